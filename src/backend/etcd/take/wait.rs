//! A blocked request's wait on etcd: its key moved onto a short waiter
//! lease, a watch on the keys whose going could let it in, and its leases
//! kept alive meanwhile, until the driver's deadline.

use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use serde_json::json;

use super::super::client::b64;
use super::super::{Etcd, grant, holds, keepalive, revoke, succeeded, txn};
use super::{Mine, Spare, WATCH_LIFE, waiter_ttl};
use crate::backend::drive::Woke;
use crate::backend::{Error, Request};
use crate::clock::Boot;

/// The keys whose going could let us in, as of the queue's `revision`.
pub(super) struct Blocked {
    pub(super) watch: Vec<String>,
    pub(super) revision: u64,
    pub(super) watching: Option<Watching>,
    /// The wait ended on the deletion of a watched key.
    pub(super) event: bool,
}

/// A watch open on the keys in our way.
pub(super) struct Watching {
    events: std::sync::mpsc::Receiver<Result<bool, Error>>,
    opened: Boot,
}

impl Etcd {
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

    /// Block until a watched key goes (then look, with the hand-off write
    /// first) or `until`, keeping our leases alive; the first time, move
    /// our key onto its waiter lease and open the watch.
    pub(super) fn wait_turn(
        &mut self,
        req: &Request,
        mine: &mut Option<Mine>,
        b: &mut Blocked,
        until: Option<Boot>,
    ) -> Result<Woke, Error> {
        let m = mine.as_mut().expect("in the queue");
        if !m.waiting && !self.onto_waiter_lease(m, req)? {
            return Ok(Woke::Look);
        }
        if b.watching.is_none() {
            b.watching = Some(self.watch(req, m, &b.watch, b.revision));
        }
        let w = b.watching.as_ref().expect("opened above");
        loop {
            // Kept alive whatever the watch does: one that breaks at once,
            // again and again, must not cost us our place.
            if !self.keep_alive(m)? {
                // Gone: the next look finds our key missing and queues again.
                return Ok(Woke::Look);
            }
            if until.is_some_and(|u| Boot::now() >= u) {
                return Ok(Woke::Due);
            }
            let due = m.spare.map_or(m.next_keepalive, |sp| {
                sp.next_keepalive.min(m.next_keepalive)
            });
            let due = until.map_or(due, |u| due.min(u));
            let timeout = due.since(Boot::now()).max(Duration::from_millis(1));
            match w.events.recv_timeout(timeout) {
                Ok(Ok(true)) => {
                    b.event = true;
                    return Ok(Woke::Look);
                }
                // A watch that lived out its life: open the next at once.
                Ok(Ok(false)) if Boot::now().since(w.opened) >= WATCH_LIFE / 2 => {
                    b.watching = None;
                    return Ok(Woke::Look);
                }
                // A stream that breaks or ends at once (a proxy that does
                // not pass streaming, a member going away) says nothing of
                // the queue: the driver looks again after a pause.
                Ok(Err(e)) => return Err(e),
                Ok(Ok(false)) | Err(RecvTimeoutError::Disconnected) => return Ok(Woke::Broke),
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Watch the keys in our way for their deletion, from just after the
    /// queue was read: one that happened since is not missed. A
    /// --supersede waiter watches its own key too: a newer one that takes
    /// its place deletes it, and it gives up at once.
    fn watch(&mut self, req: &Request, m: &Mine, watch: &[String], revision: u64) -> Watching {
        let own = req.group.supersede.then(|| m.key.clone());
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
        Watching {
            opened: Boot::now(),
            events: self.client.watch(creates, WATCH_LIFE),
        }
    }

    /// Keep our leases alive when due. False: our own lease is gone.
    fn keep_alive(&mut self, m: &mut Mine) -> Result<bool, Error> {
        if Boot::now() >= m.next_keepalive {
            let sent = Boot::now();
            match keepalive(&mut self.client, m.lease)? {
                Some(ttl) => m.next_keepalive = sent.add(ttl / 3),
                None => return Ok(false),
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
        Ok(true)
    }
}
