//! Taking a name on etcd: create our key in the queue (on a lease of the
//! full ttl, so an uncontended grant is two calls), judge the queue, and
//! while blocked sit on a short lease and watch the keys whose going could
//! let us in. The give-up clock, the waiting line and the retry budget are
//! the driver's (`backend::drive`); the promotion when our turn comes is
//! `promote.rs`'s.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use serde_json::json;

use super::client::Client;
use super::client::b64;
use super::queue::{Entry, Keys, Mark, Record, Verdict, entries, holders, judge, replaced_by};
use super::{Etcd, EtcdHeld, grant, holds, keepalive, revoke, succeeded, txn, wall_ms};
use crate::backend::drive::{Step, Take, drive};
use crate::backend::plan::{self, Stop};
use crate::backend::quit::Leave;
use crate::backend::wait::{Patience, Retry};
use crate::backend::{Acquired, Error, Lease, Request, Wait};
use crate::clock::Boot;
use crate::log;

/// A watch gives up on its own after this (the waiter then looks again and
/// watches anew): no watch outlives its waiter by long, and a stream that
/// died silently costs at most this.
const WATCH_LIFE: Duration = Duration::from_secs(30);

/// Compares a `--limit` promotion makes one per other holder up to this
/// (etcd allows 128 operations in a transaction by default).
pub(super) const MAX_COMPARES: usize = 100;

/// A waiter's key lives on a lease as long as a place lasts
/// (`plan::place_lasts`), in whole seconds and at least etcd's smallest, so
/// one killed in the queue holds up the others by no more than that.
fn waiter_ttl(ttl: Duration) -> Duration {
    let lasts = plan::place_lasts(ttl).as_secs();
    Duration::from_secs(lasts.max(super::ENGINE.ttl_min.as_secs()))
}

/// The compare "`e`'s key is as it was read".
fn unchanged(e: &Entry) -> serde_json::Value {
    json!({"key": b64(&e.key), "target": "MOD", "result": "EQUAL", "mod_revision": e.mod_rev.to_string()})
}

/// Our request in the queue.
pub(super) struct Mine {
    pub(super) key: String,
    /// The key's create revision, once read.
    pub(super) create_rev: u64,
    pub(super) lease: i64,
    pub(super) lease_ttl: Duration,
    /// When the request that started (or last renewed) the lease was sent.
    pub(super) lease_sent: Boot,
    /// On the short waiter lease rather than a full one.
    pub(super) waiting: bool,
    /// Our record exactly as stored.
    pub(super) value: String,
    /// The create transaction went through (a retry finds the key there).
    pub(super) created: bool,
    pub(super) next_keepalive: Boot,
    /// While waiting, the full lease the key was created on, kept alive
    /// with nothing on it: the key moves back onto it when our turn comes,
    /// with no new lease to grant at hand-off.
    pub(super) spare: Option<Spare>,
    /// A promotion sent whose reply may have been lost.
    pub(super) promoting: Option<Promotion>,
    /// A move onto a waiter lease sent whose reply may have been lost: the
    /// next look tells from the lease our key is on whether it went through.
    pub(super) moving: Option<Spare>,
    /// Watches in a row that ended without an event soon after they opened.
    pub(super) watch_failures: u32,
}

#[derive(Clone, Copy)]
pub(super) struct Spare {
    pub(super) lease: i64,
    pub(super) ttl: Duration,
    /// When its last keepalive (or its grant) was sent.
    pub(super) sent: Boot,
    pub(super) next_keepalive: Boot,
}

/// What our key becomes when our turn comes.
pub(super) struct Promotion {
    pub(super) value: String,
    pub(super) lease: i64,
    pub(super) lease_ttl: Duration,
    pub(super) lease_sent: Boot,
    pub(super) slot: Option<u32>,
}

impl Mine {
    /// Our key is now on the waiter lease `w`; the full lease, with nothing
    /// on it any more, waits (kept alive) for our turn.
    pub(super) fn onto_waiter(&mut self, w: Spare) {
        self.spare = Some(Spare {
            lease: self.lease,
            ttl: self.lease_ttl,
            sent: self.lease_sent,
            next_keepalive: self.lease_sent.add(self.lease_ttl / 3),
        });
        self.lease = w.lease;
        self.lease_ttl = w.ttl;
        self.lease_sent = w.sent;
        self.waiting = true;
        self.next_keepalive = w.next_keepalive;
    }

