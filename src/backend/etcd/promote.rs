//! A waiter's turn on etcd: the promotion that moves its key to a lease of
//! the full ttl (a `--limit` holder taking a free slot) in one transaction
//! that holds only if the queue did not change, and who is first in line.

use serde_json::json;

use super::client::{b64, int};
use super::queue::{Entry, Keys, Record, holders};
use super::take::{MAX_COMPARES, Mine, Promotion};
use super::{grant, holds, revoke, succeeded, txn, wall_ms};
use crate::backend::drive::Look;
use crate::backend::{Error, Mode, Request};
use crate::clock::Boot;

impl super::Etcd {
    /// Our turn has come: a waiter moves its key to a lease of the full ttl
    /// (the deadline counts from that grant), a `--limit` holder takes a
    /// free slot. Both in one transaction that holds only if nothing in
    /// the queue changed since it was read (two new holders never take the
    /// same slot).
    pub(super) fn promote(
        &mut self,
        req: &Request,
        keys: &Keys,
        mine: &mut Option<Mine>,
        queue: &[Entry],
        revision: u64,
        created_now: bool,
    ) -> Result<Look, Error> {
        let m = mine.as_mut().expect("in the queue");
        let limit = matches!(req.mode, Mode::Limit(_));
        // With no transaction only when the key was granted by its own
        // create: after any other look (a retry, a move onto a waiter
        // lease whose reply was lost) the key may not be on the lease we
        // believe, so it is put on a known full lease, with a new value
        // that a write of ours landing late no longer matches.
        if created_now && !m.waiting && !limit {
            // Granted at its create, whose revision is higher than that of
            // every earlier grant: each had its key gone, or granted, by then.
            return Ok(Look::Done(self.granted(m, req, None, m.create_rev)));
        }
        let (lease, ttl, sent) = if let (true, Some(sp)) = (m.waiting, m.spare) {
            // The deadline counts from the spare's last keepalive.
            (sp.lease, sp.ttl, sp.sent)
        } else if m.waiting {
            let sent = Boot::now();
            let (lease, ttl) = grant(&mut self.client, req.timing.ttl)?;
            (lease, ttl, sent)
        } else {
            (m.lease, m.lease_ttl, m.lease_sent)
        };
        let mut record = Record::decode(&m.value).expect("our own record");
        // Never the value it had: the transaction must change it.
        record.granted_ms = wall_ms().max(record.granted_ms + 1);
        if limit {
            record.slot = free_slot(queue, m, req.mode.limit());
        }
        let value = record.encode();
        let mut compare = vec![
            holds(&m.key, &m.value),
            json!({"key": b64(&m.key), "target": "CREATE", "result": "EQUAL", "create_revision": m.create_rev.to_string()}),
        ];
        if limit {
            compare.extend(holders_unchanged(
                queue,
                m,
                keys,
                revision,
                req.mode.limit(),
            ));
        }
        let promotion = Promotion {
            value,
            lease,
            lease_ttl: ttl,
            lease_sent: sent,
            slot: record.slot,
        };
        self.send_promotion(m, req, compare, promotion)
    }

    /// Put our key on `p`'s lease with `p`'s value if `compare` holds: our
    /// turn. Remembered before it is sent (a lost reply is found out by the
    /// next look); a spare that lapsed meanwhile means looking again.
    pub(super) fn send_promotion(
        &mut self,
        m: &mut Mine,
        req: &Request,
        compare: Vec<serde_json::Value>,
        p: Promotion,
    ) -> Result<Look, Error> {
        let put = json!({"request_put": {"key": b64(&m.key), "value": b64(&p.value), "lease": p.lease.to_string()}});
        m.promoting = Some(p);
        let v = match txn(&mut self.client, compare, vec![put], vec![]) {
            Ok(v) => v,
            // The spare lapsed (its keepalives failed for a ttl): look
            // again, and grant a new one.
            Err(Error::Refused(e)) if e.contains("lease not found") => {
                m.promoting = None;
                m.spare = None;
                return Ok(Look::Again);
            }
            Err(e) => return Err(e),
        };
        let p = m.promoting.take().expect("set above");
        if !succeeded(&v) {
            if p.lease != m.lease && m.spare.is_none_or(|sp| sp.lease != p.lease) {
                let _ = revoke(&mut self.client, p.lease);
            }
            return Ok(Look::Again);
        }
        let slot = p.slot;
        m.promoted(p);
        // The revision of the write that granted us: higher than every
        // earlier grant's (of this slot and of the name), whichever of the
        // holders arrived first.
        let token = int(&v["header"]["revision"])
            .filter(|r| *r > 0)
            .ok_or_else(|| {
                Error::Internal(format!(
                    "etcd's reply has no revision: {}",
                    crate::log::redact(&v.to_string())
                ))
            })?;
        Ok(Look::Done(self.granted(m, req, slot, token as u64)))
    }

