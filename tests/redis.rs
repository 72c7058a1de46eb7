//! The Redis engine end to end, beyond the conformance suite: pass-through,
//! tokens, exclusion, waiting on a busy or restarted server, renewal and
//! losing the lease, TLS, ACL logins and least privilege.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn stdio_passes_through() {
    let redis = Redis::start();
    let mut child = on(&redis)
        .args([
            "x",
            "--",
            "sh",
            "-c",
            "read line; echo \"out:$line\"; echo \"err:$line\" >&2",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "out:hello\n");
    assert_eq!(text(&out.stderr), "err:hello\n");
}

#[test]
fn the_job_sees_its_lease_in_the_environment() {
    let redis = Redis::start();
    let out = on(&redis)
        .args(["--ttl", "20s", "report"])
        .env("LOCKRUN_TOKEN", "1")
        .env("LOCKRUN_NAME", "outer")
        .args(["--", "sh", "-c", "echo $LOCKRUN_NAME $LOCKRUN_TOKEN $LOCKRUN_OWNER $LOCKRUN_TTL_MS ${LOCKRUN_LOCK_FD-none}"])
    .code(0)
    .out;
    let s = text(&out.stdout);
    let f: Vec<&str> = s.split_whitespace().collect();
    assert_eq!(f[0], "report");
    let token: u64 = f[1].parse().unwrap();
    assert!(
        token > 1_000_000_000_000_000,
        "token {token} is floored by the server clock in µs"
    );
    assert!(f[2].contains(':'), "owner label host:pid, got {}", f[2]);
    assert_eq!(f[3], "20000");
    assert_eq!(f[4], "none", "no lock descriptor on Redis");
    let stored: i64 = redis.cmd(&["EXISTS", "lockrun:{report}"]);
    assert_eq!(stored, 0, "released after the job");
    // The secret owner value, read from the server while the job holds, is
    // nowhere in the job's environment.
    let scratch = Scratch::new();
    let envfile = scratch.path("env");
    let mut holder = on(&redis)
        .args(["secret", "-c"])
        .arg(format!(
            "env > {}.tmp; mv {0}.tmp {0}; exec sleep 60",
            envfile.display()
        ))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || envfile.exists()));
    let fields: Vec<String> = redis.cmd(&["HKEYS", "lockrun:{secret}"]);
    let secret = fields
        .iter()
        .find_map(|f| f.strip_prefix("h:"))
        .expect("the holder's owner field")
        .to_string();
    assert!(secret.len() >= 32, "{fields:?}");
    let env = std::fs::read_to_string(&envfile).unwrap();
    assert!(env.contains("LOCKRUN_OWNER="), "{env}");
    assert!(!env.contains(&secret), "the job saw the owner value");
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
}

fn token_of(redis: &Redis, name: &str) -> u64 {
    let out = on(redis)
        .args([name, "--", "sh", "-c", "echo $LOCKRUN_TOKEN"])
        .code(0)
        .out;
    text(&out.stdout).trim().parse().unwrap()
}

#[test]
fn tokens_increase_even_across_a_restart_without_persistence() {
    let mut redis = Redis::start();
    let mut last = 0;
    for _ in 0..5 {
        let t = token_of(&redis, "t");
        assert!(t > last, "{t} after {last}");
        last = t;
    }
    // Without persistence the restart loses the counter; the server clock
    // floor keeps tokens growing.
    redis.restart();
    assert!(redis.keys().is_empty());
    let t = token_of(&redis, "t");
    assert!(t > last, "after restart {t} must exceed {last}");
}

#[test]
fn eight_processes_never_overlap() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let log = scratch.path("log");
    let script = format!(
        "echo \"start $LOCKRUN_TOKEN\" >> {0}; sleep 0.005; echo \"end $LOCKRUN_TOKEN\" >> {0}",
        log.display()
    );
    let mut kids = Vec::new();
    for _ in 0..8 {
        let (url, script) = (redis.url(), script.clone());
        kids.push(std::thread::spawn(move || {
            for _ in 0..25 {
                let out =
                    run(lockrun().args(["--url", &url, "--ttl", "10s", "shared", "-c", &script]));
                assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            }
        }));
    }
    for k in kids {
        k.join().unwrap();
    }
    assert_serial(&std::fs::read_to_string(&log).unwrap(), 200);
}

