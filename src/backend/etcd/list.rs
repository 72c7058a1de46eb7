//! `status` without a name: every key under the prefix read at one
//! revision, values and all (in pages, each after the first asked for at
//! the first one's revision), so the list is one snapshot; each name's
//! queue read from it as `status` reads its own range (`queue.rs`); and the
//! holders' time left asked of etcd by a few connections at once, ahead of
//! the list in the order it shows them. The values hold the owners'
//! secrets: they are read into records and go no further.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};

use super::client::{Client, b64, int, unb64, unb64_bytes};
use super::queue::{Keys, holders, queue_of};
use super::{Etcd, LIST_KEYS, names_in, prefix_end, status_of, time_to_live, too_many_keys};
use crate::backend::plan::{self, Read};
use crate::backend::{Error, ListBound, Listing};
use crate::clock::Boot;

/// Keys one range of the listing reads at most: half a MB of lockrun's
/// records, and room under the client's limit on a reply for another
/// program's larger values under the prefix.
const PAGE: usize = 1_000;

/// Connections that ask for the holders' time left at once, beside the
/// listing's own (which asks for any they have not reached). etcd answers
/// each through its gateway: with 10,000 holders, that is what the list
/// takes its time on.
const ASKERS: usize = 16;

/// How the list was read.
pub const ONE_SNAPSHOT: &str = "read as one snapshot (every key under the prefix at one \
     revision); the time left on each holder's lease was asked for just after";

/// Every key under the prefix at one revision, in key order.
struct Snapshot {
    /// Each key as text ("" for one that is not: no name's).
    keys: Vec<String>,
    kvs: Vec<Value>,
    /// The names found and what was passed over.
    found: plan::Names,
    /// The bound's time ran out before every page was read.
    cut: bool,
}

impl Snapshot {
    /// The key-values of the name whose keys are `keys`: every one in the
    /// range `status` of that name reads.
    fn of(&self, keys: &Keys) -> &[Value] {
        let from = self
            .keys
            .partition_point(|k| k.as_str() < keys.queue.as_str());
        let to = self
            .keys
            .partition_point(|k| k.as_str() < keys.queue_end.as_str());
        &self.kvs[from..to.max(from)]
    }
}

/// A key's bytes as the gateway gives them.
fn key_bytes(kv: &Value) -> Result<Vec<u8>, Error> {
    unb64_bytes(&kv["key"])
        .ok_or_else(|| Error::Internal("etcd gave a key that does not read as base64".into()))
}

/// The same range at `revision`, where one is known.
fn at(mut range: Value, revision: Option<i64>) -> Value {
    if let Some(rev) = revision {
        range["revision"] = json!(rev.to_string());
    }
    range
}

impl Etcd {
    /// Every key under the prefix, read at one revision, at most
    /// `LIST_KEYS` of them (and then the whole queue of the name they end
    /// in), page by page while `bound` has time.
    fn snapshot(&mut self, bound: ListBound) -> Result<Snapshot, Error> {
        let end = b64(prefix_end(&self.prefix));
        let mut from = self.prefix.as_bytes().to_vec();
        let mut revision = None;
        let mut kvs: Vec<Value> = Vec::new();
        let (mut full, mut cut) = (false, false);
        loop {
            let range = json!({
                "key": b64(&from),
                "range_end": end,
                "limit": PAGE.min(LIST_KEYS - kvs.len()),
            });
            let mut v = self.client.call("/v3/kv/range", &at(range, revision))?;
            revision = revision.or(int(&v["header"]["revision"]));
            let page = match v["kvs"].take() {
                Value::Array(page) => page,
                _ => Vec::new(),
            };
            let more = v["more"].as_bool() == Some(true);
            if let Some(last) = page.last() {
                from = key_bytes(last)?;
                from.push(0);
            }
            let empty = page.is_empty();
            kvs.extend(page);
            if !more || empty {
                break;
            }
            if kvs.len() >= LIST_KEYS {
                full = true;
                break;
            }
            if bound.passed() {
                cut = true;
                break;
            }
        }
        let text = |kv: &Value| unb64(&kv["key"]).unwrap_or_default();
        // The names as a keys-only read of the same keys finds them.
        let read: Vec<String> = kvs.iter().map(text).collect();
        let mut found = names_in(&self.prefix, read.iter().map(String::as_str));
        if full {
            found.notes.insert(0, too_many_keys());
            // The last name may have more keys than the read reached: its
            // queue is read whole, at the same revision.
            let last = kvs.last().map(key_bytes).transpose()?.unwrap_or_default();
            let within = |keys: &Keys| {
                keys.queue.as_bytes() <= last.as_slice()
                    && last.as_slice() < keys.queue_end.as_bytes()
            };
            let straddling = found
                .names
                .iter()
                .map(|name| Keys::new(&self.prefix, name))
                .find(within);
            if let Some(keys) = straddling {
                let mut v = self
                    .client
                    .call("/v3/kv/range", &at(keys.range(), revision))?;
                let mut rest = Vec::new();
                for kv in kvs.drain(..) {
                    if key_bytes(&kv)?.as_slice() < keys.queue.as_bytes() {
                        rest.push(kv);
                    }
                }
                kvs = rest;
                if let Value::Array(whole) = v["kvs"].take() {
                    kvs.extend(whole);
                }
            }
        }
        let mut keyed: Vec<(String, Value)> = kvs.into_iter().map(|kv| (text(&kv), kv)).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let (keys, kvs) = keyed.into_iter().unzip();
        Ok(Snapshot {
            keys,
            kvs,
            found,
            cut,
        })
    }

