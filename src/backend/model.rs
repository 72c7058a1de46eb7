//! What the seam speaks of: modes, how long a request waits, who asks (its
//! owner and request), what it gets (a grant, a holder, a name's status, a
//! listing) and what an operator may break.

use std::os::fd::RawFd;
use std::time::Duration;

use super::{Error, Lease};
use crate::clock::Boot;
use crate::schedule::Timing;

/// How a name is held (lockrun(1) "Modes"). Exclusive and shared are the two
/// sides of one readers–writer lock; `Limit(n)` is a counting semaphore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Shared,
    Limit(u32),
}

impl Mode {
    /// The letter engines store for a mode (x, s, or n with the limit
    /// beside it): the one place modes become text on a server or in a file.
    pub fn code(self) -> &'static str {
        match self {
            Mode::Exclusive => "x",
            Mode::Shared => "s",
            Mode::Limit(_) => "n",
        }
    }

    /// The holders a mode admits at most per place (the N of `--limit N`).
    pub fn limit(self) -> u32 {
        match self {
            Mode::Limit(n) => n,
            _ => 1,
        }
    }

    /// The mode a stored letter (and limit) stands for; anything else is
    /// taken as exclusive, the strictest.
    pub fn from_code(code: &str, limit: Option<u32>) -> Mode {
        match code {
            "s" => Mode::Shared,
            "n" => Mode::Limit(limit.unwrap_or(1).max(1)),
            _ => Mode::Exclusive,
        }
    }

    /// As `status` shows it: exclusive, shared, limit N.
    pub fn name(self) -> String {
        match self {
            Mode::Exclusive => "exclusive".into(),
            Mode::Shared => "shared".into(),
            Mode::Limit(n) => format!("limit {n}"),
        }
    }

    /// The flag that asks for this mode, for messages.
    pub fn flag(self) -> String {
        match self {
            Mode::Exclusive => "an exclusive lock".into(),
            Mode::Shared => "a shared lock (-s)".into(),
            Mode::Limit(n) => format!("--limit {n}"),
        }
    }

    /// Two requests agree when they can share a name: exclusive and shared
    /// are one readers–writer lock; a limit only agrees with the same limit.
    pub fn agrees_with(self, other: Mode) -> bool {
        match (self, other) {
            (Mode::Limit(a), Mode::Limit(b)) => a == b,
            (Mode::Limit(_), _) | (_, Mode::Limit(_)) => false,
            _ => true,
        }
    }

    /// The one line for a request that disagrees with the holders in force.
    pub fn disagreement(self, name: &str, in_force: Mode) -> Error {
        let held = match in_force {
            Mode::Limit(n) => format!("--limit {n}"),
            _ => "a plain lock (exclusive or -s, without --limit)".into(),
        };
        Error::Request(format!(
            "{name} is held as {held}; this request asks for {}: every user of a name \
             must agree on its mode and limit",
            self.flag()
        ))
    }
}

/// How long a request waits for a name that is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    No,
    For(Duration),
    Forever,
}

/// Who we are to the engine: a secret that proves ownership, and a label for humans.
#[derive(Debug, Clone)]
pub struct Owner {
    /// ≥128 random bits, hex; never printed or given to the job.
    pub secret: String,
    /// `host:pid`, given to the job as LOCKRUN_OWNER.
    pub label: String,
    /// What `status` shows: `host:pid`, or `host:pid (--label text)`.
    pub shown: String,
}

impl Owner {
    pub fn new(note: Option<&str>) -> Result<Owner, Error> {
        let mut bytes = [0u8; 16];
        rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).map_err(
            |e| Error::Internal(format!("reading random bytes for the owner value: {e}")),
        )?;
        let secret = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let host = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        let label = format!("{host}:{}", std::process::id());
        let shown = match note {
            Some(n) => format!("{label} ({n})"),
            None => label.clone(),
        };
        Ok(Owner {
            secret,
            label,
            shown,
        })
    }
}

/// What a request asks of the others of its name (lockrun(1) "Concurrency
/// groups"); all off by default, and none with `-n`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Group {
    /// `--max-waiters N`: join the queue only while fewer than N requests
    /// wait in it (counted in the step that would join it; waiters this
    /// request replaces do not count); otherwise `Acquired::QueueFull`.
    pub max_waiters: Option<u32>,
    /// `--supersede`: joining the queue removes every earlier waiter that
    /// asked for it too; each of those ends with `Acquired::Replaced`,
    /// naming this request. A waiter without it is never removed.
    pub supersede: bool,
    /// `--preempt`: finding the name held, mark every holder of that
    /// moment preempted by this request (its owner stays: it releases once
    /// its job is dead, or its lease runs out); a holder's next renewal
    /// answers `Renewal::Preempted`. A `--min-hold` window, which runs no
    /// job, is ended at once. Then wait as usual.
    pub preempt: bool,
}

