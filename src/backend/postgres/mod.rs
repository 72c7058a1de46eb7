//! PostgreSQL, a dialect of the SQL engine (`backend::sql`): a lease is a
//! row of a table, not a session or advisory lock, so a reconnect or a
//! transaction-pooling proxy does not lose it. One row per (name, slot) with its owner, token and expiry;
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
//! table); `doctor.rs` the read-only checks, `catalog.rs` those of
//! lockrun's objects; `sql.rs` the tables and every statement;
//! `dialect.rs` what the SQL engine (`backend::sql`) asks of PostgreSQL,
//! `take.rs` the statements that end a look, `leave.rs` the way out of
//! the queue on a signal. This file holds the engine's row of the scheme
//! table.

mod address;
mod catalog;
mod client;
mod dialect;
mod doctor;
mod leave;
mod sql;
mod take;
mod tls;

use std::time::Duration;

pub use address::parse;

use super::EngineInfo;

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
