//! MySQL and MariaDB, a dialect of the SQL engine: a lease is a row of an InnoDB table, not
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
//! `dialect.rs` what the SQL engine (`backend::sql`) asks of MySQL,
//! `take.rs` the statements that end a look and the wake-up locks,
//! `create.rs` the tables made and refused, `leave.rs` the way out of the
//! queue on a signal. This file holds the engine's row, the lease and its
//! renewal.

mod address;
mod client;
mod create;
mod dialect;
mod doctor;
mod leave;
mod shape;
mod sql;
mod take;

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use address::parse;
use client::{Client, int, text};
use dialect::missing;
use sql::{Tables, lit, wake_key};

use super::sql::{released, renewal, window_us};
use super::{EngineInfo, Error, Held, Request};
use super::{Renewal, Renewer, Renewing};
use crate::backend::drive::Transport;

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
        let window = window_us(self.min_hold);
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
        released(&r.name, kept > 0, self.min_hold);
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
        let row = sets[1].first().filter(|row| int(row, 0).unwrap_or(0) != 0);
        let label = row.map(|row| text(row, 1).unwrap_or_default());
        Ok(renewal(label, r.ttl_ms))
    }
}
