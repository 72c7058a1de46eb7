//! Users coming from flock, cron and CI: their spellings work, or get one
//! line saying what lockrun does instead; waiting says why it waits.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

fn flock_bin() -> &'static str {
    if Command::new("flock").arg("--version").output().is_err() {
        panic!("flock not found: this test compares with it (apt-get install -y util-linux)");
    }
    "flock"
}

/// The same options through lockrun and flock, on a free and on a held
/// lock: the exit codes must match.
#[test]
fn flock_spellings_behave_as_in_flock() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let file = scratch.path("flock-file");
    let cases: &[(&[&str], Option<&[&str]>)] = &[
        (&["-w", "5"], Some(&["-w", "5"])),
        (&["-w", "0.5"], Some(&["-w", "0.5"])),
        (&["--wait", "0.3"], Some(&["--wait", "0.3"])),
        (&["--timeout", "0.3"], Some(&["--timeout", "0.3"])),
        (&["-n"], Some(&["-n"])),
        (&["--nonblock"], Some(&["--nonblock"])),
        (&["--nb"], Some(&["--nb"])),
        (&["-x", "-n"], Some(&["-x", "-n"])),
        (&["-e", "-n"], Some(&["-e", "-n"])),
        (&["--exclusive", "-n"], Some(&["--exclusive", "-n"])),
        (&["-n", "-E", "0"], Some(&["-n", "-E", "0"])),
        (&["-n", "-E", "3"], Some(&["-n", "-E", "3"])),
        (&["--ttl", "30", "-n"], None),
    ];
    for held in [false, true] {
        let mut holders = Vec::new();
        if held {
            holders.push(hold(Some(&url), "f", "30s", &scratch));
            scratch.pid_in("pid");
            holders.push(
                Command::new(flock_bin())
                    .arg(&file)
                    .args(["sleep", "30"])
                    .spawn()
                    .unwrap(),
            );
            // flock's own holder has the file once `flock -n` is refused.
            assert!(wait_until(Duration::from_secs(20), || {
                !Command::new(flock_bin())
                    .args(["-n"])
                    .arg(&file)
                    .arg("true")
                    .status()
                    .unwrap()
                    .success()
            }));
        }
        for (ours, theirs) in cases {
            let out = run(lockrun()
                .args(["--url", &url])
                .args(*ours)
                .args(["f", "true"]));
            let code = out.status.code();
            let expected = match theirs {
                Some(t) => Command::new(flock_bin())
                    .args(*t)
                    .arg(&file)
                    .arg("true")
                    .status()
                    .unwrap()
                    .code()
                    .map(|c| if c == 1 { 75 } else { c }),
                None => Some(if held { 75 } else { 0 }),
            };
            // flock says 1 where lockrun says 75 (or -E).
            let expected = if theirs.is_some_and(|t| t.contains(&"-E")) && held {
                Some(ours[ours.len() - 1].parse().unwrap())
            } else {
                expected
            };
            assert_eq!(
                code,
                expected,
                "held={held} {ours:?}: {}",
                text(&out.stderr)
            );
        }
        for mut h in holders {
            let _ = h.kill();
            let _ = h.wait();
        }
        let _ = std::fs::remove_file(scratch.path("pid"));
    }
}

