//! The transport: etcd's v3 JSON gateway over HTTP/1.1, one small
//! synchronous client (ureq) with no runtime. Every call is bounded as a
//! whole (name resolution, connect, TLS, reply); endpoints are tried in
//! turn; which of etcd's errors are worth riding out is decided here.

use std::io::BufRead;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use serde_json::{Value, json};

use super::address::EtcdUrl;
use crate::backend::Error;
use crate::backend::drive::Remote;
use crate::clock::Boot;
use crate::log;

/// What every client of one address shares: endpoints, credentials, TLS roots.
pub struct Setup {
    endpoints: Vec<String>,
    pub display: String,
    credentials: Option<(String, String)>,
    tls: Option<ureq::tls::TlsConfig>,
}

impl Setup {
    pub fn new(url: &EtcdUrl) -> Result<Setup, Error> {
        let tls = if url.tls {
            Some(tls_config(url)?)
        } else {
            None
        };
        Ok(Setup {
            endpoints: url.endpoints.clone(),
            display: url.display.clone(),
            credentials: url.user.clone().zip(url.password.clone()),
            tls,
        })
    }

    fn agent(&self) -> ureq::Agent {
        let mut cfg = ureq::Agent::config_builder()
            // etcd's errors come as JSON bodies with a non-200 status: read them.
            .http_status_as_error(false)
            .user_agent("lockrun")
            .max_redirects(0)
            .no_delay(true);
        if let Some(tls) = &self.tls {
            cfg = cfg.tls_config(tls.clone());
        }
        ureq::Agent::with_parts(
            cfg.build(),
            ureq::unversioned::transport::DefaultConnector::default(),
            Literal::default(),
        )
    }
}

/// ureq's resolver, except that an address written as an IP address is
/// taken as it is: ureq resolves before every request, even on a pooled
/// connection, on a thread of its own when the call has a time limit (a
/// thread per call; a listing makes thousands). ureq's resolver API is
/// outside its semver promise: an update of ureq may need this changed.
#[derive(Debug, Default)]
struct Literal(ureq::unversioned::resolver::DefaultResolver);

impl ureq::unversioned::resolver::Resolver for Literal {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        let host = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'));
        if let (Some(Ok(ip)), Some(port)) = (host.map(str::parse), uri.port_u16()) {
            let mut addrs = self.empty();
            addrs.push(std::net::SocketAddr::new(ip, port));
            return Ok(addrs);
        }
        self.0.resolve(uri, config, timeout)
    }
}

/// The roots an `etcds://` server is checked against: `--tls-ca`, else the system's.
fn tls_config(url: &EtcdUrl) -> Result<ureq::tls::TlsConfig, Error> {
    use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig, TlsProvider};
    let certs: Vec<Certificate<'static>> = match &url.ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                Error::Request(format!("cannot read --tls-ca {}: {e}", path.display()))
            })?;
            let certs: Vec<_> = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(PemItem::Certificate(c)) => Some(c),
                    _ => None,
                })
                .collect();
            if certs.is_empty() {
                return Err(Error::Request(format!(
                    "--tls-ca {} holds no PEM certificate",
                    path.display()
                )));
            }
            certs
        }
        None => rustls_native_certs::load_native_certs()
            .certs
            .iter()
            .map(|der| Certificate::from_der(der.as_ref()).to_owned())
            .collect(),
    };
    Ok(TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .disable_verification(url.insecure)
        .root_certs(RootCerts::Specific(Arc::new(certs)))
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .build())
}

/// gRPC status codes (etcd's errors carry them) of states that a leader
/// election, an overloaded or restarting member produce for a while:
/// CANCELLED (lockrun cancels nothing: the gateway's connection to the
/// server was closed under the call, as a graceful stop does), UNAVAILABLE,
/// DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED ("too many requests"), ABORTED.
const TRANSIENT_CODES: [i64; 5] = [1, 14, 4, 8, 10];

