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
//! `take.rs` is the acquire loop; `held.rs` the lease once granted, its
//! release and its renewal; `list.rs` reads names for `status`, a batch
//! at a time. This file holds the engine's row, reading a name, status
//! and `release --force`.

mod address;
mod client;
mod doctor;
mod granted;
mod held;
mod leave;
mod list;
mod queue;
mod read;
mod take;

use std::time::Duration;

use zookeeper_client as zk;

pub use address::{ZkUrl, parse};
use client::{CallError, Client, sort};
use held::{ZkHeld, check, is_refusal};
use queue::{Entry, Nodes, Record, Window, holders, request_of};
use read::read;

use super::plan::{self, ForcePlan, Standing};
use super::{Acquired, Request, Wait};
use super::{
    Broken, Engine, EngineInfo, Error, Force, Holder, ListBound, Listing, Opening, Status,
};
use crate::log;

/// ZooKeeper's row of the scheme table.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "ZooKeeper",
    schemes: &["zk", "zookeeper", "zks"],
    form: "zk://[user:pass@]host[:port][,host[:port]…][/chroot], zks://…[#insecure]",
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
            // A full server names itself (and is ridden out by the caller).
            let c = Client::connect(&self.url, ttl, self.op).map_err(|e| match e {
                Error::Full(_) => e,
                e => e.doing(format_args!("on {}", self.url.display)),
            })?;
            if self.url.chroot.is_some() {
                // A chroot that does not exist: every call would fail.
                let there = c
                    .call(|z| async move { z.check_stat("/").await })
                    .map_err(|e| sort(e, "reading the chroot"))?;
                if there.is_none() {
                    return Err(Error::Refused(client::chroot_missing(
                        &self.url.display,
                        self.url.chroot.as_deref().unwrap_or(""),
                    )));
                }
            }
            self.client = Some(c);
        }
        Ok(self.client.as_ref().expect("set above"))
    }
}

/// A name's state as read: its queue and its `--min-hold` windows.
#[derive(Default)]
pub(crate) struct Name {
    pub queue: Vec<Entry>,
    pub windows: Vec<Window>,
    /// Nodes of the name this identity may not read (another identity's).
    pub foreign: Vec<String>,
    /// Request or window nodes whose record this lockrun cannot decode (a
    /// newer lockrun's, or changed by hand): holders it cannot judge.
    pub undecodable: Vec<String>,
}

impl Name {
    /// Holders at the front of the queue (beside the windows).
    fn queue_held(&self) -> usize {
        holders(&self.windows, &self.queue)
    }

    /// Leave out the windows that ended by `now` (the server's clock),
    /// the rest in the order they end.
    fn in_force(&mut self, now: i64) {
        self.windows.retain(|w| w.end > now);
        self.windows.sort_by_key(|w| w.end);
    }

    /// What `status` shows of it, the windows' time left counted from
    /// `now` (the server's clock).
    fn status(&self, now: i64) -> Status {
        let held = self.queue_held();
        let mut out: Vec<Holder> = self.windows.iter().map(|w| window_holder(w, now)).collect();
        out.extend(self.queue[..held].iter().map(holder));
        Status {
            holders: out,
            waiters: Some((self.queue.len() - held) as u64),
            superseding: Some(
                self.queue[held..]
                    .iter()
                    .filter(|e| e.record.supersede)
                    .count() as u64,
            ),
        }
    }
}

/// How many times a name is read again when its node went between the
/// read and the write that reads the clock: the node is a container, which
/// ZooKeeper removes once its last child went, so what was read is gone.
const READS_AGAIN: u32 = 3;

/// The server's clock now (ms since the epoch): the time of a write that
/// changes nothing of ours (the name's parent holds no data).
fn server_now(c: &Client, nodes: &Nodes) -> Result<i64, CallError> {
    let parent = nodes.parent.clone();
    let stat = c.call(|z| async move { z.set_data(&parent, b"", None).await })?;
    Ok(stat.mtime)
}

