//! The Redis engine: a name's holders live in one hash with an expiry, its
//! waiters in a queue, both changed only by Lua scripts that serve waiters
//! in arrival order and hand a release's lease to the next in the same call.

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::anyhow;
use redis::{Client, Connection, IntoConnectionInfo, Script, Value};

use std::path::PathBuf;
use std::sync::Arc;

use super::{
    Acquired, Address, AddressOptions, Broken, Caps, Engine, EngineInfo, Force, Held, Holder,
    Lease, Mode, Request, Status, Wait,
};
use crate::clock::{Boot, jitter};
use crate::exit::{Class, Failure, fail};
use crate::log;
use crate::schedule::Timing;
use crate::watchdog::{Renewal, Renewer};

/// Shared by every script. A name's state is one hash of holders, each
/// field `h:<owner>` (or `r:<token>` once revoked) with the value
/// `token|expires ms|mode|limit|slot|granted ms|label`, a waiter queue (a
/// sorted set of waiter ids by arrival, details in a hash) and one wake-up
/// list per waiter; a second sorted set holds until when each waiter
/// keeps its place. Times are the server's `TIME`; expired holders and dead
/// waiters are purged by whichever script looks first.
/// KEYS: lock, fence, queue, waiters, wake-up prefix, waiters' liveness.
const PRELUDE: &str = include_str!("scripts/prelude.lua");

/// ARGV: owner, label, ttl ms, mode (x s n), limit, queue ('1' wait, '0' -n),
/// waiter id, waiter lifetime ms, the `host:pid` of an outer lockrun holding
/// this name ('' when not run from inside one), '1' when a queued waiter
/// only comes to keep its place (nothing woke it), the waiter's arrival
/// number once it has one ('' before).
/// {1, token, slot} granted (idempotent for our owner value: a retried
/// acquire, or the confirmation of a grant handed over in the queue, gets a
/// full ttl); {0, holder} busy; {2, holder, ms until a holder ends, arrival
/// number} queued (a waiter only keeping its place hears no holder and no
/// number);
/// {3, mode, limit} the holders disagree with this request; {4} the outer
/// lockrun holds it (waiting would deadlock).
const ACQUIRE: &str = include_str!("scripts/acquire.lua");

/// KEYS: lock. ARGV: owner, ttl ms. 1 renewed, 0 not ours.
const RENEW: &str = include_str!("scripts/renew.lua");

/// ARGV: owner, waiter id. Gives up a lease (or a place in the queue, with
/// any grant handed over meanwhile) and serves the queue in the same call:
/// the next holder's grant is made here, one round trip for the hand-off.
/// 1 released, 0 not ours.
const RELEASE: &str = include_str!("scripts/release.lua");

/// Never returns an owner value. {now ms, waiters, rows…}, each holder as
/// eight fields: label, token, slot, mode, limit, ms left, ms held, revoked.
const INSPECT: &str = include_str!("scripts/inspect.lua");

/// ARGV: token ('' = every holder), now ('1'/'0').
/// {0} nothing held, {2, tokens…} no holder has that token, {3} already
/// revoked, {1, rows…} as INSPECT's rows for the holders broken.
/// Without `now`, a holder's owner value is replaced: its next renewal fails
/// and new grants still wait for the old expiry. With `now`, the holder goes
/// and the queue is served at once.
const FORCE: &str = include_str!("scripts/force.lua");

/// Server error codes that a restart, a failover or a cluster change produce
/// for a while: ridden out like a lost connection, never final.
const TRANSIENT: [&str; 7] = [
    "LOADING",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
];