#[test]
fn a_short_lease_survives_a_long_job() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut holder = on(&redis)
        .args(["--ttl", "1s", "long", "-c"])
        .arg(format!(
            "touch {}; sleep 4",
            scratch.path("holding").display()
        ))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("holding")));
    let mut attempts = 0;
    while holder.try_wait().unwrap().is_none() {
        let out = run(on(&redis).args(["-n", "long", "true"]));
        if holder.try_wait().unwrap().is_some() {
            break;
        }
        assert_eq!(
            out.status.code(),
            Some(75),
            "the lease lapsed while its job ran"
        );
        attempts += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(attempts >= 10, "only {attempts} attempts during the job");
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(20)).code(),
        Some(0)
    );
}

#[test]
fn a_deleted_key_ends_the_job_with_76() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut holder = hold(Some(&redis.url()), "del", "2s", &scratch);
    let job = scratch.pid_in("pid");
    let _: () = redis.cmd(&["DEL", "lockrun:{del}"]);
    let st = wait_child(&mut holder, Duration::from_secs(20));
    assert_eq!(st.code(), Some(76));
    assert!(!alive(job), "the job must be dead");
}

#[test]
fn an_overwritten_key_ends_the_job_with_76() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut holder = hold(Some(&redis.url()), "over", "2s", &scratch);
    let job = scratch.pid_in("pid");
    // Another owner's record in place of ours.
    let _: () = redis.cmd(&["DEL", "lockrun:{over}"]);
    let _: () = redis.cmd(&[
        "HSET",
        "lockrun:{over}",
        "h:00ff00ff00ff00ff00ff00ff00ff00ff",
        "1|99999999999999|x|1|-1|0|someone-else",
    ]);
    let st = wait_child(&mut holder, Duration::from_secs(20));
    assert_eq!(st.code(), Some(76));
    assert!(!alive(job));
}

/// Redis becomes unreachable mid-hold: the job must be dead before the lease
/// could have expired on the server, counted from the last successful renewal.
fn outage_kills_the_job_in_time(pause: bool) {
    let mut redis = Redis::start();
    let scratch = Scratch::new();
    let mut holder = hold(Some(&redis.url()), "outage", "3s", &scratch);
    let job = scratch.pid_in("pid");
    // Let a few renewals happen, then read when the server would expire the
    // lease: the last renewal before the outage set that time.
    std::thread::sleep(Duration::from_millis(2500));
    let pttl: i64 = redis.cmd(&["PTTL", "lockrun:{outage}"]);
    assert!(pttl > 0, "the lease must be held and renewed");
    let expires_at = Instant::now() + Duration::from_millis(pttl as u64);
    if pause {
        redis.pause();
    } else {
        redis.kill();
    }
    assert!(
        wait_until(Duration::from_secs(10), || !alive(job)),
        "job still alive"
    );
    // We see the death up to one 10 ms poll late (plus scheduling); lockrun
    // aims to have the job dead `slack` (150 ms here) before the expiry.
    let seen = Instant::now();
    let observer_latency = Duration::from_millis(50);
    assert!(
        seen <= expires_at + observer_latency,
        "job outlived its lease by {:?}",
        seen - expires_at
    );
    let st = wait_child(&mut holder, Duration::from_secs(20));
    assert_eq!(st.code(), Some(76));
    if pause {
        redis.resume();
    }
}

#[test]
fn redis_killed_mid_hold_stops_the_job_before_expiry() {
    outage_kills_the_job_in_time(false);
}

#[test]
fn redis_paused_mid_hold_stops_the_job_before_expiry() {
    outage_kills_the_job_in_time(true);
}

fn waiters(redis: &Redis, name: &str) -> u64 {
    let v = on(redis).args(["status", "--json", name]).output().json();
    v["waiters"].as_u64().unwrap_or(0)
}

