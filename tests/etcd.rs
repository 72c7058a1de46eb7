//! The etcd engine end to end, beyond the conformance suite (which covers
//! exclusion, first come first served, `--limit`, `-s`, status, `release
//! --force`, `kill -9` of a holder's lockrun): tokens across a restart,
//! leases revoked or starved behind lockrun's back, endpoints, URLs, auth.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::support::*;

/// A holder whose job runs until stopped, started with `-vv` (every
/// renewal logged to the scratch file `err`); returns once its job runs.
fn holder(url: &str, scratch: &Scratch, name: &str, ttl: &str) -> (Child, i32) {
    let err = std::fs::File::create(scratch.path("err")).unwrap();
    let child = on(url)
        .args(["-vv", "--ttl", ttl, name, "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stderr(Stdio::from(err))
        .spawn();
    (child, scratch.pid_in("pid"))
}

fn token_of(url: &str, name: &str) -> u64 {
    let v = status_json(url, name);
    v["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} is not held: {v}"))
}

fn run_token(url: &str, name: &str) -> u64 {
    on(url)
        .args([name, "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds()
        .stdout()
        .trim()
        .parse()
        .unwrap()
}

/// The lease etcd holds for `name`'s first key (decimal id), from etcdctl.
fn lease_of(etcd: &Etcd, name: &str) -> i64 {
    let out = etcd.ctl(&["get", "--prefix", &format!("lockrun:{name}/"), "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["kvs"][0]["lease"]
        .as_i64()
        .unwrap_or_else(|| panic!("no lease on {name}: {out}"))
}

#[test]
fn tokens_strictly_increase_and_never_go_back_after_a_restart() {
    let mut etcd = Etcd::start();
    let url = etcd.url();
    let mut last = 0;
    for _ in 0..3 {
        let t = run_token(&url, "tok");
        assert!(t > last, "token {t} after {last}");
        last = t;
    }
    etcd.restart();
    let t = run_token(&url, "tok");
    assert!(t > last, "token {t} after a restart, {last} before");
}

#[test]
fn a_lease_revoked_with_etcdctl_stops_the_job_in_time() {
    let etcd = Etcd::start();
    let scratch = Scratch::new();
    let (mut h, job) = holder(&etcd.url(), &scratch, "rev", "3s");
    let lease = lease_of(&etcd, "rev");
    let revoked = Instant::now();
    etcd.ctl(&["lease", "revoke", &format!("{lease:x}")]);
    assert_eq!(wait_child(&mut h, Duration::from_secs(20)).code(), Some(76));
    // ttl/3 + op + grace = 1 s + 0.5 s + 0.3 s, and a second for the
    // processes of this test on a busy machine.
    let took = revoked.elapsed();
    assert!(took < Duration::from_millis(2800), "stopped after {took:?}");
    assert!(!alive(job), "the job outlived its revoked lease");
}

/// The wall-clock time of the last `renewed in X` line of a `-vv` log,
/// minus X: no later than the last renewal was sent.
fn last_renewal(log: &str) -> Option<SystemTime> {
    let line = log.lines().rev().find(|l| l.contains("renewed in "))?;
    let at = humantime::parse_rfc3339(line.split(' ').next()?).ok()?;
    let took = line.rsplit("renewed in ").next()?.trim();
    let took = if let Some(ms) = took.strip_suffix("ms") {
        Duration::from_secs_f64(ms.parse::<f64>().ok()? / 1000.0)
    } else if let Some(us) = took.strip_suffix("µs") {
        Duration::from_secs_f64(us.parse::<f64>().ok()? / 1e6)
    } else {
        Duration::from_secs_f64(took.strip_suffix('s')?.parse().ok()?)
    };
    Some(at - took)
}

#[test]
fn etcd_stopped_past_the_ttl_stops_the_job_before_the_lease_could_expire() {
    let etcd = Etcd::start();
    let scratch = Scratch::new();
    let (mut h, job) = holder(&etcd.url(), &scratch, "stall", "3s");
    // Two renewals in: the lease runs on the renewal schedule.
    assert!(wait_until(Duration::from_secs(20), || scratch
        .read("err")
        .matches("renewed in ")
        .count()
        >= 2));
    etcd.pause();
    let log = scratch.read("err");
    let expires = last_renewal(&log).expect("a renewal line") + Duration::from_secs(3);
    let dead = wait_until(Duration::from_secs(10), || !alive(job));
    let seen = SystemTime::now();
    etcd.resume();
    assert!(dead, "job still alive with etcd stopped");
    // Seen up to one 10 ms poll late; lockrun aims for 150 ms before expiry.
    let late = seen.duration_since(expires).unwrap_or_default();
    assert!(
        late <= Duration::from_millis(50),
        "the job outlived its lease by {late:?}"
    );
    assert_eq!(wait_child(&mut h, Duration::from_secs(20)).code(), Some(76));
}

#[test]
fn a_restart_of_etcd_mid_job_is_ridden_out() {
    let mut etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    // A 10 s lease leaves about 3 s of outage to ride out after a renewal is due.
    let (mut h, job) = holder(&url, &scratch, "rs", "10s");
    let token = token_of(&url, "rs");
    etcd.restart();
    assert!(alive(job), "the job was stopped by a short restart");
    assert_eq!(token_of(&url, "rs"), token, "the lease changed hands");
    on(&url).args(["-n", "rs", "true"]).code(75);
    // Renewals go on after the restart.
    let renewed = scratch.read("err").matches("renewed in ").count();
    assert!(wait_until(Duration::from_secs(20), || scratch
        .read("err")
        .matches("renewed in ")
        .count()
        > renewed));
    signal(h.id() as i32, libc::SIGTERM);
    assert_eq!(
        wait_child(&mut h, Duration::from_secs(20)).code(),
        Some(143)
    );
    assert!(run_token(&url, "rs") > token);
}

#[test]
fn unreachable_endpoints_are_69_and_a_dead_first_one_is_passed_over() {
    let etcd = Etcd::start();
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let dead = format!("etcd://127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    on(&dead)
        .args(["away", "-c"])
        .arg(format!("touch {}", ran.display()))
        .code(69)
        .says(&["cannot reach etcd"]);
    assert!(!ran.exists());
    let url = format!("etcd://127.0.0.1:{},127.0.0.1:{}", free_port(), etcd.port);
    on(&url).args(["first", "-c", "echo ran"]).succeeds();
    on(&url).args(["status", "first"]).code(1);
}

#[test]
fn bad_urls_and_short_ttls_are_64_before_anything_is_contacted() {
    let etcd = Etcd::start();
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let job = format!("touch {}", ran.display());
    for url in [
        format!("etcd://127.0.0.1:{}/path", etcd.port),
        format!("etcd://u:s3cret@127.0.0.1:{}/x", etcd.port),
        "etcd://u:s3cret@h:port".to_string(),
        "etcd://".to_string(),
        format!("etcd://127.0.0.1:{},", etcd.port),
    ] {
        let out = on(&url).args(["bad", "-c", &job]).code(64).says(&[]);
        assert!(!out.stderr().contains("s3cret"), "{}", out.stderr());
    }
    on(&etcd)
        .args(["--ttl", "1s", "bad", "-c", &job])
        .code(64)
        .says(&["smallest lease of 2s"]);
    assert!(!ran.exists(), "a job ran on bad input");
    assert!(etcd.keys().is_empty() && etcd.leases().is_empty());
    // Rounded up to whole seconds: the job sees what etcd granted.
    let out = on(&etcd)
        .args(["--ttl", "2.2s", "ok", "-c", "echo $LOCKRUN_TTL_MS"])
        .succeeds();
    assert_eq!(out.stdout(), "3000\n");
}

#[test]
fn a_waiter_killed_in_the_queue_holds_up_the_next_by_a_third_of_the_ttl() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "q", "9s");
    let mut first = on(&url).args(["-q", "--ttl", "9s", "q", "true"]).spawn();
    wait_queued(&url, "q", 1);
    let mut second = on(&url)
        .args(["-q", "--ttl", "9s", "q", "-c"])
        .arg(format!("touch {}", scratch.path("ran").display()))
        .spawn();
    wait_queued(&url, "q", 2);
    signal(first.id() as i32, libc::SIGKILL);
    let _ = first.wait();
    signal(h.id() as i32, libc::SIGTERM);
    wait_child(&mut h, Duration::from_secs(20));
    let freed = Instant::now();
    assert_eq!(
        wait_child(&mut second, Duration::from_secs(30)).code(),
        Some(0)
    );
    // The dead waiter's key lives on a 3 s lease; a second for this test.
    let took = freed.elapsed();
    assert!(took < Duration::from_secs(4), "waited {took:?}");
}

#[test]
fn a_user_s_password_opens_etcd_and_reaches_no_line_and_no_job() {
    let etcd = Etcd::start();
    etcd.ctl(&["user", "add", "root:rootpw"]);
    etcd.ctl(&["user", "add", "locker:s3cretpw"]);
    etcd.ctl(&["role", "add", "locking"]);
    etcd.ctl(&[
        "role",
        "grant-permission",
        "locking",
        "--prefix=true",
        "readwrite",
        "lockrun:",
    ]);
    etcd.ctl(&["user", "grant-role", "locker", "locking"]);
    etcd.ctl(&["auth", "enable"]);
    let url = format!("etcd://locker:s3cretpw@127.0.0.1:{}", etcd.port);
    let out = lockrun()
        .env("LOCKRUN_URL", &url)
        .args(["-v", "--ttl", "3s", "auth", "-c"])
        .arg("env; sleep 1.2")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for seen in [text(&out.stdout), text(&out.stderr)] {
        assert!(!seen.contains("s3cretpw"), "{seen}");
    }
    let wrong = format!("etcd://locker:wrongpw@127.0.0.1:{}", etcd.port);
    let out = on(&wrong)
        .args(["auth", "true"])
        .code(69)
        .says(&["refused", "locker"]);
    assert!(!out.stderr().contains("wrongpw"));
    // A prefix outside the role's keys: refused at once, not retried.
    let started = Instant::now();
    on(&url)
        .args(["--prefix", "other:", "auth", "true"])
        .code(69)
        .says(&["permission denied"]);
    assert!(started.elapsed() < Duration::from_secs(3));
}
