//! Operators and the ecosystem: status, force release, TLS, ACL logins,
//! least privilege, logging levels and secret redaction.

use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn status_shows_held_and_free() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let out = on(&redis.url()).args(["status", "job"]).code(1).out;
    assert_eq!(text(&out.stdout), "job: free\n");

    let mut holder = hold(Some(&redis.url()), "job", "30s", &scratch);
    scratch.pid_in("pid");
    let out = on(&redis.url()).args(["status", "job"]).code(0).out;
    let s = text(&out.stdout);
    assert!(s.starts_with("job: held by "), "{s}");
    assert!(
        s.contains(&format!(":{}", holder.id())),
        "holder label host:pid: {s}"
    );
    assert!(s.contains("token 1"), "{s}");
    assert!(s.contains("left"), "{s}");

    let out = on(&redis.url())
        .args(["status", "--json", "job"])
        .code(0)
        .out;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], "job");
    assert_eq!(v["held"], true);
    assert!(
        v["holder"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", holder.id()))
    );
    assert!(v["token"].as_u64().unwrap() > 1_000_000_000_000_000);
    let left = v["ttl_left_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 30_000, "{left}");
    assert!(v["held_for_ms"].as_u64().is_some());
    assert_eq!(v["revoked"], false);
    // The secret owner value appears nowhere.
    let fields: Vec<String> = redis.cmd(&["HKEYS", "lockrun:{job}"]);
    let secret = fields[0].strip_prefix("h:").unwrap().to_string();
    assert!(secret.len() >= 32, "{fields:?}");
    assert!(!text(&out.stdout).contains(&secret) && !s.contains(&secret));

    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    let out = on(&redis.url())
        .args(["status", "--json", "job"])
        .code(1)
        .out;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false);
    assert!(v["token"].is_null());
}

#[test]
fn status_works_on_the_local_backend() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    on(&url).args(["status", "job"]).code(1);
    let mut holder = hold(Some(&url), "job", "30s", &scratch);
    scratch.pid_in("pid");
    // status must not disturb the lock: a concurrent -n still sees it held.
    let out = on(&url).args(["status", "--json", "job"]).code(0).out;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], true);
    assert!(
        v["holder"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", holder.id()))
    );
    assert!(v["token"].as_u64().is_some());
    assert!(v["ttl_left_ms"].is_null(), "a flock has no expiry");
    on(&url).args(["-n", "job", "true"]).code(75);
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    on(&url).args(["status", "job"]).code(1);
}

#[test]
fn status_of_an_unreachable_backend_is_69() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    on(&url).args(["status", "x"]).code(69);
}

#[test]
fn a_lock_named_like_a_subcommand_runs_a_job() {
    let redis = Redis::start();
    let out = on(&redis.url())
        .args(["--", "status", "--", "sh", "-c", "echo $LOCKRUN_NAME"])
        .code(0)
        .out;
    assert_eq!(text(&out.stdout), "status\n");
}

#[test]
fn release_without_force_refuses() {
    let redis = Redis::start();
    let out = on(&redis.url()).args(["release", "x"]).code(64).out;
    assert!(text(&out.stderr).contains("--force"));
}

#[test]
fn force_release_revokes_safely() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let url = redis.url();
    let mut holder = hold(Some(&url), "rv", "6s", &scratch);
    let job = scratch.pid_in("pid");
    let mut waiter = on(&url)
        .args(["--ttl", "6s", "rv", "-c"])
        .arg(format!(
            "date +%s%N > {}",
            scratch.path("started").display()
        ))
        .spawn();
    wait_queued(&url, "rv", 1);
    let pttl: i64 = redis.cmd(&["PTTL", "lockrun:{rv}"]);
    let out = run(on(&url).args(["release", "--force", "rv"]));
    let revoked_at = Instant::now();
    let expiry = revoked_at + Duration::from_millis(pttl as u64);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!(":{}", holder.id())),
        "names whose lock it broke: {}",
        text(&out.stdout)
    );
    // The old holder's job is stopped at its next renewal, with 76.
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(20)).code(),
        Some(76)
    );
    assert!(!alive(job));
    // The waiter does not start before the revoked lease's time ran out.
    assert!(wait_child(&mut waiter, Duration::from_secs(30)).success());
    let started_ns: u128 = scratch.read("started").trim().parse().unwrap();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let started = Instant::now() - Duration::from_nanos((now_ns - started_ns) as u64);
    assert!(
        started + Duration::from_millis(50) >= expiry,
        "waiter started {:?} before the old lease ended",
        expiry - started
    );
}

