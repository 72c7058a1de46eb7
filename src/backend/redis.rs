//! The Redis backend: a lease is a hash key with an expiry, changed only by
//! Lua scripts, with a fencing counter and a one-element wake-up list per lock.

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::{Context, anyhow};
use redis::{Client, Connection, IntoConnectionInfo, Script, Value};

use super::{Acquired, Backend, Broken, Force, Grant, Holder, Inspect, Owner, is_own_outer_holder};
use crate::config::{RedisUrl, Wait};
use crate::exit::{Failure, Class, ResultExt, fail};
use crate::lease::{Boot, Renewer, Timing, jitter};
use crate::log;

/// KEYS: lock, fence. ARGV: owner, label, ttl ms.
/// Idempotent for our own owner value, so a retried acquire whose first reply
/// was lost gets its token back with a fresh full ttl.
const ACQUIRE: &str = r#"
-- Arguments are checked before anything is written: no key without expiry.
local ttl = tonumber(ARGV[3])
if not ttl or ttl < 1 or ttl > 604800000 or ttl % 1 ~= 0 then
  return redis.error_reply('LOCKRUN invalid expiry ' .. tostring(ARGV[3]))
end
local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'label')
if h[1] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {1, tonumber(h[2])}
end
if h[1] then
  return {0, redis.call('PTTL', KEYS[1]), h[3] or ''}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.error_reply('LOCKRUN the key exists but is not a lockrun lease')
end
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- The counter floored by the server clock: tokens keep growing even when a
-- restart or a failover lost the counter.
local token = redis.call('INCR', KEYS[2])
if token < now_us then
  token = now_us
  redis.call('SET', KEYS[2], string.format('%d', token))
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'label', ARGV[2],
  'token', string.format('%d', token), 'granted', string.format('%d', math.floor(now_us / 1000)))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, token}
"#;

/// KEYS: lock. ARGV: owner, ttl ms. 1 renewed, 0 not ours.
const RENEW: &str = r#"
-- Arguments are checked before anything is written: no key without expiry.
local ttl = tonumber(ARGV[2])
if not ttl or ttl < 1 or ttl > 604800000 or ttl % 1 ~= 0 then
  return redis.error_reply('LOCKRUN invalid expiry ' .. tostring(ARGV[2]))
end
local owner = redis.pcall('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

/// KEYS: lock, signal. ARGV: owner, wake-up lifetime ms. 1 released, 0 not ours.
const RELEASE: &str = r#"
-- Arguments are checked before anything is written: no key without expiry.
local ttl = tonumber(ARGV[2])
if not ttl or ttl < 1 or ttl > 604800000 or ttl % 1 ~= 0 then
  return redis.error_reply('LOCKRUN invalid expiry ' .. tostring(ARGV[2]))
end
local owner = redis.pcall('HGET', KEYS[1], 'owner')
if owner ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('RPUSH', KEYS[2], '1')
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"#;

/// KEYS: lock. Never returns the owner value.
/// {0} free, or {1, label, token, granted ms, pttl, now ms, revoked}.
const INSPECT: &str = r#"
local h = redis.call('HMGET', KEYS[1], 'owner', 'label', 'token', 'granted')
if not h[1] then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return redis.error_reply('LOCKRUN the key exists but is not a lockrun lease')
  end
  return {0}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {1, h[2] or '', h[3] or '', h[4] or '', redis.call('PTTL', KEYS[1]),
  now_ms, h[1] == 'revoked' and 1 or 0}
"#;

/// KEYS: lock, signal. ARGV: token ('' = any), now ('1'/'0'), wake-up lifetime ms.
/// {0} nothing held, {2, token} token mismatch, {3} already revoked,
/// {1, label, token, granted, pttl, now ms}.
/// Without `now`, the owner value is replaced: the holder's next renewal fails
/// and new grants still wait for the old expiry.
const FORCE: &str = r#"
-- Arguments are checked before anything is written: no key without expiry.
local ttl = tonumber(ARGV[3])
if not ttl or ttl < 1 or ttl > 604800000 or ttl % 1 ~= 0 then
  return redis.error_reply('LOCKRUN invalid expiry ' .. tostring(ARGV[3]))
end
local h = redis.call('HMGET', KEYS[1], 'owner', 'label', 'token', 'granted')
if not h[1] then
  return {0}
end
if h[1] == 'revoked' and ARGV[2] ~= '1' then
  return {3}
end
if ARGV[1] ~= '' and h[3] ~= ARGV[1] then
  return {2, h[3] or ''}
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[2] == '1' then
  redis.call('DEL', KEYS[1])
  redis.call('DEL', KEYS[2])
  redis.call('RPUSH', KEYS[2], '1')
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
else
  redis.call('HSET', KEYS[1], 'owner', 'revoked')
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {1, h[2] or '', h[3] or '', h[4] or '', pttl, now_ms}
"#;

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

/// The server answered with a final error (wrong key type, ACL denial, script error).
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

// Each script's SHA1 is computed once, on first use.
static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT));
static FORCE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(FORCE));

