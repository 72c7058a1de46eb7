//! PostgreSQL, a dialect of the SQL engine: a lease is a row of a table, not a session or
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
//! statement; `dialect.rs` what the SQL engine (`backend::sql`) asks of
//! PostgreSQL, `take.rs` the statements that end a look, `leave.rs` the
//! way out of the queue on a signal. This file holds the engine's row,
//! the lease and its renewal.

mod address;
mod client;
mod dialect;
mod doctor;
mod leave;
mod sql;
mod take;
mod tls;

use std::time::Duration;

use tokio_postgres::types::Type;

pub use address::parse;
use client::Client;
use dialect::missing;
use sql::Tables;

use super::sql::{released, renewal, window_us};
use super::{EngineInfo, Error, Held, Request};
use super::{Renewal, Renewer, Renewing};
use crate::backend::drive::Transport;

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
    fn new(client: Client, tables: &Tables, req: &Request, slot: u32) -> PgHeld {
        PgHeld {
            row: Row {
                tables: tables.clone(),
                name: req.name.to_string(),
                slot: slot as i32,
                owner: req.owner.secret.clone(),
                ttl_ms: req.timing.ttl.as_millis() as i64,
                channel: tables.channel(req.name),
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
        let window = window_us(self.min_hold);
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
        released(&r.name, count(1) > 0, self.min_hold);
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
        let label = rows
            .first()
            .map(|row| row.get::<_, Option<String>>(1).unwrap_or_default());
        Ok(renewal(label, r.ttl_ms))
    }
}
