//! The Redis engine: a name's holders live in one hash with an expiry, its
//! waiters in a queue, both changed only by Lua scripts that serve waiters
//! in arrival order and hand a release's lease to the next in the same call.
//!
//! By layer: `address.rs` reads the URL and builds the client (TLS);
//! `link.rs` is one connection, bounded, with the table of errors worth
//! riding out; `scripts.rs` loads the Lua in `scripts/` and says what each
//! script takes and returns; `reply.rs` reads those replies into types;
//! `take.rs` is the acquire loop (try, then block on a wake-up list),
//! `leave.rs` its way out on a signal; `lease.rs` a granted lease and its
//! renewal. This file holds the engine's row, status, `release --force`
//! and the listing.

mod address;
mod connector;
mod doctor;
mod lease;
mod leave;
mod link;
mod reply;
mod scripts;
mod take;
mod verdicts;

use std::time::Duration;

use redis::Value;

use address::Node;
pub use address::{RedisUrl, parse};
use connector::{Conn, Connector};
use link::{Link, describe, is_auth_error};
use scripts::{FORCE_SCRIPT, INSPECT_SCRIPT, Keys};

use super::plan;
use super::{
    Acquired, Broken, Engine, EngineInfo, Error, Force, ListBound, Listing, Opening, Request,
    Status, Wait,
};
use crate::backend::drive::Remote;
use crate::clock::Boot;
use crate::log;

/// Redis's row of the scheme table.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "Redis",
    schemes: &[
        "redis",
        "rediss",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
    ],
    form: "redis://[user][:pass@]host[:port][/db], rediss://…, redis+sentinel://[user:pass@]host[:port][,host…]/MASTER[/db], redis+cluster://[user:pass@]host[:port][,host…]",
    parse,
    // Leases are asked for in milliseconds (PX / the boot clock).
    ttl_step: Duration::from_millis(1),
    ttl_min: Duration::ZERO,
    expires: true,
};

pub struct Redis {
    link: Link,
    prefix: String,
    /// `--replicas N`.
    replicas: u32,
}

impl Redis {
    pub fn connect(url: &RedisUrl, how: &Opening) -> Result<Redis, Error> {
        let op = how.op;
        let connector = Connector::new(url, op)?;
        if url.insecure {
            log::warn(format!(
                "{}: TLS certificate checks are off (#insecure)",
                url.display
            ));
        }
        log::info(format!("connecting to {}", url.display));
        let started = Boot::now();
        let first = connector.connect(op.max(Duration::from_millis(500)));
        // Behind sentinels that named a master, a master that does not
        // answer is a failover under way: ridden out like any outage.
        let first = match first {
            Err(e) if link::is_transient(&e) && connector.sentinel_answered() => {
                log::info(format!("{}: {}; trying again", url.display, describe(&e)));
                None
            }
            // A full server (maxclients) answered: the first call asks
            // again, and a request rides it out as the driver does.
            Err(e) if link::full(&describe(&e)).is_some() => None,
            other => Some(other),
        };
        let linked = first.transpose().map_err(|e| {
            let msg = if is_auth_error(&e) {
                let user = url.user();
                format!(
                    "Redis at {} refused the credentials of user {user}: check the user and password in the URL",
                    url.display
                )
            } else {
                format!("cannot reach Redis at {}: {}", url.display, describe(&e))
            };
            Error::Refused(msg)
        })?;
        log::info(format!("connected in {:.1?}", Boot::now().since(started)));
        let (conn, node) = match linked {
            Some(l) => (Some(l.conn), l.node),
            None => (None, None),
        };
        let mut r = Redis {
            link: Link {
                // The sentinels answered when the master did not, or the
                // server did, to say it was full.
                remote: Remote {
                    replied: conn.is_none(),
                    ..Remote::new(url.display.clone())
                },
                conn,
                connector,
                node,
                op,
            },
            prefix: how.prefix.clone(),
            replicas: url.replicas,
        };
        // Worth a round trip only where its warning is shown (`-v`).
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
}

impl Engine for Redis {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        self.take(req, wait)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let keys = Keys::new(&self.prefix, name);
        let script = &*INSPECT_SCRIPT;
        let v = self
            .link
            .call(|c| keys.on(script).invoke::<Vec<Value>>(c))
            .map_err(|e| self.link.remote.failed(&format!("reading {name}"), e))?;
        Ok(reply::status(&v))
    }

    fn names(&mut self, bound: ListBound) -> Result<plan::Names, Error> {
        let mut notes = Vec::new();
        let names = if matches!(self.link.connector, Connector::Cluster(_)) {
            self.scan_cluster_names(bound, &mut notes)?
        } else {
            self.scan_names(bound, &mut notes, None)?
        };
        Ok(plan::Names {
            names: names.into_iter().collect(),
            notes,
        })
    }

