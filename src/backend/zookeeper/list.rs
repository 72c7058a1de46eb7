//! Reading names for `status`, a batch at a time: each step's requests for
//! every name of the batch are sent before the first reply is awaited, so
//! that a listing of thousands of names costs a few round trips a batch,
//! not several a name. Each name is judged as `status` of it alone would
//! be: the same refusals, the same holders and waiters.

use futures_util::future::{join, join_all};
use zookeeper_client as zk;

use super::client::{CallError, Client, sort};
use super::queue::Nodes;
use super::read::{self, lockruns};
use super::{Name, in_the_way, judgeable};
use crate::backend::plan::Read;
use crate::backend::{Error, Status};

/// Names read together when listing: a batch is a few hundred requests
/// (the server reads no more from a connection while 1,000 are
/// outstanding, and takes the rest as it catches up).
const BATCH: usize = 500;

/// Nodes one multi-read asks the data of, at most: its request stays far
/// below the server's bound on one (jute.maxbuffer, 1 MB by default). A
/// name with more has a multi-read of its own: each name's nodes are read
/// in one, as `status` of that name alone reads them.
const READ_AT_ONCE: usize = 1000;

type AclReply = Result<(Vec<zk::Acl>, zk::Stat), zk::Error>;
type ChildrenReply = Result<Vec<String>, zk::Error>;
type MultiReply = Result<Vec<zk::MultiReadResult>, zk::Error>;
/// A name's children to read; None: it has no node.
type Wanted = Result<Option<Vec<String>>, CallError>;

/// Each name's status, the names read together: their nodes' ACLs and
/// children, then their children's data, then the server's clock for
/// those with `--min-hold` windows. A name refused is its own error; a
/// call that fails for the batch is the batch's.
pub(super) fn statuses(
    c: &Client,
    root: &str,
    names: &[String],
) -> Result<Vec<Result<Status, CallError>>, CallError> {
    statuses_within(c, root, names, super::READS_AGAIN)
}

/// `statuses`, reading again up to `again` times each name whose node went
/// before its clock was read (see `super::READS_AGAIN`).
fn statuses_within(
    c: &Client,
    root: &str,
    names: &[String],
    again: u32,
) -> Result<Vec<Result<Status, CallError>>, CallError> {
    let nodes: Vec<Nodes> = names.iter().map(|n| Nodes::new(root, n)).collect();
    let wanted = first_looks(c, &nodes)?
        .into_iter()
        .zip(&nodes)
        .map(|((acl, children), n)| to_read(c, n, acl, children))
        .collect();
    let read = read_all(c, &nodes, wanted)?;
    let nows = clocks(c, &nodes, &read)?;
    let mut out = Vec::with_capacity(names.len());
    for ((name, now), asked) in read.into_iter().zip(nows).zip(names) {
        if again > 0 && matches!(now, Some(Err(CallError::Zk(zk::Error::NoNode)))) {
            let name = std::slice::from_ref(asked);
            out.extend(statuses_within(c, root, name, again - 1)?);
            continue;
        }
        out.push(name.and_then(|mut name| {
            // No windows: no clock needed.
            let now = now.transpose()?.unwrap_or(0);
            name.in_force(now);
            Ok(name.status(now))
        }));
    }
    Ok(out)
}

/// Each name's node's ACL (a request each: a multi-read cannot ask for
/// one) and children (one multi-read for them all).
fn first_looks(c: &Client, nodes: &[Nodes]) -> Result<Vec<(AclReply, ChildrenReply)>, CallError> {
    let parents: Vec<String> = nodes.iter().map(|n| n.parent.clone()).collect();
    let (acls, children) = c.call(|z| async move {
        let acls = join_all(parents.iter().map(|p| z.get_acl(p)));
        let children = async {
            let mut r = z.new_multi_reader();
            for p in &parents {
                r.add_get_children(p)?;
            }
            r.commit().await
        };
        Ok(join(acls, children).await)
    })?;
    let children = each(nodes.len(), children, |r| match r {
        zk::MultiReadResult::Children { children } => Ok(children),
        zk::MultiReadResult::Error { err } => Err(err),
        _ => Err(zk::Error::UnexpectedError(
            "no children in the reply".into(),
        )),
    });
    Ok(acls.into_iter().zip(children).collect())
}

