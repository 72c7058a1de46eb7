//! The transport to PostgreSQL: one connection on a runtime of its own
//! (current-thread: no threads, nothing started before the engine is
//! opened), every call bounded by the request budget, the servers of the
//! URL tried in turn, the notifications a `LISTEN` brings, and the table
//! that sorts the server's errors into lockrun's kinds.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, NoTls, Row, Socket};

use super::address::{PgUrl, Server, SslMode};
use super::tls;
use crate::backend::Error;
use crate::backend::drive::Remote;
use crate::clock::Boot;
use crate::log;

/// A statement's parameters with their types (no round trip to learn them,
/// and no named statement, which a transaction-pooling proxy would lose).
pub type Params<'a> = [(&'a (dyn ToSql + Sync), Type)];

/// One request of a flight: a statement with typed parameters, or
/// statements without (the simple protocol, rows not read).
#[derive(Clone, Copy)]
pub enum Call<'a> {
    Query(&'a str, &'a Params<'a>),
    Batch(&'a str),
}

/// One open connection.
struct Conn {
    rt: Option<tokio::runtime::Runtime>,
    client: Option<tokio_postgres::Client>,
    /// One message per notification; closed when the connection ends.
    notes: UnboundedReceiver<String>,
    /// The task that drives the connection; it ends with it.
    driver: Option<tokio::task::JoinHandle<()>>,
}

impl Conn {
    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("until dropped")
    }

    fn client(&self) -> &tokio_postgres::Client {
        self.client.as_ref().expect("until dropped")
    }
}

/// How long a connection that goes may take to say goodbye.
const GOODBYE: Duration = Duration::from_millis(50);

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            // A closed client sends Terminate, which its driver writes
            // before it ends: the server (and a pooler) sees a clean
            // goodbye rather than a connection cut. Briefly: a server
            // that does not take it costs no more than GOODBYE.
            drop(self.client.take());
            if let Some(driver) = self.driver.take() {
                let _ = rt.block_on(async { tokio::time::timeout(GOODBYE, driver).await });
            }
            // A name lookup still running must not hold lockrun up.
            rt.shutdown_background();
        }
    }
}

/// A client: the address, the connection once open, and what the server
/// has told us so far.
pub struct Client {
    url: Arc<PgUrl>,
    conn: Option<Conn>,
    /// Bounds one call, connecting included.
    pub op: Duration,
    /// The server as shown, and whether it has answered yet.
    pub remote: Remote,
    /// The channel this connection listens on, once it does.
    listening: Option<String>,
    /// The SQLSTATE of the last call's failure, if the server gave one.
    pub last_code: Option<String>,
}

impl AsRef<Remote> for Client {
    fn as_ref(&self) -> &Remote {
        &self.remote
    }
}

impl Client {
    pub fn new(url: Arc<PgUrl>, op: Duration) -> Client {
        Client {
            remote: Remote::new(url.display.clone()),
            url,
            conn: None,
            op,
            listening: None,
            last_code: None,
        }
    }

    /// A client for the same database with a connection of its own (a
    /// renewal must not wait behind a stuck one).
    pub fn fresh(&self) -> Client {
        Client {
            remote: self.remote.clone(),
            ..Client::new(Arc::clone(&self.url), self.op)
        }
    }

    /// Forget the connection: the next call opens a new one (after an
    /// error in a transaction, or a call that ran out of time).
    pub fn drop_connection(&mut self) {
        self.conn = None;
        self.listening = None;
    }

    fn connect(&mut self, until: Boot) -> Result<&Conn, Error> {
        if self.conn.as_ref().is_some_and(|c| c.client().is_closed()) {
            self.drop_connection();
        }
        if self.conn.is_none() {
            self.conn = Some(self.open(until)?);
        }
        Ok(self.conn.as_ref().expect("set above"))
    }

