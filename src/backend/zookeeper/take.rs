//! Taking a name on ZooKeeper: create our ephemeral sequential node (its
//! name carries a unique part, so a create whose reply was lost is found
//! again rather than repeated), judge the queue, and while blocked watch
//! the node just ahead. The give-up clock, the waiting line, the retry
//! budget and every pause between tries are the driver's (`backend::drive`);
//! the calls on our nodes and the watches are `take/nodes.rs`'s.

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use zookeeper_client as zk;

use super::address::ZkUrl;
use super::client::{CallError, Client, expired, sort};
use super::queue::{Entry, Nodes, Record, Verdict, judge, request_of};
use super::{Name, Zk, ZkHeld, check, delete, end_window, read_name_behind};
use crate::backend::drive::{Look, Remote, Take, Woke, connect_first, drive};
use crate::backend::plan::{self, Standing};
use crate::backend::{Acquired, Error, Lease, Mode, Request, Wait};
use crate::clock::Boot;
use crate::log;

mod nodes;

use nodes::{claim, confirm, create, unique};

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
    /// Creates in a row that found no parent: ZooKeeper may delete an
    /// empty container at any time, the prefix's between two creates.
    orphaned: u32,
    /// What the last look found in our way, and the watches on it once set.
    blocked: Option<Blocked>,
}

/// The nodes in our way, our own, and when a `--min-hold` window in our
/// way ends (on the server's clock).
struct Blocked {
    watch: Vec<String>,
    own: String,
    until: Option<i64>,
    watching: Option<Watching>,
}

/// Watches set on what is in our way: any news comes on `news`.
struct Watching {
    news: Receiver<()>,
    /// Dropped, it ends the task watching the session.
    _stop: tokio::sync::oneshot::Sender<()>,
    opened: Boot,
    /// When a window in our way ends, by our clock.
    wake: Option<Boot>,
}

