//! Shared test helpers: the servers a test starts of its own, each in a
//! file of its own and all of one shape (`server.rs`); a builder for
//! running the lockrun binary, scratch directories, and waiting on
//! processes (here); a pseudo-terminal (`pty.rs`) and a proxy that slows
//! replies (`proxy.rs`).

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod cluster;
mod etcd;
mod mysql;
mod postgres;
mod proxy;
mod pty;
mod redis_server;
mod sentinel;
mod server;
mod zookeeper;
// The benchmark shares these helpers and needs not all of them.
#[allow(unused_imports)]
pub use cluster::*;
#[allow(unused_imports)]
pub use etcd::*;
#[allow(unused_imports)]
pub use mysql::*;
#[allow(unused_imports)]
pub use postgres::*;
#[allow(unused_imports)]
pub use proxy::*;
#[allow(unused_imports)]
pub use pty::*;
#[allow(unused_imports)]
pub use redis_server::*;
#[allow(unused_imports)]
pub use sentinel::*;
#[allow(unused_imports)]
pub use server::*;
#[allow(unused_imports)]
pub use zookeeper::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_lockrun");

/// Tests that load the whole machine (thousands of processes, the torture
/// run) take turns: their timing margins are for one of them at a time.
pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// `status --json NAME` on the engine at `url`, parsed.
pub fn status_json(url: &str, name: &str) -> serde_json::Value {
    on(url).args(["status", "--json", name]).output().json()
}

/// Wait (bounded) until `status` shows `name` held and `n` requests
/// waiting for it: the order of waiters is set by this, not by sleeps.
#[track_caller]
pub fn wait_queued(url: &str, name: &str, n: u64) {
    let ok = wait_until(Duration::from_secs(20), || {
        let v = status_json(url, name);
        v["held"] == true && v["waiters"].as_u64().unwrap_or(0) >= n
    });
    assert!(ok, "{name} never showed as held with {n} waiting");
}

/// Poll `cond` every few milliseconds until it holds or `limit` passes.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .unwrap()
        .port()
}

pub fn signal(pid: i32, sig: i32) {
    assert!(pid > 1);
    // SAFETY: kill takes plain integers; no memory is passed.
    unsafe { libc::kill(pid, sig) };
}

/// Signal a whole process group.
pub fn signal_group(pgid: i32, sig: i32) {
    assert!(pgid > 1);
    // SAFETY: kill takes plain integers; no memory is passed.
    unsafe { libc::kill(-pgid, sig) };
}

/// The tests run as root (some switch users, write /proc/sys or make
/// namespaces).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A process that exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// The lockrun binary with a clean LOCKRUN_* environment.
pub fn lockrun() -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("LOCKRUN_") {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null());
    default_interrupts(&mut cmd);
    cmd
}

/// A shell runs background commands with SIGINT and SIGQUIT ignored, and
/// lockrun keeps ignored signals ignored for its job (as nohup wants): tests
/// started that way would see no Ctrl-C at all. Start from the defaults.
pub fn default_interrupts(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal(2) is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGQUIT, libc::SIG_DFL);
            Ok(())
        });
    }
}

/// Run to the end: a `Command`, or a `Lockrun` being built.
pub fn run(cmd: impl Runnable) -> Output {
    cmd.finish()
}

pub trait Runnable {
    fn finish(self) -> Output;
}

impl Runnable for &mut Command {
    fn finish(self) -> Output {
        self.output().expect("run lockrun")
    }
}

impl Runnable for Lockrun {
    fn finish(self) -> Output {
        self.output().out
    }
}

/// Where a test's locks live: a URL, or a Redis started by the test.
pub trait Engine {
    fn url(&self) -> String;
}

impl Engine for str {
    fn url(&self) -> String {
        self.to_string()
    }
}

impl Engine for String {
    fn url(&self) -> String {
        self.clone()
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A scratch directory with helpers for files the jobs write.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }
    pub fn exists(&self, name: &str) -> bool {
        Path::new(&self.path(name)).exists()
    }
    /// A file:// URL for a lock directory inside the scratch space.
    pub fn file_url(&self) -> String {
        let d = self.path("locks");
        std::fs::create_dir_all(&d).unwrap();
        format!("file://{}", d.display())
    }
    /// Wait for a file to hold a pid, and return it.
    pub fn pid_in(&self, name: &str) -> i32 {
        let mut pid = 0;
        assert!(
            wait_until(Duration::from_secs(20), || {
                pid = self.read(name).trim().parse().unwrap_or(0);
                pid > 0
            }),
            "no pid in {name}"
        );
        pid
    }
}

