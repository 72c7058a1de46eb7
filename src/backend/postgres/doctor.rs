//! `lockrun doctor` on PostgreSQL: reachable, round trip, version, the
//! server's role (primary or standby) and standbys, the clock, the settings
//! that bear on lockrun's statements, a transaction-pooling proxy if one
//! shows, and lockrun's tables with the current role's rights on them (or
//! to create them). Only reads: catalogs, settings and `has_*_privilege`;
//! nothing is created, not even the schema (lockrun-engines(7) "POSTGRESQL").

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;

use super::address::{PgUrl, schema_of};
use super::catalog::tables;
use super::client::{Call, Client, Params};
use super::sql::bounded;
use crate::backend::doctor::{fleet_check, shown, time_round_trips};
use crate::backend::sql::doctor::{Doctor, examine};
use crate::backend::{Check, Error, Opening};

/// The oldest server lockrun's tables work on (identity columns, `CREATE
/// SEQUENCE … AS bigint`).
const OLDEST: i32 = 100_000;

pub fn doctor(url: &PgUrl, how: &Opening) -> Vec<Check> {
    let at = schema_of(&how.prefix).map(|schema| {
        let url = Arc::new(url.clone());
        PgDoctor {
            client: Client::new(Arc::clone(&url), how.op),
            url,
            how,
            schema,
            pids: Vec::new(),
        }
    });
    examine(at, how.op)
}

/// The doctor at one PostgreSQL database and schema.
struct PgDoctor<'a> {
    client: Client,
    url: Arc<PgUrl>,
    how: &'a Opening,
    schema: String,
    /// The server processes that answered this connection.
    pids: Vec<i32>,
}

