//! The seam every engine plugs into: a request in, a granted lease out (which
//! owns its renewal, its hand-off to the job and its release), operator views
//! beside it. Engines know names, owners, modes, slots and tokens, nothing of
//! processes; every failure is an `Error` of one kind, which decides the exit code.

pub mod admit;
mod doctor;
mod drive;
mod error;
pub mod etcd;
mod lease;
pub mod local;
pub mod postgres;
pub mod redis;
pub mod wait;

pub use error::Error;
pub use lease::{Fresh, Held, Lease, Pending, Renewal, Renewer, Renewing};

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Boot;
use crate::schedule::Timing;

/// How a name is held (README "Modes"). Exclusive and shared are the two
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

/// What an address may need besides its text.
#[derive(Debug, Clone, Default)]
pub struct AddressOptions {
    /// `--tls-ca`: a CA file for an engine that speaks TLS.
    pub tls_ca: Option<PathBuf>,
    /// It came from the environment, which may be meant for another engine:
    /// an engine without TLS ignores it rather than refusing it.
    pub tls_ca_from_env: bool,
    /// `--replicas N`: a grant counts once N replicas acknowledged it.
    pub replicas: u32,
    pub replicas_from_env: bool,
    /// `--prefix` came from the environment: an engine without prefixes
    /// ignores it rather than refusing it.
    pub prefix_from_env: bool,
}

impl AddressOptions {
    /// The refusal of a CA file by an address that does not use TLS (none
    /// if it came from the environment).
    pub fn no_tls(&self, shown: &str) -> Result<(), Error> {
        match &self.tls_ca {
            Some(_) if !self.tls_ca_from_env => Err(Error::Request(format!(
                "--tls-ca only applies to an address that uses TLS, not {shown}"
            ))),
            _ => Ok(()),
        }
    }

    /// The refusal of `--replicas` by an engine that has none (none if it
    /// came from the environment).
    pub fn no_replicas(&self, shown: &str) -> Result<(), Error> {
        if self.replicas > 0 && !self.replicas_from_env {
            return Err(Error::Request(format!(
                "--replicas only applies to an engine with replicas, not {shown}"
            )));
        }
        Ok(())
    }
}

/// An engine at an address: parsed and checked by the engine, not contacted.
pub trait Address: std::fmt::Debug + Send + Sync {
    fn engine(&self) -> &'static EngineInfo;
    /// The address as messages show it, any secret in it hidden.
    fn shown(&self) -> String;
    /// A secret the address carries (a password): kept out of every line
    /// lockrun prints and out of the job's environment.
    fn secret(&self) -> Option<&str> {
        None
    }
    /// The variable the secret came from, if it came from the environment:
    /// removed from the job's environment like the URL.
    fn secret_env(&self) -> Option<&'static str> {
        None
    }
    /// The engine's own rules for lock names, beyond lockrun's.
    fn check_name(&self, _name: &str) -> Result<(), Error> {
        Ok(())
    }
    /// The engine's own rules for `--prefix` (each keeps prefixes apart its
    /// own way).
    fn check_prefix(&self, prefix: &str) -> Result<(), Error>;
    /// Open the engine (contacting it, for a server).
    fn open(&self, how: &Opening) -> Result<Box<dyn Engine>, Error>;
    /// `lockrun doctor`: read-only checks of the engine and its settings,
    /// one line each (README "Operate"). They write nothing that outlives
    /// them.
    fn doctor(&self, how: &Opening) -> Vec<Check>;
}

/// How a `lockrun doctor` check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One line of `lockrun doctor`: what was checked, how it came out, and
/// (unless ok) what to do. Never carries a secret.
#[derive(Debug, Clone)]
pub struct Check {
    pub verdict: Verdict,
    pub topic: &'static str,
    pub said: String,
}

impl Check {
    pub fn new(verdict: Verdict, topic: &'static str, said: impl Into<String>) -> Check {
        Check {
            verdict,
            topic,
            said: said.into(),
        }
    }
    pub fn ok(topic: &'static str, said: impl Into<String>) -> Check {
        Check::new(Verdict::Ok, topic, said)
    }
    pub fn warn(topic: &'static str, said: impl Into<String>) -> Check {
        Check::new(Verdict::Warn, topic, said)
    }
    pub fn fail(topic: &'static str, said: impl Into<String>) -> Check {
        Check::new(Verdict::Fail, topic, said)
    }
}

/// How an engine is opened.
#[derive(Debug, Clone)]
pub struct Opening {
    /// `--prefix`: put before every key or name the engine stores.
    pub prefix: String,
    /// Bounds one request, connecting included.
    pub op: Duration,
    /// `-v`: worth a round trip to check the server's settings and say
    /// what would break a lock.
    pub check_settings: bool,
}

/// How an engine reads an address of its own (the whole text, scheme
/// included; empty for the default engine with no URL).
pub type Parse = fn(&str, &AddressOptions) -> Result<Arc<dyn Address>, Error>;

