//! The lease contract: what a granted lease is to the rest of lockrun (a
//! token, a deadline, what the job inherits, its release) and how its
//! engine renews it, from any connection or only on the one it lives on.

use std::os::fd::{OwnedFd, RawFd};
use std::time::Duration;

use super::{Error, Request, bounded};
use crate::clock::Boot;

/// What a renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed for `ttl` from when the request was sent: what the server
    /// granted, which may differ from what was asked (the deadline counts
    /// from it).
    Renewed { ttl: Duration },
    /// The lease is not ours any more (final).
    Lost,
    /// A `--preempt` request, shown as `host:pid (label)`, asked this
    /// holder to stop (final): the lease is still ours, to release once
    /// the job is dead.
    Preempted { by: String },
}

/// One renewal of one lease, as its engine does it. A transient error is
/// retried within the lease schedule; any other (the server refused it: an
/// ACL or a grant withdrawn) ends the lease at once, like `Lost`.
pub trait Renewer: Send {
    fn renew(&mut self) -> Result<Renewal, Error>;
    /// A descriptor that becomes readable when the lease must be renewed
    /// at once rather than on schedule (its session connected again and
    /// may last less now); taken once, by the watchdog. None: renewals
    /// come on schedule only.
    fn wake(&mut self) -> Option<OwnedFd> {
        None
    }
}

/// A fresh renewer for a lease that any connection can renew: it has no
/// connection yet and makes its own.
pub type Fresh = Box<dyn Fn() -> Box<dyn Renewer> + Send>;

/// How a granted lease is renewed, as its engine says.
pub enum Renewing {
    /// From any connection to the engine (a key, a row, a file): each
    /// renewer comes from `Fresh`, so an attempt stuck on one connection
    /// is abandoned and the next starts on another (one the lease kept
    /// from its grant while there is one, else a new one).
    Anywhere(Fresh),
    /// Only on the connection the lease lives on (a session): this one
    /// renewer is all there is, so an attempt that overran its bound is
    /// waited for again rather than replaced, since no other connection
    /// could renew the lease.
    OnItsConnection(Box<dyn Renewer>),
}

impl Renewing {
    /// The descriptor that asks for a renewal at once (`Renewer::wake`):
    /// only a lease on its own connection can have one.
    pub fn wake(&mut self) -> Option<OwnedFd> {
        match self {
            Renewing::Anywhere(_) => None,
            Renewing::OnItsConnection(r) => r.wake(),
        }
    }
}

/// A granted lease. It owns what keeps it (a connection, a locked
/// descriptor), hands the job what it needs, and is given back by `release`.
pub struct Lease {
    pub token: u64,
    /// With `--limit`: which of the N places this grant holds.
    pub slot: Option<u32>,
    /// When the request that started the lease was sent (or earlier): the
    /// lease deadline counts from here.
    pub sent_at: Boot,
    /// The lease's length as the engine granted it (not always the ttl
    /// asked for); the deadline counts from it.
    pub ttl: Duration,
    held: Box<dyn Held>,
}

/// What a release does with the `--min-hold` window of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MinHold {
    /// Kept: the name stays taken until the window ends.
    Keep,
    /// Forgotten: the lease was given back before any job ran under it,
    /// so nothing ran that the window would keep from running again.
    Forget,
}

impl MinHold {
    /// The window a release keeps of `min_hold`.
    pub fn of(self, min_hold: Option<Duration>) -> Option<Duration> {
        match self {
            MinHold::Keep => min_hold,
            MinHold::Forget => None,
        }
    }
}

/// An engine's side of a granted lease.
pub trait Held: Send {
    /// How the lease is renewed.
    fn renewer(&self) -> Renewing;
    /// A descriptor the job must inherit to keep the lease (a flock).
    fn inherit_fd(&self) -> Option<RawFd> {
        None
    }
    /// Give the lease up, leaving its `--min-hold` window behind or not
    /// as `window` says (an engine without windows has none to leave).
    /// Ok(false): it was no longer ours.
    fn release(self: Box<Self>, window: MinHold) -> Result<bool, Error>;
    /// The release talks to no server (a close and a stat of a local file):
    /// it needs no thread to bound it.
    fn releases_locally(&self) -> bool {
        false
    }
    /// What becomes of the lease if its release gets no answer (it may or
    /// may not have been done), when the engine knows better than "it
    /// expires within its ttl".
    fn if_unreleased(&self) -> Option<String> {
        None
    }
}

impl Lease {
    pub fn new(
        token: u64,
        slot: Option<u32>,
        sent_at: Boot,
        ttl: Duration,
        held: Box<dyn Held>,
    ) -> Lease {
        Lease {
            token,
            slot,
            sent_at,
            ttl,
            held,
        }
    }

    pub fn renewer(&self) -> Renewing {
        self.held.renewer()
    }

    /// What becomes of the lease if its release gets no answer, said
    /// before the release: after it, the lease is gone from lockrun.
    pub fn if_unreleased(&self) -> String {
        self.held.if_unreleased().unwrap_or_else(|| {
            format!(
                "the lease expires on its own within {}",
                crate::text::duration(self.ttl)
            )
        })
    }