/// A holder killed outright while the waiter behind it is stopped: the
/// next script to look (here a `-n` that finds the name taken) hands the
/// stopped waiter its grant. That grant, and every key of the name but the
/// token counter, must still expire on its own: a third of the waiter's
/// ttl, the longest a handed grant lasts unconfirmed (lockrun-engines(7) "REDIS").
#[test]
fn a_grant_handed_to_a_stopped_waiter_still_expires() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut c = redis.conn();
    let mut holder = Reap(hold(Some(&redis.url()), "gap", "1s", &scratch));
    scratch.pid_in("pid");
    let mut waiter = Reap(
        on(&redis)
            .args(["-q", "--ttl", "60s", "gap", "true"])
            .spawn(),
    );
    let queued = || waiters(&redis, "gap") == 1;
    assert!(wait_until(Duration::from_secs(20), queued));
    signal(waiter.0.id() as i32, libc::SIGSTOP);
    signal(holder.0.id() as i32, libc::SIGKILL);
    let _ = holder.0.wait();
    // The holder's lease runs out on its own (ttl 1 s).
    let free = || {
        on(&redis)
            .args(["status", "gap"])
            .output()
            .out
            .status
            .code()
            == Some(1)
    };
    assert!(wait_until(Duration::from_secs(20), free));
    on(&redis).args(["-n", "gap", "true"]).code(75);
    let lasts = |c: &mut redis::Connection| {
        assert_eq!(
            redis.keys_without_expiry(c, "lockrun:{gap}*"),
            Vec::<String>::new()
        );
        let pttl: i64 = redis::cmd("PTTL").arg("lockrun:{gap}").query(c).unwrap();
        assert!(
            (1..=20_000).contains(&pttl),
            "the handed grant lasts a third of the waiter's ttl, PTTL {pttl}"
        );
    };
    lasts(&mut c);
    signal(waiter.0.id() as i32, libc::SIGKILL);
    let _ = waiter.0.wait();
    lasts(&mut c);
}

/// A renewal leaves the key with an expiry even when it found it without
/// one (as an older lockrun could leave it): a renewal only ever moves the
/// expiry later, and no expiry at all is not "later". The expiry it gives
/// covers every holder, not only the one renewing: here a reader with a
/// 1 s lease renews beside one with 30 s.
#[test]
fn a_renewal_gives_a_key_without_expiry_one_that_covers_every_holder() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut c = redis.conn();
    let reader = |ttl: &str, file: &str| {
        Reap(
            on(&redis)
                .args(["-s", "--ttl", ttl, "kept", "-c"])
                .arg(format!(
                    "touch {}; exec sleep 60",
                    scratch.path(file).display()
                ))
                .spawn(),
        )
    };
    let long = reader("30s", "long");
    let mut short = reader("1s", "short");
    assert!(wait_until(Duration::from_secs(20), || scratch
        .exists("long")
        && scratch.exists("short")));
    let _: () = redis::cmd("PERSIST")
        .arg("lockrun:{kept}")
        .query(&mut c)
        .unwrap();
    let mut pttl = -1;
    // The short lease renews every ttl/3; the long one not for 10 s.
    assert!(
        wait_until(Duration::from_secs(5), || {
            pttl = redis::cmd("PTTL")
                .arg("lockrun:{kept}")
                .query(&mut c)
                .unwrap();
            pttl > 0
        }),
        "the key stayed without an expiry"
    );
    assert!(
        pttl > 25_000,
        "the key would expire under the 30 s reader: PTTL {pttl}"
    );
    signal(short.0.id() as i32, libc::SIGTERM);
    wait_child(&mut short.0, Duration::from_secs(20));
    drop(long);
}

/// `-w` gives up at the time asked, not when the server next looks at its
/// blocked clients (Redis does that up to 1/hz, 100 ms, late). The median
/// of five runs keeps one slow start on a loaded machine from failing it.
#[test]
fn wait_gives_up_within_milliseconds_of_the_time_asked() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut holder = Reap(hold(Some(&redis.url()), "late", "30s", &scratch));
    scratch.pid_in("pid");
    let mut took: Vec<Duration> = (0..5)
        .map(|_| {
            let start = Instant::now();
            on(&redis)
                .args(["-q", "-w", "0.2", "late", "true"])
                .code(75);
            start.elapsed()
        })
        .collect();
    took.sort();
    assert!(
        took[0] >= Duration::from_millis(200),
        "gave up too early: {took:?}"
    );
    assert!(
        took[2] < Duration::from_millis(250),
        "gave up too late: {took:?}"
    );
    signal(holder.0.id() as i32, libc::SIGTERM);
    wait_child(&mut holder.0, Duration::from_secs(20));
}

