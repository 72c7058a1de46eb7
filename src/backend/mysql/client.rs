//! The transport to MySQL or MariaDB: one blocking connection (the
//! synchronous `mysql` crate: no runtime, no thread), every read, write and
//! connect bounded by the request budget, a whole transaction sent as one
//! text of statements (one round trip), and the table that sorts the
//! server's errors into lockrun's kinds.

use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Conn, OptsBuilder, Row, SslOpts, Value};

use super::address::{MyUrl, SslMode};
use super::session;
use super::sql;
use crate::backend::Error;
use crate::backend::drive::Remote;
use crate::log;

/// A client: the address, the connection once open, and what the server
/// has told us so far.
pub struct Client {
    url: Arc<MyUrl>,
    conn: Option<Conn>,
    /// Bounds one call, connecting included.
    pub op: Duration,
    /// How much longer than `op` a read may take on this client's
    /// connections: the longest blocking wake-up wait it makes.
    pub wait: Duration,
    /// The server as shown, and whether it has answered yet.
    pub remote: Remote,
    /// The server's error number of the last call's failure, if any.
    pub last_code: Option<u16>,
    /// This connection holds our wake-up lock (`sql::wake_key`) of this kind.
    pub locked: Option<char>,
    /// The server refused `GET_LOCK` (Galera, a proxy): waiting falls back
    /// to sleeping until what is in the way lapses.
    pub no_wake: bool,
    /// The server logs statements: every session sets `binlog_format = ROW`.
    pub row_binlog: bool,
    /// The connection was opened for a bare flight, without the session
    /// settings: the next flight sends them first.
    unset: bool,
    /// This flight goes without the session settings (`bare`).
    bare: bool,
    /// With `ssl-mode=PREFERRED`, the server said it has no TLS: the next
    /// connections (a waiter far back opens one each time it looks) go
    /// without asking again.
    no_tls: bool,
}

impl AsRef<Remote> for Client {
    fn as_ref(&self) -> &Remote {
        &self.remote
    }
}

/// One value of a row: NULL (or missing) as None.
pub fn int(r: &Row, i: usize) -> Option<i64> {
    match r.as_ref(i)? {
        Value::NULL => None,
        Value::Int(v) => Some(*v),
        Value::UInt(v) => Some(*v as i64),
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        Value::Double(d) => Some(*d as i64),
        Value::Float(d) => Some(*d as i64),
        _ => None,
    }
}

pub fn text(r: &Row, i: usize) -> Option<String> {
    match r.as_ref(i)? {
        Value::NULL => None,
        Value::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Int(v) => Some(v.to_string()),
        Value::UInt(v) => Some(v.to_string()),
        _ => None,
    }
}

pub fn float(r: &Row, i: usize) -> Option<f64> {
    match r.as_ref(i)? {
        Value::Bytes(b) => std::str::from_utf8(b).ok()?.trim().parse().ok(),
        Value::Double(d) => Some(*d),
        Value::Float(d) => Some(f64::from(*d)),
        Value::Int(v) => Some(*v as f64),
        _ => None,
    }
}

/// What a flight of statements gave: the rows of each statement that ran,
/// and the failure that stopped the rest, with its index.
pub struct Flight {
    pub sets: Vec<Vec<Row>>,
    pub failed: Option<(usize, Error)>,
}

impl Client {
    pub fn new(url: Arc<MyUrl>, op: Duration) -> Client {
        Client {
            remote: Remote::new(url.display.clone()),
            url,
            conn: None,
            op,
            wait: Duration::ZERO,
            last_code: None,
            locked: None,
            no_wake: false,
            row_binlog: false,
            unset: false,
            bare: false,
            no_tls: false,
        }
    }

    /// A client for the same database with a connection of its own (a
    /// renewal must not wait behind a stuck one).
    pub fn fresh(&self) -> Client {
        Client {
            remote: self.remote.clone(),
            no_wake: self.no_wake,
            row_binlog: self.row_binlog,
            no_tls: self.no_tls,
            ..Client::new(Arc::clone(&self.url), self.op)
        }
    }

    pub fn url(&self) -> &MyUrl {
        &self.url
    }