    /// Name by name as the default does, but a batch of names a round trip.
    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let plan::Names {
            names: all,
            mut notes,
        } = self.names(bound)?;
        let cluster = matches!(self.link.connector, Connector::Cluster(_));
        let mut listed = Vec::with_capacity(all.len());
        // A cluster connection does not pipeline across slots: one name at a time.
        let batch = if cluster { 1 } else { LIST_BATCH };
        for batch in all.chunks(batch) {
            if bound.passed() {
                notes.push(format!(
                    "stopped after {} of {} names (time bound): the list is incomplete",
                    listed.len(),
                    all.len()
                ));
                break;
            }
            if cluster {
                self.inspect_one(&batch[0], &mut listed, &mut notes)?;
            } else {
                self.inspect_batch(batch, &mut listed, &mut notes)?;
            }
        }
        notes.push(
            "read with SCAN, name by name, not as one snapshot: a lock may change while the \
             list is read"
                .into(),
        );
        Ok(Listing {
            names: listed,
            notes,
            ..Listing::default()
        })
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let keys = Keys::new(&self.prefix, name);
        let script = &*FORCE_SCRIPT;
        let token = force.token.map(|t| t.to_string()).unwrap_or_default();
        let now = if force.now { "1" } else { "0" };
        let v = self
            .link
            .call(|c| keys.on(script).arg(&token).arg(now).invoke::<Vec<Value>>(c))
            .map_err(|e| self.link.remote.failed(&format!("releasing {name}"), e))?;
        Ok(reply::broken(&v))
    }
}

/// Names read per pipelined round trip when listing, and keys asked of
/// each SCAN step: large enough for 10,000 names in well under a second,
/// small enough that no single reply blocks the server for long.
const LIST_BATCH: usize = 500;
const SCAN_COUNT: usize = 1000;

impl Redis {
    /// Every name with a key under the prefix (a lease, a queue or only its
    /// token counter), by SCAN, never KEYS: the server stays responsive
    /// however many keys it has.
    /// `node`: on a cluster, the master to scan (each holds its own slots).
    fn scan_names(
        &mut self,
        bound: ListBound,
        notes: &mut Vec<String>,
        node: Option<&Node>,
    ) -> Result<std::collections::BTreeSet<String>, Error> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let pattern = format!("{}{{*", glob_escape(&self.prefix));
        let mut names = std::collections::BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, keys): (u64, Vec<Vec<u8>>) = self
                .link
                .call(|c| match (c, node) {
                    (Conn::Cluster(cc), Some(n)) => {
                        let at = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: n.host.clone(),
                            port: n.port,
                        });
                        let v = cc.route_command(&scan, at)?;
                        Ok(redis::from_redis_value(v)?)
                    }
                    (c, _) => scan.query(c),
                })
                .map_err(|e| self.link.remote.failed("listing names", e))?;
            for key in keys {
                if let Some(name) = name_of_key(&self.prefix, &key) {
                    names.insert(name);
                }
            }
            cursor = next;
            if cursor == 0 {
                return Ok(names);
            }
            if names.len() >= bound.names || bound.passed() {
                notes.push(plan::cut_short(names.len()));
                return Ok(names);
            }
        }
    }

    /// Every name on every master of a cluster (from CLUSTER NODES).
    fn scan_cluster_names(
        &mut self,
        bound: ListBound,
        notes: &mut Vec<String>,
    ) -> Result<std::collections::BTreeSet<String>, Error> {
        let nodes: String = self
            .link
            .call(|c| redis::cmd("CLUSTER").arg("NODES").query(c))
            .map_err(|e| self.link.remote.failed("listing the cluster's masters", e))?;
        let masters: Vec<Node> = nodes.lines().filter_map(cluster_master).collect();
        let mut names = std::collections::BTreeSet::new();
        for m in &masters {
            let left = ListBound {
                names: bound.names.saturating_sub(names.len()),
                until: bound.until,
            };
            names.extend(self.scan_names(left, notes, Some(m))?);
        }
        Ok(names)
    }

    /// Each name's state, one pipelined round trip for the batch; a name
    /// whose keys are not lockrun's is left out with a note.
    fn inspect_batch(
        &mut self,
        batch: &[String],
        listed: &mut Vec<(String, Status)>,
        notes: &mut Vec<String>,
    ) -> Result<(), Error> {
        let script = &*INSPECT_SCRIPT;
        let prefix = self.prefix.clone();
        let run = |link: &mut Link| {
            link.call(|c| {
                let mut pipe = redis::pipe();
                for name in batch {
                    pipe.invoke_script(&Keys::new(&prefix, name).on(script));
                }
                pipe.query::<Vec<Vec<Value>>>(c)
            })
        };
        let mut replies = run(&mut self.link);
        if matches!(&replies, Err(Error::Refused(m)) if m.starts_with("NOSCRIPT")) {
            // A server that never ran the script (or flushed it): load it once.
            self.link
                .call(|c| script.load(c))
                .map_err(|e| self.link.remote.failed("listing names", e))?;
            replies = run(&mut self.link);
        }
        match replies {
            Ok(v) => {
                for (name, reply) in batch.iter().zip(v) {
                    listed.push((name.clone(), reply::status(&reply)));
                }
                Ok(())
            }
            // One name whose key is not a lease fails the whole pipeline:
            // ask name by name, and leave that one out.
            Err(Error::Refused(_)) => {
                for name in batch {
                    self.inspect_one(name, listed, notes)?;
                }
                Ok(())
            }
            Err(e) => Err(self.link.remote.failed("listing names", e)),
        }
    }

    fn inspect_one(
        &mut self,
        name: &str,
        listed: &mut Vec<(String, Status)>,
        notes: &mut Vec<String>,
    ) -> Result<(), Error> {
        match self.listed(name)? {
            plan::Read::Listed(st) => listed.push((name.to_string(), st)),
            plan::Read::LeftOut(note) => notes.push(note),
            // Never from a status that is not refused.
            plan::Read::Empty | plan::Read::Unreadable(_) => {}
        }
        Ok(())
    }
}

