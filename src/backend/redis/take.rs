//! Taking a name on Redis: one try of the acquire script, and between tries
//! a blocking pop on our own wake-up list, which a release serving the queue
//! pushes to. The give-up clock, the waiting line, the retry budget and
//! every pause between tries are the driver's (`backend::drive`).

use std::time::Duration;

use redis::Value;

use super::Redis;
use super::lease::RedisHeld;
use super::link::Link;
use super::reply::Acquire;
use super::scripts::{ACQUIRE_SCRIPT, Keys, RELEASE_SCRIPT};
use crate::backend::drive::{Look, Remote, Take, Woke, drive};
use crate::backend::plan;
use crate::backend::quit::Leave;
use crate::backend::{Acquired, Error, Lease, Request, Wait};
use crate::clock::Boot;

/// Random hex for a waiter's place in the queue (public, unlike the owner
/// value); with `--supersede`, after an `s` that says so to the scripts.
fn waiter_id(supersede: bool) -> String {
    let mut bytes = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    let pid = std::process::id();
    let mut id = String::from(if supersede { "s" } else { "" });
    id.extend(bytes.iter().map(|b| format!("{b:02x}")));
    id.push_str(&format!("{pid:x}"));
    id
}

/// A connection this process could not open for want of descriptors
/// (`ulimit -n`) is no outage to wait out: lockrun's own descriptors do not
/// come back while it waits, and a request whose looks alternate with such
/// failures would never end. It ends the request as a system failure (70).
fn out_of_descriptors(e: Error) -> Error {
    match e {
        Error::Transient(m) if m.contains("(os error 24)") || m.contains("(os error 23)") => {
            Error::Internal(format!(
                "{m}: lockrun is out of file descriptors (ulimit -n)"
            ))
        }
        e => e,
    }
}

/// Give up a lease or a place in the queue (and a grant handed over
/// meanwhile, which goes to the next). Ok(false): none was ours.
pub fn leave(link: &mut Link, keys: &Keys, owner: &str, id: &str) -> Result<bool, Error> {
    release(link, keys, owner, id, None)
}

/// Give up a lease as `leave` does; with `min_hold`, a lease still within
/// that long of its grant (on the server's clock) stays held, by no one,
/// until then.
pub fn release(
    link: &mut Link,
    keys: &Keys,
    owner: &str,
    id: &str,
    min_hold: Option<Duration>,
) -> Result<bool, Error> {
    let script = &*RELEASE_SCRIPT;
    // Whole milliseconds, rounded up: the window is never shorter than asked.
    let hold = min_hold.map_or(0, |d| {
        u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
    });
    link.call(|c| {
        keys.on(script)
            .arg(owner)
            .arg(id)
            .arg(hold)
            .invoke::<i64>(c)
    })
    .map(|n| n == 1)
}

