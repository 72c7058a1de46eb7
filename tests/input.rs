//! Bad input: one clear line, exit 64, nothing contacted, no key, no job.

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
fn closed_port_is_unavailable_quickly() {
    let port = free_port();
    let start = Instant::now();
    let out = run(lockrun().args(["--url", &format!("redis://127.0.0.1:{port}"), "x", "true"]));
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(text(&out.stderr).lines().count(), 1);
}

#[test]
fn wrong_password_is_unavailable_and_never_printed() {
    let redis = Redis::start_with(&["--requirepass", "right-horse-battery"]);
    let url = format!("redis://:wrong-staple-9@127.0.0.1:{}", redis.port);
    for args in [
        vec!["-vv", "x", "true"],
        vec!["status", "x"],
        vec!["release", "--force", "x"],
    ] {
        let out = run(lockrun().args(["--url", &url]).args(&args));
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(69), "{args:?}: {all}");
        assert!(!all.contains("wrong-staple-9"), "password leaked: {all}");
        assert!(all.contains("127.0.0.1"), "{all}");
    }
    // The right password works, and still is never printed.
    let url = format!("redis://:right-horse-battery@127.0.0.1:{}", redis.port);
    let out = run(lockrun().args(["-vv", "--url", &url, "x", "--", "env"]));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        !all.contains("right-horse-battery"),
        "password leaked: {all}"
    );
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

/// A secret in a Redis or etcd URL's query (`?password=`, as some clients
/// take it) or a lone user name (which some clients read as the password)
/// is never echoed, whether the URL is refused or the server unreachable.
#[test]
fn a_secret_in_a_query_or_a_lone_user_is_never_echoed() {
    for url in [
        "redis://127.0.0.1:9?password=S3CR",
        "redis+sentinel://127.0.0.1:9/m?sentinel_password=S3CR",
        "redis+sentinel://127.0.0.1:9?password=S3CR",
        "redis+cluster://127.0.0.1:9?password=S3CR",
        "etcd://127.0.0.1:9?password=S3CR",
        "etcd://u:S3CR@127.0.0.1:9?password=S3CR",
        "etcd://127.0.0.1:9/S3CR",
        "redis://S3CR@127.0.0.1:9",
        "redis+cluster://S3CR@127.0.0.1:9",
        "etcd://S3CR@127.0.0.1:9",
    ] {
        for args in [vec!["-n", "x", "true"], vec!["status", "x"], vec!["doctor"]] {
            let out = on(url).args(&args).output();
            let all = format!("{}{}", out.stdout(), out.stderr());
            assert!(!all.contains("S3CR"), "{url} {args:?}: {all}");
            assert!(
                matches!(out.out.status.code(), Some(64 | 69)),
                "{url} {args:?}: {all}"
            );
        }
    }
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