    /// The listing, from one snapshot of the prefix: the same status of
    /// each name as `status NAME` shows, the same notes, within `bound`.
    pub(super) fn list_snapshot(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let doing = "listing names";
        let mut snap = self
            .snapshot(bound)
            .map_err(|e| self.client.remote.failed(doing, e))?;
        let plan::Names { names, mut notes } = std::mem::take(&mut snap.found);
        if snap.cut {
            // The time ran out before the snapshot was whole: no name is
            // read from a part of one.
            notes.push(plan::cut_short(0));
            notes.push(ONE_SNAPSHOT.into());
            return Ok(Listing {
                notes,
                ..Listing::default()
            });
        }
        // Each name's queue, and where its holders' leases start among
        // those asked for: the names the bound lets the list read, in order.
        let mut leases = Vec::new();
        let mut read = 0;
        let named: Vec<_> = names
            .into_iter()
            .map(|name| {
                let keys = Keys::new(&self.prefix, &name);
                let queue = queue_of(&keys, snap.of(&keys));
                let first = leases.len();
                if let Ok(queue) = &queue
                    && read < bound.names
                {
                    read += 1;
                    leases.extend(queue[..holders(queue)].iter().map(|e| e.lease));
                }
                (name, (queue, first))
            })
            .collect();
        drop(snap);
        let asks = Asks::new(leases);
        let askers: Vec<Client> = (0..ASKERS.min(asks.leases.len()))
            .map(|_| self.client.fresh())
            .collect();
        let client = &mut self.client;
        std::thread::scope(|s| {
            for mut asker in askers {
                let asks = &asks;
                // Fewer askers than asked for only makes the list slower.
                let _ = std::thread::Builder::new()
                    .name("lockrun-ttl".into())
                    .spawn_scoped(s, move || asks.ask(&mut asker, bound.until));
            }
            let listing =
                plan::listing(named, bound, notes, ONE_SNAPSHOT, |name, (queue, first)| {
                    let mut slot = first;
                    let status = queue.and_then(|queue| {
                        status_of(&queue, |e| {
                            let left = asks.answer(slot, e.lease, client);
                            slot += 1;
                            left
                        })
                    });
                    let doing = format!("reading {name}");
                    Read::of_status(name, status.map_err(|e| client.remote.failed(&doing, e)))
                });
            asks.stop.store(true, Ordering::Relaxed);
            listing
        })
    }
}

/// Where the time left on one lease stands.
enum Answer {
    /// Nobody has asked yet.
    Open,
    /// Asked (or taken by the list): wait for it.
    Asked,
    Told(Result<Option<Duration>, Error>),
}

/// The leases whose time left the listing needs, in the order it needs
/// them, asked for by a few threads ahead of it.
struct Asks {
    leases: Vec<i64>,
    /// The next lease an asker takes.
    next: AtomicUsize,
    /// The list is done (or failed): askers ask no more.
    stop: AtomicBool,
    answers: Mutex<Vec<Answer>>,
    told: Condvar,
}

impl Asks {
    fn new(leases: Vec<i64>) -> Asks {
        Asks {
            answers: Mutex::new(leases.iter().map(|_| Answer::Open).collect()),
            leases,
            next: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            told: Condvar::new(),
        }
    }

    fn answers(&self) -> MutexGuard<'_, Vec<Answer>> {
        self.answers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An asker's loop: the next lease nobody took, until every one is
    /// taken, the list is done, `until` has passed, or a call failed (the
    /// list fails there, or asks again itself).
    fn ask(&self, client: &mut Client, until: Boot) {
        while !self.stop.load(Ordering::Relaxed) && Boot::now() < until {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.leases.len() {
                return;
            }
            {
                let mut answers = self.answers();
                if !matches!(answers[i], Answer::Open) {
                    continue;
                }
                answers[i] = Answer::Asked;
            }
            let told = time_to_live(client, self.leases[i]);
            let failed = told.is_err();
            self.answers()[i] = Answer::Told(told);
            self.told.notify_all();
            if failed {
                return;
            }
        }
    }

