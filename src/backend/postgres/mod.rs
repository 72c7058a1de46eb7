//! The PostgreSQL engine: a lease is a row of a table, not a session or
//! advisory lock, so a reconnect or a transaction-pooling proxy does not
//! lose it. One row per (name, slot) with its owner, token and expiry;
//! every time is the server's `clock_timestamp()`; tokens come from a
//! sequence; waiters queue in a second table and sleep until a
//! notification or the lapse of what is in their way. The concurrency
//! groups (`--max-waiters`, `--supersede`, `--preempt`) add no column:
//! their marks live in the owner and label columns (`backend/table.rs`
//! says how), so tables made by an older lockrun serve them with the
//! documented grants.
//!
//! By layer: `address.rs` reads the URL and the `PG*` variables;
//! `client.rs` is the transport (bounded calls, notifications, the error
//! table); `doctor.rs` the read-only checks; `sql.rs` the tables and every
//! statement; `take.rs` is the acquire loop, judging a name's rows by the
//! rules the SQL engines share (`backend/table.rs`), `leave.rs` its way
//! out on a signal. This file holds the engine's row, status, `release
//! --force`, the lease and its renewal.

mod address;
mod client;
mod doctor;
mod leave;
mod sql;
mod take;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};

use crate::backend::table::mode;
use crate::backend::table::split_label;
pub use address::{PgUrl, parse};
use client::{Call, Client};
use sql::Tables;
use take::missing;

use super::{
    Broken, Engine, EngineInfo, Error, Force, Held, Holder, ListBound, Listing, Opening, Request,
    Status, Wait,
};
use super::{Renewal, Renewer, Renewing};
use crate::backend::drive::Transport;
use crate::clock::Boot;
use crate::log;

/// PostgreSQL's row of the scheme table.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "PostgreSQL",
    schemes: &["postgres", "postgresql"],
    form: "postgres://[user[:pass]@][host][:port][,host[:port]…][/dbname][?sslmode=…]",
    parse,
    ttl_step: Duration::from_millis(1),
    ttl_min: Duration::ZERO,
    expires: true,
};

pub struct Postgres {
    client: Client,
    tables: Tables,
}

impl Postgres {
    pub fn open(url: &PgUrl, how: &Opening) -> Result<Postgres, Error> {
        let schema = address::schema_of(&how.prefix)?;
        log::info(format!("using PostgreSQL at {}", url.display));
        Ok(Postgres {
            client: Client::new(Arc::new(url.clone()), how.op),
            tables: Tables::new(&schema),
        })
    }

    /// The live holders of `name`, oldest grant first; none while the
    /// tables do not exist yet (reading never creates them).
    fn holders(&mut self, name: &str) -> Result<Vec<Holder>, Error> {
        let rows = match self
            .client
            .query(&self.tables.holders(), &[(&name, Type::TEXT)])
        {
            Ok(rows) => rows,
            Err(_) if missing(self.client.last_code.as_deref()) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        rows.iter().map(|r| holder_of(r, 0)).collect()
    }
}

/// A holder from the columns `sql::holder_columns` names, from column `at` on.
/// Every column but the slot is read as possibly NULL: a table made by
/// hand may allow it, and `status` must still show what is there.
fn holder_of(r: &tokio_postgres::Row, at: usize) -> Result<Holder, Error> {
    let m = mode(
        &r.get::<_, Option<String>>(at + 3).unwrap_or_default(),
        r.get::<_, Option<i32>>(at + 4).map_or(1, i64::from),
    )?;
    let ms = |v: Option<i64>| Duration::from_millis(v.unwrap_or(0).max(0) as u64);
    let stored = r.get::<_, Option<String>>(at + 1).unwrap_or_default();
    let (label, preempted_by) = split_label(&stored);
    let min_hold = r.get::<_, Option<bool>>(at + 8).unwrap_or(false);
    Ok(Holder {
        label: Some(label.to_string()).filter(|l| !l.is_empty()),
        token: r.get::<_, Option<i64>>(at + 2).map(|t| t.max(0) as u64),
        mode: m,
        slot: matches!(m, super::Mode::Limit(_)).then(|| r.get::<_, i32>(at).max(0) as u32),
        ttl_left: Some(ms(r.get(at + 6))),
        held_for: Some(ms(r.get(at + 7))),
        revoked: r.get::<_, Option<bool>>(at + 5).unwrap_or(false),
        min_hold,
        // A window runs no job: nothing to stop (an older lockrun keeps
        // the label of a marked lease in its window).
        preempted_by: preempted_by.filter(|_| !min_hold).map(String::from),
    })
}

impl Engine for Postgres {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<super::Acquired, Error> {
        self.take(req, wait)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let doing = format!("reading {name}");
        let holders = self
            .holders(name)
            .map_err(|e| self.client.failed(&doing, e))?;
        let (waiters, superseding) = match self
            .client
            .query(&self.tables.waiting(), &[(&name, Type::TEXT)])
        {
            Ok(rows) => rows.first().map_or((0, 0), |r| {
                let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
                (n(0), n(1))
            }),
            Err(_) if missing(self.client.last_code.as_deref()) => (0, 0),
            Err(e) => return Err(self.client.failed(&doing, e)),
        };
        Ok(Status {
            holders,
            waiters: Some(waiters),
            superseding: Some(superseding),
        })
    }