/// Block on our wake-up list for at most `timeout`.
/// Some(true): woken by a grant; Some(false): by a refusal; None: timed out.
fn wait_for_wakeup(link: &mut Link, key: &str, timeout: Duration) -> Result<Option<bool>, Error> {
    let op = link.op;
    let mut cut = false;
    let woken = link.call(|c| {
        if c.is_cluster() {
            // A cluster connection retries a read that timed out: the
            // server's own timeout ends the wait (up to 1/hz late).
            c.set_read_timeout(Some(timeout + op))?;
            let popped: Option<(String, String)> = redis::cmd("BLPOP")
                .arg(key)
                .arg(format!("{:.3}", timeout.as_secs_f64()))
                .query(c)?;
            c.set_read_timeout(Some(op))?;
            return Ok(popped.map(|(_, v)| v != "refused"));
        }
        // Redis ends a BLPOP's timeout only when it next looks at its
        // blocked clients, up to 1/hz (100 ms) late: `--wait`, a place
        // in the queue and a holder's end must not wait for that. Our
        // read timeout ends the wait at its time; the server's, later,
        // only cleans up after us.
        c.set_read_timeout(Some(timeout))?;
        let popped: Option<(String, String)> = match redis::cmd("BLPOP")
            .arg(key)
            .arg(format!("{:.3}", (timeout + op).as_secs_f64()))
            .query(c)
        {
            Ok(p) => p,
            Err(e) if e.is_timeout() => {
                cut = true;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        c.set_read_timeout(Some(op))?;
        Ok(popped.map(|(_, v)| v != "refused"))
    });
    if cut {
        // The BLPOP still stands on the server: a new connection for
        // the next call. A wake-up it takes from our list is not lost
        // news: the grant or refusal is in the queue's state, which
        // the next call reads.
        link.conn = None;
    }
    woken
}

impl Redis {
    /// Whether a grant just made counts: behind sentinels, it was made on
    /// the master a majority names now; with `--replicas`, enough replicas
    /// have it. The flag with an error: the master may be elsewhere now.
    fn confirm_grant(&mut self) -> Result<(), (Error, bool)> {
        match self.link.on_master() {
            Ok(true) => {}
            Ok(false) => {
                let moved = "the grant came from a master the sentinels no longer name";
                return Err((Error::Transient(moved.into()), true));
            }
            Err(e) => return Err((e, true)),
        }
        if self.replicas > 0 {
            self.link
                .acknowledged(self.replicas, "grant")
                .map_err(|e| (e, false))?;
        }
        Ok(())
    }

    pub(super) fn take(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        let keys = Keys::new(&self.prefix, req.name);
        let id = waiter_id(req.group.supersede);
        let wake_key = format!("{}{id}", keys.wake);
        // A queued waiter keeps its place as long as a place lasts, so one
        // killed in the queue is dropped from it within that; it renews its
        // place `op` (the bound on one request) before the place would lapse.
        let alive = plan::place_lasts(req.timing.ttl);
        let mut taking = Taking {
            redis: self,
            req,
            keys,
            id,
            wake_key,
            alive,
            refresh: alive.saturating_sub(req.timing.op).max(alive / 2),
            queue: if wait == Wait::No { "0" } else { "1" },
            outer: req.outer.clone().unwrap_or_default(),
            holder: None,
            holder_end: None,
            keep_only: false,
            place: None,
            placed: false,
        };
        drive(&mut taking, req, wait)
    }
}

/// One request for a name on Redis, as the driver steps it.
struct Taking<'a> {
    redis: &'a mut Redis,
    req: &'a Request<'a>,
    keys: Keys,
    /// Our place's id in the queue, and the wake-up list a grant pushes to.
    id: String,
    wake_key: String,
    /// How long a place lasts unless kept, and how often it is kept.
    alive: Duration,
    refresh: Duration,
    /// "1" when the request may queue (not `-n`).
    queue: &'static str,
    outer: String,
    holder: Option<String>,
    /// When the soonest holder's lease runs out on its own, as last heard
    /// at the head of the queue.
    holder_end: Option<Boot>,
    /// The next call only keeps our place.
    keep_only: bool,
    /// Our arrival number once queued: a place that lapsed while we lived
    /// (a server paused past ttl/3) is taken back at it.
    place: Option<i64>,
    /// The server may hold a place or a grant of ours (a call that queued
    /// us, or one whose reply was lost): leaving must give it back.
    placed: bool,
}

impl Take for Taking<'_> {
    fn look(&mut self, _last: bool, _until: Option<Boot>) -> Result<Look, Error> {
        let req = self.req;
        let script = &*ACQUIRE_SCRIPT;
        let sent_at = Boot::now();
        let (keys, id, outer) = (&self.keys, &self.id, &self.outer);
        let (alive, queue, keep_only, place) = (self.alive, self.queue, self.keep_only, self.place);
        let reply = self.redis.link.call(|c| {
            keys.on(script)
                .arg(&req.owner.secret)
                .arg(&req.owner.shown)
                .arg(req.timing.ttl.as_millis() as u64)
                .arg(req.mode.code())
                .arg(req.mode.limit())
                .arg(queue)
                .arg(id)
                .arg(alive.as_millis() as u64)
                .arg(outer)
                .arg(if keep_only { "1" } else { "0" })
                .arg(place.map(|n| n.to_string()).unwrap_or_default())
                .arg(
                    req.group
                        .max_waiters
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                )
                .arg(if req.group.supersede { "1" } else { "0" })
                .arg(if req.group.preempt { "1" } else { "0" })
                .invoke::<Vec<Value>>(c)
        });
        let reply = match reply {
            Ok(v) => match Acquire::read(&v, req.mode) {
                Ok(r) => r,
                Err(e) => return Ok(Look::Over(e)),
            },
            Err(e) => {
                // A reply may have been lost after the server granted it.
                self.placed |= e.is_transient() && self.redis.link.remote.replied;
                return Err(out_of_descriptors(e));
            }
        };
        let holder_ends_in = match reply {
            Acquire::Granted { token, slot } => {
                return self.granted(token, slot, sent_at);
            }
            Acquire::Disagrees(in_force) => {
                return Ok(Look::Over(req.mode.disagreement(req.name, in_force)));
            }
            Acquire::Nested => return Ok(Look::Over(crate::backend::nested(req.name))),
            // The script took us out of the queue and left no trace.
            Acquire::Replaced { by } => {
                self.placed = false;
                return Ok(Look::Done(Acquired::Replaced { by }));
            }
            Acquire::QueueFull { waiting } => {
                self.leave();
                return Ok(Look::Done(Acquired::QueueFull { waiting }));
            }
            Acquire::Busy { holder: h } => {
                return Ok(Look::Done(Acquired::Busy {
                    holder: h.or(self.holder.take()),
                }));
            }
            Acquire::Queued {
                holder: h,
                holder_ends_in,
                arrival,
            } => {
                self.placed = true;
                self.place = arrival.or(self.place);
                // A waiter keeping its place hears no holder: keep the last one heard.
                self.holder = h.or(self.holder.take());
                holder_ends_in
            }
        };
        if let Some(left) = holder_ends_in {
            self.holder_end = Some(sent_at.add(left + Duration::from_millis(1)));
        }
        Ok(Look::Blocked(self.holder.clone()))
    }

    /// Block until a release hands us the lease, but come back to keep our
    /// place, when a holder's lease runs out on its own, and by `until`.
    fn wait(&mut self, until: Option<Boot>) -> Result<Woke, Error> {
        let now = Boot::now();
        let mut timeout = self.refresh;
        match self.holder_end {
            Some(end) if end > now => timeout = timeout.min(end.since(now)),
            // Passed: the head looks at the holders when it comes; the
            // others do not need to.
            _ => self.holder_end = None,
        }
        let timeout = until
            .map_or(timeout, |u| timeout.min(u.since(now)))
            .max(Duration::from_millis(1));
        let woken = wait_for_wakeup(&mut self.redis.link, &self.wake_key, timeout);
        // Woken, the next call confirms the grant (with a full ttl counted
        // from its own sending) or looks again; otherwise it only keeps our
        // place (and at the head, checks the holders). A BLPOP refused (an
        // ACL without it, a foreign value at the wake-up key) is final.
        self.keep_only = matches!(woken, Ok(None));
        woken.map(|_| Woke::Look).map_err(out_of_descriptors)
    }

    fn leave(&mut self) {
        if std::mem::take(&mut self.placed) {
            let _ = leave(
                &mut self.redis.link,
                &self.keys,
                &self.req.owner.secret,
                &self.id,
            );
        }
    }

    fn way_out(&self) -> Option<Leave> {
        Some(super::leave::way_out(
            &self.redis.link,
            &self.keys,
            &self.req.owner.secret,
            &self.id,
        ))
    }

    fn remote(&self) -> Option<&Remote> {
        Some(&self.redis.link.remote)
    }
}