/// Read a name, leaving out the windows that ended by the server's clock.
/// A node this identity may not read is a holder it cannot judge: refused.
fn read_name(c: &Client, nodes: &Nodes) -> Result<Name, CallError> {
    read_name_behind(c, nodes, None)
}

/// The same for the request whose sequence number is `ours`: another
/// identity's request node behind it (created later, so never a holder
/// before it) does not count; any other node it may not read is refused.
fn read_name_behind(c: &Client, nodes: &Nodes, ours: Option<u64>) -> Result<Name, CallError> {
    let mut again = READS_AGAIN;
    loop {
        let mut name = read(c, nodes)?.unwrap_or_default();
        judgeable(nodes, &name, ours)?;
        if name.windows.is_empty() {
            return Ok(name);
        }
        match server_now(c, nodes) {
            Ok(now) => {
                name.in_force(now);
                return Ok(name);
            }
            Err(CallError::Zk(zk::Error::NoNode)) if again > 0 => again -= 1,
            Err(e) => return Err(e),
        }
    }
}

/// Refuse a name as read when it holds a node this identity may not read
/// or a record this lockrun cannot decode, but for another identity's
/// request behind ours (see `read_name_behind`).
fn judgeable(nodes: &Nodes, name: &Name, ours: Option<u64>) -> Result<(), CallError> {
    let behind = |n: &String| request_of(n).zip(ours).is_some_and(|((_, seq), o)| seq > o);
    if let Some(n) = name.foreign.iter().find(|n| !behind(n)) {
        return Err(CallError::Foreign(nodes.child(n)));
    }
    if let Some(n) = name.undecodable.iter().find(|n| !behind(n)) {
        return Err(CallError::Refused(format!(
            "the node {} holds a record this lockrun cannot read (made by another version \
             of lockrun, or changed by hand), so it cannot tell whether it holds the name; \
             run one version of lockrun on a name, or delete the node",
            nodes.child(n)
        )));
    }
    Ok(())
}

/// What stands at a name's place where lockrun cannot queue.
pub(crate) enum InTheWay {
    /// A node lockrun did not make (not its ACL's shape: one identity
    /// with every permission): another program's, or planted.
    NotLockruns(String),
    /// A name's node of another identity (its ACL gives this one nothing).
    OtherIdentity(String),
}

impl InTheWay {
    pub(crate) fn line(self) -> String {
        match self {
            InTheWay::NotLockruns(l) | InTheWay::OtherIdentity(l) => l,
        }
    }
}

/// An ACL as ZooKeeper shows it (scheme:id:permissions), a digest id by
/// its user alone: the rest is a hash of the password.
pub(crate) fn acl_text(acls: &[zk::Acl]) -> String {
    let shown: Vec<String> = acls
        .iter()
        .map(|a| {
            let id = match a.scheme() {
                "digest" => a.id().split(':').next().unwrap_or(""),
                _ => a.id(),
            };
            format!("{}:{id}:{}", a.scheme(), a.permission())
        })
        .collect();
    shown.join(",")
}

/// What stands at the name's place of `nodes` when this identity cannot
/// queue there: its ACL lets neither anyone nor the URL's user read,
/// write, create and delete under it. None when it can, when the node is
/// not there, or when its ACL cannot be read (the read that follows says
/// what it finds). ZooKeeper shows a container as a persistent node, so
/// the ACL alone tells lockrun's name nodes from others.
pub(crate) fn foreign_at(c: &Client, nodes: &Nodes) -> Result<Option<InTheWay>, CallError> {
    let path = nodes.parent.clone();
    let acl = c.call(|z| async move { Ok(z.get_acl(&path).await) })?;
    in_the_way(c, nodes, acl)
}

