//! `lockrun doctor` on Redis: what would break a lease, read from the
//! server before the first incident (lockrun(1) "COMMANDS"). Only reads and dry
//! runs: INFO, CONFIG GET, TIME, ACL DRYRUN, and where the user may not
//! dry-run, a read-only script that asks `redis.acl_check_cmd`.

use std::time::Duration;

use redis::{Cmd, Connection, ErrorKind, RedisError, RedisResult, Script, Value};

use super::address::{Node, RedisUrl, Topology};
use super::connector::{Conn, Connector, connect};
use super::link::{describe, is_auth_error};
use super::verdicts::{eviction_check, persistence_check, replication_check, version_check};
use crate::backend::doctor::{clock_check, round_trip_check, shown, time_round_trips};
use crate::backend::{Check, Opening, Verdict};
use crate::clock::Boot;

/// Every command lockrun sends or its scripts run, with arguments shaped as
/// lockrun's own (keys under the prefix), for the permission check.
fn needed(prefix: &str) -> Vec<Vec<String>> {
    let lock = format!("{prefix}{{doctor}}");
    let fence = format!("{lock}:fence");
    let queue = format!("{lock}:queue");
    let wake = format!("{lock}:wake:1");
    let c = |parts: &[&str]| parts.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        c(&["evalsha", &"0".repeat(40), "1", &lock]),
        c(&["script", "load", "return 1"]),
        c(&["blpop", &wake, "1"]),
        c(&["rpush", &wake, "1"]),
        c(&["pexpire", &lock, "1000"]),
        c(&["pexpireat", &lock, "1"]),
        c(&["hget", &lock, "f"]),
        c(&["hset", &lock, "f", "v"]),
        c(&["hdel", &lock, "f"]),
        c(&["hgetall", &lock]),
        c(&["pttl", &lock]),
        c(&["time"]),
        c(&["incr", &fence]),
        c(&["set", &fence, "1"]),
        c(&["del", &lock]),
        c(&["zadd", &queue, "1", "m"]),
        c(&["zrange", &queue, "0", "-1"]),
        c(&["zrangebyscore", &queue, "0", "1"]),
        c(&["zrem", &queue, "m"]),
        c(&["zscore", &queue, "m"]),
        c(&["zcard", &queue]),
        c(&["zcount", &queue, "0", "1"]),
    ]
}

/// Asks, for each command (its word count, then its words), whether this
/// connection's user may run it; writes nothing (`no-writes`).
const ACL_CHECK: &str = "#!lua flags=no-writes
local out = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local cmd = {}
  for j = 1, n do cmd[j] = ARGV[i + j] end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(cmd))
  out[#out + 1] = (ok and allowed) and 1 or 0
  i = i + n + 1
end
return out
";

pub fn doctor(url: &RedisUrl, how: &Opening) -> Vec<Check> {
    let op = how.op;
    if let Topology::Cluster { nodes, .. } = &url.topology {
        return cluster(url, nodes, how);
    }
    let connector = match Connector::new(url, op) {
        Ok(c) => c,
        Err(e) => return vec![Check::fail("reachable", e.to_string())],
    };
    let started = Boot::now();
    let linked = match connector.connect(op.max(Duration::from_millis(500))) {
        Ok(l) => l,
        Err(e) => {
            let said = if is_auth_error(&e) {
                format!(
                    "Redis at {} refused the credentials of user {}: check the user and password in the URL",
                    url.display,
                    url.user()
                )
            } else {
                format!(
                    "cannot reach Redis at {}: {}; check the address and that the server runs",
                    url.display,
                    describe(&e)
                )
            };
            return vec![Check::fail("reachable", said)];
        }
    };
    let connected = Boot::now().since(started);
    let (Conn::One(mut conn), node) = (linked.conn, linked.node) else {
        return vec![Check::fail(
            "reachable",
            "a cluster where one server was asked for",
        )];
    };
    let at = node.map(|n| format!(" (master {n})")).unwrap_or_default();
    let who = format!("Redis at {}{at}", url.display);
    let mut asker = Asker::new(&mut conn, op);
    one_server(&mut asker, &who, connected, url, &how.prefix)
}

/// A cluster: each master by its address, from the list that the first
/// node to answer gives (CLUSTER NODES), one `reachable` line each; a
/// master that does not answer costs one bound, not one per check.
fn cluster(url: &RedisUrl, seeds: &[Node], how: &Opening) -> Vec<Check> {
    let (seed, text) = match cluster_nodes(url, seeds, how.op) {
        Ok(listed) => listed,
        Err(failed) => return vec![failed],
    };
    let masters: Vec<(Node, bool)> = text.lines().filter_map(super::cluster_node).collect();
    if masters.is_empty() {
        return vec![Check::fail(
            "reachable",
            format!("{seed} named no master in CLUSTER NODES: is it a cluster node?"),
        )];
    }
    // Every master at once: one that does not answer costs its bound once,
    // however many masters there are.
    let asked: Vec<_> = masters
        .into_iter()
        .map(|(m, flagged)| {
            let who = format!("master {m}");
            (who, flagged, check_master(url, m, how))
        })
        .collect();
    let mut out = Vec::new();
    for (who, flagged, checks) in asked {
        let checks = match checks.map(|t| t.join()) {
            Ok(Ok(checks)) => checks,
            _ => vec![Check::fail(
                "reachable",
                format!("{who}: not checked (no thread to ask it)"),
            )],
        };
        for c in checks {
            // The cluster's own view, beside ours, of a master that failed.
            let said = if c.topic == "reachable" && c.verdict == Verdict::Fail && flagged {
                format!("{} (the cluster marks it failing)", c.said)
            } else if c.topic == "reachable" {
                c.said
            } else {
                format!("{who}: {}", c.said)
            };
            out.push(Check { said, ..c });
        }
    }
    out
}

/// CLUSTER NODES from the first seed that answers, and which seed it was.
fn cluster_nodes<'a>(
    url: &RedisUrl,
    seeds: &'a [Node],
    op: Duration,
) -> Result<(&'a Node, String), Check> {
    let mut tried = Vec::new();
    for seed in seeds {
        let nodes = open(url, seed, op)
            .and_then(|mut c| redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut c));
        match nodes {
            Ok(text) => return Ok((seed, text)),
            Err(e) => tried.push(format!("{seed}: {}", describe(&e))),
        }
    }
    Err(Check::fail(
        "reachable",
        format!(
            "no node of the cluster at {} answered CLUSTER NODES ({}); check the addresses \
             and that the servers run",
            url.display,
            tried.join("; ")
        ),
    ))
}