/// One row of the scheme table: which URL schemes name an engine, how its
/// addresses are written and parsed, and what sets it apart (what every
/// engine does alike is the seam's contract, not a flag).
pub struct EngineInfo {
    /// As messages name it.
    pub name: &'static str,
    pub schemes: &'static [&'static str],
    /// How an address is written, for messages.
    pub form: &'static str,
    pub parse: Parse,
    /// A lease ends on its own when not renewed (a flock does not: it lasts
    /// as long as its holder, with no deadline and no loss by time).
    pub expires: bool,
    /// The engine grants leases in steps of this (a ttl asked for is rounded
    /// up to it) and no shorter than `ttl_min`: refused before anything is
    /// contacted.
    pub ttl_step: Duration,
    pub ttl_min: Duration,
}

impl EngineInfo {
    /// The ttl this engine would grant for `asked`, or the one line saying
    /// why it cannot.
    pub fn grantable(&self, asked: Duration) -> Result<Duration, Error> {
        let step = self.ttl_step.as_nanos().max(1);
        let ttl = Duration::from_nanos(
            u64::try_from(asked.as_nanos().div_ceil(step) * step).unwrap_or(u64::MAX),
        );
        if ttl < self.ttl_min {
            return Err(Error::Request(format!(
                "--ttl {} is below the {} engine's smallest lease of {}",
                humantime::format_duration(asked),
                self.name,
                humantime::format_duration(self.ttl_min)
            )));
        }
        Ok(ttl)
    }
}

/// Every engine lockrun has, by URL scheme. No URL means the first (local).
pub const ENGINES: [EngineInfo; 4] = [local::ENGINE, redis::ENGINE, etcd::ENGINE, postgres::ENGINE];

/// The engine a URL scheme names.
pub fn engine_for(scheme: &str) -> Option<&'static EngineInfo> {
    ENGINES.iter().find(|e| e.schemes.contains(&scheme))
}

/// Parse `--url` (empty: the local default) into its engine's address.
pub fn address(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    if raw.is_empty() {
        return (ENGINES[0].parse)(raw, opts);
    }
    let forms: Vec<&str> = ENGINES.iter().map(|e| e.form).collect();
    let expected = format!("expected {}", forms.join(" or "));
    // Never echo the raw URL: it may hold a password.
    let scheme = raw
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .ok_or_else(|| Error::Request(format!("invalid --url: no scheme; {expected}")))?;
    let engine = engine_for(&scheme).ok_or_else(|| {
        let shown: String = scheme.chars().take(20).collect();
        Error::Request(format!(
            "invalid --url: unknown scheme {shown:?}; {expected}"
        ))
    })?;
    (engine.parse)(raw, opts)
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
    /// grant, on the engine's clock, also once the job ended (README "Once per window").
    pub min_hold: Option<Duration>,
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
}

/// A name's state for `status`.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub holders: Vec<Holder>,
    /// Requests queued for the name (None: the engine cannot tell).
    pub waiters: Option<u64>,
}

/// Every name under the prefix with its state, for `status` without a
/// name, sorted by name.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub names: Vec<(String, Status)>,
    /// What the reader should know about the list: it was read name by
    /// name (no snapshot), or a bound cut it short.
    pub notes: Vec<String>,
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

/// One engine at one address.
pub trait Engine: Send {
    /// Take a lease as `req` asks, waiting as `wait` says.
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error>;
    /// Every holder of `name` and the number of waiters.
    fn status(&mut self, name: &str) -> Result<Status, Error>;
    /// Break `name`'s holders (README "Operate" says what that means per engine).
    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error>;
    /// Every name under the prefix and its state, sorted, read within
    /// `bound` and without disturbing any lock.
    fn list(&mut self, bound: ListBound) -> Result<Listing, Error>;
}

/// Run `f` on a thread of its own and wait for it at most `limit`: a server
/// that trickles its replies (each read within its timeout, the whole
/// without end) must not keep lockrun from ending. On time-out the thread is
/// left behind (lockrun exits soon after) and the failure says `doing`.
pub fn bounded<T: Send + 'static>(
    doing: &str,
    limit: Duration,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("lockrun-call".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| Error::Internal(format!("{doing}: cannot start a thread: {e}")))?;
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        Err(Error::Transient(format!(
            "{doing}: no answer within {}",
            humantime::format_duration(limit)
        )))
    })
}