    /// Forget the connection (the server ends its transaction and frees
    /// its locks): the next call opens a new one.
    pub fn drop_connection(&mut self) {
        self.conn = None;
        self.locked = None;
        self.unset = false;
    }

    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    fn options(&self, tls: bool) -> Result<OptsBuilder, Error> {
        let url = &self.url;
        let read = self.op + self.wait;
        let mut o = OptsBuilder::new()
            .user(Some(&url.user))
            .pass(url.password.as_deref())
            .db_name(Some(&url.database))
            .prefer_socket(false)
            .max_allowed_packet(Some(16 << 20))
            .tcp_connect_timeout(Some(self.op))
            .read_timeout(Some(read))
            .write_timeout(Some(self.op))
            .tcp_nodelay(true)
            .stmt_cache_size(Some(0));
        o = match &url.socket {
            Some(s) => o.socket(Some(s)),
            None => o.ip_or_hostname(Some(&url.host)).tcp_port(url.port),
        };
        if tls {
            // The driver builds its TLS settings with rustls' process-wide
            // provider, and this build has two (ring, and aws-lc-rs which
            // the ZooKeeper client brings): name ring, lockrun's own, or
            // the driver could not choose.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut ssl = SslOpts::default();
            if let Some(ca) = &url.ca_file {
                if !ca.exists() {
                    return Err(Error::Refused(format!(
                        "the CA file {} does not exist",
                        ca.display()
                    )));
                }
                ssl = ssl.with_root_cert_path(Some(ca.clone()));
            }
            ssl = match url.ssl_mode {
                SslMode::Preferred => ssl
                    .with_danger_accept_invalid_certs(true)
                    .with_danger_skip_domain_validation(true),
                SslMode::Required if url.ca_file.is_none() => ssl
                    .with_danger_accept_invalid_certs(true)
                    .with_danger_skip_domain_validation(true),
                SslMode::Required | SslMode::VerifyCa => {
                    ssl.with_danger_skip_domain_validation(true)
                }
                _ => ssl,
            };
            o = o.ssl_opts(Some(ssl));
        }
        Ok(o)
    }

    /// Connect. A server whose connections are all taken says so
    /// (`Error::Full`): the driver rides that out, and a renewal retries it
    /// on schedule.
    fn open(&mut self) -> Result<Conn, Error> {
        let tls =
            self.url.socket.is_none() && self.url.ssl_mode != SslMode::Disabled && !self.no_tls;
        let got = Conn::new(self.options(tls)?);
        let got = match got {
            Err(mysql::Error::DriverError(mysql::DriverError::TlsNotSupported))
                if self.url.ssl_mode == SslMode::Preferred =>
            {
                self.no_tls = true;
                Conn::new(self.options(false)?)
            }
            other => other,
        };
        match got {
            Ok(c) => {
                self.remote.replied = true;
                Ok(c)
            }
            Err(e) => {
                if let mysql::Error::MySqlError(m) = &e {
                    self.remote.replied = true;
                    self.last_code = Some(m.code);
                }
                Err(match classify(&e, &self.url, self.op + self.wait) {
                    Error::Transient(m) => {
                        Error::Transient(format!("cannot reach MySQL at {}: {m}", self.url.display))
                    }
                    e => e,
                })
            }
        }
    }

    /// Send `stmts` as one text (one round trip) on the connection, opened
    /// first if need be: the rows of each, until the first failure. A new
    /// connection gets the session settings first, in the same flight. A
    /// failure leaves the connection behind (a transaction in the middle
    /// must not go on).
    pub fn flight(&mut self, stmts: &[String]) -> Flight {
        self.flight_keeping(stmts, &[])
    }