#[test]
fn foreign_options_get_one_line_saying_what_to_do() {
    for (args, says) in [
        (&["-o", "x", "true"][..], "-o"),
        (&["-F", "x", "true"][..], "-F"),
        (&["--unlock", "x"][..], "--unlock"),
        (&["9"][..], "descriptor"),
        (&["-timeout=10s", "x", "true"][..], "--timeout=10s"),
        (&["-name=ci", "x", "true"][..], "--label"),
    ] {
        let out = run(lockrun().args(args));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// An executable without `#!` runs through /bin/sh, as the shell runs it.
#[test]
fn a_script_without_a_shebang_runs_through_sh() {
    let scratch = Scratch::new();
    let script = scratch.path("noshebang");
    std::fs::write(&script, "echo ran \"$1\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(lockrun()
        .args(["--url", &scratch.file_url(), "s", "--"])
        .arg(&script)
        .arg("arg"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ran arg\n");
}

/// A wait over a second says once who holds the lock; a --wait that runs
/// out says so; -n stays silent (cron mails every line); -q silences all.
#[test]
fn waiting_says_who_holds_the_lock() {
    for redis in [false, true] {
        let server = redis.then(Redis::start);
        let scratch = Scratch::new();
        let url = server
            .as_ref()
            .map_or_else(|| scratch.file_url(), |r| r.url());
        let mut holder = lockrun()
            .args(["--url", &url, "--label", "pipeline 42", "w", "-c"])
            .arg(format!(
                "echo $$ > {}; exec sleep 30",
                scratch.path("pid").display()
            ))
            .spawn()
            .unwrap();
        scratch.pid_in("pid");
        let out = run(lockrun().args(["--url", &url, "-w", "1.5", "w", "true"]));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(75), "{err}");
        assert_eq!(err.lines().count(), 2, "{err}");
        assert!(err.contains("waiting for w: held by"), "{err}");
        assert!(
            err.contains("gave up waiting for w after 1s 500ms"),
            "{err}"
        );
        assert!(err.contains("(pipeline 42)"), "{err}");
        let out = run(lockrun().args(["--url", &url, "-n", "w", "true"]));
        assert_eq!(out.status.code(), Some(75));
        assert_eq!(text(&out.stderr), "", "-n must stay silent");
        let out = run(lockrun().args(["--url", &url, "-q", "-w", "1.2", "w", "true"]));
        assert_eq!(out.status.code(), Some(75));
        assert_eq!(text(&out.stderr), "", "-q must stay silent");
        let out = run(lockrun().args(["--url", &url, "status", "w"]));
        assert!(
            text(&out.stdout).contains("(pipeline 42)"),
            "{}",
            text(&out.stdout)
        );
        signal(holder.id() as i32, libc::SIGTERM);
        wait_child(&mut holder, Duration::from_secs(20));
    }
}

/// After `kill -9` of a holder's lockrun the Redis lease lives on until it
/// expires; status says that the holder is gone.
#[test]
fn status_says_when_the_holder_is_gone() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut holder = hold(Some(&redis.url()), "gone", "30s", &scratch);
    scratch.pid_in("pid");
    signal(holder.id() as i32, libc::SIGKILL);
    let _ = holder.wait();
    let out = run(lockrun().args(["--url", &redis.url(), "status", "gone"]));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("no longer runs on this host"),
        "{}",
        text(&out.stdout)
    );
    let out = run(lockrun().args(["--url", &redis.url(), "status", "--json", "gone"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["holder_gone"], true);
}

#[test]
fn messages_say_plain_things() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let out = run(lockrun().args(["-v", "--url", &url, "m", "-c", "exit 3"]));
    let err = text(&out.stderr);
    assert!(err.contains("job exited with 3"), "{err}");
    let out = run(lockrun().args(["-v", "--url", &url, "m", "-c", "kill -9 $$"]));
    assert!(
        text(&out.stderr).contains("job killed by SIGKILL"),
        "{}",
        text(&out.stderr)
    );
    // Local locks cannot be broken: no talk of exit 76.
    let out = run(lockrun().args(["--url", &url, "release", "m"]));
    assert_eq!(out.status.code(), Some(64));
    assert!(!text(&out.stderr).contains("76"), "{}", text(&out.stderr));
    // A wrong password is a refusal of the credentials, for the user given.
    let redis = Redis::start_with(&["--requirepass", "right"]);
    let out = run(lockrun().args([
        "--url",
        &format!("redis://:wrong@127.0.0.1:{}", redis.port),
        "m",
        "true",
    ]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69));
    assert!(
        err.contains("refused the credentials of user default"),
        "{err}"
    );
    // A token that does not match: no story about changing hands.
    let plain = Redis::start();
    let mut holder = hold(Some(&plain.url()), "tok", "30s", &scratch);
    scratch.pid_in("pid");
    let out = run(lockrun().args([
        "--url",
        &plain.url(),
        "release",
        "--force",
        "--token",
        "1",
        "tok",
    ]));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !text(&out.stderr).contains("changed hands"),
        "{}",
        text(&out.stderr)
    );
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
}