impl Taking<'_> {
    /// A grant: confirmed, the lease; unconfirmed, given back, and the
    /// failure tried again within the driver's budget.
    fn granted(&mut self, token: u64, slot: Option<u32>, sent_at: Boot) -> Result<Look, Error> {
        // A grant from a master that a failover demoted, or one too few
        // replicas have, is no grant.
        self.placed = true;
        if let Err((e, elsewhere)) = self.redis.confirm_grant() {
            self.leave();
            if elsewhere {
                // The next call goes to the master of the moment.
                self.redis.link.conn = None;
            }
            return Err(out_of_descriptors(e));
        }
        self.placed = false;
        let req = self.req;
        // The grant's connection is lent to the renewals, taken back by
        // the release.
        let mut link = self.redis.link.hand_over();
        let conn = link.conn.take().map(|c| (c, link.node.clone()));
        let held = RedisHeld {
            link,
            kept: std::sync::Arc::new(std::sync::Mutex::new(conn)),
            replicas: self.redis.replicas,
            keys: std::mem::take(&mut self.keys),
            owner: req.owner.secret.clone(),
            id: std::mem::take(&mut self.id),
            name: req.name.to_string(),
            timing: req.timing,
            min_hold: req.min_hold,
        };
        // PEXPIREAT with the ttl asked: Redis grants what it is asked.
        let lease = Lease::new(token, slot, sent_at, req.timing.ttl, Box::new(held));
        Ok(Look::Done(Acquired::Granted(lease)))
    }
}