/// Whether an error is worth retrying: a transport failure (timeout, reset,
/// refused) or one of the transient server states. Everything else the server
/// says (a wrong password, an ACL denial, a key of the wrong type, a script
/// error) is final.
fn is_transient(e: &redis::RedisError) -> bool {
    if matches!(e.kind(), redis::ErrorKind::Io | redis::ErrorKind::Parse)
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
    {
        return true;
    }
    if e.code().is_some_and(|c| TRANSIENT.contains(&c)) {
        return true;
    }
    // A script that fails on a write (a replica, a cluster in trouble) may
    // carry the code inside its own error text.
    let text = e.to_string();
    TRANSIENT.iter().any(|c| {
        text.split(|ch: char| !ch.is_ascii_alphabetic())
            .any(|w| w == *c)
    })
}

/// How one call to the server failed: worth retrying, or final.
#[derive(Debug)]
enum CallError {
    /// A lost connection, a timeout, a transient server state.
    Transient(String),
    /// The server answered for good (a wrong key type, an ACL denial, a
    /// script error): retrying will not help.
    Refused(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Transient(m) | CallError::Refused(m) => f.write_str(m),
        }
    }
}

// Each script's SHA1 is computed once, on first use.
fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}
static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(ACQUIRE));
static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RENEW));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RELEASE));
static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(INSPECT));
static FORCE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(FORCE));

/// Every key of one name, all under one hash tag (one Cluster slot).
#[derive(Clone)]
struct Keys {
    lock: String,
    fence: String,
    queue: String,
    waiters: String,
    wake: String,
    alive: String,
}

impl Keys {
    fn new(prefix: &str, name: &str) -> Keys {
        let lock = format!("{prefix}{{{name}}}");
        Keys {
            fence: format!("{lock}:fence"),
            queue: format!("{lock}:queue"),
            waiters: format!("{lock}:waiters"),
            wake: format!("{lock}:wake:"),
            alive: format!("{lock}:alive"),
            lock,
        }
    }

    fn on<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.lock)
            .key(&self.fence)
            .key(&self.queue)
            .key(&self.waiters)
            .key(&self.wake)
            .key(&self.alive);
        inv
    }
}

/// One connection to one server, reconnected on demand.
struct Link {
    client: Client,
    conn: Option<Connection>,
    display: String,
    /// Bounds one request, connect included.
    op: Duration,
    /// The server has answered at least once: later transport errors may be
    /// a restart worth waiting out, earlier ones are misconfiguration.
    replied: bool,
}

impl Link {
    fn conn(&mut self) -> Result<&mut Connection, CallError> {
        if self.conn.is_none() {
            self.conn = Some(reconnect(&self.client, self.op).map_err(CallError::Transient)?);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    /// Run a call; any transport error drops the connection, since its state is unknown.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, CallError> {
        let conn = self.conn()?;
        match f(conn) {
            Ok(v) => {
                self.replied = true;
                Ok(v)
            }
            Err(e) => {
                if !is_transient(&e) {
                    self.replied = true;
                    return Err(CallError::Refused(describe(&e)));
                }
                if e.code().is_some() {
                    // A transient state reported by a server that does answer.
                    self.replied = true;
                }
                self.conn = None;
                Err(CallError::Transient(describe(&e)))
            }
        }
    }

    /// The end of an operation that failed: 69 with what was being done.
    fn unavailable(&self, doing: &str, e: CallError) -> Failure {
        fail(
            Class::Unavailable,
            format!("{doing} on {}: {e}", self.display),
        )
    }
}

fn connect(client: &Client, timeout: Duration) -> redis::RedisResult<Connection> {
    let conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    Ok(conn)
}

/// A new connection after the first one, bounded as a whole (name resolution
/// included, which no socket timeout covers): a resolver that stopped
/// answering must not hang a waiter or the release at the end of a run.
fn reconnect(client: &Client, timeout: Duration) -> Result<Connection, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let client = client.clone();
    std::thread::Builder::new()
        .name("lockrun-connect".into())
        .spawn(move || {
            let _ = tx.send(connect(&client, timeout));
        })
        .map_err(|e| format!("cannot start a thread to connect: {e}"))?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(format!(
            "no connection within {timeout:?} (name resolution or connect stalled)"
        )),
    }
}

