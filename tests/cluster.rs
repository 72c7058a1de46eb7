//! Redis Cluster (lockrun-engines(7) "REDIS SENTINEL and REDIS CLUSTER"): a name's slot moved to
//! another node while it is held. The behaviour every engine shares runs in
//! the conformance suite.

use std::time::Duration;

use crate::support::*;

/// Move the slot of `key` from the node that serves it to another, keys
/// and all, as a reshard does.
fn move_slot(cluster: &Cluster, key: &str) -> u16 {
    let from = cluster.node_of(key);
    let to = cluster.nodes.iter().find(|n| n.port != from.port).unwrap();
    let slot: i64 = from.cmd(&["CLUSTER", "KEYSLOT", key]);
    let slot = slot.to_string();
    let id = |n: &Redis| -> String { n.cmd(&["CLUSTER", "MYID"]) };
    let (from_id, to_id) = (id(from), id(to));
    let _: () = to.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &from_id]);
    let _: () = from.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &to_id]);
    loop {
        let keys: Vec<String> = from.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
        if keys.is_empty() {
            break;
        }
        let mut m = redis::cmd("MIGRATE");
        m.arg("127.0.0.1")
            .arg(to.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys);
        let _: () = m.query(&mut from.conn()).unwrap();
    }
    for n in &cluster.nodes {
        let _: () = n.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
    }
    to.port
}

/// A holder keeps its lease when its name's slot moves to another node
/// (renewals follow MOVED, and the scripts load there on NOSCRIPT), a
/// waiter behind it is served after it, and tokens keep growing.
#[test]
fn a_name_keeps_its_lease_when_its_slot_moves() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let scratch = Scratch::new();
    let key = "lockrun:{moving}";
    let mut holder = Reap(
        on(&url)
            .args(["--ttl", "2s", "moving", "-c"])
            .arg(format!(
                "echo $LOCKRUN_TOKEN > {}; sleep 5",
                scratch.path("h").display()
            ))
            .spawn(),
    );
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("h")));
    let to = move_slot(&cluster, key);
    assert_eq!(cluster.node_of(key).port, to);
    let waiter = on(&url)
        .args([
            "--ttl",
            "2s",
            "-w",
            "30",
            "moving",
            "-c",
            "echo $LOCKRUN_TOKEN",
        ])
        .code(0);
    let st = wait_child(&mut holder.0, Duration::from_secs(30));
    assert_eq!(
        st.code(),
        Some(0),
        "the holder lost its lease when the slot moved"
    );
    let first: u64 = scratch.read("h").trim().parse().unwrap();
    let next: u64 = waiter.stdout().trim().parse().unwrap();
    assert!(next > first, "token {next} after {first}");
}
