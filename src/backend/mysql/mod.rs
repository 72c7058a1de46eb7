//! The MySQL and MariaDB engine: a lease is a row of an InnoDB table, not
//! a `GET_LOCK` session lock, so a reconnect or a proxy does not lose it.
//! One row per (name, slot) with its owner, token and expiry; every time is
//! the server's `UTC_TIMESTAMP(6)`; tokens come from a counter row per name
//! advanced in the grant's own transaction, whose row lock also takes a
//! name's decisions one at a time; waiters queue in a second table and
//! block on the `GET_LOCK` of the place just ahead (woken by a release or a
//! grant), or sleep until what is in their way lapses where `GET_LOCK` is
//! refused.
//!
//! By layer: `address.rs` reads the URL; `client.rs` is the transport
//! (bounded calls, flights of statements, the error table); `doctor.rs`
//! the read-only checks; `sql.rs` the tables and every statement;
//! `take.rs` is the acquire loop, judging a name's rows by the rules the
//! SQL engines share (`backend/table.rs`). This file holds the engine's
//! row, status, `release --force`, the lease and its renewal.

mod address;
mod client;
mod doctor;
mod leave;
mod shape;
mod sql;
mod take;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::table::mode;
use crate::backend::table::split_label;
pub use address::{MyUrl, parse};
use client::{Client, int, text};
use sql::{Tables, lit, wake_key};
use take::missing;

use super::{
    Broken, Engine, EngineInfo, Error, Force, Held, Holder, ListBound, Listing, Opening, Request,
    Status, Wait,
};
use super::{Renewal, Renewer, Renewing};
use crate::backend::drive::Transport;
use crate::clock::Boot;
use crate::log;

/// MySQL's row of the scheme table.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "MySQL",
    schemes: &["mysql", "mariadb"],
    form: "mysql://[user[:pass]@]host[:port]/dbname[?ssl-mode=…&socket=…]",
    parse,
    // DATETIME(6): the server keeps times to the microsecond.
    ttl_step: Duration::from_millis(1),
    ttl_min: Duration::ZERO,
    expires: true,
};

pub struct Mysql {
    client: Client,
    tables: Tables,
}

impl Mysql {
    pub fn open(url: &MyUrl, how: &Opening) -> Result<Mysql, Error> {
        let base = address::tables_of(&how.prefix)?;
        log::info(format!("using MySQL at {}", url.display));
        Ok(Mysql {
            client: Client::new(Arc::new(url.clone()), how.op),
            tables: Tables::new(&base),
        })
    }

    /// The live holders of `name`, oldest grant first; none while the
    /// tables do not exist yet (reading never creates them).
    fn holders(&mut self, name: &str) -> Result<Vec<Holder>, Error> {
        let rows = match self.client.query(self.tables.holders(name)) {
            Ok(rows) => rows,
            Err(_) if missing(self.client.last_code) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        rows.iter().map(|r| holder_of(r, 0)).collect()
    }
}

/// A holder from the columns `sql::holder_columns` names, from column `at` on.
fn holder_of(r: &mysql::Row, at: usize) -> Result<Holder, Error> {
    let m = mode(
        &text(r, at + 3).unwrap_or_default(),
        int(r, at + 4).unwrap_or(1),
    )?;
    let ms = |v: Option<i64>| Duration::from_millis(v.unwrap_or(0).max(0) as u64);
    let stored = text(r, at + 1).unwrap_or_default();
    let (label, preempted_by) = split_label(&stored);
    let min_hold = int(r, at + 8).unwrap_or(0) != 0;
    Ok(Holder {
        label: Some(label.to_string()).filter(|l| !l.is_empty()),
        token: int(r, at + 2).map(|t| t.max(0) as u64),
        mode: m,
        slot: matches!(m, super::Mode::Limit(_))
            .then(|| int(r, at).unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32),
        ttl_left: Some(ms(int(r, at + 6))),
        held_for: Some(ms(int(r, at + 7))),
        revoked: int(r, at + 5).unwrap_or(0) != 0,
        min_hold,
        preempted_by: preempted_by.filter(|_| !min_hold).map(String::from),
    })
}

impl Engine for Mysql {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<super::Acquired, Error> {
        self.take(req, wait)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let doing = format!("reading {name}");
        let holders = self
            .holders(name)
            .map_err(|e| self.client.failed(&doing, e))?;
        let (waiters, superseding) = match self.client.query(self.tables.waiting(name)) {
            Ok(rows) => rows.first().map_or((0, 0), |r| {
                let n = |i: usize| int(r, i).unwrap_or(0).max(0) as u64;
                (n(0), n(1))
            }),
            Err(_) if missing(self.client.last_code) => (0, 0),
            Err(e) => return Err(self.client.failed(&doing, e)),
        };
        Ok(Status {
            holders,
            waiters: Some(waiters),
            superseding: Some(superseding),
        })
    }

