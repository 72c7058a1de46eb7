//! A redis-server of a test's own on a free loopback port, without
//! persistence, and how any server of ours is started on a port another
//! test may take first.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{Engine, Process, Server, alive, free_port, wait_until};

fn redis_server_path() -> &'static str {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!(
            "redis-server not found: these tests need a real Redis; \
             install it with `apt-get install -y redis-server`"
        );
    }
    "redis-server"
}

/// A redis-server of our own, without persistence, on 127.0.0.1.
pub struct Redis {
    pub port: u16,
    process: Process,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Redis {
        let mut r = Redis {
            port: free_port(),
            process: Process::default(),
            dir: tempfile::tempdir().unwrap(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        r.launch(false);
        r
    }

    /// On `self.port` when `fixed` (a restart: the tests reconnect to the
    /// same address), else on the first free port.
    fn launch(&mut self, fixed: bool) {
        let (dir, extra) = (self.dir.path().to_owned(), self.extra.clone());
        let (port, child) = serve(self.port, fixed, |port| {
            let mut cmd = Command::new(redis_server_path());
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .args(&extra);
            cmd
        });
        self.port = port;
        self.process = Process::new(child);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).unwrap();
        let c = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c
    }

    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn()).unwrap()
    }

    pub fn keys(&self) -> Vec<String> {
        self.cmd(&["KEYS", "*"])
    }

    /// The keys matching `pattern` that would never go away on their own
    /// (PTTL −1; every key but a name's token counter must expire: lockrun-engines(7)
    /// "REDIS"), read in one script, so at one instant between two of
    /// lockrun's. (Inside a script a key expiring this very millisecond has
    /// PTTL 0: it is going.)
    pub fn keys_without_expiry(&self, conn: &mut redis::Connection, pattern: &str) -> Vec<String> {
        redis::cmd("EVAL")
            .arg(
                "local out = {} \
                 for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
                   if redis.call('PTTL', k) == -1 and not string.find(k, ':fence$') then \
                     out[#out + 1] = k \
                   end \
                 end \
                 return out",
            )
            .arg(0)
            .arg(pattern)
            .query(conn)
            .unwrap()
    }
}

/// Killed, every key is gone (no persistence); started again, empty.
impl Server for Redis {
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

impl Engine for Redis {
    fn url(&self) -> String {
        Redis::url(self)
    }
}

/// Start a server that listens on `port` (made by `command`) and wait until
/// it answers. A port from `free_port` may be taken by another test's
/// server between the check and the start: the server then exits at once,
/// and unless the port is `fixed` (a restart) it is tried again on another.
/// It also keeps a server of another test that answers on that port from
/// passing for ours.
pub fn serve(mut port: u16, fixed: bool, command: impl Fn(u16) -> Command) -> (u16, Child) {
    for _ in 0..5 {
        let mut child = command(port)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (apt-get install -y redis-server)");
        let pid = child.id();
        let mut exited = false;
        let up = wait_until(Duration::from_secs(10), || {
            exited = !matches!(child.try_wait(), Ok(None));
            exited || served_by(port, pid)
        });
        if up && !exited {
            return (port, child);
        }
        let _ = child.kill();
        let _ = child.wait();
        if !fixed {
            port = free_port();
        }
    }
    panic!("redis-server did not come up on a loopback port (last tried {port})");
}

/// Whether the server answering on `port` is process `pid`, by its `INFO
/// server`. One that asks for a password first cannot say: it counts as
/// ours when it answers and `pid` still runs a moment later (a server that
/// lost the port exits at start).
fn served_by(port: u16, pid: u32) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"INFO server\r\n").is_err() {
        return false;
    }
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = s.read(&mut buf) {
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply);
        if text.starts_with('-') && text.contains("\r\n") {
            std::thread::sleep(Duration::from_millis(300));
            return alive(pid as i32);
        }
        if text.contains("\r\ntcp_port:") && text.contains("process_id:") {
            return text.contains(&format!("\r\nprocess_id:{pid}\r\n"));
        }
    }
    false
}
