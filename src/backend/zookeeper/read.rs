//! Reading a name: its request nodes, slots and windows, in one round trip
//! after listing them.

use std::future::Future;

use zookeeper_client as zk;

use super::Name;
use super::client::{CallError, Client};
use super::queue::{self, Entry, Nodes, Record, Window, request_of, slot_of, window_of};

/// Read a name's request nodes and slots in one round trip after listing
/// them; None when the name has no node at all.
pub(super) fn read(c: &Client, nodes: &Nodes) -> Result<Option<Name>, CallError> {
    let Some(wanted) = lockruns_children(c, nodes)? else {
        return Ok(None);
    };
    if wanted.is_empty() {
        return Ok(Some(Name::default()));
    }
    let paths: Vec<String> = wanted.iter().map(|n| nodes.child(n)).collect();
    let results = c.call(|z| async move { data(&z, &paths)?.await })?;
    name_of(&wanted, results).map(Some)
}

/// Ask for the data of the nodes at `paths` in one multi-read: the
/// request is sent now, its reply awaited when the future is.
pub(super) fn data<'a>(
    z: &'a zk::Client,
    paths: &[String],
) -> Result<
    impl Future<Output = Result<Vec<zk::MultiReadResult>, zk::Error>> + Send + use<'a>,
    zk::Error,
> {
    let mut r = z.new_multi_reader();
    for p in paths {
        r.add_get_data(p)?;
    }
    Ok(r.commit())
}

/// A name from its children `wanted` and the multi-read of their data.
pub(super) fn name_of(
    wanted: &[String],
    results: Vec<zk::MultiReadResult>,
) -> Result<Name, CallError> {
    let mut found = Found::default();
    for (node, result) in wanted.iter().zip(results) {
        let (data, stat) = match result {
            zk::MultiReadResult::Data { data, stat } => (data, stat),
            // Gone since the list.
            zk::MultiReadResult::Error {
                err: zk::Error::NoNode,
            } => continue,
            // Another identity's node: never one to leave out as gone.
            zk::MultiReadResult::Error {
                err: zk::Error::NoAuth,
            } => {
                found.foreign.push(node.clone());
                continue;
            }
            zk::MultiReadResult::Error { err } => return Err(CallError::Zk(err)),
            _ => {
                return Err(CallError::Zk(zk::Error::UnexpectedError(format!(
                    "no data in the reply for {node}"
                ))));
            }
        };
        found.add(node, &data, &stat);
    }
    Ok(found.into_name())
}

/// The children of the name's node named as lockrun's requests, slots and
/// windows are; None when the name has no node.
fn lockruns_children(c: &Client, nodes: &Nodes) -> Result<Option<Vec<String>>, CallError> {
    let parent = nodes.parent.clone();
    match c.call(|z| async move { z.list_children(&parent).await }) {
        Ok(children) => Ok(Some(lockruns(children))),
        Err(CallError::Zk(zk::Error::NoNode)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Of a name's node's children, those named as lockrun's requests, slots
/// and windows are.
pub(super) fn lockruns(children: Vec<String>) -> Vec<String> {
    children
        .into_iter()
        .filter(|n| request_of(n).is_some() || slot_of(n).is_some() || window_of(n).is_some())
        .collect()
}

/// The nodes read so far, sorted by what they are.
#[derive(Default)]
struct Found {
    entries: Vec<Entry>,
    windows: Vec<Window>,
    foreign: Vec<String>,
    undecodable: Vec<String>,
    slots: Vec<(u32, String)>,
}

impl Found {
    /// Sort one node read: a slot's holder, a window, a request; or one
    /// left out, or that this lockrun cannot judge.
    fn add(&mut self, node: &str, data: &[u8], stat: &zk::Stat) {
        if let Some(slot) = slot_of(node) {
            self.slots
                .push((slot, String::from_utf8_lossy(data).into_owned()));
            return;
        }
        // A node that is not lockrun's record: another program's, left
        // out; but one named as lockrun's requests and windows are is a
        // holder this lockrun cannot judge.
        let Some(record) = Record::decode(data) else {
            if request_of(node).is_some() || window_of(node).is_some() {
                self.undecodable.push(node.to_string());
            }
            return;
        };
        if window_of(node).is_some() {
            let end = stat.ctime + record.window_ms.unwrap_or(0) as i64;
            self.windows.push(Window {
                node: node.to_string(),
                record,
                version: stat.version,
                end,
            });
            return;
        }
        let Some((id, seq)) = request_of(node) else {
            return;
        };
        self.entries.push(Entry {
            node: node.to_string(),
            id: id.to_string(),
            seq,
            record,
            czxid: stat.czxid.max(0) as u64,
            version: stat.version,
            owner: stat.ephemeral_owner,
            ctime: stat.ctime,
            slot: None,
        });
    }

    /// The name as read: each slot's holder marked on its request.
    fn into_name(mut self) -> Name {
        for (slot, holder) in self.slots {
            if let Some(e) = self.entries.iter_mut().find(|e| e.node == holder) {
                e.slot = Some(slot);
            }
        }
        Name {
            queue: queue::queue(self.entries),
            windows: self.windows,
            foreign: self.foreign,
            undecodable: self.undecodable,
        }
    }
}
