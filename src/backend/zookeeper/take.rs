//! Taking a name on ZooKeeper: create our ephemeral sequential node (its
//! name carries a unique part, so a create whose reply was lost is found
//! again rather than repeated), judge the queue, and while blocked watch
//! the node just ahead. The give-up clock, the waiting line and the retry
//! budget are the driver's (`backend::drive`).

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use zookeeper_client as zk;

use super::address::ZkUrl;
use super::client::{CallError, Client, expired, sort};
use super::queue::{Entry, Nodes, Record, Verdict, judge, request_of};
use super::{Name, Zk, ZkHeld, check, delete, end_window, read_name_behind, server_now};
use crate::backend::drive::{Step, Take, drive};
use crate::backend::plan::{self, Standing};
use crate::backend::wait::{Patience, Retry};
use crate::backend::{Acquired, Error, Lease, Mode, Request, Wait};
use crate::clock::Boot;
use crate::log;

/// A waiter looks at the queue again after this even with no event: a
/// watch lost with a connection costs at most this.
const LOOK_AGAIN: Duration = Duration::from_secs(30);

/// Our request in the queue.
struct Mine {
    /// The unique part of our node's name.
    id: String,
    /// Our node's name, once seen.
    node: Option<String>,
    /// A create was sent (its reply may have been lost).
    sent: bool,
}

struct Taking<'a> {
    zk: &'a mut Zk,
    client: Client,
    req: &'a Request<'a>,
    nodes: Nodes,
    mine: Option<Mine>,
    /// The concurrency group words were applied (once, as the request
    /// first found itself waiting).
    joined: bool,
    holder: Option<String>,
    /// The queue as last read in full, and whether a watch just woke us:
    /// then an exclusive request looks with one list (`quick_look`).
    known: Vec<Entry>,
    woken: bool,
}

