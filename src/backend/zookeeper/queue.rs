//! A name's nodes on ZooKeeper, read into types: where a prefix and a name
//! live, a request node's name (a unique part, then ZooKeeper's sequence
//! number) and its record, and who of the queue holds.

use serde_json::{Value, json};

use crate::backend::admit::{self, Place};
use crate::backend::plan::{self, Standing};
use crate::backend::{Error, Mode, Request};

/// The node `--prefix` names: `/` and the prefix less one trailing `:`
/// (the default `lockrun:` is `/lockrun`): one plain node name, so that
/// two prefixes are two siblings and no name under one is under another.
pub fn root_of(prefix: &str) -> Result<String, Error> {
    let node = prefix.strip_suffix(':').unwrap_or(prefix);
    let plain = !node.is_empty()
        && node != "."
        && node != ".."
        && node != "zookeeper"
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if plain {
        return Ok(format!("/{node}"));
    }
    let shown: String = prefix.chars().take(60).collect();
    Err(Error::Request(format!(
        "invalid --prefix {shown:?} for ZooKeeper: letters, digits, '.', '-' and '_', \
         perhaps followed by ':' (as the default lockrun:), naming one node under the chroot"
    )))
}

/// A name as one node name: bytes other than letters, digits and `_-:@=+,`
/// written `%XX` (so `.`, `..` and `/` cannot be one).
pub fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"_-:@=+,".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The name a node name under the root stands for, if it is one `encode`
/// writes.
pub fn decode(node: &str) -> Option<String> {
    let bytes = node.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let hex = node.get(i + 1..i + 3)?;
            let v = u8::from_str_radix(hex, 16).ok()?;
            if hex != format!("{v:02X}") || v.is_ascii_alphanumeric() || b"_-:@=+,".contains(&v) {
                return None;
            }
            out.push(v);
            i += 3;
        } else if b.is_ascii_alphanumeric() || b"_-:@=+,".contains(&b) {
            out.push(b);
            i += 1;
        } else {
            return None;
        }
    }
    let name = String::from_utf8(out).ok()?;
    (!name.is_empty()).then_some(name)
}

/// The nodes of one name.
pub struct Nodes {
    /// The root of the prefix, `/lockrun`.
    pub root: String,
    /// The name's parent node, `/lockrun/<name>`.
    pub parent: String,
}

impl Nodes {
    pub fn new(root: &str, name: &str) -> Nodes {
        Nodes {
            root: root.to_string(),
            parent: format!("{root}/{}", encode(name)),
        }
    }

    /// The path a request with unique part `id` is created at (ZooKeeper
    /// appends the sequence number).
    pub fn request(&self, id: &str) -> String {
        format!("{}/q-{id}-", self.parent)
    }

    pub fn child(&self, node: &str) -> String {
        format!("{}/{node}", self.parent)
    }

    /// The node a `--min-hold` window of request `id` is kept as.
    pub fn window(&self, id: &str) -> String {
        format!("{}/w-{id}", self.parent)
    }

    /// The node a `--limit` holder claims its slot with.
    pub fn slot(&self, slot: u32) -> String {
        format!("{}/s-{slot}", self.parent)
    }
}

/// A request node's unique part and sequence number, if `node` is one.
pub fn request_of(node: &str) -> Option<(&str, u64)> {
    let rest = node.strip_prefix("q-")?;
    let (id, seq) = rest.rsplit_once('-')?;
    let plain = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
    let seq_ok = seq.len() >= 10 && seq.bytes().all(|b| b.is_ascii_digit());
    (plain && seq_ok).then(|| (id, seq.parse().unwrap_or(u64::MAX)))
}

/// A `--min-hold` window's unique part, if `node` is one.
pub fn window_of(node: &str) -> Option<&str> {
    let id = node.strip_prefix("w-")?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// A `--limit` slot node's number, if `node` is one.
pub fn slot_of(node: &str) -> Option<u32> {
    let n = node.strip_prefix("s-")?;
    n.parse().ok().filter(|v: &u32| v.to_string() == n)
}

/// What a request node holds: who asked and how, and the marks an operator
/// or another request left on it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub label: String,
    pub mode: Option<Mode>,
    /// The session timeout the holder's session has (what is left of a
    /// lease at most).
    pub ttl_ms: u64,
    pub supersede: bool,
    /// `release --force`: its holder's next renewal finds it lost.
    pub revoked: bool,
    /// A `--preempt` request asked it to stop.
    pub preempted_by: Option<String>,
    /// A newer `--supersede` request took its place in the queue.
    pub replaced_by: Option<String>,
    /// A `--min-hold` window: how long it lasts from its node's creation
    /// (server time), the grant's token and its slot.
    pub window_ms: Option<u64>,
    pub token: Option<u64>,
    pub slot: Option<u32>,
}

