//! A PostgreSQL server of our own: a cluster made by `initdb` (once per
//! test run, copied for each server) in memory where there can be, run as
//! the unprivileged `postgres` user (PostgreSQL refuses root), listening on
//! a loopback port with password authentication, stopped by pid on drop.
//! And PgBouncer in transaction pooling mode in front of one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::{Engine, Process, Server, free_port, signal, text, wait_until};

/// The superuser's password in every test cluster (never shown by lockrun).
pub const PG_PASSWORD: &str = "pg-s3cret-pw";

/// The user the servers run as.
const RUN_AS: &str = "postgres";

fn need(what: &str) -> ! {
    panic!(
        "{what} not found: these tests need a real PostgreSQL and PgBouncer; \
         install them with `apt-get install -y postgresql pgbouncer` (the tests \
         run the server as the `postgres` user the package creates)"
    )
}

/// PostgreSQL's server programs: on PATH, else Debian's versioned directory.
fn bin(tool: &str) -> PathBuf {
    if let Ok(out) = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        && out.status.success()
    {
        return PathBuf::from(text(&out.stdout).trim());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin").join(tool))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop().unwrap_or_else(|| need(tool))
}

/// PostgreSQL's server programs and the user to run them are there (the
/// benchmark measures PostgreSQL only then).
pub fn postgres_installed() -> bool {
    let programs = ["initdb", "postgres"].iter().all(|t| {
        std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().join("bin").join(t).exists())
    });
    programs
        && Command::new("id")
            .args(["-u", RUN_AS])
            .output()
            .is_ok_and(|o| o.status.success())
}

/// A command run as the `postgres` user (its own uid, gid and groups).
fn as_postgres(program: &Path) -> Command {
    let id = Command::new("id").args(["-u", RUN_AS]).output();
    if !id.is_ok_and(|o| o.status.success()) {
        need("the postgres user");
    }
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", RUN_AS, "--regid", RUN_AS, "--init-groups", "--"])
        .arg(program);
    cmd
}

fn chown(path: &Path) {
    let ok = Command::new("chown")
        .args(["-R", &format!("{RUN_AS}:{RUN_AS}")])
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "chown {} to {RUN_AS}", path.display());
}

/// Memory (/dev/shm) when it has room for a few clusters of about 40 MB
/// each (a container's is often 64 MB), else the temporary directory.
fn fast_dir() -> PathBuf {
    let avail_kib = Command::new("df")
        .args(["-k", "--output=avail", "/dev/shm"])
        .output()
        .ok()
        .and_then(|o| text(&o.stdout).lines().nth(1)?.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if avail_kib > 1 << 20 {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

fn scratch_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(fast_dir()).unwrap();
    chown(dir.path());
    dir
}

/// One cluster made by initdb, kept between test runs (initdb takes
/// seconds, a copy milliseconds): each server starts from a copy. Made
/// aside and renamed into place, so test processes running at once agree
/// on one; named for the initdb that made it and for its settings.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let initdb = bin("initdb");
        // `initdb (PostgreSQL) 15.18 (Debian …)`: the third word.
        let version = Command::new(&initdb)
            .arg("--version")
            .output()
            .map(|o| text(&o.stdout))
            .unwrap_or_default()
            .split_whitespace()
            .nth(2)
            .unwrap_or("")
            .to_string();
        let home = fast_dir();
        let kept = home.join(format!("lockrun-test-pg{version}-template-v1"));
        if kept.join("data/PG_VERSION").exists() {
            return kept;
        }
        let dir = scratch_dir();
        let data = dir.path().join("data");
        let pw = dir.path().join("pw");
        std::fs::write(&pw, PG_PASSWORD).unwrap();
        chown(dir.path());
        let out = as_postgres(&initdb)
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ])
            .args(["--auth-local=trust", "--auth-host=scram-sha-256"])
            .arg(format!("--pwfile={}", pw.display()))
            .output()
            .unwrap_or_else(|_| need("initdb"));
        assert!(out.status.success(), "initdb: {}", text(&out.stderr));
        let made = dir.keep();
        // Another test process may have put its own there first: then ours goes.
        if std::fs::rename(&made, &kept).is_err() {
            let _ = std::fs::remove_dir_all(&made);
        }
        kept
    })
}

