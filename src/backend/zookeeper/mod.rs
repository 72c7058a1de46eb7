//! The ZooKeeper engine, after ZooKeeper's own lock recipe (its recipes
//! page, Apache Curator's `InterProcessMutex`): each request is an
//! ephemeral sequential node `ROOT/NAME/q-<unique>-<sequence>` on our
//! session; the holders are the front of the queue in sequence order; a
//! waiter watches the node just ahead of it. The lease is the session; the
//! token is the lock node's czxid (Zab-committed: it never goes back, and a
//! later grant's is higher). `--limit` holders claim their slot with an
//! ephemeral node `ROOT/NAME/s-<slot>` naming their request.
//!
//! By layer: `address.rs` reads the URL; `client.rs` is the transport (a
//! session on a runtime thread, bounded calls, the error table);
//! `queue.rs` reads a name's nodes into types and judges who holds;
//! `take.rs` is the acquire loop. This file holds the engine's row,
//! reading a name, status, `release --force`, the lease and its renewal.

mod address;
mod client;
mod doctor;
mod queue;
mod take;

use std::time::Duration;

use zookeeper_client as zk;

pub use address::{ZkUrl, parse};
use client::{CallError, Client, expired, sort};
use queue::{Entry, Nodes, Record, holders, request_of, slot_of};

use super::{Acquired, Request, Wait};
use super::{
    Broken, Engine, EngineInfo, Error, Force, Held, Holder, ListBound, Listing, Opening, Status,
};
use super::{Renewal, Renewer, Renewing};
use crate::log;

/// ZooKeeper's row of the scheme table.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "ZooKeeper",
    schemes: &["zk", "zookeeper", "zks"],
    form: "zk://[user:pass@]host[:port][,host[:port]…][/chroot]",
    parse,
    // Session timeouts are milliseconds; the server bounds them by its
    // minSessionTimeout..maxSessionTimeout, checked when connecting.
    ttl_step: Duration::from_millis(1),
    ttl_min: Duration::from_millis(1),
    expires: true,
};

/// The session timeout asked for by commands that hold nothing (status,
/// release --force, doctor).
const OPERATOR_SESSION: Duration = Duration::from_secs(10);

pub struct Zk {
    url: ZkUrl,
    op: Duration,
    root: String,
    client: Option<Client>,
}

impl Zk {
    pub fn open(url: &ZkUrl, how: &Opening) -> Result<Zk, Error> {
        log::info(format!("using ZooKeeper at {}", url.display));
        Ok(Zk {
            url: url.clone(),
            op: how.op,
            root: queue::root_of(&how.prefix)?,
            client: None,
        })
    }

    /// Our session, made with `ttl` asked for if there is none yet.
    fn client(&mut self, ttl: Duration) -> Result<&Client, Error> {
        if self.client.is_none() {
            let c = Client::connect(&self.url, ttl, self.op)
                .map_err(|e| e.doing(format_args!("on {}", self.url.display)))?;
            if self.url.chroot.is_some() {
                // A chroot that does not exist: every call would fail.
                let there = c
                    .call(|z| async move { z.check_stat("/").await })
                    .map_err(|e| sort(e, "reading the chroot"))?;
                if there.is_none() {
                    return Err(Error::Refused(format!(
                        "the chroot of {} does not exist: create it (zkCli.sh create {}) \
                         or fix the URL",
                        self.url.display,
                        self.url.chroot.as_deref().unwrap_or("")
                    )));
                }
            }
            self.client = Some(c);
        }
        Ok(self.client.as_ref().expect("set above"))
    }
}

