//! The watchdog: a thread that renews a lease on its own connection and
//! tells the supervisor when it is renewed, retried or lost.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, poll};

use crate::clock::{Boot, BootTimer, backoff};
use crate::schedule::Timing;

/// What a renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed for `ttl` from when the request was sent: what the server
    /// granted, which may differ from what was asked (the deadline counts
    /// from it).
    Renewed { ttl: Duration },
    /// The lease is not ours any more (final).
    Lost,
}

/// One backend lease as the watchdog sees it: renew, or learn it is gone.
pub trait Renewer: Send {
    fn renew(&mut self) -> anyhow::Result<Renewal>;
    /// A renewer for the same lease with no connection yet, used when an
    /// attempt had to be abandoned (it may still be stuck somewhere).
    fn fresh(&self) -> Box<dyn Renewer>;
}

/// The lease deadline, shared between the watchdog (writer) and the supervisor.
#[derive(Debug)]
pub struct Deadline(AtomicU64);

impl Deadline {
    pub fn new(at: Boot) -> Deadline {
        Deadline(AtomicU64::new(at.nanos()))
    }
    pub fn get(&self) -> Boot {
        Boot::from_nanos(self.0.load(Ordering::SeqCst))
    }
    fn set(&self, at: Boot) {
        self.0.store(at.nanos(), Ordering::SeqCst);
    }
}

/// What the watchdog tells the supervisor.
#[derive(Debug)]
pub enum Event {
    Renewed {
        took: Duration,
    },
    Retrying {
        error: String,
    },
    /// Final: the supervisor must stop the job.
    Lost {
        reason: String,
    },
}

