//! `lockrun doctor` for MySQL and MariaDB: read-only checks, one line each
//! (lockrun-engines(7) "MYSQL AND MARIADB").

use std::sync::Arc;
use std::time::Duration;

use mysql::Row;

use super::address::{MyUrl, tables_of};
use super::client::{Client, float, int, text};
use super::session;
use super::shape;
use super::sql::{Tables, not_innodb};
use crate::backend::doctor::{fleet_check, time_round_trips};
use crate::backend::sql::doctor::{Doctor, examine};
use crate::backend::{Check, Error, Opening};

pub fn doctor(url: &MyUrl, how: &Opening) -> Vec<Check> {
    let at = tables_of(&how.prefix).map(|base| MyDoctor {
        client: Client::new(Arc::new(url.clone()), how.op),
        url,
        base,
    });
    examine(at, how.op)
}

/// The doctor at one MySQL or MariaDB database.
struct MyDoctor<'a> {
    client: Client,
    url: &'a MyUrl,
    /// The tables' names less their `_leases`, `_waiters`, `_tokens`.
    base: String,
}

impl Doctor for MyDoctor<'_> {
    type About = Row;

    fn about(&mut self) -> Result<Option<Row>, String> {
        let c = &mut self.client;
        let e = match c.query(
            "SELECT VERSION(), CURRENT_USER(), DATABASE(), @@global.read_only, \
               @@session.time_zone, @@global.time_zone, @@version_comment, \
               @@global.max_connections, @@session.max_user_connections"
                .into(),
        ) {
            Ok(rows) => return Ok(rows.into_iter().next()),
            Err(e) => e,
        };
        Err(match e {
            Error::Transient(m) => format!("{m}; check the address and that the server runs"),
            // No right to the database: the grant, to the user as the server named it.
            e if c.last_code == Some(1044) => {
                let said = denied(&e);
                let who = said
                    .split_once("for user ")
                    .and_then(|(_, r)| r.split_once(" to database"))
                    .map(|(who, _)| who.to_string())
                    .unwrap_or_else(|| grantee(&format!("{}@%", self.url.user)));
                format!("{said}: {}", grant(&self.url.database, &who, true))
            }
            e => e.to_string(),
        })
    }

    fn reached(&self, about: &Row, took: &str) -> String {
        format!(
            "{} answered in {took} as {} in database {}",
            self.url.display,
            text(about, 1).unwrap_or_default(),
            text(about, 2).unwrap_or_default()
        )
    }

    fn round_trips(&mut self) -> Result<(Duration, f64), Error> {
        let (timed, failed) = time_round_trips(|| {
            let rows = self.client.query(
                "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) / 1e6"
                    .into(),
            )?;
            rows.first()
                .and_then(|r| float(r, 0))
                .ok_or_else(|| Error::Refused("the server answered with no row".into()))
        });
        match failed {
            Some(e) => Err(e),
            None => Ok((
                timed.worst.unwrap_or_default(),
                timed.offset.unwrap_or_default(),
            )),
        }
    }

    fn rest(&mut self, about: Row) -> Vec<Check> {
        let client = &mut self.client;
        let version = text(&about, 0).unwrap_or_default();
        let mariadb = version.to_ascii_lowercase().contains("mariadb");
        let mut out = vec![version_check(&version, mariadb)];
        // Not in the first query: a server without InnoDB has no such variable.
        let innodb_read_only = client
            .query("SELECT @@GLOBAL.innodb_read_only".into())
            .ok()
            .and_then(|r| r.first().and_then(|r| int(r, 0)))
            .unwrap_or(0)
            != 0;
        out.push(read_only_check(innodb_read_only, &about));
        out.push(Check::ok(
            "time_zone",
            format!(
                "session {}, global {} (lockrun reads UTC_TIMESTAMP, which no time zone moves)",
                text(&about, 4).unwrap_or_default(),
                text(&about, 5).unwrap_or_default()
            ),
        ));
        let (all, user) = (int(&about, 7).unwrap_or(0), int(&about, 8).unwrap_or(0));
        out.push(if user > 0 && user < all {
            fleet_check(user, &format!("max_user_connections {user}"))
        } else {
            fleet_check(all, &format!("max_connections {all}"))
        });
        let grantee = grantee(&text(&about, 1).unwrap_or_default());
        out.extend(replication(client, mariadb, &grantee));
        out.push(wake_check(client));
        out.push(binlog(client));
        let database = text(&about, 2).unwrap_or_default();
        out.push(if innodb_read_only {
            Check::fail(
                "tables",
                "neither created nor written while InnoDB is read-only (innodb_read_only = ON)",
            )
        } else {
            tables(client, &self.base, &database, &grantee)
        });
        out
    }
}

