//! `--min-hold` beyond what every engine shares (those tests are in
//! `conformance.rs`): where each engine keeps the window, on which clock, and
//! that waiting on one neither overtakes nor polls; windows on PostgreSQL
//! tables made before them, and ZooKeeper's window nodes and slots.

use std::time::{Duration, Instant};

use crate::postgres::run_token;
use crate::support::*;
use crate::zookeeper::attacks::{chroot_url, lockrun_nodes};

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

/// `--min-hold` with TTL nodes: a second run within the window is busy;
/// after it, it runs; nothing is left without an end.
#[test]
fn min_hold_keeps_its_window_and_then_ends() {
    let (url, port, chroot) = chroot_url();
    let out = on(&url)
        .args(["--min-hold", "3s", "mh", "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds();
    let t1: u64 = out.stdout().trim().parse().unwrap();
    let start = Instant::now();
    on(&url).args(["-n", "mh", "true"]).code(75);
    let out = on(&url)
        .args(["-w", "20", "mh", "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds();
    let waited = start.elapsed();
    let t2: u64 = out.stdout().trim().parse().unwrap();
    assert!(t2 > t1, "token went backwards: {t2} after {t1}");
    assert!(
        waited >= Duration::from_millis(2500),
        "window ended early: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(8),
        "window ended late: {waited:?}"
    );
    assert!(
        wait_until(Duration::from_secs(30), || lockrun_nodes(port, &chroot)
            .is_empty()),
        "{:?}",
        lockrun_nodes(port, &chroot)
    );
}

/// `--min-hold` under `--limit 2`: the two windows keep both slots; a
/// third request waits until the first window ends, takes a free slot and
/// a higher token.
#[test]
fn min_hold_windows_keep_their_limit_slots() {
    let (url, _, _) = chroot_url();
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let out = on(&url)
            .args([
                "--limit",
                "2",
                "--min-hold",
                "3s",
                "ml",
                "-c",
                "echo $LOCKRUN_SLOT $LOCKRUN_TOKEN",
            ])
            .succeeds();
        tokens.push(out.stdout());
    }
    let slots: Vec<&str> = tokens
        .iter()
        .map(|t| t.split(' ').next().unwrap())
        .collect();
    assert_ne!(slots[0], slots[1], "{tokens:?}");
    on(&url).args(["--limit", "2", "-n", "ml", "true"]).code(75);
    let out = on(&url)
        .args([
            "--limit",
            "2",
            "-w",
            "20",
            "ml",
            "-c",
            "echo $LOCKRUN_SLOT $LOCKRUN_TOKEN",
        ])
        .succeeds();
    let last: u64 = out
        .stdout()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let before: u64 = tokens[1]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(last > before);
}

#[test]
fn a_job_longer_than_its_window_releases_at_its_end() {
    let pg = Postgres::start();
    let url = pg.url();
    on(&url)
        .args(["--min-hold", "0.2s", "long", "sleep", "0.5"])
        .succeeds();
    assert_eq!(status_json(&url, "long")["held"], false);
    on(&url).args(["-n", "long", "true"]).succeeds();
}

#[test]
fn a_min_hold_window_works_on_tables_made_before_it_and_with_the_readme_s_grants() {
    let pg = Postgres::start();
    // The tables as the version before --min-hold made them, then a role
    // with the grants lockrun-engines(7) lists only.
    pg.create_earlier_tables();
    pg.sql(
        "CREATE ROLE ci LOGIN PASSWORD 'ci-pw'; \
         GRANT USAGE ON SCHEMA lockrun TO ci; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON lockrun.lockrun_leases, lockrun.lockrun_waiters TO ci; \
         GRANT USAGE ON SEQUENCE lockrun.lockrun_tokens TO ci",
    );
    let url = pg.url_as("ci", "ci-pw");
    let first = run_token(&url, "plain");
    on(&url).args(["--min-hold", "2s", "w", "true"]).succeeds();
    on(&url).args(["-n", "w", "true"]).code(75);
    let v = status_json(&url, "w");
    assert_eq!(v["min_hold"], true, "{v}");
    // The owner value never shows: the row's owner is only the marker.
    assert!(!v.to_string().contains("\"owner\""), "{v}");
    // The window is kept on the server's clock: it ends on its own.
    assert!(wait_until(Duration::from_secs(10), || {
        status_json(&url, "w")["held"] == false
    }));
    assert!(run_token(&url, "w") > first);
    // status without a name: every name, sorted, from one statement.
    let v = on(&url).args(["status", "--json"]).code(1).json();
    let names: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    assert!(
        pg.sql("SELECT count(*) FROM lockrun.lockrun_leases WHERE name = 'w'")
            .trim()
            == "0"
    );
}