fn unique() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
        .map_err(|e| Error::Internal(format!("reading random bytes: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The ACL of the prefix's node, shared by every identity that locks
/// under the prefix: anyone may read it and create a name's node in it,
/// so who came first never decides who may lock a name; and anyone may
/// delete a child of it, so a node planted where a name's node goes (that
/// lockrun could never queue under) is removed by whoever runs lockrun,
/// not only by ZooKeeper's superuser. ZooKeeper deletes a node only when
/// it has no children: a name's node with requests in it stays, and an
/// empty one is a container ZooKeeper deletes itself anyway. Nobody may
/// set its data or change its ACL.
static PREFIX_ACL: std::sync::LazyLock<[zk::Acl; 1]> = std::sync::LazyLock::new(|| {
    use zk::Permission as P;
    [zk::Acl::new(
        P::READ | P::CREATE | P::DELETE,
        zk::AuthId::new("world", "anyone"),
    )]
});

/// Create a container node with `acls` if it is not there.
fn container(c: &Client, path: &str, acls: zk::Acls<'static>) -> Result<(), CallError> {
    let path = path.to_string();
    match c.call(|z| async move {
        let opts = zk::CreateMode::Container.with_acls(acls);
        z.create(&path, b"", &opts).await
    }) {
        Ok(_) | Err(CallError::Zk(zk::Error::NodeExists)) => Ok(()),
        Err(e) => Err(e),
    }
}

impl Take for Taking<'_> {
    type Transport = Client;

    fn step(&mut self, patience: &mut Patience, _: &mut Retry) -> Result<Step, Error> {
        match self.look(patience) {
            Ok(step) => Ok(step),
            Err(Failed::Final(e)) => {
                self.leave();
                Ok(Step::Over(e))
            }
            Err(Failed::Call(e, doing)) => {
                if expired(&e) {
                    // Our session is over, and our node with it: a new
                    // session, and a new place at the back.
                    log::info(format!(
                        "our ZooKeeper session expired while acquiring {}; queueing again",
                        self.req.name
                    ));
                    self.mine = None;
                    self.zk.client = None;
                    self.client = self.client.reconnect(&self.zk.url, self.req.timing.ttl)?;
                    self.zk.client = Some(self.client.clone());
                    // The server may grant a new session less than before.
                    if let Some(e) = too_short(&self.zk.url, &self.client, self.req.timing.ttl) {
                        return Ok(Step::Over(e));
                    }
                    return Ok(Step::Again);
                }
                Err(sort(e, &doing))
            }
        }
    }

    fn leave(&mut self) {
        let Some(m) = self.mine.take() else { return };
        let node = match m.node {
            Some(node) => Some(node),
            // A create whose reply was lost may have made our node: find
            // it by its unique part.
            None if m.sent => {
                let parent = self.nodes.parent.clone();
                let prefix = format!("q-{}-", m.id);
                self.client
                    .call(|z| async move { z.list_children(&parent).await })
                    .ok()
                    .and_then(|ch| ch.into_iter().find(|n| n.starts_with(&prefix)))
            }
            None => None,
        };
        if let Some(node) = node {
            let path = self.nodes.child(&node);
            let _ = self
                .client
                .call(|z| async move { z.delete(&path, None).await });
        }
    }

    fn way_out(&self) -> Option<crate::backend::quit::Leave> {
        let (url, parent, ttl) = (&self.zk.url, &self.nodes.parent, self.req.timing.ttl);
        Some(super::leave::way_out(url, parent, &self.client, ttl))
    }

    fn transport(&self) -> &Client {
        &self.client
    }
}

enum Failed {
    Call(CallError, String),
    Final(Error),
}

/// Rewrite request `e`'s record as `change` makes it, while it is as read.
/// Ok(false): it changed or went since.
fn mark(
    c: &Client,
    nodes: &Nodes,
    e: &Entry,
    change: impl FnOnce(Record) -> Record,
) -> Result<bool, Failed> {
    let path = nodes.child(&e.node);
    let (version, r) = (e.version, change(e.record.clone()));
    match c.call(|z| async move { z.set_data(&path, &r.encode(), Some(version)).await }) {
        Ok(_) => Ok(true),
        Err(CallError::Zk(zk::Error::NoNode | zk::Error::BadVersion)) => Ok(false),
        Err(e) => Err(Failed::Call(e, "marking a request".into())),
    }
}

fn call_failed(doing: &str) -> impl Fn(CallError) -> Failed + '_ {
    move |e| Failed::Call(e, doing.to_string())
}

impl Zk {
    pub(super) fn take(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        let ttl = req.timing.ttl;
        let client = self.client(ttl)?.clone();
        if let Some(e) = too_short(&self.url, &client, ttl) {
            return Err(e);
        }
        let mut taking = Taking {
            nodes: Nodes::new(&self.root, req.name),
            zk: self,
            client,
            req,
            mine: None,
            joined: false,
            holder: None,
            known: Vec::new(),
            woken: false,
        };
        drive(&mut taking, req, wait)
    }
}

/// The refusal of a ttl longer than the session the server granted: the
/// lease is the session. Checked when a session is made, and again
/// before a waiter's grant, since ZooKeeper negotiates the timeout again
/// on every reconnect (a restart with a smaller maxSessionTimeout, a
/// rolling change of tickTime).
fn too_short(url: &ZkUrl, c: &Client, ttl: Duration) -> Option<Error> {
    let granted = c.granted().unwrap_or(Duration::ZERO);
    (granted < ttl).then(|| {
        Error::Request(format!(
            "--ttl {} is longer than the longest session {} grants ({}, its \
             maxSessionTimeout): use --ttl {} or less, or raise maxSessionTimeout",
            crate::text::duration(ttl),
            url.display,
            crate::text::duration(granted),
            crate::text::duration(granted),
        ))
    })
}

impl Taking<'_> {
    fn look(&mut self, patience: &mut Patience) -> Result<Step, Failed> {
        let req = self.req;
        let c = self.client.clone();
        let ttl = req.timing.ttl;
        if self.mine.is_none() {
            self.mine = Some(Mine {
                id: unique().map_err(Failed::Final)?,
                node: None,
                sent: false,
            });
        }
        let m = self.mine.as_mut().expect("set above");
        // The create is judged by the leader, which checks our session:
        // a grant on the look right after it counts from its send.
        let mut created_at = None;
        if m.node.is_none() && !m.sent {
            m.sent = true;
            created_at = Some(Boot::now());
            let record = Record::new(req, ttl.as_millis() as u64);
            let doing = format!("creating our node under {}", self.nodes.parent);
            let node =
                create(&c, &self.nodes, &m.id, &record.encode()).map_err(call_failed(&doing))?;
            m.node = Some(node);
        }
        // Our sequence number, when we know our node: another identity's
        // request behind ours cannot hold before us.
        let our_seq = m.node.as_deref().and_then(request_of).map(|(_, seq)| seq);
        let name = match self.quick_look(&c)? {
            Some(name) => name,
            None => {
                let name = read_name_behind(&c, &self.nodes, our_seq)
                    .map_err(call_failed("reading the queue"))?;
                self.known = name.queue.clone();
                name
            }
        };
        let queue = &name.queue;
        let m = self.mine.as_mut().expect("set above");
        let ours: Vec<&Entry> = queue.iter().filter(|e| e.id == m.id).collect();
        let Some(first) = ours.first() else {
            // A replaced node is left out of the queue: look for it apart.
            let node = m.node.clone();
            if let Some(by) = self.replaced(&c, node.as_deref())? {
                self.leave();
                return Ok(Step::Done(Acquired::Replaced { by }));
            }
            let m = self.mine.as_mut().expect("set above");
            if m.node.is_some() {
                // Our node went: deleted by an operator, or with a session
                // that expired under us. Queue again, at the back.
                log::info(format!(
                    "our place in {}'s queue went; queueing again",
                    req.name
                ));
                self.mine = None;
            } else {
                // The create's reply was lost and it never happened.
                m.sent = false;
            }
            return Ok(Step::Again);
        };
        let first = (*first).clone();
        // A create repeated after a lost reply: only the first is ours.
        for extra in ours.iter().skip(1) {
            let _ = delete(&c, &self.nodes, extra);
        }
        if ours.len() > 1 {
            return Ok(Step::Again);
        }
        m.node = Some(first.node.clone());
        if first.owner != c.session_id() {
            self.leave();
            return Err(Failed::Final(Error::Refused(format!(
                "our node in {}'s queue is on another session: remove it",
                req.name
            ))));
        }
        if first.record.revoked {
            // Revoked by `release --force` as it came to the front: queue again.
            log::info(format!(
                "our place in {}'s queue was revoked; queueing again",
                req.name
            ));
            self.leave();
            return Ok(Step::Again);
        }
        let me = queue
            .iter()
            .position(|e| e.node == first.node)
            .expect("found above");
        match judge(&name.windows, queue, me, req) {
            Verdict::Nested => Err(Failed::Final(crate::backend::nested(req.name))),
            Verdict::Disagrees(in_force) => {
                Err(Failed::Final(req.mode.disagreement(req.name, in_force)))
            }
            Verdict::Granted { slot } => {
                let mut entry = first;
                // Judged on a read, which a follower may serve while the
                // leader is away: confirm through the leader that our
                // session is alive and our node as read.
                let sent = match created_at {
                    // A --supersede request may be marked replaced by a
                    // later one that read it as waiting: the grant writes
                    // its node (at the version read), so a mark made on an
                    // older read fails, and a mark that came first fails
                    // the grant. A replaced node is never a holder.
                    _ if req.group.supersede => {
                        let at = Boot::now();
                        match confirm(&c, &self.nodes.child(&entry.node), &entry) {
                            Ok(version) => {
                                entry.version = version;
                                at
                            }
                            Err(CallError::Zk(zk::Error::BadVersion | zk::Error::NoNode)) => {
                                return Ok(Step::Again);
                            }
                            Err(e) => return Err(Failed::Call(e, "confirming our turn".into())),
                        }
                    }
                    Some(at) => at,
                    None => {
                        let at = Boot::now();
                        match check(&c, &self.nodes.child(&entry.node), entry.version) {
                            Ok(()) => at,
                            Err(CallError::Zk(zk::Error::BadVersion | zk::Error::NoNode)) => {
                                return Ok(Step::Again);
                            }
                            Err(e) => return Err(Failed::Call(e, "confirming our turn".into())),
                        }
                    }
                };
                // Our session may have reconnected since it was made, to a
                // server that grants less: as a fresh run, refused.
                if let Some(e) = too_short(&self.zk.url, &c, ttl) {
                    return Err(Failed::Final(e));
                }
                if let Mode::Limit(n) = req.mode
                    && entry.slot.is_none()
                {
                    let kept: Vec<u32> =
                        name.windows.iter().filter_map(|w| w.record.slot).collect();
                    match claim(&c, &self.nodes, &entry.node, slot.unwrap_or(0), n, &kept)
                        .map_err(call_failed("claiming a slot"))?
                    {
                        Some(s) => entry.slot = Some(s),
                        None => {
                            std::thread::sleep(Duration::from_millis(50));
                            return Ok(Step::Again);
                        }
                    }
                }
                let token = entry.czxid;
                let slot = entry.slot.filter(|_| matches!(req.mode, Mode::Limit(_)));
                let held = ZkHeld {
                    client: c,
                    nodes: Nodes::new(&self.zk.root, req.name),
                    entry,
                    ttl,
                    name: req.name.to_string(),
                    granted_by: Boot::now(),
                    min_hold: req.min_hold,
                };
                Ok(Step::Done(Acquired::Granted(Lease::new(
                    token,
                    slot,
                    sent,
                    ttl,
                    Box::new(held),
                ))))
            }
            Verdict::Blocked { watch, until } => {
                self.holder = name
                    .windows
                    .first()
                    .map(|w| w.record.label.clone())
                    .or_else(|| queue.first().map(|e| e.record.label.clone()))
                    .or(self.holder.take());
                if !self.joined {
                    if let Some(step) = self.join(&c, &name, me)? {
                        return Ok(step);
                    }
                    self.joined = true;
                }
                if patience.over() {
                    self.leave();
                    return Ok(Step::Done(Acquired::Busy {
                        holder: self.holder.clone(),
                    }));
                }
                patience.tick(self.holder.as_deref());
                // A window ends on the server's clock: sleep until then by ours.
                let wake = match until {
                    Some(end) => {
                        let now = server_now(&c, &self.nodes)
                            .map_err(call_failed("reading the server's clock"))?;
                        Some(Boot::now().add(Duration::from_millis((end - now).max(0) as u64 + 5)))
                    }
                    None => None,
                };
                self.wait_turn(&c, &watch, &first.node, wake, patience)
            }
        }
    }

    /// Woken by a watch, an exclusive request looks at the names of the
    /// name's nodes alone (one round trip): when every one is a request
    /// read before, their records are as read (a mode never changes; a
    /// mark read late only keeps us waiting longer), and the queue is
    /// those still there. Anything new (a slot, a window, a request not
    /// read yet) needs the full read: None.
    fn quick_look(&mut self, c: &Client) -> Result<Option<Name>, Failed> {
        let woken = std::mem::take(&mut self.woken);
        let req = self.req;
        if !woken || req.mode != Mode::Exclusive || req.group.supersede || self.known.is_empty() {
            return Ok(None);
        }
        let parent = self.nodes.parent.clone();
        let children = match c.call(|z| async move { z.list_children(&parent).await }) {
            Ok(ch) => ch,
            Err(CallError::Zk(zk::Error::NoNode)) => return Ok(None),
            Err(e) => return Err(Failed::Call(e, "reading the queue".into())),
        };
        let lockrun_s =
            |n: &String| request_of(n).is_some() || n.starts_with("s-") || n.starts_with("w-");
        let ours: Vec<&String> = children.iter().filter(|n| lockrun_s(n)).collect();
        if ours
            .iter()
            .any(|n| !self.known.iter().any(|e| &e.node == *n))
        {
            return Ok(None);
        }
        let queue: Vec<Entry> = self
            .known
            .iter()
            .filter(|e| ours.contains(&&e.node))
            .cloned()
            .collect();
        Ok(Some(Name {
            queue,
            windows: Vec::new(),
            foreign: Vec::new(),
            undecodable: Vec::new(),
        }))
    }

    /// Who replaced our waiting request, if a `--supersede` request did.
    fn replaced(&self, c: &Client, node: Option<&str>) -> Result<Option<String>, Failed> {
        let Some(node) = node else {
            return Ok(None);
        };
        let path = self.nodes.child(node);
        match c.call(|z| async move { z.get_data(&path).await }) {
            Ok((data, _)) => Ok(Record::decode(&data).and_then(|r| r.replaced_by)),
            Err(CallError::Zk(zk::Error::NoNode)) => Ok(None),
            Err(e) => Err(Failed::Call(e, "reading our node".into())),
        }
    }

    /// The first time our request finds itself waiting, it carries out
    /// its join plan (`plan::join`): a full queue (`--max-waiters`) and
    /// ours leaves; else `--preempt` ends the windows and marks the
    /// holders, and `--supersede` marks the earlier waiters that asked for
    /// it too as replaced.
    fn join(&mut self, c: &Client, name: &Name, me: usize) -> Result<Option<Step>, Failed> {
        let queue = &name.queue;
        let held = name.queue_held().min(me);
        // The windows, then the holders in the queue.
        let mut holders: Vec<Standing> = name.windows.iter().map(|w| w.standing()).collect();
        holders.extend(queue[..held].iter().map(Entry::standing));
        let ahead: Vec<Standing> = queue[held..me].iter().map(Entry::standing).collect();
        let plan = plan::join(self.req.group, &holders, &ahead);
        if let Some(waiting) = plan.full {
            self.leave();
            return Ok(Some(Step::Done(Acquired::QueueFull { waiting })));
        }
        let shown = &self.req.owner.shown;
        let mut again = false;
        for (i, _) in plan.preempt {
            let done = match i.checked_sub(name.windows.len()) {
                // A --min-hold window runs no job: it ends at once.
                None => end_window(c, &self.nodes, &name.windows[i])
                    .map_err(call_failed("ending a window"))?,
                Some(i) => mark(c, &self.nodes, &queue[i], |r| Record {
                    preempted_by: Some(shown.clone()),
                    ..r
                })?,
            };
            again |= !done;
        }
        for i in plan.replace {
            again |= !mark(c, &self.nodes, &queue[held + i], |r| Record {
                replaced_by: Some(shown.clone()),
                ..r
            })?;
        }
        Ok(again.then_some(Step::Again))
    }

    /// Block until a watched node goes (or ours is marked replaced), or
    /// the wait says to look again.
    fn wait_turn(
        &mut self,
        c: &Client,
        watch: &[String],
        own: &str,
        wake: Option<Boot>,
        patience: &mut Patience,
    ) -> Result<Step, Failed> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        for node in watch {
            let path = self.nodes.child(node);
            let (stat, watcher) = c
                .call(|z| async move { z.check_and_watch_stat(&path).await })
                .map_err(call_failed("watching the node ahead"))?;
            if stat.is_none() {
                return Ok(Step::Again);
            }
            let tx = tx.clone();
            c.spawn(async move {
                watcher.changed().await;
                let _ = tx.send(());
            });
        }
        if self.req.group.supersede {
            // A newer --supersede request marks our node: watch it too.
            let path = self.nodes.child(own);
            let (data, _, watcher) =
                match c.call(|z| async move { z.get_and_watch_data(&path).await }) {
                    Ok(v) => v,
                    // Gone: the next look finds out why.
                    Err(CallError::Zk(zk::Error::NoNode)) => return Ok(Step::Again),
                    Err(e) => return Err(Failed::Call(e, "watching our node".into())),
                };
            if Record::decode(&data).is_some_and(|r| r.replaced_by.is_some()) {
                return Ok(Step::Again);
            }
            let tx = tx.clone();
            c.spawn(async move {
                watcher.changed().await;
                let _ = tx.send(());
            });
        }
        // A watch's event lost with a connection comes back when the
        // session reconnects (the server resets our watches), but a
        // release missed meanwhile is read at once on reconnecting: the
        // session's state wakes us too. Dropping `_stop` ends the task.
        let (_stop, stop) = tokio::sync::oneshot::channel::<()>();
        let mut states = c
            .call(|z| async move { Ok(z.state_watcher()) })
            .map_err(call_failed("watching the session"))?;
        c.spawn(async move {
            let back = async move {
                let mut lost = !matches!(
                    states.peek_state(),
                    zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
                );
                loop {
                    match states.changed().await {
                        zk::SessionState::Disconnected => lost = true,
                        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly
                            if !lost => {}
                        // Back, or over for good: look again.
                        _ => return,
                    }
                }
            };
            if let futures_util::future::Either::Left(_) =
                futures_util::future::select(Box::pin(back), stop).await
            {
                let _ = tx.send(());
            }
        });
        let opened = Boot::now();
        loop {
            let mut left = LOOK_AGAIN.saturating_sub(Boot::now().since(opened));
            if let Some(at) = wake {
                if Boot::now() >= at {
                    return Ok(Step::Again);
                }
                left = left.min(at.since(Boot::now()));
            }
            match rx.recv_timeout(patience.cap(left).max(Duration::from_millis(1))) {
                Ok(()) => {
                    self.woken = true;
                    return Ok(Step::Again);
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(Step::Again),
                Err(RecvTimeoutError::Timeout) => {}
            }
            if patience.over() {
                self.leave();
                return Ok(Step::Done(Acquired::Busy {
                    holder: self.holder.clone(),
                }));
            }
            patience.tick(self.holder.as_deref());
            if Boot::now().since(opened) >= LOOK_AGAIN {
                return Ok(Step::Again);
            }
        }
    }
}

