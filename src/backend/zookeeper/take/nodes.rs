//! The calls a request makes on its nodes: its unique part, its create
//! (with the containers above it), the confirmation of its turn, a
//! `--limit` slot, and the watches a waiter sets.

use std::time::Duration;

use zookeeper_client as zk;

use super::super::client::{CallError, Client};
use super::super::queue::{Entry, Nodes, Record};
use super::super::{foreign_at, server_now};
use super::{Blocked, Failed, Taking, Watching, call_failed};
use crate::backend::Error;
use crate::clock::Boot;

pub(super) fn unique() -> Result<String, Error> {
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

impl Taking<'_> {
    /// Set the watches on what is in our way, and on our session: news of
    /// any comes on one channel. None: something went already; look again.
    pub(super) fn watch(&mut self, b: &Blocked) -> Result<Option<Watching>, Failed> {
        let c = self.client.clone();
        // A window ends on the server's clock: sleep until then by ours.
        let wake = match b.until {
            Some(end) => {
                let now = server_now(&c, &self.nodes)
                    .map_err(call_failed("reading the server's clock"))?;
                Some(Boot::now().add(Duration::from_millis((end - now).max(0) as u64 + 5)))
            }
            None => None,
        };
        let (tx, news) = std::sync::mpsc::channel::<()>();
        for node in &b.watch {
            let path = self.nodes.child(node);
            let (stat, watcher) = c
                .call(|z| async move { z.check_and_watch_stat(&path).await })
                .map_err(call_failed("watching the node ahead"))?;
            if stat.is_none() {
                return Ok(None);
            }
            let tx = tx.clone();
            c.spawn(async move {
                watcher.changed().await;
                let _ = tx.send(());
            });
        }
        if self.req.group.supersede && !self.watch_own(&c, &b.own, &tx)? {
            return Ok(None);
        }
        let _stop = watch_session(&c, tx)?;
        Ok(Some(Watching {
            news,
            _stop,
            opened: Boot::now(),
            wake,
        }))
    }

    /// A newer --supersede request marks our node: watch it too. False:
    /// gone or marked already (the next look finds out why).
    fn watch_own(
        &self,
        c: &Client,
        own: &str,
        tx: &std::sync::mpsc::Sender<()>,
    ) -> Result<bool, Failed> {
        let path = self.nodes.child(own);
        let (data, _, watcher) = match c.call(|z| async move { z.get_and_watch_data(&path).await })
        {
            Ok(v) => v,
            Err(CallError::Zk(zk::Error::NoNode)) => return Ok(false),
            Err(e) => return Err(Failed::Call(e, "watching our node".into())),
        };
        if Record::decode(&data).is_some_and(|r| r.replaced_by.is_some()) {
            return Ok(false);
        }
        let tx = tx.clone();
        c.spawn(async move {
            watcher.changed().await;
            let _ = tx.send(());
        });
        Ok(true)
    }
}

/// A watch's event lost with a connection comes back when the session
/// reconnects (the server resets our watches), but a release missed
/// meanwhile is read at once on reconnecting: the session's state sends
/// news too. Dropping the sender returned ends the task.
pub(super) fn watch_session(
    c: &Client,
    tx: std::sync::mpsc::Sender<()>,
) -> Result<tokio::sync::oneshot::Sender<()>, Failed> {
    let (stop_tx, stop) = tokio::sync::oneshot::channel::<()>();
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
    Ok(stop_tx)
}

/// Create our node under the name's parent: its node name. None: no
/// parent (ZooKeeper may delete an empty container at any time, the
/// prefix's between our two creates), made now: try again. After
/// `orphaned` such tries in a row, the chroot may be gone under us.
pub(super) fn create(
    c: &Client,
    nodes: &Nodes,
    id: &str,
    data: &[u8],
    orphaned: u32,
) -> Result<Option<String>, CallError> {
    let path = nodes.request(id);
    let data = data.to_vec();
    let acls = c.acls();
    match c.call(|z| async move {
        let opts = zk::CreateMode::EphemeralSequential.with_acls(acls);
        z.create(&path, &data, &opts).await
    }) {
        Ok((_, seq)) => Ok(Some(format!("q-{id}-{seq}"))),
        Err(CallError::Zk(zk::Error::NoNode)) if orphaned >= 5 => {
            // Still no parent: the chroot may be gone under us.
            Err(c.chroot_gone()?.unwrap_or(CallError::Zk(zk::Error::NoNode)))
        }
        Err(CallError::Zk(zk::Error::NoNode)) => {
            // The prefix's node is shared by every identity; a name's
            // node carries our ACL, as its requests do (a name is one
            // identity's: another could not read its requests).
            let prefix = zk::Acls::new(&PREFIX_ACL[..]);
            match container(c, &nodes.root, prefix)
                .and_then(|()| container(c, &nodes.parent, c.acls()))
            {
                Ok(()) | Err(CallError::Zk(zk::Error::NoNode)) => Ok(None),
                Err(e) => Err(e),
            }
        }
        // A node at the name's place that lockrun may not create
        // under: named, if it is not lockrun's.
        Err(CallError::Zk(e @ (zk::Error::NoAuth | zk::Error::NoChildrenForEphemerals))) => {
            Err(match foreign_at(c, nodes)? {
                Some(w) => CallError::Refused(w.line()),
                None => CallError::Zk(e),
            })
        }
        Err(e) => Err(e),
    }
}

/// Rewrite our node as read, at the version read: the leader judges it
/// (our session alive, the node unchanged). Its new version.
pub(super) fn confirm(c: &Client, path: &str, e: &Entry) -> Result<i32, CallError> {
    let path = path.to_string();
    let (data, version) = (e.record.encode(), e.version);
    c.call(|z| async move { z.set_data(&path, &data, Some(version)).await })
        .map(|stat| stat.version)
}

/// Claim a free `--limit` slot for our node, `first` tried first: None
/// when all N are taken (a holder leaving at this moment).
pub(super) fn claim(
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