    /// The key an exclusive waiter watched has gone: take the name in one
    /// transaction that holds only if no key of the queue is older than
    /// ours (our own is in it, so the range is never empty), with no read
    /// before it. A hand-off then costs the release and this one write.
    /// Anything else, or a compare that fails, looks at the queue as usual.
    pub(super) fn first_in_line(
        &mut self,
        req: &Request,
        keys: &Keys,
        mine: &mut Option<Mine>,
    ) -> Result<Look, Error> {
        let m = mine.as_mut().expect("in the queue");
        let (Mode::Exclusive, true, Some(sp), None, None, 1..) = (
            req.mode,
            m.waiting,
            m.spare,
            &m.moving,
            &m.promoting,
            m.create_rev,
        ) else {
            return Ok(Look::Again);
        };
        let mut record = Record::decode(&m.value).expect("our own record");
        record.granted_ms = wall_ms().max(record.granted_ms + 1);
        let value = record.encode();
        let compare = vec![
            holds(&m.key, &m.value),
            json!({"key": b64(&m.key), "target": "CREATE", "result": "EQUAL", "create_revision": m.create_rev.to_string()}),
            json!({
                "key": b64(&keys.queue), "range_end": b64(&keys.queue_end),
                "target": "CREATE", "result": "GREATER",
                "create_revision": (m.create_rev - 1).to_string(),
            }),
        ];
        // The deadline counts from the spare's last keepalive, as in `promote`.
        let promotion = Promotion {
            value,
            lease: sp.lease,
            lease_ttl: sp.ttl,
            lease_sent: sp.sent,
            slot: None,
        };
        self.send_promotion(m, req, compare, promotion)
    }
}

/// The lowest slot no other holder of the queue has.
fn free_slot(queue: &[Entry], m: &Mine, limit: u32) -> Option<u32> {
    let used: Vec<u32> = queue[..holders(queue)]
        .iter()
        .filter(|e| e.key != m.key)
        .filter_map(|e| e.record.slot)
        .collect();
    (0..limit).find(|s| !used.contains(s))
}

/// The compares of a `--limit` promotion: no other holder written (a slot
/// taken) or gone (the holders changed) since the queue was read. With every
/// slot's holder in the queue, a request that arrives meanwhile queues
/// behind them and cannot take a slot without one of them going first, so
/// it does not abort ours: a stream of arrivals cannot starve a promotion.
/// With fewer, an arrival is a holder too: no key may have come since the
/// read.
fn holders_unchanged(
    queue: &[Entry],
    m: &Mine,
    keys: &Keys,
    revision: u64,
    limit: u32,
) -> Vec<serde_json::Value> {
    let held = holders(queue);
    let others: Vec<&Entry> = queue[..held].iter().filter(|e| e.key != m.key).collect();
    if others.len() > MAX_COMPARES {
        // More than a transaction may hold: no key of the queue written
        // since it was read.
        return vec![json!({
            "key": b64(&keys.queue), "range_end": b64(&keys.queue_end),
            "target": "MOD", "result": "LESS",
            "mod_revision": (revision + 1).to_string(),
        })];
    }
    let mut compare: Vec<serde_json::Value> = others
        .iter()
        .map(|e| {
            json!({"key": b64(&e.key), "target": "MOD", "result": "EQUAL", "mod_revision": e.mod_rev.to_string()})
        })
        .collect();
    if held < limit as usize {
        compare.push(json!({
            "key": b64(&keys.queue), "range_end": b64(&keys.queue_end),
            "target": "CREATE", "result": "LESS",
            "create_revision": (revision + 1).to_string(),
        }));
    }
    compare
}