/// The same states as etcd and its gateway word them, for errors that come
/// without a code (or with one that also means other things): an election,
/// a server stopping or starting, a connection lost after it answered.
const TRANSIENT_TEXT: [&str; 15] = [
    "leader changed",
    "no leader",
    "not leader",
    "too many requests",
    "request timed out",
    "timed out",
    "not capable",
    "unhealthy cluster",
    "server stopped",
    "raft: stopped",
    "request cancelled",
    "context canceled",
    "client connection is closing",
    "transport is closing",
    "error reading from server",
];

/// etcd's UNAUTHENTICATED with an expired or unknown token: authenticate again.
const CODE_UNAUTHENTICATED: i64 = 16;

/// What an error reply from etcd means to lockrun.
fn classify(code: i64, message: &str, display: &str) -> Error {
    let message = log::redact(message);
    if TRANSIENT_CODES.contains(&code) || TRANSIENT_TEXT.iter().any(|t| message.contains(t)) {
        return Error::Transient(message);
    }
    if code == 7
        || code == CODE_UNAUTHENTICATED
        || [
            "authentication failed",
            "permission denied",
            "user name is empty",
        ]
        .iter()
        .any(|t| message.contains(t))
    {
        return Error::Refused(format!(
            "etcd at {display} refused lockrun: {message}; check the user and password in the \
             URL and the role's permissions (lockrun-engines(7) \"ETCD\")"
        ));
    }
    Error::Refused(format!("etcd at {display}: {message}"))
}

/// The gRPC code and message of an error reply. A unary call's comes at
/// the top (`{"error": "…", "code": 14, "message": "…"}`); a stream's
/// (a keepalive, a watch) as `{"error": {"grpc_code": 14, "message": "…"}}`.
fn reply_error(v: &Value) -> (i64, &str) {
    let inner = &v["error"];
    let message = v["message"]
        .as_str()
        .or(inner.as_str())
        .or(inner["message"].as_str())
        .unwrap_or("unexpected reply");
    let code = v["code"]
        .as_i64()
        .or(inner["grpc_code"].as_i64())
        .or(inner["code"].as_i64())
        .unwrap_or(0);
    (code, message)
}

/// How one try at one endpoint ended.
enum Try {
    Answered(Value),
    /// An error reply (or no etcd at all behind the address).
    Failed(Error),
    /// This endpoint cannot be reached: the next may be.
    Unreachable(String),
    /// The budget ran out on this endpoint.
    TimedOut,
}

fn describe(e: &ureq::Error) -> String {
    let text = log::redact(&e.to_string());
    if text.contains("certificate") || text.contains("UnknownIssuer") {
        return format!(
            "TLS: the server's certificate is not trusted ({text}); pass its CA with --tls-ca"
        );
    }
    text
}

/// One client: a connection pool over the endpoints, the endpoint in use,
/// and the auth token once it has one.
pub struct Client {
    setup: Arc<Setup>,
    agent: ureq::Agent,
    current: usize,
    token: Option<String>,
    /// Bounds one call, connecting and authenticating included.
    pub op: Duration,
    /// etcd as shown, and whether it has answered yet.
    pub remote: Remote,
}

impl Client {
    pub fn new(setup: Arc<Setup>, op: Duration) -> Client {
        Client {
            agent: setup.agent(),
            remote: Remote::new(setup.display.clone()),
            setup,
            current: 0,
            token: None,
            op,
        }
    }

    /// A client on the same connections (a granted lease releases on the
    /// connection it was granted on, with no new connect).
    pub fn hand_over(&self) -> Client {
        Client {
            agent: self.agent.clone(),
            ..self.fresh()
        }
    }

    /// A client for the same cluster with connections of its own (a
    /// renewal must not wait behind a stuck one).
    pub fn fresh(&self) -> Client {
        Client {
            agent: self.setup.agent(),
            setup: Arc::clone(&self.setup),
            current: self.current,
            token: self.token.clone(),
            op: self.op,
            remote: Remote {
                replied: true,
                ..self.remote.clone()
            },
        }
    }