/// Start lockrun around a long job (`exec sleep 60`) whose pid lands in the
/// scratch file `pid`; `url` None means the default local backend.
pub fn hold(url: Option<&str>, name: &str, ttl: &str, scratch: &Scratch) -> Child {
    let mut c = lockrun();
    if let Some(u) = url {
        c.args(["--url", u]);
    }
    c.args(["--ttl", ttl, name, "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn()
        .unwrap()
}

/// Check a log of "start TOKEN" / "end TOKEN" lines written by jobs under one
/// lock: no two jobs overlapped, and tokens strictly increased.
pub fn assert_serial(log: &str, jobs: usize) {
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2 * jobs, "every job must have run once");
    let mut last = 0u64;
    for pair in lines.chunks(2) {
        let ta: u64 = pair[0]
            .strip_prefix("start ")
            .expect(pair[0])
            .parse()
            .unwrap();
        let tb: u64 = pair[1]
            .strip_prefix("end ")
            .expect(pair[1])
            .parse()
            .unwrap();
        assert_eq!(ta, tb, "two jobs overlapped: {pair:?}");
        assert!(
            ta > last,
            "tokens must strictly increase: {ta} after {last}"
        );
        last = ta;
    }
}

/// A child killed when the test ends, also when it fails (continued first,
/// in case it was stopped): a lockrun left behind would keep the harness's
/// output open and a lease alive.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            signal(self.0.id() as i32, libc::SIGCONT);
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Wait for `child` (at most `limit`): its exit code and what it printed
/// on its piped stderr.
pub fn exited(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let status = wait_child(&mut child, limit);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (status.code(), err)
}

/// Wait (bounded) for a spawned lockrun and return its exit status.
pub fn wait_child(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("lockrun did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The state letter of a process (R, S, T, Z, …), or None when it is gone.
pub fn state_of(pid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit(')').next()?.trim_start().chars().next()
}

/// One lockrun invocation, built up and then run with an assertion on how
/// it ended (as just's `Test`): `on(&url).args(["-n", "x", "true"]).code(75)`.
#[must_use]
pub struct Lockrun {
    cmd: Command,
}

/// lockrun on the engine at `url`.
pub fn on(engine: &(impl Engine + ?Sized)) -> Lockrun {
    let mut cmd = lockrun();
    cmd.args(["--url", &engine.url()]);
    Lockrun { cmd }
}

/// What a finished invocation printed.
pub struct Ran {
    pub out: Output,
}

impl Ran {
    pub fn stdout(&self) -> String {
        text(&self.out.stdout)
    }
    pub fn stderr(&self) -> String {
        text(&self.out.stderr)
    }
    /// stdout parsed as the one JSON object `status --json` prints.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.out.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout()))
    }
    /// stderr is one line containing every one of `parts`.
    #[track_caller]
    pub fn says(self, parts: &[&str]) -> Ran {
        let err = self.stderr();
        assert_eq!(err.lines().count(), 1, "expected one line on stderr: {err}");
        for p in parts {
            assert!(err.contains(p), "stderr lacks {p:?}: {err}");
        }
        self
    }
}

impl Lockrun {
    pub fn arg(mut self, a: impl AsRef<std::ffi::OsStr>) -> Lockrun {
        self.cmd.arg(a);
        self
    }
    pub fn args<I, S>(mut self, args: I) -> Lockrun
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.cmd.args(args);
        self
    }
    pub fn env(mut self, k: &str, v: impl AsRef<std::ffi::OsStr>) -> Lockrun {
        self.cmd.env(k, v);
        self
    }
    pub fn env_remove(mut self, k: &str) -> Lockrun {
        self.cmd.env_remove(k);
        self
    }
    pub fn stdout(mut self, cfg: impl Into<Stdio>) -> Lockrun {
        self.cmd.stdout(cfg);
        self
    }
    pub fn stderr(mut self, cfg: impl Into<Stdio>) -> Lockrun {
        self.cmd.stderr(cfg);
        self
    }
    pub fn stdin(mut self, cfg: impl Into<Stdio>) -> Lockrun {
        self.cmd.stdin(cfg);
        self
    }
    /// The command itself, for what the builder does not cover.
    pub fn command(&mut self) -> &mut Command {
        &mut self.cmd
    }
    pub fn spawn(mut self) -> Child {
        self.cmd.spawn().expect("start lockrun")
    }
    /// Run to the end, whatever the exit code.
    pub fn output(mut self) -> Ran {
        Ran {
            out: self.cmd.output().expect("run lockrun"),
        }
    }
    /// Run to the end and check the exit code, showing stderr if it differs.
    #[track_caller]
    pub fn code(self, expected: i32) -> Ran {
        let ran = self.output();
        assert_eq!(
            ran.out.status.code(),
            Some(expected),
            "exit code; stderr: {}",
            ran.stderr()
        );
        ran
    }
    #[track_caller]
    pub fn succeeds(self) -> Ran {
        self.code(0)
    }
}

/// A CA and a server certificate for 127.0.0.1, made with openssl.
pub fn make_certs(dir: &std::path::Path) {
    let sh = |cmd: &str| {
        let st = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|_| panic!("sh not found"));
        assert!(st.status.success(), "{cmd}: {}", text(&st.stderr));
    };
    if Command::new("openssl").arg("version").output().is_err() {
        panic!("openssl not found: the TLS tests need it (apt-get install -y openssl)");
    }
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=lockrun-test-ca",
    );
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 2 -subj /CN=other-ca",
    );
    sh("openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=localhost");
    sh("printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext");
    sh(
        "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt -days 2 -extfile ext",
    );
}

/// The shell block of README's section `heading` (a guide), less its
/// install line: the guide as a user would paste it.
pub fn readme_guide(heading: &str) -> String {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme
        .split(&format!("### {heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("README has no section {heading:?}"));
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the guide has a shell block");
    block
        .lines()
        .filter(|l| !l.starts_with("apt-get "))
        .collect::<Vec<_>>()
        .join("\n")
}
