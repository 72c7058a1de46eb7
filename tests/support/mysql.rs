//! A MariaDB server of our own: a data directory made by
//! `mariadb-install-db` (once per test run, copied for each server), run
//! on a loopback port and a socket in its own directory, stopped by pid.
//! One server is shared by every test of a test process (each test gets a
//! database of its own); fault tests start their own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{Engine, Process, Server, free_port, is_root, text, wait_until};

/// root's password over TCP in every test server (never shown by lockrun).
pub const MY_PASSWORD: &str = "my-s3cret-pw";

fn need(what: &str) -> ! {
    panic!(
        "{what} not found: these tests need a real MariaDB; install it with \
         `apt-get install -y mariadb-server mariadb-client`"
    )
}

fn program(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"] {
        let p = Path::new(dir).join(name);
        if p.exists() {
            return p;
        }
    }
    need(name)
}

/// MariaDB's programs are there (the benchmark measures MariaDB only then).
pub fn mariadb_installed() -> bool {
    ["mariadbd", "mariadb-install-db", "mariadb"]
        .iter()
        .all(|p| {
            ["/usr/sbin", "/usr/bin"]
                .iter()
                .any(|d| Path::new(d).join(p).exists())
        })
}

/// Memory (/dev/shm) when it has room, else the temporary directory.
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

/// Settings every test server runs with: small, and without the name
/// lookups that would make 127.0.0.1 a `localhost` user.
const SETTINGS: [&str; 7] = [
    "--innodb-log-file-size=8M",
    "--innodb-buffer-pool-size=24M",
    "--skip-log-bin",
    "--skip-name-resolve",
    "--innodb-flush-log-at-trx-commit=2",
    "--max-connections=300",
    "--performance-schema=OFF",
];

/// mariadbd refuses to run as root unless told to; as anyone else it
/// runs as who started it.
fn run_as() -> Vec<String> {
    if is_root() {
        vec!["--user=root".into()]
    } else {
        Vec::new()
    }
}

/// One data directory made by mariadb-install-db, kept between test runs:
/// each server starts from a copy. Made aside and renamed into place.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let install = program("mariadb-install-db");
        let version = Command::new(program("mariadbd"))
            .arg("--version")
            .output()
            .map(|o| text(&o.stdout))
            .unwrap_or_default()
            .split_whitespace()
            .find(|w| w.contains("MariaDB"))
            .unwrap_or("")
            .to_string();
        let who = rustix::process::geteuid().as_raw();
        let kept = fast_dir().join(format!("lockrun-test-mariadb{version}-u{who}-template-v1"));
        if kept.join("data/mysql").exists() {
            return kept;
        }
        let dir = tempfile::tempdir_in(fast_dir()).unwrap();
        let data = dir.path().join("data");
        let out = Command::new(install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .args(run_as())
            .arg("--innodb-log-file-size=8M")
            .output()
            .unwrap_or_else(|_| need("mariadb-install-db"));
        assert!(
            out.status.success(),
            "mariadb-install-db: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let made = dir.keep();
        if std::fs::rename(&made, &kept).is_err() {
            let _ = std::fs::remove_dir_all(&made);
        }
        kept
    })
}

/// A MariaDB server on 127.0.0.1 (and a socket in its own directory).
pub struct Mariadb {
    pub port: u16,
    process: Process,
    dir: PathBuf,
    /// Removed on drop (a shared server's directory goes with the next run).
    owned: bool,
    extra: Vec<String>,
}

