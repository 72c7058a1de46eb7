//! The concurrency groups on etcd, beyond the conformance suite: where a
//! preempt mark lives, how a replaced waiter leaves, and a preempted
//! `--min-hold` window.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::etcd::holder;
use crate::support::*;

/// A holder as a lockrun that knows no marks wrote it: `--preempt` marks
/// it beside its key, on its own lease (status shows it; the mark cannot
/// outlive that lease), and the preempting request waits as usual.
#[test]
fn a_preempt_mark_lives_on_the_holder_s_lease_and_ends_with_it() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let granted = etcd.ctl(&["lease", "grant", "60"]);
    let lease = granted.split_whitespace().nth(1).unwrap().to_string();
    let id = i64::from_str_radix(&lease, 16).unwrap();
    let key = format!("lockrun:old/q/{id:016x}");
    etcd.ctl(&[
        "put",
        "--lease",
        &lease,
        &key,
        r#"{"owner":"secret","label":"h:1 (old)","mode":"x","limit":1,"slot":null,"granted_ms":1,"revoked":false,"min_hold":false,"token":null}"#,
    ]);
    on(&url)
        .args(["--preempt", "--label", "new", "-w", "2s", "old", "true"])
        .code(75);
    let st = status_json(&url, "old");
    assert!(
        st["preempted_by"]
            .as_str()
            .is_some_and(|b| b.contains("new")),
        "{st}"
    );
    let mark = format!("{key}/preempted");
    let v: serde_json::Value =
        serde_json::from_str(&etcd.ctl(&["get", &mark, "-w", "json"])).unwrap();
    assert_eq!(v["kvs"][0]["lease"].as_i64(), Some(id), "{v}");
    // The mark is no name of its own in the list.
    let listed = on(&url).args(["status"]).code(0);
    assert!(!listed.stderr().contains("left out"), "{}", listed.stderr());
    etcd.ctl(&["lease", "revoke", &lease]);
    assert!(etcd.keys().is_empty(), "{:?}", etcd.keys());
}

/// A `--supersede` waiter on a long lease (its waiter lease is renewed
/// every few seconds) gives up within about a second of being replaced, not
/// at its next renewal, and the mark naming its replacement goes with it.
#[test]
fn a_replaced_waiter_gives_up_at_once_and_its_mark_goes_with_it() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "sp", "30s");
    let mut first = on(&url)
        .args([
            "--ttl",
            "30s",
            "--supersede",
            "--label",
            "one",
            "sp",
            "true",
        ])
        .stderr(Stdio::piped())
        .spawn();
    wait_queued(&url, "sp", 1);
    let started = Instant::now();
    let mut second = on(&url)
        .args([
            "--ttl",
            "30s",
            "--supersede",
            "--label",
            "two",
            "sp",
            "true",
        ])
        .spawn();
    assert_eq!(
        wait_child(&mut first, Duration::from_secs(20)).code(),
        Some(75)
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "replaced after {took:?}");
    let mut err = String::new();
    use std::io::Read;
    first
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("replaced") && err.contains("two"), "{err}");
    // The replaced waiter revoked its leases: no mark stays behind.
    let gone = wait_until(Duration::from_secs(5), || {
        !etcd.keys().iter().any(|k| k.ends_with("/replaced"))
    });
    assert!(gone, "{:?}", etcd.keys());
    assert_eq!(status_json(&url, "sp")["superseding"], 1);
    signal(h.id() as i32, libc::SIGTERM);
    wait_child(&mut h, Duration::from_secs(20));
    assert_eq!(
        wait_child(&mut second, Duration::from_secs(30)).code(),
        Some(0)
    );
    assert!(etcd.keys().is_empty(), "{:?}", etcd.keys());
}

/// A `--min-hold` window runs no job: `--preempt` ends it at once.
#[test]
fn preempt_ends_a_min_hold_window_at_once() {
    let etcd = Etcd::start();
    let url = etcd.url();
    on(&url)
        .args(["--min-hold", "60s", "win", "true"])
        .succeeds();
    assert_eq!(status_json(&url, "win")["min_hold"], true);
    let started = Instant::now();
    on(&url)
        .args(["--preempt", "-w", "20s", "win", "true"])
        .succeeds();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
