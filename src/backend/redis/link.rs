//! One connection to one Redis server: connecting within a bound, which of
//! the server's errors are worth riding out, and how an error is told
//! without echoing what was sent.

use std::time::Duration;

use super::address::Node;
use super::connector::{Conn, Connector, Linked};
use crate::backend::Error;
use crate::backend::drive::Remote;
use crate::log;

/// Server error codes that a restart, a failover or a cluster change produce
/// for a while: ridden out like a lost connection, never final.
const TRANSIENT: [&str; 8] = [
    "LOADING",
    // A blocked BLPOP on a master that a failover turned into a replica.
    "UNBLOCKED",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
];

/// Whether an error is worth retrying: a transport failure (timeout, reset,
/// refused) or one of the transient server states. Everything else the server
/// says (a wrong password, an ACL denial, a key of the wrong type, a script
/// error) is final.
pub fn is_transient(e: &redis::RedisError) -> bool {
    if matches!(e.kind(), redis::ErrorKind::Io | redis::ErrorKind::Parse)
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
    {
        return true;
    }
    if e.code().is_some_and(|c| TRANSIENT.contains(&c)) {
        return true;
    }
    // A script that fails on a write (a replica, a cluster in trouble) may
    // carry the code inside its own error text.
    let text = e.to_string();
    TRANSIENT.iter().any(|c| {
        text.split(|ch: char| !ch.is_ascii_alphabetic())
            .any(|w| w == *c)
    })
}

/// What a server whose clients are all connected (`maxclients`) says
/// before it closes a new connection.
const FULL: &str = "max number of clients reached";

/// A server or connect error in lockrun's kinds when it says the server is
/// full (`Error::Full`, naming the limit); None for any other.
pub fn full(text: &str) -> Option<Error> {
    text.contains(FULL).then(|| {
        Error::Full(format!(
            "{text}: every connection the server allows (maxclients) is taken"
        ))
    })
}

/// One connection to the server that holds the keys, reconnected on demand.
pub struct Link {
    pub connector: Connector,
    pub conn: Option<Conn>,
    /// The data node `conn` reaches, behind sentinels.
    pub node: Option<Node>,
    /// Bounds one request, connect included.
    pub op: Duration,
    /// The server as shown, and whether it has answered yet.
    pub remote: Remote,
}

impl Link {
    fn conn(&mut self) -> Result<&mut Conn, Error> {
        if self.conn.is_none() {
            let linked = reconnect(&self.connector, self.op)
                .map_err(|m| full(&m).unwrap_or(Error::Transient(m)))?;
            self.conn = Some(linked.conn);
            self.node = linked.node;
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    /// Run a call; any transport error drops the connection, since its state is unknown.
    pub fn call<T>(
        &mut self,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        let conn = self.conn()?;
        match f(conn) {
            Ok(v) => {
                self.remote.replied = true;
                Ok(v)
            }
            Err(e) => {
                if let Some(full) = full(&describe(&e)) {
                    self.remote.replied = true;
                    self.conn = None;
                    return Err(full);
                }
                if !is_transient(&e) {
                    self.remote.replied = true;
                    return Err(Error::Refused(describe(&e)));
                }
                if e.code().is_some() {
                    // A transient state reported by a server that does answer.
                    self.remote.replied = true;
                }
                self.conn = None;
                Err(Error::Transient(describe(&e)))
            }
        }
    }

    /// A link on the same server that takes over this one's connection (a
    /// granted lease keeps the connection it was granted on).
    pub fn hand_over(&mut self) -> Link {
        Link {
            connector: self.connector.clone(),
            conn: self.conn.take(),
            node: self.node.clone(),
            op: self.op,
            remote: Remote {
                replied: true,
                ..self.remote.clone()
            },
        }
    }

    /// `WAIT`: whether `replicas` replicas acknowledged every write made on
    /// this connection so far, waiting for them within the request's bound.
    pub fn acknowledged(&mut self, replicas: u32, what: &str) -> Result<(), Error> {
        let op = self.op;
        let n = self.call(|c| wait_replicas(c, replicas, op))?;
        if n < i64::from(replicas) {
            return Err(Error::Transient(format!(
                "only {n} of {replicas} replicas acknowledged the {what}"
            )));
        }
        Ok(())
    }

    /// Whether the connection still reaches the master (behind sentinels);
    /// an error when no majority of the sentinels says.
    pub fn on_master(&self) -> Result<bool, Error> {
        self.connector
            .still_master(self.node.as_ref(), self.op)
            .map_err(|e| Error::Transient(describe(&e)))
    }
}

/// `WAIT replicas ms`, answering before the connection's own read timeout.
pub fn wait_replicas(c: &mut Conn, replicas: u32, op: Duration) -> redis::RedisResult<i64> {
    // Half the bound: the answer must come back within the read timeout
    // also on a loaded machine.
    let ms = (op.as_millis() / 2).max(1) as u64;
    redis::cmd("WAIT").arg(replicas).arg(ms).query(c)
}

/// A new connection after the first one, bounded as a whole (name resolution
/// included, which no socket timeout covers): a resolver that stopped
/// answering must not hang a waiter or the release at the end of a run.
pub fn reconnect(connector: &Connector, timeout: Duration) -> Result<Linked, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let connector = connector.clone();
    // The connect bounds itself a little sooner, so that its own account
    // (a sentinel majority that did not answer, say) arrives in time; this
    // bound is for what it cannot bound (name resolution).
    let own = timeout.saturating_sub((timeout / 10).min(Duration::from_millis(100)));
    std::thread::Builder::new()
        .name("lockrun-connect".into())
        .spawn(move || {
            let _ = tx.send(connector.connect(own));
        })
        .map_err(|e| format!("cannot start a thread to connect: {e}"))?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err(format!(
            "no connection within {timeout:?} (name resolution or connect stalled)"
        )),
    }
}