    /// As `flight`, but a failure with one of the server's numbers in
    /// `keep` leaves the connection as it is (one outside a transaction).
    pub fn flight_keeping(&mut self, stmts: &[String], keep: &[u16]) -> Flight {
        self.last_code = None;
        let fresh = self.conn.is_none();
        if fresh {
            match self.open() {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    return Flight {
                        sets: Vec::new(),
                        failed: Some((0, e)),
                    };
                }
            }
        }
        let mut text = String::new();
        let mut skip = 0;
        if fresh && self.bare {
            self.unset = true;
        } else if fresh | std::mem::take(&mut self.unset) {
            let session = session::session(self.op, self.row_binlog);
            // Each of the session's statements answers with a set of its own.
            skip = session.split(';').count();
            text.push_str(&session);
            text.push_str("; ");
        }
        text.push_str(&stmts.join("; "));
        let conn = self.conn.as_mut().expect("opened above");
        let mut sets = Vec::with_capacity(stmts.len() + skip);
        let mut failed = None;
        match conn.query_iter(text) {
            Ok(mut result) => {
                while let Some(set) = result.iter() {
                    let mut rows = Vec::new();
                    for row in set {
                        match row {
                            Ok(r) => rows.push(r),
                            Err(e) => {
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                    if failed.is_some() {
                        break;
                    }
                    sets.push(rows);
                }
            }
            Err(e) => failed = Some(e),
        }
        let failed = failed.map(|e| {
            if let mysql::Error::MySqlError(m) = &e {
                self.last_code = Some(m.code);
            }
            let at = sets.len().saturating_sub(skip);
            if !matches!(self.last_code, Some(c) if keep.contains(&c)) {
                self.drop_connection();
            }
            (at, classify(&e, &self.url, self.op + self.wait))
        });
        if sets.len() >= skip {
            sets.drain(..skip);
        }
        Flight { sets, failed }
    }

    /// `stmts` in one flight; the first failure is the result.
    pub fn run(&mut self, stmts: &[String]) -> Result<Vec<Vec<Row>>, Error> {
        let f = self.flight(stmts);
        match f.failed {
            Some((_, e)) => Err(e),
            None => Ok(f.sets),
        }
    }

    /// One statement: its rows.
    /// As `run`, on a connection opened without the session settings (one
    /// that already has them keeps them): for a statement or two that need
    /// none of them, on a connection opened for them alone. `stmts` end
    /// with a COMMIT, whatever the server's autocommit.
    pub fn run_bare(&mut self, stmts: &[String]) -> Result<Vec<Vec<Row>>, Error> {
        self.bare = true;
        let run = self.run(stmts);
        self.bare = false;
        run
    }

    pub fn query(&mut self, stmt: String) -> Result<Vec<Row>, Error> {
        Ok(self.run(&[stmt])?.remove(0))
    }

    /// Interrupt the waits of these connections (best effort: a user may
    /// only interrupt its own, and a connection may be gone).
    pub fn poke(&mut self, conns: &[i64]) {
        for id in conns {
            let _ = self.flight_keeping(&[format!("KILL QUERY {id}")], &[1094, 1095]);
        }
    }

    /// Block until the session of `owner`'s lock of `kind` lets it go (a
    /// release, a grant, a connection that ended, an interruption) or `d`
    /// has passed. With `keep` (a statement that keeps our place, and a
    /// condition that the row waited on is still there), those go first in
    /// the same flight, and the wait only if both held.
    pub fn wait_for(
        &mut self,
        kind: char,
        owner: &str,
        d: Duration,
        keep: Option<(String, String)>,
    ) -> Result<Woke, Error> {
        let key = sql::wake_key(kind, &sql::lit(owner));
        let secs = d.as_secs_f64().max(0.001);
        let mut stmts = Vec::new();
        let wait = match keep {
            Some((k, still)) => {
                stmts.push(k);
                format!("IF(ROW_COUNT() > 0 AND {still}, GET_LOCK({key}, {secs:.3}), -1)")
            }
            None => format!("GET_LOCK({key}, {secs:.3})"),
        };
        let hint = session::wait_hint((d + self.op).as_millis() as u64);
        stmts.push(format!("SELECT {hint} {wait}, RELEASE_LOCK({key})"));
        let started = crate::clock::Boot::now();
        // Interrupted (`KILL QUERY` from a request that changed our place):
        // woken, the connection as good as before.
        let f = self.flight_keeping(&stmts, &[1317, 1969, 3024, 1213, 3058]);
        let cut = |c| session::STATEMENT_TIME.contains(&c) || session::DEADLOCK.contains(&c);
        match f.failed {
            Some(_) if self.last_code == Some(1317) => Ok(Woke::Woken),
            Some(_) if matches!(self.last_code, Some(c) if cut(c)) => {
                // Cut by a statement time limit the session could not
                // lift, or refused as a deadlock because the chain of
                // waiters ahead is deeper than the server searches: sleep
                // out the wait rather than ask again at once, the place
                // kept (by the flight's first statement) and the
                // connection with it.
                let spent = crate::clock::Boot::now().since(started);
                if spent < d {
                    std::thread::sleep(d - spent);
                }
                Ok(Woke::TimedOut)
            }
            None => {
                let got = f
                    .sets
                    .last()
                    .and_then(|s| s.first())
                    .and_then(|r| int(r, 0));
                match got {
                    Some(0) => {
                        // Timed out before the wait ran out: a server that
                        // reads the timeout in whole seconds cut it short.
                        let spent = crate::clock::Boot::now().since(started);
                        if spent + Duration::from_millis(20) < d {
                            std::thread::sleep(d - spent);
                        }
                        Ok(Woke::TimedOut)
                    }
                    Some(-1) => Ok(Woke::PlaceLost),
                    // Granted (and given back at once), or interrupted.
                    _ => Ok(Woke::Woken),
                }
            }
            Some((_, e)) if !e.is_transient() => {
                self.no_wake = true;
                Ok(Woke::Woken)
            }
            Some((_, e)) => Err(e),
        }
    }
}

/// How a blocking wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Woke {
    /// What we waited on let go: look again.
    Woken,
    /// Nothing moved ahead of us.
    TimedOut,
    /// Our place was not there to keep: look again.
    PlaceLost,
}

/// A client error in one line, without anything secret.
fn describe(e: &mysql::Error, bound: Duration) -> String {
    let no_answer = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )
    };
    let within = || {
        format!(
            "no answer within {}",
            crate::text::duration(Duration::from_millis(bound.as_millis() as u64))
        )
    };
    let text = match e {
        mysql::Error::IoError(io) if no_answer(io) => within(),
        mysql::Error::CodecError(c)
            if std::error::Error::source(c)
                .and_then(|s| s.downcast_ref::<std::io::Error>())
                .is_some_and(no_answer) =>
        {
            within()
        }
        mysql::Error::MySqlError(m) => format!("{} ({})", m.message, m.code),
        mysql::Error::DriverError(mysql::DriverError::CouldNotConnect(Some((a, d, _)))) => {
            format!("could not connect to {a}: {d}")
        }
        mysql::Error::DriverError(mysql::DriverError::ConnectTimeout) => {
            "no connection within the time allowed".into()
        }
        mysql::Error::DriverError(mysql::DriverError::TlsNotSupported) => {
            "the server does not offer TLS (ssl-mode asks for it)".into()
        }
        // Plain words: the crate's own forms read as Rust (`IoError { … }`).
        mysql::Error::IoError(e) => format!("the connection broke: {e}"),
        mysql::Error::CodecError(e) => format!("the connection broke: {e}"),
        mysql::Error::DriverError(d) => d.to_string(),
        mysql::Error::UrlError(u) => u.to_string(),
        mysql::Error::TlsError(t) => format!("TLS: {t}"),
        other => other.to_string(),
    };
    log::redact(text.lines().next().unwrap_or(""))
}

