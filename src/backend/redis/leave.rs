//! Leaving a name's queue from another thread, when a signal ends lockrun
//! while it waits (`backend::quit`): the release script with our owner and
//! place, on a connection of its own (behind sentinels, to the master of
//! the moment; on a cluster, to the name's node).

use super::link::Link;
use super::scripts::Keys;
use super::take::leave;
use crate::backend::drive::Remote;
use crate::backend::quit::Leave;

/// Our place (`id`) and any grant of `owner` on the name of `keys`, given
/// up from a new connection to the server `link` reaches.
pub fn way_out(link: &Link, keys: &Keys, owner: &str, id: &str) -> Leave {
    let mut fresh = Link {
        connector: link.connector.clone(),
        conn: None,
        node: None,
        op: link.op,
        remote: Remote::new(link.remote.shown.clone()),
    };
    let (keys, owner, id) = (keys.clone(), owner.to_string(), id.to_string());
    Box::new(move || leave(&mut fresh, &keys, &owner, &id).map(|_| ()))
}
