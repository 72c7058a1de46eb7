//! A ZooKeeper lease once granted: our request node on our session, its
//! release (with a `--min-hold` window kept as a TTL node), and its
//! renewal, one round trip through the leader.

use std::time::Duration;

use zookeeper_client as zk;

use super::client::{CallError, Client, expired, sort};
use super::queue::{Entry, Nodes, Record};
use super::{delete, delete_at, own_slot};
use crate::backend::{Error, Held, MinHold, Renewal, Renewer, Renewing};
use crate::clock::Boot;
use crate::log;

/// A lease on ZooKeeper: our node on our session.
pub(super) struct ZkHeld {
    pub(super) client: Client,
    pub(super) nodes: Nodes,
    pub(super) entry: Entry,
    pub(super) ttl: Duration,
    pub(super) name: String,
    /// When the grant's reply came: the grant was made no later.
    pub(super) granted_by: Boot,
    /// `--min-hold`: the release keeps a window until it ends.
    pub(super) min_hold: Option<Duration>,
}

impl ZkHeld {
    /// What is left of the `--min-hold` window, counted from the reply to
    /// the grant (no later than the grant itself).
    fn window_left(&self) -> Option<Duration> {
        let hold = self.min_hold?;
        hold.checked_sub(Boot::now().since(self.granted_by))
            .filter(|d| !d.is_zero())
    }

    /// Delete our node while it is as granted. Marked since: a revoked
    /// node stays until our session ends, as `release --force` promised;
    /// a preempted one goes. Ok(false): it was no longer ours.
    fn delete(&self) -> Result<bool, Error> {
        let (c, nodes, e) = (&self.client, &self.nodes, &self.entry);
        match delete_at(c, nodes, e, Some(e.version)) {
            Ok(done) => Ok(done),
            Err(CallError::Zk(zk::Error::BadVersion)) => {
                let path = nodes.child(&e.node);
                let (data, _) = match c.call(|z| async move { z.get_data(&path).await }) {
                    Ok(v) => v,
                    // Gone meanwhile (deleted, or with an expired session).
                    Err(CallError::Zk(zk::Error::NoNode)) => return Ok(false),
                    Err(err) => return Err(sort(err, "releasing")),
                };
                if Record::decode(&data).is_none_or(|r| r.revoked) {
                    return Ok(false);
                }
                delete(c, nodes, e).map_err(|err| sort(err, "releasing"))
            }
            Err(err) => Err(sort(err, "releasing")),
        }
    }

    /// Replace our node by a window that the server ends no sooner than
    /// `left` from now (a TTL node; its time counts from its creation,
    /// after this), in one multi with the delete of our node.
    fn keep_for(&self, left: Duration) -> Result<bool, Error> {
        let (c, nodes, e) = (&self.client, &self.nodes, &self.entry);
        // The server's clock may run a little faster than ours.
        let padded = left + left / 100 + Duration::from_millis(2);
        let ms = padded.as_millis().max(1) as u64;
        let record = Record {
            window_ms: Some(ms),
            token: Some(e.czxid),
            slot: e.slot,
            preempted_by: None,
            ..e.record.clone()
        };
        let path = nodes.child(&e.node);
        let slot = own_slot(c, nodes, e).map_err(|err| sort(err, "releasing"))?;
        let window = nodes.window(&e.id);
        let version = e.version;
        let acls = c.acls();
        let r = c.call(|z| async move {
            let mut w = z.new_multi_writer();
            w.add_delete(&path, Some(version))?;
            if let Some((s, v)) = &slot {
                w.add_delete(s, Some(*v))?;
            }
            let opts = zk::CreateMode::Persistent
                .with_acls(acls)
                .with_ttl(Duration::from_millis(ms));
            w.add_create(&window, &record.encode(), &opts)?;
            w.commit().await.map_err(zk::Error::from)
        });
        match r {
            Ok(_) => {
                log::info(format!(
                    "released {}; kept by --min-hold for {}",
                    self.name,
                    crate::text::duration(Duration::from_millis(ms))
                ));
                Ok(true)
            }
            // Marked since the grant (revoked or preempted): no window.
            Err(CallError::Zk(zk::Error::BadVersion | zk::Error::NoNode)) => self.delete(),
            Err(err) if !matches!(&err, CallError::Zk(e) if is_refusal(e)) => {
                Err(sort(err, "releasing"))
            }
            Err(err) => {
                log::warn(format!(
                    "released {} without its --min-hold window: ZooKeeper refused a TTL \
                     node ({}); set extendedTypesEnabled=true on its servers",
                    self.name,
                    sort(err, "keeping the window")
                ));
                self.delete()
            }
        }
    }
}

/// A refusal of a TTL node by a server that does not enable them.
pub(super) fn is_refusal(e: &zk::Error) -> bool {
    !matches!(
        e,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::SessionExpired
            | zk::Error::SessionMoved
            | zk::Error::ClientClosed
            | zk::Error::NoAuth
    )
}

impl Held for ZkHeld {
    fn renewer(&self) -> Renewing {
        Renewing::OnItsConnection(Box::new(ZkRenewer {
            client: self.client.clone(),
            path: self.nodes.child(&self.entry.node),
            session: self.client.session_id(),
            ttl: self.ttl,
            version: self.entry.version,
            preempted: self.entry.record.preempted_by.clone(),
            slot: self.entry.slot.map(|s| self.nodes.slot(s)),
            node: self.entry.node.clone(),
            shrunk: None,
        }))
    }