/// A master's address in a line of CLUSTER NODES
/// (`id host:port@cport[,hostname] flags master …`); None for a replica or
/// a node that failed.
pub(super) fn cluster_master(line: &str) -> Option<Node> {
    cluster_node(line).and_then(|(node, failing)| (!failing).then_some(node))
}

/// A master's address in a line of CLUSTER NODES, and whether the cluster
/// marks it failing (`fail` or `fail?`); None for a replica.
pub(super) fn cluster_node(line: &str) -> Option<(Node, bool)> {
    let mut fields = line.split(' ');
    let addr = fields.nth(1)?;
    let flags = fields.next()?;
    let flags: Vec<&str> = flags.split(',').collect();
    if !flags.contains(&"master") {
        return None;
    }
    let failing = flags.iter().any(|f| f.starts_with("fail"));
    let hostport = addr.split(['@', ',']).next()?;
    let (host, port) = hostport.rsplit_once(':')?;
    let node = Node {
        host: host.to_string(),
        port: port.parse().ok()?,
    };
    Some((node, failing))
}

/// `prefix` as a SCAN pattern that matches it literally.
fn glob_escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lock name a key belongs to: `PREFIX{NAME}` or one of its companions
/// (`:fence`, `:queue`…); None for any other key under the prefix.
fn name_of_key(prefix: &str, key: &[u8]) -> Option<String> {
    let key = std::str::from_utf8(key).ok()?;
    let rest = key.strip_prefix(prefix)?.strip_prefix('{')?;
    let (name, tail) = rest.split_once('}')?;
    let ours = matches!(
        tail,
        "" | ":fence" | ":queue" | ":waiters" | ":alive" | ":preempt"
    ) || tail.starts_with(":wake:");
    (ours && !name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod listing_tests {
    use super::*;

    #[test]
    fn keys_name_their_lock_and_others_are_left_out() {
        let n = |k: &str| name_of_key("lockrun:", k.as_bytes());
        assert_eq!(n("lockrun:{job}").as_deref(), Some("job"));
        assert_eq!(n("lockrun:{job}:fence").as_deref(), Some("job"));
        assert_eq!(n("lockrun:{a b}:wake:123").as_deref(), Some("a b"));
        assert_eq!(n("lockrun:{job}:preempt").as_deref(), Some("job"));
        assert_eq!(n("lockrun:{job}:other"), None);
        assert_eq!(n("lockrun:{}"), None);
        assert_eq!(n("other:{job}"), None);
    }

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let m = cluster_master(
            "07c3 127.0.0.1:30004@31004,host-a myself,master - 0 0 1 connected 0-5460",
        )
        .unwrap();
        assert_eq!((m.host.as_str(), m.port), ("127.0.0.1", 30004));
        assert!(cluster_master("e7d1 127.0.0.1:30005@31005 slave 07c3 0 0 1 connected").is_none());
        assert!(
            cluster_master("e7d1 127.0.0.1:30006@31006 master,fail - 0 0 1 connected").is_none()
        );
        // doctor still names a failing master, and says the cluster marks it.
        let (m, failing) =
            cluster_node("e7d1 127.0.0.1:30006@31006 master,fail? - 0 0 1 connected").unwrap();
        assert_eq!((m.port, failing), (30006, true));
    }

    #[test]
    fn a_prefix_is_matched_literally() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("lockrun:"), "lockrun:");
    }
}
