//! A name's queue on etcd, read into types and judged: the keys under
//! `PREFIX NAME/q/` in create-revision order are the holders (the longest
//! run at the front that may hold together) followed by the waiters. Pure:
//! what to do about it is `take.rs`'s.

use serde_json::{Value, json};

use super::client::{int, unb64};
use crate::backend::{Error, Mode, Request};

/// Every key of one name.
#[derive(Debug, Clone)]
pub struct Keys {
    /// `PREFIX NAME/q/`: a request's key is this followed by a lease id.
    pub queue: String,
    /// Just past every queue key (`/` + 1 is `0`), for ranges.
    pub queue_end: String,
}

impl Keys {
    pub fn new(prefix: &str, name: &str) -> Keys {
        // A `/` in the name would let one name's range hold another's
        // (`a` and `a/q`): it is written `%2F`, and `%` as `%25`.
        let name = name.replace('%', "%25").replace('/', "%2F");
        Keys {
            queue: format!("{prefix}{name}/q/"),
            queue_end: format!("{prefix}{name}/q0"),
        }
    }

    pub fn entry(&self, lease: i64) -> String {
        format!("{}{lease:016x}", self.queue)
    }

    /// A range request over the queue in arrival order.
    pub fn range(&self) -> Value {
        json!({
            "key": super::client::b64(&self.queue),
            "range_end": super::client::b64(&self.queue_end),
            "sort_target": "CREATE",
            "sort_order": "ASCEND",
        })
    }
}

/// The lock name a key under `prefix` is a request of (None: not one of
/// lockrun's request keys, or one under a longer prefix).
pub fn name_of_key(prefix: &str, key: &str) -> Option<String> {
    let (encoded, lease) = key.strip_prefix(prefix)?.split_once("/q/")?;
    if encoded.is_empty() || encoded.contains('/') || lease.is_empty() {
        return None;
    }
    Some(encoded.replace("%2F", "/").replace("%25", "%"))
}

/// What a request's key holds: who, in which mode, since when, and (once
/// revoked) that it no longer proves anyone's ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The owner's secret; empty once revoked.
    pub owner: String,
    pub label: String,
    pub mode: Mode,
    pub slot: Option<u32>,
    /// When it was granted, in ms of the holder's wall clock (0 while it waits):
    /// only for `status`'s "held for".
    pub granted_ms: u64,
    pub revoked: bool,
    /// Kept by `--min-hold` after its job ended: no owner, on a lease of
    /// its own that ends with the window.
    pub min_hold: bool,
    /// The token of a revoked grant (or one kept by `--min-hold`): the
    /// write that changed it moved the key's mod revision, which was the
    /// token.
    pub token: Option<u64>,
}

impl Record {
    pub fn new(req: &Request) -> Record {
        Record {
            owner: req.owner.secret.clone(),
            label: req.owner.shown.clone(),
            mode: req.mode,
            slot: None,
            granted_ms: 0,
            revoked: false,
            min_hold: false,
            token: None,
        }
    }

    pub fn encode(&self) -> String {
        json!({
            "owner": self.owner,
            "label": self.label,
            "mode": self.mode.code(),
            "limit": self.mode.limit(),
            "slot": self.slot,
            "granted_ms": self.granted_ms,
            "revoked": self.revoked,
            "min_hold": self.min_hold,
            "token": self.token,
        })
        .to_string()
    }

    pub fn decode(text: &str) -> Option<Record> {
        let v: Value = serde_json::from_str(text).ok()?;
        let limit = v["limit"]
            .as_u64()
            .map(|n| n.clamp(1, u64::from(u32::MAX)) as u32);
        let mode = match v["mode"].as_str()? {
            m @ ("x" | "s" | "n") => Mode::from_code(m, limit),
            _ => return None,
        };
        Some(Record {
            owner: v["owner"].as_str()?.to_string(),
            label: v["label"].as_str()?.to_string(),
            mode,
            slot: v["slot"].as_u64().map(|s| s as u32),
            granted_ms: v["granted_ms"].as_u64().unwrap_or(0),
            revoked: v["revoked"].as_bool().unwrap_or(false),
            min_hold: v["min_hold"].as_bool().unwrap_or(false),
            token: v["token"].as_u64(),
        })
    }

    /// Who holds the place, as waiting lines name it.
    pub fn shown(&self) -> String {
        if self.min_hold {
            return format!("the min-hold window of {}", self.label);
        }
        self.label.clone()
    }

    /// The same grant (its token `token`) once its job ended within its
    /// `--min-hold` window: it proves no one's ownership.
    pub fn kept(&self, token: u64) -> Record {
        Record {
            owner: String::new(),
            min_hold: true,
            token: Some(token),
            ..self.clone()
        }
    }