    pub(super) fn promoted(&mut self, p: Promotion) {
        // A waiter lease left behind has nothing on it and lapses on its own.
        self.value = p.value;
        self.lease = p.lease;
        self.lease_ttl = p.lease_ttl;
        self.lease_sent = p.lease_sent;
        self.waiting = false;
        self.spare = None;
    }
}

/// One request for a name on etcd, as the driver steps it.
struct Taking<'a> {
    etcd: &'a mut Etcd,
    req: &'a Request<'a>,
    keys: Keys,
    mine: Option<Mine>,
    holder: Option<String>,
    /// The concurrency group words were applied (once, as the request
    /// first found itself waiting): a request queued is never judged again.
    joined: bool,
}

impl Take for Taking<'_> {
    type Transport = Client;

    fn step(&mut self, patience: &mut Patience, _: &mut Retry) -> Result<Step, Error> {
        let Taking {
            etcd,
            req,
            keys,
            mine,
            holder,
            joined,
        } = self;
        etcd.step(req, keys, mine, patience, holder, joined)
    }

    fn leave(&mut self) {
        self.etcd.leave(&mut self.mine);
    }

    fn way_out(&self) -> Option<Leave> {
        Some(super::leave::way_out(
            &self.etcd.client,
            &self.keys,
            &self.req.owner.secret,
        ))
    }

    fn transport(&self) -> &Client {
        &self.etcd.client
    }
}

impl Etcd {
    pub(super) fn take(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        let mut taking = Taking {
            keys: Keys::new(&self.prefix, req.name),
            etcd: self,
            req,
            mine: None,
            holder: None,
            joined: false,
        };
        drive(&mut taking, req, wait)
    }

    /// Give up our place (and any grant): the lease goes, and our key with it.
    fn leave(&mut self, mine: &mut Option<Mine>) {
        if let Some(m) = mine.take() {
            let _ = revoke(&mut self.client, m.lease);
            for sp in [m.spare, m.moving].into_iter().flatten() {
                let _ = revoke(&mut self.client, sp.lease);
            }
        }
    }