/// What a run asks an engine for.
pub struct Request<'a> {
    pub name: &'a str,
    pub owner: &'a Owner,
    pub timing: Timing,
    pub mode: Mode,
    /// The `host:pid` of an outer lockrun whose job this request runs in,
    /// when that lockrun holds this very name: a holder with that label is
    /// ourselves, and waiting for it would deadlock.
    pub outer: Option<String>,
    /// The lock descriptor an outer lockrun handed its job
    /// (LOCKRUN_LOCK_FD): a lock held on it is ourselves.
    pub inherited_fd: Option<RawFd>,
    /// `-q`: no line about waiting (and no waking up to print one).
    pub quiet: bool,
    /// `--min-hold`: the lease stays held at least this long after its
    /// grant, on the engine's clock, also once the job ended (lockrun(1) "Once per window").
    pub min_hold: Option<Duration>,
    pub group: Group,
}

impl Request<'_> {
    /// Whether a holder recorded as `holder_label` is the lockrun this
    /// request runs inside.
    pub fn is_own_outer_holder(&self, holder_label: Option<&str>) -> bool {
        // A stored label is `host:pid`, perhaps followed by ` (note)`.
        let holder = holder_label.and_then(|l| l.split(' ').next());
        holder.is_some() && self.outer.as_deref() == holder
    }
}

/// The `host:pid` of the lockrun whose job we run in, if it holds `name`
/// (its job's environment says so).
pub fn outer_holder(name: &str) -> Option<String> {
    let env_name = std::env::var_os("LOCKRUN_NAME")?;
    (env_name == *name).then(|| std::env::var("LOCKRUN_OWNER").ok())?
}

/// The descriptor number an outer lockrun's job was given as LOCKRUN_LOCK_FD
/// (anything but a plain descriptor number is not ours to look at).
pub fn inherited_lock_fd() -> Option<RawFd> {
    std::env::var("LOCKRUN_LOCK_FD")
        .ok()
        .and_then(|v| v.parse::<RawFd>().ok())
        .filter(|n| *n >= 0)
}

pub enum Acquired {
    Granted(Lease),
    /// Not acquired (-n, or --wait ran out): who holds it, if known.
    Busy {
        holder: Option<String>,
    },
    /// Not queued (`--max-waiters`): this many requests waited already.
    QueueFull {
        waiting: u64,
    },
    /// Not acquired: the wait (or, with -n, the bound on one request) ran
    /// out while the server had no connection free; why, naming its limit.
    Unreachable {
        why: String,
    },
    /// Taken out of the queue by a newer `--supersede` request, shown as
    /// `host:pid (label)`.
    Replaced {
        by: String,
    },
}

/// One holder as `status` shows it; never includes the owner value.
#[derive(Debug, Clone)]
pub struct Holder {
    pub label: Option<String>,
    pub token: Option<u64>,
    pub mode: Mode,
    pub slot: Option<u32>,
    /// Time left on the lease (None: no expiry, as on the local backend).
    pub ttl_left: Option<Duration>,
    pub held_for: Option<Duration>,
    /// Revoked by `release --force`: no one runs, but the place is not free yet.
    pub revoked: bool,
    /// Kept by `--min-hold` after its job ended: no one runs, the place is
    /// held until `ttl_left` runs out (or `release --force` ends it).
    pub min_hold: bool,
    /// Asked to stop by a `--preempt` request, shown as `host:pid (label)`:
    /// its job stops at its next renewal.
    pub preempted_by: Option<String>,
}

/// A name's state for `status`.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub holders: Vec<Holder>,
    /// Requests queued for the name (None: the engine cannot tell).
    pub waiters: Option<u64>,
    /// Of those, the ones that asked for `--supersede`.
    pub superseding: Option<u64>,
}

/// Every name under the prefix with its state, for `status` without a
/// name, sorted by name.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub names: Vec<(String, Status)>,
    /// What the reader should know about the list: it was read name by
    /// name (no snapshot), or a bound cut it short.
    pub notes: Vec<String>,
    /// Names whose state this identity may not read (another identity's,
    /// or a node that is not the engine's at their place), with why.
    pub unreadable: Vec<(String, String)>,
}

/// How far one listing may go: names read at most, and until when.
#[derive(Debug, Clone, Copy)]
pub struct ListBound {
    pub names: usize,
    pub until: Boot,
}

impl ListBound {
    pub fn passed(&self) -> bool {
        Boot::now() >= self.until
    }
}

/// What `release --force` did.
#[derive(Debug, Clone)]
pub enum Broken {
    /// These holders were revoked (or deleted with `--now`).
    Leases(Vec<Holder>),
    NotHeld,
    /// Revoked before: no one runs, the name comes free when the old lease ends.
    AlreadyRevoked,
    /// `--token` matched no holder; the tokens in force.
    TokenMismatch(Vec<u64>),
}

/// What `release --force` may do.
#[derive(Debug, Clone, Copy)]
pub struct Force {
    pub token: Option<u64>,
    pub now: bool,
}

/// Refusal for `lockrun X` run from inside the job that holds X.
pub fn nested(name: &str) -> Error {
    Error::Request(format!(
        "lock {name} is held by the job this command runs in; waiting for it would deadlock"
    ))
}

/// For a holder shown as `host:pid…` on this very host whose process is gone:
/// its pid (the lease outlives a lockrun killed outright until it expires).
pub fn gone_holder(label: &str) -> Option<u32> {
    let (host, rest) = label.split_once(':')?;
    let pid: u32 = rest.split(' ').next()?.parse().ok()?;
    let here = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    (host == here && !std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(pid)
}