    /// POST `body` to `path` (`/v3/kv/range`, …) and return etcd's reply,
    /// within `op` whatever the endpoints do.
    pub fn call(&mut self, path: &str, body: &Value) -> Result<Value, Error> {
        let until = Boot::now().add(self.op);
        let n = self.setup.endpoints.len();
        // One endpoint gets a second try: a pooled connection the server
        // closed while we were idle fails once, then a new one is opened.
        let tries = n.max(2);
        let mut last = String::new();
        let mut reauthenticated = false;
        let mut tried = 0;
        while tried < tries {
            let left = until.since(Boot::now());
            if left.is_zero() {
                break;
            }
            let base = self.setup.endpoints[self.current].clone();
            if self.token.is_none()
                && let Some((user, password)) = self.setup.credentials.clone()
            {
                let auth = json!({"name": user, "password": password});
                match self.post(&base, "/v3/auth/authenticate", &auth, left, false) {
                    Try::Answered(v) => {
                        self.token = v["token"].as_str().map(String::from);
                    }
                    Try::Failed(e) => return Err(e),
                    Try::Unreachable(why) => {
                        last = why;
                        self.current = (self.current + 1) % n;
                        tried += 1;
                        continue;
                    }
                    Try::TimedOut => break,
                }
            }
            let left = until.since(Boot::now());
            match self.post(&base, path, body, left, true) {
                Try::Answered(v) => return Ok(v),
                Try::Failed(Error::Refused(m))
                    if self.token.is_some()
                        && !reauthenticated
                        && m.contains("invalid auth token") =>
                {
                    // Simple tokens expire (5 minutes idle by default): once more with a new one.
                    self.token = None;
                    reauthenticated = true;
                }
                Try::Failed(e) => return Err(e),
                Try::Unreachable(why) => {
                    last = why;
                    self.current = (self.current + 1) % n;
                    tried += 1;
                }
                Try::TimedOut => {
                    // The next call starts on the next endpoint: this one may be stuck.
                    self.current = (self.current + 1) % n;
                    break;
                }
            }
        }
        if tried >= tries {
            return Err(Error::Transient(format!(
                "cannot reach etcd at {}: {last}",
                self.setup.display
            )));
        }
        Err(Error::Transient(format!(
            "no answer from etcd at {} within {}",
            self.setup.display,
            crate::text::duration(Duration::from_millis(self.op.as_millis() as u64))
        )))
    }

    fn post(&mut self, base: &str, path: &str, body: &Value, left: Duration, auth: bool) -> Try {
        let mut req = self
            .agent
            .post(format!("{base}{path}"))
            .config()
            .timeout_global(Some(left.max(Duration::from_millis(1))))
            .build()
            .header("Content-Type", "application/json");
        if auth && let Some(t) = &self.token {
            req = req.header("Authorization", t.as_str());
        }
        let resp = match req.send(body.to_string().as_bytes()) {
            Ok(r) => r,
            Err(ureq::Error::Timeout(_)) => return Try::TimedOut,
            Err(
                e
                @ (ureq::Error::Io(_) | ureq::Error::ConnectionFailed | ureq::Error::HostNotFound),
            ) => return Try::Unreachable(describe(&e)),
            Err(e) => return Try::Failed(Error::Refused(describe(&e))),
        };
        let status = resp.status().as_u16();
        let text = match resp
            .into_body()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
        {
            Ok(t) => t,
            Err(ureq::Error::Timeout(_)) => return Try::TimedOut,
            // The server answered, then the connection broke: worth another try.
            Err(e) => return Try::Failed(Error::Transient(describe(&e))),
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            self.remote.replied = true;
            // A proxy in front of etcd answers 502 or 503 while etcd
            // restarts: that passes, as a lost connection does.
            if status >= 500 {
                return Try::Failed(Error::Transient(format!(
                    "{base} answered HTTP {status} without etcd's JSON"
                )));
            }
            return Try::Failed(Error::Refused(format!(
                "{base} answered HTTP {status} with something other than etcd's v3 JSON \
                 gateway (etcd 3.4 or later is needed)"
            )));
        };
        self.remote.replied = true;
        if status == 200 && v.get("error").is_none() {
            return Try::Answered(v);
        }
        let (code, message) = reply_error(&v);
        Try::Failed(classify(code, message, &self.setup.display))
    }

