//! Bad input and hostile servers: one clear line and the right exit code,
//! nothing half-done, no spinning, no leaked secret.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

/// Every key but a name's token counter must expire on its own.
fn assert_nothing_without_expiry(redis: &Redis) {
    for key in redis.keys() {
        let ttl: i64 = redis.cmd(&["PTTL", &key]);
        assert!(
            ttl > 0 || key.ends_with(":fence"),
            "key {key} has no expiry ({ttl})"
        );
    }
}

#[test]
fn durations_past_their_bounds_are_refused_and_leave_nothing() {
    let redis = Redis::start();
    for args in [
        vec!["--ttl", "99999999999999h"],
        vec!["--ttl", "600y"],
        vec!["--ttl", "18446744073709551615s"],
        vec!["--kill-after", "18446744073709551615s"],
        vec!["--kill-after", "100000000000000000s"],
        vec!["--wait", "18446744073709551615s"],
        vec!["--wait", "2y"],
        vec!["--min-hold", "18446744073709551615s"],
        vec!["--min-hold", "8days"],
    ] {
        let start = Instant::now();
        let out = run(on(&redis.url()).args(&args).args(["dur", "--", "true"]));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(start.elapsed() < Duration::from_secs(5), "{args:?} hung");
        // The same on the local backend, where no server would catch it.
        let out = run(lockrun().args(&args).args(["dur", "--", "true"]));
        assert_eq!(out.status.code(), Some(64), "{args:?} (local)");
    }
    // The largest accepted values work and leave an expiring key only.
    on(&redis.url())
        .args(["--ttl", "7days", "--wait", "1y", "big", "--", "true"])
        .code(0);
    let mut holder = on(&redis.url())
        .args(["--ttl", "7days", "big2", "--", "sleep", "30"])
        .spawn();
    assert!(wait_until(Duration::from_secs(10), || redis
        .keys()
        .iter()
        .any(|k| k == "lockrun:{big2}")));
    assert_nothing_without_expiry(&redis);
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    assert_nothing_without_expiry(&redis);
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

/// A password in an inherited LOCKRUN_URL never reaches the job, whichever
/// URL is in effect.
#[test]
fn an_inherited_password_url_never_reaches_the_job() {
    let redis = Redis::start_with(&["--requirepass", "sekrit-pw"]);
    let plain = Redis::start();
    let scratch = Scratch::new();
    let with_pw = format!("redis://:sekrit-pw@127.0.0.1:{}", redis.port);
    for url in [plain.url(), scratch.file_url(), String::new()] {
        let out = run(lockrun()
            .env("LOCKRUN_URL", &with_pw)
            .args(["--url", &url, "pw", "--", "env"]));
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{url}: {all}");
        assert!(
            !all.contains("sekrit-pw"),
            "{url:?}: password reached the job: {all}"
        );
    }
    // Every URL form that can carry a secret, and one lockrun cannot read
    // (so cannot tell): overridden by --url, none reaches the job.
    for inherited in [
        "postgres://u:sekrit-pw@127.0.0.1:9/db",
        "postgres://u@127.0.0.1:9/db?password=sekrit-pw",
        "postgres://u@127.0.0.1:9/db?sslpassword=sekrit-pw",
        "postgres://u@127.0.0.1:9/db?%70assword=sekrit-pw",
        "etcd://u:sekrit-pw@127.0.0.1:9",
        "redis+sentinel://:sekrit-pw@127.0.0.1:9/m",
        "unknown://u:sekrit-pw@127.0.0.1:9",
    ] {
        let out = run(lockrun().env("LOCKRUN_URL", inherited).args([
            "--url",
            &scratch.file_url(),
            "pw",
            "--",
            "env",
        ]));
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{inherited}: {all}");
        assert!(
            !all.contains("sekrit-pw"),
            "{inherited:?}: a secret reached the job: {all}"
        );
    }
}

/// A job of the same (non-root) user cannot read the password from lockrun's
/// /proc entries.
#[test]
fn a_job_cannot_read_the_password_from_proc() {
    if !is_root() {
        panic!("this test switches to the user nobody and needs root");
    }
    let redis = Redis::start_with(&["--requirepass", "sekrit-pw"]);
    let url = format!("redis://:sekrit-pw@127.0.0.1:{}", redis.port);
    let out = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN, "pp", "-c"])
        .arg("cat /proc/$PPID/environ /proc/${LOCKRUN_OWNER##*:}/environ 2>/dev/null | tr '\\0' '\\n'; true")
        .env("LOCKRUN_URL", &url)
        .env_remove("LOCKRUN_TTL"));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        !all.contains("sekrit-pw"),
        "the job read the password: {all}"
    );
}