/// `[v6-address][:port]` of a host list, checked: the address and the port
/// text, if any; None when `text` does not start with '['. `what` names the
/// part in messages ("endpoint", "host").
pub fn bracketed_host<'a>(
    text: &'a str,
    what: &str,
) -> Result<Option<(&'a str, Option<&'a str>)>, String> {
    let Some(rest) = text.strip_prefix('[') else {
        return Ok(None);
    };
    let (h, after) = rest
        .split_once(']')
        .ok_or_else(|| format!("{what} {text:?} has no closing ']'"))?;
    if h.is_empty() || !h.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
        return Err(format!("{what} {text:?} is not an IPv6 address"));
    }
    let port = match after {
        "" => None,
        p => Some(
            p.strip_prefix(':')
                .ok_or_else(|| format!("{what} {text:?}: expected :port after ']'"))?,
        ),
    };
    Ok(Some((h, port)))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> Result<Arc<dyn Address>, Error> {
        address(url, &AddressOptions::default())
    }

    #[test]
    fn urls_are_validated() {
        assert_eq!(
            spec("redis://127.0.0.1:6379/2").unwrap().engine().name,
            "Redis"
        );
        assert_eq!(spec("rediss://h#insecure").unwrap().engine().name, "Redis");
        assert_eq!(spec("file:///tmp/x").unwrap().engine().name, "local");
        assert_eq!(spec("").unwrap().engine().name, "local");
        assert_eq!(
            spec("postgresql://u@h/db").unwrap().engine().name,
            "PostgreSQL"
        );
        for bad in [
            "http://h",
            "redis://",
            "redis://h/x",
            "redis://h/4294967295",
            "redis://h/2147483648",
            "redis://h#insecure",
            "nonsense",
            "file://h/x",
        ] {
            let e = spec(bad).unwrap_err();
            assert!(matches!(e, Error::Request(_)), "{bad}: {e}");
        }
        // A CA file on an address without TLS: refused when asked for, ignored
        // when it only came from the environment.
        let ca = |from_env| AddressOptions {
            tls_ca: Some("/ca.pem".into()),
            tls_ca_from_env: from_env,
            ..AddressOptions::default()
        };
        for url in ["redis://h", "file:///tmp/x", ""] {
            assert!(address(url, &ca(false)).is_err(), "{url}");
            assert!(address(url, &ca(true)).is_ok(), "{url}");
        }
        assert!(address("rediss://h", &ca(false)).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn the_url_parser_never_panics(raw in "\\PC{0,40}", scheme in "(redis|rediss|file|http|postgres|postgresql|)(://)?") {
            let url = format!("{scheme}{raw}");
            if let Err(e) = spec(&url) {
                proptest::prop_assert!(matches!(e, Error::Request(_)));
            }
        }

    }

    #[test]
    fn passwords_never_reach_messages() {
        let r = spec("redis://u:s3cret@h:1/0").unwrap();
        assert!(!r.shown().contains("s3cret"), "{}", r.shown());
        assert_eq!(r.secret(), Some("s3cret"));
        let e = spec("redis://u:s3cret@h:1/zz").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let p = spec("postgres://u:s3cret@h/d").unwrap();
        assert!(!p.shown().contains("s3cret"), "{}", p.shown());
        assert_eq!(p.secret(), Some("s3cret"));
        let e = spec("postgres://u:s3cret@h:0/d").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = spec("foo://u:s3cret@h").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn engines_add_their_own_name_rules() {
        let redis = spec("redis://h").unwrap();
        assert!(redis.check_name("a{b}").is_err());
        assert!(redis.check_prefix("p{").is_err());
        let local = spec("").unwrap();
        assert!(local.check_name("a{b}").is_ok());
    }

    #[test]
    fn a_ttl_is_rounded_up_to_the_engine_s_step_and_bounded_below() {
        let e = EngineInfo {
            ttl_step: Duration::from_secs(1),
            ttl_min: Duration::from_secs(2),
            ..local::ENGINE
        };
        assert_eq!(
            e.grantable(Duration::from_millis(2001)).unwrap(),
            Duration::from_secs(3)
        );
        assert_eq!(
            e.grantable(Duration::from_secs(2)).unwrap(),
            Duration::from_secs(2)
        );
        let refused = e.grantable(Duration::from_millis(900)).unwrap_err();
        assert!(matches!(refused, Error::Request(_)));
        assert!(
            refused.to_string().contains("smallest lease of 2s"),
            "{refused}"
        );
        assert_eq!(
            redis::ENGINE
                .grantable(Duration::from_millis(1500))
                .unwrap(),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn modes_agree_as_the_readme_says() {
        assert!(Mode::Exclusive.agrees_with(Mode::Shared));
        assert!(Mode::Shared.agrees_with(Mode::Shared));
        assert!(Mode::Limit(3).agrees_with(Mode::Limit(3)));
        assert!(!Mode::Limit(3).agrees_with(Mode::Limit(4)));
        assert!(!Mode::Limit(3).agrees_with(Mode::Exclusive));
        assert!(!Mode::Shared.agrees_with(Mode::Limit(2)));
    }

    #[test]
    fn modes_survive_their_stored_letters() {
        for m in [
            Mode::Exclusive,
            Mode::Shared,
            Mode::Limit(1),
            Mode::Limit(7),
        ] {
            assert_eq!(Mode::from_code(m.code(), Some(m.limit())), m);
        }
        assert_eq!(Mode::from_code("?", None), Mode::Exclusive);
        assert_eq!(Mode::Limit(3).name(), "limit 3");
    }

    #[test]
    fn every_scheme_names_one_engine() {
        let mut seen = std::collections::HashSet::new();
        for e in &ENGINES {
            for s in e.schemes {
                assert!(seen.insert(*s), "{s} twice");
                assert_eq!(engine_for(s).unwrap().name, e.name);
            }
        }
        assert!(engine_for("gopher").is_none());
    }
}