/// The checks of one master, from a thread of its own.
fn check_master(
    url: &RedisUrl,
    m: Node,
    how: &Opening,
) -> std::io::Result<std::thread::JoinHandle<Vec<Check>>> {
    let (url, prefix, op) = (url.clone(), how.prefix.clone(), how.op);
    let checking = format!("master {m}");
    std::thread::Builder::new()
        .name("lockrun-doctor".into())
        .spawn(move || {
            let started = Boot::now();
            match open(&url, &m, op) {
                Ok(mut conn) => {
                    let connected = Boot::now().since(started);
                    let mut a = Asker::new(&mut conn, op);
                    one_server(&mut a, &checking, connected, &url, &prefix)
                }
                Err(e) => vec![Check::fail(
                    "reachable",
                    format!("cannot reach {checking}: {}", describe(&e)),
                )],
            }
        })
}

/// A connection to one node of a cluster, bounded by `op`.
fn open(url: &RedisUrl, node: &Node, op: Duration) -> RedisResult<Connection> {
    let client = url.client_at(node, true, true).map_err(|e| {
        RedisError::from((ErrorKind::InvalidClientConfig, "bad address", e.to_string()))
    })?;
    connect(&client, op)
}

/// The checks of one server take at most this many bounds of one request
/// (some thirty round trips; each may take up to one bound).
const BOUNDS: u32 = 8;

/// One server being checked. After a command that got no answer (nothing,
/// or nothing Redis would send) it sends nothing more: each would wait out
/// the bound again, and a check that got no answer must not read as one
/// the server refused. Nor does it start one past its time.
struct Asker<'c> {
    conn: &'c mut Connection,
    op: Duration,
    until: Boot,
    silent: Option<String>,
}

impl<'c> Asker<'c> {
    fn new(conn: &'c mut Connection, op: Duration) -> Asker<'c> {
        Asker {
            conn,
            op,
            until: Boot::now().add(op * BOUNDS),
            silent: None,
        }
    }

    fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        if self.silent.is_none() && Boot::now() >= self.until {
            self.silent = Some(format!(
                "the answers came too slowly to finish within {}",
                shown(self.op * BOUNDS)
            ));
        }
        if let Some(why) = &self.silent {
            return Err(RedisError::from((ErrorKind::Io, "no answer", why.clone())));
        }
        let sent = Boot::now();
        let reply = cmd.query::<Value>(self.conn);
        let took = Boot::now().since(sent);
        match &reply {
            Err(e) if e.code().is_none() => self.silent = Some(unanswered(e, self.op)),
            // Each read came in time, the whole did not (a trickling link).
            _ if took > self.op => {
                self.silent = Some(format!(
                    "an answer took {}, past the bound on one request ({})",
                    shown(took),
                    shown(self.op)
                ))
            }
            _ => {}
        }
        reply
    }