impl Take for Taking<'_> {
    fn look(&mut self, _last: bool, _until: Option<Boot>) -> Result<Look, Error> {
        self.blocked = None;
        match self.look_once() {
            Ok(look) => Ok(look),
            Err(Failed::Final(e)) => Ok(Look::Over(e)),
            Err(Failed::Call(e, doing)) => self.recover(e, &doing).map(|()| Look::Again),
        }
    }

    fn wait(&mut self, until: Option<Boot>) -> Result<Woke, Error> {
        let Some(mut b) = self.blocked.take() else {
            return Ok(Woke::Look);
        };
        let woke = match self.wait_turn(&mut b, until) {
            Ok(woke) => woke,
            Err(Failed::Final(e)) => return Err(e),
            Err(Failed::Call(e, doing)) => self.recover(e, &doing).map(|()| Woke::Look)?,
        };
        if matches!(woke, Woke::Due) {
            self.blocked = Some(b);
        }
        Ok(woke)
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

    fn remote(&self) -> Option<&Remote> {
        Some(&self.client.remote)
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

impl Taking<'_> {
    /// A call failed: a session that expired is made again, and our place
    /// with it (queue again, at the back); anything else ends the request.
    fn recover(&mut self, e: CallError, doing: &str) -> Result<(), Error> {
        if !expired(&e) {
            return Err(sort(e, doing));
        }
        log::info(format!(
            "our ZooKeeper session expired while acquiring {}; queueing again",
            self.req.name
        ));
        self.mine = None;
        self.zk.client = None;
        self.client = self.client.reconnect(&self.zk.url, self.req.timing.ttl)?;
        self.zk.client = Some(self.client.clone());
        // The server may grant a new session less than before.
        match too_short(&self.zk.url, &self.client, self.req.timing.ttl) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Zk {
    pub(super) fn take(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        let ttl = req.timing.ttl;
        // A server whose connections from this address are all taken is
        // ridden out as the driver rides out any full server.
        let shown = self.url.display.clone();
        let (client, wait) = match connect_first(req, wait, &shown, || self.client(ttl).cloned())? {
            Ok(got) => got,
            Err(unreachable) => return Ok(unreachable),
        };
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
            orphaned: 0,
            blocked: None,
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
    /// One look: our node made (once), the queue read, and judged.
    fn look_once(&mut self) -> Result<Look, Failed> {
        let req = self.req;
        let c = self.client.clone();
        let Some(created_at) = self.ensure_node(&c)? else {
            return Ok(Look::Again);
        };
        let m = self.mine.as_ref().expect("made above");
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
        let first = match self.find_ours(&c, &name.queue)? {
            Ok(first) => first,
            Err(look) => return Ok(look),
        };
        if let Some(done) = self.not_ours_any_more(&c, &first)? {
            return Ok(done);
        }
        let queue = &name.queue;
        let me = queue
            .iter()
            .position(|e| e.node == first.node)
            .expect("found above");
        match judge(&name.windows, queue, me, req) {
            Verdict::Nested => Err(Failed::Final(crate::backend::nested(req.name))),
            Verdict::Disagrees(in_force) => {
                Err(Failed::Final(req.mode.disagreement(req.name, in_force)))
            }
            Verdict::Granted { slot } => self.granted(&c, &name, first, slot, created_at),
            Verdict::Blocked { watch, until } => {
                self.holder = name
                    .windows
                    .first()
                    .map(|w| w.record.label.clone())
                    .or_else(|| queue.first().map(|e| e.record.label.clone()))
                    .or(self.holder.take());
                if !self.joined {
                    if let Some(look) = self.join(&c, &name, me)? {
                        return Ok(look);
                    }
                    self.joined = true;
                }
                self.blocked = Some(Blocked {
                    watch,
                    own: first.node,
                    until,
                    watching: None,
                });
                Ok(Look::Blocked(self.holder.clone()))
            }
        }
    }

    /// Our request, with its node created once. Some(when the create was
    /// sent, if this look sent it); None: look again (the create found no
    /// parent, made now).
    fn ensure_node(&mut self, c: &Client) -> Result<Option<Option<Boot>>, Failed> {
        if self.mine.is_none() {
            self.mine = Some(Mine {
                id: unique().map_err(Failed::Final)?,
                node: None,
                sent: false,
            });
        }
        let m = self.mine.as_mut().expect("set above");
        if m.node.is_some() || m.sent {
            return Ok(Some(None));
        }
        // The create is judged by the leader, which checks our session:
        // a grant on the look right after it counts from its send.
        m.sent = true;
        let at = Boot::now();
        let record = Record::new(self.req, self.req.timing.ttl.as_millis() as u64);
        let doing = format!("creating our node under {}", self.nodes.parent);
        match create(c, &self.nodes, &m.id, &record.encode(), self.orphaned) {
            Ok(Some(node)) => {
                m.node = Some(node);
                self.orphaned = 0;
                Ok(Some(Some(at)))
            }
            Ok(None) => {
                m.sent = false;
                self.orphaned += 1;
                Ok(None)
            }
            Err(e) => Err(Failed::Call(e, doing)),
        }
    }

    /// Our entry in the queue read, or what the look comes to without it:
    /// replaced, or look again (our node went, or a create was repeated
    /// and its extra nodes are deleted now).
    fn find_ours(&mut self, c: &Client, queue: &[Entry]) -> Result<Result<Entry, Look>, Failed> {
        let m = self.mine.as_ref().expect("made before");
        let ours: Vec<&Entry> = queue.iter().filter(|e| e.id == m.id).collect();
        let Some(first) = ours.first() else {
            // A replaced node is left out of the queue: look for it apart.
            if let Some(by) = self.replaced(c, m.node.as_deref())? {
                self.leave();
                return Ok(Err(Look::Done(Acquired::Replaced { by })));
            }
            let m = self.mine.as_mut().expect("made before");
            if m.node.is_some() {
                // Our node went: deleted by an operator, or with a session
                // that expired under us. Queue again, at the back.
                log::info(format!(
                    "our place in {}'s queue went; queueing again",
                    self.req.name
                ));
                self.mine = None;
            } else {
                // The create's reply was lost and it never happened.
                m.sent = false;
            }
            return Ok(Err(Look::Again));
        };
        let first = (*first).clone();
        // A create repeated after a lost reply: only the first is ours.
        for extra in ours.iter().skip(1) {
            let _ = delete(c, &self.nodes, extra);
        }
        if ours.len() > 1 {
            return Ok(Err(Look::Again));
        }
        self.mine.as_mut().expect("made before").node = Some(first.node.clone());
        Ok(Ok(first))
    }

    /// Our node as read may no longer be our request's: on another
    /// session (refused), or revoked by `release --force` as it came to
    /// the front (queue again). Some: what this look comes to.
    fn not_ours_any_more(&mut self, c: &Client, first: &Entry) -> Result<Option<Look>, Failed> {
        if first.owner != c.session_id() {
            return Err(Failed::Final(Error::Refused(format!(
                "our node in {}'s queue is on another session: remove it",
                self.req.name
            ))));
        }
        if !first.record.revoked {
            return Ok(None);
        }
        log::info(format!(
            "our place in {}'s queue was revoked; queueing again",
            self.req.name
        ));
        self.leave();
        Ok(Some(Look::Again))
    }

    /// Our turn: confirmed through the leader (and a `--limit` slot
    /// claimed), the lease.
    fn granted(
        &mut self,
        c: &Client,
        name: &Name,
        mut entry: Entry,
        slot: Option<u32>,
        created_at: Option<Boot>,
    ) -> Result<Look, Failed> {
        let (req, ttl) = (self.req, self.req.timing.ttl);
        let Some(sent) = self.confirmed(c, &mut entry, created_at)? else {
            return Ok(Look::Again);
        };
        // Our session may have reconnected since it was made, to a
        // server that grants less: as a fresh run, refused.
        if let Some(e) = too_short(&self.zk.url, c, ttl) {
            return Err(Failed::Final(e));
        }
        if let Mode::Limit(n) = req.mode
            && entry.slot.is_none()
        {
            let kept: Vec<u32> = name.windows.iter().filter_map(|w| w.record.slot).collect();
            match claim(c, &self.nodes, &entry.node, slot.unwrap_or(0), n, &kept)
                .map_err(call_failed("claiming a slot"))?
            {
                Some(s) => entry.slot = Some(s),
                // Every slot taken: a holder leaving at this moment.
                None => return Ok(Look::Later),
            }
        }
        let token = entry.czxid;
        let slot = entry.slot.filter(|_| matches!(req.mode, Mode::Limit(_)));
        let held = ZkHeld {
            client: c.clone(),
            nodes: Nodes::new(&self.zk.root, req.name),
            entry,
            ttl,
            name: req.name.to_string(),
            granted_by: Boot::now(),
            min_hold: req.min_hold,
        };
        let lease = Lease::new(token, slot, sent, ttl, Box::new(held));
        Ok(Look::Done(Acquired::Granted(lease)))
    }

    /// Judged on a read, which a follower may serve while the leader is
    /// away: confirm through the leader that our session is alive and our
    /// node as read. When the grant counts from; None: look again.
    fn confirmed(
        &self,
        c: &Client,
        entry: &mut Entry,
        created_at: Option<Boot>,
    ) -> Result<Option<Boot>, Failed> {
        let at = Boot::now();
        let path = self.nodes.child(&entry.node);
        let done = match created_at {
            // A --supersede request may be marked replaced by a later one
            // that read it as waiting: the grant writes its node (at the
            // version read), so a mark made on an older read fails, and a
            // mark that came first fails the grant. A replaced node is
            // never a holder.
            _ if self.req.group.supersede => {
                confirm(c, &path, entry).map(|version| entry.version = version)
            }
            Some(created) => return Ok(Some(created)),
            None => check(c, &path, entry.version),
        };
        match done {
            Ok(()) => Ok(Some(at)),
            Err(CallError::Zk(zk::Error::BadVersion | zk::Error::NoNode)) => Ok(None),
            Err(e) => Err(Failed::Call(e, "confirming our turn".into())),
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
    fn join(&mut self, c: &Client, name: &Name, me: usize) -> Result<Option<Look>, Failed> {
        let queue = &name.queue;
        let held = name.queue_held().min(me);
        // The windows, then the holders in the queue.
        let mut holders: Vec<Standing> = name.windows.iter().map(|w| w.standing()).collect();
        holders.extend(queue[..held].iter().map(Entry::standing));
        let ahead: Vec<Standing> = queue[held..me].iter().map(Entry::standing).collect();
        let plan = plan::join(self.req.group, &holders, &ahead);
        if let Some(waiting) = plan.full {
            self.leave();
            return Ok(Some(Look::Done(Acquired::QueueFull { waiting })));
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
        Ok(again.then_some(Look::Again))
    }

    /// Block until a watched node goes (or ours is marked replaced), a
    /// window in our way ends, it is time to look again anyway, or `until`.
    fn wait_turn(&mut self, b: &mut Blocked, until: Option<Boot>) -> Result<Woke, Failed> {
        if b.watching.is_none() {
            match self.watch(b)? {
                Some(w) => b.watching = Some(w),
                None => return Ok(Woke::Look),
            }
        }
        let w = b.watching.as_ref().expect("set above");
        let mut at = w.opened.add(LOOK_AGAIN);
        if let Some(wake) = w.wake {
            at = at.min(wake);
        }
        if Boot::now() >= at {
            return Ok(Woke::Look);
        }
        let deadline = until.map_or(at, |u| u.min(at));
        let left = deadline.since(Boot::now()).max(Duration::from_millis(1));
        match w.news.recv_timeout(left) {
            Ok(()) => {
                self.woken = true;
                Ok(Woke::Look)
            }
            Err(RecvTimeoutError::Disconnected) => Ok(Woke::Look),
            Err(RecvTimeoutError::Timeout) if Boot::now() >= at => Ok(Woke::Look),
            Err(RecvTimeoutError::Timeout) => Ok(Woke::Due),
        }
    }
}