/// A server paused past the waiters' ttl/3 sees every place in the queue
/// lapse at once. Each waiter takes its own place back when it returns, so
/// the jobs still run in the order the waiters came (lockrun-engines(7) "REDIS").
#[test]
fn waiters_keep_their_order_across_a_server_pause() {
    const N: u64 = 10;
    let redis = Redis::start();
    let scratch = Scratch::new();
    let order = scratch.path("order");
    let go = scratch.path("go");
    let mut holder = Reap(
        on(&redis)
            .args(["--ttl", "30s", "pq", "-c"])
            .arg(format!(
                "touch {}; while [ ! -e {} ]; do sleep 0.01; done",
                scratch.path("holding").display(),
                go.display()
            ))
            .spawn(),
    );
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("holding")));
    // ttl 9 s: a place lapses 3 s after its last refresh, and a waiter
    // rides out an unreachable server for 9 s.
    let mut children = Vec::new();
    for i in 0..N {
        children.push(Reap(
            on(&redis)
                .args(["-q", "--ttl", "9s", "pq", "-c"])
                .arg(format!("echo {i} >> {}", order.display()))
                .spawn(),
        ));
        let queued = || waiters(&redis, "pq") > i;
        assert!(wait_until(Duration::from_secs(20), queued));
    }
    // The fault itself lasts a fixed time: longer than every place.
    redis.pause();
    std::thread::sleep(Duration::from_secs(4));
    redis.resume();
    assert!(
        wait_until(Duration::from_secs(30), || waiters(&redis, "pq") == N),
        "the waiters did not all come back to the queue"
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(
        wait_child(&mut holder.0, Duration::from_secs(30)).code(),
        Some(0)
    );
    for mut c in children {
        assert_eq!(
            wait_child(&mut c.0, Duration::from_secs(60)).code(),
            Some(0)
        );
    }
    let got: Vec<String> = scratch.read("order").lines().map(String::from).collect();
    let want: Vec<String> = (0..N).map(|i| i.to_string()).collect();
    assert_eq!(got, want, "grants out of arrival order after the pause");
}

/// A server paused past the holder's ttl and every waiter's place: when it
/// comes back the name is free and the waiters return in whatever order
/// their connections are served. The first back must not take the name
/// ahead of an earlier arrival that is still on its way back.
#[test]
fn a_pause_that_outlives_the_holder_keeps_the_queue_in_order() {
    const N: u64 = 8;
    let redis = Redis::start();
    for run in 0..3 {
        let scratch = Scratch::new();
        let name = format!("pz{run}");
        let order = scratch.path("order");
        let holder = Reap(
            on(&redis)
                .args(["-q", "--ttl", "3s", &name, "-c"])
                .arg(format!(
                    "touch {}; exec sleep 60",
                    scratch.path("holding").display()
                ))
                .spawn(),
        );
        assert!(wait_until(Duration::from_secs(20), || scratch.exists("holding")));
        // ttl 6 s: a place lapses 2 s after its last refresh, and a waiter
        // rides out an unreachable server for 6 s, well past the pause.
        let mut children = Vec::new();
        for i in 0..N {
            children.push(Reap(
                on(&redis)
                    .args(["-q", "--ttl", "6s", &name, "-c"])
                    .arg(format!("echo {i} >> {}", order.display()))
                    .spawn(),
            ));
            let queued = || waiters(&redis, &name) > i;
            assert!(wait_until(Duration::from_secs(20), queued));
            // Spread out as waiters arriving over a second or two are: the
            // pause finds them at every stage of their refresh cycle.
            std::thread::sleep(Duration::from_millis(200));
        }
        // The fault itself lasts a fixed time: longer than the holder's
        // lease and every place in the queue.
        redis.pause();
        std::thread::sleep(Duration::from_secs(5));
        redis.resume();
        for mut c in children {
            assert_eq!(
                wait_child(&mut c.0, Duration::from_secs(60)).code(),
                Some(0)
            );
        }
        drop(holder);
        let got: Vec<String> = scratch.read("order").lines().map(String::from).collect();
        let want: Vec<String> = (0..N).map(|i| i.to_string()).collect();
        assert_eq!(got, want, "run {run}: grants out of arrival order");
    }
}

