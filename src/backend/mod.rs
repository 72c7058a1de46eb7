//! The lock backends behind one trait: Redis leases and local flock files.
//! Backends know nothing of processes; they grant, renew, release and inspect.

pub mod local;
pub mod redis;

use std::os::fd::RawFd;
use std::time::Duration;

use crate::config::{Endpoint, Common, Wait};
use crate::exit::Failure;
use crate::lease::{Boot, Renewer, Timing};

/// Who we are to the backend: a secret that proves ownership, and a label for humans.
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
    pub fn new(note: Option<&str>) -> anyhow::Result<Owner> {
        let mut bytes = [0u8; 16];
        rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| anyhow::anyhow!("reading random bytes for the owner value: {e}"))?;
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

/// A lease we hold.
#[derive(Debug, Clone)]
pub struct Grant {
    pub token: u64,
    /// When the granting request was sent: the lease deadline counts from here.
    pub sent_at: Boot,
}

pub enum Acquired {
    Granted(Grant),
    /// Not acquired (-n, or --wait ran out).
    Busy {
        holder: Option<String>,
    },
}

/// A lock's state as `status` shows it; never includes the owner value.
#[derive(Debug, Clone, Default)]
pub struct Holder {
    pub label: Option<String>,
    pub token: Option<u64>,
    /// Time left on the lease (None: no expiry, as on the local backend).
    pub ttl_left: Option<Duration>,
    pub held_for: Option<Duration>,
    /// Revoked by `release --force`: no one runs, but the name is not free yet.
    pub revoked: bool,
}

/// What `release --force` did.
#[derive(Debug, Clone)]
pub enum Broken {
    /// This lease was revoked (or deleted with `--now`).
    Lease(Holder),
    NotHeld,
    /// Revoked before: no one runs, the name comes free when the old lease ends.
    AlreadyRevoked,
    /// `--token` did not match; the current token, if any.
    TokenMismatch(Option<u64>),
}

/// What `release --force` may do.
#[derive(Debug, Clone, Copy)]
pub struct Force {
    pub token: Option<u64>,
    pub now: bool,
}

pub trait Backend {
    /// Take the lock, waiting as `wait` says. The owner and timing are the backend's.
    fn acquire(&mut self, wait: Wait) -> Result<Acquired, Failure>;
    /// A renewer for the lease just granted, on its own connection.
    fn renewer(&mut self) -> anyhow::Result<Box<dyn Renewer>>;
    /// Give the lease up. Ok(false): it was no longer ours.
    fn release(&mut self) -> anyhow::Result<bool>;
    /// A descriptor the job must inherit to keep the lock (local backend).
    fn job_fd(&self) -> Option<RawFd> {
        None
    }
    /// Whether a lease ends on its own when not renewed (false for a flock,
    /// which lasts as long as its holder: no deadline, no loss by time).
    fn expires(&self) -> bool {
        true
    }
}

/// Operator views that need no lease of their own.
pub trait Inspect {
    fn inspect(&mut self) -> Result<Option<Holder>, Failure>;
    /// Break the lock.
    fn force_release(&mut self, force: Force) -> Result<Broken, Failure>;
}

/// Open the backend for one lock name.
pub fn open(
    common: &Common,
    name: &str,
    owner: Owner,
    timing: Timing,
) -> Result<Box<dyn Backend>, Failure> {
    Ok(match &common.backend {
        Endpoint::Local { dir } => Box::new(local::Local::open(dir.as_deref(), name, owner)?),
        Endpoint::Redis(spec) => Box::new(redis::Redis::connect(
            spec,
            &common.prefix,
            name,
            owner,
            timing,
        )?),
    })
}

/// Open a backend for `status` and `release`.
pub fn open_inspect(common: &Common, name: &str) -> Result<Box<dyn Inspect>, Failure> {
    let timing = Timing::new(Duration::from_secs(30), None).expect("default timing fits");
    Ok(match &common.backend {
        Endpoint::Local { dir } => {
            Box::new(local::Local::open_for_inspect(dir.as_deref(), name)?)
        }
        Endpoint::Redis(spec) => Box::new(redis::Redis::connect(
            spec,
            &common.prefix,
            name,
            Owner {
                secret: String::new(),
                label: String::new(),
                shown: String::new(),
            },
            timing,
        )?),
    })
}

/// The one line a wait prints once it has lasted a second (unless -q), so a
/// CI log says why it is stuck.
pub fn announce_wait(name: &str, holder: Option<&str>) {
    crate::log::warn(format!(
        "waiting for {name}: held by {}",
        holder.unwrap_or("another process (no holder recorded)")
    ));
}

/// Refusal for `lockrun X` run from inside the job that holds X.
pub fn nested(name: &str) -> Failure {
    crate::exit::fail(
        crate::exit::Class::Usage,
        format!(
            "lock {name} is held by the job this command runs in; waiting for it would deadlock"
        ),
    )
}

/// The environment says we run inside a job holding `name` with this holder label.
pub fn is_own_outer_holder(name: &str, holder_label: Option<&str>) -> bool {
    let env_name = std::env::var_os("LOCKRUN_NAME");
    let env_owner = std::env::var("LOCKRUN_OWNER").ok();
    // A stored label is `host:pid`, perhaps followed by ` (note)`.
    let holder = holder_label.and_then(|l| l.split(' ').next());
    env_name.as_deref() == Some(std::ffi::OsStr::new(name))
        && holder.is_some()
        && env_owner.as_deref() == holder
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
