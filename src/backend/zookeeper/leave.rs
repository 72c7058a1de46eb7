//! Leaving a name's queue from another thread, when a signal ends lockrun
//! while it waits (`backend::quit`): our nodes are ephemeral, and would
//! stay until our session timed out (a whole ttl). On a session of its
//! own, every node under the name that our session owns goes: our place,
//! and a grant or slot claim made meanwhile.

use std::time::Duration;

use super::address::ZkUrl;
use super::client::{Client, sort};
use crate::backend::quit::Leave;

/// Every node under `parent` owned by the session of `ours`, deleted from
/// a new session to the ensemble at `url`. A request whose session expired
/// while it waited has nodes of the new session, which stay until it
/// times out.
pub fn way_out(url: &ZkUrl, parent: &str, ours: &Client, ttl: Duration) -> Leave {
    let (url, parent) = (url.clone(), parent.to_string());
    let (session, op) = (ours.session_id(), ours.op);
    Box::new(move || {
        let c = Client::connect(&url, ttl, op)?;
        let p = parent.clone();
        let children = c
            .call(|z| async move { z.list_children(&p).await })
            .map_err(|e| sort(e, "listing our nodes"))?;
        for child in children {
            let path = format!("{parent}/{child}");
            let p = path.clone();
            let stat = c
                .call(|z| async move { z.check_stat(&p).await })
                .map_err(|e| sort(e, "reading our node"))?;
            if stat.is_some_and(|s| s.ephemeral_owner == session) {
                c.call(|z| async move { z.delete(&path, None).await })
                    .map_err(|e| sort(e, "deleting our node"))?;
            }
        }
        Ok(())
    })
}
