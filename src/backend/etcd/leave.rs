//! Leaving a name's queue from another thread, when a signal ends lockrun
//! while it waits (`backend::quit`): on connections of its own, read the
//! name's queue and end the lease of every key our owner has in it (a
//! place, or a grant made meanwhile); the key goes with its lease.

use super::client::Client;
use super::queue::{Keys, entries};
use super::revoke;
use crate::backend::quit::Leave;

/// Every key of `owner` in the queue of `keys`, given up from a new
/// client of the cluster `client` reaches.
pub fn way_out(client: &Client, keys: &Keys, owner: &str) -> Leave {
    let mut c = client.fresh();
    let (keys, owner) = (keys.clone(), owner.to_string());
    Box::new(move || {
        let v = c.call("/v3/kv/range", &keys.range())?;
        let (queue, _) = entries(&keys, &v, &v["header"])?;
        for e in queue.iter().filter(|e| e.record.owner == owner) {
            revoke(&mut c, e.lease)?;
        }
        Ok(())
    })
}
