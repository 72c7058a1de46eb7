//! `lockrun doctor` on PostgreSQL: reachable, round trip, version, the
//! server's role (primary or standby) and standbys, the clock, the settings
//! that bear on lockrun's statements, a transaction-pooling proxy if one
//! shows, and lockrun's tables with the current role's rights on them (or
//! to create them). Only reads: catalogs, settings and `has_*_privilege`;
//! nothing is created, not even the schema (lockrun-engines(7) "POSTGRESQL").

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::address::{PgUrl, schema_of};
use super::client::{Call, Client, Params};
use super::sql::{Tables, bounded};
use crate::backend::doctor::{shown, time_round_trips};
use crate::backend::sql::doctor::{Doctor, examine};
use crate::backend::{Check, Error, Opening};

/// The oldest server lockrun's tables work on (identity columns, `CREATE
/// SEQUENCE … AS bigint`).
const OLDEST: i32 = 100_000;

/// A table's columns as (name, type as `format_type` writes it).
type Columns = &'static [(&'static str, &'static str)];

/// The columns lockrun reads and writes, by table; other columns may be
/// there as long as they have defaults.
const LEASE_COLUMNS: [(&str, &str); 10] = [
    ("name", "text"),
    ("slot", "integer"),
    ("owner", "text"),
    ("label", "text"),
    ("token", "bigint"),
    ("mode", "text"),
    ("lim", "integer"),
    ("expires_at", "timestamp with time zone"),
    ("granted_at", "timestamp with time zone"),
    ("revoked", "boolean"),
];
const WAITER_COLUMNS: [(&str, &str); 7] = [
    ("name", "text"),
    ("seq", "bigint"),
    ("owner", "text"),
    ("label", "text"),
    ("mode", "text"),
    ("lim", "integer"),
    ("expires_at", "timestamp with time zone"),
];

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
fn ask(client: &mut Client, sql: &str, params: &Params) -> Result<Vec<Row>, Error> {
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
           (SELECT count(*) FROM pg_stat_replication)",
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

/// One object of lockrun's in the catalog.
struct Object {
    /// Its relation name, unqualified.
    rel: String,
    kind: String,
    rights: Vec<(&'static str, Option<bool>)>,
    /// UPDATE on the sequence: what moves it up to a token floored by
    /// the clock.
    moves_sequence: Option<bool>,
}

/// Where lockrun's objects are to be, and what the current role may do.
struct Place<'a> {
    schema: &'a str,
    role: &'a str,
    /// USAGE on the schema.
    usage: bool,
    /// CREATE on the schema.
    create: bool,
}

/// lockrun's schema, its three objects, and the current role's rights on
/// them, from the catalogs (readable by every role) and `has_*_privilege`.
fn tables(client: &mut Client, schema: &str, role: &str) -> Result<Vec<Check>, Error> {
    let t = Tables::new(schema);
    let ns = ask(
        client,
        "SELECT has_schema_privilege(n.oid, 'USAGE'), has_schema_privilege(n.oid, 'CREATE') \
         FROM pg_namespace n WHERE n.nspname = $1",
        &[(&schema, Type::TEXT)],
    )?;
    let db_create = ask(
        client,
        "SELECT has_database_privilege(current_database(), 'CREATE')",
        &[],
    )?
    .first()
    .is_some_and(|r| r.get::<_, bool>(0));
    let Some(ns) = ns.first() else {
        return Ok(vec![no_schema(schema, role, db_create)]);
    };
    let at = Place {
        schema,
        role,
        usage: ns.get(0),
        create: ns.get(1),
    };
    let mut out = Vec::new();
    if !at.usage {
        out.push(Check::fail(
            "schema",
            format!(
                "role {role} may not use schema {schema}: GRANT USAGE ON SCHEMA {schema} TO \
                 {role} (lockrun-engines(7) \"POSTGRESQL\")"
            ),
        ));
    }
    let objects = catalog(client, schema)?;
    let columns = ask(
        client,
        "SELECT c.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod) \
         FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid \
           JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname IN ('lockrun_leases', 'lockrun_waiters') \
           AND a.attnum > 0 AND NOT a.attisdropped",
        &[(&schema, Type::TEXT)],
    )?;
    let lacking = |table: &str, want: &[(&str, &str)]| -> Vec<String> {
        want.iter()
            .filter(|(col, ty)| {
                !columns.iter().any(|r| {
                    r.get::<_, String>(0) == table
                        && r.get::<_, String>(1) == *col
                        && r.get::<_, String>(2) == *ty
                })
            })
            .map(|(col, ty)| format!("{col} {ty}"))
            .collect()
    };
    let wanted: [(&'static str, &str, &str, Columns); 3] = [
        ("leases table", "lockrun_leases", &t.leases, &LEASE_COLUMNS),
        (
            "waiters table",
            "lockrun_waiters",
            &t.waiters,
            &WAITER_COLUMNS,
        ),
        ("token sequence", "lockrun_tokens", &t.tokens, &[]),
    ];
    for (topic, rel, full, want) in wanted {
        let found = objects.iter().find(|o| o.rel == rel);
        let sequence = want.is_empty();
        out.push(object_check(
            topic,
            found,
            || lacking(rel, want),
            sequence,
            full,
            &at,
        ));
    }
    Ok(out)
}

/// No schema of lockrun's yet: fine when the role may create it.
fn no_schema(schema: &str, role: &str, db_create: bool) -> Check {
    if db_create {
        Check::ok(
            "tables",
            format!(
                "schema {schema} does not exist yet: role {role} may create it and \
                 lockrun's tables in it, as the first run does"
            ),
        )
    } else {
        Check::fail(
            "tables",
            format!(
                "schema {schema} does not exist and role {role} may not create it: \
                 create it and lockrun's tables once as a role that may, then grant \
                 this one what lockrun-engines(7) \"POSTGRESQL\" lists"
            ),
        )
    }
}

/// lockrun's objects found in `schema`, with the current role's rights.
fn catalog(client: &mut Client, schema: &str) -> Result<Vec<Object>, Error> {
    let rows = ask(
        client,
        "SELECT c.relname::text, c.relkind::text, \
           CASE WHEN c.relkind IN ('r', 'p') THEN has_table_privilege(c.oid, 'SELECT') END, \
           CASE WHEN c.relkind IN ('r', 'p') THEN has_table_privilege(c.oid, 'INSERT') END, \
           CASE WHEN c.relkind IN ('r', 'p') THEN has_table_privilege(c.oid, 'UPDATE') END, \
           CASE WHEN c.relkind IN ('r', 'p') THEN has_table_privilege(c.oid, 'DELETE') END, \
           CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(c.oid, 'USAGE') \
             OR has_sequence_privilege(c.oid, 'UPDATE') END, \
           CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(c.oid, 'UPDATE') END \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 \
           AND c.relname IN ('lockrun_leases', 'lockrun_waiters', 'lockrun_tokens')",
        &[(&schema, Type::TEXT)],
    )?;
    Ok(rows
        .iter()
        .map(|r: &Row| Object {
            rel: r.get(0),
            kind: r.get(1),
            rights: vec![
                ("SELECT", r.get(2)),
                ("INSERT", r.get(3)),
                ("UPDATE", r.get(4)),
                ("DELETE", r.get(5)),
                ("USAGE", r.get(6)),
            ],
            moves_sequence: r.get(7),
        })
        .collect())
}

/// One object's check: there, lockrun's by
/// kind and columns (`lacking`), and usable by the role.
fn object_check(
    topic: &'static str,
    found: Option<&Object>,
    lacking: impl FnOnce() -> Vec<String>,
    sequence: bool,
    full: &str,
    at: &Place,
) -> Check {
    let (schema, role) = (at.schema, at.role);
    let Some(o) = found else {
        return if at.create {
            Check::ok(
                topic,
                format!(
                    "{full} does not exist yet: role {role} may create it, as the first run does"
                ),
            )
        } else {
            Check::fail(
                topic,
                format!(
                    "{full} does not exist and role {role} may not create it in schema \
                     {schema}: create lockrun's tables once as a role that may (lockrun-engines(7) \
                     \"POSTGRESQL\")"
                ),
            )
        };
    };
    let right_kind = if sequence {
        o.kind == "S"
    } else {
        matches!(o.kind.as_str(), "r" | "p")
    };
    if !right_kind {
        return Check::fail(
            topic,
            format!(
                "{full} is not a {}: it is not lockrun's; remove it or choose another --prefix",
                if sequence { "sequence" } else { "table" }
            ),
        );
    }
    let lacking = lacking();
    if !lacking.is_empty() {
        return Check::fail(
            topic,
            format!(
                "{full} is not lockrun's (it lacks {}); remove it or choose another --prefix",
                lacking.join(", ")
            ),
        );
    }
    rights_check(topic, o, sequence, full, at)
}

/// The role's rights on one of lockrun's objects.
fn rights_check(topic: &'static str, o: &Object, sequence: bool, full: &str, at: &Place) -> Check {
    let (schema, role) = (at.schema, at.role);
    let grant = if sequence {
        format!("GRANT USAGE, UPDATE ON SEQUENCE {full} TO {role}")
    } else {
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {full} TO {role}")
    };
    let missing: Vec<&str> = o
        .rights
        .iter()
        .filter(|(_, held)| *held == Some(false))
        .map(|(what, _)| *what)
        .collect();
    let unmoved = o.moves_sequence == Some(false);
    if missing.is_empty() && at.usage && unmoved {
        Check::warn(
            topic,
            format!(
                "{full}: role {role} lacks UPDATE on it: its tokens are floored by the \
                 server's clock all the same, but the sequence is not moved up to them, so \
                 an older lockrun, which takes nextval alone, may hand out lower ones; \
                 {grant} (lockrun-engines(7) \"POSTGRESQL\")"
            ),
        )
    } else if missing.is_empty() && at.usage {
        Check::ok(
            topic,
            format!("{full}: role {role} may use it as lockrun does"),
        )
    } else if missing.is_empty() {
        Check::fail(
            topic,
            format!("{full}: role {role} may not reach it (no USAGE on schema {schema})"),
        )
    } else {
        Check::fail(
            topic,
            format!(
                "{full}: role {role} lacks {} on it: every run would fail with 69; {grant} \
                 (lockrun-engines(7) \"POSTGRESQL\")",
                missing.join(", ")
            ),
        )
    }
}
