//! The transport: one ZooKeeper session on a runtime of its own thread
//! (the client's connection task must run while lockrun's job does, or the
//! session would not be kept alive between renewals), every call bounded,
//! and the table that sorts ZooKeeper's errors into kinds.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client as zk;

use super::address::ZkUrl;
use super::granted::Granted;
use crate::backend::Error;
use crate::backend::drive::Remote;

/// The runtime the session's connection task runs on: a thread of its own
/// that drives it until lockrun exits (started only when ZooKeeper is used).
struct Runtime {
    handle: tokio::runtime::Handle,
    /// What the server granted the sessions run here, each time they
    /// connected.
    granted: Granted,
}

impl Runtime {
    fn start() -> Result<Runtime, Error> {
        reactor()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| Error::Internal(format!("starting ZooKeeper's runtime: {e}")))?;
        let handle = rt.handle().clone();
        let granted = Granted::default();
        let collector = granted.collector();
        std::thread::Builder::new()
            .name("lockrun-zk".into())
            .spawn(move || {
                // The client's connect replies are read on this thread.
                let _reading = tracing_core::dispatcher::set_default(&collector);
                rt.block_on(std::future::pending::<()>())
            })
            .map_err(|e| Error::Internal(format!("starting ZooKeeper's runtime: {e}")))?;
        Ok(Runtime { handle, granted })
    }
}

/// Start the client's I/O reactor (async-io's), which aborts the process
/// when it cannot have its descriptors: first make sure a few are free,
/// then start it here at once, so that a tight descriptor limit is a
/// failure (70) rather than an abort.
fn reactor() -> Result<(), Error> {
    use futures_util::FutureExt;
    let mut probe = Vec::new();
    for _ in 0..4 {
        match rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC) {
            Ok(fd) => probe.push(fd),
            Err(e) => {
                return Err(Error::Internal(format!(
                    "starting ZooKeeper's client: {}",
                    std::io::Error::from(e)
                )));
            }
        }
    }
    drop(probe);
    // Polling a timer once makes async-io set up its reactor.
    let _ = async_io::Timer::after(Duration::from_secs(3600)).now_or_never();
    Ok(())
}

/// One session to the ensemble.
#[derive(Clone)]
pub struct Client {
    rt: Arc<Runtime>,
    zk: zk::Client,
    /// Bounds one call.
    pub op: Duration,
    /// The ensemble as messages show it; a session exists only once a
    /// server answered.
    pub remote: Remote,
    /// The session timeout the server granted when the session began (it
    /// may grant another on a reconnect: `granted`).
    pub timeout: Duration,
    /// Credentials were given: our nodes carry an ACL for their identity.
    pub authed: bool,
    /// The URL's chroot ("" for none).
    chroot: String,
    /// The URL's user, if it gave credentials.
    pub user: Option<String>,
}

/// The line for a chroot that does not exist.
pub fn chroot_missing(url: &str, chroot: &str) -> String {
    format!(
        "the chroot of {url} does not exist: create it (zkCli.sh create {chroot}) or fix the URL"
    )
}

/// Run `f` on the runtime and wait at most `limit` for it.
fn run<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    limit: Duration,
    f: impl Future<Output = Result<T, zk::Error>> + Send + 'static,
) -> Result<T, CallError> {
    let (tx, rx) = std::sync::mpsc::channel();
    handle.spawn(async move {
        let _ = tx.send(f.await);
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CallError::Zk(e)),
        Err(_) => Err(CallError::Timeout(limit)),
    }
}

/// A call's failure before it is sorted.
#[derive(Debug)]
pub enum CallError {
    Zk(zk::Error),
    /// No answer within this long.
    Timeout(Duration),
    /// A node of a name (its path) that this identity may not read: the
    /// ACL of another identity's node. lockrun cannot tell whether it holds.
    Foreign(String),
    /// What the server's state refuses, said in full: a node at a name's
    /// place that is not lockrun's (`foreign_at`), a chroot gone.
    Refused(String),
}

impl Client {
    /// A new session of `ttl` asked for: the server may grant another
    /// (within its minSessionTimeout..maxSessionTimeout).
    pub fn connect(url: &ZkUrl, ttl: Duration, op: Duration) -> Result<Client, Error> {
        let rt = Arc::new(Runtime::start()?);
        Client::connect_on(rt, url, ttl, op)
    }