/// Read a name's request nodes and slots in one round trip after listing
/// them; None when the name has no node at all.
fn read(c: &Client, nodes: &Nodes) -> Result<Option<Vec<Entry>>, CallError> {
    let parent = nodes.parent.clone();
    let children = match c.call(|z| async move { z.list_children(&parent).await }) {
        Ok(ch) => ch,
        Err(CallError::Zk(zk::Error::NoNode)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let wanted: Vec<String> = children
        .into_iter()
        .filter(|n| request_of(n).is_some() || slot_of(n).is_some())
        .collect();
    if wanted.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let paths: Vec<String> = wanted.iter().map(|n| nodes.child(n)).collect();
    let results = c.call(|z| async move {
        let mut r = z.new_multi_reader();
        for p in &paths {
            r.add_get_data(p)?;
        }
        r.commit().await
    })?;
    let mut entries = Vec::new();
    let mut slots: Vec<(u32, String)> = Vec::new();
    for (node, result) in wanted.iter().zip(results) {
        let zk::MultiReadResult::Data { data, stat } = result else {
            // Gone since the list.
            continue;
        };
        if let Some(slot) = slot_of(node) {
            slots.push((slot, String::from_utf8_lossy(&data).into_owned()));
            continue;
        }
        let Some((id, seq)) = request_of(node) else {
            continue;
        };
        // A node that is not lockrun's record: another program's, left out.
        let Some(record) = Record::decode(&data) else {
            continue;
        };
        entries.push(Entry {
            node: node.clone(),
            id: id.to_string(),
            seq,
            record,
            czxid: stat.czxid.max(0) as u64,
            version: stat.version,
            owner: stat.ephemeral_owner,
            ctime: stat.ctime,
            slot: None,
        });
    }
    for (slot, holder) in slots {
        if let Some(e) = entries.iter_mut().find(|e| e.node == holder) {
            e.slot = Some(slot);
        }
    }
    Ok(Some(queue::queue(entries)))
}

/// Wall-clock milliseconds: only ever shown (`status`'s "held for").
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn holder(e: &Entry) -> Holder {
    let r = &e.record;
    Holder {
        label: Some(r.label.clone()).filter(|l| !l.is_empty()),
        token: Some(e.czxid),
        mode: r.mode(),
        slot: e.slot.filter(|_| matches!(r.mode(), super::Mode::Limit(_))),
        ttl_left: Some(Duration::from_millis(r.ttl_ms)),
        held_for: (e.ctime > 0)
            .then(|| Duration::from_millis(wall_ms().saturating_sub(e.ctime).max(0) as u64)),
        revoked: r.revoked,
        min_hold: false,
        preempted_by: r.preempted_by.clone(),
    }
}

/// Delete a request node and the slot it claimed, together.
fn delete(c: &Client, nodes: &Nodes, e: &Entry) -> Result<bool, CallError> {
    let path = nodes.child(&e.node);
    let slot = e.slot.map(|s| nodes.slot(s));
    let r = c.call(|z| async move {
        let mut w = z.new_multi_writer();
        w.add_delete(&path, None)?;
        if let Some(s) = &slot {
            w.add_delete(s, None)?;
        }
        w.commit().await.map_err(zk::Error::from)
    });
    match r {
        Ok(_) => Ok(true),
        Err(CallError::Zk(zk::Error::NoNode)) => Ok(false),
        Err(e) => Err(e),
    }
}

impl Engine for Zk {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        self.take(req, wait)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let nodes = Nodes::new(&self.root, name);
        let doing = format!("reading {name} on {}", self.url.display);
        let c = self.client(OPERATOR_SESSION)?;
        let queue = read(c, &nodes)
            .map_err(|e| sort(e, &doing))?
            .unwrap_or_default();
        let held = holders(&queue);
        Ok(Status {
            holders: queue[..held].iter().map(holder).collect(),
            waiters: Some((queue.len() - held) as u64),
            superseding: Some(queue[held..].iter().filter(|e| e.record.supersede).count() as u64),
        })
    }

    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let doing = format!("listing names on {}", self.url.display);
        let root = self.root.clone();
        let c = self.client(OPERATOR_SESSION)?;
        let children = match c.call(|z| async move { z.list_children(&root).await }) {
            Ok(ch) => ch,
            Err(CallError::Zk(zk::Error::NoNode)) => Vec::new(),
            Err(e) => return Err(sort(e, &doing)),
        };
        let mut names: Vec<String> = children.iter().filter_map(|n| queue::decode(n)).collect();
        names.sort();
        let mut notes = Vec::new();
        let others = children.len() - names.len();
        if others > 0 {
            notes.push(format!(
                "left out {others} node(s) under the prefix that are no lock's"
            ));
        }
        let mut listed = Vec::new();
        for name in names {
            if listed.len() >= bound.names || bound.passed() {
                notes.push(format!(
                    "stopped after {} names: the list is incomplete",
                    listed.len()
                ));
                break;
            }
            let st = self.status(&name)?;
            if !st.holders.is_empty() || st.waiters.unwrap_or(0) > 0 {
                listed.push((name, st));
            }
        }
        notes.push(
            "read name by name, not as one snapshot: a lock may change while the list is read"
                .into(),
        );
        Ok(Listing {
            names: listed,
            notes,
        })
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let nodes = Nodes::new(&self.root, name);
        let doing = format!("releasing {name} on {}", self.url.display);
        let c = self.client(OPERATOR_SESSION)?.clone();
        let queue = read(&c, &nodes)
            .map_err(|e| sort(e, &doing))?
            .unwrap_or_default();
        let held = &queue[..holders(&queue)];
        if held.is_empty() {
            return Ok(Broken::NotHeld);
        }
        let matched: Vec<&Entry> = held
            .iter()
            .filter(|e| force.token.is_none_or(|t| t == e.czxid))
            .collect();
        if matched.is_empty() {
            return Ok(Broken::TokenMismatch(
                held.iter().map(|e| e.czxid).collect(),
            ));
        }
        let mut broken = Vec::new();
        for e in matched {
            if e.record.revoked && !force.now {
                continue;
            }
            let done = if force.now {
                delete(&c, &nodes, e).map_err(|err| sort(err, &doing))?
            } else {
                // The node stays on the holder's session, so it ends when
                // that session would have: nobody else gets in early.
                let revoked = Record {
                    revoked: true,
                    ..e.record.clone()
                };
                let path = nodes.child(&e.node);
                let version = e.version;
                match c.call(|z| async move {
                    z.set_data(&path, &revoked.encode(), Some(version)).await
                }) {
                    Ok(_) => true,
                    // Changed or gone since we looked: not the lease asked about.
                    Err(CallError::Zk(zk::Error::NoNode | zk::Error::BadVersion)) => false,
                    Err(err) => return Err(sort(err, &doing)),
                }
            };
            if done {
                let mut h = holder(e);
                if force.now {
                    h.ttl_left = None;
                } else {
                    h.revoked = true;
                }
                broken.push(h);
            }
        }
        if broken.is_empty() {
            return Ok(Broken::AlreadyRevoked);
        }
        Ok(Broken::Leases(broken))
    }
}

