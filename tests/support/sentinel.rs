//! A master, a replica and three sentinels of our own on 127.0.0.1, for the
//! Sentinel tests: started with config files in a temporary directory,
//! stopped by pid (`Process`).

use std::process::{Child, Command};
use std::time::Duration;

use super::{Process, Redis, Server, free_port, serve, wait_until};

/// The name the sentinels know the master by.
pub const MASTER: &str = "lockrun-master";

pub struct Sentinels {
    pub nodes: Vec<Redis>,
    sentinels: Vec<(u16, Process)>,
    _dir: tempfile::TempDir,
}

impl Sentinels {
    /// A master and one replica, watched by three sentinels (quorum 2) that
    /// call a master down after 1 s.
    pub fn start() -> Sentinels {
        let master = Redis::start();
        let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
        let dir = tempfile::tempdir().unwrap();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let (port, child) = sentinel_process(dir.path(), i, master.port, 2);
            sentinels.push((port, Process::new(child)));
        }
        let s = Sentinels {
            nodes: vec![master, replica],
            sentinels,
            _dir: dir,
        };
        // Ready when every sentinel names the master and knows the other
        // two (which a failover needs) and the replica is in sync.
        let ready = wait_until(Duration::from_secs(60), || {
            s.sentinels.iter().all(|(p, _)| {
                let others: Result<Vec<redis::Value>, _> =
                    sentinel_cmd(*p, &["SENTINEL", "sentinels", MASTER]);
                others.is_ok_and(|o| o.len() == 2)
            }) && s.nodes[1]
                .info("replication")
                .contains("master_link_status:up")
        });
        if !ready {
            let seen: Vec<String> = s
                .sentinels
                .iter()
                .map(|(p, c)| {
                    let others: redis::RedisResult<Vec<redis::Value>> =
                        sentinel_cmd(*p, &["SENTINEL", "sentinels", MASTER]);
                    match others {
                        Ok(o) => format!("{p} (pid {}) knows {} others", c.pid(), o.len()),
                        Err(e) => format!("{p} (pid {}): {e}", c.pid()),
                    }
                })
                .collect();
            panic!(
                "the sentinels did not come up and find each other within 60 s: {}; replica: {}",
                seen.join(", "),
                s.nodes[1]
                    .info("replication")
                    .lines()
                    .find(|l| l.starts_with("master_link_status"))
                    .unwrap_or("no answer"),
            );
        }
        s
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// Stop sentinel `i` (SIGSTOP): it accepts connections and never
    /// answers, as a host gone silent does.
    pub fn pause_sentinel(&self, i: usize) {
        self.sentinels[i].1.pause();
    }

    pub fn resume_sentinel(&self, i: usize) {
        self.sentinels[i].1.resume();
    }