    fn connect_on(
        rt: Arc<Runtime>,
        url: &ZkUrl,
        ttl: Duration,
        op: Duration,
    ) -> Result<Client, Error> {
        let tls = tls_options(url)?;
        let secure = tls.is_some();
        let connector = |eager: bool| connector(url, ttl, op, tls.clone(), eager);
        let cs = url.connect_string();
        let connect = |c: zk::Connector, limit: Duration| {
            let cs = cs.clone();
            run(&rt.handle, limit, async move {
                if secure {
                    c.secure_connect(&cs).await
                } else {
                    c.connect(&cs).await
                }
            })
        };
        // Connecting tries every server in turn: give it the bound of one
        // call for each, and a little more.
        let limit = op * (url.servers.len() as u32 + 1);
        let started = crate::clock::Boot::now();
        // Each server once first: when every one refuses the connection,
        // that is said at once. Otherwise (a server that answered but gave
        // no session, in an election say) they are tried again until the
        // bound, as the client does.
        let zk = connect(connector(true), limit)
            .or_else(|e| match e {
                CallError::Zk(zk::Error::NoHosts) if refused(url, op).is_none() => connect(
                    connector(false),
                    limit.saturating_sub(crate::clock::Boot::now().since(started)),
                ),
                e => Err(e),
            })
            .map_err(|e| match e {
                // The whole bound, not what was left of it for the last try.
                CallError::Timeout(_) => not_connected(url, op, CallError::Timeout(limit)),
                e => not_connected(url, op, e),
            })?;
        let Some(timeout) = rt.granted.get(zk.session_id().0) else {
            return Err(Error::Internal(
                "the ZooKeeper client did not show the session timeout the server granted".into(),
            ));
        };
        Ok(Client {
            rt,
            zk,
            op,
            remote: Remote {
                replied: true,
                ..Remote::new(url.display.clone())
            },
            timeout,
            authed: url.user.is_some(),
            chroot: url.chroot.clone().unwrap_or_default(),
            user: url.user.clone(),
        })
    }

    /// A new session on the same runtime (the old one expired).
    pub fn reconnect(&self, url: &ZkUrl, ttl: Duration) -> Result<Client, Error> {
        Client::connect_on(self.rt.clone(), url, ttl, self.op)
    }

    pub fn session_id(&self) -> i64 {
        self.zk.session_id().0
    }

    /// The session timeout the server granted when our session last
    /// connected: ZooKeeper negotiates it again on every reconnect. None
    /// only if the client never showed it (the lease is then over).
    pub fn granted(&self) -> Option<Duration> {
        self.rt.granted.get(self.session_id())
    }

    /// When the URL has a chroot and it is gone (deleted, perhaps while
    /// lockrun used it): the refusal that names it. Every call under it
    /// fails with NoNode, which would otherwise read as lockrun's own bug.
    pub fn chroot_gone(&self) -> Result<Option<CallError>, CallError> {
        if self.chroot.is_empty() {
            return Ok(None);
        }
        let there = self.call(|z| async move { z.check_stat("/").await })?;
        Ok(there
            .is_none()
            .then(|| CallError::Refused(chroot_missing(&self.remote.shown, &self.chroot))))
    }

    /// `path` as seen from the server's root: under the URL's chroot.
    pub fn chrooted(&self, path: &str) -> String {
        format!("{}{path}", self.chroot)
    }

    /// A descriptor that becomes readable each time our session connects
    /// again (`Granted::wake_on_connect`).
    pub fn wake_on_connect(&self, lasting: Duration) -> std::io::Result<std::os::fd::OwnedFd> {
        self.rt.granted.wake_on_connect(self.session_id(), lasting)
    }

    /// Run a call with this session within the bound of one call.
    pub fn call<T, F, Fut>(&self, f: F) -> Result<T, CallError>
    where
        T: Send + 'static,
        F: FnOnce(zk::Client) -> Fut,
        Fut: Future<Output = Result<T, zk::Error>> + Send + 'static,
    {
        run(&self.rt.handle, self.op, f(self.zk.clone()))
    }

    /// Spawn a task on the session's runtime (a watch's wait).
    pub fn spawn(&self, f: impl Future<Output = ()> + Send + 'static) {
        self.rt.handle.spawn(f);
    }

    /// The ACL for nodes lockrun creates: only the URL's identity may
    /// change them when it gave credentials, anyone otherwise.
    pub fn acls(&self) -> zk::Acls<'static> {
        if self.authed {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }
}