    fn open(&mut self, until: Boot) -> Result<Conn, Error> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::Internal(format!("starting the PostgreSQL client: {e}")))?;
        let url = &self.url;
        let tls = tls::connector(url)?;
        let mut last = String::new();
        let budget = until.since(Boot::now());
        for s in &url.servers {
            let left = until.since(Boot::now());
            if left.is_zero() {
                break;
            }
            let cfg = config(url, s, left, self.op);
            // Timers exist only inside the runtime: made within block_on.
            let connecting = rt.block_on(async {
                match &tls {
                    Some(t) => tokio::time::timeout(left, start(&cfg, t.clone())).await,
                    None => tokio::time::timeout(left, start(&cfg, NoTls)).await,
                }
            });
            let (client, notes, driver) = match connecting {
                Ok(Ok(pair)) => pair,
                Ok(Err(e)) if e.code().is_some() => {
                    // The server answered, and said no.
                    self.remote.replied = true;
                    self.last_code = e.code().map(|c| c.code().to_string());
                    return Err(classify(&e, url));
                }
                Ok(Err(e)) => {
                    last = format!("{}:{}: {}", s.host, s.port, describe(&e));
                    continue;
                }
                Err(_) => {
                    last = format!(
                        "{}:{}: no answer within {}",
                        s.host,
                        s.port,
                        crate::text::duration(left)
                    );
                    continue;
                }
            };
            self.remote.replied = true;
            return Ok(Conn {
                rt: Some(rt),
                client: Some(client),
                notes,
                driver: Some(driver),
            });
        }
        if last.is_empty() {
            last = format!("no answer within {}", crate::text::duration(budget));
        }
        Err(Error::Transient(format!(
            "cannot reach PostgreSQL at {}: {last}",
            url.display
        )))
    }

    /// Send `calls` on the connection (opened first if need be), all at
    /// once, and wait for every answer within the budget: a server that
    /// does not answer in time costs the connection. The answers come in
    /// the order of the calls; the first failure is the result.
    fn bounded(&mut self, calls: &[Call]) -> Result<Vec<Vec<Row>>, Error> {
        let until = Boot::now().add(self.op);
        let url = Arc::clone(&self.url);
        self.last_code = None;
        let conn = self.connect(until)?;
        let left = until.since(Boot::now()).max(Duration::from_millis(1));
        let client = conn.client();
        let done = conn.rt().block_on(async move {
            // Each request is written when its future is first polled,
            // which join_all does in order: one flight, in order.
            let sent = futures_util::future::join_all(calls.iter().map(|call| async move {
                match call {
                    Call::Query(sql, params) => client.query_typed(sql, params).await,
                    Call::Batch(sql) => client.simple_query(sql).await.map(|_| Vec::new()),
                }
            }));
            tokio::time::timeout(left, sent).await
        });
        let answers = match done {
            Ok(answers) => answers,
            Err(_) => {
                self.drop_connection();
                return Err(Error::Transient(format!(
                    "no answer from PostgreSQL at {} within {}",
                    url.display,
                    crate::text::duration(Duration::from_millis(self.op.as_millis() as u64))
                )));
            }
        };
        let mut rows = Vec::with_capacity(answers.len());
        for a in answers {
            match a {
                Ok(r) => rows.push(r),
                Err(e) => {
                    self.last_code = e.code().map(|c| c.code().to_string());
                    if e.code().is_none() || e.is_closed() {
                        self.drop_connection();
                    }
                    return Err(classify(&e, &url));
                }
            }
        }
        Ok(rows)
    }

    /// Several statements in one flight (see `bounded`): the rows of each.
    pub fn pipeline(&mut self, calls: &[Call]) -> Result<Vec<Vec<Row>>, Error> {
        self.bounded(calls)
    }

    /// One statement with typed parameters: its rows.
    pub fn query(&mut self, sql: &str, params: &Params) -> Result<Vec<Row>, Error> {
        Ok(self.bounded(&[Call::Query(sql, params)])?.remove(0))
    }

    /// Statements without parameters, in one round trip.
    pub fn batch(&mut self, sql: &str) -> Result<(), Error> {
        self.bounded(&[Call::Batch(sql)]).map(|_| ())
    }

    /// Listen on `channel` (a no-op when this connection already does).
    /// Through a transaction-pooling proxy this may reach no session that
    /// stays ours: waiting never relies on it alone.
    pub fn listen(&mut self, channel: &str) -> Result<(), Error> {
        if self.listens(channel) {
            return Ok(());
        }
        self.batch(&format!("LISTEN \"{channel}\""))?;
        self.listening = Some(channel.to_string());
        Ok(())
    }

    /// Listen no more, and forget the notifications that came: a granted
    /// lease keeps this connection, on which the waiters' notifications
    /// must not pile up while the job runs. A connection that fails at it
    /// is let go (the next call opens a new one).
    pub fn unlisten(&mut self) {
        if self.listening.is_none() {
            return;
        }
        if self.batch("UNLISTEN *").is_err() {
            self.drop_connection();
        }
        self.listening = None;
        self.drain();
    }

    /// This connection listens on `channel`.
    pub fn listens(&self, channel: &str) -> bool {
        self.conn.is_some() && self.listening.as_deref() == Some(channel)
    }

    /// Forget notifications that came before now.
    pub fn drain(&mut self) {
        if let Some(c) = &mut self.conn {
            while c.notes.try_recv().is_ok() {}
        }
    }

    /// Sleep until a notification comes or `d` has passed. Ok(Some):
    /// woken, with the notification's payload.
    pub fn wait_note(&mut self, d: Duration) -> Result<Option<String>, Error> {
        let Some(c) = &mut self.conn else {
            std::thread::sleep(d);
            return Ok(None);
        };
        let got =
            c.rt.as_ref()
                .expect("until dropped")
                .block_on(async { tokio::time::timeout(d, c.notes.recv()).await });
        match got {
            Ok(Some(payload)) => Ok(Some(payload)),
            Ok(None) => {
                self.drop_connection();
                Err(Error::Transient(format!(
                    "the connection to PostgreSQL at {} ended",
                    self.url.display
                )))
            }
            Err(_) => Ok(None),
        }
    }
}