impl Record {
    pub fn new(req: &Request, ttl_ms: u64) -> Record {
        Record {
            label: req.owner.shown.clone(),
            mode: Some(req.mode),
            ttl_ms,
            supersede: req.group.supersede,
            ..Record::default()
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode.unwrap_or(Mode::Exclusive)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mode = self.mode();
        let mut v = json!({"label": self.label, "mode": mode.code(), "ttl_ms": self.ttl_ms});
        if let Mode::Limit(n) = mode {
            v["limit"] = json!(n);
        }
        if self.supersede {
            v["supersede"] = json!(true);
        }
        if self.revoked {
            v["revoked"] = json!(true);
        }
        if let Some(by) = &self.preempted_by {
            v["preempted_by"] = json!(by);
        }
        if let Some(by) = &self.replaced_by {
            v["replaced_by"] = json!(by);
        }
        if let Some(ms) = self.window_ms {
            v["window_ms"] = json!(ms);
        }
        if let Some(t) = self.token {
            v["token"] = json!(t);
        }
        if let Some(s) = self.slot {
            v["slot"] = json!(s);
        }
        v.to_string().into_bytes()
    }

    pub fn decode(data: &[u8]) -> Option<Record> {
        let v: Value = serde_json::from_slice(data).ok()?;
        let code = v["mode"].as_str()?;
        if !matches!(code, "x" | "s" | "n") {
            return None;
        }
        let limit = v["limit"].as_u64().map(|n| n.min(u32::MAX as u64) as u32);
        let text = |k: &str| v[k].as_str().map(String::from);
        Some(Record {
            label: text("label").unwrap_or_default(),
            mode: Some(Mode::from_code(code, limit)),
            ttl_ms: v["ttl_ms"].as_u64().unwrap_or(0),
            supersede: v["supersede"].as_bool() == Some(true),
            revoked: v["revoked"].as_bool() == Some(true),
            preempted_by: text("preempted_by"),
            replaced_by: text("replaced_by"),
            window_ms: v["window_ms"].as_u64(),
            token: v["token"].as_u64(),
            slot: v["slot"].as_u64().map(|n| n.min(u32::MAX as u64) as u32),
        })
    }
}

/// One request node as read.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its node name under the parent.
    pub node: String,
    pub id: String,
    pub seq: u64,
    pub record: Record,
    /// Its czxid: the token of its grant.
    pub czxid: u64,
    pub version: i32,
    /// The session it lives on.
    pub owner: i64,
    /// Server time of its creation (ms since the epoch), for display.
    pub ctime: i64,
    /// Its `--limit` slot, from the slot node that names it.
    pub slot: Option<u32>,
}

/// A `--min-hold` window kept after its job ended: a TTL node that
/// holds like any holder until `end` on the server's clock.
#[derive(Debug, Clone)]
pub struct Window {
    pub node: String,
    pub record: Record,
    pub version: i32,
    /// When it ends, in server milliseconds since the epoch.
    pub end: i64,
}

impl Window {
    pub fn token(&self) -> u64 {
        self.record.token.unwrap_or(0)
    }

    /// As the join rule and `release --force` see it.
    pub fn standing(&self) -> Standing {
        Standing {
            token: Some(self.token()),
            window: true,
            ..Standing::default()
        }
    }
}

impl Entry {
    /// As the join rule and `release --force` see it.
    pub fn standing(&self) -> Standing {
        Standing {
            token: Some(self.czxid),
            revoked: self.record.revoked,
            preempted: self.record.preempted_by.is_some(),
            window: false,
            supersede: self.record.supersede,
        }
    }
}

/// The queue: request nodes in sequence order, those another request
/// replaced left out (they are leaving).
pub fn queue(mut entries: Vec<Entry>) -> Vec<Entry> {
    entries.retain(|e| e.record.replaced_by.is_none());
    entries.sort_by_key(|e| e.seq);
    entries
}

