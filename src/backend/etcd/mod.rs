//! The etcd engine, after the recipe of etcd's own concurrency package: a
//! request is a key `PREFIX NAME/q/<lease id>` on an etcd lease, created in
//! one transaction; the holders are the front of the queue in create-revision
//! order; a waiter watches the key just ahead of it; the token is the
//! revision of the write that granted the key (raft-committed, so it never
//! goes back, and a later grant's is higher). The concurrency group words
//! leave marks beside a request's key, on that request's own lease
//! (`queue::Mark`): `KEY/preempted` on a holder a `--preempt` request asked
//! to stop, `KEY/replaced` where a `--supersede` request took a waiter's
//! place. They end with the lease they speak of.
//!
//! By layer: `address.rs` reads the URL; `client.rs` is the transport (the
//! v3 JSON gateway, bounded calls, endpoints in turn, the error table);
//! `queue.rs` reads a name's keys into types and judges who holds;
//! `take.rs` is the acquire loop (create, judge, watch), `leave.rs` its way
//! out on a signal; `list.rs` is `status` without a name. This file holds
//! the engine's row, the lease calls, status, `release --force`, the lease
//! and its renewal.

mod address;
mod client;
mod doctor;
mod leave;
mod list;
mod promote;
mod queue;
mod take;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

pub use address::{EtcdUrl, parse};
use client::{Client, Setup, b64, int, unb64};
use queue::{Entry, Keys, Mark, Record, entries, holders};

use super::plan::{self, ForcePlan, Standing};
use super::{
    Acquired, Broken, Engine, EngineInfo, Error, Force, Held, Holder, ListBound, Listing, Opening,
    Request, Status, Wait,
};
use super::{MinHold, Renewal, Renewer, Renewing};
use crate::clock::Boot;
use crate::log;

/// etcd's row of the scheme table.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "etcd",
    schemes: &["etcd", "etcds"],
    form: "etcd://[user:pass@]host[:port][,host[:port]…], etcds://…",
    parse,
    // etcd leases are whole seconds, and etcd grants none shorter than
    // 1.5 election timeouts, rounded up: 2 s with the default 1 s timeout
    // (lockrun-engines(7) "ETCD").
    ttl_step: Duration::from_secs(1),
    ttl_min: Duration::from_secs(2),
    expires: true,
};

pub struct Etcd {
    client: Client,
    prefix: String,
}

impl Etcd {
    pub fn open(url: &EtcdUrl, how: &Opening) -> Result<Etcd, Error> {
        let setup = Arc::new(Setup::new(url)?);
        log::info(format!("using etcd at {}", url.display));
        Ok(Etcd {
            client: Client::new(setup, how.op),
            prefix: how.prefix.clone(),
        })
    }

    /// The queue of `name` as etcd holds it now.
    fn queue(&mut self, keys: &Keys) -> Result<(Vec<Entry>, u64), Error> {
        let v = self.client.call("/v3/kv/range", &keys.range())?;
        entries(keys, &v, &v["header"])
    }
}

/// A new lease of `ttl` (whole seconds): its id and the ttl etcd granted.
fn grant(c: &mut Client, ttl: Duration) -> Result<(i64, Duration), Error> {
    let v = c.call("/v3/lease/grant", &json!({"TTL": ttl.as_secs()}))?;
    let id = int(&v["ID"]).filter(|id| *id != 0);
    let granted = int(&v["TTL"]).filter(|t| *t > 0);
    match (id, granted) {
        (Some(id), Some(t)) => Ok((id, Duration::from_secs(t as u64))),
        _ => Err(Error::Internal(format!(
            "etcd granted no lease: {}",
            log::redact(&v.to_string())
        ))),
    }
}

/// Keep a lease alive: the ttl etcd renewed it for, or None when it is gone.
fn keepalive(c: &mut Client, lease: i64) -> Result<Option<Duration>, Error> {
    // One request on the gateway's stream, one result line back.
    let v = c.call("/v3/lease/keepalive", &json!({"ID": lease.to_string()}))?;
    Ok(int(&v["result"]["TTL"])
        .filter(|t| *t > 0)
        .map(|t| Duration::from_secs(t as u64)))
}

