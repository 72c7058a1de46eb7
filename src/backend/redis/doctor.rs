//! `lockrun doctor` on Redis: what would break a lease, read from the
//! server before the first incident (README "Operate"). Only reads and dry
//! runs: INFO, CONFIG GET, TIME, ACL DRYRUN, and where the user may not
//! dry-run, a read-only script that asks `redis.acl_check_cmd`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, RedisResult, Script, Value};

use super::address::{Node, RedisUrl};
use super::connector::{Conn, Connector};
use super::link::{describe, is_auth_error};
use crate::backend::{Check, Opening, round_trip_check};
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
    let mut out = Vec::new();
    let connector = match Connector::new(url, op) {
        Ok(c) => c,
        Err(e) => {
            out.push(Check::fail("reachable", e.to_string()));
            return out;
        }
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
            out.push(Check::fail("reachable", said));
            return out;
        }
    };
    let mut conn = linked.conn;
    let at = linked
        .node
        .map(|n| format!(" (master {n})"))
        .unwrap_or_default();
    out.push(Check::ok(
        "reachable",
        format!(
            "Redis at {}{at} answered; connected in {}",
            url.display,
            shown(Boot::now().since(started))
        ),
    ));
    let (rtt, clock) = time_samples(&mut conn);
    match rtt {
        Some(rtt) => out.push(round_trip_check(rtt, op)),
        None => out.push(Check::fail(
            "round trip",
            "TIME got no answer: lockrun's scripts need TIME; allow +time",
        )),
    }
    if let Some(offset) = clock {
        out.push(clock_check(offset));
    }
    match &mut conn {
        Conn::One(c) => {
            let mut send = |cmd: &Cmd| cmd.query::<Value>(c);
            out.extend(settings(&mut send, url, &how.prefix));
        }
        Conn::Cluster(cc) => {
            // Each master has its own settings and its own ACL users: ask
            // every one, by address.
            let nodes: Option<String> = redis::cmd("CLUSTER").arg("NODES").query(&mut **cc).ok();
            let masters: Vec<Node> = nodes
                .as_deref()
                .unwrap_or_default()
                .lines()
                .filter_map(super::cluster_master)
                .collect();
            if masters.is_empty() {
                out.push(Check::warn(
                    "settings",
                    "CLUSTER NODES named no master: each master's settings are not checked; \
                     run lockrun doctor --url redis://HOST:PORT against each master",
                ));
            }
            for m in masters {
                let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: m.host.clone(),
                    port: m.port,
                });
                let mut send = |cmd: &Cmd| cc.route_command(cmd, at.clone());
                for c in settings(&mut send, url, &how.prefix) {
                    out.push(Check {
                        said: format!("master {m}: {}", c.said),
                        ..c
                    });
                }
            }
        }
    }
    out
}

/// Sends one command to the server being checked (on a cluster, to one
/// master by its address).
type Send<'a> = dyn FnMut(&Cmd) -> RedisResult<Value> + 'a;

fn ask<T: redis::FromRedisValue>(send: &mut Send, cmd: &Cmd) -> Option<T> {
    send(cmd).ok().and_then(|v| redis::from_redis_value(v).ok())
}

/// What one server's INFO, CONFIG and ACLs say.
fn settings(send: &mut Send, url: &RedisUrl, prefix: &str) -> Vec<Check> {
    let mut out = Vec::new();
    let info: Option<String> = ask(send, &redis::cmd("INFO"));
    let field = |k: &str| {
        info.as_deref().and_then(|i| {
            i.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        })
    };
    let mut config = |k: &str| -> Option<String> {
        let v: Vec<String> = ask(send, redis::cmd("CONFIG").arg("GET").arg(k))?;
        v.get(1).cloned()
    };
    let save = config("save");
    let fsync = config("appendfsync");
    let min_replicas = config("min-replicas-to-write");
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
    out.extend(acl_checks(send, url, prefix, version.as_deref()));
    out
}

fn shown(d: Duration) -> String {
    humantime::format_duration(Duration::from_micros(d.as_micros() as u64)).to_string()
}

/// Five TIME round trips: the slowest (what a renewal must live with), and
/// the server's clock minus this host's, from the fastest (the least
/// uncertain).
fn time_samples(conn: &mut Conn) -> (Option<Duration>, Option<f64>) {
    let mut worst: Option<Duration> = None;
    let mut best: Option<(Duration, f64)> = None;
    for _ in 0..5 {
        let before = wall();
        let sent = Boot::now();
        let Ok((secs, micros)) = redis::cmd("TIME").query::<(u64, u64)>(conn) else {
            return (None, None);
        };
        let rtt = Boot::now().since(sent);
        let server = secs as f64 + micros as f64 / 1e6;
        let offset = server - (before + rtt.as_secs_f64() / 2.0);
        worst = Some(worst.map_or(rtt, |w| w.max(rtt)));
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, offset));
        }
    }
    (worst, best.map(|(_, o)| o))
}