    /// One statement reads every name with its holders and waiters: a
    /// snapshot, bounded in names by `bound` and in time by what is left
    /// of it. Missing tables are an empty list, never created.
    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let doing = "listing names";
        let limit = i64::try_from(bound.names.saturating_add(1)).unwrap_or(i64::MAX);
        let left = bound.until.since(Boot::now());
        let op = self.client.op;
        // A large table may take longer than one request's budget; the
        // listing's own bound is the limit.
        self.client.op = op.max(left);
        let got = self
            .client
            .query(&self.tables.list(), &[(&limit, Type::INT8)]);
        self.client.op = op;
        let rows = match got {
            Ok(rows) => rows,
            Err(_) if missing(self.client.last_code.as_deref()) => Vec::new(),
            Err(e) => return Err(self.client.failed(doing, e)),
        };
        let mut names: Vec<(String, Status)> = Vec::new();
        for r in &rows {
            let name: String = r.get(0);
            if names.last().is_none_or(|(n, _)| *n != name) {
                let n = |i: usize| r.get::<_, i64>(i).max(0) as u64;
                names.push((
                    name,
                    Status {
                        holders: Vec::new(),
                        waiters: Some(n(10)),
                        superseding: Some(n(11)),
                    },
                ));
            }
            // The slot is never NULL in a holder's row (a primary key column).
            if r.get::<_, Option<i32>>(1).is_some() {
                let h = holder_of(r, 1)?;
                names.last_mut().expect("pushed above").1.holders.push(h);
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
        let channel = tables.channel(name);
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
            ("SELECT 1", &[]),
            |c, _| {
                let mut broken = Vec::new();
                let mut deleted = false;
                for h in matched {
                    if h.revoked && !force.now {
                        continue;
                    }
                    // A row kept by --min-hold runs no job: it goes at once.
                    let now = force.now || h.min_hold;
                    let token = h.token.unwrap_or(0) as i64;
                    let sql = if now {
                        tables.delete()
                    } else {
                        // The row stays until it would have ended: nobody else
                        // gets in early, and its holder's renewal finds it gone.
                        tables.revoke()
                    };
                    let params: [(&(dyn ToSql + Sync), Type); 2] =
                        [(&name, Type::TEXT), (&token, Type::INT8)];
                    let rows = c.query(&sql, &params)?;
                    if rows.is_empty() {
                        // It changed hands since we looked: not the lease asked about.
                        continue;
                    }
                    let mut h = h.clone();
                    if now {
                        h.ttl_left = None;
                        deleted = true;
                    } else {
                        h.revoked = true;
                    }
                    broken.push(h);
                }
                let wake: [(&(dyn ToSql + Sync), Type); 1] = [(&channel, Type::TEXT)];
                let last: Vec<Call> = deleted
                    .then_some(Call::Query(tables.notify(), &wake))
                    .into_iter()
                    .collect();
                take::commit(c, &last)?;
                Ok(broken)
            },
        )
        .map_err(|e| self.client.failed(&doing, e))?;
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
    slot: i32,
    owner: String,
    ttl_ms: i64,
    channel: String,
}

/// A PostgreSQL lease: our row, and the connection it was granted on
/// (release needs no new connect).
struct PgHeld {
    client: Client,
    row: Row,
    /// `--min-hold`: the release keeps the row until the grant plus this.
    min_hold: Option<Duration>,
}

impl PgHeld {
    fn new(client: Client, tables: &Tables, req: &Request, slot: u32, channel: &str) -> PgHeld {
        PgHeld {
            row: Row {
                tables: tables.clone(),
                name: req.name.to_string(),
                slot: slot as i32,
                owner: req.owner.secret.clone(),
                ttl_ms: req.timing.ttl.as_millis() as i64,
                channel: channel.to_string(),
            },
            client,
            min_hold: req.min_hold,
        }
    }
}

impl Held for PgHeld {
    fn renewer(&self) -> Renewing {
        // Any connection can extend the row: each renewer opens its own.
        let (client, row) = (self.client.fresh(), self.row.clone());
        Renewing::Anywhere(Box::new(move || {
            Box::new(PgRenewer {
                client: client.fresh(),
                row: row.clone(),
            })
        }))
    }

