//! MySQL and MariaDB, a dialect of the SQL engine (`backend::sql`): a
//! lease is a row of an InnoDB table, not a `GET_LOCK` session lock, so a
//! reconnect or a proxy does not lose it. One row per (name, slot) with its owner, token and expiry; every time is
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
//! queue on a signal. This file holds the engine's row of the scheme
//! table.

mod address;
mod client;
mod create;
mod dialect;
mod doctor;
mod leave;
mod session;
mod shape;
mod sql;
mod take;

use std::time::Duration;

pub use address::parse;

use super::EngineInfo;

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