impl Doctor for PgDoctor<'_> {
    type About = Row;

    fn about(&mut self) -> Result<Option<Row>, String> {
        match ask(
            &mut self.client,
            "SELECT current_setting('server_version'), \
               current_setting('server_version_num')::int, \
               current_user::text, current_database()::text, pg_is_in_recovery()",
            &[],
        ) {
            Ok(rows) => Ok(rows.into_iter().next()),
            Err(Error::Transient(m)) => {
                Err(format!("{m}; check the address and that PostgreSQL runs"))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn reached(&self, about: &Row, took: &str) -> String {
        format!(
            "PostgreSQL at {} answered in {took} as role {} in database {}",
            self.url.display,
            about.get::<_, String>(2),
            about.get::<_, String>(3)
        )
    }

    fn round_trips(&mut self) -> Result<(Duration, f64), Error> {
        round_trips(&mut self.client, &mut self.pids)
    }

    fn rest(&mut self, about: Row) -> Vec<Check> {
        let (client, how) = (&mut self.client, self.how);
        let mut out = vec![version_check(about.get(0), about.get(1))];
        if about.get::<_, bool>(4) {
            out.push(Check::fail(
                "primary",
                "this server is a standby (in recovery): it is read-only, so every grant \
                 fails; point lockrun at the primary",
            ));
        }
        out.push(pooler_check(client, &self.url, how, &self.pids));
        match settings(client, how) {
            Ok(checks) => out.extend(checks),
            Err(e) => out.push(Check::warn("settings", format!("could not be read: {e}"))),
        }
        let role: String = about.get(2);
        match tables(client, &self.schema, &role) {
            Ok(checks) => out.extend(checks),
            Err(e) => out.push(Check::fail("tables", e.to_string())),
        }
        out
    }
}

/// One check's statement, run as a run runs its own: inside a transaction
/// started as lockrun starts each of its transactions (READ COMMITTED,
/// `statement_timeout` and `lock_timeout` set to the bound on one
/// request), in one flight. So a role's default `statement_timeout`, too
/// short for a catalog query but overridden by every run, fails no check,
/// and each check is bounded by `op` on the server as well as here. Only
/// `SET LOCAL`: nothing outlives the transaction, also through a pooler.
pub(super) fn ask(client: &mut Client, sql: &str, params: &Params) -> Result<Vec<Row>, Error> {
    let begin = bounded(client.op);
    let done = client.pipeline(&[
        Call::Batch(&begin),
        Call::Query(sql, params),
        Call::Batch("COMMIT"),
    ]);
    match done {
        Ok(mut rows) => Ok(rows.remove(1)),
        Err(e) => {
            // A failed transaction: the next check starts afresh.
            client.drop_connection();
            Err(e)
        }
    }
}

/// Five round trips that read the server's clock and its backend: the
/// slowest, and the server's clock minus ours.
fn round_trips(client: &mut Client, pids: &mut Vec<i32>) -> Result<(Duration, f64), Error> {
    let (timed, failed) = time_round_trips(|| {
        let rows = ask(
            client,
            "SELECT extract(epoch FROM clock_timestamp())::float8, pg_backend_pid()",
            &[],
        )?;
        let row = rows
            .first()
            .ok_or_else(|| Error::Refused("the server answered with no row".into()))?;
        pids.push(row.get(1));
        Ok(row.get::<_, f64>(0))
    });
    match failed {
        Some(e) => Err(e),
        None => Ok((
            timed.worst.unwrap_or_default(),
            timed.offset.unwrap_or_default(),
        )),
    }
}

fn version_check(version: String, num: i32) -> Check {
    if num >= OLDEST {
        Check::ok("version", format!("PostgreSQL {version}"))
    } else {
        Check::fail(
            "version",
            format!("PostgreSQL {version}: lockrun needs PostgreSQL 10 or later"),
        )
    }
}

/// A transaction-pooling proxy shows as one server backend answering two
/// client connections, or one client connection answered by several
/// backends; a direct connection always has a backend of its own.
fn pooler_check(client: &mut Client, url: &Arc<PgUrl>, how: &Opening, pids: &[i32]) -> Check {
    let mut other = Client::new(Arc::clone(url), how.op);
    let mut theirs = Vec::new();
    let mut ours = pids.to_vec();
    let pid = |c: &mut Client| -> Option<i32> {
        ask(c, "SELECT pg_backend_pid()", &[])
            .ok()?
            .first()
            .map(|r| r.get(0))
    };
    for _ in 0..3 {
        theirs.extend(pid(&mut other));
        ours.extend(pid(client));
    }
    drop(other);
    let varied = ours.windows(2).any(|w| w[0] != w[1]);
    let shared = theirs.iter().any(|p| ours.contains(p));
    if varied || shared {
        Check::warn(
            "pooler",
            "statements of one connection ran on several server connections, or two \
             connections on one: a transaction-pooling proxy (PgBouncer pool_mode = \
             transaction) is between. Leases work through it, but LISTEN does not, so a \
             waiter's hand-off costs up to ttl/9 (lockrun-engines(7) \"POSTGRESQL\"); point lockrun at \
             the server or a session pool for prompt hand-offs",
        )
    } else {
        Check::ok(
            "pooler",
            "no transaction pooling seen: each connection had a server connection of its own",
        )
    }
}

/// A timeout setting in ms as a person reads it.
fn timeout_shown(ms: i64) -> String {
    if ms <= 0 {
        "0 (none)".into()
    } else {
        shown(Duration::from_millis(ms as u64))
    }
}

/// The settings that bear on lockrun's statements, as the server applies
/// them to this role and database: the session's values (`reset_val`),
/// not those `ask`'s transaction sets for itself.
fn settings(client: &mut Client, how: &Opening) -> Result<Vec<Check>, Error> {
    let rows = ask(
        client,
        "SELECT current_setting('default_transaction_isolation'), \
           (SELECT reset_val::bigint FROM pg_settings \
             WHERE name = 'idle_in_transaction_session_timeout'), \
           current_setting('default_transaction_read_only'), \
           (SELECT reset_val::bigint FROM pg_settings WHERE name = 'statement_timeout'), \
           current_setting('synchronous_standby_names'), \
           current_setting('synchronous_commit'), \
           (SELECT count(*) FROM pg_stat_replication), \
           current_setting('max_connections')::int \
             - current_setting('superuser_reserved_connections')::int, \
           (SELECT rolconnlimit FROM pg_roles WHERE rolname = current_user)",
        &[],
    )?;
    let r = rows
        .first()
        .ok_or_else(|| Error::Refused("the server answered with no row".into()))?;
    let mut out = Vec::new();
    let read_only: String = r.get(2);
    if read_only == "on" {
        // Every transaction of lockrun's starts read-only: no grant, no
        // renewal, no release can write.
        out.push(Check::fail(
            "default_transaction_read_only",
            "on for this role or database: every transaction starts read-only, so every \
             grant fails and every run ends with 69; ALTER ROLE … RESET \
             default_transaction_read_only (or ALTER DATABASE …) for lockrun's role",
        ));
    }
    let isolation: String = r.get(0);
    out.push(Check::ok(
        "default_transaction_isolation",
        if isolation == "read committed" {
            isolation
        } else {
            format!(
                "{isolation}: lockrun's transactions ask for read committed themselves; its \
                 single statements (renewal, release) may meet serialization failures under \
                 load, which it retries"
            )
        },
    ));
    let idle = timeout_shown(r.get::<_, Option<i64>>(1).unwrap_or(0));
    out.push(Check::ok(
        "idle_in_transaction_session_timeout",
        format!(
            "{idle} (lockrun sets its own inside each of its transactions: twice the bound on \
             one request, so a client stopped mid-transaction holds no name up for long)"
        ),
    ));
    out.push(statement_timeout_check(r.get(3), how.op));
    let (all, role): (i32, Option<i32>) = (r.get(7), r.get(8));
    out.push(match role {
        Some(role) if role >= 0 && role < all => fleet_check(
            i64::from(role),
            &format!("CONNECTION LIMIT {role} for this role"),
        ),
        _ => fleet_check(
            i64::from(all),
            &format!("max_connections less the superusers' {all}"),
        ),
    });
    out.push(standbys_check(r.get(4), r.get(5), r.get(6)));
    Ok(out)
}

/// A `statement_timeout` below the bound on one request cancels
/// renewals and releases.
fn statement_timeout_check(timeout_ms: Option<i64>, op: Duration) -> Check {
    let timeout = timeout_shown(timeout_ms.unwrap_or(0));
    let op_ms = op.as_millis() as i64;
    match timeout_ms {
        Some(ms) if ms > 0 && ms < op_ms => Check::warn(
            "statement_timeout",
            format!(
                "{timeout}, below the bound on one request ({}): renewals and releases run \
                 under it as single statements, and the server cancels any slower than it \
                 (at a few ms, nearly all: a job longer than its ttl loses its lease, and \
                 every release leaves the lease to expire); ALTER ROLE … SET \
                 statement_timeout = 0 (or at least {}) for lockrun's role",
                shown(op),
                shown(op)
            ),
        ),
        _ => Check::ok("statement_timeout", timeout),
    }
}

/// Standbys streaming from this server, and whether a failover to one
/// could lose a grant.
fn standbys_check(sync_names: String, sync_commit: String, standbys: i64) -> Check {
    if standbys == 0 {
        Check::ok(
            "standbys",
            "none streaming from this server: no failover can lose a grant, and none can \
             take over if it fails",
        )
    } else if sync_names.trim().is_empty() || !matches!(sync_commit.as_str(), "on" | "remote_apply")
    {
        Check::warn(
            "standbys",
            format!(
                "{standbys} asynchronous (synchronous_standby_names {sync_names:?}, \
                 synchronous_commit {sync_commit}): a failover can lose the last grants and \
                 hand a name out twice (lockrun-safety(7) \"GUARANTEES\"); set \
                 synchronous_standby_names and synchronous_commit = on"
            ),
        )
    } else {
        Check::ok(
            "standbys",
            format!(
                "{standbys}, synchronous ({sync_names}): a grant is on a standby before its job starts"
            ),
        )
    }
}