/// A PostgreSQL server on 127.0.0.1 (and a socket in its own directory).
pub struct Postgres {
    pub port: u16,
    process: Process,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl Postgres {
    pub fn start() -> Postgres {
        Postgres::start_with(&[])
    }

    /// With more server settings (`-c name=value` pairs).
    pub fn start_with(extra: &[&str]) -> Postgres {
        let dir = scratch_dir();
        let copied = Command::new("cp")
            .arg("-a")
            .arg(template().join("data"))
            .arg(dir.path().join("data"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(copied, "copy the template cluster");
        let mut p = Postgres {
            port: free_port(),
            process: Process::default(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        p.launch(false);
        p
    }

    fn launch(&mut self, fixed: bool) {
        for _ in 0..5 {
            let mut child = as_postgres(&bin("postgres"))
                .arg("-D")
                .arg(self.dir.path().join("data"))
                .args(["-p", &self.port.to_string()])
                .arg("-k")
                .arg(self.dir.path())
                .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
                .args(["-c", "max_connections=200", "-c", "shared_buffers=16MB"])
                // No fsync (the machine does not crash under a test), but every
                // commit is written before it is acknowledged: a killed server
                // keeps what it said it had.
                .args(["-c", "full_page_writes=off"])
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|_| need("postgres"));
            let mut exited = false;
            let up = wait_until(Duration::from_secs(30), || {
                exited = !matches!(child.try_wait(), Ok(None));
                exited || self.answers()
            });
            if up && !exited {
                self.process = Process::new(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            // A port another test took between the check and the start
            // makes the server exit at once; a first start tries another.
            if !fixed {
                self.port = free_port();
            }
        }
        panic!("postgres did not come up on port {}", self.port);
    }

    /// Our server answers on its own socket (no other test's can).
    fn answers(&self) -> bool {
        self.try_sql("SELECT 1").is_some_and(|o| o.trim() == "1")
    }

    /// A directory the server may read (its own), for files it needs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// lockrun's URL for the superuser, password included.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres:{PG_PASSWORD}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// lockrun's schema and tables as versions before `--min-hold` and the
    /// concurrency groups made them (the columns every version has since).
    pub fn create_earlier_tables(&self) {
        self.sql(
            "CREATE SCHEMA lockrun; \
             CREATE SEQUENCE lockrun.lockrun_tokens AS bigint CACHE 1; \
             CREATE TABLE lockrun.lockrun_leases ( \
               name text NOT NULL, slot integer NOT NULL, owner text NOT NULL, \
               label text NOT NULL, token bigint NOT NULL, mode text NOT NULL, \
               lim integer NOT NULL, expires_at timestamptz NOT NULL, \
               granted_at timestamptz NOT NULL, revoked boolean NOT NULL DEFAULT false, \
               PRIMARY KEY (name, slot)); \
             CREATE TABLE lockrun.lockrun_waiters ( \
               name text NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY, \
               owner text NOT NULL, label text NOT NULL, mode text NOT NULL, \
               lim integer NOT NULL, expires_at timestamptz NOT NULL, \
               PRIMARY KEY (name, seq))",
        );
    }

    /// A URL for `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// A session of `user` over TCP that runs `sql` (say, a long sleep
    /// that keeps a connection slot taken), started, not waited for.
    pub fn session_as(&self, user: &str, password: &str, sql: &str) -> Child {
        Command::new(bin("psql"))
            .arg(self.url_as(user, password))
            .args(["-X", "-q", "-c", sql])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run psql")
    }

    pub fn try_sql(&self, sql: &str) -> Option<String> {
        let out = Command::new(bin("psql"))
            .arg("-h")
            .arg(self.dir.path())
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status.success().then(|| text(&out.stdout))
    }

    /// Run `sql` as the superuser over the socket; its output (unaligned,
    /// tuples only), after checking it succeeded.
    #[track_caller]
    pub fn sql(&self, sql: &str) -> String {
        match self.try_sql(sql) {
            Some(out) => out,
            None => {
                let out = Command::new(bin("psql"))
                    .arg("-h")
                    .arg(self.dir.path())
                    .args(["-p", &self.port.to_string(), "-U", "postgres"])
                    .args(["-X", "-c", sql])
                    .output()
                    .expect("run psql");
                panic!("psql {sql:?}: {}", text(&out.stderr))
            }
        }
    }

    /// Every row of lockrun's tables in the default schema (empty when
    /// they do not exist).
    pub fn rows(&self) -> usize {
        let there = self.sql("SELECT to_regclass('lockrun.lockrun_waiters') IS NOT NULL");
        if there.trim() != "t" {
            return 0;
        }
        let n = self.sql(
            "SELECT (SELECT count(*) FROM lockrun.lockrun_leases) \
               + (SELECT count(*) FROM lockrun.lockrun_waiters)",
        );
        n.trim().parse().unwrap_or(0)
    }

    /// lockrun's schema exists.
    pub fn has_schema(&self) -> bool {
        self.sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'lockrun'")
            .trim()
            == "1"
    }

    /// The server and every backend of it: each open connection stalls
    /// (stopping the postmaster alone only stalls new ones).
    pub fn processes(&self) -> Vec<i32> {
        let root = self.pid();
        let mut pids = vec![root];
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(root) {
                pids.push(pid);
            }
        }
        pids
    }

    pub fn pause_all(&self) {
        for pid in self.processes() {
            signal(pid, libc::SIGSTOP);
        }
    }

    pub fn resume_all(&self) {
        for pid in self.processes() {
            signal(pid, libc::SIGCONT);
        }
    }
}

/// Killed as a crash would kill it, but with an immediate shutdown (no
/// checkpoint; it recovers from its WAL on the next start): a killed
/// postmaster would leave its backends behind. Started again on the same
/// port and data.
impl Server for Postgres {
    fn process(&self) -> &Process {
        &self.process
    }

    fn process_mut(&mut self) -> &mut Process {
        &mut self.process
    }

    fn kill(&mut self) {
        if self.process.running() {
            self.resume_all();
        }
        self.process
            .stop(Some(libc::SIGQUIT), Duration::from_secs(10));
    }

    fn start_again(&mut self) {
        self.launch(true);
    }

    /// Every process: a backend goes on answering its connection while
    /// the postmaster alone is stopped.
    fn pause(&self) {
        self.pause_all();
    }

    fn resume(&self) {
        self.resume_all();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Engine for Postgres {
    fn url(&self) -> String {
        Postgres::url(self)
    }
}

/// PgBouncer in transaction pooling mode before a server: each transaction
/// may run on another server connection, so no session state survives.
pub struct Bouncer {
    pub port: u16,
    process: Process,
    dir: tempfile::TempDir,
}

impl Bouncer {
    pub fn start(pg: &Postgres) -> Bouncer {
        Bouncer::start_with(pg, 200)
    }

    /// With `max_client_conn` clients at most.
    pub fn start_with(pg: &Postgres, max_client_conn: u32) -> Bouncer {
        let mut dir = scratch_dir();
        for _ in 0..5 {
            let port = free_port();
            std::fs::write(
                dir.path().join("pgbouncer.ini"),
                format!(
                    "[databases]\n\
                     postgres = host=127.0.0.1 port={pg_port} dbname=postgres user=postgres password={PG_PASSWORD}\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = any\n\
                     pool_mode = transaction\n\
                     default_pool_size = 3\n\
                     max_client_conn = {max_client_conn}\n\
                     ignore_startup_parameters = extra_float_digits\n",
                    pg_port = pg.port
                ),
            )
            .unwrap();
            chown(dir.path());
            let mut b = Bouncer {
                port,
                process: Process::default(),
                dir,
            };
            if b.launch() {
                return b;
            }
            dir = b.dir;
        }
        panic!("pgbouncer did not come up on a loopback port");
    }

    /// Start on the port its configuration names; false when it exited
    /// (the port was taken) or did not answer in time.
    fn launch(&mut self) -> bool {
        let program = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| need("pgbouncer"));
        let mut child = as_postgres(&program)
            .arg(self.dir.path().join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|_| need("pgbouncer"));
        let mut exited = false;
        let port = self.port;
        let up = wait_until(Duration::from_secs(20), || {
            exited = !matches!(child.try_wait(), Ok(None));
            exited || bouncer_answers(port)
        });
        self.process = Process::new(child);
        if up && !exited {
            return true;
        }
        self.process.kill();
        false
    }

    /// lockrun's URL through the pooler (the pooler logs in with the password).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

/// Started again on the same port.
impl Server for Bouncer {
    fn process(&self) -> &Process {
        &self.process
    }

    fn process_mut(&mut self) -> &mut Process {
        &mut self.process
    }

    fn start_again(&mut self) {
        assert!(self.launch(), "pgbouncer did not come back");
    }
}

fn bouncer_answers(port: u16) -> bool {
    Command::new(bin("psql"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
        .args(["-d", "postgres", "-X", "-A", "-t", "-c", "SELECT 1"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Engine for Bouncer {
    fn url(&self) -> String {
        Bouncer::url(self)
    }
}
