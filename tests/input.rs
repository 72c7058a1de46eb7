//! Bad input: one clear line, exit 64, nothing contacted, no key, no job;
//! odd environments and durations past their bounds.

use std::time::{Duration, Instant};

use crate::support::*;

fn refused(args: &[&str], redis: &Redis, scratch: &Scratch) -> String {
    let out = run(lockrun()
        .args(["--url", &redis.url()])
        .args(args)
        .args(["--", "sh", "-c"])
        .arg(format!("touch {}", scratch.path("ran").display())));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line expected: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
    assert!(!scratch.exists("ran"), "{args:?}: the job must not start");
    err
}

#[test]
fn bad_input_is_refused_before_anything_happens() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let e = refused(&["--ttl", "ten", "x"], &redis, &scratch);
    assert!(e.contains("--ttl"), "{e}");
    let e = refused(&["--ttl", "0s", "x"], &redis, &scratch);
    assert!(e.contains("smallest ttl"), "{e}");
    let e = refused(&["--ttl", "100ms", "x"], &redis, &scratch);
    assert!(e.contains("134ms"), "{e}");
    refused(&["--wait", "soon", "x"], &redis, &scratch);
    refused(&["--kill-after", "-1s", "x"], &redis, &scratch);
    refused(
        &["--ttl", "2s", "--kill-after", "5s", "x"],
        &redis,
        &scratch,
    );
    refused(&["-n", "-w", "1s", "x"], &redis, &scratch);
    refused(&["-E", "76", "x"], &redis, &scratch);
    refused(&["-E", "300", "x"], &redis, &scratch);
    refused(&[""], &redis, &scratch);
    let e = refused(&["a{b}"], &redis, &scratch);
    assert!(e.contains("'{'"), "{e}");
    assert!(
        redis.keys().is_empty(),
        "no key may be created: {:?}",
        redis.keys()
    );
}

#[test]
fn bad_urls_are_refused() {
    let scratch = Scratch::new();
    for url in [
        "http://127.0.0.1:1",
        "redis://",
        "redis://127.0.0.1:1/notadb",
        "::nonsense",
        "rediss://h#secure",
    ] {
        let out = run(lockrun()
            .args(["--url", url, "x", "--", "sh", "-c"])
            .arg(format!("touch {}", scratch.path("ran").display())));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{url}: {err}");
        assert_eq!(err.lines().count(), 1, "{url}: {err}");
        assert!(err.contains("--url"), "{url}: {err}");
    }
    assert!(!scratch.exists("ran"));
}

#[test]
fn missing_command_is_a_usage_error() {
    let out = run(lockrun().arg("x"));
    assert_eq!(out.status.code(), Some(64));
    assert_eq!(text(&out.stderr).lines().count(), 1);
}

#[test]
fn help_and_version_work() {
    let out = run(lockrun().arg("--help"));
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("--ttl"));
    let out = run(lockrun().arg("--version"));
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).starts_with("lockrun "));
}

/// A name is at most 1 KiB (1024 bytes of UTF-8) on every engine: a longer
/// one is refused before anything is contacted, in one line that does not
/// repeat it.
#[test]
fn a_name_longer_than_1_kib_is_refused_on_every_engine() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let local = scratch.file_url();
    let long = "x".repeat(100_000);
    // 513 characters, 1026 bytes: the bound counts bytes.
    let just_over = "é".repeat(513);
    for name in [long.as_str(), just_over.as_str()] {
        let e = refused(&[name], &redis, &scratch);
        assert!(e.contains("1024 bytes"), "{e}");
        assert!(
            e.len() < 300,
            "the line repeats the name: {} bytes",
            e.len()
        );
        on(&local)
            .args([name, "true"])
            .code(64)
            .says(&["1024 bytes"]);
        on(&redis)
            .args(["status", name])
            .code(64)
            .says(&["1024 bytes"]);
    }
    assert!(
        redis.keys().is_empty(),
        "no key may be created: {} keys",
        redis.keys().len()
    );
    let files: Vec<_> = std::fs::read_dir(scratch.path("locks")).unwrap().collect();
    assert!(files.is_empty(), "no lock file may be created: {files:?}");
    // The bound itself is a name.
    let at = "x".repeat(1024);
    on(&redis).args([at.as_str(), "true"]).succeeds();
    on(&local).args([at.as_str(), "true"]).succeeds();
}

