//! Leaving a name's queue from another thread, when a signal ends lockrun
//! while it waits (`backend::quit`): on a connection of its own, under the
//! name's lock (so a look of ours in flight is done first), our place goes,
//! and any grant of ours with it, and the name's waiters look again.

use tokio_postgres::types::{ToSql, Type};

use super::client::{Call, Client};
use super::sql::Tables;
use super::take::{commit, transaction};
use crate::backend::Request;
use crate::backend::quit::Leave;

/// Every place and grant of `req`'s owner on its name, given up from a new
/// connection to the database `client` reaches.
pub fn way_out(client: &Client, tables: &Tables, req: &Request) -> Leave {
    let mut c = client.fresh();
    let tables = tables.clone();
    let (name, owner) = (req.name.to_string(), req.owner.secret.clone());
    let channel = tables.channel(&name);
    Box::new(move || {
        let (dequeue, forsake) = (tables.dequeue(), tables.forsake());
        let who: [(&(dyn ToSql + Sync), Type); 2] = [(&name, Type::TEXT), (&owner, Type::TEXT)];
        let wake: [(&(dyn ToSql + Sync), Type); 1] = [(&channel, Type::TEXT)];
        transaction(&mut c, &tables, &name, (&dequeue, &who), |c, _| {
            let last = [
                Call::Query(&forsake, &who),
                Call::Query(tables.notify(), &wake),
            ];
            commit(c, &last).map(|_| ())
        })
    })
}
