//! Taking a name on Redis: one try of the acquire script, and between tries
//! a blocking pop on our own wake-up list, which a release serving the queue
//! pushes to. The give-up clock, the waiting line and the retry budget are
//! the seam's (`backend::wait`).

use std::time::Duration;

use redis::Value;

use super::link::Link;
use super::reply::Acquire;
use super::scripts::{ACQUIRE_SCRIPT, Keys, RELEASE_SCRIPT};
use super::{Redis, RedisHeld};
use crate::backend::wait::{Patience, Retry};
use crate::backend::{Acquired, Error, Lease, Request, Wait};
use crate::clock::Boot;
use crate::log;

/// Random hex for a waiter's place in the queue (public, unlike the owner value).
fn waiter_id() -> String {
    let mut bytes = [0u8; 8];
    let _ = rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty());
    let pid = std::process::id();
    let mut id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    id.push_str(&format!("{pid:x}"));
    id
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

/// Keep trying after transport errors for this long before giving up with 69.
fn outage_budget(req: &Request) -> Duration {
    req.timing.ttl.max(Duration::from_secs(5))
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
        let id = waiter_id();
        let wake_key = format!("{}{id}", keys.wake);
        let timing = req.timing;
        let ttl_ms = timing.ttl.as_millis() as u64;
        // A queued waiter keeps its place for a third of its ttl, so one
        // killed in the queue is dropped from it within that; it renews its
        // place `op` (the bound on one request) before the place would lapse.
        let alive = (timing.ttl / 3).max(Duration::from_millis(100));
        let refresh = alive.saturating_sub(timing.op).max(alive / 2);
        let queue = if wait == Wait::No { "0" } else { "1" };
        let outer = req.outer.clone().unwrap_or_default();
        let doing = format!("acquiring {}", req.name);
        let mut patience = Patience::new(req, wait);
        let mut retry = Retry::new(outage_budget(req));
        let mut unconfirmed = Retry::new(outage_budget(req));
        let mut holder: Option<String> = None;
        // When the soonest holder's lease runs out on its own, as last heard
        // at the head of the queue, and whether the next call only keeps our
        // place.
        let mut holder_end: Option<Boot> = None;
        let mut keep_only = false;
        // Our arrival number once queued: a place that lapsed while we
        // lived (a server paused past ttl/3) is taken back at it.
        let mut place: Option<i64> = None;
        loop {
            let script = &*ACQUIRE_SCRIPT;
            let sent_at = Boot::now();
            let reply = self.link.call(|c| {
                keys.on(script)
                    .arg(&req.owner.secret)
                    .arg(&req.owner.shown)
                    .arg(ttl_ms)
                    .arg(req.mode.code())
                    .arg(req.mode.limit())
                    .arg(queue)
                    .arg(&id)
                    .arg(alive.as_millis() as u64)
                    .arg(&outer)
                    .arg(if keep_only { "1" } else { "0" })
                    .arg(place.map(|n| n.to_string()).unwrap_or_default())
                    .invoke::<Vec<Value>>(c)
            });
            let reply = match reply {
                Ok(v) => {
                    retry.succeeded();
                    Acquire::read(&v, req.mode)?
                }
                // Final, or a server that never answered: misconfiguration,
                // not an outage to wait out.
                Err(e) if !e.is_transient() || !self.link.replied => {
                    return Err(self.link.failed(&doing, e));
                }
                Err(e) => match retry.failed(&patience) {
                    Some(pause) => {
                        log::info(format!("acquire failed: {e}; retrying"));
                        std::thread::sleep(pause);
                        continue;
                    }
                    None => {
                        // A reply may have been lost after the server granted
                        // it; this gives back only what is ours.
                        let _ = leave(&mut self.link, &keys, &req.owner.secret, &id);
                        return Err(self.link.failed(&doing, e));
                    }
                },
            };
            let holder_ends_in = match reply {
                Acquire::Granted { token, slot } => {
                    // A grant from a master that a failover demoted, or one
                    // too few replicas have, is no grant: give it back and
                    // try again, on a budget of its own (a script that
                    // answers does not renew it).
                    if let Err((e, elsewhere)) = self.confirm_grant() {
                        let _ = leave(&mut self.link, &keys, &req.owner.secret, &id);
                        if elsewhere {
                            // The next call goes to the master of the moment.
                            self.link.conn = None;
                        }
                        match unconfirmed.failed(&patience) {
                            Some(pause) if e.is_transient() => {
                                log::info(format!("{e}; retrying"));
                                std::thread::sleep(pause);
                                continue;
                            }
                            _ => return Err(self.link.failed(&doing, e)),
                        }
                    }
                    log::info(format!(
                        "acquired {} with token {token} after {:.1?}",
                        req.name,
                        Boot::now().since(patience.started())
                    ));
                    let held = RedisHeld {
                        link: self.link.hand_over(),
                        replicas: self.replicas,
                        keys,
                        owner: req.owner.secret.clone(),
                        id,
                        name: req.name.to_string(),
                        timing,
                        min_hold: req.min_hold,
                    };
                    // PEXPIREAT with the ttl asked: Redis grants what it is asked.
                    let lease = Lease::new(token, slot, sent_at, timing.ttl, Box::new(held));
                    return Ok(Acquired::Granted(lease));
                }
                Acquire::Disagrees(in_force) => {
                    return Err(req.mode.disagreement(req.name, in_force));
                }
                Acquire::Nested => return Err(crate::backend::nested(req.name)),
                Acquire::Busy { holder: h } => {
                    return Ok(Acquired::Busy {
                        holder: h.or(holder),
                    });
                }
                Acquire::Queued {
                    holder: h,
                    holder_ends_in,
                    arrival,
                } => {
                    place = arrival.or(place);
                    // A waiter keeping its place hears no holder: keep the last one heard.
                    holder = h.or(holder);
                    holder_ends_in
                }
            };
            if patience.over() {
                // Out of the queue; a grant handed over meanwhile goes to the next.
                let _ = leave(&mut self.link, &keys, &req.owner.secret, &id);
                return Ok(Acquired::Busy { holder });
            }
            patience.tick(holder.as_deref());
            // Block until a release hands us the lease, but come back to keep
            // our place, when a holder's lease runs out on its own, to say we
            // wait, and when --wait runs out.
            if let Some(left) = holder_ends_in {
                holder_end = Some(sent_at.add(left + Duration::from_millis(1)));
            }
            let now = Boot::now();
            let mut timeout = refresh;
            match holder_end {
                Some(end) if end > now => timeout = timeout.min(end.since(now)),
                // Passed: the head looks at the holders when it comes; the
                // others do not need to.
                _ => holder_end = None,
            }
            let timeout = patience.cap(timeout).max(Duration::from_millis(1));
            let woken = wait_for_wakeup(&mut self.link, &wake_key, timeout);
            // Woken, the next call confirms the grant (with a full ttl
            // counted from its own sending) or looks again; otherwise it
            // only keeps our place (and at the head, checks the holders).
            keep_only = matches!(woken, Ok(None));
            match woken {
                Ok(_) => {}
                Err(e) if !e.is_transient() => {
                    // BLPOP refused (an ACL without it, a foreign value at the
                    // wake-up key): final, never a retry loop.
                    let _ = leave(&mut self.link, &keys, &req.owner.secret, &id);
                    return Err(self.link.failed(&format!("waiting for {}", req.name), e));
                }
                Err(e) => {
                    log::info(format!("waiting failed: {e}; retrying"));
                    std::thread::sleep(retry.pause());
                }
            }
        }
    }
}
