//! `--min-hold` beyond what every engine shares (those tests are in
//! `conformance.rs`): where each engine keeps the window, on which clock, and
//! that waiting on one neither overtakes nor polls.

use std::time::{Duration, Instant};

use crate::support::*;

/// The kept place on Redis ends at the grant plus DUR on the server's clock:
/// its value's grant time and expiry are the server's, DUR apart, and the
/// name's key lives as long.
#[test]
fn redis_keeps_the_window_on_the_server_s_clock() {
    let redis = Redis::start();
    let url = redis.url();
    on(&url)
        .args(["--min-hold", "20s", "srv", "-c", "sleep 0.2"])
        .code(0);
    let fields: Vec<String> = redis.cmd(&["HGETALL", "lockrun:{srv}"]);
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert!(fields[0].starts_with("m:"), "not a kept place: {fields:?}");
    let f: Vec<&str> = fields[1].split('|').collect();
    let (exp, granted): (u64, u64) = (f[1].parse().unwrap(), f[5].parse().unwrap());
    // The grant's time is in whole ms rounded down: one more ms at the end.
    assert_eq!(exp - granted, 20_001, "{fields:?}");
    let time: Vec<String> = redis.cmd(&["TIME"]);
    let now_ms = time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
    assert!(
        granted < now_ms && now_ms - granted < 10_000,
        "{fields:?} at {now_ms}"
    );
    let pttl: i64 = redis.cmd(&["PTTL", "lockrun:{srv}"]);
    assert!(
        (pttl - (exp as i64 - now_ms as i64)).abs() < 1000,
        "{pttl} vs {}",
        exp - now_ms
    );
    // Named by its token, not by an owner value: nothing renews or frees it.
    assert_eq!(fields[0], format!("m:{}", f[0]));
}

/// Without `--min-hold` a release keeps nothing, even when the server's
/// clock now reads earlier than the grant (a failover to a node whose clock
/// is behind, a step back): the name is free at once.
#[test]
fn redis_keeps_no_window_without_min_hold_whatever_the_clock_says() {
    let redis = Redis::start();
    let url = redis.url();
    let scratch = Scratch::new();
    let mut job = on(&url)
        .args(["skew", "-c"])
        .arg(format!(
            "echo $$ > {}; sleep 1",
            scratch.path("pid").display()
        ))
        .spawn();
    scratch.pid_in("pid");
    // The grant as a server 30 s ahead wrote it: its clock steps back.
    let fields: Vec<String> = redis.cmd(&["HGETALL", "lockrun:{skew}"]);
    let mut f: Vec<String> = fields[1].split('|').map(String::from).collect();
    f[5] = (f[5].parse::<u64>().unwrap() + 30_000).to_string();
    let _: i64 = redis.cmd(&["HSET", "lockrun:{skew}", &fields[0], &f.join("|")]);
    assert_eq!(
        wait_child(&mut job, Duration::from_secs(20)).code(),
        Some(0)
    );
    assert_eq!(status_json(&url, "skew")["held"], false);
    on(&url).args(["-n", "skew", "true"]).code(0);
}

/// A job that runs longer than its window releases at its end, as without
/// `--min-hold`.
#[test]
fn a_job_longer_than_the_window_releases_at_its_end() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    for url in [redis.url(), scratch.file_url()] {
        on(&url)
            .args(["--min-hold", "300ms", "long", "-c", "sleep 1"])
            .code(0);
        on(&url).args(["-n", "long", "true"]).code(0);
    }
}

/// Waiters on a window keep their order: each starts after the window of
/// the one before it, in the order they came, on Redis and local.
#[test]
fn waiters_on_a_window_keep_their_order() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    for url in [redis.url(), scratch.file_url()] {
        let log = scratch.path(&format!("order-{}", url.len()));
        on(&url).args(["--min-hold", "2s", "fifo", "true"]).code(0);
        let mut waiters = Vec::new();
        for who in ["a", "b", "c"] {
            waiters.push(
                on(&url)
                    .args(["-q", "--min-hold", "1s", "fifo", "-c"])
                    .arg(format!("echo {who} >> {}", log.display()))
                    .spawn(),
            );
            // Each queued before the next comes: the order is set by this.
            let n = waiters.len() as u64;
            assert!(wait_until(Duration::from_secs(20), || status_json(
                &url, "fifo"
            )["waiters"]
                .as_u64()
                .unwrap_or(0)
                >= n));
        }
        for mut w in waiters {
            assert_eq!(wait_child(&mut w, Duration::from_secs(30)).code(), Some(0));
        }
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "a\nb\nc\n", "{url}");
    }
}