/// Wait until `at` on the boot clock or until `stop` becomes readable or hung up.
/// Returns true when asked to stop.
fn wait_until(timer: &BootTimer, stop: BorrowedFd<'_>, at: Boot) -> bool {
    if timer.arm(at).is_err() {
        // Without a timer we cannot wait safely; stopping early is the safe side.
        return true;
    }
    loop {
        if Boot::now() >= at {
            return false;
        }
        let mut fds = [
            PollFd::from_borrowed_fd(stop, PollFlags::IN),
            PollFd::from_borrowed_fd(timer.fd(), PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {
                if !fds[0].revents().is_empty() {
                    return true;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
    }
}

/// The running watchdog. Stopping it never waits for it: a renewal in
/// flight may be stuck in name resolution or a trickling reply.
pub struct Watchdog {
    stop: Option<OwnedFd>,
}

impl Watchdog {
    /// Start renewing now (the first renewal is due). `deadline` is None for a
    /// lease that cannot expire (it is only checked, never extended).
    pub fn spawn(
        renewer: Box<dyn Renewer>,
        timing: Timing,
        deadline: Option<Arc<Deadline>>,
        events: Sender<Event>,
        wake: UnixStream,
    ) -> std::io::Result<Watchdog> {
        let (stop_rx, stop_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let timer = BootTimer::new()?;
        std::thread::Builder::new()
            .name("lockrun-watchdog".into())
            .spawn(move || {
                let mut wake = wake;
                let mut send = |ev: Event| {
                    let _ = events.send(ev);
                    // Non-blocking: a full wake socket already means "look".
                    let _ = wake.write(&[1]);
                };
                renew_loop(
                    renewer,
                    &timing,
                    deadline.as_deref(),
                    &timer,
                    stop_rx.as_fd(),
                    &mut send,
                );
            })?;
        Ok(Watchdog {
            stop: Some(stop_tx),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // The thread sees the pipe close and ends after its current attempt;
        // nobody waits for that.
        self.stop.take();
    }
}

/// How one renewal attempt ended.
enum Attempt {
    Done(anyhow::Result<Renewal>),
    /// It did not finish within its bound; it was left to finish on its own.
    Abandoned,
}

/// One whole renewal attempt (name resolution, connect, handshake, script
/// reload, call) on a thread of its own, waited for at most `limit`.
fn attempt(
    slot: &mut Option<Box<dyn Renewer>>,
    template: &dyn Renewer,
    limit: Duration,
) -> Attempt {
    let mut renewer = slot.take().unwrap_or_else(|| template.fresh());
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("lockrun-renew".into())
        .spawn(move || {
            let r = renewer.renew();
            let _ = tx.send((r, renewer));
        });
    if let Err(e) = spawned {
        return Attempt::Done(Err(anyhow::anyhow!("cannot start a thread: {e}")));
    }
    match rx.recv_timeout(limit) {
        Ok((r, renewer)) => {
            *slot = Some(renewer);
            Attempt::Done(r)
        }
        Err(_) => Attempt::Abandoned,
    }
}

fn renew_loop(
    renewer: Box<dyn Renewer>,
    timing: &Timing,
    deadline: Option<&Deadline>,
    timer: &BootTimer,
    stop: BorrowedFd<'_>,
    send: &mut dyn FnMut(Event),
) {
    let template = renewer.fresh();
    let mut slot = Some(renewer);
    let mut failures: u32 = 0;
    loop {
        let current = deadline.map(Deadline::get);
        let now = Boot::now();
        if let Some(c) = current
            && now > timing.last_attempt(c)
        {
            send(Event::Lost {
                reason: "could not renew the lease in time".into(),
            });
            return;
        }
        let limit = match current {
            Some(c) => timing.op.min(timing.lost_at(c).since(now)),
            None => timing.op,
        };
        let sent_at = Boot::now();
        let error = match attempt(&mut slot, &*template, limit) {
            Attempt::Done(Ok(Renewal::Renewed { ttl })) => {
                failures = 0;
                // A late success cannot undo "lost": the supervisor also checks
                // the deadline it had, and lost is final there.
                if let Some(d) = deadline {
                    d.set(timing.deadline_for(sent_at, ttl));
                }
                send(Event::Renewed {
                    took: Boot::now().since(sent_at),
                });
                if wait_until(timer, stop, sent_at.add(timing.renew_every)) {
                    return;
                }
                continue;
            }
            Attempt::Done(Ok(Renewal::Lost)) => {
                send(Event::Lost {
                    reason: "the lease is no longer ours (deleted, expired or taken over)".into(),
                });
                return;
            }
            Attempt::Done(Err(e)) => format!("{e:#}"),
            Attempt::Abandoned => format!(
                "no answer within {}",
                humantime::format_duration(Duration::from_millis(limit.as_millis() as u64))
            ),
        };
        failures += 1;
        send(Event::Retrying { error });
        let cap = (timing.renew_every / 4).max(Duration::from_millis(10));
        let mut retry_at = Boot::now().add(backoff(failures, Duration::from_millis(20), cap));
        if let Some(c) = current {
            retry_at = retry_at.min(timing.last_attempt(c));
        }
        if wait_until(timer, stop, retry_at) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grants a fixed ttl on every renewal.
    struct Grants(Duration);

    impl Renewer for Grants {
        fn renew(&mut self) -> anyhow::Result<Renewal> {
            Ok(Renewal::Renewed { ttl: self.0 })
        }
        fn fresh(&self) -> Box<dyn Renewer> {
            Box::new(Grants(self.0))
        }
    }

    #[test]
    fn the_deadline_counts_from_what_the_server_granted() {
        let timing = Timing::new(Duration::from_secs(3), None).unwrap();
        let start = Boot::now();
        let deadline = Arc::new(Deadline::new(start.add(timing.ttl)));
        let (tx, rx) = std::sync::mpsc::channel();
        let (_wake_rx, wake_tx) = UnixStream::pair().unwrap();
        wake_tx.set_nonblocking(true).unwrap();
        // The server grants 2 s where 3 s were asked: the deadline moves in.
        let _w = Watchdog::spawn(
            Box::new(Grants(Duration::from_secs(2))),
            timing,
            Some(Arc::clone(&deadline)),
            tx,
            wake_tx,
        )
        .unwrap();
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Renewed { .. }), "{ev:?}");
        let d = deadline.get();
        assert!(d <= Boot::now().add(Duration::from_secs(2)), "{d:?}");
        assert!(
            d >= start.add(Duration::from_secs(2)).sub(timing.drift),
            "{d:?}"
        );
    }
}