/// End a lease and every key on it. Ok(false): it was gone already.
fn revoke(c: &mut Client, lease: i64) -> Result<bool, Error> {
    match c.call("/v3/lease/revoke", &json!({"ID": lease.to_string()})) {
        Ok(_) => Ok(true),
        Err(Error::Refused(m)) if m.contains("lease not found") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Time left on a lease (whole seconds, as etcd tells it); None when gone.
fn time_to_live(c: &mut Client, lease: i64) -> Result<Option<Duration>, Error> {
    let v = c.call("/v3/lease/timetolive", &json!({"ID": lease.to_string()}))?;
    // The gateway leaves out fields that are zero: a lease in its last
    // second has no TTL at all, and is still there (a gone one says -1).
    let ttl = match v.get("TTL") {
        None => Some(0),
        Some(t) => int(t),
    };
    Ok(ttl
        .filter(|t| *t >= 0)
        .map(|t| Duration::from_secs(t as u64)))
}

/// A transaction: all `compare`s hold → `success`, else `failure`.
fn txn(
    c: &mut Client,
    compare: Vec<Value>,
    success: Vec<Value>,
    failure: Vec<Value>,
) -> Result<Value, Error> {
    c.call(
        "/v3/kv/txn",
        &json!({"compare": compare, "success": success, "failure": failure}),
    )
}

fn succeeded(v: &Value) -> bool {
    v["succeeded"].as_bool() == Some(true)
}

/// The compare "`key` still holds exactly `value`".
fn holds(key: &str, value: &str) -> Value {
    json!({"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)})
}

/// Keys read at most by one listing (every request of every name).
const LIST_KEYS: usize = 100_000;

/// The end of the range of every key that starts with `prefix` (etcd's
/// `--prefix`: the last byte that can be raised, raised).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0xff {
            bytes.push(last + 1);
            return bytes;
        }
    }
    // Every key.
    vec![0]
}

/// Wall-clock milliseconds: only ever shown (`status`'s "held for"), never
/// part of a lease's time.
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The holder whose request is `e`, with `ttl_left` on its lease. The
/// owner's secret stays behind: a holder is shown.
fn holder(e: &Entry, ttl_left: Option<Duration>) -> Holder {
    let r = &e.record;
    Holder {
        label: Some(r.label.clone()).filter(|l| !l.is_empty()),
        token: Some(e.token),
        mode: r.mode,
        slot: r.slot.filter(|_| matches!(r.mode, super::Mode::Limit(_))),
        ttl_left,
        held_for: (r.granted_ms > 0)
            .then(|| Duration::from_millis(wall_ms().saturating_sub(r.granted_ms))),
        revoked: r.revoked,
        min_hold: r.min_hold,
        preempted_by: e.preempted_by.clone(),
    }
}

/// A name's status from its queue, with each holder's time left as
/// `ttl_left` tells it (in queue order).
fn status_of(
    queue: &[Entry],
    mut ttl_left: impl FnMut(&Entry) -> Result<Option<Duration>, Error>,
) -> Result<Status, Error> {
    let held = holders(queue);
    let mut out = Vec::new();
    for e in &queue[..held] {
        // A lease that ended since the range: its key is going.
        if let Some(left) = ttl_left(e)? {
            out.push(holder(e, Some(left)));
        }
    }
    Ok(Status {
        holders: out,
        waiters: Some((queue.len() - held) as u64),
        superseding: Some(queue[held..].iter().filter(|e| e.record.supersede).count() as u64),
    })
}

/// The names of lockrun's request keys among `keys` (sorted, each once),
/// with a note on the keys under the prefix that are no lock's.
fn names_in<'k>(prefix: &str, keys: impl IntoIterator<Item = &'k str>) -> plan::Names {
    let mut names = std::collections::BTreeSet::new();
    let (mut others, mut example) = (0, None);
    for key in keys {
        match queue::name_of_key(prefix, key) {
            Some(name) => {
                names.insert(name);
            }
            // A mark beside a request names no lock of its own.
            None if queue::is_mark_key(prefix, key) => {}
            None => {
                others += 1;
                example.get_or_insert(key);
            }
        }
    }
    let mut notes = Vec::new();
    if let Some(key) = example {
        // Escaped: a key is anyone's text.
        let key: String = key.chars().take(200).collect();
        notes.push(format!(
            "left out {others} key(s) under the prefix that are no lock's under it \
             (another program's, or a longer --prefix's), such as {key:?}"
        ));
    }
    plan::Names {
        names: names.into_iter().collect(),
        notes,
    }
}

/// The note of a listing that met `LIST_KEYS`.
fn too_many_keys() -> String {
    format!("more than {LIST_KEYS} keys under the prefix: the list is incomplete")
}