    /// The same grant (its token `token`), revoked by `release --force`.
    pub fn revoked(&self, token: u64) -> Record {
        Record {
            owner: String::new(),
            revoked: true,
            token: Some(token),
            ..self.clone()
        }
    }
}

/// One key of the queue.
#[derive(Debug, Clone)]
pub struct Entry {
    pub key: String,
    /// The key's create revision: its place in the queue.
    pub created: u64,
    /// A holder's token: the revision of the write that granted it (its
    /// create, or the transaction that promoted it), so a later grant
    /// always has a higher one, whatever the order of arrival.
    pub token: u64,
    pub mod_rev: u64,
    pub lease: i64,
    /// The value exactly as stored (ownership is checked against it).
    pub value: String,
    pub record: Record,
}

/// A range reply (or a txn's range response) read into the queue, in
/// arrival order, with the revision it was read at.
pub fn entries(range: &Value, header: &Value) -> Result<(Vec<Entry>, u64), Error> {
    let revision = int(&header["revision"]).unwrap_or(0).max(0) as u64;
    let mut out = Vec::new();
    for kv in range["kvs"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let key = unb64(&kv["key"]).unwrap_or_default();
        // An empty value comes without the field at all.
        let value = unb64(kv.get("value").unwrap_or(&json!(""))).unwrap_or_default();
        let record = Record::decode(&value).ok_or_else(|| {
            Error::Refused(format!(
                "the key {key} is not a lockrun lease: remove it or choose another --prefix"
            ))
        })?;
        let mod_rev = int(&kv["mod_revision"]).unwrap_or(0).max(0) as u64;
        out.push(Entry {
            key,
            created: int(&kv["create_revision"]).unwrap_or(0).max(0) as u64,
            token: record.token.unwrap_or(mod_rev),
            mod_rev,
            lease: int(&kv["lease"]).unwrap_or(0),
            value,
            record,
        });
    }
    out.sort_by_key(|e| e.created);
    Ok((out, revision))
}

/// How many at the front of the queue hold the name: the first request
/// sets the mode in force; readers hold together up to the first writer;
/// `--limit N` holds the first N that agree with it.
pub fn holders(queue: &[Entry]) -> usize {
    let Some(first) = queue.first() else {
        return 0;
    };
    let head = first.record.mode;
    match head {
        Mode::Exclusive => 1,
        Mode::Shared => queue
            .iter()
            .take_while(|e| e.record.mode == Mode::Shared)
            .count(),
        Mode::Limit(n) => queue
            .iter()
            .take(n as usize)
            .take_while(|e| e.record.mode == head)
            .count(),
    }
}

/// What a request at place `me` in the queue may do.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Granted,
    /// Wait for one of these keys to go, with the first holder's label.
    Blocked {
        watch: Vec<String>,
        holder: Option<String>,
    },
    /// The holders hold the name in this other mode.
    Disagrees(Mode),
    /// The outer lockrun holds it.
    Nested,
}