/// The `n` results of a multi-read, each as `f` takes it: the multi-read's
/// failure is each one's, and a result missing from the reply is an error
/// (every name has its own).
fn each<T>(
    n: usize,
    reply: MultiReply,
    f: impl Fn(zk::MultiReadResult) -> Result<T, zk::Error>,
) -> Vec<Result<T, zk::Error>> {
    let mut results = reply.map(Vec::into_iter);
    (0..n)
        .map(|_| match &mut results {
            Ok(rs) => rs.next().map(&f).unwrap_or_else(|| {
                Err(zk::Error::UnexpectedError(
                    "a result missing from the reply".into(),
                ))
            }),
            Err(e) => Err(e.clone()),
        })
        .collect()
}

/// What a name's first look says: refused when what stands at its place
/// is not this identity's to queue under, None when it has no node, else
/// its children to read.
fn to_read(c: &Client, nodes: &Nodes, acl: AclReply, children: ChildrenReply) -> Wanted {
    if let Some(w) = in_the_way(c, nodes, acl)? {
        return Err(CallError::Refused(w.line()));
    }
    match children {
        Ok(children) => Ok(Some(lockruns(children))),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(CallError::Zk(e)),
    }
}

/// Each name read from its children's data (one multi-read a name), and
/// refused if it holds what this lockrun cannot judge.
fn read_all(
    c: &Client,
    nodes: &[Nodes],
    wanted: Vec<Wanted>,
) -> Result<Vec<Result<Name, CallError>>, CallError> {
    let replies = children_data(c, nodes, &wanted)?;
    Ok(wanted
        .into_iter()
        .zip(replies)
        .zip(nodes)
        .map(|((w, reply), n)| {
            let name = match (w?, reply) {
                (Some(w), Some(reply)) => read::name_of(&w, reply.map_err(CallError::Zk)?)?,
                // No node, or none of lockrun's in it.
                _ => Name::default(),
            };
            judgeable(n, &name, None)?;
            Ok(name)
        })
        .collect())
}

/// The data of each name's children to read (None for a name with none,
/// or refused already), names packed into multi-reads of `READ_AT_ONCE`
/// nodes.
fn children_data(
    c: &Client,
    nodes: &[Nodes],
    wanted: &[Wanted],
) -> Result<Vec<Option<MultiReply>>, CallError> {
    let paths: Vec<Vec<String>> = wanted
        .iter()
        .zip(nodes)
        .map(|(w, n)| match w {
            Ok(Some(w)) => w.iter().map(|node| n.child(node)).collect(),
            _ => Vec::new(),
        })
        .collect();
    let counts: Vec<usize> = paths.iter().map(Vec::len).collect();
    if counts.iter().all(|&n| n == 0) {
        return Ok(counts.iter().map(|_| None).collect());
    }
    let groups = packed(&counts);
    let asked = groups.clone();
    let replies: Vec<MultiReply> = c.call(|z| async move {
        let asked = asked.into_iter().map(|g| {
            let reply = read::data(&z, &paths[g].concat());
            async move { reply?.await }
        });
        Ok(join_all(asked).await)
    })?;
    // Each group's results in the order asked: its names' in turn.
    let mut out = Vec::with_capacity(counts.len());
    for (g, reply) in groups.into_iter().zip(replies) {
        let mut results = reply.map(Vec::into_iter);
        for &n in &counts[g] {
            out.push((n > 0).then(|| match &mut results {
                Ok(rs) => Ok(rs.by_ref().take(n).collect()),
                Err(e) => Err(e.clone()),
            }));
        }
    }
    Ok(out)
}

/// Consecutive names whose nodes (`counts` a name) one multi-read asks
/// for: up to `READ_AT_ONCE` nodes, or one name that has more alone.
fn packed(counts: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let (mut start, mut nodes) = (0, 0);
    for (i, &n) in counts.iter().enumerate() {
        if nodes > 0 && nodes + n > READ_AT_ONCE {
            groups.push(start..i);
            (start, nodes) = (i, 0);
        }
        nodes += n;
    }
    groups.push(start..counts.len());
    groups
}