/// Create our node under the name's parent (the parents as needed): its
/// node name.
fn create(c: &Client, nodes: &Nodes, id: &str, data: &[u8]) -> Result<String, CallError> {
    let mut tries = 0;
    loop {
        let path = nodes.request(id);
        let data = data.to_vec();
        let acls = c.acls();
        match c.call(|z| async move {
            let opts = zk::CreateMode::EphemeralSequential.with_acls(acls);
            z.create(&path, &data, &opts).await
        }) {
            Ok((_, seq)) => return Ok(format!("q-{id}-{seq}")),
            Err(CallError::Zk(zk::Error::NoNode)) if tries >= 5 => {
                // Still no parent: the chroot may be gone under us.
                return Err(c.chroot_gone()?.unwrap_or(CallError::Zk(zk::Error::NoNode)));
            }
            Err(CallError::Zk(zk::Error::NoNode)) => {
                // ZooKeeper may delete an empty container at any time,
                // the prefix's between our two creates: try again.
                tries += 1;
                // The prefix's node is shared by every identity; a name's
                // node carries our ACL, as its requests do (a name is one
                // identity's: another could not read its requests).
                let prefix = zk::Acls::new(&PREFIX_ACL[..]);
                match container(c, &nodes.root, prefix)
                    .and_then(|()| container(c, &nodes.parent, c.acls()))
                {
                    Ok(()) | Err(CallError::Zk(zk::Error::NoNode)) => {}
                    Err(e) => return Err(e),
                }
            }
            // A node at the name's place that lockrun may not create
            // under: named, if it is not lockrun's.
            Err(CallError::Zk(e @ (zk::Error::NoAuth | zk::Error::NoChildrenForEphemerals))) => {
                return Err(match super::foreign_at(c, nodes)? {
                    Some(w) => CallError::Refused(w.line()),
                    None => CallError::Zk(e),
                });
            }
            Err(e) => return Err(e),
        }
    }
}