    fn ask<T: redis::FromRedisValue>(&mut self, cmd: &Cmd) -> Option<T> {
        self.send(cmd)
            .ok()
            .and_then(|v| redis::from_redis_value(v).ok())
    }

    /// The line for checks not made: the server stopped answering.
    fn stopped(&self, topic: &'static str) -> Option<Check> {
        self.silent.as_ref().map(|why| {
            Check::fail(
                topic,
                format!("not checked: {why}; check that the server runs and is not stopped or overloaded"),
            )
        })
    }
}

/// What a request that got no Redis answer met, in one line.
fn unanswered(e: &RedisError, op: Duration) -> String {
    if e.is_timeout() {
        format!("no answer within {}", shown(op))
    } else {
        describe(e)
    }
}

/// Every check of one server: that it answers (a connection the kernel
/// accepts proves nothing), the round trip and clock, its settings.
fn one_server(
    a: &mut Asker,
    who: &str,
    connected: Duration,
    url: &RedisUrl,
    prefix: &str,
) -> Vec<Check> {
    let mut out = Vec::new();
    let timed = time_samples(a);
    if let Some(why) = &a.silent
        && timed.answered == 0
    {
        out.push(Check::fail(
            "reachable",
            format!(
                "{who} accepted the connection but did not answer: {why}; check that the \
                 server runs and is not stopped or overloaded, and that the address is a Redis \
                 server's"
            ),
        ));
        return out;
    }
    out.push(Check::ok(
        "reachable",
        format!("{who} answered; connected in {}", shown(connected)),
    ));
    match (timed.worst, timed.refused) {
        (Some(rtt), None) if a.silent.is_none() || rtt > a.op => {
            out.push(round_trip_check(rtt, a.op))
        }
        (_, Some(e)) if e.code() == Some("NOPERM") => out.push(Check::fail(
            "round trip",
            "TIME is not allowed for this user: lockrun's scripts need TIME; allow +time",
        )),
        (_, Some(e)) => out.push(Check::fail(
            "round trip",
            format!("TIME failed: {}", describe(&e)),
        )),
        _ => {
            out.push(a.stopped("round trip").unwrap_or_else(|| {
                Check::fail("round trip", "TIME answered what Redis never does")
            }))
        }
    }
    if let Some(offset) = timed.offset {
        out.push(clock(offset));
    }
    out.extend(settings(a, url, prefix));
    out
}

/// What one server's INFO, CONFIG and ACLs say.
fn settings(a: &mut Asker, url: &RedisUrl, prefix: &str) -> Vec<Check> {
    if let Some(c) = a.stopped("settings") {
        return vec![c];
    }
    let mut out = Vec::new();
    let info: Option<String> = a.ask(&redis::cmd("INFO"));
    let field = |k: &str| {
        info.as_deref().and_then(|i| {
            i.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        })
    };
    let mut config = |k: &str| -> Option<String> {
        let v: Vec<String> = a.ask(redis::cmd("CONFIG").arg("GET").arg(k))?;
        v.get(1).cloned()
    };
    let save = config("save");
    let fsync = config("appendfsync");
    let min_replicas = config("min-replicas-to-write");
    if let Some(c) = a.stopped("settings") {
        return vec![c];
    }
    let version = field("redis_version");
    out.push(version_check(version.as_deref()));
    out.push(eviction_check(field("maxmemory_policy")));
    out.push(persistence_check(
        field("aof_enabled").as_deref(),
        save.as_deref(),
        fsync.as_deref(),
    ));
    out.push(replication_check(
        field("role").as_deref(),
        field("connected_slaves").and_then(|n| n.parse().ok()),
        min_replicas.and_then(|n| n.parse().ok()),
        url.replicas,
        field("master_host"),
    ));
    let acl = acl_checks(a, url, prefix, version.as_deref());
    match a.stopped("permissions") {
        Some(c) => out.push(c),
        None => out.extend(acl),
    }
    out
}

/// What five TIME round trips found.
struct Timed {
    answered: u32,
    worst: Option<Duration>,
    offset: Option<f64>,
    /// The server's refusal (an ACL without +time).
    refused: Option<RedisError>,
}

fn time_samples(a: &mut Asker) -> Timed {
    let (t, failed) = time_round_trips(|| {
        let (secs, micros) = a
            .send(&redis::cmd("TIME"))
            .and_then(|v| Ok(redis::from_redis_value::<(u64, u64)>(v)?))?;
        Ok::<_, RedisError>(secs as f64 + micros as f64 / 1e6)
    });
    // An error reply is an answer too (a connection that broke is not).
    let refused = failed.filter(|e| e.code().is_some());
    Timed {
        answered: t.answered + u32::from(refused.is_some()),
        worst: t.worst,
        offset: t.offset,
        refused,
    }
}