/// How long a release's wake-up waits for a waiter before it expires.
const WAKE_LIFETIME_MS: u64 = 2000;

struct Keys {
    lock: String,
    fence: String,
    signal: String,
}

pub struct Redis {
    client: Client,
    conn: Option<Connection>,
    display: String,
    name: String,
    keys: Keys,
    owner: Owner,
    timing: Timing,
    /// The server has answered at least once: later transport errors may be
    /// a restart worth waiting out, earlier ones are misconfiguration.
    replied: bool,
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
fn reconnect(client: &Client, timeout: Duration) -> anyhow::Result<Connection> {
    let (tx, rx) = std::sync::mpsc::channel();
    let client = client.clone();
    std::thread::Builder::new()
        .name("lockrun-connect".into())
        .spawn(move || {
            let _ = tx.send(connect(&client, timeout));
        })
        .map_err(|e| anyhow!("cannot start a thread to connect: {e}"))?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(anyhow!(describe(&e))),
        Err(_) => Err(anyhow!(
            "no connection within {:?} (name resolution or connect stalled)",
            timeout
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

impl Redis {
    pub fn connect(
        spec: &RedisUrl,
        prefix: &str,
        name: &str,
        owner: Owner,
        timing: Timing,
    ) -> Result<Redis, Failure> {
        let client = client_for(spec)?;
        log::info(format!("connecting to {}", spec.display));
        let started = Boot::now();
        let conn = connect(&client, timing.op.max(Duration::from_millis(500))).map_err(|e| {
            let msg = if is_auth_error(&e) {
                let user = url::Url::parse(&spec.url)
                    .ok()
                    .map(|u| u.username().to_string())
                    .filter(|u| !u.is_empty())
                    .unwrap_or_else(|| "default".into());
                format!(
                    "Redis at {} refused the credentials of user {user}: check the user and password in the URL",
                    spec.display
                )
            } else {
                format!("cannot reach Redis at {}: {}", spec.display, describe(&e))
            };
            fail(Class::Unavailable, msg)
        })?;
        log::info(format!("connected in {:.1?}", Boot::now().since(started)));
        let lock = format!("{prefix}{{{name}}}");
        let mut r = Redis {
            client,
            conn: Some(conn),
            display: spec.display.clone(),
            name: name.to_string(),
            keys: Keys {
                fence: format!("{lock}:fence"),
                signal: format!("{lock}:signal"),
                lock,
            },
            owner,
            timing,
            replied: false,
        };
        if log::level() >= 2 {
            r.warn_on_eviction();
        }
        Ok(r)
    }

    /// An evicted lease is a broken lock: say so when the policy is readable.
    fn warn_on_eviction(&mut self) {
        let Ok(conn) = self.conn() else { return };
        let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query(conn);
        if let Ok(v) = reply
            && let Some(policy) = v.get(1)
            && policy != "noeviction"
        {
            log::warn(format!(
                "Redis maxmemory-policy is {policy}; lockrun needs noeviction (an evicted lease is a broken lock)"
            ));
        }
    }

    fn conn(&mut self) -> anyhow::Result<&mut Connection> {
        if self.conn.is_none() {
            self.conn = Some(reconnect(&self.client, self.timing.op)?);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    /// Run a call; any error drops the connection, since its state is unknown.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> anyhow::Result<T> {
        let conn = self.conn()?;
        match f(conn) {
            Ok(v) => {
                self.replied = true;
                Ok(v)
            }
            Err(e) => {
                if !is_transient(&e) {
                    // The server answered for good: retrying won't help.
                    self.replied = true;
                    return Err(anyhow::Error::new(Refused(describe(&e))));
                }
                if e.code().is_some() {
                    // A transient state reported by a server that does answer.
                    self.replied = true;
                }
                // Its state is unknown after an error: start over on a new connection.
                self.conn = None;
                Err(anyhow!(describe(&e)))
            }
        }
    }

    fn try_acquire(&mut self) -> anyhow::Result<(Boot, Vec<Value>)> {
        let script = &*ACQUIRE_SCRIPT;
        let (lock, fence) = (self.keys.lock.clone(), self.keys.fence.clone());
        let (secret, label) = (self.owner.secret.clone(), self.owner.shown.clone());
        let ttl_ms = self.timing.ttl.as_millis() as u64;
        let sent_at = Boot::now();
        let v = self.call(|c| {
            script
                .key(&lock)
                .key(&fence)
                .arg(&secret)
                .arg(&label)
                .arg(ttl_ms)
                .invoke::<Vec<Value>>(c)
        })?;
        Ok((sent_at, v))
    }

    /// Block on the wake-up list for at most `timeout`. Ok(true): woken by a release.
    fn wait_for_wakeup(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        let signal = self.keys.signal.clone();
        let op = self.timing.op;
        self.call(|c| {
            c.set_read_timeout(Some(timeout + op))?;
            let popped: Option<(String, String)> = redis::cmd("BLPOP")
                .arg(&signal)
                .arg(format!("{:.3}", timeout.as_secs_f64()))
                .query(c)?;
            c.set_read_timeout(Some(op))?;
            Ok(popped.is_some())
        })
    }

    /// Hand a wake-up we took but will not use to the next waiter.
    fn put_back_wakeup(&mut self) {
        let signal = self.keys.signal.clone();
        let _ = self.call(|c| {
            redis::pipe()
                .cmd("RPUSH")
                .arg(&signal)
                .arg("1")
                .ignore()
                .cmd("PEXPIRE")
                .arg(&signal)
                .arg(WAKE_LIFETIME_MS)
                .ignore()
                .query::<()>(c)
        });
    }

    fn holder_from(v: &[Value]) -> Option<Holder> {
        let int = |i| int_at(v, i);
        if int(0) != Some(1) {
            return None;
        }
        let pttl = int(4).unwrap_or(-1);
        let granted = int(3);
        let now = int(5);
        Some(Holder {
            label: text_at(v, 1).filter(|s| !s.is_empty()),
            token: int(2).map(|t| t as u64),
            ttl_left: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
            held_for: match (granted, now) {
                (Some(g), Some(n)) if n >= g => Some(Duration::from_millis((n - g) as u64)),
                _ => None,
            },
            revoked: int(6) == Some(1),
        })
    }
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

impl Backend for Redis {
    fn acquire(&mut self, wait: Wait) -> Result<Acquired, Failure> {
        let start = Boot::now();
        let give_up_at = match wait {
            Wait::No => Some(start),
            Wait::For(d) => Some(start.add(d)),
            Wait::Forever => None,
        };
        let mut failing_since: Option<Boot> = None;
        let mut failures = 0u32;
        let mut announced_wait = false;
        loop {
            match self.try_acquire() {
                Ok((sent_at, v)) => {
                    failing_since = None;
                    failures = 0;
                    let int = |i| int_at(&v, i);
                    if int(0) == Some(1) {
                        let token = int(1).ok_or_else(|| {
                            fail(Class::Internal, "acquire script returned no token")
                        })? as u64;
                        log::info(format!(
                            "acquired {} with token {token} after {:.1?}",
                            self.name,
                            Boot::now().since(start)
                        ));
                        return Ok(Acquired::Granted(Grant { token, sent_at }));
                    }
                    let pttl = int(1).unwrap_or(-1);
                    let holder = text_at(&v, 2).filter(|l| !l.is_empty());
                    if is_own_outer_holder(&self.name, holder.as_deref()) {
                        return Err(super::nested(&self.name));
                    }
                    let now = Boot::now();
                    if give_up_at.is_some_and(|g| now >= g) {
                        return Ok(Acquired::Busy { holder });
                    }
                    if !announced_wait && now >= start.add(Duration::from_secs(1)) {
                        announced_wait = true;
                        super::announce_wait(&self.name, holder.as_deref());
                    }
                    // Block until a release wakes us, but never longer than the
                    // holder's lease could last or ttl/3 (a lease without expiry
                    // must not turn into an endless block).
                    let mut timeout = if pttl > 0 {
                        Duration::from_millis(pttl as u64)
                    } else {
                        self.timing.renew_every
                    };
                    timeout = timeout.min(self.timing.renew_every);
                    if let Some(g) = give_up_at {
                        timeout = timeout.min(g.since(now));
                    }
                    if !announced_wait {
                        // Look again when the wait has lasted a second, to say so.
                        timeout = timeout.min(start.add(Duration::from_secs(1)).since(now));
                    }
                    let timeout = timeout.max(Duration::from_millis(1));
                    match self.wait_for_wakeup(timeout) {
                        Ok(true) => {
                            if give_up_at.is_some_and(|g| Boot::now() >= g) {
                                self.put_back_wakeup();
                                return Ok(Acquired::Busy { holder });
                            }
                        }
                        Ok(false) => {}
                        Err(e) if e.downcast_ref::<Refused>().is_some() => {
                            // BLPOP refused (an ACL without it, a foreign value
                            // at the wake-up key): final, never a retry loop.
                            return Err(fail(
                                Class::Unavailable,
                                format!("waiting for {} on {}: {e:#}", self.name, self.display),
                            ));
                        }
                        Err(e) => {
                            log::info(format!("waiting failed: {e:#}; retrying"));
                            failures += 1;
                            std::thread::sleep(backoff(failures));
                        }
                    }
                }
                Err(e) if e.downcast_ref::<Refused>().is_some() || !self.replied => {
                    return Err(fail(
                        Class::Unavailable,
                        format!("acquiring {} on {}: {e:#}", self.name, self.display),
                    ));
                }
                Err(e) => {
                    failures += 1;
                    let since = *failing_since.get_or_insert_with(Boot::now);
                    let now = Boot::now();
                    let out_of_time = give_up_at.is_some_and(|g| now >= g)
                        || now.since(since) >= outage_budget(&self.timing);
                    if out_of_time {
                        // A reply may have been lost after the server granted
                        // it; release only deletes a lease that is ours.
                        let _ = self.release();
                        return Err(fail(
                            Class::Unavailable,
                            format!("acquiring {} on {}: {e:#}", self.name, self.display),
                        ));
                    }
                    log::info(format!("acquire failed: {e:#}; retrying"));
                    std::thread::sleep(backoff(failures));
                }
            }
        }
    }

    fn renewer(&mut self) -> anyhow::Result<Box<dyn Renewer>> {
        Ok(Box::new(RedisRenewer {
            client: self.client.clone(),
            conn: None,
            lock: self.keys.lock.clone(),
            secret: self.owner.secret.clone(),
            timing: self.timing,
        }))
    }

    fn release(&mut self) -> anyhow::Result<bool> {
        let script = &*RELEASE_SCRIPT;
        let (lock, signal) = (self.keys.lock.clone(), self.keys.signal.clone());
        let secret = self.owner.secret.clone();
        let started = Boot::now();
        let mut last = None;
        // The main connection sat idle while the job ran; one retry on a fresh
        // connection covers a server that dropped it.
        for _ in 0..2 {
            match self.call(|c| {
                script
                    .key(&lock)
                    .key(&signal)
                    .arg(&secret)
                    .arg(WAKE_LIFETIME_MS)
                    .invoke::<i64>(c)
            }) {
                Ok(n) => {
                    log::info(format!(
                        "released {} in {:.1?}",
                        self.name,
                        Boot::now().since(started)
                    ));
                    return Ok(n == 1);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("two attempts")).with_context(|| format!("releasing {}", self.name))
    }
}

impl Inspect for Redis {
    fn inspect(&mut self) -> Result<Option<Holder>, Failure> {
        let script = &*INSPECT_SCRIPT;
        let lock = self.keys.lock.clone();
        let v = self
            .call(|c| script.key(&lock).invoke::<Vec<Value>>(c))
            .with_context(|| format!("reading {} on {}", self.name, self.display))
            .exit_as(Class::Unavailable)?;
        Ok(Self::holder_from(&v))
    }

    fn force_release(&mut self, force: Force) -> Result<Broken, Failure> {
        let script = &*FORCE_SCRIPT;
        let (lock, signal) = (self.keys.lock.clone(), self.keys.signal.clone());
        let token = force.token.map(|t| t.to_string()).unwrap_or_default();
        let now = if force.now { "1" } else { "0" };
        let v = self
            .call(|c| {
                script
                    .key(&lock)
                    .key(&signal)
                    .arg(&token)
                    .arg(now)
                    .arg(WAKE_LIFETIME_MS)
                    .invoke::<Vec<Value>>(c)
            })
            .with_context(|| format!("releasing {} on {}", self.name, self.display))
            .exit_as(Class::Unavailable)?;
        match v.first() {
            Some(Value::Int(0)) => Ok(Broken::NotHeld),
            Some(Value::Int(2)) => Ok(Broken::TokenMismatch(int_at(&v, 1).map(|t| t as u64))),
            Some(Value::Int(3)) => Ok(Broken::AlreadyRevoked),
            // Reply layout matches INSPECT's minus the revoked flag.
            _ => Ok(Self::holder_from(&v).map_or(Broken::NotHeld, Broken::Lease)),
        }
    }
}

struct RedisRenewer {
    client: Client,
    conn: Option<Connection>,
    lock: String,
    secret: String,
    timing: Timing,
}

impl Renewer for RedisRenewer {
    fn fresh(&self) -> Box<dyn Renewer> {
        Box::new(RedisRenewer {
            client: self.client.clone(),
            conn: None,
            lock: self.lock.clone(),
            secret: self.secret.clone(),
            timing: self.timing,
        })
    }

    fn renew(&mut self) -> anyhow::Result<bool> {
        if self.conn.is_none() {
            self.conn =
                Some(connect(&self.client, self.timing.op).map_err(|e| anyhow!(describe(&e)))?);
        }
        let conn = self.conn.as_mut().expect("just connected");
        let r = RENEW_SCRIPT
            .key(&self.lock)
            .arg(&self.secret)
            .arg(self.timing.ttl.as_millis() as u64)
            .invoke::<i64>(conn);
        match r {
            Ok(n) => Ok(n == 1),
            Err(e) => {
                // Unknown state after a timeout: start over on a new connection.
                self.conn = None;
                Err(anyhow!(describe(&e)))
            }
        }
    }
}