/// `cp NAME.lock t && mv t NAME.lock` while held: no second holder.
#[test]
fn a_lock_file_replaced_by_a_copy_admits_no_second_holder() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut holder = hold(Some(&url), "cp", "30s", &scratch);
    let job = scratch.pid_in("pid");
    let dir = scratch.path("locks");
    std::fs::copy(dir.join("cp.lock"), dir.join("t")).unwrap();
    std::fs::rename(dir.join("t"), dir.join("cp.lock")).unwrap();
    on(&url).args(["-n", "cp", "true"]).code(75);
    assert!(alive(job));
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
}

#[test]
fn odd_environments_and_small_cases() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    // A lock descriptor that is not one we can use is ignored.
    for v in ["-1", "abc", "999999", "2147483648"] {
        on(&url)
            .env("LOCKRUN_LOCK_FD", v)
            .args(["fd", "true"])
            .code(0);
    }
    // Settings for another engine never break a local run or status.
    for (k, v) in [("LOCKRUN_TLS_CA", "/nonexistent"), ("LOCKRUN_PREFIX", "{")] {
        on(&url).env(k, v).args(["env", "true"]).code(0);
        on(&url).env(k, v).args(["status", "env"]).code(1);
        let out = run(lockrun().env(k, v).args(["status", "env"]));
        assert_eq!(out.status.code(), Some(1), "{k}={v}: {}", text(&out.stderr));
    }
    // The token never goes backwards, even from a record at the top.
    let file = scratch.path("locks").join("top.lock");
    std::fs::write(&file, format!("token={} granted_ms=1 label=x\n", u64::MAX)).unwrap();
    let out = run(on(&url).args(["top", "sh", "-c", "echo $LOCKRUN_TOKEN"]));
    assert_eq!(text(&out.stdout).trim(), u64::MAX.to_string());
    // Names that hide characters are refused.
    for name in ["a\u{202E}b", "zero\u{200B}width", "line\u{2028}sep"] {
        let out = on(&url).args([name, "true"]).code(64).out;
        assert_eq!(text(&out.stderr).lines().count(), 1);
    }
    // A database number Redis cannot have is a usage error.
    let out = run(lockrun().args(["--url", "redis://127.0.0.1/4294967295", "x", "true"]));
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
}

/// Another local user pre-created the default directory: fail closed, and say
/// what is wrong and how to fix it.
#[test]
fn a_planted_lock_directory_is_refused_with_a_fix() {
    if !is_root() {
        panic!("this test plants a directory for the user nobody and needs root");
    }
    let dir = std::path::Path::new("/run/lock/lockrun-65534");
    let tmp = std::path::Path::new("/tmp/lockrun-65534");
    let base = if std::path::Path::new("/run/lock").is_dir() {
        dir
    } else {
        tmp
    };
    let _ = std::fs::remove_dir_all(base);
    std::fs::create_dir(base).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = run(Command::new("setpriv").args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        BIN,
        "planted",
        "true",
    ]));
    let _ = std::fs::remove_dir_all(base);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("owned by uid 0") && err.contains("file:///"),
        "{err}"
    );
}