/// A waiter on a Redis window sleeps until it ends: a handful of calls, not
/// one every few milliseconds.
#[test]
fn a_waiter_on_a_redis_window_does_not_poll() {
    let redis = Redis::start();
    let url = redis.url();
    let calls = || -> u64 {
        let info: String = redis.cmd(&["INFO", "commandstats"]);
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    on(&url).args(["--min-hold", "4s", "idle", "true"]).code(0);
    let before = calls();
    let started = Instant::now();
    on(&url).args(["-q", "idle", "true"]).code(0);
    let waited = started.elapsed();
    let made = calls() - before;
    assert!(waited >= Duration::from_millis(3000), "{waited:?}");
    // Acquire, queue, a look when woken, one at the window's end, the
    // release: far below one call per 100 ms of the wait.
    assert!(made <= 12, "{made} script calls in a wait of {waited:?}");
}

/// On the local backend the window is in the lock file from the grant: a
/// lockrun killed outright during its job still leaves it in force.
#[test]
fn a_local_window_holds_when_lockrun_is_killed() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut lr = on(&url)
        .args(["--min-hold", "30s", "k9", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn();
    let job = scratch.pid_in("pid");
    signal(lr.id() as i32, libc::SIGKILL);
    let _ = lr.wait();
    assert!(wait_until(Duration::from_secs(10), || !alive(job)));
    // The guard keeps the flock a moment longer, until every process of
    // the job is gone; from then on the window alone holds the name.
    let mut v = serde_json::Value::Null;
    let windowed = wait_until(Duration::from_secs(10), || {
        v = status_json(&url, "k9");
        v["min_hold"] == true
    });
    assert!(windowed, "the window does not hold the name: {v}");
    on(&url).args(["-n", "k9", "true"]).code(75);
    // A running local holder is still not broken; a window is.
    let (mut h, _) = {
        let c = on(&url)
            .args(["run", "-c"])
            .arg(format!(
                "echo $$ > {}; exec sleep 60",
                scratch.path("run").display()
            ))
            .spawn();
        let pid = scratch.pid_in("run");
        (c, pid)
    };
    on(&url)
        .args(["release", "--force", "run"])
        .code(64)
        .says(&["not available"]);
    signal(h.id() as i32, libc::SIGTERM);
    let _ = wait_child(&mut h, Duration::from_secs(20));
    on(&url).args(["release", "--force", "k9"]).code(0);
    on(&url).args(["-n", "k9", "true"]).code(0);
}

/// On etcd the kept key, owned by no one now, sits on a lease of its own
/// that covers what is left of the window (whole seconds, rounded up), and
/// everything lockrun stored is gone once the window and the old lease end.
#[test]
fn etcd_keeps_the_key_on_a_lease_of_its_own() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let before = Instant::now();
    on(&url)
        .args(["--ttl", "2s", "--min-hold", "4s", "kept", "true"])
        .code(0);
    let got = etcd.ctl(&["get", "--prefix", "lockrun:kept/", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&got).unwrap();
    let kv = &v["kvs"][0];
    let value = {
        use base64::Engine as _;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(kv["value"].as_str().unwrap())
            .unwrap();
        String::from_utf8(raw).unwrap()
    };
    let record: serde_json::Value = serde_json::from_str(&value).unwrap();
    assert_eq!(record["min_hold"], true, "{record}");
    assert_eq!(
        record["owner"], "",
        "a kept key proves no one's ownership: {record}"
    );
    let lease = format!("{:x}", kv["lease"].as_i64().unwrap());
    let ttl = etcd.ctl(&["lease", "timetolive", &lease]);
    let granted: u64 = ttl
        .split("granted with TTL(")
        .nth(1)
        .and_then(|t| t.split('s').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{ttl}"));
    // What was left of 4 s, with 1 % for drift, rounded up to whole seconds.
    let left = Duration::from_secs(4).saturating_sub(before.elapsed());
    assert!(
        granted as f64 >= left.as_secs_f64() && granted <= 5,
        "a {granted}s lease for {left:?} left: {ttl}"
    );
    assert!(wait_until(Duration::from_secs(20), || etcd
        .keys()
        .is_empty()
        && etcd.leases().is_empty()));
    assert!(before.elapsed() >= Duration::from_millis(3900));
}