impl Mariadb {
    /// A server of its own (fault tests).
    pub fn start() -> Mariadb {
        Mariadb::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Mariadb {
        let dir = tempfile::tempdir_in(fast_dir()).unwrap().keep();
        Mariadb::start_in(dir, true, extra)
    }

    fn start_in(dir: PathBuf, owned: bool, extra: &[&str]) -> Mariadb {
        let copied = Command::new("cp")
            .arg("-a")
            .arg(template().join("data"))
            .arg(dir.join("data"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(copied, "copy the template data directory");
        let mut m = Mariadb {
            port: free_port(),
            process: Process::default(),
            dir,
            owned,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        m.launch(false);
        m.sql(&format!(
            "ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY '{MY_PASSWORD}'; \
             CREATE DATABASE IF NOT EXISTS app"
        ));
        m
    }

    /// The server every test of this process shares: started once, killed
    /// when the process ends (its parent thread lives as long), its
    /// directory removed by the next run.
    pub fn shared() -> &'static Mariadb {
        static SHARED: OnceLock<Mariadb> = OnceLock::new();
        SHARED.get_or_init(|| {
            let base = fast_dir();
            let me = std::process::id();
            // Directories of earlier runs whose process is gone.
            for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if let Some(pid) = n.strip_prefix("lockrun-test-mariadb-shared-")
                    && let Ok(pid) = pid.parse::<i32>()
                    && !super::alive(pid)
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
            let dir = base.join(format!("lockrun-test-mariadb-shared-{me}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            // The server's parent is a thread that never ends: the server
            // dies with the test process (PR_SET_PDEATHSIG), not with the
            // test that happened to start it.
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = tx.send(Mariadb::start_in(dir, false, &[]));
                loop {
                    std::thread::park();
                }
            });
            rx.recv().expect("the shared MariaDB started")
        })
    }

    fn launch(&mut self, fixed: bool) {
        // A temporary directory of the server's own: servers that share one
        // (/tmp by default) have had the on-disk temporary tables of a
        // running query go from under it ("Error on delete of
        // '/tmp/#sql-temptable-…' (Errcode: 2)") while other tests' servers
        // came and went.
        let tmp = self.dir.join("tmp");
        let _ = std::fs::create_dir_all(&tmp);
        for _ in 0..5 {
            let mut cmd = Command::new(program("mariadbd"));
            cmd.arg("--no-defaults")
                .arg(format!("--datadir={}", self.dir.join("data").display()))
                .arg(format!("--tmpdir={}", tmp.display()))
                .arg(format!("--port={}", self.port))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--socket={}", self.socket().display()))
                .arg(format!("--pid-file={}", self.dir.join("pid").display()))
                .arg(format!(
                    "--log-error={}",
                    self.dir.join("err.log").display()
                ))
                .args(SETTINGS)
                .args(run_as())
                .args(&self.extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            // The shared server dies with the thread that started it, which
            // lives as long as the test process; a server of one test's own
            // is stopped by its drop (and restarted from any thread).
            if !self.owned {
                // SAFETY: prctl takes plain integers and is async-signal-safe,
                // as a pre_exec hook must be.
                unsafe {
                    use std::os::unix::process::CommandExt;
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
            }
            let mut child = cmd.spawn().unwrap_or_else(|_| need("mariadbd"));
            let mut exited = false;
            let up = wait_until(Duration::from_secs(60), || {
                exited = !matches!(child.try_wait(), Ok(None));
                exited || self.answers()
            });
            if up && !exited {
                self.process = Process::new(child);
                return;
            }
            let _ = child.kill();
            let _ = child.wait();
            if !fixed {
                self.port = free_port();
            }
        }
        let log = std::fs::read_to_string(self.dir.join("err.log")).unwrap_or_default();
        panic!("mariadbd did not come up on port {}: {log}", self.port);
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("sock")
    }

    fn answers(&self) -> bool {
        self.try_sql("SELECT 1").is_some_and(|o| o.trim() == "1")
    }

    /// lockrun's URL for root, password included, in database `db`.
    pub fn url_in(&self, db: &str) -> String {
        format!("mysql://root:{MY_PASSWORD}@127.0.0.1:{}/{db}", self.port)
    }

    /// lockrun's URL for root in the database `app`.
    pub fn url(&self) -> String {
        self.url_in("app")
    }

    /// A URL for `user` with `password` in `db`.
    pub fn url_as(&self, user: &str, password: &str, db: &str) -> String {
        format!("mysql://{user}:{password}@127.0.0.1:{}/{db}", self.port)
    }

    /// A database of its own for one test: its name.
    pub fn database(&self) -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let db = format!(
            "t{}_{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        self.sql(&format!("CREATE DATABASE {db}"));
        db
    }

    /// Run `sql` as root over the socket; its output, or None if it failed.
    /// A session of `user` over TCP that runs `sql` (say, a long sleep
    /// that keeps a connection slot taken), started, not waited for.
    pub fn session_as(&self, user: &str, password: &str, sql: &str) -> Child {
        Command::new(program("mariadb"))
            .arg("--no-defaults")
            .args([
                "-h",
                "127.0.0.1",
                "-P",
                &self.port.to_string(),
                "--skip-ssl",
            ])
            .arg(format!("-u{user}"))
            .arg(format!("-p{password}"))
            .args(["-e", sql])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mariadb")
    }

    pub fn try_sql(&self, sql: &str) -> Option<String> {
        let out = Command::new(program("mariadb"))
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.socket().display()))
            // Plain, so that the server's TLS counters count lockrun alone.
            .args(["--skip-ssl", "-uroot", "-N", "-B", "-e", sql])
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status.success().then(|| text(&out.stdout))
    }

    /// The server's global status variable `name` (a counter).
    #[track_caller]
    pub fn global_status(&self, name: &str) -> u64 {
        let out = self.sql(&format!("SHOW GLOBAL STATUS LIKE '{name}'"));
        let value = out.split_whitespace().nth(1);
        value
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no counter {name}: {out:?}"))
    }

    /// Run `sql` as root over the socket; its output (tab-separated, no
    /// column names), after checking it succeeded.
    #[track_caller]
    pub fn sql(&self, sql: &str) -> String {
        match self.try_sql(sql) {
            Some(out) => out,
            None => {
                let out = Command::new(program("mariadb"))
                    .arg("--no-defaults")
                    .arg(format!("--socket={}", self.socket().display()))
                    .args(["-uroot", "-e", sql])
                    .output()
                    .expect("run mariadb");
                panic!("mariadb {sql:?}: {}", text(&out.stderr))
            }
        }
    }

    /// Every row of lockrun's lease and waiter tables in `db` (0 when
    /// they do not exist).
    pub fn rows(&self, db: &str) -> usize {
        if !self.has_tables(db) {
            return 0;
        }
        self.sql(&format!(
            "SELECT (SELECT COUNT(*) FROM {db}.lockrun_leases) \
               + (SELECT COUNT(*) FROM {db}.lockrun_waiters)"
        ))
        .trim()
        .parse()
        .unwrap_or(0)
    }

    /// `db` holds any table.
    pub fn has_tables(&self, db: &str) -> bool {
        self.sql(&format!(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{db}'"
        ))
        .trim()
            != "0"
    }

    /// `KILL CONNECTION id`; false when it was gone already.
    pub fn try_kill(&self, id: &str) -> bool {
        self.try_sql(&format!("KILL CONNECTION {id}")).is_some()
    }

    /// Shut down cleanly (nothing left to recover, as `--innodb-read-only`
    /// needs) and start again on the same port and data with these settings.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.sql("SET GLOBAL innodb_fast_shutdown = 0; SHUTDOWN");
        self.process.stop(None, Duration::from_secs(60));
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.launch(true);
    }
}

/// Killed as a crash would kill it; started again on the same port and
/// data.
impl Server for Mariadb {
    fn process(&self) -> &Process {
        &self.process
    }

    fn process_mut(&mut self) -> &mut Process {
        &mut self.process
    }

    fn start_again(&mut self) {
        self.launch(true);
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        self.kill();
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Engine for Mariadb {
    fn url(&self) -> String {
        Mariadb::url(self)
    }
}

/// A database of its own on the shared server, as an engine for `on()`.
pub struct MyDb {
    pub server: &'static Mariadb,
    pub db: String,
}

impl MyDb {
    pub fn new() -> MyDb {
        let server = Mariadb::shared();
        MyDb {
            server,
            db: server.database(),
        }
    }

    pub fn sql(&self, sql: &str) -> String {
        self.server.sql(sql)
    }

    pub fn rows(&self) -> usize {
        self.server.rows(&self.db)
    }
}

impl MyDb {
    /// lockrun's URL for root in this database.
    pub fn url(&self) -> String {
        self.server.url_in(&self.db)
    }
}

impl Engine for MyDb {
    fn url(&self) -> String {
        self.server.url_in(&self.db)
    }
}