/// The server's clock (ms) for each name read with `--min-hold` windows,
/// by an empty write to its node (see `server_now`); None for the others.
fn clocks(
    c: &Client,
    nodes: &[Nodes],
    read: &[Result<Name, CallError>],
) -> Result<Vec<Option<Result<i64, CallError>>>, CallError> {
    let parents: Vec<Option<String>> = read
        .iter()
        .zip(nodes)
        .map(|(name, n)| {
            let windows = name.as_ref().is_ok_and(|name| !name.windows.is_empty());
            windows.then(|| n.parent.clone())
        })
        .collect();
    if parents.iter().all(Option::is_none) {
        return Ok(parents.iter().map(|_| None).collect());
    }
    let stats = c.call(|z| async move {
        let asked = parents.iter().map(|p| {
            let reply = p.as_ref().map(|p| z.set_data(p, b"", None));
            async move {
                match reply {
                    Some(reply) => Some(reply.await),
                    None => None,
                }
            }
        });
        Ok(join_all(asked).await)
    })?;
    Ok(stats
        .into_iter()
        .map(|s| s.map(|s| s.map(|s| s.mtime).map_err(CallError::Zk)))
        .collect())
}

/// A listing's reads, a batch ahead: the name asked for is read with the
/// names after it.
pub(super) struct Ahead {
    c: Client,
    root: String,
    /// The URL as messages show it.
    shown: String,
    names: Vec<String>,
    /// Where the batch read last starts in `names`, and each name's read
    /// (taken once).
    start: usize,
    read: Vec<Option<Result<Read, Error>>>,
}

impl Ahead {
    pub(super) fn new(c: Client, root: &str, shown: &str, names: Vec<String>) -> Ahead {
        Ahead {
            c,
            root: root.to_string(),
            shown: shown.to_string(),
            names,
            start: 0,
            read: Vec::new(),
        }
    }

    /// What the listing says of the `i`th name.
    pub(super) fn read(&mut self, i: usize) -> Result<Read, Error> {
        if !(self.start..self.start + self.read.len()).contains(&i) {
            self.fetch(i)?;
        }
        self.read[i - self.start]
            .take()
            .unwrap_or_else(|| Err(Error::Internal(format!("{} read twice", self.names[i]))))
    }

    /// Read the batch of names from the `i`th on.
    fn fetch(&mut self, i: usize) -> Result<(), Error> {
        let batch = &self.names[i..(i + BATCH).min(self.names.len())];
        let doing = |what: &str| format!("reading {what} on {}", self.shown);
        let read = statuses(&self.c, &self.root, batch).map_err(|e| {
            let what = format!("{} and the {} names after it", batch[0], batch.len() - 1);
            sort(e, &doing(&what))
        })?;
        self.start = i;
        self.read = batch
            .iter()
            .zip(read)
            .map(|(name, st)| Some(listed(st.map_err(|e| sort(e, &doing(name))))))
            .collect();
        Ok(())
    }
}

/// What the listing says of a name as read: a name this identity may not
/// read (another identity's, or a node that is not lockrun's at its
/// place) is marked, and the others are still listed.
fn listed(st: Result<Status, Error>) -> Result<Read, Error> {
    match st {
        Ok(st) if st.holders.is_empty() && st.waiters.unwrap_or(0) == 0 => Ok(Read::Empty),
        Ok(st) => Ok(Read::Listed(st)),
        Err(Error::Refused(why)) => Ok(Read::Unreadable(why)),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_packed_whole_into_multi_reads() {
        assert_eq!(packed(&[0, 1, 0]), vec![0..3]);
        assert_eq!(packed(&[600, 400, 1]), vec![0..2, 2..3]);
        // A name with more than one multi-read's worth is read alone.
        assert_eq!(packed(&[1, 2500, 0, 3]), vec![0..1, 1..2, 2..4]);
        assert_eq!(packed(&[2500]), vec![0..1]);
        assert_eq!(packed(&[]), vec![0..0]);
    }
}