    /// One statement reads every name with its holders and waiters: a
    /// snapshot, bounded in names by `bound`. Missing tables are an empty
    /// list, never created.
    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let doing = "listing names";
        let limit = bound.names.saturating_add(1) as u64;
        let left = bound.until.since(Boot::now());
        let op = self.client.op;
        // A large table may take longer than one request's budget; the
        // listing's own bound is the limit.
        self.client.op = op.max(left);
        self.client.drop_connection();
        let got = self.client.query(self.tables.list(limit));
        self.client.op = op;
        let rows = match got {
            Ok(rows) => rows,
            Err(_) if missing(self.client.last_code) => Vec::new(),
            Err(e) => return Err(self.client.failed(doing, e)),
        };
        let mut names: Vec<(String, Status)> = Vec::new();
        for r in &rows {
            let name = text(r, 0).unwrap_or_default();
            if names.last().is_none_or(|(n, _)| *n != name) {
                let n = |i: usize| int(r, i).unwrap_or(0).max(0) as u64;
                names.push((
                    name,
                    Status {
                        holders: Vec::new(),
                        waiters: Some(n(10)),
                        superseding: Some(n(11)),
                    },
                ));
            }
            if int(r, 1).is_some() {
                match holder_of(r, 1) {
                    Ok(h) => names.last_mut().expect("pushed above").1.holders.push(h),
                    // A row written by hand: said, and the others listed.
                    Err(e) => log::warn(format!(
                        "{}: a lease row left out: {e}",
                        crate::text::printable(&names.last().expect("pushed above").0)
                    )),
                }
            }
        }
        let mut notes = Vec::new();
        if names.len() > bound.names {
            names.truncate(bound.names);
            notes.push(format!(
                "stopped after {} names: the list is incomplete",
                bound.names
            ));
        }
        Ok(Listing {
            names,
            notes,
            ..Listing::default()
        })
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let doing = format!("releasing {name}");
        let tables = self.tables.clone();
        // Writes follow: the same refusals as a run's, and rows logged
        // where the binary log takes statements.
        self.check_engines()
            .map_err(|e| self.client.failed(&doing, e))?;
        let held = self
            .holders(name)
            .map_err(|e| self.client.failed(&doing, e))?;
        if held.is_empty() {
            return Ok(Broken::NotHeld);
        }
        let matched: Vec<Holder> = held
            .iter()
            .filter(|h| force.token.is_none_or(|t| Some(t) == h.token))
            .cloned()
            .collect();
        if matched.is_empty() {
            return Ok(Broken::TokenMismatch(
                held.iter().filter_map(|h| h.token).collect(),
            ));
        }
        let broken = take::transaction(
            &mut self.client,
            &tables,
            name,
            vec!["SELECT 1".into()],
            |c, _| {
                let mut broken = Vec::new();
                for h in matched {
                    if h.revoked && !force.now {
                        continue;
                    }
                    // A row kept by --min-hold runs no job: it goes at once.
                    let now = force.now || h.min_hold;
                    let token = h.token.unwrap_or(0);
                    let stmts = if now {
                        tables.delete(name, token)
                    } else {
                        tables.revoke(name, token)
                    };
                    let sets = c.run(&stmts)?;
                    if sets[1].first().and_then(|r| int(r, 0)).unwrap_or(0) == 0 {
                        // It changed hands since we looked.
                        continue;
                    }
                    let mut h = h.clone();
                    if now {
                        h.ttl_left = None;
                    } else {
                        h.revoked = true;
                    }
                    broken.push(h);
                }
                // Deleted: the waiters look again now, rather than when
                // the holder's lockrun ends.
                let deleted = broken.iter().any(|h| h.ttl_left.is_none());
                let wake: Vec<String> = deleted
                    .then(|| tables.waiting_conns(name, !c.no_wake))
                    .into_iter()
                    .collect();
                let sets = take::commit(c, wake, Vec::new())?;
                if deleted {
                    let conns: Vec<i64> = sets[0].iter().filter_map(|r| int(r, 0)).collect();
                    c.poke(&conns);
                }
                Ok(broken)
            },
        )
        .map_err(|e| self.client.failed(&doing, e))?
        .unwrap_or_default();
        if broken.is_empty() {
            return Ok(Broken::AlreadyRevoked);
        }
        Ok(Broken::Leases(broken))
    }
}