/// Rewrite our node as read, at the version read: the leader judges it
/// (our session alive, the node unchanged). Its new version.
fn confirm(c: &Client, path: &str, e: &Entry) -> Result<i32, CallError> {
    let path = path.to_string();
    let (data, version) = (e.record.encode(), e.version);
    c.call(|z| async move { z.set_data(&path, &data, Some(version)).await })
        .map(|stat| stat.version)
}

/// Claim a free `--limit` slot for our node, `first` tried first: None
/// when all N are taken (a holder leaving at this moment).
fn claim(
    c: &Client,
    nodes: &Nodes,
    node: &str,
    first: u32,
    n: u32,
    kept: &[u32],
) -> Result<Option<u32>, CallError> {
    for s in std::iter::once(first)
        .chain(0..n)
        .filter(|s| !kept.contains(s))
    {
        let path = nodes.slot(s);
        let data = node.as_bytes().to_vec();
        let acls = c.acls();
        let p = path.clone();
        match c.call(|z| async move {
            let opts = zk::CreateMode::Ephemeral.with_acls(acls);
            z.create(&p, &data, &opts).await
        }) {
            Ok(_) => return Ok(Some(s)),
            Err(CallError::Zk(zk::Error::NodeExists)) => {
                // Ours already, if an earlier claim's reply was lost.
                match c.call(|z| async move { z.get_data(&path).await }) {
                    Ok((d, _)) if d == node.as_bytes() => return Ok(Some(s)),
                    Ok(_) | Err(CallError::Zk(zk::Error::NoNode)) => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}