/// MariaDB 10.5 or MySQL 8 or later.
fn version_check(version: &str, mariadb: bool) -> Check {
    let (major, minor) = {
        let mut p = version
            .split(['.', '-'])
            .map(|x| x.parse::<u32>().unwrap_or(0));
        (p.next().unwrap_or(0), p.next().unwrap_or(0))
    };
    let new_enough = if mariadb {
        (major, minor) >= (10, 5)
    } else {
        major >= 8
    };
    if new_enough {
        Check::ok("version", version.to_string())
    } else {
        Check::warn(
            "version",
            format!(
                "{version}: lockrun is tested on MariaDB 10.11; MariaDB 10.5 or MySQL 8 or later is expected"
            ),
        )
    }
}

/// A server that may write: neither InnoDB nor the server read-only.
fn read_only_check(innodb_read_only: bool, about: &Row) -> Check {
    if innodb_read_only {
        Check::fail("read-only", INNODB_READ_ONLY)
    } else if int(about, 3).unwrap_or(0) != 0 {
        Check::fail(
            "read-only",
            "the server is read-only (read_only = ON): every grant fails; point lockrun at \
             the primary",
        )
    } else {
        Check::ok("read-only", "read_only = OFF, innodb_read_only = OFF")
    }
}

/// Why nothing can be done on a server whose InnoDB is read-only.
const INNODB_READ_ONLY: &str = "the server's InnoDB is read-only (innodb_read_only = ON): no \
    table can be created or written, so every run fails; start the server without \
    innodb_read_only, or point lockrun at one that may write";

/// `'user'@'host'` of `CURRENT_USER()`'s `user@host`, as a GRANT names it.
fn grantee(current: &str) -> String {
    let (user, host) = current.rsplit_once('@').unwrap_or((current, "%"));
    let q = |s: &str| format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"));
    format!("{}@{}", q(user), q(host))
}

/// The statement that gives `grantee` what lockrun needs in `database`
/// (lockrun-engines(7) "MYSQL AND MARIADB"), creating the tables included.
fn grant(database: &str, grantee: &str, create: bool) -> String {
    format!(
        "GRANT SELECT, INSERT, UPDATE, DELETE{} ON `{}`.* TO {grantee}",
        if create { ", CREATE" } else { "" },
        database.replace('`', "``")
    )
}

/// A refusal as the server said it, without what a run adds to it.
fn denied(e: &Error) -> String {
    let text = e.to_string();
    text.strip_suffix(super::client::GRANTS_HINT)
        .unwrap_or(&text)
        .to_string()
}

/// A replica, and whether a failover could lose a grant; Galera.
fn replication(client: &mut Client, mariadb: bool, grantee: &str) -> Vec<Check> {
    let mut out = Vec::new();
    let galera = client
        .query("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'".into())
        .ok()
        .and_then(|r| r.first().and_then(|r| text(r, 1)))
        .is_some_and(|v| v.eq_ignore_ascii_case("ON"));
    if galera {
        out.push(Check::warn(
            "galera",
            "Galera replication is on: a grant commits on every node; GET_LOCK is refused, so \
             waiters sleep until what is in their way lapses (slower hand-offs)",
        ));
    }
    let replica = client
        .query(if mariadb {
            "SHOW ALL SLAVES STATUS".into()
        } else {
            "SHOW REPLICA STATUS".into()
        })
        .map(|r| !r.is_empty());
    match replica {
        Ok(true) => out.push(Check::fail(
            "replication",
            "this server replicates from another: it is a replica; point lockrun at the primary",
        )),
        Ok(false) => {
            let semi = client
                .query(
                    "SHOW GLOBAL STATUS WHERE Variable_name IN \
                     ('Rpl_semi_sync_master_status', 'Rpl_semi_sync_source_status')"
                        .into(),
                )
                .ok()
                .and_then(|r| r.first().and_then(|r| text(r, 1)))
                .is_some_and(|v| v.eq_ignore_ascii_case("ON"));
            let replicas = client
                .query("SHOW SLAVE HOSTS".into())
                .map(|r| r.len())
                .unwrap_or(0);
            out.push(if replicas > 0 && !semi && !galera {
                Check::warn(
                    "replication",
                    format!(
                        "{replicas} replica(s) replicate asynchronously: a failover to one may \
                         lose the last grants (two holders at once until they lapse); use \
                         semi-synchronous replication, or fence with LOCKRUN_TOKEN"
                    ),
                )
            } else {
                Check::ok("replication", "a primary (no replication source)")
            });
        }
        Err(_) => out.push(Check::warn(
            "replication",
            format!(
                "not readable by this user: whether this server is a replica, or has \
                 replicas a failover could lose grants to, is unknown; to let doctor tell: \
                 GRANT {} ON *.* TO {grantee}",
                if mariadb {
                    "SLAVE MONITOR"
                } else {
                    "REPLICATION CLIENT"
                }
            ),
        )),
    }
    out
}

