//! The local backend: flock files, one machine, no server; lock files and
//! directories replaced or planted behind lockrun's back.

use std::process::Command;
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

/// Wall-clock nanoseconds, as the jobs' `date +%s%N` prints them.
fn wall_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The nanoseconds logged on the line `WHAT NANOS` of a jobs' log.
fn logged(log: &str, what: &str) -> Option<u128> {
    log.lines()
        .find_map(|l| l.strip_prefix(what)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A job that logs `WHO-start` and `WHO-end` with the wall clock around a sleep.
fn timed_job(scratch: &Scratch, who: &str, hold: &str) -> String {
    let log = scratch.path("log");
    format!(
        "echo {who}-start $(date +%s%N) >> {0}; sleep {hold}; echo {who}-end $(date +%s%N) >> {0}",
        log.display()
    )
}

pub(crate) fn waiters(url: &str, name: &str) -> u64 {
    on(url).args(["status", "--json", name]).output().json()["waiters"]
        .as_u64()
        .unwrap_or(0)
}

/// A waiter stopped while it waits loses its place within a third of its
/// ttl, as on Redis; continued, it queues again and never runs beside the
/// holder that went ahead.
#[test]
fn a_stopped_waiter_loses_its_place_within_a_third_of_its_ttl() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut holder = on(&url)
        .args(["gs", "-c"])
        .arg(timed_job(&scratch, "holder", "1"))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || scratch
        .read("log")
        .contains("holder-start")));
    let mut stopped = on(&url)
        .args(["-q", "--ttl", "3s", "gs", "-c"])
        .arg(timed_job(&scratch, "stopped", "0.2"))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || waiters(&url, "gs") == 1));
    signal(stopped.id() as i32, libc::SIGSTOP);
    assert!(wait_until(Duration::from_secs(20), || state_of(
        stopped.id() as i32
    ) == Some('T')));
    let stopped_at = wall_ns();
    let mut third = on(&url)
        .args(["-q", "-w", "3", "gs", "-c"])
        .arg(timed_job(&scratch, "third", "1.5"))
        .spawn();
    let ran = wait_until(Duration::from_secs(20), || {
        scratch.read("log").contains("third-start") || third.try_wait().unwrap().is_some()
    });
    signal(stopped.id() as i32, libc::SIGCONT);
    let log = scratch.read("log");
    assert!(
        ran && log.contains("third-start"),
        "the third request never ran behind the stopped waiter: {log}"
    );
    // The stopped waiter kept its place for at most ttl/3 = 1 s.
    let third_start = logged(&log, "third-start").unwrap();
    let delay = Duration::from_nanos((third_start - stopped_at) as u64);
    assert!(
        delay < Duration::from_millis(2500),
        "the third started {delay:?} after the waiter ahead of it was stopped"
    );
    for c in [&mut holder, &mut stopped, &mut third] {
        assert_eq!(wait_child(c, Duration::from_secs(30)).code(), Some(0));
    }
    let log = scratch.read("log");
    let stopped_start = logged(&log, "stopped-start").expect(&log);
    let third_end = logged(&log, "third-end").expect(&log);
    assert!(
        stopped_start > third_end,
        "the continued waiter ran beside the holder that went ahead: {log}"
    );
}

/// Live waiters keep their order around one that was stopped in the middle
/// of the queue; continued, that one queues again at the back.
#[test]
fn a_stopped_waiter_does_not_reorder_the_others() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let order = scratch.path("order");
    let go = scratch.path("go");
    let job = |who: &str| format!("echo {who} >> {}; sleep 0.3", order.display());
    // The holder keeps the name until every waiter is queued.
    let mut children = vec![
        on(&url)
            .args(["o", "-c"])
            .arg(format!(
                "echo holder >> {}; for i in $(seq 600); do [ -e {} ] && break; sleep 0.05; done",
                order.display(),
                go.display()
            ))
            .spawn(),
    ];
    assert!(wait_until(Duration::from_secs(20), || scratch
        .read("order")
        .contains("holder")));
    let mut stopped = None;
    for who in ["a", "stopped", "b", "c"] {
        let before = waiters(&url, "o");
        // The stopped one keeps its place for ttl/3 = 3 s: b and c come
        // while it still has it.
        let child = on(&url)
            .args(["-q", "--ttl", "9s", "o", "-c"])
            .arg(job(who))
            .spawn();
        assert!(wait_until(Duration::from_secs(20), || waiters(&url, "o") > before));
        if who == "stopped" {
            signal(child.id() as i32, libc::SIGSTOP);
            assert!(wait_until(Duration::from_secs(20), || state_of(
                child.id() as i32
            ) == Some('T')));
            stopped = Some(child);
        } else {
            children.push(child);
        }
    }
    std::fs::write(&go, "").unwrap();
    let stopped = stopped.unwrap();
    let passed = wait_until(Duration::from_secs(30), || {
        scratch.read("order").lines().any(|l| l == "c")
    });
    signal(stopped.id() as i32, libc::SIGCONT);
    assert!(passed, "the waiters behind a stopped one never ran");
    children.push(stopped);
    for c in &mut children {
        assert_eq!(wait_child(c, Duration::from_secs(30)).code(), Some(0));
    }
    assert_eq!(scratch.read("order"), "holder\na\nb\nc\nstopped\n");
}

