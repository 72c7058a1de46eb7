//! What the settings a Redis server reports mean for lockrun: its version,
//! eviction policy, persistence and replication, each judged as one line of
//! `lockrun doctor`.

use crate::backend::Check;

pub(super) fn version_check(version: Option<&str>) -> Check {
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
            format!(
                "Redis {v}: lockrun's scripts use nothing newer than Redis 5, but lockrun is \
                 tested on Redis 7, and the permission check below needs 7 or later"
            ),
        )
    } else {
        Check::ok("version", format!("Redis {v}"))
    }
}

pub(super) fn eviction_check(policy: Option<String>) -> Check {
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

pub(super) fn persistence_check(
    aof: Option<&str>,
    save: Option<&str>,
    fsync: Option<&str>,
) -> Check {
    let loses = "a restart loses the leases, so the next holder may start while an old job \
                 still runs (for up to ttl/3 + the bound on one request + --kill-after), and \
                 token counters fall back on the server's clock (lockrun-safety(7) \"GUARANTEES\")";
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

pub(super) fn replication_check(
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
}