/// Whether waiters can be woken at once (GET_LOCK), or sleep.
fn wake_check(client: &mut Client) -> Check {
    match client.query("SELECT IS_FREE_LOCK('lockrun:doctor')".into()) {
        Ok(_) => Check::ok(
            "wake-up",
            "GET_LOCK is allowed: a release wakes the next waiter at once",
        ),
        Err(e) => Check::warn(
            "wake-up",
            format!("GET_LOCK is refused ({e}): waiters sleep until what is in their way lapses"),
        ),
    }
}

/// Whether the server's binary log takes statements, under which InnoDB
/// refuses lockrun's READ COMMITTED writes unless its sessions may log
/// rows (`create::check_engines` does the same before a run).
fn binlog(client: &mut Client) -> Check {
    let Ok(rows) = client.query(session::BINLOG.into()) else {
        return Check::ok("binlog", "no binary log this user can see");
    };
    let Some(r) = rows.first() else {
        return Check::ok("binlog", "no binary log this user can see");
    };
    let format = text(r, 1).unwrap_or_default();
    if int(r, 0).unwrap_or(0) == 0 {
        return Check::ok("binlog", "the binary log is off");
    }
    if !format.eq_ignore_ascii_case("STATEMENT") {
        return Check::ok("binlog", format!("binlog_format = {format}"));
    }
    match client.run(&[session::ROW_BINLOG.into()]) {
        Ok(_) => {
            client.row_binlog = true;
            Check::ok(
                "binlog",
                "binlog_format = STATEMENT; this user may set ROW, and lockrun's sessions do",
            )
        }
        Err(_) => Check::fail("binlog", session::STATEMENT_BINLOG),
    }
}

/// The user's privileges on lockrun's tables, or to create them, and the
/// tables' engine. Existing tables are tried: each write lockrun makes,
/// with a condition no row meets, in a transaction rolled back (the server
/// checks every privilege, roles and patterns included; nothing is written).
fn tables(client: &mut Client, base: &str, database: &str, grantee: &str) -> Check {
    let t = Tables::new(base);
    let at = Whose {
        names: format!("{base}_leases, {base}_waiters, {base}_tokens"),
        database,
        grantee,
    };
    if let Some(refused) = read_tables(client, &t, &at) {
        return refused;
    }
    let sets = match write_tables(client, &t, &at) {
        Ok(sets) => sets,
        Err(refused) => return refused,
    };
    let names = &at.names;
    if let Some(r) = sets.last().and_then(|s| not_innodb(s)) {
        return Check::fail(
            "tables",
            format!(
                "{} is in the {} engine, which has no transactions or row locks: lockrun \
                 refuses it; make it InnoDB",
                text(r, 0).unwrap_or_default(),
                text(r, 1).unwrap_or_default()
            ),
        );
    }
    let f = client.flight(&shape::describe(&t));
    if let Some((_, e)) = f.failed {
        return Check::warn(
            "tables",
            format!("{names} exist in InnoDB, but their columns could not be read: {e}"),
        );
    }
    let diffs = shape::differences(base, &f.sets);
    if !diffs.is_empty() {
        return Check::fail("tables", shape::said(database, &diffs));
    }
    Check::ok(
        "tables",
        format!(
            "{names} exist in InnoDB with the columns and keys lockrun needs; the user may \
             read and write them"
        ),
    )
}

/// lockrun's tables in one database, and the user whose rights they are.
struct Whose<'a> {
    /// The three tables' names, for messages.
    names: String,
    database: &'a str,
    grantee: &'a str,
}

impl Whose<'_> {
    /// The last statement was refused for want of a right.
    fn denied(&self, c: &Client) -> bool {
        c.last_code
            .is_some_and(|c| super::client::DENIED.contains(&c))
    }

    fn lacks(&self, to: &str, e: &Error) -> Check {
        Check::fail(
            "tables",
            format!(
                "{} exist, but this user may not {to} them ({}): {}",
                self.names,
                denied(e),
                grant(self.database, self.grantee, false)
            ),
        )
    }
}

/// Each table read once: None, they are there to read; else why not.
fn read_tables(client: &mut Client, t: &Tables, at: &Whose) -> Option<Check> {
    let mut probe = vec!["START TRANSACTION".to_string()];
    for table in [&t.leases, &t.waiters, &t.tokens] {
        probe.push(format!("SELECT COUNT(*) FROM {table}"));
    }
    match client.run(&probe) {
        Ok(_) => None,
        Err(_) if client.last_code == Some(1146) => {
            let _ = client.run(&["ROLLBACK".into()]);
            let grant = grant(at.database, at.grantee, true);
            Some(missing_tables(client, &at.names, &grant))
        }
        Err(e) if at.denied(client) => Some(at.lacks("read", &e)),
        Err(e) => Some(Check::fail("tables", e.to_string())),
    }
}

