//! The local backend: flock files, one machine, no server.

use std::time::Duration;

use crate::support::*;

fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), free_port())
}

#[test]
fn works_with_no_url_and_no_server() {
    let name = unique("local-default");
    let out = run(lockrun().args([
        &name,
        "--",
        "sh",
        "-c",
        "echo $LOCKRUN_TOKEN $LOCKRUN_LOCK_FD",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    let f: Vec<&str> = s.split_whitespace().collect();
    assert!(f[0].parse::<u64>().unwrap() > 1_000_000_000_000_000);
    assert!(f[1].parse::<i32>().unwrap() > 2);
}

#[test]
fn two_runs_exclude_each_other_and_tokens_grow() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut holder = hold(Some(&url), "x", "30s", &scratch);
    let job = scratch.pid_in("pid");
    let out = run(lockrun().args(["--url", &url, "-n", "x", "true"]));
    assert_eq!(out.status.code(), Some(75));
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    assert!(!alive(job));
    let mut last = 0u64;
    for _ in 0..5 {
        let out = run(lockrun().args([
            "--url",
            &url,
            "-n",
            "x",
            "--",
            "sh",
            "-c",
            "echo $LOCKRUN_TOKEN",
        ]));
        assert_eq!(out.status.code(), Some(0));
        let t: u64 = text(&out.stdout).trim().parse().unwrap();
        assert!(t > last);
        last = t;
    }
}

#[test]
fn eight_local_processes_never_overlap() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let log = scratch.path("log");
    let script = format!(
        "echo \"start $LOCKRUN_TOKEN\" >> {0}; sleep 0.002; echo \"end $LOCKRUN_TOKEN\" >> {0}",
        log.display()
    );
    let kids: Vec<_> = (0..8)
        .map(|_| {
            let (url, script) = (url.clone(), script.clone());
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let out = run(lockrun().args(["--url", &url, "shared", "-c", &script]));
                    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
                }
            })
        })
        .collect();
    for k in kids {
        k.join().unwrap();
    }
    assert_serial(&std::fs::read_to_string(&log).unwrap(), 200);
}

#[test]
fn login_session_variables_do_not_split_the_lock() {
    let scratch = Scratch::new();
    let name = unique("xdg");
    let xdg = scratch.path("xdg");
    std::fs::create_dir_all(&xdg).unwrap();
    let mut holder = lockrun()
        .env("XDG_RUNTIME_DIR", &xdg)
        .args([&name, "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn()
        .unwrap();
    scratch.pid_in("pid");
    // As cron would run it: no XDG_RUNTIME_DIR, a bare environment.
    let out = run(lockrun()
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("TMPDIR")
        .args(["-n", &name, "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
}

#[test]
fn names_stay_inside_the_lock_directory() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    for name in ["../../x", "a/b", "..", "/etc/passwd", ".hidden"] {
        let out = run(lockrun().args(["--url", &url, name, "true"]));
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out.stderr));
    }
    // Only the lock directory was touched.
    let top: Vec<_> = std::fs::read_dir(scratch.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(top, ["locks"]);
    let inside: Vec<_> = std::fs::read_dir(scratch.path("locks"))
        .unwrap()
        .flatten()
        .collect();
    // One lock file per name, beside it the gate its requests pass.
    let names: Vec<String> = inside
        .iter()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".lock")).count(),
        5,
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".lock.gate")).count(),
        5,
        "{names:?}"
    );
    for e in inside {
        assert!(e.file_type().unwrap().is_file());
    }
}

#[test]
fn deleting_the_lock_file_does_not_admit_a_second_holder() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut holder = hold(Some(&url), "del", "30s", &scratch);
    let job = scratch.pid_in("pid");
    std::fs::remove_file(scratch.path("locks/del.lock")).unwrap();
    let out = run(lockrun()
        .args(["--url", &url, "-n", "del", "-c"])
        .arg(format!("touch {}", scratch.path("ran").display())));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(!scratch.exists("ran"));
    assert!(alive(job));
    // A waiter gets in only once the first job is gone.
    let mut waiter = lockrun()
        .args(["--url", &url, "del", "-c"])
        .arg(format!("touch {}", scratch.path("ran").display()))
        .spawn()
        .unwrap();
    wait_queued(&url, "del", 1);
    assert!(
        !scratch.exists("ran"),
        "second holder admitted while the first runs"
    );
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    assert!(!alive(job));
    assert!(wait_child(&mut waiter, Duration::from_secs(20)).success());
    assert!(scratch.exists("ran"));
}

#[test]
fn a_replaced_lock_file_ends_the_holder() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut holder = hold(Some(&url), "rep", "1s", &scratch);
    let job = scratch.pid_in("pid");
    std::fs::remove_file(scratch.path("locks/rep.lock")).unwrap();
    std::fs::write(scratch.path("locks/rep.lock"), "").unwrap();
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(20)).code(),
        Some(76)
    );
    assert!(!alive(job));
}

#[test]
fn a_killed_lockrun_takes_its_job_along_and_only_then_frees_the_lock() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    // The job starts an escapee (own session) that keeps the inherited lock
    // descriptor and ignores SIGTERM.
    let mut holder = lockrun()
        .args(["--url", &url, "k", "-c"])
        .arg(format!(
            "setsid sh -c 'trap \"\" TERM; echo $$ > {}; exec sleep 60' & exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn()
        .unwrap();
    let escaped = scratch.pid_in("pid");
    signal(holder.id() as i32, libc::SIGKILL);
    wait_child(&mut holder, Duration::from_secs(20));
    // Whenever the next holder runs, the escapee must be dead already: the
    // next holder's job looks at it.
    let mut seen = String::new();
    let freed = wait_until(Duration::from_secs(10), || {
        let out = run(lockrun()
            .args(["--url", &url, "-n", "k", "-c"])
            .arg(format!("cat /proc/{escaped}/stat 2>/dev/null || echo gone")));
        seen = text(&out.stdout);
        out.status.code() == Some(0)
    });
    assert!(freed, "the lock never came free");
    let state = seen.rsplit(')').next().unwrap_or("").trim_start();
    assert!(
        seen.trim() == "gone" || state.starts_with('Z') || state.starts_with('X'),
        "a second holder ran beside the escapee: {seen}"
    );
    assert!(!alive(escaped));
}

#[test]
fn nested_local_lock_is_refused() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let out = run(lockrun().args([
        "--url", &url, "outer", "--", BIN, "--url", &url, "outer", "true",
    ]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("deadlock"), "{err}");
}