/// A lease on ZooKeeper: our node on our session.
struct ZkHeld {
    client: Client,
    nodes: Nodes,
    entry: Entry,
    ttl: Duration,
}

impl Held for ZkHeld {
    fn renewer(&self) -> Renewing {
        Renewing::OnItsConnection(Box::new(ZkRenewer {
            client: self.client.clone(),
            path: self.nodes.child(&self.entry.node),
            session: self.client.session_id(),
            ttl: self.ttl,
        }))
    }

    fn release(self: Box<Self>) -> Result<bool, Error> {
        let r = delete(&self.client, &self.nodes, &self.entry);
        // Our session ends with lockrun; its nodes, if any are left, with it.
        r.map_err(|e| sort(e, "releasing"))
    }

    fn give_back(self: Box<Self>) -> Result<bool, Error> {
        self.release()
    }
}

/// A renewal: one round trip that proves the session alive and the node
/// ours (there, on our session, not revoked).
struct ZkRenewer {
    client: Client,
    path: String,
    session: i64,
    ttl: Duration,
}

impl Renewer for ZkRenewer {
    fn renew(&mut self) -> Result<Renewal, Error> {
        let path = self.path.clone();
        let (data, stat) = match self.client.call(|z| async move { z.get_data(&path).await }) {
            Ok(v) => v,
            Err(CallError::Zk(zk::Error::NoNode)) => return Ok(Renewal::Lost),
            Err(e) if expired(&e) => return Ok(Renewal::Lost),
            Err(e) => return Err(sort(e, "renewing")),
        };
        if stat.ephemeral_owner != self.session {
            return Ok(Renewal::Lost);
        }
        let Some(record) = Record::decode(&data) else {
            return Ok(Renewal::Lost);
        };
        if record.revoked {
            return Ok(Renewal::Lost);
        }
        if let Some(by) = record.preempted_by {
            return Ok(Renewal::Preempted { by });
        }
        Ok(Renewal::Renewed { ttl: self.ttl })
    }
}