    /// Watch `creates` (one or more watch create requests, as JSON) on a
    /// thread of its own. The receiver hears once: Ok(true) when an event
    /// came (or the server cancelled the watch: look again either way),
    /// Ok(false) when the stream ended without one, Err when it broke.
    /// After `life` the thread gives up on its own, with Ok(false), so a
    /// watch never outlives its use by long.
    pub fn watch(&self, creates: String, life: Duration) -> Receiver<Result<bool, Error>> {
        let (tx, rx) = channel();
        let agent = self.agent.clone();
        let base = self.setup.endpoints[self.current].clone();
        let token = self.token.clone();
        let op = self.op;
        let spawned = std::thread::Builder::new()
            .name("lockrun-watch".into())
            .spawn(move || watch_stream(agent, base, token, creates, op, life, &tx));
        if let Err(e) = spawned {
            let (tx, rx2) = channel();
            let _ = tx.send(Err(Error::Internal(format!(
                "cannot start a thread to watch: {e}"
            ))));
            return rx2;
        }
        rx
    }
}

fn watch_stream(
    agent: ureq::Agent,
    base: String,
    token: Option<String>,
    creates: String,
    op: Duration,
    life: Duration,
    tx: &Sender<Result<bool, Error>>,
) {
    let mut req = agent
        .post(format!("{base}/v3/watch"))
        .config()
        .timeout_resolve(Some(op))
        .timeout_connect(Some(op))
        .timeout_recv_response(Some(op))
        .timeout_recv_body(Some(life))
        .build()
        .header("Content-Type", "application/json");
    if let Some(t) = &token {
        req = req.header("Authorization", t.as_str());
    }
    let resp = match req.send(creates.as_bytes()) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Err(Error::Transient(format!("watching: {}", describe(&e)))));
            return;
        }
    };
    if resp.status().as_u16() != 200 {
        let _ = tx.send(Err(Error::Transient(format!(
            "watching: HTTP {}",
            resp.status().as_u16()
        ))));
        return;
    }
    let reader = std::io::BufReader::new(resp.into_body().into_reader());
    for line in reader.lines() {
        let line = match line {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                let _ = tx.send(Ok(false));
                return;
            }
            Err(e) => {
                let _ = tx.send(Err(Error::Transient(format!("watching: {e}"))));
                return;
            }
        };
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if v.get("error").is_some() {
            let (code, message) = reply_error(&v);
            let _ = tx.send(Err(classify(code, message, &base)));
            return;
        }
        let r = &v["result"];
        let events = r["events"].as_array().is_some_and(|e| !e.is_empty());
        if events || r["canceled"].as_bool() == Some(true) {
            let _ = tx.send(Ok(true));
            return;
        }
    }
    // The server (or something in between) ended the stream: look again.
    let _ = tx.send(Ok(false));
}

