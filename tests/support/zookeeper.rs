//! ZooKeeper servers of our own from Debian's jar: one standalone server
//! shared by a test file (each user on a chroot of its own), or one of its
//! own for a test that stops or pauses it, or a three-server ensemble;
//! each on free loopback ports with its own data directory, stopped by pid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use zookeeper_client as zk;

use super::{Engine, Process, Server, free_port, wait_until};

const JAR: &str = "/usr/share/java/zookeeper.jar";

fn java() -> &'static str {
    if !Path::new(JAR).exists() || Command::new("java").arg("-version").output().is_err() {
        panic!(
            "ZooKeeper not found: these tests need Debian's ZooKeeper jar and a Java runtime; \
             install them with `apt-get install -y zookeeper`"
        );
    }
    "java"
}

/// The answer of a four-letter word, if the server gives one.
pub fn four_letters(port: u16, word: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(word.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// One ZooKeeper server process.
pub struct ZkServer {
    pub port: u16,
    process: Process,
    cfg: PathBuf,
}

fn launch(cfg: &Path, shared: bool, main: &str) -> Child {
    let mut cmd = if shared {
        // A server for the whole run outlives every test thread: a shell
        // beside it stops it when the test process is gone.
        let mut c = Command::new("sh");
        c.arg("-c").arg(format!(
            "{} {} & j=$!; while kill -0 {} 2>/dev/null && kill -0 $j 2>/dev/null; \
             do sleep 0.5; done; kill -9 $j",
            java_line(main),
            cfg.display(),
            std::process::id()
        ));
        c
    } else {
        let mut c = Command::new(java());
        c.args(java_args(main)).arg(cfg);
        c
    };
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ZooKeeper")
}

fn java_args(main: &str) -> Vec<String> {
    [
        "-Xmx128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Dznode.container.checkIntervalMs=500",
        "-Dzookeeper.admin.enableServer=false",
        "-cp",
        &format!("/etc/zookeeper/conf:{JAR}"),
        &format!("org.apache.zookeeper.server.{main}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn java_line(main: &str) -> String {
    format!("{} {}", java(), java_args(main).join(" "))
}

fn config(dir: &Path, port: u16, extra: &str) -> String {
    format!(
        "tickTime=200\ninitLimit=50\nsyncLimit=25\ndataDir={}\nclientPort={port}\n\
         clientPortAddress=127.0.0.1\nadmin.enableServer=false\nminSessionTimeout=1000\n\
         maxSessionTimeout=120000\nextendedTypesEnabled=true\n4lw.commands.whitelist=*\n{extra}",
        dir.display()
    )
}

impl ZkServer {
    fn start_in(dir: &Path, shared: bool) -> ZkServer {
        for _ in 0..5 {
            let port = free_port();
            let cfg = dir.join("zoo.cfg");
            std::fs::create_dir_all(dir.join("data")).unwrap();
            std::fs::write(&cfg, config(&dir.join("data"), port, "")).unwrap();
            let mut s = ZkServer {
                port,
                process: Process::new(launch(&cfg, shared, "ZooKeeperServerMain")),
                cfg,
            };
            if s.wait_serving() {
                return s;
            }
            s.kill();
        }
        panic!("ZooKeeper did not come up on a loopback port");
    }

    /// Serving: it answers `srvr` with its mode.
    fn wait_serving(&mut self) -> bool {
        let port = self.port;
        let child = self.process.child_mut().unwrap();
        let mut exited = false;
        wait_until(Duration::from_secs(60), || {
            exited = !matches!(child.try_wait(), Ok(None));
            exited || four_letters(port, "srvr").is_some_and(|s| s.contains("Mode:"))
        }) && !exited
    }

    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    pub fn running(&self) -> bool {
        self.process.running()
    }

    /// Restart with `key=value` in its configuration, in place of any
    /// line that set `key`.
    pub fn restart_with(&mut self, key: &str, value: &str) {
        let cfg = std::fs::read_to_string(&self.cfg).unwrap();
        let set = format!("{key}=");
        let mut lines: Vec<&str> = cfg.lines().filter(|l| !l.starts_with(&set)).collect();
        let line = format!("{key}={value}");
        lines.push(&line);
        std::fs::write(&self.cfg, lines.join("\n") + "\n").unwrap();
        self.restart();
    }
}

/// Started again on the same port and data, standalone or as the member
/// of an ensemble it was (a shared server's pid is its watching shell's).
impl Server for ZkServer {
    fn process(&self) -> &Process {
        &self.process
    }

    fn process_mut(&mut self) -> &mut Process {
        &mut self.process
    }

    fn start_again(&mut self) {
        let main = if std::fs::read_to_string(&self.cfg)
            .unwrap()
            .contains("server.1=")
        {
            "quorum.QuorumPeerMain"
        } else {
            "ZooKeeperServerMain"
        };
        self.process = Process::new(launch(&self.cfg, false, main));
        assert!(self.wait_serving(), "ZooKeeper did not come back");
    }
}

impl Engine for ZkServer {
    fn url(&self) -> String {
        ZkServer::url(self)
    }
}

/// A standalone server of one test's own (to stop or pause).
pub struct Zookeeper {
    pub server: ZkServer,
    _dir: tempfile::TempDir,
}

fn scratch_dir() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    }
}

/// The directory of a server that lives as long as the test process (a
/// static's is never dropped): named by the process, so that a later run
/// removes those whose process is gone instead of leaving them in memory.
fn process_dir(kind: &str) -> PathBuf {
    const PREFIX: &str = "lockrun-test-zk-";
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if let Some(rest) = n.strip_prefix(PREFIX)
            && let Some((pid, _)) = rest.split_once('-')
            && let Ok(pid) = pid.parse::<i32>()
            && !super::alive(pid)
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let dir = base.join(format!("{PREFIX}{}-{kind}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Zookeeper {
    pub fn start() -> Zookeeper {
        let dir = scratch_dir();
        Zookeeper {
            server: ZkServer::start_in(dir.path(), false),
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        self.server.url()
    }
}

/// A server of its own is its one server.
impl Server for Zookeeper {
    fn process(&self) -> &Process {
        self.server.process()
    }

    fn process_mut(&mut self) -> &mut Process {
        self.server.process_mut()
    }

    fn start_again(&mut self) {
        self.server.start_again();
    }
}

impl Engine for Zookeeper {
    fn url(&self) -> String {
        self.server.url()
    }
}

/// The standalone server every test of the run shares, each on a chroot
/// of its own.
pub fn shared_zookeeper() -> u16 {
    static SHARED: OnceLock<(u16, PathBuf)> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let dir = process_dir("shared");
            let s = ZkServer::start_in(&dir, true);
            let port = s.port;
            // Left running on purpose: its shell stops it with the test process.
            std::mem::forget(s);
            (port, dir)
        })
        .0
}

/// A chroot of its own on the shared server: `zk://127.0.0.1:PORT/tN`,
/// created empty.
pub fn zk_chroot() -> (u16, String) {
    zk_chroot_on(shared_zookeeper())
}

/// A chroot of its own on the server at `port` (of the shared ensemble, say).
pub fn zk_chroot_on(port: u16) -> (u16, String) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let chroot = format!(
        "/t{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let c = chroot.clone();
    zk_do(port, None, move |z| async move {
        z.create(
            &c,
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .map(|_| ())
    });
    (port, chroot)
}

/// Run `f` with a session of its own to the server on `port` (under
/// `chroot`, if given).
pub fn zk_do<T, F, Fut>(port: u16, chroot: Option<&str>, f: F) -> T
where
    F: FnOnce(zk::Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, zk::Error>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cs = format!("127.0.0.1:{port}{}", chroot.unwrap_or(""));
    rt.block_on(async move {
        let z = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(&cs)
            .await
            .expect("connect to ZooKeeper");
        f(z).await.expect("a ZooKeeper call")
    })
}

/// Every node under `root` (not ZooKeeper's own), with its ephemeral
/// owner (0: persistent; containers and TTL nodes have their own marks).
pub fn zk_tree(port: u16, chroot: Option<&str>) -> Vec<(String, i64)> {
    zk_do(port, chroot, |z| async move {
        let mut out = Vec::new();
        let mut todo = vec!["/".to_string()];
        while let Some(p) = todo.pop() {
            let children = match z.list_children(&p).await {
                Ok(c) => c,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(e),
            };
            for ch in children {
                let path = if p == "/" {
                    format!("/{ch}")
                } else {
                    format!("{p}/{ch}")
                };
                if path == "/zookeeper" {
                    continue;
                }
                if let Ok(Some(st)) = z.check_stat(&path).await {
                    out.push((path.clone(), st.ephemeral_owner));
                }
                todo.push(path);
            }
        }
        Ok(out)
    })
}

/// Delete `path` if it is there.
pub fn zk_delete(port: u16, chroot: Option<&str>, path: &str) {
    let path = path.to_string();
    zk_do(port, chroot, move |z| async move {
        match z.delete(&path, None).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(()),
            Err(e) => Err(e),
        }
    })
}

/// A loopback TCP proxy in front of a ZooKeeper server that can lose the
/// reply to one create of a request node: it passes the request on, drops
/// everything the server says from then on, and cuts the connection, as a
/// network that fails at the worst moment would. It can also stall every
/// connection (a partition: nothing passes either way).
pub struct ZkProxy {
    pub port: u16,
    lose_create: std::sync::Arc<std::sync::atomic::AtomicBool>,
    lose_delete: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stall: std::sync::Arc<std::sync::atomic::AtomicBool>,
    refuse: std::sync::Arc<std::sync::atomic::AtomicBool>,
    hold_set_data: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// setData requests held back so far (see `hold_set_data`).
    pub set_data_held: std::sync::Arc<AtomicU32>,
    /// Creates whose reply it lost.
    pub lost: std::sync::Arc<AtomicU32>,
    /// Connections on which the server's first reply (to the connect
    /// request) went through to the client.
    pub connected: std::sync::Arc<AtomicU32>,
}

impl ZkProxy {
    pub fn start(upstream: u16) -> ZkProxy {
        use std::io::{Read, Write};
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let lose_create = Arc::new(AtomicBool::new(false));
        let lose_delete = Arc::new(AtomicBool::new(false));
        let stall = Arc::new(AtomicBool::new(false));
        let refuse = Arc::new(AtomicBool::new(false));
        let rf = refuse.clone();
        let hold_set_data = Arc::new(AtomicBool::new(false));
        let set_data_held = Arc::new(AtomicU32::new(0));
        let (hs, sh) = (hold_set_data.clone(), set_data_held.clone());
        let lost = Arc::new(AtomicU32::new(0));
        let connected = Arc::new(AtomicU32::new(0));
        let ld = lose_delete.clone();
        let (lc, st, lo, co) = (
            lose_create.clone(),
            stall.clone(),
            lost.clone(),
            connected.clone(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let cut = Arc::new(AtomicBool::new(false));
                let (mut c_read, mut s_write) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (lc, st1, lo, cut1) = (lc.clone(), st.clone(), lo.clone(), cut.clone());
                let ld = ld.clone();
                let rf = rf.clone();
                let (hs, sh) = (hs.clone(), sh.clone());
                let (c_close, s_close) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    // Frames: a 4-byte length, then the body; the first is
                    // the connect request, later ones start xid, op code.
                    let mut first = true;
                    loop {
                        let mut len = [0u8; 4];
                        if c_read.read_exact(&mut len).is_err() {
                            return;
                        }
                        if first && len.iter().all(u8::is_ascii_lowercase) {
                            // A four-letter word (srvr, ruok): as it is.
                            let _ = s_write.write_all(&len);
                            let _ = std::io::copy(&mut c_read, &mut s_write);
                            return;
                        }
                        let n = u32::from_be_bytes(len) as usize;
                        let mut body = vec![0u8; n];
                        if c_read.read_exact(&mut body).is_err() {
                            return;
                        }
                        while st1.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        if first && rf.load(Ordering::SeqCst) {
                            // As a server over its maxClientCnxns does,
                            // but only once the client asks for a session.
                            let _ = c_close.shutdown(std::net::Shutdown::Both);
                            let _ = s_close.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        let op = (!first && n >= 8)
                            .then(|| i32::from_be_bytes(body[4..8].try_into().unwrap()));
                        // setData (5): held back while asked, at most 60 s.
                        if op == Some(5) && hs.load(Ordering::SeqCst) {
                            sh.fetch_add(1, Ordering::SeqCst);
                            for _ in 0..3000 {
                                if !hs.load(Ordering::SeqCst) {
                                    break;
                                }
                                std::thread::sleep(Duration::from_millis(20));
                            }
                        }
                        if s_write.write_all(&len).is_err() || s_write.write_all(&body).is_err() {
                            return;
                        }
                        first = false;
                        // create (1), create2 (15), createTTL (19)
                        let creates = matches!(op, Some(1 | 15 | 19))
                            && String::from_utf8_lossy(&body).contains("/q-");
                        // delete (2), or a multi (14) whose first op deletes
                        let first_op =
                            (n >= 12).then(|| i32::from_be_bytes(body[8..12].try_into().unwrap()));
                        let deletes = (op == Some(2) || (op == Some(14) && first_op == Some(2)))
                            && String::from_utf8_lossy(&body).contains("/q-");
                        let lose = (creates && lc.swap(false, Ordering::SeqCst))
                            || (deletes && ld.swap(false, Ordering::SeqCst));
                        if lose {
                            cut1.store(true, Ordering::SeqCst);
                            lo.fetch_add(1, Ordering::SeqCst);
                            // Let the server act on it, then cut.
                            std::thread::sleep(Duration::from_millis(300));
                            let _ = c_close.shutdown(std::net::Shutdown::Both);
                            let _ = s_close.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                    }
                });
                let st = st.clone();
                let co = co.clone();
                let (mut s_read, mut c_write) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut first = true;
                    loop {
                        let n = match s_read.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        while st.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        if cut.load(Ordering::SeqCst) {
                            continue;
                        }
                        if c_write.write_all(&buf[..n]).is_err() {
                            return;
                        }
                        if std::mem::take(&mut first) {
                            co.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        ZkProxy {
            port,
            lose_create,
            lose_delete,
            stall,
            refuse,
            hold_set_data,
            set_data_held,
            lost,
            connected,
        }
    }

    /// Close every connection as soon as it asks for a session (on), as a
    /// server does to an address over its `maxClientCnxns`; a connection
    /// that asks nothing is kept. Or let sessions through again (off).
    pub fn set_refuse_sessions(&self, on: bool) {
        self.refuse.store(on, Ordering::SeqCst);
    }

    pub fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }

    /// Lose the reply to the next create of a request node.
    pub fn lose_next_create(&self) {
        self.lose_create.store(true, Ordering::SeqCst);
    }

    /// Lose the reply to the next delete of a request node (a release).
    pub fn lose_next_delete(&self) {
        self.lose_delete.store(true, Ordering::SeqCst);
    }

    /// Let nothing through either way (on), or everything again (off).
    pub fn set_stall(&self, on: bool) {
        self.stall.store(on, Ordering::SeqCst);
    }

    /// Hold every setData request back until this is turned off (counted
    /// in `set_data_held`); the rest passes.
    pub fn hold_set_data(&self, on: bool) {
        self.hold_set_data.store(on, Ordering::SeqCst);
    }
}

/// A three-server ensemble on loopback, each server with its own data
/// directory and `myid`.
pub struct Ensemble {
    pub servers: Vec<ZkServer>,
    _dir: Option<tempfile::TempDir>,
}

impl Ensemble {
    pub fn start() -> Ensemble {
        let dir = scratch_dir();
        let servers = Ensemble::launch_in(dir.path(), false);
        Ensemble {
            servers,
            _dir: Some(dir),
        }
    }

    fn launch_in(dir: &Path, shared: bool) -> Vec<ZkServer> {
        let ports: Vec<(u16, u16, u16)> = (0..3)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let peers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, q, e))| format!("server.{}=127.0.0.1:{q}:{e}\n", i + 1))
            .collect();
        let mut servers: Vec<ZkServer> = ports
            .iter()
            .enumerate()
            .map(|(i, (client, _, _))| {
                let d = dir.join(format!("s{}", i + 1));
                std::fs::create_dir_all(d.join("data")).unwrap();
                std::fs::write(d.join("data/myid"), format!("{}\n", i + 1)).unwrap();
                let cfg = d.join("zoo.cfg");
                std::fs::write(&cfg, config(&d.join("data"), *client, &peers)).unwrap();
                ZkServer {
                    port: *client,
                    process: Process::new(launch(&cfg, shared, "quorum.QuorumPeerMain")),
                    cfg,
                }
            })
            .collect();
        for s in &mut servers {
            assert!(s.wait_serving(), "an ensemble server did not come up");
        }
        servers
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("zk://{}", hosts.join(","))
    }

    /// The index of the server that leads now.
    pub fn leader(&self) -> Option<usize> {
        self.servers.iter().position(|s| {
            s.running() && four_letters(s.port, "srvr").is_some_and(|t| t.contains("Mode: leader"))
        })
    }
}

/// The ensemble every test of the run shares: its client ports.
pub fn shared_ensemble() -> Vec<u16> {
    static SHARED: OnceLock<Vec<u16>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let dir = process_dir("ensemble");
            let servers = Ensemble::launch_in(&dir, true);
            let ports = servers.iter().map(|s| s.port).collect();
            std::mem::forget(servers);
            ports
        })
        .clone()
}

/// A standalone server of a test file's own that also serves TLS on a
/// second loopback port, with the server certificate `make_certs` made in
/// `certs` (the key and the certificate in one PEM file, as ZooKeeper's PEM
/// key store wants). Runs until the test process is gone.
pub struct ZkTls {
    /// The plain client port.
    pub port: u16,
    /// The TLS client port.
    pub tls_port: u16,
}

pub fn start_zookeeper_tls(certs: &Path) -> ZkTls {
    let key_and_cert = certs.join("srv-key-and-cert.pem");
    let pem = std::fs::read_to_string(certs.join("srv.key")).unwrap()
        + &std::fs::read_to_string(certs.join("srv.crt")).unwrap();
    std::fs::write(&key_and_cert, pem).unwrap();
    static STARTED: AtomicU32 = AtomicU32::new(0);
    let dir = process_dir(&format!("tls{}", STARTED.fetch_add(1, Ordering::SeqCst)));
    for _ in 0..5 {
        let port = free_port();
        let tls_port = free_port();
        if tls_port == port {
            continue;
        }
        let extra = format!(
            "secureClientPort={tls_port}\nsecureClientPortAddress=127.0.0.1\n\
             serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
             ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=none\n",
            key_and_cert.display(),
            certs.join("ca.crt").display()
        );
        let cfg = dir.join("zoo.cfg");
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::write(&cfg, config(&dir.join("data"), port, &extra)).unwrap();
        // Netty's TLS handler needs its codec jar, which the jar's own
        // class path leaves out.
        let args: Vec<String> = java_args("ZooKeeperServerMain")
            .into_iter()
            .map(|a| {
                if a.starts_with("/etc/zookeeper/conf:") {
                    format!("{a}:/usr/share/java/netty-codec.jar")
                } else {
                    a
                }
            })
            .collect();
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "{} {} {} & j=$!; while kill -0 {} 2>/dev/null && kill -0 $j 2>/dev/null; \
                 do sleep 0.5; done; kill -9 $j",
                java(),
                args.join(" "),
                cfg.display(),
                std::process::id()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ZooKeeper");
        let mut s = ZkServer {
            port,
            process: Process::new(child),
            cfg,
        };
        let listening = |p: u16| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok();
        if s.wait_serving() && wait_until(Duration::from_secs(30), || listening(tls_port)) {
            // Left running on purpose: its shell stops it with the test process.
            std::mem::forget(s);
            return ZkTls { port, tls_port };
        }
        s.kill();
    }
    panic!("ZooKeeper with TLS did not come up on loopback ports");
}