pub fn judge(queue: &[Entry], me: usize, req: &Request) -> Verdict {
    let held = holders(queue);
    let others = queue[..held].iter().enumerate().filter(|(i, _)| *i != me);
    for (_, e) in others.clone() {
        // Run from inside a job holding this name: any wait would be for ourselves.
        if req.is_own_outer_holder(Some(&e.record.label)) {
            return Verdict::Nested;
        }
    }
    if me < held {
        return Verdict::Granted;
    }
    if let Some((_, e)) = others
        .clone()
        .find(|(_, e)| !req.mode.agrees_with(e.record.mode))
    {
        return Verdict::Disagrees(e.record.mode);
    }
    // Watch the keys whose going could let us in: never the whole queue
    // (no herd), never too few (no missed turn).
    let ahead = &queue[..me];
    let blocking = |e: &Entry| match req.mode {
        Mode::Exclusive => true,
        Mode::Shared => e.record.mode != Mode::Shared,
        Mode::Limit(_) => e.record.mode != req.mode,
    };
    let mut watch: Vec<String> = Vec::new();
    if let Some(e) = ahead.iter().rev().find(|e| blocking(e)) {
        watch.push(e.key.clone());
    }
    if let Mode::Limit(n) = req.mode {
        // Any of the N just ahead going moves us up to a free place; one
        // further ahead going moves them up with us.
        for e in ahead.iter().rev().take(n as usize) {
            if !watch.contains(&e.key) {
                watch.push(e.key.clone());
            }
        }
    }
    Verdict::Blocked {
        watch,
        holder: queue.first().map(|e| e.record.shown()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Owner;
    use crate::schedule::Timing;
    use std::time::Duration;

    #[test]
    fn request_keys_name_their_lock() {
        for name in ["job", "a/q/b", "50%", "%2F"] {
            let keys = Keys::new("lockrun:", name);
            let key = keys.entry(7);
            assert_eq!(
                name_of_key("lockrun:", &key).as_deref(),
                Some(name),
                "{key}"
            );
        }
        assert_eq!(name_of_key("lockrun:", "lockrun:team/job/q/1"), None);
        assert_eq!(name_of_key("lockrun:", "other/job/q/1"), None);
    }

    fn entry(i: u64, mode: Mode) -> Entry {
        let record = Record {
            owner: format!("o{i}"),
            label: format!("h:{i}"),
            mode,
            slot: None,
            granted_ms: 0,
            revoked: false,
            min_hold: false,
            token: None,
        };
        Entry {
            key: format!("k{i}"),
            created: i,
            token: i,
            mod_rev: i,
            lease: i as i64,
            value: record.encode(),
            record,
        }
    }

    fn verdict(modes: &[Mode], me: usize, outer: Option<&str>) -> Verdict {
        let owner = Owner::new(None).unwrap();
        let req = Request {
            name: "n",
            owner: &owner,
            timing: Timing::new(Duration::from_secs(3), None).unwrap(),
            mode: modes[me],
            outer: outer.map(String::from),
            inherited_fd: None,
            quiet: true,
            min_hold: None,
        };
        let q: Vec<Entry> = modes
            .iter()
            .enumerate()
            .map(|(i, m)| entry(i as u64 + 1, *m))
            .collect();
        judge(&q, me, &req)
    }

    fn watching(v: Verdict) -> Vec<String> {
        match v {
            Verdict::Blocked { mut watch, .. } => {
                watch.sort();
                watch
            }
            other => panic!("{other:?}"),
        }
    }

    use Mode::{Exclusive as X, Limit, Shared as S};

    #[test]
    fn holders_are_the_front_of_the_queue_that_may_hold_together() {
        assert_eq!(verdict(&[X], 0, None), Verdict::Granted);
        assert_eq!(watching(verdict(&[X, X, X], 2, None)), ["k2"]);
        assert_eq!(verdict(&[S, S, S], 2, None), Verdict::Granted);
        // A reader behind a waiting writer waits for the writer, not the readers.
        assert_eq!(watching(verdict(&[S, S, X, S, S], 4, None)), ["k3"]);
        assert_eq!(watching(verdict(&[S, S, X], 2, None)), ["k2"]);
        let l = Limit(2);
        assert_eq!(verdict(&[l, l], 1, None), Verdict::Granted);
        assert_eq!(watching(verdict(&[l, l, l, l], 3, None)), ["k2", "k3"]);
    }

    #[test]
    fn requests_that_disagree_or_nest_are_refused() {
        assert_eq!(
            verdict(&[Limit(2), X], 1, None),
            Verdict::Disagrees(Limit(2))
        );
        assert_eq!(
            verdict(&[Limit(2), Limit(3)], 1, None),
            Verdict::Disagrees(Limit(2))
        );
        assert_eq!(verdict(&[X, Limit(2)], 1, None), Verdict::Disagrees(X));
        // Nested: refused even where it could be granted beside the outer holder.
        assert_eq!(verdict(&[S, S], 1, Some("h:1")), Verdict::Nested);
        assert_eq!(verdict(&[X, X], 1, Some("h:1")), Verdict::Nested);
        assert_eq!(watching(verdict(&[X, X], 1, Some("h:9"))), ["k1"]);
    }

    #[test]
    fn records_survive_the_store_and_foreign_values_do_not_parse() {
        let mut r = entry(1, Limit(4)).record;
        r.slot = Some(3);
        assert_eq!(Record::decode(&r.encode()), Some(r.clone()));
        let revoked = Record::decode(&r.revoked(7).encode()).unwrap();
        assert!(revoked.revoked && revoked.token == Some(7));
        assert_eq!(Record::decode("hello"), None);
        assert_eq!(Record::decode("{\"mode\":\"q\"}"), None);
    }

    #[test]
    fn names_cannot_reach_into_each_other_s_keys() {
        let a = Keys::new("p:", "a");
        let aq = Keys::new("p:", "a/q");
        assert!(!aq.entry(1).starts_with(&a.queue), "{}", aq.entry(1));
        assert_eq!(Keys::new("p:", "50%").queue, "p:50%25/q/");
    }
}