/// The server's error numbers that are worth another try.
fn transient_code(code: u16) -> bool {
    matches!(
        code,
        1053 // server shutdown in progress
            | 1077 // normal shutdown
            | 1079 // shutdown complete
            | 1152 | 1153 | 1154 | 1155 | 1156 | 1157 | 1158 | 1159 | 1160 | 1161 // network
            | 1180 | 1181 // commit / rollback failed
            | 1205 // lock wait timeout
            | 1213 // deadlock
            | 1317 // query interrupted
            | 1637 // too many active transactions
            | 1927 // connection killed
            | 1969 // statement time exceeded
            | 2006 | 2013 // server gone away, lost connection
            | 3024 // max_execution_time exceeded
            | 4031 // disconnected for inactivity
            | 1047 // Galera: not ready ("unknown command")
    )
}

/// The server's errors in lockrun's kinds (lockrun-engines(7) "MYSQL AND
/// MARIADB").
/// `bound`: how long a read waits for the server (a stopped server is
/// told by a read that ran out of it).
pub fn classify(e: &mysql::Error, url: &MyUrl, bound: Duration) -> Error {
    let text = describe(e, bound);
    let mysql::Error::MySqlError(m) = e else {
        return match e {
            mysql::Error::DriverError(mysql::DriverError::TlsNotSupported) => Error::Refused(text),
            mysql::Error::UrlError(_) => Error::Request(text),
            // No answer at all, or the connection broke: worth another try.
            _ => Error::Transient(text),
        };
    };
    kind(m.code, text, url)
}

