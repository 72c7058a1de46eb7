//! Leaving a name's queue from another thread, when a signal ends lockrun
//! while it waits (`backend::quit`): on a connection of its own, under the
//! row lock on the name's counter (so a look of ours in flight is done
//! first), our place goes, and any grant of ours with it. The waiters that
//! block on our wake-up locks are woken as our own session ends, with
//! lockrun.

use super::client::Client;
use super::sql::{Tables, lit};
use super::take::{commit, transaction};
use crate::backend::Request;
use crate::backend::quit::Leave;

/// Every place and grant of `req`'s owner on its name, given up from a new
/// connection to the database `client` reaches.
pub fn way_out(client: &Client, tables: &Tables, req: &Request) -> Leave {
    let mut c = client.fresh();
    let tables = tables.clone();
    let (name, owner) = (req.name.to_string(), req.owner.secret.clone());
    Box::new(move || {
        let dequeue = tables.dequeue(&name, &owner);
        // Without a --min-hold window: no job ran under a grant made now.
        let forsake = format!(
            "DELETE FROM {} WHERE name = {} AND owner = {}",
            tables.leases,
            lit(&name),
            lit(&owner)
        );
        transaction(&mut c, &tables, &name, vec![dequeue], |c, _| {
            commit(c, vec![forsake], Vec::new()).map(|_| ())
        })
        .map(|_| ())
    })
}