fn wall() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn clock_check(offset: f64) -> Check {
    let why = "tokens are floored by the server's clock (TIME): after a failover that lost \
               the token counter, a new master whose clock is behind the old one's by more \
               than the failover took can hand out a lower token";
    let ahead = if offset >= 0.0 { "ahead of" } else { "behind" };
    let said = format!(
        "the server's clock is {} {ahead} this host's",
        shown(Duration::from_secs_f64(offset.abs()))
    );
    if offset.abs() < 1.0 {
        Check::ok(
            "clock",
            format!("{said} (tokens are floored by the server's clock: keep NTP on every server)"),
        )
    } else {
        Check::warn(
            "clock",
            format!(
                "{said}: {why}; run NTP (chrony, systemd-timesyncd) on this host and every Redis server"
            ),
        )
    }
}

fn version_check(version: Option<&str>) -> Check {
    let Some(v) = version else {
        return Check::warn(
            "version",
            "INFO is not allowed for this user: the server's version and settings cannot be \
             read; run lockrun doctor as a user with +info to check them",
        );
    };
    let major: u32 = v
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major < 5 {
        Check::fail(
            "version",
            format!("Redis {v}: lockrun's scripts need Redis 5 or later; upgrade the server"),
        )
    } else if major < 7 {
        Check::warn(
            "version",
            format!("Redis {v}: works, but the permission check below needs Redis 7 or later"),
        )
    } else {
        Check::ok("version", format!("Redis {v}"))
    }
}

fn eviction_check(policy: Option<String>) -> Check {
    match policy.as_deref() {
        Some("noeviction") => Check::ok(
            "maxmemory-policy",
            "noeviction: a lease is never evicted to make room",
        ),
        Some(p) => Check::fail(
            "maxmemory-policy",
            format!(
                "{p}: under memory pressure Redis may evict a lease, and a second holder starts \
                 while the first one's job runs; set maxmemory-policy noeviction \
                 (CONFIG SET maxmemory-policy noeviction, and in redis.conf)"
            ),
        ),
        None => Check::warn(
            "maxmemory-policy",
            "unknown (INFO not allowed): make sure it is noeviction",
        ),
    }
}

fn persistence_check(aof: Option<&str>, save: Option<&str>, fsync: Option<&str>) -> Check {
    let loses = "a restart loses the leases, so the next holder may start while an old job \
                 still runs (for up to ttl/3 + the bound on one request + --kill-after), and \
                 token counters fall back on the server's clock (README \"Safety\")";
    match (aof, save) {
        (Some("1"), _) => Check::ok(
            "persistence",
            format!(
                "appendonly yes (appendfsync {}): a restart keeps leases and token counters",
                fsync.unwrap_or("unknown")
            ),
        ),
        (Some(_), Some(s)) if !s.trim().is_empty() => Check::warn(
            "persistence",
            format!(
                "snapshots only (save {s}): {loses}, for what was written since the last \
                 snapshot; set appendonly yes"
            ),
        ),
        (Some(_), Some(_)) => Check::warn(
            "persistence",
            format!("none (appendonly no, save \"\"): {loses}; set appendonly yes"),
        ),
        (Some(_), None) => Check::warn(
            "persistence",
            format!(
                "appendonly no, and the snapshot schedule cannot be read (CONFIG not allowed): \
                 {loses}; set appendonly yes"
            ),
        ),
        (None, _) => Check::warn(
            "persistence",
            "unknown (INFO not allowed): without appendonly yes a restart loses leases",
        ),
    }
}

