//! `lockrun doctor`'s look at lockrun's objects in the catalog: the
//! schema, the two tables and the token sequence, whether each is
//! lockrun's (its kind and columns), and the current role's rights on it
//! or to create it. Only reads: the catalogs (readable by every role) and
//! `has_*_privilege`.

use tokio_postgres::Row;
use tokio_postgres::types::Type;

use super::client::Client;
use super::doctor::ask;
use super::sql::Tables;
use crate::backend::{Check, Error};

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
pub fn tables(client: &mut Client, schema: &str, role: &str) -> Result<Vec<Check>, Error> {
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