    fn release(mut self: Box<Self>) -> Result<bool, Error> {
        let r = &self.row;
        let doing = format!("releasing {}", r.name);
        // The window in whole µs (the server's resolution), rounded up: it
        // ends no sooner than asked.
        let window = self.min_hold.map_or(0, |d| {
            i64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(i64::MAX)
        });
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 5] = [
            (&r.name, Type::TEXT),
            (&r.slot, Type::INT4),
            (&r.owner, Type::TEXT),
            (&r.channel, Type::TEXT),
            (&window, Type::INT8),
        ];
        let sql = r.tables.release();
        // The connection may have gone while the job ran: once more on a new one.
        let rows = match self.client.query(&sql, &params) {
            Err(e) if e.is_transient() => self.client.query(&sql, &params),
            done => done,
        }
        .map_err(|e| self.client.failed(&doing, e))?;
        let count = |i: usize| rows.first().map_or(0, |row| row.get::<_, i64>(i));
        if count(1) > 0 {
            log::info(format!(
                "released {}; kept by --min-hold until {} after its grant",
                r.name,
                crate::text::duration(self.min_hold.unwrap_or_default())
            ));
        } else {
            log::info(format!("released {}", r.name));
        }
        Ok(count(0) > 0)
    }

    fn give_back(mut self: Box<Self>) -> Result<bool, Error> {
        self.min_hold = None;
        self.release()
    }
}

struct PgRenewer {
    client: Client,
    row: Row,
}

impl Renewer for PgRenewer {
    fn renew(&mut self) -> Result<Renewal, Error> {
        let r = &self.row;
        // One statement: extended only while the row is still ours and
        // unexpired on the server's clock; no row back means lost.
        let rows = match self.client.query(
            &r.tables.renew(),
            &[
                (&r.name, Type::TEXT),
                (&r.slot, Type::INT4),
                (&r.owner, Type::TEXT),
                (&r.ttl_ms, Type::INT8),
            ],
        ) {
            Ok(rows) => rows,
            // The table (or schema) is gone, and our row with it.
            Err(_) if missing(self.client.last_code.as_deref()) => return Ok(Renewal::Lost),
            Err(e) => return Err(e),
        };
        let Some(row) = rows.first() else {
            return Ok(Renewal::Lost);
        };
        // Renewed all the same: the lease stays ours while the job stops.
        let label = row.get::<_, Option<String>>(1).unwrap_or_default();
        if let (_, Some(by)) = split_label(&label) {
            return Ok(Renewal::Preempted { by: by.to_string() });
        }
        Ok(Renewal::Renewed {
            ttl: Duration::from_millis(r.ttl_ms as u64),
        })
    }
}