/// Connect, and drive the connection on the runtime: notifications go to
/// the receiver, which closes when the connection ends.
async fn start<T>(
    cfg: &tokio_postgres::Config,
    tls: T,
) -> Result<
    (
        tokio_postgres::Client,
        UnboundedReceiver<String>,
        tokio::task::JoinHandle<()>,
    ),
    tokio_postgres::Error,
>
where
    T: MakeTlsConnect<Socket> + Send + 'static,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, mut connection) = cfg.connect(tls).await?;
    let (tx, notes) = unbounded_channel();
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_string());
            }
        }
    });
    Ok((client, notes, driver))
}

/// A client error in one line, without anything secret.
fn describe(e: &tokio_postgres::Error) -> String {
    let text = match e.as_db_error() {
        Some(db) => db.message().to_string(),
        None => {
            // The source says what failed (refused, reset, timed out).
            let mut t = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(s) = src {
                t = format!("{t}: {s}");
                src = s.source();
            }
            t
        }
    };
    log::redact(&text)
}

/// The connection settings for server `s` of `url`, `left` to connect.
fn config(url: &PgUrl, s: &Server, left: Duration, op: Duration) -> tokio_postgres::Config {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(&s.host)
        .port(s.port)
        .user(&url.user)
        .dbname(&url.dbname)
        .application_name("lockrun")
        .connect_timeout(left)
        // Unacknowledged data (a server gone, a network cut) ends
        // the connection rather than hanging a renewal.
        .tcp_user_timeout(op.max(Duration::from_millis(500)))
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(10));
    if let Some(p) = &url.password {
        cfg.password(p);
    }
    cfg.ssl_mode(match url.sslmode {
        // libpq never asks for TLS on a Unix socket either.
        _ if s.host.starts_with('/') => tokio_postgres::config::SslMode::Disable,
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        _ => tokio_postgres::config::SslMode::Require,
    });
    cfg
}

/// The server's errors in lockrun's kinds (lockrun-engines(7) "POSTGRESQL").
pub fn classify(e: &tokio_postgres::Error, url: &PgUrl) -> Error {
    let text = describe(e);
    let Some(code) = e.code() else {
        // No answer at all, or the connection broke: worth another try.
        return Error::Transient(text);
    };
    kind(code, text, url)
}

