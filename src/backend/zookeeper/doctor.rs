//! `lockrun doctor` on ZooKeeper: reachable, the round trip, the session
//! timeout the server grants, its version and role (by the `srvr`
//! four-letter word, which ZooKeeper allows by default), the ACL on the
//! prefix's node, and whether it takes TTL nodes (lockrun-engines(7) "ZOOKEEPER").

use std::io::{Read, Write};
use std::time::Duration;

use super::address::ZkUrl;
use zookeeper_client as zk;

use super::client::{CallError, Client, sort};
use crate::backend::doctor::{round_trip_check, shown};
use crate::backend::{Check, Opening};
use crate::clock::Boot;

pub fn doctor(url: &ZkUrl, how: &Opening) -> Vec<Check> {
    let mut out = Vec::new();
    let root = match super::queue::root_of(&how.prefix) {
        Ok(r) => r,
        Err(e) => {
            out.push(Check::fail("prefix", e.to_string()));
            return out;
        }
    };
    let started = Boot::now();
    let c = match Client::connect(url, super::OPERATOR_SESSION, how.op) {
        Ok(c) => c,
        Err(e) => {
            out.push(Check::fail(
                "reachable",
                format!("{e}; check the address and that ZooKeeper runs"),
            ));
            return out;
        }
    };
    out.push(Check::ok(
        "reachable",
        format!(
            "ZooKeeper at {} gave a session in {}",
            url.display,
            shown(Boot::now().since(started))
        ),
    ));
    if let Some(failed) = chroot_check(&c, url) {
        out.push(failed);
        return out;
    }
    out.push(session_bounds(url, how));
    match round_trips(&c, &root, how.op) {
        Ok(check) => out.push(check),
        Err(failed) => {
            out.push(failed);
            return out;
        }
    }
    out.extend(server_checks(url, how.op));
    out.push(acl_check(&c, &root));
    out.push(names(&c, &root));
    out.push(ttl_nodes(&c, &root));
    out
}

/// A chroot that does not exist or cannot be read; None when it is fine
/// (or there is none).
fn chroot_check(c: &Client, url: &ZkUrl) -> Option<Check> {
    url.chroot.as_ref()?;
    match c.call(|z| async move { z.check_stat("/").await }) {
        Ok(Some(_)) => None,
        Ok(None) => Some(Check::fail(
            "chroot",
            format!(
                "the chroot {} does not exist: create it, or fix the URL",
                url.chroot.as_deref().unwrap_or("")
            ),
        )),
        Err(e) => Some(Check::fail(
            "chroot",
            sort(e, "reading the chroot").to_string(),
        )),
    }
}

/// The worst of five reads of the prefix's node, against the bound `op`.
fn round_trips(c: &Client, root: &str, op: Duration) -> Result<Check, Check> {
    let mut worst = Duration::ZERO;
    for _ in 0..5 {
        let sent = Boot::now();
        let r = root.to_string();
        match c.call(|z| async move { z.check_stat(&r).await }) {
            Ok(_) => worst = worst.max(Boot::now().since(sent)),
            Err(e) => return Err(Check::fail("round trip", sort(e, "reading").to_string())),
        }
    }
    Ok(round_trip_check(worst, op))
}

/// The first server's version and role, as its `srvr` says.
fn server_checks(url: &ZkUrl, op: Duration) -> Vec<Check> {
    let Some(srvr) = url
        .servers
        .first()
        .and_then(|s| four_letters(s, "srvr", op))
    else {
        return vec![Check::warn(
            "version",
            "the four-letter word srvr is not allowed (4lw.commands.whitelist): version and role not checked",
        )];
    };
    let line = |k: &str| {
        srvr.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
    };
    let version = line("Zookeeper version:").unwrap_or_else(|| "unknown".into());
    let version = version.split(['-', ',']).next().unwrap_or("").to_string();
    vec![
        Check::ok("version", format!("ZooKeeper {version}")),
        Check::ok(
            "role",
            format!(
                "{} is {}",
                url.servers[0],
                line("Mode:").unwrap_or_else(|| "of unknown role".into())
            ),
        ),
    ]
}

/// Who may use the prefix's node.
fn acl_check(c: &Client, root: &str) -> Check {
    let r = root.to_string();
    match c.call(|z| async move { z.get_acl(&r).await }) {
        Ok((acls, _)) => {
            let text: Vec<String> = acls
                .iter()
                .map(|a| format!("{}:{}", a.scheme(), a.id().split(':').next().unwrap_or("")))
                .collect();
            Check::ok("acl", format!("{root} allows {}", text.join(", ")))
        }
        Err(CallError::Zk(zk::Error::NoNode)) => Check::ok(
            "acl",
            format!("{root} does not exist yet: the first request creates it"),
        ),
        Err(e) => Check::fail("acl", sort(e, "reading the ACL").to_string()),
    }
}

/// The most nodes under the prefix that doctor looks at one by one.
const NAMES_LOOKED_AT: usize = 1_000;