/// The same from the name's node's ACL as the server gave it.
pub(crate) fn in_the_way(
    c: &Client,
    nodes: &Nodes,
    acl: Result<(Vec<zk::Acl>, zk::Stat), zk::Error>,
) -> Result<Option<InTheWay>, CallError> {
    use zk::Permission as P;
    let (acls, stat) = match acl {
        Ok(v) => v,
        Err(zk::Error::NoNode | zk::Error::NoAuth) => return Ok(None),
        Err(e) => return Err(CallError::Zk(e)),
    };
    let needed = P::READ | P::WRITE | P::CREATE | P::DELETE;
    let ours = |a: &zk::Acl| match a.scheme() {
        "world" => a.id() == "anyone",
        "digest" => c
            .user
            .as_deref()
            .is_some_and(|u| a.id().split(':').next() == Some(u)),
        _ => false,
    };
    if acls.iter().any(|a| ours(a) && a.permission().has(needed)) {
        return Ok(None);
    }
    let shown = c.chrooted(&nodes.parent);
    let acl = acl_text(&acls);
    let lockruns = acls.len() == 1 && acls[0].permission() == P::ALL && stat.ephemeral_owner == 0;
    Ok(Some(if lockruns {
        InTheWay::OtherIdentity(format!(
            "{shown} is another identity's name (ACL {acl}): every user of a name must use \
             the same credentials"
        ))
    } else {
        let kind = if stat.ephemeral_owner == 0 {
            "a node"
        } else {
            "an ephemeral node"
        };
        InTheWay::NotLockruns(format!(
            "{shown} is not lockrun's: {kind} with ACL {acl} where the name's node goes, so \
             no request can queue on the name; delete it (zkCli.sh deleteall {shown}) as an \
             identity the prefix's ACL lets delete, or as ZooKeeper's superuser"
        ))
    }))
}

/// Refuse a name whose place holds what this identity cannot queue under.
fn refuse_in_the_way(c: &Client, nodes: &Nodes) -> Result<(), CallError> {
    match foreign_at(c, nodes)? {
        Some(w) => Err(CallError::Refused(w.line())),
        None => Ok(()),
    }
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
        // ZooKeeper does not say how much of a session is left: no number
        // that would look exact (lockrun-engines(7) "ZOOKEEPER").
        ttl_left: None,
        held_for: (e.ctime > 0)
            .then(|| Duration::from_millis(wall_ms().saturating_sub(e.ctime).max(0) as u64)),
        revoked: r.revoked,
        min_hold: false,
        preempted_by: r.preempted_by.clone(),
    }
}

fn window_holder(w: &Window, now: i64) -> Holder {
    let r = &w.record;
    Holder {
        label: Some(r.label.clone()).filter(|l| !l.is_empty()),
        token: r.token,
        mode: r.mode(),
        slot: r.slot.filter(|_| matches!(r.mode(), super::Mode::Limit(_))),
        ttl_left: Some(Duration::from_millis((w.end - now).max(0) as u64)),
        held_for: None,
        revoked: false,
        min_hold: true,
        preempted_by: None,
    }
}