/// Tokens are floored by the server's clock.
fn clock(offset: f64) -> Check {
    clock_check(
        offset,
        "tokens are floored by the server's clock: keep NTP on every server",
        "tokens are floored by the server's clock (TIME): after a failover that lost the \
         token counter, a new master whose clock is behind the old one's by more than the \
         failover took can hand out a lower token; run NTP (chrony, systemd-timesyncd) on \
         this host and every Redis server",
    )
}

/// Whether the URL's user may run every command lockrun needs: ACL DRYRUN
/// where this user may dry-run, else the same question asked from a
/// read-only script (which lockrun's own user can run).
fn acl_checks(a: &mut Asker, url: &RedisUrl, prefix: &str, version: Option<&str>) -> Vec<Check> {
    let user = url.user();
    let mut commands = needed(prefix);
    if url.replicas > 0 {
        commands.push(vec!["wait".into(), "1".into(), "1".into()]);
    }
    let listing = vec!["scan".to_string(), "0".into()];
    commands.push(listing.clone());
    let verdicts = dry_run(a, &user, &commands).or_else(|| check_script(a, &commands));
    let Some(allowed) = verdicts else {
        let why = match version {
            Some(v) if v.split('.').next().and_then(|m| m.parse::<u32>().ok()) < Some(7) => {
                format!("Redis {v} has no ACL DRYRUN")
            }
            _ => "neither ACL DRYRUN nor a check script is allowed".into(),
        };
        return vec![Check::warn(
            "permissions",
            format!(
                "cannot check what user {user} may run ({why}): make sure it has the commands \
                 lockrun-engines(7) \"REDIS\" lists"
            ),
        )];
    };
    let mut missing = Vec::new();
    let mut scan = true;
    for (cmd, ok) in commands.iter().zip(allowed) {
        if ok {
            continue;
        }
        if *cmd == listing {
            scan = false;
        } else {
            let word = match cmd[0].as_str() {
                "script" => "script|load".to_string(),
                w => w.to_string(),
            };
            missing.push(format!("+{word}"));
        }
    }
    let mut out = Vec::new();
    if missing.is_empty() {
        out.push(Check::ok(
            "permissions",
            format!("user {user} may run every command lockrun needs on keys under {prefix:?}"),
        ));
    } else {
        out.push(Check::fail(
            "permissions",
            format!(
                "user {user} may not run {} on keys under {prefix:?}: its runs would fail with \
                 69 (or a waiter at its first wait); ACL SETUSER {user} {} (lockrun-engines(7) \
                 \"REDIS\")",
                missing.join(" "),
                missing.join(" ")
            ),
        ));
    }
    if !scan {
        out.push(Check::warn(
            "permissions",
            format!("user {user} may not run SCAN: `lockrun status` without a name needs +scan"),
        ));
    }
    out
}

/// ACL DRYRUN for each command; None when this connection may not dry-run.
fn dry_run(a: &mut Asker, user: &str, commands: &[Vec<String>]) -> Option<Vec<bool>> {
    let mut out = Vec::new();
    for cmd in commands {
        let reply: String = a.ask(redis::cmd("ACL").arg("DRYRUN").arg(user).arg(cmd))?;
        out.push(reply == "OK");
    }
    Some(out)
}

/// `redis.acl_check_cmd` for each command, in one read-only script, run
/// by its SHA and loaded only if the server lacks it, as lockrun's own.
fn check_script(a: &mut Asker, commands: &[Vec<String>]) -> Option<Vec<bool>> {
    let script = Script::new(ACL_CHECK);
    let mut eval = redis::cmd("EVALSHA");
    eval.arg(script.get_hash()).arg(0);
    for cmd in commands {
        eval.arg(cmd.len()).arg(cmd);
    }
    let reply = match a.send(&eval) {
        Err(e) if e.code() == Some("NOSCRIPT") => {
            a.send(redis::cmd("SCRIPT").arg("LOAD").arg(ACL_CHECK))
                .ok()?;
            a.send(&eval)
        }
        other => other,
    };
    let v: Vec<i64> = redis::from_redis_value(reply.ok()?).ok()?;
    (v.len() == commands.len()).then(|| v.into_iter().map(|x| x == 1).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Verdict;

    #[test]
    fn clocks_apart_by_a_second_warn() {
        assert_eq!(clock(0.004).verdict, Verdict::Ok);
        assert_eq!(clock(-2.5).verdict, Verdict::Warn);
    }
}
