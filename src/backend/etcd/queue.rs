//! A name's queue on etcd, read into types and judged: the keys under
//! `PREFIX NAME/q/` in create-revision order are the holders (the longest
//! run at the front that may hold together) followed by the waiters. Pure:
//! what to do about it is `take.rs`'s.

use serde_json::{Value, json};

use super::client::{int, unb64};
use crate::backend::admit::{self, Place};
use crate::backend::plan::{self, Standing};
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
        let name = encode(name);
        Keys {
            queue: format!("{prefix}{name}/q/"),
            queue_end: format!("{prefix}{name}/q0"),
        }
    }

    pub fn entry(&self, lease: i64) -> String {
        format!("{}{lease:016x}", self.queue)
    }

    /// The mark of kind `kind` beside the request key `key`.
    pub fn mark(key: &str, kind: Mark) -> String {
        format!("{key}{}", kind.suffix())
    }

    /// `key` is a mark beside one of this name's requests: that request's
    /// key and the kind of mark. Only exactly the form `mark` writes.
    pub fn mark_of(&self, key: &str) -> Option<(String, Mark)> {
        [Mark::Preempted, Mark::Replaced]
            .into_iter()
            .find_map(|kind| {
                let request = key.strip_suffix(kind.suffix())?;
                self.holds(request).then(|| (request.to_string(), kind))
            })
    }

    /// `key` is one of this name's requests: the queue's path followed by
    /// a lease id exactly as `entry` writes it. The range holds more when
    /// a longer prefix runs through it (`lockrun:foo/q/` under the name
    /// `foo`): those keys are another prefix's, never this name's.
    pub fn holds(&self, key: &str) -> bool {
        key.strip_prefix(&self.queue).is_some_and(is_lease_id)
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

/// A mark lockrun leaves beside a request's key, on that request's own
/// etcd lease (so it ends with it): `KEY/preempted` on a holder's,
/// `KEY/replaced` on a waiter's whose key a `--supersede` request deleted.
/// Its value is `{"by": "host:pid (label)"}`. A lockrun that knows no
/// marks reads past them: its queue keys are `…/q/` and a lease id alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    Preempted,
    Replaced,
}

impl Mark {
    fn suffix(self) -> &'static str {
        match self {
            Mark::Preempted => "/preempted",
            Mark::Replaced => "/replaced",
        }
    }

    pub fn encode(by: &str) -> String {
        json!({ "by": by }).to_string()
    }

    /// Who a mark's value names; None for anything lockrun does not write.
    pub fn decode(text: &str) -> Option<String> {
        let v: Value = serde_json::from_str(text).ok()?;
        v["by"].as_str().map(String::from)
    }
}