/// End a window (it runs no job): Ok(false) when it changed or went.
fn end_window(c: &Client, nodes: &Nodes, w: &Window) -> Result<bool, CallError> {
    let path = nodes.child(&w.node);
    let version = w.version;
    match c.call(|z| async move { z.delete(&path, Some(version)).await }) {
        Ok(()) => Ok(true),
        Err(CallError::Zk(zk::Error::NoNode | zk::Error::BadVersion)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Delete a request node and the slot it claimed, together.
fn delete(c: &Client, nodes: &Nodes, e: &Entry) -> Result<bool, CallError> {
    delete_at(c, nodes, e, None)
}

/// The slot node of `e` with its version, if it is still `e`'s: it names
/// `e`'s node and lives on `e`'s session. A slot node deleted behind our
/// back may have been claimed since by another holder, at the same path:
/// deleting it by its path alone would take that holder's slot away, and
/// the next claim would put a second holder in it.
fn own_slot(c: &Client, nodes: &Nodes, e: &Entry) -> Result<Option<(String, i32)>, CallError> {
    let Some(s) = e.slot else { return Ok(None) };
    let path = nodes.slot(s);
    let p = path.clone();
    match c.call(|z| async move { z.get_data(&p).await }) {
        Ok((data, stat)) if data == e.node.as_bytes() && stat.ephemeral_owner == e.owner => {
            Ok(Some((path, stat.version)))
        }
        Ok(_) | Err(CallError::Zk(zk::Error::NoNode)) => Ok(None),
        Err(err) => Err(err),
    }
}

/// The same, only while the node is at `version` (unmarked since read).
fn delete_at(
    c: &Client,
    nodes: &Nodes,
    e: &Entry,
    version: Option<i32>,
) -> Result<bool, CallError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let path = nodes.child(&e.node);
        let slot = own_slot(c, nodes, e)?;
        let with_slot = slot.is_some();
        let r = c.call(|z| async move {
            let mut w = z.new_multi_writer();
            w.add_delete(&path, version)?;
            if let Some((s, v)) = &slot {
                w.add_delete(s, Some(*v))?;
            }
            w.commit().await.map_err(zk::Error::from)
        });
        match r {
            Ok(_) => return Ok(true),
            // Our slot node went since it was read: the request node alone.
            Err(CallError::Zk(zk::Error::NoNode)) if with_slot && tries < 2 => {}
            Err(CallError::Zk(zk::Error::NoNode)) => return Ok(false),
            Err(e) => return Err(e),
        }
    }
}

impl Engine for Zk {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        self.take(req, wait)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let doing = format!("reading {name} on {}", self.url.display);
        let c = self.client(OPERATOR_SESSION)?.clone();
        let mut read =
            list::statuses(&c, &self.root, &[name.to_string()]).map_err(|e| sort(e, &doing))?;
        let one = read.pop().expect("a status for each name");
        one.map_err(|e| sort(e, &doing))
    }

    fn names(&mut self, _bound: ListBound) -> Result<plan::Names, Error> {
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
        Ok(plan::Names { names, notes })
    }

    /// Name by name as the default does, but a batch of names read
    /// together (`list.rs`).
    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let plan::Names { names, notes } = self.names(bound)?;
        let c = self.client(OPERATOR_SESSION)?.clone();
        let mut ahead = list::Ahead::new(c, &self.root, &self.url.display, names.clone());
        let names = names.into_iter().enumerate().map(|(i, n)| (n, i));
        plan::listing(names, bound, notes, plan::NAME_BY_NAME, |_, i| {
            ahead.read(i)
        })
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let nodes = Nodes::new(&self.root, name);
        let doing = format!("releasing {name} on {}", self.url.display);
        let c = self.client(OPERATOR_SESSION)?.clone();
        let n = refuse_in_the_way(&c, &nodes)
            .and_then(|()| read_name(&c, &nodes))
            .map_err(|e| sort(e, &doing))?;
        // The windows, then the holders in the queue.
        let held = &n.queue[..n.queue_held()];
        let mut standing: Vec<Standing> = n.windows.iter().map(Window::standing).collect();
        standing.extend(held.iter().map(Entry::standing));
        let cuts = match plan::force(&standing, force) {
            ForcePlan::Done(done) => return Ok(done),
            ForcePlan::Cut(cuts) => cuts,
        };
        let mut broken = Vec::new();
        for (i, cut) in cuts {
            let Some(e) = i.checked_sub(n.windows.len()).map(|i| &held[i]) else {
                let w = &n.windows[i];
                if end_window(&c, &nodes, w).map_err(|e| sort(e, &doing))? {
                    broken.push(cut.shown(window_holder(w, 0)));
                }
                continue;
            };
            let done = if cut.deletes() {
                // Only the grant that was read: not one that changed since.
                match delete_at(&c, &nodes, e, Some(e.version)) {
                    Ok(done) => done,
                    Err(CallError::Zk(zk::Error::BadVersion)) => false,
                    Err(err) => return Err(sort(err, &doing)),
                }
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
                broken.push(cut.shown(holder(e)));
            }
        }
        Ok(plan::forced(broken))
    }
}
