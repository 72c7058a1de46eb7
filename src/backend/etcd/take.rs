//! Taking a name on etcd: create our key in the queue (on a lease of the
//! full ttl, so an uncontended grant is two calls), judge the queue, and
//! while blocked sit on a short lease and watch the keys whose going could
//! let us in. The give-up clock, the waiting line, the retry budget and
//! every pause between tries are the driver's (`backend::drive`); the wait
//! is `take/wait.rs`'s, the promotion when our turn comes `promote.rs`'s.

use std::time::Duration;

use serde_json::{Value, json};

use super::client::b64;
use super::queue::{Entry, Keys, Mark, Record, Verdict, entries, holders, judge, replaced_by};
use super::{Etcd, EtcdHeld, grant, holds, revoke, succeeded, txn, wall_ms};
use crate::backend::drive::{Look, Remote, Take, Woke, drive};
use crate::backend::plan::{self, Stop};
use crate::backend::quit::Leave;
use crate::backend::{Acquired, Error, Lease, Request, Wait};
use crate::clock::Boot;
use crate::log;

mod wait;

use wait::Blocked;

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
    /// What the last look found in our way, and the watch on it once open.
    blocked: Option<Blocked>,
    /// A watched key went: the next look first tries the hand-off write.
    woken: bool,
}

impl Take for Taking<'_> {
    fn look(&mut self, _last: bool, _until: Option<Boot>) -> Result<Look, Error> {
        self.blocked = None;
        if std::mem::take(&mut self.woken) {
            match self
                .etcd
                .first_in_line(self.req, &self.keys, &mut self.mine)?
            {
                Look::Again => {}
                done => return Ok(done),
            }
        }
        let Taking {
            etcd,
            req,
            keys,
            mine,
            holder,
            joined,
            blocked,
            ..
        } = self;
        etcd.look(req, keys, mine, holder, joined, blocked)
    }

    fn wait(&mut self, until: Option<Boot>) -> Result<Woke, Error> {
        let Taking {
            etcd,
            req,
            mine,
            blocked,
            woken,
            ..
        } = self;
        let Some(b) = blocked.as_mut() else {
            return Ok(Woke::Look);
        };
        let woke = etcd.wait_turn(req, mine, b, until)?;
        *woken = b.event;
        if !matches!(woke, Woke::Due) {
            *blocked = None;
        }
        Ok(woke)
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

    fn remote(&self) -> Option<&Remote> {
        Some(&self.etcd.client.remote)
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
            blocked: None,
            woken: false,
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

    /// One look: our key made (once), the queue read, and judged.
    fn look(
        &mut self,
        req: &Request,
        keys: &Keys,
        mine: &mut Option<Mine>,
        holder: &mut Option<String>,
        joined: &mut bool,
        blocked: &mut Option<Blocked>,
    ) -> Result<Look, Error> {
        if mine.is_none() {
            *mine = Some(self.new_mine(req, keys)?);
        }
        let m = mine.as_mut().expect("set above");
        let (v, at, created_now) = self.read(keys, m)?;
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
                return Ok(Look::Done(Acquired::Replaced { by }));
            }
            // Our key went with its lease (lockrun or etcd paused past it):
            // queue again, at the back.
            log::info(format!(
                "our place in {}'s queue lapsed; queueing again",
                req.name
            ));
            self.leave(mine);
            return Ok(Look::Again);
        };
        if let Some(look) = self.settle(req, mine, &queue[me])? {
            return Ok(look);
        }
        let m = mine.as_mut().expect("in the queue");
        m.create_rev = queue[me].created;
        match judge(&queue, me, req) {
            Verdict::Nested => Err(crate::backend::nested(req.name)),
            Verdict::Disagrees(in_force) => Err(req.mode.disagreement(req.name, in_force)),
            Verdict::Granted => self.promote(req, keys, mine, &queue, revision, created_now),
            Verdict::Blocked { watch, holder: h } => {
                *holder = h.or(holder.take());
                if !*joined {
                    if let Some(look) = self.join(req, mine, &queue, me)? {
                        return Ok(look);
                    }
                    *joined = true;
                }
                *blocked = Some(Blocked {
                    watch,
                    revision,
                    watching: None,
                    event: false,
                });
                Ok(Look::Blocked(holder.clone()))
            }
        }
    }

    /// A request of ours, on a lease of the full ttl (not yet in the queue).
    fn new_mine(&mut self, req: &Request, keys: &Keys) -> Result<Mine, Error> {
        let sent = Boot::now();
        let (lease, ttl) = grant(&mut self.client, req.timing.ttl)?;
        let record = Record {
            granted_ms: wall_ms(),
            ..Record::new(req)
        };
        Ok(Mine {
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
        })
    }

    /// Read the queue, creating our key first if it is not there yet: the
    /// reply, where its range is in it, and whether our create made the key
    /// (only a look that is our own create's reply may grant with no
    /// transaction of ours after it, `promote`).
    fn read(&mut self, keys: &Keys, m: &mut Mine) -> Result<(Value, Option<usize>, bool), Error> {
        if m.created {
            // Served by the member we talk to, without a round of the
            // cluster: a stale read can only show keys ahead of ours that
            // are gone since (keys never appear ahead of an existing one),
            // so a grant it shows is a grant; every change is then made by
            // a transaction that checks what it relies on.
            let mut range = keys.range();
            range["serializable"] = json!(true);
            return Ok((self.client.call("/v3/kv/range", &range)?, None, false));
        }
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
        let created_now = succeeded(&v);
        let at = if created_now { 1 } else { 0 };
        Ok((v, Some(at), created_now))
    }

    /// Our key as read (`e`), after writes of ours whose replies were lost:
    /// a move onto a waiter lease, a promotion (then granted), a key that
    /// is no longer our request's (queue again). Some: what the look
    /// comes to.
    fn settle(
        &mut self,
        req: &Request,
        mine: &mut Option<Mine>,
        e: &Entry,
    ) -> Result<Option<Look>, Error> {
        let m = mine.as_mut().expect("in the queue");
        if let Some(w) = m.moving.take() {
            if e.lease == w.lease {
                // The move went through; only its reply was lost.
                m.onto_waiter(w);
            } else if let Err(err) = revoke(&mut self.client, w.lease) {
                m.moving = Some(w);
                return Err(err);
            }
            // Else it never reaches our key now: a move landing late finds
            // its lease gone and fails.
        }
        if let Some(p) = m.promoting.take() {
            if e.value == p.value && e.lease == p.lease {
                // The promotion went through; only its reply was lost.
                let slot = p.slot;
                m.promoted(p);
                // Its write is the key's last: its revision is the token.
                return Ok(Some(Look::Done(self.granted(m, req, slot, e.mod_rev))));
            }
            if p.lease != m.lease && m.spare.is_none_or(|sp| sp.lease != p.lease) {
                let _ = revoke(&mut self.client, p.lease);
            }
        }
        if e.value != m.value {
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
            return Ok(Some(Look::Again));
        }
        if e.lease != m.lease {
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
            return Ok(Some(Look::Again));
        }
        Ok(None)
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
    ) -> Result<Option<Look>, Error> {
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
            return Ok(Some(Look::Done(Acquired::QueueFull { waiting })));
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
        Ok(again.then_some(Look::Again))
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
}