#[test]
fn force_release_now_deletes_and_wakes_a_waiter() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let url = redis.url();
    let mut holder = hold(Some(&url), "now", "30s", &scratch);
    scratch.pid_in("pid");
    let mut waiter = on(&url)
        .args(["now", "-c"])
        .arg(format!("touch {}", scratch.path("started").display()))
        .spawn();
    wait_queued(&url, "now", 1);
    on(&url)
        .args(["release", "--force", "--now", "now"])
        .code(0);
    let t = Instant::now();
    assert!(wait_child(&mut waiter, Duration::from_secs(20)).success());
    // With a 30 s ttl only the wake-up explains a start this soon.
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "waiter took {:?}",
        t.elapsed()
    );
    // The old holder finds out at its next renewal (ttl/3), exit 76.
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(30)).code(),
        Some(76)
    );
}

#[test]
fn force_release_with_a_token_acts_only_on_that_lease() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let url = redis.url();
    on(&url).args(["release", "--force", "t"]).code(1);
    let mut holder = hold(Some(&url), "t", "3s", &scratch);
    scratch.pid_in("pid");
    let out = run(on(&url).args(["status", "--json", "t"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let token = v["token"].as_u64().unwrap().to_string();
    let out = on(&url)
        .args(["release", "--force", "--token", "12345", "t"])
        .code(1)
        .out;
    assert!(text(&out.stderr).contains(&token), "{}", text(&out.stderr));
    on(&url).args(["status", "t"]).code(0);
    on(&url)
        .args(["release", "--force", "--now", "--token", &token, "t"])
        .code(0);
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(20)).code(),
        Some(76)
    );
}

#[test]
fn force_release_is_refused_on_the_local_backend() {
    let scratch = Scratch::new();
    let out = on(&scratch.file_url())
        .args(["release", "--force", "x"])
        .code(64)
        .out;
    assert_eq!(text(&out.stderr).lines().count(), 1);
}

#[test]
fn verbose_quiet_and_default_output() {
    let redis = Redis::start();
    let url = redis.url();
    let out = run(on(&url).args(["x", "true"]));
    assert_eq!(text(&out.stderr), "", "silent on success, like flock");
    // A ttl that renews twice in the job, with a bound on each request
    // (ttl/6) that a loaded machine still meets.
    let out = run(on(&url).args(["-vv", "--ttl", "1800ms", "x", "sleep", "1.4"]));
    let err = text(&out.stderr);
    for step in [
        "connecting to",
        "acquired x with token",
        "lockrun: renewed in",
        "released x in",
    ] {
        assert!(err.contains(step), "-vv must show {step:?}: {err}");
    }
    assert!(
        err.lines().all(|l| l.starts_with("20")),
        "timestamped: {err}"
    );
    let out = run(on(&url).args(["-v", "--ttl", "1800ms", "x", "sleep", "1.4"]));
    assert!(
        !text(&out.stderr).contains("lockrun: renewed in"),
        "renewals only at -vv: {}",
        text(&out.stderr)
    );
    let out = run(on(&url).args(["-q", "x", "true"]));
    assert_eq!(text(&out.stderr), "");
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

#[test]
fn a_password_never_reaches_output_or_the_job() {
    let redis = Redis::start_with(&["--requirepass", "pa55-w0rd-xyz"]);
    let url = format!("redis://:pa55-w0rd-xyz@127.0.0.1:{}", redis.port);
    let scratch = Scratch::new();
    let mut outputs = Vec::new();
    // From the environment, as lockrun(1) recommends (keeps it out of ps).
    let out = run(lockrun().env("LOCKRUN_URL", &url).args([
        "-vv",
        "--ttl",
        "600ms",
        "p",
        "--",
        "sh",
        "-c",
        "env; sleep 0.5",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    outputs.push(out);
    let holder = on(&url)
        .args(["-vv", "--ttl", "3s", "p", "-c"])
        .arg(format!(
            "echo $$ > {}; env; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    scratch.pid_in("pid");
    outputs.push(run(on(&url).args(["-vv", "-n", "p", "true"])));
    outputs.push(run(on(&url).args(["-vv", "status", "p"])));
    outputs.push(run(on(&url).args(["-vv", "status", "--json", "p"])));
    outputs.push(run(
        on(&url).args(["-vv", "release", "--force", "--now", "p"])
    ));
    outputs.push(holder.wait_with_output_checked());
    outputs.push(run(on(&url).args(["--ttl", "nonsense", "p", "true"])));
    outputs.push(run(on(&format!(
        "redis://:pa55-w0rd-xyz@127.0.0.1:{}",
        free_port()
    ))
    .args(["-vv", "p", "true"])));
    for o in &outputs {
        let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
        assert!(!all.contains("pa55-w0rd-xyz"), "password leaked: {all}");
    }
}

trait WaitChecked {
    fn wait_with_output_checked(self) -> std::process::Output;
}

impl WaitChecked for std::process::Child {
    /// Collect a piped child's output, bounded in time (lease lost → 76).
    fn wait_with_output_checked(self) -> std::process::Output {
        let pid = self.id() as i32;
        let guard = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(30));
            if alive(pid) {
                signal(pid, libc::SIGKILL);
            }
        });
        let out = self.wait_with_output().unwrap();
        drop(guard);
        assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
        out
    }
}