/// A refused duration or URL says what lockrun expects in the words a user
/// writes: no parser's state, no option the user did not give, and a bound
/// written as one would write it.
#[test]
fn refusals_speak_the_users_words() {
    let scratch = Scratch::new();
    let local = scratch.file_url();
    // A negative wait is a bad wait, not an unknown option.
    for wait in ["-5", "-5s", "-0.5"] {
        on(&local)
            .args(["-w", wait, "x", "--", "true"])
            .code(64)
            .says(&["--wait", "cannot be negative", "30s"]);
    }
    on(&local)
        .args(["--ttl", "-5s", "x", "true"])
        .code(64)
        .says(&["--ttl", "cannot be negative"]);
    on(&local)
        .args(["-E", "-1", "x", "true"])
        .code(64)
        .says(&["-E \"-1\"", "0 to 255"]);
    // A word where a duration goes: what is expected, with examples.
    let ran = on(&local)
        .args(["--ttl", "abc", "x", "true"])
        .code(64)
        .says(&["--ttl \"abc\": not a duration", "30s", "5m"]);
    assert!(
        !ran.stderr().contains("expected number"),
        "{}",
        ran.stderr()
    );
    on(&local)
        .args(["--ttl", "5x", "x", "true"])
        .code(64)
        .says(&["unknown unit \"x\""]);
    // Bounds and times left as one writes them: 7d, 1y, 2d 23h.
    on(&local)
        .args(["--ttl", "8d", "x", "true"])
        .code(64)
        .says(&["limit of 7d"]);
    on(&local)
        .args(["--wait", "2y", "x", "true"])
        .code(64)
        .says(&["limit of 1y"]);
    on(&local)
        .args(["--min-hold", "3d", "x", "true"])
        .succeeds();
    let shown = on(&local).args(["status", "x"]).succeeds().stdout();
    assert!(shown.contains("(2d 23h 59m"), "{shown}");
    assert!(!shown.contains("days"), "{shown}");
    assert!(!scratch.exists("ran"));
}

/// A URL that came from LOCKRUN_URL is refused naming the variable: the
/// user gave no --url to look for.
#[test]
fn a_bad_lockrun_url_names_the_variable() {
    for args in [vec!["x", "true"], vec!["status", "x"], vec!["doctor"]] {
        let ran = run(lockrun().env("LOCKRUN_URL", "bogus://h").args(&args));
        let err = text(&ran.stderr);
        assert_eq!(ran.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("invalid LOCKRUN_URL"), "{args:?}: {err}");
        assert!(!err.contains("--url"), "{args:?}: {err}");
    }
    // Given on the command line, it is still --url's.
    let ran = run(lockrun().args(["--url", "bogus://h", "x", "true"]));
    assert!(text(&ran.stderr).contains("invalid --url"));
}

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

#[test]
fn mode_flags_are_checked_before_anything_is_contacted() {
    // Nothing listens on this port: a 64 proves nothing was contacted.
    let url = format!("redis://127.0.0.1:{}", free_port());
    on(&url)
        .args(["-s", "--limit", "2", "x", "true"])
        .code(64)
        .says(&["--limit"]);
    on(&url)
        .args(["--limit", "0", "x", "true"])
        .code(64)
        .says(&["1 to 1000"]);
    on(&url).args(["--limit", "abc", "x", "true"]).code(64);
    on(&url).args(["--limit", "1001", "x", "true"]).code(64);
    on(&url).args(["-x", "-s", "x", "true"]).code(64);
}