impl Engine for Etcd {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        self.take(req, wait)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let keys = Keys::new(&self.prefix, name);
        let doing = format!("reading {name}");
        let (queue, _) = self
            .queue(&keys)
            .map_err(|e| self.client.remote.failed(&doing, e))?;
        let client = &mut self.client;
        status_of(&queue, |e| time_to_live(client, e.lease))
            .map_err(|err| self.client.remote.failed(&doing, err))
    }

    fn names(&mut self, _bound: ListBound) -> Result<plan::Names, Error> {
        let doing = "listing names";
        // Keys only, and no more than the bound allows: a name's values
        // hold its owners' secrets, which this never needs.
        let range = json!({
            "key": b64(&self.prefix),
            "range_end": b64(prefix_end(&self.prefix)),
            "keys_only": true,
            "limit": LIST_KEYS,
        });
        let v = self
            .client
            .call("/v3/kv/range", &range)
            .map_err(|e| self.client.remote.failed(doing, e))?;
        let keys: Vec<String> = v["kvs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|kv| unb64(&kv["key"]).unwrap_or_default())
            .collect();
        let mut found = names_in(&self.prefix, keys.iter().map(String::as_str));
        if v["more"].as_bool() == Some(true) {
            found.notes.insert(0, too_many_keys());
        }
        Ok(found)
    }

    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        self.list_snapshot(bound)
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let keys = Keys::new(&self.prefix, name);
        let doing = format!("releasing {name}");
        let (queue, _) = self
            .queue(&keys)
            .map_err(|e| self.client.remote.failed(&doing, e))?;
        let held = &queue[..holders(&queue)];
        let standing: Vec<Standing> = held.iter().map(Entry::standing).collect();
        let cuts = match plan::force(&standing, force) {
            ForcePlan::Done(done) => return Ok(done),
            ForcePlan::Cut(cuts) => cuts,
        };
        let mut broken = Vec::new();
        for (i, cut) in cuts {
            let e = &held[i];
            let unchanged = json!({"key": b64(&e.key), "target": "MOD", "result": "EQUAL", "mod_revision": e.mod_rev.to_string()});
            let change = if cut.deletes() {
                json!({"request_delete_range": {"key": b64(&e.key)}})
            } else {
                // The key stays on the holder's lease, so it ends when that
                // lease would have: nobody else gets in early.
                json!({"request_put": {"key": b64(&e.key), "value": b64(e.record.revoked(e.token).encode()), "ignore_lease": true}})
            };
            let v = txn(&mut self.client, vec![unchanged], vec![change], vec![])
                .map_err(|err| self.client.remote.failed(&doing, err))?;
            if !succeeded(&v) {
                // It changed hands since we looked: not the lease asked about.
                continue;
            }
            let h = time_to_live(&mut self.client, e.lease)
                .map(|left| holder(e, left))
                .map_err(|err| self.client.remote.failed(&doing, err))?;
            if cut.deletes() {
                // Its holder's next keepalive finds the lease gone.
                let _ = revoke(&mut self.client, e.lease);
            }
            broken.push(cut.shown(h));
        }
        Ok(plan::forced(broken))
    }
}

/// An etcd lease: our key, the lease it lives on, and its value exactly as
/// written (ownership is that value, unchanged).
struct EtcdHeld {
    client: Client,
    key: String,
    lease: i64,
    value: String,
    name: String,
    token: u64,
    /// When the grant's reply came: the grant was made no later.
    granted_by: Boot,
    /// `--min-hold`: the release keeps the key until the window ends.
    min_hold: Option<Duration>,
}

impl EtcdHeld {
    /// What is left of the `--min-hold` window, counted from the reply to
    /// the grant (no later than the grant itself): never less than etcd's.
    fn window_left(&self) -> Option<Duration> {
        let hold = self.min_hold?;
        hold.checked_sub(Boot::now().since(self.granted_by))
            .filter(|d| !d.is_zero())
    }

    /// Keep our key, owned by no one, on a lease of its own that etcd ends
    /// no sooner than `left` from now (its ttl starts when etcd grants it,
    /// after this): waiters watching for its deletion wake when it goes.
    fn keep_for(&mut self, left: Duration) -> Result<bool, Error> {
        let c = &mut self.client;
        let doing = format!("releasing {}", self.name);
        // etcd's clock may run a little faster than ours (a lease's
        // drift), and it counts whole seconds: round up past both.
        let padded = left + left / 100 + Duration::from_millis(2);
        let secs = padded.as_nanos().div_ceil(1_000_000_000).max(1) as u64;
        let (lease, _) =
            grant(c, Duration::from_secs(secs)).map_err(|e| c.remote.failed(&doing, e))?;
        let kept = Record::decode(&self.value)
            .ok_or_else(|| Error::Internal(format!("{doing}: our own record does not read")))?
            .kept(self.token)
            .encode();
        let put = json!({"request_put": {"key": b64(&self.key), "value": b64(&kept), "lease": lease.to_string()}});
        // A holder a --preempt request asked to stop keeps no window for it.
        let mark = Keys::mark(&self.key, Mark::Preempted);
        let unmarked = json!({"key": b64(&mark), "target": "CREATE", "result": "EQUAL", "create_revision": "0"});
        let v = txn(
            c,
            vec![holds(&self.key, &self.value), unmarked],
            vec![put],
            vec![json!({"request_range": {"key": b64(&mark)}})],
        )
        .map_err(|e| c.remote.failed(&doing, e))?;
        if !succeeded(&v) {
            // Not ours any more (revoked), or preempted: the new lease
            // holds nothing.
            let _ = revoke(c, lease);
            let marked = v["responses"][0]["response_range"]["kvs"]
                .as_array()
                .is_some_and(|kvs| !kvs.is_empty());
            return Ok(marked && self.delete()?);
        }
        log::info(format!(
            "released {}; kept by --min-hold for {}",
            self.name,
            crate::text::duration(Duration::from_secs(secs))
        ));
        Ok(true)
    }
}

