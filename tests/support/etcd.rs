//! A one-member etcd of a test's own on loopback, over plain HTTP or TLS.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{Engine, Process, Server, free_port, text, wait_until};

fn etcd_path() -> &'static str {
    for tool in ["etcd", "etcdctl"] {
        if Command::new(tool).arg("--version").output().is_err() {
            panic!(
                "{tool} not found: these tests need a real etcd; \
                 install it with `apt-get install -y etcd-server etcd-client`"
            );
        }
    }
    "etcd"
}

/// A one-member etcd of our own on 127.0.0.1, its data in memory (/dev/shm
/// where there is one), stopped by PID on drop.
pub struct Etcd {
    pub port: u16,
    peer: u16,
    process: Process,
    dir: tempfile::TempDir,
    /// Serve clients over TLS with this certificate and key.
    tls: Option<(PathBuf, PathBuf)>,
}

impl Etcd {
    /// Turn on authentication: a root user and a user `locker` (password
    /// `password`) whose role may read and write under `lockrun:`; returns
    /// the URL that logs in as `locker`.
    pub fn with_locker(&self, password: &str) -> String {
        self.ctl(&["user", "add", "root:rootpw"]);
        self.ctl(&["user", "add", &format!("locker:{password}")]);
        self.ctl(&["role", "add", "locking"]);
        self.ctl(&[
            "role",
            "grant-permission",
            "locking",
            "--prefix=true",
            "readwrite",
            "lockrun:",
        ]);
        self.ctl(&["user", "grant-role", "locker", "locking"]);
        self.ctl(&["auth", "enable"]);
        format!("etcd://locker:{password}@127.0.0.1:{}", self.port)
    }

    pub fn start() -> Etcd {
        Etcd::start_with(None)
    }

    /// An etcd whose clients speak TLS to a server holding `cert` and `key`.
    pub fn start_tls(cert: &Path, key: &Path) -> Etcd {
        Etcd::start_with(Some((cert.to_owned(), key.to_owned())))
    }

    fn start_with(tls: Option<(PathBuf, PathBuf)>) -> Etcd {
        let dir = if Path::new("/dev/shm").is_dir() {
            tempfile::tempdir_in("/dev/shm").unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let mut e = Etcd {
            port: free_port(),
            peer: free_port(),
            process: Process::default(),
            dir,
            tls,
        };
        e.launch();
        e
    }

    fn launch(&mut self) {
        // As `serve`: ports another test took between the check and the
        // start make etcd exit at once; a first start tries others.
        let first = !self.process.running() && !self.dir.path().join("data").exists();
        for _ in 0..5 {
            let scheme = if self.tls.is_some() { "https" } else { "http" };
            let client = format!("{scheme}://127.0.0.1:{}", self.port);
            let peer = format!("http://127.0.0.1:{}", self.peer);
            let mut cmd = Command::new(etcd_path());
            if let Some((cert, key)) = &self.tls {
                cmd.arg("--cert-file").arg(cert).arg("--key-file").arg(key);
            }
            cmd.arg("--data-dir")
                .arg(self.dir.path().join("data"))
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &format!("default={peer}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let mut child = cmd.spawn().expect("start etcd");
            let port = self.port;
            let mut exited = false;
            let up = wait_until(Duration::from_secs(20), || {
                exited = !matches!(child.try_wait(), Ok(None));
                exited
                    || if self.tls.is_some() {
                        etcd_listening(port)
                    } else {
                        etcd_healthy(port)
                    }
            });
            if up && !exited {
                self.process = Process::new(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            if first {
                let _ = std::fs::remove_dir_all(self.dir.path().join("data"));
                (self.port, self.peer) = (free_port(), free_port());
            }
        }
        panic!("etcd did not come up on port {}", self.port);
    }

    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    /// `etcdctl ARGS` against this etcd; its stdout, after checking it succeeded.
    #[track_caller]
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .args(["--endpoints", &format!("127.0.0.1:{}", self.port)])
            .args(["--command-timeout", "10s"])
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .expect("run etcdctl");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Every key stored.
    pub fn keys(&self) -> Vec<String> {
        self.ctl(&["get", "", "--prefix", "--keys-only"])
            .lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }

    /// Every lease alive, as etcdctl prints their ids (hex).
    pub fn leases(&self) -> Vec<String> {
        self.ctl(&["lease", "list"])
            .lines()
            .skip(1)
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// Stop the server as an operator does (SIGTERM, then wait for it to
    /// exit) and start it again on the same ports and data.
    pub fn restart_gracefully(&mut self) {
        self.process
            .stop(Some(libc::SIGTERM), Duration::from_secs(120));
        self.launch();
    }
}

/// Killed, its data stays (etcd is durable): it starts again on the same
/// ports and data.
impl Server for Etcd {
    fn process(&self) -> &Process {
        &self.process
    }

    fn process_mut(&mut self) -> &mut Process {
        &mut self.process
    }

    fn start_again(&mut self) {
        self.launch();
    }
}

impl Engine for Etcd {
    fn url(&self) -> String {
        Etcd::url(self)
    }
}

/// etcd answers its health check with a leader in place.
/// A TLS etcd, asked through etcdctl without checking its certificate.
fn etcd_listening(port: u16) -> bool {
    Command::new("etcdctl")
        .args(["--endpoints", &format!("https://127.0.0.1:{port}")])
        .args(["--insecure-skip-tls-verify", "--insecure-transport=false"])
        .args(["--dial-timeout", "1s"])
        .args(["endpoint", "health"])
        .env("ETCDCTL_API", "3")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn etcd_healthy(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(1000)));
    let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let mut reply = String::new();
    s.write_all(req.as_bytes()).is_ok()
        && s.read_to_string(&mut reply).is_ok()
        && reply.contains("\"health\":\"true\"")
}
