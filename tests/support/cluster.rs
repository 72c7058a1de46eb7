//! A Redis Cluster of our own: three masters on 127.0.0.1 with the slots
//! split between them, started in a temporary directory, stopped by pid.

use std::process::Command;
use std::time::Duration;

use super::{Redis, wait_until};

pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let nodes: Vec<Redis> = (0..3)
            .map(|_| {
                Redis::start_with(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create (apt-get install -y redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = Cluster { nodes };
        let ok = wait_until(Duration::from_secs(30), || {
            c.nodes
                .iter()
                .all(|n| n.info_cluster().contains("cluster_state:ok"))
        });
        assert!(ok, "the cluster did not reach cluster_state:ok");
        c
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The node that serves `key`'s slot.
    pub fn node_of(&self, key: &str) -> &Redis {
        for n in &self.nodes {
            let mut conn = n.conn();
            let probe: redis::RedisResult<i64> = redis::cmd("EXISTS").arg(key).query(&mut conn);
            if probe.is_ok() {
                return n;
            }
        }
        panic!("no node serves {key}");
    }

    /// Every key on every node.
    pub fn keys(&self) -> Vec<String> {
        self.nodes.iter().flat_map(|n| n.keys()).collect()
    }
}

impl Redis {
    /// `CLUSTER INFO` as text (empty when it cannot be read).
    pub fn info_cluster(&self) -> String {
        let client = redis::Client::open(self.url()).unwrap();
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
            return String::new();
        };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
        redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut conn)
            .unwrap_or_default()
    }
}