/// Our row: which name and slot, and the owner value that proves it ours.
#[derive(Clone)]
struct Row {
    tables: Tables,
    name: String,
    slot: u32,
    owner: String,
    ttl_ms: i64,
}

/// A MySQL lease: our row, the connection it was granted on, which holds
/// the lease's wake-up lock for the waiters (release needs no new
/// connect), and the first renewer's connection, opened at the grant: a
/// user whose connections are capped and then all taken by waiters still
/// renews.
struct MyHeld {
    client: Client,
    spare: Arc<Mutex<Option<Client>>>,
    row: Row,
    min_hold: Option<Duration>,
}

impl MyHeld {
    fn new(mut client: Client, tables: &Tables, req: &Request, slot: u32) -> MyHeld {
        client.wait = Duration::ZERO;
        let mut spare = client.fresh();
        // Best effort: without it the first renewal connects.
        let spare = match spare.run(&["DO 0".into()]) {
            Ok(_) => Some(spare),
            Err(_) => None,
        };
        MyHeld {
            spare: Arc::new(Mutex::new(spare)),
            row: Row {
                tables: tables.clone(),
                name: req.name.to_string(),
                slot,
                owner: req.owner.secret.clone(),
                ttl_ms: req.timing.ttl.as_millis() as i64,
            },
            client,
            min_hold: req.min_hold,
        }
    }
}

impl Held for MyHeld {
    fn renewer(&self) -> Renewing {
        // Any connection can extend the row: each renewer opens its own.
        let (client, row) = (self.client.fresh(), self.row.clone());
        let spare = Arc::clone(&self.spare);
        Renewing::Anywhere(Box::new(move || {
            let opened = spare.lock().ok().and_then(|mut s| s.take());
            Box::new(MyRenewer {
                client: opened.unwrap_or_else(|| client.fresh()),
                row: row.clone(),
            })
        }))
    }

    fn release(mut self: Box<Self>) -> Result<bool, Error> {
        let r = &self.row;
        let doing = format!("releasing {}", r.name);
        let window = self.min_hold.map_or(0, |d| {
            i64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX)
        });
        let mut stmts: Vec<String> = r.tables.release(&r.name, r.slot, &r.owner, window).into();
        let wake = self.client.locked.is_some();
        if wake {
            // The waiter blocked on this lease wakes now.
            stmts.push(format!(
                "DO RELEASE_LOCK({})",
                wake_key('h', &lit(&r.owner))
            ));
        }
        // The connection may have gone while the job ran: once more on a new one.
        let sets = match self.client.run(&stmts) {
            Err(e) if e.is_transient() => {
                if wake {
                    stmts.pop();
                }
                self.client.run(&stmts)
            }
            done => done,
        }
        .map_err(|e| self.client.failed(&doing, e))?;
        let count = |i: usize| sets[i].first().and_then(|row| int(row, 0)).unwrap_or(0);
        let (kept, gone) = (count(1), count(3));
        if kept > 0 {
            log::info(format!(
                "released {}; kept by --min-hold until {} after its grant",
                r.name,
                crate::text::duration(self.min_hold.unwrap_or_default())
            ));
        } else {
            log::info(format!("released {}", r.name));
        }
        Ok(kept + gone > 0)
    }

    fn give_back(mut self: Box<Self>) -> Result<bool, Error> {
        self.min_hold = None;
        self.release()
    }
}

struct MyRenewer {
    client: Client,
    row: Row,
}

impl Renewer for MyRenewer {
    fn renew(&mut self) -> Result<Renewal, Error> {
        let r = &self.row;
        // Extended only while the row is still ours and unexpired on the
        // server's clock; no row changed means lost.
        let stmts = r.tables.renew(&r.name, r.slot, &r.owner, r.ttl_ms);
        let sets = match self.client.run(&stmts) {
            Ok(sets) => sets,
            // The table is gone, and our row with it.
            Err(_) if missing(self.client.last_code) => return Ok(Renewal::Lost),
            Err(e) => return Err(e),
        };
        let row = sets[1].first();
        if row.and_then(|r| int(r, 0)).unwrap_or(0) == 0 {
            return Ok(Renewal::Lost);
        }
        let label = row.and_then(|r| text(r, 1)).unwrap_or_default();
        if let (_, Some(by)) = split_label(&label) {
            return Ok(Renewal::Preempted { by: by.to_string() });
        }
        Ok(Renewal::Renewed {
            ttl: Duration::from_millis(r.ttl_ms as u64),
        })
    }
}