fn window_places(windows: &[Window]) -> Vec<Place> {
    windows
        .iter()
        .map(|w| Place {
            mode: w.record.mode(),
            slot: w.record.slot,
            window: true,
            outer: false,
            ours: false,
        })
        .collect()
}

fn places(queue: &[Entry], req: Option<&Request>) -> Vec<Place> {
    queue
        .iter()
        .map(|e| Place {
            mode: e.record.mode(),
            slot: e.slot,
            window: false,
            outer: req.is_some_and(|r| r.is_own_outer_holder(Some(&e.record.label))),
            ours: false,
        })
        .collect()
}

/// How many at the front of the queue hold the name, beside the windows.
pub fn holders(windows: &[Window], queue: &[Entry]) -> usize {
    admit::front(&window_places(windows), &places(queue, None))
}

/// What a request at place `me` in the queue may do.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Granted {
        slot: Option<u32>,
    },
    /// Wait for one of these nodes to go, or a window to end (server ms).
    Blocked {
        until: Option<i64>,
        watch: Vec<String>,
    },
    Disagrees(Mode),
    Nested,
}

pub fn judge(windows: &[Window], queue: &[Entry], me: usize, req: &Request) -> Verdict {
    let w = window_places(windows);
    match admit::admit(&w, &places(queue, Some(req)), req.mode, Some(me)) {
        admit::Verdict::Hold { slot } => return Verdict::Granted { slot },
        admit::Verdict::Ours(_) => return Verdict::Granted { slot: None },
        admit::Verdict::Nested => return Verdict::Nested,
        admit::Verdict::Disagrees(mode) => return Verdict::Disagrees(mode),
        admit::Verdict::Wait(admit::By::Holder(i)) => {
            // A window: it goes when it ends, or when an operator ends it.
            return Verdict::Blocked {
                watch: vec![windows[i].node.clone()],
                until: Some(windows.iter().map(|w| w.end).min().unwrap_or(0)),
            };
        }
        admit::Verdict::Wait(_) => {}
    }
    // Watch the nodes whose going could let us in.
    let ahead: Vec<Mode> = queue[..me].iter().map(|e| e.record.mode()).collect();
    let watch = plan::watch(&ahead, req.mode)
        .into_iter()
        .map(|i| queue[i].node.clone())
        .collect();
    // Windows in force wake us when the first of them ends.
    let until = windows.iter().map(|w| w.end).min();
    Verdict::Blocked { watch, until }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_survive_their_node_names_and_foreign_ones_do_not_read() {
        for name in ["job", "a/b", "50%", ".", "..", "x:y", "é", "a b"] {
            let node = encode(name);
            assert!(!node.contains('/') && node != "." && node != "..");
            assert_eq!(decode(&node).as_deref(), Some(name), "{node}");
        }
        for foreign in ["", "a/b", "%2f", "%41", "a.b", "%zz", "%2"] {
            assert_eq!(decode(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn prefixes_are_one_plain_node() {
        assert_eq!(root_of("lockrun:").unwrap(), "/lockrun");
        assert_eq!(root_of("team-a").unwrap(), "/team-a");
        for bad in ["", ":", "a/b", "a:b:", "..", "zookeeper", "a b"] {
            assert!(root_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn request_nodes_carry_their_unique_part_and_sequence() {
        let id = "0123456789abcdef0123456789abcdef";
        assert_eq!(request_of(&format!("q-{id}-0000000042")), Some((id, 42)));
        for foreign in ["q-x-0000000001", &format!("q-{id}-12"), "s-1", "q-"] {
            assert_eq!(request_of(foreign), None, "{foreign}");
        }
        assert_eq!(slot_of("s-3"), Some(3));
        assert_eq!(slot_of("s-03"), None);
    }

    #[test]
    fn records_survive_the_store() {
        let r = Record {
            label: "h:1 (x)".into(),
            mode: Some(Mode::Limit(3)),
            ttl_ms: 3000,
            supersede: true,
            revoked: true,
            preempted_by: Some("h:2".into()),
            replaced_by: None,
            window_ms: Some(5),
            token: Some(9),
            slot: Some(1),
        };
        assert_eq!(Record::decode(&r.encode()), Some(r));
        assert_eq!(Record::decode(b"hello"), None);
        assert_eq!(Record::decode(b"{\"mode\":\"q\"}"), None);
    }
}