/// Waiters watch the place ahead of them by blocking on its file. A newcomer
/// that takes that file again the instant it is left must not leave an older
/// waiter blocked behind it: the queue would wait in a circle until a place
/// lapsed (ttl/3, 20 s here), with no holder at all.
#[test]
fn a_busy_queue_hands_over_without_stalling() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut slowest = Duration::ZERO;
                for _ in 0..25 {
                    let t = std::time::Instant::now();
                    let out =
                        run(lockrun()
                            .args(["-q", "--url", &url, "--ttl", "60s", "busy", "--", "true"]));
                    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
                    slowest = slowest.max(t.elapsed());
                }
                slowest
            })
        })
        .collect();
    let slowest = workers
        .into_iter()
        .map(|w| w.join().unwrap())
        .max()
        .unwrap();
    // One acquisition takes milliseconds here; a circle lasts until a place lapses.
    assert!(
        slowest < Duration::from_secs(10),
        "one acquisition among 100 took {slowest:?}"
    );
}

/// The files a name may have in the lock directory: its lock file and
/// those beside it (lockrun-engines(7) "LOCAL"); marks live inside them.
pub(crate) fn only_known_files(scratch: &Scratch, name: &str) {
    let main = format!("{name}.lock");
    for entry in std::fs::read_dir(scratch.path("locks")).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let Some(rest) = file.strip_prefix(&main) else {
            panic!("a file of no name: {file}");
        };
        let numbered = |p: &str| {
            rest.strip_prefix(p)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        };
        assert!(
            ["", ".gate", ".grant", ".join", ".readers"].contains(&rest)
                || numbered(".place")
                || numbered(".slot"),
            "a file left behind: {file}"
        );
    }
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

/// 10,000 held names on one machine are listed in a moment: the kernel's
/// table of flocks (which lists every one of them) is read for the
/// listing, not once for every name (that took 20 s for 276 names).
/// The names are copies of one lockrun wrote, held by one process.
#[test]
fn ten_thousand_held_names_are_listed_in_seconds() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    on(&url).args(["n00001", "true"]).succeeds();
    let dir = scratch.path("locks");
    let first = dir.join("n00001.lock");
    for i in 2..=10_000 {
        std::fs::copy(&first, dir.join(format!("n{i:05}.lock"))).unwrap();
    }
    let held = scratch.path("held");
    let holder = std::process::Command::new("perl")
        .arg("-e")
        .arg(format!(
            "use Fcntl qw(:flock); my @f; \
             for my $i (1..10000) {{ open(my $f, '<', sprintf('{dir}/n%05d.lock', $i)) or die $!; \
               flock($f, LOCK_EX) or die $!; push @f, $f }} \
             open(my $o, '>', '{held}'); close $o; sleep 120",
            dir = dir.display(),
            held = held.display()
        ))
        .spawn()
        .expect("perl (apt-get install perl)");
    let _holder = Reap(holder);
    assert!(
        wait_until(Duration::from_secs(60), || held.exists()),
        "the holder of 10,000 flocks never said so"
    );
    let started = std::time::Instant::now();
    let out = on(&url).arg("status").code(0).stdout();
    let took = started.elapsed();
    println!("status of 10,000 held names on the local engine: {took:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10_000, "{}", &out[..out.len().min(300)]);
    assert!(
        lines.iter().all(|l| l.contains(": held by")),
        "{}",
        lines.iter().find(|l| !l.contains(": held by")).unwrap()
    );
    assert!(
        lines[9_999].starts_with("n10000: held by"),
        "{}",
        lines[9_999]
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}