fn replication_check(
    role: Option<&str>,
    replicas: Option<u32>,
    min_replicas: Option<u32>,
    asked: u32,
    master: Option<String>,
) -> Check {
    match role {
        Some("slave") => {
            let of = master.map(|m| format!(" of {m}")).unwrap_or_default();
            return Check::fail(
                "replicas",
                format!(
                    "this server is a replica{of}: lockrun's writes fail here; point --url at \
                     the master, or at the sentinels (redis+sentinel://)"
                ),
            );
        }
        None => {
            return Check::warn("replicas", "unknown (INFO not allowed)");
        }
        _ => {}
    }
    let n = replicas.unwrap_or(0);
    let min = min_replicas
        .map(|m| m.to_string())
        .unwrap_or_else(|| "unknown".into());
    if n == 0 {
        return Check::ok(
            "replicas",
            format!(
                "none (min-replicas-to-write {min}): no failover can lose a grant, and none can \
                 take over if this server fails"
            ),
        );
    }
    if min_replicas.unwrap_or(0) == 0 && asked == 0 {
        return Check::warn(
            "replicas",
            format!(
                "{n} connected, min-replicas-to-write {min} and no --replicas: a failover can \
                 lose a grant not yet copied and let a second holder in; run with --replicas 1 \
                 (or set min-replicas-to-write)"
            ),
        );
    }
    if n < asked {
        return Check::fail(
            "replicas",
            format!(
                "{n} connected, fewer than --replicas {asked}: no grant can count; lower \
                 --replicas or add replicas"
            ),
        );
    }
    Check::ok(
        "replicas",
        format!("{n} connected, min-replicas-to-write {min}, --replicas {asked}"),
    )
}

/// Whether the URL's user may run every command lockrun needs: ACL DRYRUN
/// where this user may dry-run, else the same question asked from a
/// read-only script (which lockrun's own user can run).
fn acl_checks(send: &mut Send, url: &RedisUrl, prefix: &str, version: Option<&str>) -> Vec<Check> {
    let user = url.user();
    let mut commands = needed(prefix);
    if url.replicas > 0 {
        commands.push(vec!["wait".into(), "1".into(), "1".into()]);
    }
    let listing = vec!["scan".to_string(), "0".into()];
    commands.push(listing.clone());
    let verdicts = dry_run(send, &user, &commands).or_else(|| check_script(send, &commands));
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
                 README \"Redis permissions\" lists"
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
                 69 (or a waiter at its first wait); ACL SETUSER {user} {} (README \"Redis \
                 permissions\")",
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
fn dry_run(send: &mut Send, user: &str, commands: &[Vec<String>]) -> Option<Vec<bool>> {
    let mut out = Vec::new();
    for cmd in commands {
        let reply: String = ask(send, redis::cmd("ACL").arg("DRYRUN").arg(user).arg(cmd))?;
        out.push(reply == "OK");
    }
    Some(out)
}

/// `redis.acl_check_cmd` for each command, in one read-only script, run
/// by its SHA and loaded only if the server lacks it, as lockrun's own.
fn check_script(send: &mut Send, commands: &[Vec<String>]) -> Option<Vec<bool>> {
    let script = Script::new(ACL_CHECK);
    let mut eval = redis::cmd("EVALSHA");
    eval.arg(script.get_hash()).arg(0);
    for cmd in commands {
        eval.arg(cmd.len()).arg(cmd);
    }
    let reply = match send(&eval) {
        Err(e) if e.code() == Some("NOSCRIPT") => {
            send(redis::cmd("SCRIPT").arg("LOAD").arg(ACL_CHECK)).ok()?;
            send(&eval)
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
    fn eviction_is_a_failure() {
        assert_eq!(
            eviction_check(Some("allkeys-lru".into())).verdict,
            Verdict::Fail
        );
        assert_eq!(
            eviction_check(Some("noeviction".into())).verdict,
            Verdict::Ok
        );
    }

    #[test]
    fn persistence_is_judged_by_what_survives_a_restart() {
        assert_eq!(
            persistence_check(Some("1"), Some(""), Some("everysec")).verdict,
            Verdict::Ok
        );
        assert_eq!(
            persistence_check(Some("0"), Some("3600 1"), None).verdict,
            Verdict::Warn
        );
        assert_eq!(
            persistence_check(Some("0"), Some(""), None).verdict,
            Verdict::Warn
        );
    }

    #[test]
    fn replicas_without_a_write_quorum_warn() {
        let v =
            |role, n, min, asked| replication_check(Some(role), Some(n), Some(min), asked, None);
        assert_eq!(v("master", 0, 0, 0).verdict, Verdict::Ok);
        assert_eq!(v("master", 2, 0, 0).verdict, Verdict::Warn);
        assert_eq!(v("master", 2, 1, 0).verdict, Verdict::Ok);
        assert_eq!(v("master", 1, 0, 2).verdict, Verdict::Fail);
        assert_eq!(v("slave", 0, 0, 0).verdict, Verdict::Fail);
    }

    #[test]
    fn clocks_apart_by_a_second_warn() {
        assert_eq!(clock_check(0.004).verdict, Verdict::Ok);
        assert_eq!(clock_check(-2.5).verdict, Verdict::Warn);
    }
}