    /// What the job gets (lockrun(1) "ENVIRONMENT"): variables set over its
    /// inherited environment, variables removed from it, and the descriptor
    /// it inherits. An outer lockrun's LOCKRUN_SLOT and LOCKRUN_LOCK_FD never
    /// pass through to a job that has none of its own.
    pub fn job_env(&self, req: &Request, remove_url: bool) -> JobEnv {
        let mut set = vec![
            ("LOCKRUN_NAME".to_string(), req.name.to_string()),
            ("LOCKRUN_TOKEN".to_string(), self.token.to_string()),
            ("LOCKRUN_OWNER".to_string(), req.owner.label.clone()),
            (
                "LOCKRUN_TTL_MS".to_string(),
                self.ttl.as_millis().to_string(),
            ),
        ];
        if let Some(slot) = self.slot {
            set.push(("LOCKRUN_SLOT".to_string(), slot.to_string()));
        }
        let inherit_fd = self.held.inherit_fd();
        if let Some(fd) = inherit_fd {
            set.push(("LOCKRUN_LOCK_FD".to_string(), fd.to_string()));
        }
        let mut remove = vec!["LOCKRUN_SLOT".to_string(), "LOCKRUN_LOCK_FD".to_string()];
        if remove_url {
            remove.push("LOCKRUN_URL".to_string());
        }
        remove.retain(|r| !set.iter().any(|(k, _)| k == r));
        JobEnv {
            set,
            remove,
            inherit_fd,
        }
    }

    pub fn release(self) -> Result<bool, Error> {
        self.held.release(MinHold::Keep)
    }

    /// Give the lease up before any job ran under it (no `--min-hold`
    /// window: nothing ran that it would keep from running again).
    pub fn give_back(self) -> Result<bool, Error> {
        self.held.release(MinHold::Forget)
    }

    /// Give the lease up within `limit` whatever its server does: on a
    /// thread that is left behind if it takes longer, unless the release is
    /// local and so has nothing to wait for.
    pub fn release_within(self, doing: &str, limit: Duration) -> Result<bool, Error> {
        if self.held.releases_locally() {
            return self.release();
        }
        bounded(doing, limit, move || self.release())
    }

    /// A thread that waits, holding the lease, to release it when told:
    /// started while the job runs, so that the end of the job pays for the
    /// request alone and not for a thread's start. None for a local release
    /// (no thread needed) or when no thread can be had; the lease comes back.
    pub fn release_later(self) -> Result<Releaser, Lease> {
        if self.held.releases_locally() {
            return Err(self);
        }
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // The lease comes back through this if the thread never starts.
        let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(self)));
        let theirs = slot.clone();
        let started = std::thread::Builder::new()
            .name("lockrun-release".into())
            .spawn(move || {
                // Told to release, or dropped: the lease goes either way.
                let _ = go_rx.recv();
                let lease = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(lease) = lease {
                    let _ = done_tx.send(lease.release());
                }
            });
        match started {
            Ok(_) => Ok(Releaser {
                go: go_tx,
                done: done_rx,
            }),
            Err(_) => Err(slot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .expect("the thread never started")),
        }
    }
}

/// A granted lease until its release: on this thread, or (once the job
/// runs) with a thread of its own that waits to release it.
pub enum Pending {
    Here(Lease),
    Thread(Releaser),
    Moving,
}

impl Pending {
    /// Hand the lease to a thread of its own, if it needs one.
    pub fn start_thread(&mut self) {
        if let Pending::Here(lease) = std::mem::replace(self, Pending::Moving) {
            *self = match lease.release_later() {
                Ok(r) => Pending::Thread(r),
                Err(lease) => Pending::Here(lease),
            };
        }
    }

    /// Give the lease up within `limit` whatever its server does.
    pub fn release(self, doing: &str, limit: Duration) -> Result<bool, Error> {
        match self {
            Pending::Here(lease) => lease.release_within(doing, limit),
            Pending::Thread(r) => r.release(doing, limit),
            Pending::Moving => Err(Error::Internal(format!("{doing}: the lease was lost"))),
        }
    }
}

/// A lease in the hands of a thread of its own, waiting to be released.
pub struct Releaser {
    go: std::sync::mpsc::Sender<()>,
    done: std::sync::mpsc::Receiver<Result<bool, Error>>,
}

impl Releaser {
    /// Release now, within `limit` whatever the server does (the thread is
    /// left behind if it takes longer).
    pub fn release(self, doing: &str, limit: Duration) -> Result<bool, Error> {
        let _ = self.go.send(());
        self.done.recv_timeout(limit).unwrap_or_else(|_| {
            Err(Error::Transient(format!(
                "{doing}: no answer within {}",
                crate::text::duration(limit)
            )))
        })
    }
}

/// The job's side of a lease.
pub struct JobEnv {
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
    pub inherit_fd: Option<RawFd>,
}