    fn step(
        &mut self,
        req: &Request,
        keys: &Keys,
        mine: &mut Option<Mine>,
        patience: &mut Patience,
        holder: &mut Option<String>,
        joined: &mut bool,
    ) -> Result<Step, Error> {
        if mine.is_none() {
            let sent = Boot::now();
            let (lease, ttl) = grant(&mut self.client, req.timing.ttl)?;
            let record = Record {
                granted_ms: wall_ms(),
                ..Record::new(req)
            };
            *mine = Some(Mine {
                key: keys.entry(lease),
                create_rev: 0,
                lease,
                lease_ttl: ttl,
                lease_sent: sent,
                waiting: false,
                value: record.encode(),
                created: false,
                next_keepalive: sent.add(ttl / 3),
                spare: None,
                promoting: None,
                moving: None,
                watch_failures: 0,
            });
        }
        let m = mine.as_mut().expect("set above");
        // Only a look that is our own create's reply may grant with no
        // transaction of ours after it (`promote`).
        let mut created_now = false;
        let (v, at) = if m.created {
            // Served by the member we talk to, without a round of the
            // cluster: a stale read can only show keys ahead of ours that
            // are gone since (keys never appear ahead of an existing one),
            // so a grant it shows is a grant; every change is then made by
            // a transaction that checks what it relies on.
            let mut range = keys.range();
            range["serializable"] = json!(true);
            (self.client.call("/v3/kv/range", &range)?, None)
        } else {
            // Created only if absent: a retry after a lost reply finds it.
            let absent = json!({"key": b64(&m.key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"});
            let put = json!({"request_put": {"key": b64(&m.key), "value": b64(&m.value), "lease": m.lease.to_string()}});
            let range = json!({ "request_range": keys.range() });
            let v = txn(
                &mut self.client,
                vec![absent],
                vec![put, range.clone()],
                vec![range],
            )?;
            m.created = true;
            created_now = succeeded(&v);
            let at = if created_now { 1 } else { 0 };
            (v, Some(at))
        };
        let range = match at {
            Some(at) => &v["responses"][at]["response_range"],
            None => &v,
        };
        let (queue, revision) = entries(keys, range, &v["header"])?;
        let Some(me) = queue.iter().position(|e| e.key == m.key) else {
            if let Some(by) = replaced_by(keys, range, &m.key) {
                // A newer --supersede request took our place: the mark it
                // left is on our lease, and goes with it.
                self.leave(mine);
                return Ok(Step::Done(Acquired::Replaced { by }));
            }
            // Our key went with its lease (lockrun or etcd paused past it):
            // queue again, at the back.
            log::info(format!(
                "our place in {}'s queue lapsed; queueing again",
                req.name
            ));
            self.leave(mine);
            return Ok(Step::Again);
        };
        if let Some(w) = m.moving.take() {
            if queue[me].lease == w.lease {
                // The move went through; only its reply was lost.
                m.onto_waiter(w);
            } else if let Err(e) = revoke(&mut self.client, w.lease) {
                m.moving = Some(w);
                return Err(e);
            }
            // Else it never reaches our key now: a move landing late finds
            // its lease gone and fails.
        }
        if let Some(p) = m.promoting.take() {
            if queue[me].value == p.value && queue[me].lease == p.lease {
                // The promotion went through; only its reply was lost.
                let slot = p.slot;
                m.promoted(p);
                // Its write is the key's last: its revision is the token.
                let token = queue[me].mod_rev;
                return Ok(Step::Done(self.granted(m, req, slot, token)));
            }
            if p.lease != m.lease && m.spare.is_none_or(|sp| sp.lease != p.lease) {
                let _ = revoke(&mut self.client, p.lease);
            }
        }
        if queue[me].value != m.value {
            // Revoked by `release --force` as it came to the front: not ours;
            // the revoked key ends with its lease. Queue again.
            log::info(format!(
                "our place in {}'s queue was revoked; queueing again",
                req.name
            ));
            if let Some(sp) = m.spare {
                let _ = revoke(&mut self.client, sp.lease);
            }
            *mine = None;
            return Ok(Step::Again);
        }
        if queue[me].lease != m.lease {
            // Our key is not on the lease we keep alive (a write of ours
            // landed after we had given up on it): it would lapse under a
            // holder. Take it out of the queue and queue again.
            log::info(format!(
                "our place in {}'s queue is on a lease we do not keep; queueing again",
                req.name
            ));
            let delete = json!({"request_delete_range": {"key": b64(&m.key)}});
            txn(
                &mut self.client,
                vec![holds(&m.key, &m.value)],
                vec![delete],
                vec![],
            )?;
            self.leave(mine);
            return Ok(Step::Again);
        }
        m.create_rev = queue[me].created;
        match judge(&queue, me, req) {
            Verdict::Nested => Err(crate::backend::nested(req.name)),
            Verdict::Disagrees(in_force) => Err(req.mode.disagreement(req.name, in_force)),
            Verdict::Granted => self.promote(req, keys, mine, &queue, revision, created_now),
            Verdict::Blocked { watch, holder: h } => {
                *holder = h.or(holder.take());
                if !*joined {
                    if let Some(step) = self.join(req, mine, &queue, me)? {
                        return Ok(step);
                    }
                    *joined = true;
                }
                let m = mine.as_mut().expect("in the queue");
                if patience.over() {
                    self.leave(mine);
                    return Ok(Step::Done(Acquired::Busy {
                        holder: holder.clone(),
                    }));
                }
                if !m.waiting && !self.onto_waiter_lease(m, req)? {
                    return Ok(Step::Again);
                }
                patience.tick(holder.as_deref());
                self.wait_turn(req, keys, mine, &watch, revision, patience, holder)
            }
        }
    }

    /// The first time our request finds itself waiting, it carries out
    /// its join plan (`plan::join`): a full queue (`--max-waiters`, by
    /// create revision) and ours leaves; else `--preempt` marks the holders
    /// and `--supersede` takes the places of the earlier waiters that asked
    /// for it too. Some(step): the request ends here, or looks again
    /// (something changed under a transaction); None: it waits.
    fn join(
        &mut self,
        req: &Request,
        mine: &mut Option<Mine>,
        queue: &[Entry],
        me: usize,
    ) -> Result<Option<Step>, Error> {
        let held = holders(queue).min(me);
        let m = mine.as_ref().expect("in the queue");
        let standing = |es: &[Entry]| es.iter().map(Entry::standing).collect::<Vec<_>>();
        let plan = plan::join(
            req.group,
            &standing(&queue[..held]),
            &standing(&queue[held..me]),
        );
        if let Some(waiting) = plan.full {
            // Gone before we answer: a revoke that fails is retried,
            // our key counted by the others until it goes.
            revoke(&mut self.client, m.lease)?;
            self.leave(mine);
            return Ok(Some(Step::Done(Acquired::QueueFull { waiting })));
        }
        let mut again = false;
        for (i, stop) in plan.preempt {
            again |= !self.preempt(req, &queue[i], stop)?;
        }
        for i in plan.replace {
            again |= !self.replace(req, &queue[held + i])?;
        }
        // Something we judged changed (a holder went, a waiter moved onto
        // its waiter lease): look again, and judge again.
        Ok(again.then_some(Step::Again))
    }

    /// Ask holder `e` to stop, or end it if it is a `--min-hold` window.
    /// Ok(false): it changed since it was read.
    fn preempt(&mut self, req: &Request, e: &Entry, stop: Stop) -> Result<bool, Error> {
        let change = match stop {
            // A --min-hold window runs no job: it ends at once, as
            // `release --force` ends it.
            Stop::End => json!({"request_delete_range": {"key": b64(&e.key)}}),
            // Beside the holder's key, on the holder's lease: it cannot
            // outlive the lease it speaks of.
            Stop::Mark => {
                let mark = Keys::mark(&e.key, Mark::Preempted);
                json!({"request_put": {"key": b64(mark), "value": b64(Mark::encode(&req.owner.shown)), "lease": e.lease.to_string()}})
            }
        };
        match txn(&mut self.client, vec![unchanged(e)], vec![change], vec![]) {
            Ok(v) if succeeded(&v) => {}
            Ok(_) => return Ok(false),
            Err(Error::Refused(m)) if m.contains("lease not found") => return Ok(false),
            Err(err) => return Err(err),
        }
        if stop == Stop::End {
            let _ = revoke(&mut self.client, e.lease);
            log::info(format!(
                "ended {} (--preempt)",
                crate::text::printable(&e.record.shown())
            ));
        } else {
            log::info(format!(
                "asked the holder {} to stop (--preempt)",
                crate::text::printable(&e.record.label)
            ));
        }
        Ok(true)
    }

    /// Take waiter `e` out of the queue, with a mark in its place on its
    /// own lease, naming us: it wakes (it watches its own key), finds the
    /// mark and gives up; the mark goes with it. Ok(false): it changed
    /// since it was read.
    fn replace(&mut self, req: &Request, e: &Entry) -> Result<bool, Error> {
        let mark = Keys::mark(&e.key, Mark::Replaced);
        let ops = vec![
            json!({"request_delete_range": {"key": b64(&e.key)}}),
            json!({"request_put": {"key": b64(mark), "value": b64(Mark::encode(&req.owner.shown)), "lease": e.lease.to_string()}}),
        ];
        match txn(&mut self.client, vec![unchanged(e)], ops, vec![]) {
            Ok(v) if succeeded(&v) => {
                log::info(format!(
                    "took the place of the waiting request of {} (--supersede)",
                    crate::text::printable(&e.record.label)
                ));
                Ok(true)
            }
            Ok(_) => Ok(false),
            Err(Error::Refused(m)) if m.contains("lease not found") => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Move our key to a lease of a third of the ttl while it waits.
    /// Ok(false): the key changed meanwhile; look again.
    fn onto_waiter_lease(&mut self, m: &mut Mine, req: &Request) -> Result<bool, Error> {
        let sent = Boot::now();
        let (lease, ttl) = grant(&mut self.client, waiter_ttl(req.timing.ttl))?;
        let put = json!({"request_put": {"key": b64(&m.key), "value": b64(&m.value), "lease": lease.to_string()}});
        // Remembered before it is sent: if the reply is lost, the key may
        // be on this lease, and only the next look can tell.
        m.moving = Some(Spare {
            lease,
            ttl,
            sent,
            next_keepalive: sent.add(ttl / 3),
        });
        let v = txn(
            &mut self.client,
            vec![holds(&m.key, &m.value)],
            vec![put],
            vec![],
        )?;
        let w = m.moving.take().expect("set above");
        if !succeeded(&v) {
            let _ = revoke(&mut self.client, lease);
            return Ok(false);
        }
        m.onto_waiter(w);
        Ok(true)
    }

    pub(super) fn granted(
        &mut self,
        m: &Mine,
        req: &Request,
        slot: Option<u32>,
        token: u64,
    ) -> Acquired {
        let held = EtcdHeld {
            client: self.client.hand_over(),
            key: m.key.clone(),
            lease: m.lease,
            value: m.value.clone(),
            name: req.name.to_string(),
            token,
            // The grant's reply is in: the server granted no later than now.
            granted_by: Boot::now(),
            min_hold: req.min_hold,
        };
        Acquired::Granted(Lease::new(
            token,
            slot,
            m.lease_sent,
            m.lease_ttl,
            Box::new(held),
        ))
    }

    /// Block until a watched key goes, keeping our waiter lease alive,
    /// printing the waiting line and giving up when the wait says so.
    #[allow(clippy::too_many_arguments)]
    fn wait_turn(
        &mut self,
        req: &Request,
        keys: &Keys,
        mine: &mut Option<Mine>,
        watch: &[String],
        revision: u64,
        patience: &mut Patience,
        holder: &mut Option<String>,
    ) -> Result<Step, Error> {
        // Only deletions matter, from just after the queue was read: one
        // that happened since is not missed.
        // A --supersede waiter watches its own key too: a newer one that
        // takes its place deletes it, and it gives up at once.
        let own = mine
            .as_ref()
            .filter(|_| req.group.supersede)
            .map(|m| m.key.clone());
        let creates: String = watch
            .iter()
            .chain(own.iter())
            .map(|k| {
                json!({"create_request": {
                    "key": b64(k),
                    "start_revision": (revision + 1).to_string(),
                    "filters": ["NOPUT"],
                }})
                .to_string()
            })
            .collect();
        let opened = Boot::now();
        let mut woken = Some(self.client.watch(creates, WATCH_LIFE));
        // Once the watch failed: when to look again, our leases kept alive
        // until then.
        let mut look_at: Option<Boot> = None;
        loop {
            let m = mine.as_mut().expect("in the queue");
            let mut due = m.spare.map_or(m.next_keepalive, |sp| {
                sp.next_keepalive.min(m.next_keepalive)
            });
            if let Some(at) = look_at {
                if Boot::now() >= at {
                    return Ok(Step::Again);
                }
                due = due.min(at);
            }
            let timeout = patience
                .cap(due.since(Boot::now()))
                .max(Duration::from_millis(1));
            let ended = match &woken {
                Some(rx) => match rx.recv_timeout(timeout) {
                    Ok(Ok(true)) => {
                        m.watch_failures = 0;
                        return self.first_in_line(req, keys, mine);
                    }
                    // A watch that lived out its life: open the next at once.
                    Ok(Ok(false)) if Boot::now().since(opened) >= WATCH_LIFE / 2 => {
                        m.watch_failures = 0;
                        return Ok(Step::Again);
                    }
                    Ok(Err(e)) if !e.is_transient() => return Err(e),
                    Ok(Err(e)) => {
                        log::info(format!("waiting failed: {e}; retrying"));
                        true
                    }
                    Ok(Ok(false)) | Err(RecvTimeoutError::Disconnected) => true,
                    Err(RecvTimeoutError::Timeout) => false,
                },
                None => {
                    std::thread::sleep(timeout);
                    false
                }
            };
            if ended {
                // A stream that breaks or ends at once (a proxy that does
                // not pass streaming, a member going away) says nothing of
                // the queue: look again after a pause that grows each time
                // in a row, and keep our leases alive meanwhile, so our
                // place does not lapse while the watch cannot be had.
                woken = None;
                m.watch_failures += 1;
                look_at = Some(Boot::now().add(crate::clock::backoff(
                    m.watch_failures,
                    Duration::from_millis(50),
                    Duration::from_secs(1),
                )));
                continue;
            }
            if patience.over() {
                self.leave(mine);
                return Ok(Step::Done(Acquired::Busy {
                    holder: holder.clone(),
                }));
            }
            patience.tick(holder.as_deref());
            if Boot::now() >= m.next_keepalive {
                let sent = Boot::now();
                match keepalive(&mut self.client, m.lease)? {
                    Some(ttl) => m.next_keepalive = sent.add(ttl / 3),
                    // Gone: the next look finds our key missing and queues again.
                    None => return Ok(Step::Again),
                }
            }
            if let Some(sp) = m.spare.as_mut()
                && Boot::now() >= sp.next_keepalive
            {
                let sent = Boot::now();
                match keepalive(&mut self.client, sp.lease)? {
                    Some(ttl) => {
                        sp.sent = sent;
                        sp.ttl = ttl;
                        sp.next_keepalive = sent.add(ttl / 3);
                    }
                    // Lapsed: our turn will grant a new one.
                    None => m.spare = None,
                }
            }
        }
    }
}