/// A waiter paused by itself past its place, alone in the queue: once it
/// runs again and the name is free, it takes the name within a moment (the
/// queue's regathering is bounded by the 2 s request bound plus 1 s), not
/// after a third of its ttl.
#[test]
fn a_waiter_that_lapsed_alone_takes_a_free_name_soon() {
    let redis = Redis::start();
    let url = redis.url();
    let scratch = Scratch::new();
    let stop = scratch.path("stop");
    let mut holder = on(&url)
        .args(["--ttl", "30s", "alone", "-c"])
        .arg(format!(
            "while [ ! -e {} ]; do sleep 0.05; done",
            stop.display()
        ))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || {
        status_json(&url, "alone")["held"] == true
    }));
    let mut waiter = on(&url)
        .args(["--ttl", "30s", "alone", "-c"])
        .arg(format!("echo ran > {}", scratch.path("ran").display()))
        .spawn();
    wait_queued(&url, "alone", 1);
    signal(waiter.id() as i32, libc::SIGSTOP);
    // Its place lapses a third of its ttl later.
    let lapsed = wait_until(Duration::from_secs(30), || {
        status_json(&url, "alone")["waiters"] == 0
    });
    std::fs::write(&stop, "").unwrap();
    wait_child(&mut holder, Duration::from_secs(20));
    assert!(wait_until(Duration::from_secs(20), || {
        status_json(&url, "alone")["held"] == false
    }));
    let resumed = Instant::now();
    signal(waiter.id() as i32, libc::SIGCONT);
    assert!(lapsed, "the paused waiter's place never lapsed");
    assert!(
        wait_until(Duration::from_secs(30), || scratch.exists("ran")),
        "the waiter never ran"
    );
    let took = resumed.elapsed();
    wait_child(&mut waiter, Duration::from_secs(20));
    assert!(
        took < Duration::from_secs(7),
        "a free name waited {took:?} for its one waiter"
    );
}