/// Nodes under the prefix where a name's node goes that are not lockrun's
/// (see `super::foreign_at`): no request can queue on their names.
fn names(c: &Client, root: &str) -> Check {
    let r = root.to_string();
    let children = match c.call(|z| async move { z.list_children(&r).await }) {
        Ok(ch) => ch,
        Err(CallError::Zk(zk::Error::NoNode)) => {
            return Check::ok("names", "no name's node yet");
        }
        Err(e) => return Check::fail("names", sort(e, "listing the prefix").to_string()),
    };
    let mut foreign = Vec::new();
    let looked = children.len().min(NAMES_LOOKED_AT);
    for node in &children[..looked] {
        let nodes = super::queue::Nodes {
            root: root.to_string(),
            parent: format!("{root}/{node}"),
        };
        match super::foreign_at(c, &nodes) {
            Ok(Some(super::InTheWay::NotLockruns(said))) => foreign.push(said),
            Ok(_) => {}
            Err(e) => return Check::fail("names", sort(e, "reading the prefix").to_string()),
        }
    }
    let unlooked = children.len() - looked;
    match (foreign.len(), unlooked) {
        (0, 0) => Check::ok(
            "names",
            format!("{looked} node(s) under the prefix, none in the way"),
        ),
        (0, n) => Check::warn(
            "names",
            format!("looked at {looked} nodes under the prefix, not at {n} more"),
        ),
        (1, _) => Check::fail("names", foreign.remove(0)),
        (k, _) => Check::fail(
            "names",
            format!(
                "{k} nodes under the prefix are not lockrun's; the first: {}",
                foreign[0]
            ),
        ),
    }
}

/// The session timeouts the server grants (its minSessionTimeout and
/// maxSessionTimeout), learnt by asking for a session far too short and
/// one far too long, against the ttl runs ask for: a --ttl above the longest
/// is refused with 64, one below the shortest gets the longer session.
fn session_bounds(url: &ZkUrl, how: &Opening) -> Check {
    let granted = |ask: Duration| {
        Client::connect(url, ask, how.op)
            .map(|c| c.timeout)
            .map_err(|e| Check::fail("session", e.to_string()))
    };
    // The client also bounds its own handshake by the session it asks for:
    // a shorter ask than a second makes the probe itself fail on a loaded
    // machine, and a server whose shortest session is below a second is
    // told as "1s or less".
    let short_ask = Duration::from_secs(1);
    let (shortest, longest) = match (granted(short_ask), granted(Duration::from_secs(24 * 3600))) {
        (Ok(s), Ok(l)) => (s, l),
        (Err(c), _) | (_, Err(c)) => return c,
    };
    let f = crate::text::duration;
    let shortest = if shortest <= short_ask {
        format!("{} or less", f(short_ask))
    } else {
        f(shortest).to_string()
    };
    let bounds = format!(
        "the server grants sessions of {shortest} to {} (minSessionTimeout, maxSessionTimeout): \
         a --ttl in that range is the session timeout",
        f(longest)
    );
    let ttl = how.ttl;
    if longest < ttl {
        Check::warn(
            "session",
            format!(
                "{bounds}; --ttl {} is refused with 64: pass --ttl {} or less, \
                 or raise maxSessionTimeout",
                f(ttl),
                f(longest)
            ),
        )
    } else {
        Check::ok(
            "session",
            format!("{bounds}; a longer one is refused with 64"),
        )
    }
}

/// Whether the server takes TTL nodes (`extendedTypesEnabled`), which
/// `--min-hold` needs: by creating one beside the prefix's node and
/// deleting it at once.
fn ttl_nodes(c: &Client, root: &str) -> Check {
    let mut bytes = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let path = format!("{root}.doctor-{hex}");
    let acls = c.acls();
    let p = path.clone();
    let made = c.call(|z| async move {
        let opts = zk::CreateMode::Persistent
            .with_acls(acls)
            .with_ttl(Duration::from_secs(60));
        z.create(&p, b"", &opts).await
    });
    match made {
        Ok(_) => {
            let _ = c.call(|z| async move { z.delete(&path, None).await });
            Check::ok(
                "ttl nodes",
                "the server takes TTL nodes: --min-hold keeps its window",
            )
        }
        Err(CallError::Zk(zk::Error::NoAuth)) => Check::warn(
            "ttl nodes",
            "no permission to create a node beside the prefix's: TTL nodes (which --min-hold needs) not checked",
        ),
        Err(CallError::Zk(e)) if super::is_refusal(&e) => Check::warn(
            "ttl nodes",
            format!(
                "the server refuses TTL nodes ({e}): --min-hold keeps no window; \
                 set extendedTypesEnabled=true on every server"
            ),
        ),
        Err(e) => Check::fail("ttl nodes", sort(e, "checking TTL nodes").to_string()),
    }
}

/// A four-letter word's answer from `server`, if it gives one.
fn four_letters(server: &str, word: &str, limit: Duration) -> Option<String> {
    use std::net::ToSocketAddrs;
    let addr = server.to_socket_addrs().ok()?.next()?;
    let mut s = std::net::TcpStream::connect_timeout(&addr, limit).ok()?;
    s.set_read_timeout(Some(limit)).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    (out.contains("Mode:")).then_some(out)
}
