//! MySQL's tables as the server has them: created on first use, refused
//! when they cannot keep two holders apart (not InnoDB, a binary log that
//! takes statements), and what to say when a name's looks keep stalling
//! or its tokens are used up.

use super::client::{Client, int, text};
use super::session;
use super::shape;
use super::sql::{Tables, lit, not_innodb};
use crate::backend::Error;
use crate::log;

/// Create lockrun's tables (lockrun-engines(7) "MYSQL AND MARIADB").
pub fn create(c: &mut Client, t: &Tables) -> Result<(), Error> {
    log::info(format!(
        "creating lockrun's tables {}_leases, {}_waiters and {}_tokens",
        t.base, t.base, t.base
    ));
    let f = c.flight(&t.create());
    let Some((at, e)) = f.failed else {
        return Ok(());
    };
    let code = c.last_code;
    let database = crate::text::printable(&c.url().database).into_owned();
    match e {
        Error::Refused(m) if matches!(code, Some(1142 | 1044)) => Err(Error::Refused(format!(
            "cannot create lockrun's tables in database {database}: {m}; create them once \
             as a user that may (lockrun-engines(7) \"MYSQL AND MARIADB\")"
        ))),
        Error::Refused(m) => {
            let table = ["tokens", "leases", "waiters"]
                .get(at)
                .map_or(String::new(), |name| format!("{}_{name}", t.base));
            // A server that makes new tables in another engine refuses
            // InnoDB (1290), or makes one whose keys are too long (1071).
            if let Some(engine) = enforced_engine(c) {
                return Err(Error::Refused(format!(
                    "cannot create lockrun's table {database}.{table}: the server makes \
                     every new table in {engine} (enforce_storage_engine), and lockrun \
                     needs InnoDB, whose transactions and row locks keep two holders \
                     apart: set enforce_storage_engine to InnoDB, or to nothing"
                )));
            }
            if innodb_read_only(c) {
                return Err(Error::Refused(format!(
                    "cannot create lockrun's table {database}.{table}: the server's InnoDB \
                     is read-only (innodb_read_only = ON); point lockrun at a server that \
                     may write"
                )));
            }
            let keys = if matches!(code, Some(1071 | 1709)) {
                "; lockrun's keys on names need InnoDB's DYNAMIC rows (keys up to 3072 \
                 bytes): allow ROW_FORMAT=DYNAMIC on the server (innodb_default_row_format, \
                 innodb_file_per_table)"
            } else {
                ""
            };
            Err(Error::Refused(format!(
                "cannot create lockrun's table {database}.{table} in InnoDB: {m}{keys}"
            )))
        }
        e => Err(e),
    }
}

/// The server's InnoDB creates and writes nothing (`innodb_read_only`).
fn innodb_read_only(c: &mut Client) -> bool {
    let rows = c
        .flight_keeping(&["SELECT @@GLOBAL.innodb_read_only".into()], &[1193])
        .sets;
    rows.first()
        .and_then(|s| s.first())
        .and_then(|r| int(r, 0))
        .is_some_and(|v| v != 0)
}

/// The engine `enforce_storage_engine` makes every new table in, when
/// it is set and is not InnoDB (MariaDB; MySQL has no such setting).
fn enforced_engine(c: &mut Client) -> Option<String> {
    let rows = c
        .flight_keeping(&["SELECT @@GLOBAL.enforce_storage_engine".into()], &[1193])
        .sets;
    let engine = rows.first()?.first().and_then(|r| text(r, 0))?;
    (!engine.is_empty() && !engine.eq_ignore_ascii_case("InnoDB"))
        .then(|| crate::text::printable(&engine).into_owned())
}

/// Refuse tables that are not InnoDB (`Tables::engines`); true when all
/// of lockrun's tables are there and were checked, false when some are
/// not there yet (no answer: they must be checked once they are). Before
/// that, a server that logs statements (`binlog_format = STATEMENT`),
/// under which InnoDB refuses every READ COMMITTED write: lockrun's
/// sessions log rows instead where the user may set that, else it is
/// refused before any table is made.
pub fn check_engines(c: &mut Client, t: &Tables) -> Result<bool, Error> {
    // A server without these variables has no such log.
    let f = c.flight_keeping(&[t.engines(), session::BINLOG.into()], &[1193]);
    match f.failed {
        Some((0, e)) => return Err(e),
        Some((_, e)) if e.is_transient() => return Err(e),
        _ => {}
    }
    let sets = f.sets;
    if !c.row_binlog
        && let Some(r) = sets.get(1).and_then(|s| s.first())
        && int(r, 0).unwrap_or(0) != 0
        && text(r, 1).is_some_and(|f| f.eq_ignore_ascii_case("STATEMENT"))
    {
        match c.run(&[session::ROW_BINLOG.into()]) {
            Ok(_) => c.row_binlog = true,
            Err(Error::Transient(m)) => return Err(Error::Transient(m)),
            Err(_) => return Err(Error::Refused(session::STATEMENT_BINLOG.into())),
        }
    }
    let Some(r) = not_innodb(&sets[0]) else {
        return Ok(sets[0].len() == 3);
    };
    let table = text(r, 0).unwrap_or_default();
    let engine = text(r, 1).unwrap_or_default();
    Err(Error::Refused(format!(
        "lockrun's table {}.{} is in the {} engine, which has no transactions or row \
         locks to keep two holders apart: make it InnoDB (ALTER TABLE … ENGINE=InnoDB \
         while nothing runs; check enforce_storage_engine)",
        crate::text::printable(&c.url().database),
        crate::text::printable(&table),
        crate::text::printable(&engine),
    )))
}

/// what it needs, read from the server, or else what did not happen.
pub fn stalled(c: &mut Client, t: &Tables, tries: u32) -> Error {
    let database = c.url().database.clone();
    let f = c.flight(&shape::describe(t));
    let diffs = shape::differences(&t.base, &f.sets);
    if !diffs.is_empty() {
        return Error::Refused(shape::said(&database, &diffs));
    }
    Error::Refused(format!(
        "after {tries} tries, the name's rows in database {}'s {}_tokens and {}_leases \
         are still not as lockrun wrote them (something changes or removes them); \
         run lockrun doctor",
        crate::text::printable(&database),
        t.base,
        t.base,
    ))
}

/// A name whose counter (or a lease row's token) is at BIGINT's
/// largest: no greater token can be given, and lockrun gives none
/// lower. Clearing the row is the operator's choice, said with what
/// it costs.
pub fn tokens_used_up(c: &Client, t: &Tables, name: &str) -> Error {
    let database = crate::text::printable(&c.url().database).into_owned();
    Error::Refused(format!(
        "the name's token counter is at its maximum ({}, BIGINT's largest; set by hand or \
         imported), so no greater token can be given: to clear it, while nothing holds \
         the name, DELETE FROM {database}.{tokens} WHERE name = {n}, and its rows from \
         {leases}; its tokens then start again from the server's clock in microseconds, \
         below those given before",
        i64::MAX,
        tokens = t.tokens,
        leases = t.leases,
        n = lit(name),
    ))
}