/// The client's connector for `url`: `eager` fails at once when no server
/// answers instead of trying them again.
fn connector(
    url: &ZkUrl,
    ttl: Duration,
    op: Duration,
    tls: Option<zk::TlsOptions>,
    eager: bool,
) -> zk::Connector {
    let mut c = zk::Client::connector()
        .with_session_timeout(ttl)
        .with_connection_timeout(op);
    if eager {
        c = c.with_fail_eagerly();
    }
    if let (Some(u), Some(p)) = (&url.user, &url.password) {
        c = c.with_auth("digest", format!("{u}:{p}").as_bytes());
    }
    if let Some(options) = tls {
        c = c.with_tls(options);
    }
    c
}

/// What a failed connection says: why no server was reached when that can
/// be told, and what to check when TLS is in use.
fn not_connected(url: &ZkUrl, op: Duration, e: CallError) -> Error {
    let unreached = matches!(
        e,
        CallError::Timeout(_)
            | CallError::Zk(zk::Error::NoHosts | zk::Error::Timeout | zk::Error::ConnectionLoss)
    );
    let why = unreached.then(|| refused(url, op)).flatten();
    match why.unwrap_or_else(|| sort(e, "connecting")) {
        // The client gives no reason for a failed handshake.
        Error::Transient(t) if url.tls => Error::Transient(format!(
            "{t} (TLS: is the port a secureClientPort, and does the server's \
             certificate check against {}?)",
            if url.ca_file.is_some() {
                "--tls-ca"
            } else {
                "the system's roots"
            }
        )),
        e => e,
    }
}

/// The TLS of a `zks://` URL, or None: the roots are the CA file given,
/// else the system's; `#insecure` skips the host name check only (the
/// client checks the chain in every case).
fn tls_options(url: &ZkUrl) -> Result<Option<zk::TlsOptions>, Error> {
    if !url.tls {
        return Ok(None);
    }
    // The client builds its TLS configuration with the process's default
    // provider: lockrun's is ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pem = match &url.ca_file {
        Some(path) => {
            let pem = std::fs::read_to_string(path).map_err(|e| {
                Error::Request(format!("cannot read the CA file {}: {e}", path.display()))
            })?;
            let certs = rustls::pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes())
                .filter_map(Result::<rustls::pki_types::CertificateDer, _>::ok)
                .count();
            if certs == 0 {
                return Err(Error::Request(format!(
                    "the CA file {} holds no PEM certificate",
                    path.display()
                )));
            }
            pem
        }
        None => {
            use base64::Engine as _;
            let mut pem = String::new();
            for cert in rustls_native_certs::load_native_certs().certs {
                let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
                pem.push_str("-----BEGIN CERTIFICATE-----\n");
                for line in b64.as_bytes().chunks(64) {
                    pem.push_str(std::str::from_utf8(line).unwrap_or_default());
                    pem.push('\n');
                }
                pem.push_str("-----END CERTIFICATE-----\n");
            }
            pem
        }
    };
    let options = zk::TlsOptions::new().with_pem_ca(&pem).map_err(|e| {
        let from = match &url.ca_file {
            Some(path) => format!("the CA file {}", path.display()),
            None => "the system's roots".into(),
        };
        Error::Request(format!("{from}: no CA certificate lockrun can use: {e}"))
    })?;
    if url.insecure {
        // SAFETY: not memory safety; the name check is skipped as
        // `#insecure` asks (lockrun-engines(7) "ZOOKEEPER").
        return Ok(Some(unsafe { options.with_no_hostname_verification() }));
    }
    Ok(Some(options))
}