    /// The sentinels' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|(p, _)| *p).collect()
    }

    /// The port of the node the first sentinel that answers names master.
    pub fn master_port(&self) -> u16 {
        for (p, _) in &self.sentinels {
            if let Ok((_, port)) =
                sentinel_cmd::<(String, u16)>(*p, &["SENTINEL", "get-master-addr-by-name", MASTER])
            {
                return port;
            }
        }
        panic!("no sentinel names a master");
    }

    /// The node that is master now.
    pub fn master(&self) -> &Redis {
        let port = self.master_port();
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("the master is one of ours")
    }

    /// The node that is not the master now.
    pub fn replica(&self) -> &Redis {
        let port = self.master_port();
        self.nodes.iter().find(|n| n.port != port).unwrap()
    }

    /// Make the replica master (`SENTINEL FAILOVER`) and wait until the
    /// sentinels name it and it says it is one.
    pub fn failover(&self) {
        assert!(
            self.try_failover(),
            "SENTINEL FAILOVER did not make a new master"
        );
    }

    /// `SENTINEL FAILOVER`; false if the sentinels refused it (no replica
    /// they would promote, one under way) or no new master came.
    pub fn try_failover(&self) -> bool {
        let before = self.master_port();
        let asked: redis::RedisResult<String> =
            sentinel_cmd(self.sentinels[0].0, &["SENTINEL", "failover", MASTER]);
        asked.is_ok() && self.new_master(before).is_some()
    }

    /// Wait until the sentinels name a master other than `before`, and it
    /// says it is one.
    pub fn wait_new_master(&self, before: u16) -> u16 {
        self.new_master(before).expect("no new master within 60 s")
    }

    /// The new master, once the sentinels name one other than `before` and
    /// it says it is one; None if that takes more than 60 s.
    pub fn new_master(&self, before: u16) -> Option<u16> {
        let mut now = before;
        let moved = wait_until(Duration::from_secs(60), || {
            now = self.master_port();
            now != before
                && self
                    .nodes
                    .iter()
                    .find(|n| n.port == now)
                    .is_some_and(|n| n.info("replication").contains("role:master"))
        });
        moved.then_some(now)
    }

    /// Whether, within 60 s, a majority of the sentinels name `master`: from
    /// then on a client that asks them (as lockrun does) goes there.
    pub fn named_by_majority(&self, master: u16) -> bool {
        wait_until(Duration::from_secs(60), || {
            let naming = self.sentinels.iter().filter(|(p, _)| {
                sentinel_cmd::<(String, u16)>(*p, &["SENTINEL", "get-master-addr-by-name", MASTER])
                    .is_ok_and(|(_, port)| port == master)
            });
            naming.count() * 2 > self.sentinels.len()
        })
    }

    /// Wait until every node but the master is its replica again, in sync.
    pub fn wait_synced(&self) {
        assert!(
            self.synced(),
            "the replica did not sync with the new master"
        );
    }

    /// Whether every node but the master is its replica, in sync, within 60 s.
    pub fn synced(&self) -> bool {
        let master = self.master_port();
        wait_until(Duration::from_secs(60), || {
            self.nodes.iter().filter(|n| n.port != master).all(|n| {
                let info = n.info("replication");
                info.contains("master_link_status:up")
                    && info.contains(&format!("master_port:{master}"))
            })
        })
    }

    /// Start node `i` again after it was killed, empty, and make it a
    /// replica of the master, as an operator would (the sentinels would, in
    /// their time).
    pub fn rejoin(&mut self, i: usize, master: u16) -> bool {
        self.nodes[i].restart();
        // The master it must follow, as the caller learned it: a sentinel
        // asked now may not know of the failover yet.
        let master = master.to_string();
        let _: redis::RedisResult<()> = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(&master)
            .query(&mut self.nodes[i].conn());
        self.synced()
    }
}

/// A sentinel on a free port watching the master on `master_port` under
/// the name MASTER, its config file in `dir`.
fn sentinel_process(
    dir: &std::path::Path,
    i: usize,
    master_port: u16,
    quorum: u32,
) -> (u16, Child) {
    serve(free_port(), false, |port| {
        let conf = dir.join(format!("sentinel{i}-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {MASTER} 1000\n\
                 sentinel failover-timeout {MASTER} 5000\n\
                 sentinel parallel-syncs {MASTER} 1\n",
                dir.display(),
            ),
        )
        .unwrap();
        let mut cmd = Command::new("redis-server");
        cmd.arg(&conf).arg("--sentinel");
        cmd
    })
}

/// A sentinel of its own that names another server master under the same
/// name: a sentinel cut off from the others, still naming the old master.
pub struct StraySentinel {
    pub server: Redis,
    pub port: u16,
    _process: Process,
    _dir: tempfile::TempDir,
}

impl StraySentinel {
    pub fn start() -> StraySentinel {
        let server = Redis::start();
        let dir = tempfile::tempdir().unwrap();
        let (port, child) = sentinel_process(dir.path(), 9, server.port, 1);
        let named = wait_until(Duration::from_secs(30), || {
            sentinel_cmd::<(String, u16)>(port, &["SENTINEL", "get-master-addr-by-name", MASTER])
                .is_ok_and(|(_, p)| p == server.port)
        });
        assert!(named, "the stray sentinel did not come up");
        StraySentinel {
            server,
            port,
            _process: Process::new(child),
            _dir: dir,
        }
    }
}

/// One command to the sentinel on `port`.
pub fn sentinel_cmd<T: redis::FromRedisValue>(port: u16, args: &[&str]) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(&mut conn)
}

impl Redis {
    /// `INFO section` as text.
    pub fn info(&self, section: &str) -> String {
        let client = redis::Client::open(self.url()).unwrap();
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
            return String::new();
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        redis::cmd("INFO")
            .arg(section)
            .query(&mut conn)
            .unwrap_or_default()
    }
}