pub fn is_auth_error(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || e.code().is_some_and(|c| c == "WRONGPASS" || c == "NOAUTH")
}

/// Describe a Redis error without ever including the server's echo of our
/// arguments, in one line.
pub fn describe(e: &redis::RedisError) -> String {
    let text = said(e);
    // Nothing below may span lines: an error is one line of stderr. Then
    // no secret, and what the server wrote shown escaped.
    log::redact(&text.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn said(e: &redis::RedisError) -> String {
    if e.is_timeout() {
        return "timed out".into();
    }
    if e.is_connection_refusal() {
        return "connection refused".into();
    }
    if is_auth_error(e) {
        return "the server refused the credentials (check the user and password in the URL)"
            .into();
    }
    let text = e.to_string();
    // The parser's own account spans lines and shows the bytes it met.
    if e.kind() == redis::ErrorKind::Parse || text.contains("Parse error") {
        return "the reply was not Redis's protocol (is the address a Redis server's? a TLS \
                port needs rediss://)"
            .into();
    }
    if text.contains("certificate") {
        return format!(
            "TLS: the server's certificate is not trusted ({}); pass its CA with --tls-ca",
            text
        );
    }
    if text.contains("WRONGTYPE") || text.contains("LOCKRUN the key exists") {
        return "a key at this lock's name is not a lockrun lease (wrong type); \
                remove it or choose another --prefix"
            .into();
    }
    // A server error reads as the server said it ("LOADING Redis is loading…").
    if let (Some(code), Some(detail)) = (e.code(), e.detail()) {
        return format!("{code} {detail}");
    }
    // A failure that lockrun or the client put into words: the words alone,
    // without the kind and category it was filed under.
    if let Some(detail) = e.detail() {
        return detail.to_string();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_told_in_one_line() {
        let garbage = redis::RedisError::from((
            redis::ErrorKind::Parse,
            "parse",
            "Parse error at 1\nUnexpected `84`\n".to_string(),
        ));
        let said = describe(&garbage);
        assert!(said.contains("not Redis's protocol"), "{said}");
        let ours = redis::RedisError::from((
            redis::ErrorKind::Io,
            "no majority",
            "only 1 of the 3\nsentinels answered".to_string(),
        ));
        assert_eq!(describe(&ours), "only 1 of the 3 sentinels answered");
    }

    #[test]
    fn a_full_server_is_said_with_its_limit() {
        let got = full("ERR max number of clients reached").expect("full");
        assert!(
            got.is_transient() && got.to_string().contains("maxclients"),
            "{got}"
        );
        assert!(full("ERR unknown command").is_none());
    }
}