/// Why no session could be had, when no server gave one: the client says
/// only that no server could be reached. Asked of the servers again, each
/// by a connection of its own that asks for the server's state (`srvr`,
/// which asks for no session): refused by every one, or closed at once by
/// at least one of them and refused by the rest (a server closes a new
/// connection at once when the client's address already has as many as
/// its `maxClientCnxns` allows), or answered by one: a server that answers
/// and yet closed the client's requests for a session has no room for this
/// address at those moments (a fleet's connections come and go, and the
/// one asking here took a slot another had just left; asked of a plain
/// URL's servers only). None when any server accepts and says nothing (a
/// server stopped, a network that takes connections and passes nothing).
fn refused(url: &ZkUrl, op: Duration) -> Option<Error> {
    use std::io::{Read, Write};
    use std::net::{TcpStream, ToSocketAddrs};
    let limit = op.min(Duration::from_secs(1));
    let (mut refused, mut closed, mut answered) = (Vec::new(), Vec::new(), Vec::new());
    for server in &url.servers {
        let addrs: Vec<_> = server.to_socket_addrs().ok()?.collect();
        if addrs.is_empty() {
            return None;
        }
        for a in addrs {
            // Closed so soon that the connect itself may see it.
            let gone = |e: &std::io::Error| {
                matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                )
            };
            match TcpStream::connect_timeout(&a, limit) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    refused.push(server.as_str());
                }
                Err(e) if gone(&e) => closed.push(server.as_str()),
                Err(_) => return None,
                Ok(mut s) => {
                    // A server over its limit for this address closes
                    // the connection at once; one with room waits for the
                    // first request, and answers `srvr` in ZooKeeper's
                    // words (anything else taking connections there, a
                    // TLS port among them, does not). Asked in plain text
                    // only of a plain URL's servers: a TLS client at a
                    // plain port is a mistake to say at once, not a full
                    // server to wait out.
                    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                    match s.read(&mut [0u8; 1]) {
                        Ok(0) => closed.push(server.as_str()),
                        Err(e) if gone(&e) => closed.push(server.as_str()),
                        Ok(_) => return None,
                        Err(_) if url.tls => return None,
                        Err(_) => {
                            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                            let mut said = [0u8; 64];
                            let n = s
                                .write_all(b"srvr")
                                .and_then(|()| s.read(&mut said))
                                .unwrap_or(0);
                            let said = String::from_utf8_lossy(&said[..n]);
                            if !(said.starts_with("Zookeeper version")
                                || said.contains("not executed"))
                            {
                                return None;
                            }
                            answered.push(server.as_str());
                        }
                    }
                }
            }
        }
    }
    refused.dedup();
    closed.dedup();
    answered.dedup();
    if !answered.is_empty() {
        return Some(Error::Full(format!(
            "connecting: ZooKeeper at {} answers, but closed this client's connections \
             when they asked for a session: the connections it allows from this address \
             (maxClientCnxns, 60 unless set) are taken as soon as they are free",
            answered.join(", ")
        )));
    }
    if closed.is_empty() {
        return Some(Error::Transient(format!(
            "connecting: connection refused at {}",
            refused.join(", ")
        )));
    }
    // Full, not refused: the server is up, and takes us once one of this
    // address's connections ends.
    Some(Error::Full(format!(
        "connecting: ZooKeeper at {} closed the connection at once: the \
         connections it allows from this address (maxClientCnxns, 60 unless set) are \
         all in use",
        closed.join(", ")
    )))
}

/// Whether a session is over for good (a new one is needed).
pub fn expired(e: &CallError) -> bool {
    matches!(
        e,
        CallError::Zk(zk::Error::SessionExpired | zk::Error::ClientClosed)
    )
}

/// ZooKeeper's errors by kind (lockrun-engines(7) "ZOOKEEPER").
pub fn sort(e: CallError, doing: &str) -> Error {
    let e = match e {
        CallError::Timeout(limit) => {
            return Error::Transient(format!(
                "{doing}: no answer within {}",
                crate::text::duration(limit)
            ));
        }
        CallError::Foreign(path) => {
            return Error::Refused(format!(
                "{doing}: the node {path} belongs to another identity (its ACL denies this \
                 one: NoAuth), so lockrun cannot tell whether it holds the name; every user \
                 of a name must use the same credentials"
            ));
        }
        CallError::Refused(said) => return Error::Refused(format!("{doing}: {said}")),
        CallError::Zk(e) => e,
    };
    use zk::Error as Z;
    let text = format!("{doing}: {}", crate::log::redact(&e.to_string()));
    match e {
        Z::ConnectionLoss
        | Z::Timeout
        | Z::NoHosts
        | Z::SessionMoved
        | Z::Throttled
        | Z::SessionExpired
        | Z::ClientClosed
        // The client's own: a connection reset, no answer on it in time.
        | Z::Custom(_) => Error::Transient(text),
        Z::NoAuth | Z::AuthFailed | Z::InvalidAcl => Error::Refused(format!(
            "{text}: check the URL's user and password, and the ACL on lockrun's nodes"
        )),
        Z::QuotaExceeded | Z::NotReadOnly => Error::Refused(text),
        // Another program's ephemeral node where lockrun's parent goes.
        Z::NoChildrenForEphemerals => Error::Refused(format!(
            "{text}: an ephemeral node that is not lockrun's is in the way; remove it \
             or use another --prefix"
        )),
        // Server codes the client has no name for: a system error, an
        // operation timed out, no quorum for a new configuration, a
        // reconfiguration under way, a request timed out (-1, -7, -13,
        // -14, -122): the ensemble is busy or electing.
        Z::UnexpectedErrorCode(-1 | -7 | -13 | -14 | -122) => Error::Transient(text),
        _ => Error::Internal(text),
    }
}
