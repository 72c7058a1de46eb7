//! `lockrun doctor` on etcd: reachable, its version and leader, the round
//! trip, and whether the URL's user may read and write keys under the
//! prefix, asked with a transaction whose condition can never hold, so
//! that nothing is written (lockrun-engines(7) "ETCD").

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::address::EtcdUrl;
use super::client::{Client, Setup, b64};
use crate::backend::doctor::{round_trip_check, shown};
use crate::backend::{Check, Error, Opening};
use crate::clock::Boot;

pub fn doctor(url: &EtcdUrl, how: &Opening) -> Vec<Check> {
    let mut out = Vec::new();
    let setup = match Setup::new(url) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            out.push(Check::fail("reachable", e.to_string()));
            return out;
        }
    };
    let mut client = Client::new(setup, how.op);
    let started = Boot::now();
    let status = match client.call("/v3/maintenance/status", &json!({})) {
        Ok(v) => Some(v),
        // A user that may not ask for the member's status: its version and
        // leader stay unknown, the rest is still worth checking.
        Err(Error::Refused(m)) if m.contains("permission denied") => None,
        Err(Error::Transient(e)) => {
            out.push(Check::fail(
                "reachable",
                format!("{e}; check the address and that etcd runs"),
            ));
            return out;
        }
        Err(e) => {
            out.push(Check::fail("reachable", e.to_string()));
            return out;
        }
    };
    out.push(Check::ok(
        "reachable",
        format!(
            "etcd at {} answered in {}",
            url.display,
            shown(Boot::now().since(started))
        ),
    ));
    match &status {
        Some(status) => out.extend(member_checks(status)),
        None => out.push(Check::warn(
            "version",
            "this user may not read the member's status: version and leader not checked",
        )),
    }
    prefix_checks(&mut out, &mut client, url, how);
    out
}

/// The member's version, and whether the cluster has a leader.
fn member_checks(status: &serde_json::Value) -> Vec<Check> {
    let mut out = Vec::new();
    let version = status["version"].as_str().unwrap_or("unknown").to_string();
    let newer = |v: &str| {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (3, 4)
    };
    out.push(if newer(&version) {
        Check::ok("version", format!("etcd {version}"))
    } else {
        Check::fail(
            "version",
            format!("etcd {version}: lockrun needs etcd 3.4 or later (its v3 JSON gateway)"),
        )
    });
    let leader = status["leader"].as_str().is_some_and(|l| l != "0");
    let errors: Vec<String> = status["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str().map(String::from))
        .collect();
    out.push(if !leader {
        Check::fail(
            "leader",
            "the cluster has no leader: no lease can be granted; restore a quorum of members",
        )
    } else if !errors.is_empty() {
        Check::warn(
            "leader",
            format!(
                "the member reports: {}",
                crate::log::redact(&errors.join("; "))
            ),
        )
    } else {
        Check::ok("leader", "the cluster has a leader")
    });
    out
}

/// The round trip of a read of the prefix, and the user's permission to
/// read and write there.
fn prefix_checks(out: &mut Vec<Check>, client: &mut Client, url: &EtcdUrl, how: &Opening) {
    // The round trip of a read of the prefix, which also says whether the
    // user may read there.
    let prefix = &how.prefix;
    let read = json!({"key": b64(prefix), "range_end": b64(super::prefix_end(prefix)), "keys_only": true, "limit": 1});
    let mut worst = Duration::ZERO;
    let mut denied = None;
    for _ in 0..5 {
        let sent = Boot::now();
        match client.call("/v3/kv/range", &read) {
            Ok(_) => worst = worst.max(Boot::now().since(sent)),
            Err(e) => {
                denied = Some(e);
                break;
            }
        }
    }
    let user = match &url.user {
        Some(u) => format!("user {u}"),
        None => "a client without a user".into(),
    };
    match denied {
        Some(e) => {
            out.push(permission_failure(&user, prefix, "read", e));
            return;
        }
        None => out.push(round_trip_check(worst, how.op)),
    }
    // A put and a delete behind a condition that never holds (no key has
    // a version below 0): etcd checks the user's permission for both and
    // writes nothing.
    let key = format!("{prefix}doctor/q/0");
    let other = format!("{prefix}doctor/q/1");
    let probe = json!({
        "compare": [{"key": b64(&key), "target": "VERSION", "result": "LESS", "version": "0"}],
        "success": [
            {"request_put": {"key": b64(&key), "value": b64("")}},
            {"request_delete_range": {"key": b64(&other)}},
        ],
        "failure": [],
    });
    match client.call("/v3/kv/txn", &probe) {
        Ok(_) => out.push(Check::ok(
            "permissions",
            format!("{user} may read and write keys under {prefix:?}"),
        )),
        Err(e) => out.push(permission_failure(&user, prefix, "write", e)),
    }
    out.push(Check::ok(
        "clock",
        "not used: etcd tokens are raft revisions and leases count on etcd's own clock",
    ));
}

fn permission_failure(user: &str, prefix: &str, what: &str, e: Error) -> Check {
    let text = e.to_string();
    if text.contains("permission denied") {
        Check::fail(
            "permissions",
            format!(
                "{user} may not {what} keys under {prefix:?}: etcdctl role grant-permission \
                 ROLE --prefix=true readwrite {prefix:?} for a role of that user (lockrun-engines(7) \"ETCD\")"
            ),
        )
    } else {
        Check::fail("permissions", format!("{what} under {prefix:?}: {text}"))
    }
}