/// etcd's int64 fields come as JSON strings.
pub fn int(v: &Value) -> Option<i64> {
    match v {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

pub fn b64(s: impl AsRef<[u8]>) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

pub fn unb64(v: &Value) -> Option<String> {
    String::from_utf8(unb64_bytes(v)?).ok()
}

/// The bytes a gateway field holds (a key need not be text).
pub fn unb64_bytes(v: &Value) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str()?)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_fall_in_the_documented_classes() {
        let d = "etcd://h";
        for (code, text) in [
            (14, "etcdserver: leader changed"),
            (8, "etcdserver: too many requests"),
            (14, "etcdserver: request timed out"),
            (2, "etcdserver: no leader"),
        ] {
            assert!(classify(code, text, d).is_transient(), "{text}");
        }
        for (code, text) in [
            (
                3,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            (7, "etcdserver: permission denied"),
            (3, "etcdserver: user name is empty"),
            (3, "etcdserver: key is not provided"),
        ] {
            let e = classify(code, text, d);
            assert!(matches!(e, Error::Refused(_)), "{text}: {e:?}");
        }
    }

    #[test]
    fn error_replies_of_calls_and_streams_are_classified_alike() {
        let d = "etcd://h";
        let class = |body: &str| {
            let v: Value = serde_json::from_str(body).unwrap();
            let (code, message) = reply_error(&v);
            classify(code, message, d)
        };
        // As the gateway answers a unary call and a stream (keepalive,
        // watch) during an election, under load, or without a leader.
        for body in [
            r#"{"error":"etcdserver: leader changed","code":14,"message":"etcdserver: leader changed"}"#,
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: leader changed","http_status":"Service Unavailable"}}"#,
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#,
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"transport is closing","http_status":"Service Unavailable"}}"#,
            r#"{"error":{"grpc_code":4,"http_code":504,"message":"context deadline exceeded","http_status":"Gateway Timeout"}}"#,
            r#"{"error":{"grpc_code":8,"http_code":429,"message":"etcdserver: too many requests","http_status":"Too Many Requests"}}"#,
            r#"{"error":{"grpc_code":10,"http_code":409,"message":"aborted","http_status":"Conflict"}}"#,
            r#"{"error":{"grpc_code":2,"http_code":500,"message":"etcdserver: request timed out","http_status":"Internal Server Error"}}"#,
            // A graceful stop (SIGTERM) under calls and watches.
            r#"{"error":"grpc: the client connection is closing","code":1,"message":"grpc: the client connection is closing"}"#,
            r#"{"error":{"grpc_code":1,"http_code":499,"message":"grpc: the client connection is closing","http_status":"Client Closed Request"}}"#,
            r#"{"error":"grpc: the client connection is closing","message":"grpc: the client connection is closing"}"#,
            r#"{"error":"etcdserver: server stopped","code":14,"message":"etcdserver: server stopped"}"#,
            r#"{"error":"etcdserver: server stopped","message":"etcdserver: server stopped"}"#,
            r#"{"error":"rpc error: code = Unavailable desc = error reading from server: EOF","message":"error reading from server: EOF"}"#,
            r#"{"error":"transport is closing","message":"transport is closing"}"#,
            r#"{"error":"etcdserver: request cancelled","message":"etcdserver: request cancelled"}"#,
            r#"{"error":"context canceled","code":1,"message":"context canceled"}"#,
        ] {
            assert!(class(body).is_transient(), "{body}");
        }
        for body in [
            r#"{"error":{"grpc_code":16,"http_code":401,"message":"etcdserver: invalid auth token","http_status":"Unauthorized"}}"#,
            r#"{"error":{"grpc_code":7,"http_code":403,"message":"etcdserver: permission denied","http_status":"Forbidden"}}"#,
            r#"{"error":"etcdserver: permission denied","code":7,"message":"etcdserver: permission denied"}"#,
            r#"{"error":{"grpc_code":5,"http_code":404,"message":"etcdserver: requested lease not found","http_status":"Not Found"}}"#,
        ] {
            let e = class(body);
            assert!(matches!(e, Error::Refused(_)), "{body}: {e:?}");
            assert!(!e.to_string().contains("unexpected reply"), "{e}");
        }
    }

    #[test]
    fn ints_and_keys_read_as_the_gateway_writes_them() {
        assert_eq!(int(&json!("12")), Some(12));
        assert_eq!(int(&json!(12)), Some(12));
        assert_eq!(int(&Value::Null), None);
        assert_eq!(
            unb64(&json!(b64("lockrun:a/q/1"))).unwrap(),
            "lockrun:a/q/1"
        );
    }
}