fn kind(code: &SqlState, text: String, url: &PgUrl) -> Error {
    let c = code.code();
    if let Some(limit) = full(code, &text) {
        return Error::Full(format!("{text} ({c}): {limit}"));
    }
    let transient = c.starts_with("08")
        || c.starts_with("53")
        || matches!(
            *code,
            SqlState::ADMIN_SHUTDOWN
                | SqlState::CRASH_SHUTDOWN
                | SqlState::CANNOT_CONNECT_NOW
                | SqlState::T_R_SERIALIZATION_FAILURE
                | SqlState::T_R_DEADLOCK_DETECTED
                | SqlState::LOCK_NOT_AVAILABLE
                | SqlState::QUERY_CANCELED
                | SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT
                | SqlState::READ_ONLY_SQL_TRANSACTION
        );
    if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        // Worth waiting out after a switch-over; said so when it lasts.
        return Error::Transient(format!(
            "{text} ({c}): a standby, or default_transaction_read_only = on for the role \
             (lockrun doctor names it)"
        ));
    }
    if transient {
        return Error::Transient(format!("{text} ({c})"));
    }
    let hint = match *code {
        SqlState::INVALID_PASSWORD | SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
            format!("; check the user {:?} and its password", url.user)
        }
        SqlState::INSUFFICIENT_PRIVILEGE => {
            "; the role needs the grants lockrun-engines(7) \"POSTGRESQL\" lists".into()
        }
        SqlState::UNDEFINED_COLUMN
        | SqlState::DATATYPE_MISMATCH
        | SqlState::INVALID_COLUMN_REFERENCE
        | SqlState::WRONG_OBJECT_TYPE
        | SqlState::NOT_NULL_VIOLATION => {
            "; a table of that name that is not lockrun's is in the way: remove it or \
             choose another --prefix"
                .into()
        }
        _ => String::new(),
    };
    Error::Refused(format!("{text} ({c}){hint}"))
}

/// A connection refused for want of a free one (53300, or PgBouncer's
/// limits, which it sends as protocol violations): the limit, in words.
fn full(code: &SqlState, text: &str) -> Option<&'static str> {
    if *code == SqlState::TOO_MANY_CONNECTIONS {
        return Some(if text.contains("for role") {
            "every connection this role may have (its CONNECTION LIMIT) is taken"
        } else if text.contains("for database") {
            "every connection to this database (its CONNECTION LIMIT) is taken"
        } else {
            "every connection the server allows (max_connections, less \
             superuser_reserved_connections) is taken"
        });
    }
    if *code != SqlState::PROTOCOL_VIOLATION {
        return None;
    }
    if text.contains("max_client_conn") {
        Some("every client connection PgBouncer allows (max_client_conn) is taken")
    } else if text.contains("query_wait_timeout") {
        Some("no server connection of PgBouncer's pool came free in time (pool_size)")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_server_is_said_with_its_limit() {
        let url = super::super::address::tests_url();
        let e = kind(
            &SqlState::TOO_MANY_CONNECTIONS,
            "sorry, too many clients already".into(),
            &url,
        );
        assert!(e.is_full() && e.is_transient(), "{e:?}");
        assert!(e.to_string().contains("max_connections"), "{e}");
        let e = kind(
            &SqlState::TOO_MANY_CONNECTIONS,
            "too many connections for role \"app\"".into(),
            &url,
        );
        assert!(e.to_string().contains("CONNECTION LIMIT"), "{e}");
        for (text, limit) in [
            (
                "no more connections allowed (max_client_conn)",
                "max_client_conn",
            ),
            ("query_wait_timeout", "pool_size"),
        ] {
            let e = kind(&SqlState::PROTOCOL_VIOLATION, text.into(), &url);
            assert!(e.is_full(), "{e:?}");
            assert!(e.to_string().contains(limit), "{e}");
        }
        let e = kind(
            &SqlState::PROTOCOL_VIOLATION,
            "server login failed".into(),
            &url,
        );
        assert!(!e.is_full(), "{e:?}");
    }

    #[test]
    fn server_errors_fall_in_the_documented_classes() {
        let url = super::super::address::tests_url();
        for code in [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::CONNECTION_FAILURE,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::LOCK_NOT_AVAILABLE,
        ] {
            assert!(kind(&code, "x".into(), &url).is_transient(), "{code:?}");
        }
        for code in [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::UNDEFINED_COLUMN,
            SqlState::INVALID_CATALOG_NAME,
        ] {
            let e = kind(&code, "x".into(), &url);
            assert!(matches!(e, Error::Refused(_)), "{code:?}: {e:?}");
        }
        let e = kind(&SqlState::UNDEFINED_COLUMN, "x".into(), &url);
        assert!(e.to_string().contains("--prefix"), "{e}");
    }
}