    fn release(mut self: Box<Self>, window: MinHold) -> Result<bool, Error> {
        self.min_hold = window.of(self.min_hold);
        if let Some(left) = self.window_left() {
            return self.keep_for(left);
        }
        self.delete()
    }

    /// Our node goes with our session: within the session timeout the
    /// server granted it when it last connected, which is not the ttl when
    /// the server's minSessionTimeout is above it.
    fn if_unreleased(&self) -> Option<String> {
        let granted = self.client.granted().unwrap_or(self.client.timeout);
        Some(format!(
            "our node goes with our ZooKeeper session, within the {} the server granted it",
            crate::text::duration(granted)
        ))
    }
}

/// Check, through the leader, that `path` is at `version`: a check-only
/// multi is a write, so the leader (with a quorum) judges it and first
/// checks that our session is alive; a read could be served by a follower
/// cut off from a paused leader, which may expire the session meanwhile.
pub(super) fn check(c: &Client, path: &str, version: i32) -> Result<(), CallError> {
    let path = path.to_string();
    c.call(|z| async move {
        let mut w = z.new_multi_writer();
        w.add_check_version(&path, version)?;
        w.commit().await.map_err(zk::Error::from)
    })
    .map(|_| ())
}

/// A renewal: one round trip through the leader that proves the session
/// alive and the node ours (there, on our session, unchanged since it was
/// granted); when it changed, a read says why (revoked, preempted).
struct ZkRenewer {
    client: Client,
    path: String,
    session: i64,
    ttl: Duration,
    /// Our node's version as last seen.
    version: i32,
    /// A `--preempt` request marked our node before our grant read it.
    preempted: Option<String>,
    /// Our `--limit` slot's node, and our node's name that it holds.
    slot: Option<String>,
    node: String,
    /// The session timeout last granted below the ttl, once said.
    shrunk: Option<Duration>,
}

impl Renewer for ZkRenewer {
    fn renew(&mut self) -> Result<Renewal, Error> {
        let renewal = self.renew_node()?;
        let (Renewal::Renewed { .. }, Some(slot)) = (&renewal, &self.slot) else {
            return Ok(renewal);
        };
        // Our slot's node must be ours still: one deleted behind our back
        // is the next claimant's to take, so the lease is lost with it.
        // Read on our session after the check, so no older than it.
        let path = slot.clone();
        match self.client.call(|z| async move { z.get_data(&path).await }) {
            Ok((data, stat))
                if data == self.node.as_bytes() && stat.ephemeral_owner == self.session =>
            {
                Ok(renewal)
            }
            Ok(_) => Ok(Renewal::Lost),
            Err(e) if expired(&e) || matches!(e, CallError::Zk(zk::Error::NoNode)) => {
                Ok(Renewal::Lost)
            }
            Err(e) => Err(sort(e, "renewing")),
        }
    }

    fn wake(&mut self) -> Option<std::os::fd::OwnedFd> {
        match self.client.wake_on_connect(self.ttl) {
            Ok(fd) => Some(fd),
            Err(e) => {
                log::warn(format!(
                    "cannot watch our ZooKeeper session's reconnects ({e}): a shorter \
                     session granted on one is followed at the next renewal"
                ));
                None
            }
        }
    }
}

impl ZkRenewer {
    /// What the lease lasts from a renewal whose check went through: the
    /// ttl, or the session timeout the server granted when our session
    /// last connected if that is shorter (ZooKeeper negotiates it again on
    /// every reconnect), so the deadline and the kill schedule follow it.
    /// Read after the check, so no older than the connection it went on.
    fn lasting(&mut self) -> Duration {
        let granted = self.client.granted().unwrap_or(Duration::ZERO);
        if granted >= self.ttl {
            return self.ttl;
        }
        if self.shrunk != Some(granted) {
            self.shrunk = Some(granted);
            log::warn(format!(
                "ZooKeeper granted our session {} when it reconnected, less than --ttl {}: \
                 the lease now ends {} after each renewal (the server's maxSessionTimeout \
                 or tickTime changed?)",
                crate::text::duration(granted),
                crate::text::duration(self.ttl),
                crate::text::duration(granted),
            ));
        }
        granted
    }

    /// The renewal of our request node.
    fn renew_node(&mut self) -> Result<Renewal, Error> {
        let lost = |e: &CallError| expired(e) || matches!(e, CallError::Zk(zk::Error::NoNode));
        if let Some(by) = self.preempted.clone() {
            // Asked to stop already: the node was marked at the version
            // our grant read, so the check below would not see it.
            return match check(&self.client, &self.path, self.version) {
                Err(e) if lost(&e) => Ok(Renewal::Lost),
                _ => Ok(Renewal::Preempted { by }),
            };
        }
        match check(&self.client, &self.path, self.version) {
            Ok(()) => {
                return Ok(Renewal::Renewed {
                    ttl: self.lasting(),
                });
            }
            Err(e) if lost(&e) => return Ok(Renewal::Lost),
            Err(CallError::Zk(zk::Error::BadVersion)) => {}
            Err(e) => return Err(sort(e, "renewing")),
        }
        // Changed since we last looked: a mark, or not ours.
        let path = self.path.clone();
        let (data, stat) = match self.client.call(|z| async move { z.get_data(&path).await }) {
            Ok(v) => v,
            Err(e) if lost(&e) => return Ok(Renewal::Lost),
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
        self.version = stat.version;
        match check(&self.client, &self.path, self.version) {
            Ok(()) => Ok(Renewal::Renewed {
                ttl: self.lasting(),
            }),
            Err(e) if lost(&e) => Ok(Renewal::Lost),
            Err(e) => Err(sort(e, "renewing")),
        }
    }
}