/// A connection refused for want of a free one: the limit, in words.
fn full(code: u16) -> Option<&'static str> {
    Some(match code {
        1040 => "every connection the server allows (max_connections) is taken",
        1203 => "every connection this user may have (max_user_connections) is taken",
        1226 => {
            "a limit of this user's account is reached (its MAX_USER_CONNECTIONS, or an \
             hourly cap)"
        }
        _ => return None,
    })
}

/// The server's errors for a privilege the user lacks.
pub const DENIED: [u16; 5] = [1044, 1142, 1143, 1227, 1370];

/// What a run adds to them.
pub const GRANTS_HINT: &str =
    "; the user needs the grants lockrun-engines(7) \"MYSQL AND MARIADB\" lists";

fn kind(code: u16, text: String, url: &MyUrl) -> Error {
    if let Some(limit) = full(code) {
        return Error::Full(format!("{text}: {limit}"));
    }
    if transient_code(code) {
        return Error::Transient(text);
    }
    let hint = match code {
        1045 | 1698 => format!("; check the user {:?} and its password", url.user),
        c if DENIED.contains(&c) => GRANTS_HINT.into(),
        1290 if !text.to_ascii_lowercase().contains("read") => String::new(),
        1036 => "; the server is read-only (innodb_read_only, read_only or super_read_only): \
                 point lockrun at a server that may write"
            .into(),
        1290 | 1836 | 1792 => {
            "; the server is read-only (read_only or super_read_only, a replica): point \
             lockrun at the primary"
                .into()
        }
        1049 => "; create the database, or name another in the URL".into(),
        1054 | 1136 | 1364 | 1366 | 1265 | 1406 | 1048 | 1052 => {
            "; a table of that name that is not lockrun's is in the way: remove it or \
             choose another --prefix"
                .into()
        }
        _ => String::new(),
    };
    Error::Refused(format!("{text}{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_fall_in_the_documented_classes() {
        let url = super::super::address::tests_url();
        for code in [1205, 1213, 1053, 2013, 1927] {
            let e = kind(code, "x".into(), &url);
            assert!(e.is_transient() && !e.is_full(), "{code}");
        }
        for (code, limit) in [
            (1040, "max_connections"),
            (1203, "max_user_connections"),
            (1226, "MAX_USER_CONNECTIONS"),
        ] {
            let e = kind(code, "x".into(), &url);
            assert!(e.is_full() && e.is_transient(), "{code}: {e:?}");
            assert!(e.to_string().contains(limit), "{e}");
        }
        for code in [1045, 1044, 1142, 1290, 1836, 1054, 1049] {
            let e = kind(code, "x".into(), &url);
            assert!(matches!(e, Error::Refused(_)), "{code}: {e:?}");
        }
        let read_only = "The MariaDB server is running with the --read-only option";
        assert!(
            kind(1290, read_only.into(), &url)
                .to_string()
                .contains("point lockrun at the primary")
        );
        let enforced = "The MariaDB server is running with the NO_ENGINE_SUBSTITUTION option";
        assert!(
            !kind(1290, enforced.into(), &url)
                .to_string()
                .contains("primary")
        );
        assert!(
            kind(1054, "x".into(), &url)
                .to_string()
                .contains("--prefix")
        );
    }
}