/// A name as a key holds it. A `/` would let one name's range hold
/// another's (`a` and `a/q`): it is written `%2F`, and `%` as `%25`. So a
/// name's part never holds a `/`, which is what keeps the prefixes apart
/// (lockrun-engines(7) "ETCD").
fn encode(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// The name a key's part stands for, only if lockrun writes it so.
fn decode(part: &str) -> Option<String> {
    let name = part.replace("%2F", "/").replace("%25", "%");
    let written = !part.is_empty() && encode(&name) == part && !name.chars().any(char::is_control);
    written.then_some(name)
}

/// A lease id as `Keys::entry` writes it: 16 lower-case hex digits.
fn is_lease_id(text: &str) -> bool {
    text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The lock name a key under `prefix` is a request of. None: not one of
/// lockrun's request keys under this prefix (another program's, or a
/// longer prefix's: its part before the lease id then holds a `/`).
pub fn name_of_key(prefix: &str, key: &str) -> Option<String> {
    let (part, lease) = key.strip_prefix(prefix)?.rsplit_once("/q/")?;
    if !is_lease_id(lease) {
        return None;
    }
    decode(part)
}

/// Whether `key` is a mark beside one of lockrun's request keys under
/// `prefix` (it names no lock of its own).
pub fn is_mark_key(prefix: &str, key: &str) -> bool {
    [Mark::Preempted, Mark::Replaced].into_iter().any(|kind| {
        key.strip_suffix(kind.suffix())
            .is_some_and(|request| name_of_key(prefix, request).is_some())
    })
}

/// Whether `prefix` keeps its names apart from every other accepted
/// prefix's: it ends with `/`, which no name's part holds, or with `:`
/// and holds no other `:` or `/` (the default `lockrun:`). Then no key is
/// written under two (prefix, name) pairs, and no name's range yields
/// another pair's key (lockrun-engines(7) "ETCD").
pub fn prefix_is_apart(prefix: &str) -> bool {
    match prefix.strip_suffix(':') {
        Some(head) => !head.contains([':', '/']),
        None => prefix.ends_with('/'),
    }
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
    /// Asked for `--supersede`: a later request that asks for it too
    /// takes this one's place while it waits.
    pub supersede: bool,
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
            supersede: req.group.supersede,
        }
    }

    pub fn encode(&self) -> String {
        let mut v = json!({
            "owner": self.owner,
            "label": self.label,
            "mode": self.mode.code(),
            "limit": self.mode.limit(),
            "slot": self.slot,
            "granted_ms": self.granted_ms,
            "revoked": self.revoked,
            "min_hold": self.min_hold,
            "token": self.token,
        });
        // Written only when asked for: a record of a request that uses
        // none of the group words reads as every lockrun wrote it.
        if self.supersede {
            v["supersede"] = json!(true);
        }
        v.to_string()
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
            supersede: v["supersede"].as_bool().unwrap_or(false),
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
    /// Marked by a `--preempt` request, shown as `host:pid (label)`: the
    /// mark beside this key, on this key's lease.
    pub preempted_by: Option<String>,
}

impl Entry {
    /// As the join rule and `release --force` see it.
    pub fn standing(&self) -> Standing {
        Standing {
            token: Some(self.token),
            revoked: self.record.revoked,
            preempted: self.preempted_by.is_some(),
            window: self.record.min_hold,
            supersede: self.record.supersede,
        }
    }
}

/// A range reply (or a txn's range response) over `keys` read into the
/// queue, in arrival order, with the revision it was read at.
pub fn entries(keys: &Keys, range: &Value, header: &Value) -> Result<(Vec<Entry>, u64), Error> {
    let revision = int(&header["revision"]).unwrap_or(0).max(0) as u64;
    let kvs = range["kvs"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    Ok((queue_of(keys, kvs)?, revision))
}

/// The key-values of a range over `keys` (or any that holds all of the
/// name's keys, in any order) read into the queue, in arrival order.
pub fn queue_of(keys: &Keys, kvs: &[Value]) -> Result<Vec<Entry>, Error> {
    let mut preempted = std::collections::HashMap::new();
    for kv in kvs {
        let key = unb64(&kv["key"]).unwrap_or_default();
        if let Some((request, Mark::Preempted)) = keys.mark_of(&key) {
            let value = unb64(kv.get("value").unwrap_or(&json!(""))).unwrap_or_default();
            if let Some(by) = Mark::decode(&value) {
                preempted.insert(request, (by, int(&kv["lease"]).unwrap_or(0)));
            }
        }
    }
    let mut out = Vec::new();
    for kv in kvs {
        let key = unb64(&kv["key"]).unwrap_or_default();
        if !keys.holds(&key) {
            continue;
        }
        // An empty value comes without the field at all.
        let value = unb64(kv.get("value").unwrap_or(&json!(""))).unwrap_or_default();
        let record = Record::decode(&value).ok_or_else(|| {
            Error::Refused(format!(
                "the key {key:?} is not a lockrun lease: remove it or choose another --prefix"
            ))
        })?;
        let mod_rev = int(&kv["mod_revision"]).unwrap_or(0).max(0) as u64;
        let lease = int(&kv["lease"]).unwrap_or(0);
        // A mark counts only on the lease the key is on now: one left on
        // a lease the key moved off (a --min-hold window's) is not its.
        let preempted_by = preempted
            .remove(&key)
            .filter(|(_, on)| *on == lease && lease != 0)
            .map(|(by, _)| by);
        out.push(Entry {
            key,
            created: int(&kv["create_revision"]).unwrap_or(0).max(0) as u64,
            token: record.token.unwrap_or(mod_rev),
            mod_rev,
            lease,
            value,
            record,
            preempted_by,
        });
    }
    out.sort_by_key(|e| e.created);
    Ok(out)
}

/// Who replaced the request whose key was `key`, by the mark a
/// `--supersede` request left in its place (in a range reply over `keys`).
pub fn replaced_by(keys: &Keys, range: &Value, key: &str) -> Option<String> {
    let kvs = range["kvs"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    kvs.iter().find_map(|kv| {
        let k = unb64(&kv["key"]).unwrap_or_default();
        match keys.mark_of(&k) {
            Some((request, Mark::Replaced)) if request == key => {
                Mark::decode(&unb64(kv.get("value").unwrap_or(&json!(""))).unwrap_or_default())
            }
            _ => None,
        }
    })
}

/// The queue as the admission rule sees it: etcd keeps no holders apart
/// from its queue, so every key is a place in arrival order.
fn places(queue: &[Entry], req: &Request) -> Vec<Place> {
    queue
        .iter()
        .map(|e| Place {
            mode: e.record.mode,
            slot: e.record.slot,
            window: e.record.min_hold,
            outer: req.is_own_outer_holder(Some(&e.record.label)),
            ours: false,
        })
        .collect()
}

/// How many at the front of the queue hold the name: those the admission
/// rule lets in one by one in arrival order.
pub fn holders(queue: &[Entry]) -> usize {
    let places: Vec<Place> = queue.iter().map(|e| Place::new(e.record.mode)).collect();
    admit::front(&[], &places)
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
    match admit::admit(&[], &places(queue, req), req.mode, Some(me)) {
        admit::Verdict::Hold { .. } => return Verdict::Granted,
        // No holders apart from the queue, so no grant of ours among them.
        admit::Verdict::Ours(_) => return Verdict::Granted,
        admit::Verdict::Nested => return Verdict::Nested,
        admit::Verdict::Disagrees(mode) => return Verdict::Disagrees(mode),
        admit::Verdict::Wait(_) => {}
    }
    // Watch the keys whose going could let us in.
    let ahead: Vec<Mode> = queue[..me].iter().map(|e| e.record.mode).collect();
    let watch = plan::watch(&ahead, req.mode)
        .into_iter()
        .map(|i| queue[i].key.clone())
        .collect();
    Verdict::Blocked {
        watch,
        holder: queue.first().map(|e| e.record.shown()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::client::b64;
    use super::*;
    use crate::backend::Owner;
    use crate::schedule::Timing;
    use std::time::Duration;

    #[test]
    fn request_keys_name_their_lock() {
        for name in ["job", "a/q/b", "50%", "%2F", "x:y"] {
            let keys = Keys::new("lockrun:", name);
            let key = keys.entry(7);
            assert_eq!(
                name_of_key("lockrun:", &key).as_deref(),
                Some(name),
                "{key}"
            );
            assert!(keys.holds(&key));
        }
        // The layout of the default prefix and plain names, as every
        // earlier lockrun wrote it: an old and a new one exclude each other.
        assert_eq!(
            Keys::new("lockrun:", "db:migrate").entry(0x694d_8b2c_11a0_0f3e),
            "lockrun:db:migrate/q/694d8b2c11a00f3e"
        );
        for foreign in [
            "lockrun:team/job/q/0000000000000001",
            "other/job/q/0000000000000001",
            "lockrun:job/q/1",
            "lockrun:job/q/000000000000000G",
            "lockrun:job/q/0000000000000001/x",
            "lockrun:bad%ZZenc/q/0000000000000005",
            "lockrun:bad%2fenc/q/0000000000000005",
            "lockrun:/q/0000000000000005",
            "lockrun:a\u{1}b/q/0000000000000005",
        ] {
            assert_eq!(name_of_key("lockrun:", foreign), None, "{foreign}");
        }
    }

    #[test]
    fn prefixes_that_end_where_no_name_can_are_apart() {
        for ok in [
            "lockrun:",
            "team:",
            "a/",
            "a/b/",
            "lockrun:foo/q/",
            "x:y/",
            "/",
        ] {
            assert!(prefix_is_apart(ok), "{ok}");
        }
        for bad in ["", "lockrun", "lockrun:a", "team:x:", "a/b:", "a/b", ":x:"] {
            assert!(!prefix_is_apart(bad), "{bad}");
        }
    }

    /// No key is written under two (prefix, name) pairs, no name's range
    /// yields another pair's key, and no listing names another pair's key,
    /// for every accepted prefix among some that come close and every
    /// short name of the characters that matter.
    #[test]
    fn no_two_prefixes_and_names_share_a_key() {
        let prefixes: Vec<&str> = [
            "",
            "lockrun:",
            "lockrun",
            "lockrun:a",
            "lockrun:foo/q/",
            "lockrun:foo/",
            "team:",
            "team:x:",
            "a/",
            "a/b/",
            "a/b/q/",
            "a/q/",
            "a:b/",
            "a/b:",
            "%/",
            "q/",
            "/",
        ]
        .into_iter()
        .filter(|p| prefix_is_apart(p))
        .collect();
        let alphabet = ["a", "b", "q", ":", "/", "%", "2", "F"];
        let mut names: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
        for _ in 0..2 {
            let longer: Vec<String> = names
                .iter()
                .flat_map(|n| alphabet.iter().map(move |c| format!("{n}{c}")))
                .collect();
            names.extend(longer);
        }
        names.sort();
        names.dedup();
        let pairs: Vec<(&str, &str, Keys)> = prefixes
            .iter()
            .flat_map(|p| names.iter().map(move |n| (*p, n.as_str(), Keys::new(p, n))))
            .collect();
        for (p1, n1, k1) in &pairs {
            let key = k1.entry(0x7);
            for p2 in &prefixes {
                let named = name_of_key(p2, &key);
                let want = (p2 == p1).then_some(*n1);
                assert_eq!(named.as_deref(), want, "{key:?} listed under {p2:?}");
            }
            for (p2, n2, k2) in &pairs {
                if (p1, n1) != (p2, n2) {
                    assert!(!k2.holds(&key), "{p2:?} {n2:?} holds {p1:?} {n1:?}");
                }
            }
        }
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
            supersede: false,
        };
        Entry {
            key: format!("k{i}"),
            created: i,
            token: i,
            mod_rev: i,
            lease: i as i64,
            value: record.encode(),
            record,
            preempted_by: None,
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
            group: Default::default(),
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

    /// Marks sit beside a request's key in its name's range. A reader that
    /// knows no marks (every earlier lockrun: `Keys::holds` and
    /// `name_of_key` are what it parses) takes none for a request or a
    /// name; this one reads them only in exactly the form it writes.
    #[test]
    fn marks_are_no_requests_and_belong_to_their_key_alone() {
        let keys = Keys::new("lockrun:", "job");
        let key = keys.entry(0x7);
        for kind in [Mark::Preempted, Mark::Replaced] {
            let mark = Keys::mark(&key, kind);
            assert!(mark.starts_with(&keys.queue) && mark < keys.queue_end);
            assert!(!keys.holds(&mark), "{mark}");
            assert_eq!(name_of_key("lockrun:", &mark), None, "{mark}");
            assert!(is_mark_key("lockrun:", &mark));
            assert_eq!(keys.mark_of(&mark), Some((key.clone(), kind)));
            // Another prefix running through the range has none of them.
            let longer = Keys::new("lockrun:job/q/", "0000000000000007");
            assert_eq!(longer.mark_of(&mark), None);
        }
        for foreign in [
            format!("{key}/preempted/x"),
            format!("{key}/other"),
            format!("{}1/preempted", keys.queue),
            format!("{key}preempted"),
        ] {
            assert_eq!(keys.mark_of(&foreign), None, "{foreign}");
            assert!(!is_mark_key("lockrun:", &foreign), "{foreign}");
        }
        // A range holding a holder, its mark and a waiter's replaced mark.
        let holder = entry(1, X);
        let kv = |k: &str, v: &str, lease: i64, rev: u64| {
            json!({"key": b64(k), "value": b64(v), "lease": lease.to_string(),
                   "create_revision": rev.to_string(), "mod_revision": rev.to_string()})
        };
        let hk = keys.entry(1);
        let wk = keys.entry(2);
        let range = json!({"kvs": [
            kv(&hk, &holder.value, 1, 1),
            kv(&Keys::mark(&hk, Mark::Preempted), &Mark::encode("h:9 (new)"), 1, 3),
            kv(&Keys::mark(&wk, Mark::Replaced), &Mark::encode("h:8"), 5, 4),
        ]});
        let (q, _) = entries(&keys, &range, &json!({"revision": "4"})).unwrap();
        assert_eq!(q.len(), 1);
        assert_eq!(q[0].preempted_by.as_deref(), Some("h:9 (new)"));
        assert_eq!(replaced_by(&keys, &range, &wk).as_deref(), Some("h:8"));
        assert_eq!(replaced_by(&keys, &range, &hk), None);
        // A mark on a lease the key is no longer on is not its.
        let moved = json!({"kvs": [
            kv(&hk, &holder.value, 2, 1),
            kv(&Keys::mark(&hk, Mark::Preempted), &Mark::encode("h:9"), 1, 3),
        ]});
        let (q, _) = entries(&keys, &moved, &json!({})).unwrap();
        assert_eq!(q[0].preempted_by, None);
    }

    #[test]
    fn supersede_is_stored_only_when_asked_for() {
        let mut r = entry(1, X).record;
        assert!(!r.encode().contains("supersede"));
        r.supersede = true;
        assert_eq!(Record::decode(&r.encode()), Some(r));
    }

    #[test]
    fn names_cannot_reach_into_each_other_s_keys() {
        let a = Keys::new("p:", "a");
        let aq = Keys::new("p:", "a/q");
        assert!(!aq.entry(1).starts_with(&a.queue), "{}", aq.entry(1));
        assert_eq!(Keys::new("p:", "50%").queue, "p:50%25/q/");
        // A longer prefix runs through a name's range: its keys are not the name's.
        let foo = Keys::new("lockrun:", "foo");
        let bar = Keys::new("lockrun:foo/q/", "bar").entry(1);
        assert!(bar.starts_with(&foo.queue) && !foo.holds(&bar), "{bar}");
    }
}