fn client_for(spec: &RedisUrl) -> Result<Client, Failure> {
    let bad_url =
        |e: redis::RedisError| fail(Class::Usage, format!("invalid --url {}: {e}", spec.display));
    let info = spec.url.as_str().into_connection_info().map_err(bad_url)?;
    // CLIENT SETINFO costs a round trip on every connect and tells the server nothing it needs.
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let info = info.set_redis_settings(settings);
    if !spec.tls {
        return Client::open(info).map_err(bad_url);
    }
    // One crypto provider for rustls; a second install attempt is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if spec.insecure {
        log::warn(format!(
            "{}: TLS certificate checks are off (#insecure)",
            spec.display
        ));
    }
    let root_cert = match &spec.ca_file {
        None => None,
        Some(path) => Some(std::fs::read(path).map_err(|e| {
            fail(
                Class::Usage,
                format!("cannot read --tls-ca {}: {e}", path.display()),
            )
        })?),
    };
    Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls: None,
            root_cert,
        },
    )
    .map_err(bad_url)
}

fn is_auth_error(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || e.code().is_some_and(|c| c == "WRONGPASS" || c == "NOAUTH")
}

/// Describe a Redis error without ever including the server's echo of our arguments.
fn describe(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    if e.is_connection_refusal() {
        return "connection refused".into();
    }
    if is_auth_error(e) {
        return "the server refused the credentials (check the user and password in the URL)"
            .into();
    }
    let text = e.to_string();
    if text.contains("certificate") {
        return format!(
            "TLS: the server's certificate is not trusted ({}); pass its CA with --tls-ca",
            log::scrub(&text)
        );
    }
    if text.contains("WRONGTYPE") || text.contains("LOCKRUN the key exists") {
        return "a key at this lock's name is not a lockrun lease (wrong type); \
                remove it or choose another --prefix"
            .into();
    }
    // A server error reads as the server said it ("LOADING Redis is loading…").
    if let (Some(code), Some(detail)) = (e.code(), e.detail()) {
        return log::scrub(&format!("{code} {detail}"));
    }
    log::scrub(&text)
}