/// Each write lockrun makes, with a condition no row meets, rolled back,
/// then the tables' engines: the rows of each, or why the writes failed.
fn write_tables(
    client: &mut Client,
    t: &Tables,
    at: &Whose,
) -> Result<Vec<Vec<mysql::Row>>, Check> {
    let writes = [
        (&t.leases, "slot"),
        (&t.waiters, "seq"),
        (&t.tokens, "token"),
    ]
    .into_iter()
    .flat_map(|(table, col)| {
        [
            format!("INSERT INTO {table} SELECT * FROM {table} WHERE FALSE"),
            format!("UPDATE {table} SET {col} = {col} WHERE FALSE"),
            format!("DELETE FROM {table} WHERE FALSE"),
        ]
    })
    .chain(["ROLLBACK".to_string(), t.engines()])
    .collect::<Vec<_>>();
    let names = &at.names;
    client.run(&writes).map_err(|e| match e {
        _ if client.last_code == Some(1665) => Check::fail("tables", session::STATEMENT_BINLOG),
        e if matches!(client.last_code, Some(1036 | 1792 | 1836))
            || (client.last_code == Some(1290) && denied(&e).contains("read")) =>
        {
            Check::fail(
                "tables",
                format!(
                    "{names} exist, but the server refuses to write them ({}): it is \
                     read-only; point lockrun at a server that may write",
                    denied(&e)
                ),
            )
        }
        e if at.denied(client) => at.lacks("write", &e),
        // Writes that wait (a global read lock: FLUSH TABLES WITH READ
        // LOCK, a backup running; a server overloaded) are no question of
        // rights.
        e if e.is_transient() => Check::fail(
            "tables",
            format!(
                "{names} exist, but a write to them got no answer ({e}): the server may \
                 hold a global read lock (FLUSH TABLES WITH READ LOCK, a backup running) \
                 or be overloaded; runs wait on it too"
            ),
        ),
        e => Check::fail(
            "tables",
            format!("{names} exist, but writing them failed: {e}"),
        ),
    })
}

/// The tables are not there yet: whether the user may create them (a
/// CREATE privilege on every database, or on a pattern this database
/// matches, as the server's own privilege tables show it), and in InnoDB.
fn missing_tables(client: &mut Client, names: &str, grant: &str) -> Check {
    // 'user'@'host', as GRANTEE writes it.
    let me = "CONCAT(X'27', SUBSTRING_INDEX(CURRENT_USER(), X'40', 1), X'274027', \
              SUBSTRING_INDEX(CURRENT_USER(), X'40', -1), X'27')";
    let query = format!(
        "SELECT (SELECT COUNT(*) FROM information_schema.USER_PRIVILEGES \
           WHERE GRANTEE = {me} AND PRIVILEGE_TYPE = 'CREATE') + \
         (SELECT COUNT(*) FROM information_schema.SCHEMA_PRIVILEGES \
           WHERE GRANTEE = {me} AND PRIVILEGE_TYPE = 'CREATE' \
             AND DATABASE() LIKE TABLE_SCHEMA ESCAPE CHAR(92)), \
         COALESCE(CURRENT_ROLE(), 'NONE'), @@GLOBAL.enforce_storage_engine"
    );
    let rows = match client.query(query.clone()) {
        Ok(rows) => rows,
        // MySQL has no enforce_storage_engine.
        Err(_) => client
            .query(query.replace("@@GLOBAL.enforce_storage_engine", "NULL"))
            .unwrap_or_default(),
    };
    let r = rows.first();
    let may = r.and_then(|r| int(r, 0)).unwrap_or(0) > 0;
    let role = r
        .and_then(|r| text(r, 1))
        .filter(|x| !x.eq_ignore_ascii_case("NONE"));
    let enforced = r.and_then(|r| text(r, 2));
    if let Some(e) = enforced.filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("InnoDB")) {
        return Check::fail(
            "tables",
            format!(
                "{names} do not exist yet, and the server makes every new table in {e} \
                 (enforce_storage_engine), which has no transactions or row locks: lockrun \
                 would refuse them; enforce InnoDB, or none"
            ),
        );
    }
    if may {
        Check::ok(
            "tables",
            format!("{names} do not exist yet: the first run creates them"),
        )
    } else if let Some(role) = role {
        Check::warn(
            "tables",
            format!(
                "{names} do not exist yet, and the server's privilege tables give this user \
                 no CREATE on the database, though its role {role} may: the first run tells"
            ),
        )
    } else {
        Check::fail(
            "tables",
            format!(
                "{names} do not exist yet, and the server gives this user no CREATE on the \
                 database: create them once as a user that may, or {grant}"
            ),
        )
    }
}