impl Held for EtcdHeld {
    fn renewer(&self) -> Renewing {
        // Any connection can keep the lease alive: each renewer gets
        // connections of its own (a renewal must not wait behind a stuck one).
        let (client, key, lease, value) = (
            self.client.fresh(),
            self.key.clone(),
            self.lease,
            self.value.clone(),
        );
        Renewing::Anywhere(Box::new(move || {
            Box::new(EtcdRenewer {
                client: client.fresh(),
                key: key.clone(),
                lease,
                value: value.clone(),
            })
        }))
    }

    fn release(mut self: Box<Self>, window: MinHold) -> Result<bool, Error> {
        self.min_hold = window.of(self.min_hold);
        if let Some(left) = self.window_left() {
            return self.keep_for(left);
        }
        self.delete()
    }
}

impl EtcdHeld {
    /// Delete our key, with any --preempt mark beside it: the name is free
    /// at once. Ok(false): it was no longer ours.
    fn delete(&mut self) -> Result<bool, Error> {
        let c = &mut self.client;
        // Deleted only while it is still ours: a revoked key stays until its
        // lease ends, as `release --force` promised. The lease itself, with
        // nothing on it any more, ends on its own within the ttl: revoking
        // it too would cost every run another round trip.
        let delete = json!({"request_delete_range": {"key": b64(&self.key)}});
        let mark =
            json!({"request_delete_range": {"key": b64(Keys::mark(&self.key, Mark::Preempted))}});
        let v = txn(
            c,
            vec![holds(&self.key, &self.value)],
            vec![delete, mark],
            vec![],
        )
        .map_err(|e| c.remote.failed(&format!("releasing {}", self.name), e))?;
        log::info(format!("released {}", self.name));
        Ok(succeeded(&v))
    }
}

struct EtcdRenewer {
    client: Client,
    key: String,
    lease: i64,
    value: String,
}

impl Renewer for EtcdRenewer {
    fn renew(&mut self) -> Result<Renewal, Error> {
        // Ownership first: a revoked key must not get one more ttl from
        // us. Our key and the mark a --preempt request may have left
        // beside it, read together.
        let read = |key: String| json!({"request_range": {"key": b64(key)}});
        let v = txn(
            &mut self.client,
            vec![],
            vec![
                read(self.key.clone()),
                read(Keys::mark(&self.key, Mark::Preempted)),
            ],
            vec![],
        )?;
        let value = |at: usize| {
            let kv = &v["responses"][at]["response_range"]["kvs"][0];
            let text = client::unb64(kv.get("value").unwrap_or(&json!("")));
            (text, int(&kv["lease"]))
        };
        let (text, lease) = value(0);
        if text.as_deref() != Some(self.value.as_str()) || lease != Some(self.lease) {
            return Ok(Renewal::Lost);
        }
        // Only a mark on our own lease is ours (it ends with it).
        let preempted = match value(1) {
            (Some(text), Some(on)) if on == self.lease => Mark::decode(&text),
            _ => None,
        };
        match keepalive(&mut self.client, self.lease) {
            // Kept alive first: the lease is still ours, and lasts while
            // the job is stopped and released.
            Ok(Some(_)) if let Some(by) = preempted => Ok(Renewal::Preempted { by }),
            Ok(Some(ttl)) => Ok(Renewal::Renewed { ttl }),
            Ok(None) => Ok(Renewal::Lost),
            // Revoked since the key was read: lost, not refused.
            Err(Error::Refused(m)) if m.contains("lease not found") => Ok(Renewal::Lost),
            Err(e) => Err(e),
        }
    }
}