    /// The time left on `lease`, the `i`th asked for: as an asker was
    /// told, or asked for now on `client` if none took it.
    fn answer(&self, i: usize, lease: i64, client: &mut Client) -> Result<Option<Duration>, Error> {
        if self.leases.get(i) != Some(&lease) {
            return time_to_live(client, lease);
        }
        let mut answers = self.answers();
        loop {
            match std::mem::replace(&mut answers[i], Answer::Asked) {
                Answer::Told(told) => return told,
                Answer::Open => {
                    drop(answers);
                    return time_to_live(client, lease);
                }
                Answer::Asked => {
                    answers = self.told.wait(answers).unwrap_or_else(|e| e.into_inner());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::client::Setup;
    use super::super::queue::{Mark, entries};
    use super::*;
    use std::sync::Arc;

    fn kv(key: &str, value: &str, lease: i64, rev: u64) -> Value {
        json!({"key": b64(key), "value": b64(value), "lease": lease.to_string(),
               "create_revision": rev.to_string(), "mod_revision": rev.to_string()})
    }

    fn record(label: &str) -> String {
        json!({"owner": "0wn3r", "label": label, "mode": "x", "limit": 1, "slot": null,
               "granted_ms": 0, "revoked": false, "min_hold": false, "token": null})
        .to_string()
    }

    /// A name's part of the snapshot is what `status` of that name reads
    /// from its own range: marks beside its keys, another prefix's keys
    /// that run through its range, and no key of any other name.
    #[test]
    fn a_name_reads_from_the_snapshot_what_its_own_range_holds() {
        let foo = Keys::new("lockrun:", "foo");
        let first = foo.entry(1);
        let second = foo.entry(2);
        let mut kvs = vec![
            kv(&first, &record("h:1"), 1, 5),
            kv(
                &Keys::mark(&first, Mark::Preempted),
                &Mark::encode("h:9"),
                1,
                7,
            ),
            kv(&second, &record("h:2"), 2, 6),
            // A longer prefix's key inside foo's range.
            kv("lockrun:foo/q/bar/q/0000000000000003", &record("h:3"), 3, 4),
            kv(&Keys::new("lockrun:", "fo").entry(4), &record("h:4"), 4, 3),
            kv(
                &Keys::new("lockrun:", "foo%").entry(5),
                &record("h:5"),
                5,
                2,
            ),
            kv("lockrun:stray", "not ours", 0, 1),
        ];
        kvs.sort_by_key(|kv| unb64(&kv["key"]).unwrap());
        let keys: Vec<String> = kvs.iter().map(|kv| unb64(&kv["key"]).unwrap()).collect();
        let snap = Snapshot {
            keys,
            kvs: kvs.clone(),
            found: plan::Names::default(),
            cut: false,
        };
        let own: Vec<Value> = kvs
            .iter()
            .filter(|kv| {
                let k = unb64(&kv["key"]).unwrap();
                foo.queue <= k && k < foo.queue_end
            })
            .cloned()
            .collect();
        assert_eq!(own.len(), 4);
        assert_eq!(snap.of(&foo), own.as_slice());
        let from_snapshot = queue_of(&foo, snap.of(&foo)).unwrap();
        let (from_range, _) = entries(&foo, &json!({ "kvs": own }), &json!({})).unwrap();
        let shown = |q: &[super::super::queue::Entry]| {
            q.iter()
                .map(|e| (e.key.clone(), e.token, e.preempted_by.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(shown(&from_snapshot), shown(&from_range));
        assert_eq!(
            shown(&from_snapshot),
            [(first, 5, Some("h:9".to_string())), (second, 6, None)]
        );
        let stray = Keys::new("lockrun:", "stray");
        assert!(snap.of(&stray).is_empty());
    }

    /// The list takes each lease's answer from the asker that asked, waiting
    /// for one still under way.
    #[test]
    fn the_list_waits_for_an_answer_under_way() {
        let url = super::super::address::read(
            "etcd://127.0.0.1:1",
            &crate::backend::AddressOptions::default(),
        )
        .unwrap();
        let mut client = Client::new(Arc::new(Setup::new(&url).unwrap()), Duration::from_secs(1));
        let asks = Asks::new(vec![7, 8]);
        asks.answers()[0] = Answer::Asked;
        asks.answers()[1] = Answer::Told(Ok(None));
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                asks.answers()[0] = Answer::Told(Ok(Some(Duration::from_secs(5))));
                asks.told.notify_all();
            });
            let left = asks.answer(0, 7, &mut client).unwrap();
            assert_eq!(left, Some(Duration::from_secs(5)));
        });
        assert_eq!(asks.answer(1, 8, &mut client).unwrap(), None);
        // Nobody at the address: a lease no asker took is asked for by
        // the list itself.
        assert!(asks.answer(2, 9, &mut client).is_err());
    }
}