#[test]
fn tls_with_a_ca_file_a_wrong_ca_and_insecure() {
    let scratch = Scratch::new();
    let d = scratch.dir.path();
    make_certs(d);
    let tls_port = free_port();
    let p = |f: &str| d.join(f).display().to_string();
    let redis = Redis::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &p("srv.crt"),
        "--tls-key-file",
        &p("srv.key"),
        "--tls-ca-cert-file",
        &p("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    on(&url)
        .args([
            "--tls-ca",
            &p("ca.crt"),
            "x",
            "--",
            "sh",
            "-c",
            "echo $LOCKRUN_TOKEN",
        ])
        .code(0);
    on(&url)
        .env("LOCKRUN_TLS_CA", p("ca.crt"))
        .args(["status", "x"])
        .code(1);

    let t = Instant::now();
    let out = run(on(&url).args(["--tls-ca", &p("other.crt"), "x", "true"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("certificate"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));

    on(&format!("{url}#insecure")).args(["x", "true"]).code(0);
    drop(redis);
}

#[test]
fn acl_logins_and_least_privilege() {
    let redis = Redis::start();
    acl_user(&redis, "locker", "s3cret-locker-pw", &least_privilege());
    let url = format!("redis://locker:s3cret-locker-pw@127.0.0.1:{}", redis.port);
    let scratch = Scratch::new();
    // Run, wait and hand off, status, release: all with exactly these rules.
    let mut holder = hold(Some(&url), "acl", "3s", &scratch);
    scratch.pid_in("pid");
    on(&url).args(["-n", "acl", "true"]).code(75);
    on(&url).args(["status", "acl"]).code(0);
    on(&url).args(["release", "--force", "acl"]).code(0);
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(20)).code(),
        Some(76)
    );
    let out = run(on(&url).args(["-w", "10s", "acl", "--", "env"]));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(!all.contains("s3cret-locker-pw"), "password leaked: {all}");

    // One rule fewer and lockrun says clearly that it was refused.
    acl_user(
        &redis,
        "weak",
        "weak-pw",
        &least_privilege().replace("+hset ", ""),
    );
    let weak = format!("redis://weak:weak-pw@127.0.0.1:{}", redis.port);
    let out = run(on(&weak).args(["w", "true"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!err.contains("weak-pw"), "{err}");

    // A wrong password is 69 and never printed.
    let bad = format!("redis://locker:not-the-pw-77@127.0.0.1:{}", redis.port);
    let out = run(on(&bad).args(["-vv", "w", "true"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(!err.contains("not-the-pw-77"), "{err}");
}

/// The commands lockrun needs, and only its keys: the rules
/// lockrun-engines(7) gives, less `+scan` (only `status` without a name
/// needs it).
fn least_privilege() -> String {
    let rules = crate::docs::documented_redis_acl().replace("+scan ", "");
    assert!(rules.contains("+hset "), "{rules}");
    rules
}

fn acl_user(redis: &Redis, user: &str, pass: &str, rules: &str) {
    let mut args = vec!["ACL", "SETUSER", user, "reset", "on"];
    let pw = format!(">{pass}");
    args.push(&pw);
    args.extend(rules.split_whitespace());
    let _: () = redis.cmd(&args);
}

/// A waiter refused by the server (here: a foreign value at the queue's key)
/// must stop at once, not spin.
#[test]
fn a_refused_wait_is_final_and_never_spins() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut holder = hold(Some(&redis.url()), "spin", "30s", &scratch);
    scratch.pid_in("pid");
    // A foreign value at the queue's key.
    let _: () = redis.cmd(&["SET", "lockrun:{spin}:queue", "x", "EX", "60"]);
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]);
    let start = Instant::now();
    on(&redis.url()).args(["-w", "5s", "spin", "true"]).code(69);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    let calls = |cmd: &str| -> u64 {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
            .and_then(|l| l.split("calls=").nth(1))
            .and_then(|v| v.split(',').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert!(calls("blpop") <= 2, "{stats}");
    assert!(calls("evalsha") <= 4, "{stats}");
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
}

/// An ACL user without BLPOP: the same, with one clear line.
#[test]
fn a_user_without_blpop_gets_69_at_once() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let _: () = redis.cmd(&[
        "ACL",
        "SETUSER",
        "noblpop",
        "on",
        ">pw",
        "~lockrun:*",
        "+evalsha",
        "+eval",
        "+script|load",
        "+ping",
    ]);
    let url = format!("redis://noblpop:pw@127.0.0.1:{}", redis.port);
    let mut holder = hold(Some(&redis.url()), "acl", "30s", &scratch);
    scratch.pid_in("pid");
    let start = Instant::now();
    let out = run(on(&url).args(["-w", "5s", "acl", "true"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(start.elapsed() < Duration::from_secs(3));
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
}

/// A server still loading its data set answers LOADING: a waiter rides it out.
#[test]
fn a_waiter_rides_out_a_loading_server() {
    let mut redis = Redis::start_with(&["--enable-debug-command", "yes"]);
    // Enough data that loading it takes a noticeable moment.
    let _: () = redis.cmd(&["DEBUG", "POPULATE", "1000000", "k", "64"]);
    let _: () = redis.cmd(&["SAVE"]);
    redis.restart();
    let out = run(on(&redis.url()).args(["-v", "-w", "60s", "loading", "--", "true"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("LOADING"),
        "the server was never seen loading: {err}"
    );
}

/// A replica answers READONLY (as after a failover, before the switch): a
/// waiter rides it out and succeeds once the replica is promoted.
#[test]
fn a_waiter_rides_out_a_read_only_replica() {
    let primary = Redis::start();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let mut waiter = on(&replica.url())
        .args(["-v", "-w", "30s", "ro", "--", "true"])
        .stderr(std::process::Stdio::piped())
        .spawn();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "READONLY must not be final"
    );
    let _: () = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    let st = wait_child(&mut waiter, Duration::from_secs(30));
    let mut err = String::new();
    use std::io::Read;
    waiter
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(err.contains("READONLY"), "{err}");
}

#[test]
fn a_key_of_the_wrong_type_is_a_clear_error() {
    let redis = Redis::start();
    let _: () = redis.cmd(&["SET", "lockrun:{x}", "hello"]);
    let out = run(lockrun().args(["--url", &redis.url(), "x", "true"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("not a lockrun lease"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let _: () = redis.cmd(&["DEL", "lockrun:{x}"]);
    let _: () = redis.cmd(&["RPUSH", "lockrun:{x}", "a"]);
    let out = run(lockrun().args(["--url", &redis.url(), "x", "true"]));
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
}