/// An integer in a script's reply array (Lua numbers come back as integers,
/// stored hash fields as strings).
fn int_at(v: &[Value], i: usize) -> Option<i64> {
    match v.get(i) {
        Some(Value::Int(n)) => Some(*n),
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// A string in a script's reply array.
fn text_at(v: &[Value], i: usize) -> Option<String> {
    match v.get(i) {
        Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

/// Jittered exponential backoff after `failures` failed requests in a row.
fn backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(25).saturating_mul(1 << failures.min(10));
    jitter(base.min(Duration::from_secs(1)))
}

/// Keep trying after transport errors for this long before giving up with 69.
fn outage_budget(timing: &Timing) -> Duration {
    timing.ttl.max(Duration::from_secs(5))
}

fn mode_args(mode: Mode) -> (&'static str, u32) {
    (mode.code(), mode.limit())
}

fn mode_from(code: Option<&str>, limit: Option<i64>) -> Mode {
    let limit = limit.map(|n| n.clamp(1, i64::from(u32::MAX)) as u32);
    Mode::from_code(code.unwrap_or("x"), limit)
}

/// Holders from a reply's rows of eight fields, starting at `at`.
fn holders_from(v: &[Value], at: usize) -> Vec<Holder> {
    let mut out = Vec::new();
    let mut i = at;
    while i + 8 <= v.len() {
        let mode = mode_from(text_at(v, i + 3).as_deref(), int_at(v, i + 4));
        out.push(Holder {
            label: text_at(v, i).filter(|s| !s.is_empty()),
            token: int_at(v, i + 1).map(|t| t as u64),
            slot: int_at(v, i + 2)
                .filter(|s| *s >= 0 && matches!(mode, Mode::Limit(_)))
                .map(|s| s as u32),
            mode,
            ttl_left: int_at(v, i + 5).map(|ms| Duration::from_millis(ms.max(0) as u64)),
            held_for: int_at(v, i + 6).map(|ms| Duration::from_millis(ms.max(0) as u64)),
            revoked: int_at(v, i + 7) == Some(1),
        });
        i += 8;
    }
    out
}

/// Random hex for a waiter's place in the queue (public, unlike the owner value).
fn waiter_id() -> String {
    let mut bytes = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    let pid = std::process::id();
    let mut id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    id.push_str(&format!("{pid:x}"));
    id
}

/// The Redis engine at one address.
/// Redis's row of the scheme table.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "Redis",
    schemes: &["redis", "rediss"],
    form: "redis://[user][:pass@]host[:port][/db], rediss://…",
    parse,
    // Leases are asked for in milliseconds (PX / the boot clock).
    ttl_step: Duration::from_millis(1),
    ttl_min: Duration::ZERO,
    caps: Caps {
        expires: true,
        force_release: true,
        shared: true,
        limit: true,
    },
};

/// A Redis server's address (README "Redis").
#[derive(Debug, Clone)]
pub struct RedisUrl {
    /// The URL as given, handed to the redis crate; holds the password, never printed.
    pub url: String,
    /// The URL with any password replaced, for messages.
    pub display: String,
    pub password: Option<String>,
    pub tls: bool,
    pub insecure: bool,
    pub ca_file: Option<PathBuf>,
}

impl Address for RedisUrl {
    fn engine(&self) -> &'static EngineInfo {
        &ENGINE
    }
    fn shown(&self) -> String {
        self.display.clone()
    }
    fn secret(&self) -> Option<&str> {
        self.password.as_deref()
    }
    fn check_name(&self, name: &str) -> Result<(), Failure> {
        if name.contains(['{', '}']) {
            return Err(fail(
                Class::Usage,
                format!(
                    "invalid lock name {name:?}: '{{' and '}}' are not allowed on Redis (the name is the key's hash tag)"
                ),
            ));
        }
        Ok(())
    }
    fn check_prefix(&self, prefix: &str) -> Result<(), Failure> {
        if prefix.contains(['{', '}']) {
            return Err(fail(
                Class::Usage,
                format!(
                    "invalid --prefix {prefix:?}: it may not contain '{{' or '}}' (the lock name is the hash tag)"
                ),
            ));
        }
        Ok(())
    }
    fn open(&self, prefix: &str, op: Duration) -> Result<Box<dyn Engine>, Failure> {
        Ok(Box::new(Redis::connect(self, prefix, op)?))
    }
}

/// Parse `redis://[user][:pass@]host[:port][/db]` or `rediss://…`.
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Failure> {
    let usage = |msg: String| fail(Class::Usage, msg);
    let expected = format!("expected {}", ENGINE.form);
    // Never echo the raw URL: it may hold a password.
    let url = url::Url::parse(raw).map_err(|e| usage(format!("invalid --url: {e}; {expected}")))?;
    let mut shown = url.clone();
    if url.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    let display = shown.to_string();
    if url.host_str().is_none_or(str::is_empty) {
        return Err(usage(format!(
            "invalid --url {display}: missing host; {expected}"
        )));
    }
    let db = url.path().trim_matches('/');
    // Redis numbers its databases with a C int.
    if !db.is_empty()
        && db
            .parse::<u32>()
            .ok()
            .filter(|d| *d <= i32::MAX as u32)
            .is_none()
    {
        return Err(usage(format!(
            "invalid --url {display}: database {db:?} is not a number from 0 to {}; {expected}",
            i32::MAX
        )));
    }
    let tls = url.scheme() == "rediss";
    let insecure = match url.fragment() {
        None => false,
        Some("insecure") if tls => true,
        Some(_) => {
            return Err(usage(format!(
                "invalid --url {display}: the only fragment accepted is #insecure, on rediss://"
            )));
        }
    };
    if url.query().is_some() {
        return Err(usage(format!(
            "invalid --url {display}: query parameters are not supported; {expected}"
        )));
    }
    let ca_file = if tls {
        opts.tls_ca.clone()
    } else {
        opts.no_tls(&display)?;
        None
    };
    let password = url.password().map(|p| {
        url::form_urlencoded::parse(format!("p={p}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    });
    Ok(Arc::new(RedisUrl {
        url: raw.to_string(),
        display,
        password,
        tls,
        insecure,
        ca_file,
    }))
}

pub struct Redis {
    link: Link,
    prefix: String,
}

impl Redis {
    pub fn connect(url: &RedisUrl, prefix: &str, op: Duration) -> Result<Redis, Failure> {
        let client = client_for(url)?;
        log::info(format!("connecting to {}", url.display));
        let started = Boot::now();
        let conn = connect(&client, op.max(Duration::from_millis(500))).map_err(|e| {
            let msg = if is_auth_error(&e) {
                let user = url::Url::parse(&url.url)
                    .ok()
                    .map(|u| u.username().to_string())
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| "default".into());
                format!(
                    "Redis at {} refused the credentials of user {user}: check the user and password in the URL",
                    url.display
                )
            } else {
                format!("cannot reach Redis at {}: {}", url.display, describe(&e))
            };
            fail(Class::Unavailable, msg)
        })?;
        log::info(format!("connected in {:.1?}", Boot::now().since(started)));
        let mut r = Redis {
            link: Link {
                client,
                conn: Some(conn),
                display: url.display.clone(),
                op,
                replied: false,
            },
            prefix: prefix.to_string(),
        };
        if log::level() >= 2 {
            r.warn_on_eviction();
        }
        Ok(r)
    }

    /// An evicted lease is a broken lock: say so when the policy is readable.
    fn warn_on_eviction(&mut self) {
        let reply: Result<Vec<String>, _> = self.link.call(|c| {
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query(c)
        });
        if let Ok(v) = reply
            && let Some(policy) = v.get(1)
            && policy != "noeviction"
        {
            log::warn(format!(
                "Redis maxmemory-policy is {policy}; lockrun needs noeviction (an evicted lease is a broken lock)"
            ));
        }
    }

    /// Block on our wake-up list for at most `timeout`.
    /// Some(true): woken by a grant; Some(false): by a refusal; None: timed out.
    fn wait_for_wakeup(&mut self, key: &str, timeout: Duration) -> Result<Option<bool>, CallError> {
        let op = self.link.op;
        let mut cut = false;
        let woken = self.link.call(|c| {
            // Redis ends a BLPOP's timeout only when it next looks at its
            // blocked clients, up to 1/hz (100 ms) late: `--wait`, a place
            // in the queue and a holder's end must not wait for that. Our
            // read timeout ends the wait at its time; the server's, later,
            // only cleans up after us.
            c.set_read_timeout(Some(timeout))?;
            let popped: Option<(String, String)> = match redis::cmd("BLPOP")
                .arg(key)
                .arg(format!("{:.3}", (timeout + op).as_secs_f64()))
                .query(c)
            {
                Ok(p) => p,
                Err(e) if e.is_timeout() => {
                    cut = true;
                    return Ok(None);
                }
                Err(e) => return Err(e),
            };
            c.set_read_timeout(Some(op))?;
            Ok(popped.map(|(_, v)| v != "refused"))
        });
        if cut {
            // The BLPOP still stands on the server: a new connection for
            // the next call. A wake-up it takes from our list is not lost
            // news: the grant or refusal is in the queue's state, which
            // the next call reads.
            self.link.conn = None;
        }
        woken
    }

    fn leave_queue(link: &mut Link, keys: &Keys, owner: &str, id: &str) -> Result<bool, CallError> {
        let script = &*RELEASE_SCRIPT;
        link.call(|c| keys.on(script).arg(owner).arg(id).invoke::<i64>(c))
            .map(|n| n == 1)
    }
}

impl Engine for Redis {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Failure> {
        let keys = Keys::new(&self.prefix, req.name);
        let id = waiter_id();
        let wake_key = format!("{}{id}", keys.wake);
        let timing = req.timing;
        let ttl_ms = timing.ttl.as_millis() as u64;
        // A queued waiter keeps its place for a third of its ttl, so one
        // killed in the queue is dropped from it within that; it renews its
        // place `op` (the bound on one request) before the place would lapse.
        let alive = (timing.ttl / 3).max(Duration::from_millis(100));
        let refresh = alive.saturating_sub(timing.op).max(alive / 2);
        let (mode, limit) = mode_args(req.mode);
        let queue = if wait == Wait::No { "0" } else { "1" };
        // The `host:pid` of an outer lockrun whose job we run in, if it
        // holds this very name.
        let outer = req.outer.clone().unwrap_or_default();
        let start = Boot::now();
        let give_up_at = match wait {
            Wait::No => Some(start),
            Wait::For(d) => Some(start.add(d)),
            Wait::Forever => None,
        };
        let mut failing_since: Option<Boot> = None;
        let mut failures = 0u32;
        // Under -q there is no waiting line to print, and no reason to wake for it.
        let mut announced = req.quiet;
        let mut holder: Option<String> = None;
        // When the soonest holder's lease runs out on its own, as last heard
        // at the head of the queue, and whether the next call only keeps our
        // place.
        let mut holder_end: Option<Boot> = None;
        let mut keep_only = false;
        // Our arrival number once queued: a place that lapsed while we
        // lived (a server paused past ttl/3) is taken back at it.
        let mut place: Option<i64> = None;
        loop {
            let script = &*ACQUIRE_SCRIPT;
            let sent_at = Boot::now();
            let reply = self.link.call(|c| {
                keys.on(script)
                    .arg(&req.owner.secret)
                    .arg(&req.owner.shown)
                    .arg(ttl_ms)
                    .arg(mode)
                    .arg(limit)
                    .arg(queue)
                    .arg(&id)
                    .arg(alive.as_millis() as u64)
                    .arg(&outer)
                    .arg(if keep_only { "1" } else { "0" })
                    .arg(place.map(|n| n.to_string()).unwrap_or_default())
                    .invoke::<Vec<Value>>(c)
            });
            let v = match reply {
                Ok(v) => {
                    failing_since = None;
                    failures = 0;
                    v
                }
                Err(e @ CallError::Refused(_)) => {
                    return Err(self.link.unavailable(&format!("acquiring {}", req.name), e));
                }
                Err(e) if !self.link.replied => {
                    return Err(self.link.unavailable(&format!("acquiring {}", req.name), e));
                }
                Err(e) => {
                    failures += 1;
                    let since = *failing_since.get_or_insert_with(Boot::now);
                    let now = Boot::now();
                    if give_up_at.is_some_and(|g| now >= g)
                        || now.since(since) >= outage_budget(&timing)
                    {
                        // A reply may have been lost after the server granted
                        // it; this gives back only what is ours.
                        let _ = Self::leave_queue(&mut self.link, &keys, &req.owner.secret, &id);
                        return Err(self.link.unavailable(&format!("acquiring {}", req.name), e));
                    }
                    log::info(format!("acquire failed: {e}; retrying"));
                    std::thread::sleep(backoff(failures));
                    continue;
                }
            };
            match int_at(&v, 0) {
                Some(1) => {
                    let token = int_at(&v, 1)
                        .ok_or_else(|| fail(Class::Internal, "acquire script returned no token"))?
                        as u64;
                    let slot = int_at(&v, 2)
                        .filter(|s| *s >= 0 && matches!(req.mode, Mode::Limit(_)))
                        .map(|s| s as u32);
                    log::info(format!(
                        "acquired {} with token {token} after {:.1?}",
                        req.name,
                        Boot::now().since(start)
                    ));
                    let held = RedisHeld {
                        link: Link {
                            client: self.link.client.clone(),
                            conn: self.link.conn.take(),
                            display: self.link.display.clone(),
                            op: self.link.op,
                            replied: true,
                        },
                        keys,
                        owner: req.owner.secret.clone(),
                        id,
                        name: req.name.to_string(),
                        timing,
                    };
                    return Ok(Acquired::Granted(Lease::new(
                        token,
                        slot,
                        sent_at,
                        // PEXPIREAT with the ttl asked: Redis grants what it is asked.
                        timing.ttl,
                        Box::new(held),
                    )));
                }
                Some(3) => {
                    let in_force = mode_from(text_at(&v, 1).as_deref(), int_at(&v, 2));
                    return Err(req.mode.disagreement(req.name, in_force));
                }
                Some(4) => return Err(super::nested(req.name)),
                Some(0) | Some(2) => {}
                _ => return Err(fail(Class::Internal, "acquire script: unexpected reply")),
            }
            if int_at(&v, 0) == Some(2)
                && let Some(n) = int_at(&v, 3)
            {
                place = Some(n);
            }
            // A waiter keeping its place hears no holder: keep the last one heard.
            if let Some(h) = text_at(&v, 1).filter(|l| !l.is_empty()) {
                holder = Some(h);
            }
            let holder = holder.clone();
            let now = Boot::now();
            if int_at(&v, 0) == Some(0) || give_up_at.is_some_and(|g| now >= g) {
                if int_at(&v, 0) == Some(2) {
                    // Out of the queue; a grant handed over meanwhile goes to the next.
                    let _ = Self::leave_queue(&mut self.link, &keys, &req.owner.secret, &id);
                }
                return Ok(Acquired::Busy { holder });
            }
            if !announced && now >= start.add(Duration::from_secs(1)) {
                announced = true;
                super::announce_wait(req.name, holder.as_deref());
            }
            // Block until a release hands us the lease, but come back to keep
            // our place, when a holder's lease runs out on its own, to say we
            // wait, and when --wait runs out.
            if let Some(ms) = int_at(&v, 2).filter(|ms| *ms >= 0) {
                holder_end = Some(sent_at.add(Duration::from_millis(ms as u64 + 1)));
            }
            let mut timeout = refresh;
            match holder_end {
                Some(end) if end > now => timeout = timeout.min(end.since(now)),
                // Passed: the head looks at the holders when it comes; the
                // others do not need to.
                _ => holder_end = None,
            }
            if let Some(g) = give_up_at {
                timeout = timeout.min(g.since(now));
            }
            if !announced {
                timeout = timeout.min(start.add(Duration::from_secs(1)).since(now));
            }
            let timeout = timeout.max(Duration::from_millis(1));
            let woken = self.wait_for_wakeup(&wake_key, timeout);
            // Woken, the next call confirms the grant (with a full ttl
            // counted from its own sending) or looks again; otherwise it
            // only keeps our place (and at the head, checks the holders).
            keep_only = matches!(woken, Ok(None));
            match woken {
                Ok(_) => {}
                Err(e @ CallError::Refused(_)) => {
                    // BLPOP refused (an ACL without it, a foreign value at the
                    // wake-up key): final, never a retry loop.
                    let _ = Self::leave_queue(&mut self.link, &keys, &req.owner.secret, &id);
                    return Err(self
                        .link
                        .unavailable(&format!("waiting for {}", req.name), e));
                }
                Err(e) => {
                    log::info(format!("waiting failed: {e}; retrying"));
                    failures += 1;
                    std::thread::sleep(backoff(failures));
                }
            }
        }
    }

    fn status(&mut self, name: &str) -> Result<Status, Failure> {
        let keys = Keys::new(&self.prefix, name);
        let script = &*INSPECT_SCRIPT;
        let v = self
            .link
            .call(|c| keys.on(script).invoke::<Vec<Value>>(c))
            .map_err(|e| self.link.unavailable(&format!("reading {name}"), e))?;
        Ok(Status {
            holders: holders_from(&v, 2),
            waiters: int_at(&v, 1).map(|n| n.max(0) as u64),
        })
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Failure> {
        let keys = Keys::new(&self.prefix, name);
        let script = &*FORCE_SCRIPT;
        let token = force.token.map(|t| t.to_string()).unwrap_or_default();
        let now = if force.now { "1" } else { "0" };
        let v = self
            .link
            .call(|c| keys.on(script).arg(&token).arg(now).invoke::<Vec<Value>>(c))
            .map_err(|e| self.link.unavailable(&format!("releasing {name}"), e))?;
        Ok(match int_at(&v, 0) {
            Some(0) => Broken::NotHeld,
            Some(2) => Broken::TokenMismatch(
                (1..v.len())
                    .filter_map(|i| int_at(&v, i).map(|t| t as u64))
                    .collect(),
            ),
            Some(3) => Broken::AlreadyRevoked,
            _ => Broken::Leases(holders_from(&v, 1)),
        })
    }
}

/// A Redis lease: the connection it was granted on, kept for its release.
struct RedisHeld {
    link: Link,
    keys: Keys,
    owner: String,
    id: String,
    name: String,
    timing: Timing,
}

impl Held for RedisHeld {
    fn renewer(&self) -> Option<Box<dyn Renewer>> {
        Some(Box::new(RedisRenewer {
            client: self.link.client.clone(),
            conn: None,
            lock: self.keys.lock.clone(),
            owner: self.owner.clone(),
            timing: self.timing,
        }))
    }

    fn release(mut self: Box<Self>) -> Result<bool, Failure> {
        let started = Boot::now();
        let mut last = None;
        // The connection sat idle while the job ran; one retry on a fresh
        // connection covers a server that dropped it.
        for _ in 0..2 {
            match Redis::leave_queue(&mut self.link, &self.keys, &self.owner, &self.id) {
                Ok(ours) => {
                    log::info(format!(
                        "released {} in {:.1?}",
                        self.name,
                        Boot::now().since(started)
                    ));
                    return Ok(ours);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(self.link.unavailable(
            &format!("releasing {}", self.name),
            last.expect("two attempts"),
        ))
    }
}

struct RedisRenewer {
    client: Client,
    conn: Option<Connection>,
    lock: String,
    owner: String,
    timing: Timing,
}

impl Renewer for RedisRenewer {
    fn fresh(&self) -> Box<dyn Renewer> {
        Box::new(RedisRenewer {
            client: self.client.clone(),
            conn: None,
            lock: self.lock.clone(),
            owner: self.owner.clone(),
            timing: self.timing,
        })
    }

    fn renew(&mut self) -> anyhow::Result<Renewal> {
        if self.conn.is_none() {
            self.conn =
                Some(connect(&self.client, self.timing.op).map_err(|e| anyhow!(describe(&e)))?);
        }
        let conn = self.conn.as_mut().expect("just connected");
        let r = RENEW_SCRIPT
            .key(&self.lock)
            .arg(&self.owner)
            .arg(self.timing.ttl.as_millis() as u64)
            .invoke::<i64>(conn);
        match r {
            Ok(1) => Ok(Renewal::Renewed {
                ttl: self.timing.ttl,
            }),
            Ok(_) => Ok(Renewal::Lost),
            Err(e) => {
                // Unknown state after a timeout: start over on a new connection.
                self.conn = None;
                Err(anyhow!(describe(&e)))
            }
        }
    }
}
