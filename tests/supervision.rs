//! Supervision: nothing of the job outlives the lease, signals reach the whole
//! job, and the job starts clean.

use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// `status` says the name is free (the lease was released).
fn is_free(url: &str, name: &str) -> bool {
    on(url).args(["status", name]).output().out.status.code() == Some(1)
}

fn key_exists(redis: &Redis, name: &str) -> bool {
    let n: i64 = redis.cmd(&["EXISTS", &format!("lockrun:{{{name}}}")]);
    n == 1
}

/// Wait for the lease to be released, then check the given processes were
/// already dead at that moment.
fn released_after_death(redis: &Redis, name: &str, lockrun: &mut Child, pids: &[i32]) {
    let gone = wait_until(Duration::from_secs(30), || !key_exists(redis, name));
    assert!(gone, "lease never released");
    for &p in pids {
        assert!(
            !alive(p),
            "process {p} of the job was alive when the lease was released"
        );
    }
    wait_child(lockrun, Duration::from_secs(20));
}

#[test]
fn sigterm_to_lockrun_ends_the_whole_job() {
    // No server needed: the local engine in a scratch directory.
    let locks = Scratch::new();
    let url = locks.file_url();
    let scratch = Scratch::new();
    let mut lr = on(&url)
        .args(["t", "-c"])
        .arg(format!(
            "sleep 100 & echo $! > {}; wait",
            scratch.path("pid").display()
        ))
        .spawn();
    let sleeper = scratch.pid_in("pid");
    signal(lr.id() as i32, libc::SIGTERM);
    let st = wait_child(&mut lr, Duration::from_secs(20));
    assert!(!alive(sleeper), "sleep survived lockrun");
    assert_eq!(st.code(), Some(143));
    assert!(is_free(&url, "t"));
}

#[test]
fn background_leftovers_are_killed_before_release() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let pid = scratch.path("pid");
    let pid = pid.display();
    // Each job exits as soon as its leftover has written its pid.
    let settle = format!("while [ ! -s {pid} ]; do sleep 0.01; done; exit 0");
    for (i, script) in [
        format!("sleep 30 & echo $! > {pid}; {settle}"),
        format!("setsid sleep 30 & echo $! > {pid}; {settle}"),
        format!("(sleep 30 & echo $! > {pid}); {settle}"),
        format!("(setsid sh -c 'echo $$ > {pid}; trap \"\" TERM; exec sleep 30' &); {settle}"),
    ]
    .iter()
    .enumerate()
    {
        let _ = std::fs::remove_file(scratch.path("pid"));
        let name = format!("bg{i}");
        let mut lr = on(&redis)
            .args(["--ttl", "5s", &name, "-c", script])
            .spawn();
        let leftover = scratch.pid_in("pid");
        released_after_death(&redis, &name, &mut lr, &[leftover]);
        assert!(!alive(leftover), "{script}");
    }
}

#[test]
fn lost_lease_kills_a_job_that_ignores_sigterm() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut lr = on(&redis)
        .args(["--ttl", "3s", "trap", "-c"])
        .arg(format!(
            "trap '' TERM; echo $$ > {}; sleep 100; sleep 100",
            scratch.path("pid").display()
        ))
        .spawn();
    let job = scratch.pid_in("pid");
    let deleted = Instant::now();
    let _: () = redis.cmd(&["DEL", "lockrun:{trap}"]);
    let st = wait_child(&mut lr, Duration::from_secs(20));
    assert_eq!(st.code(), Some(76));
    assert!(!alive(job));
    // Noticed at the next renewal (≤ ttl/3), killed after the grace (ttl/10).
    assert!(
        deleted.elapsed() < Duration::from_secs(3),
        "took {:?}",
        deleted.elapsed()
    );
}

#[test]
fn lost_lease_kills_a_stopped_job() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut lr = on(&redis)
        .args(["--ttl", "3s", "stopped", "-c"])
        .arg(format!(
            "echo $$ > {}; sleep 100; sleep 100",
            scratch.path("pid").display()
        ))
        .spawn();
    let job = scratch.pid_in("pid");
    signal(job, libc::SIGSTOP);
    // A stopped job still counts as running: the lease is renewed.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(
        key_exists(&redis, "stopped"),
        "a stopped job must keep its lease"
    );
    let _: () = redis.cmd(&["DEL", "lockrun:{stopped}"]);
    assert_eq!(
        wait_child(&mut lr, Duration::from_secs(20)).code(),
        Some(76)
    );
    assert!(!alive(job));
}

#[test]
fn signals_reach_every_process_of_the_job() {
    // No server needed: the local engine in a scratch directory.
    let locks = Scratch::new();
    let url = locks.file_url();
    let scratch = Scratch::new();
    let log = scratch.path("log");
    let log = log.display();
    // The main process is sh; a second process of the group is perl (a
    // background sh could not trap QUIT: it starts with it ignored).
    let script = format!(
        "for s in HUP USR1 QUIT WINCH; do trap \"echo sh $s >> {log}\" $s; done; \
         perl -e '$|=1; for my $s (qw(HUP USR1 QUIT WINCH)) {{ $SIG{{$s}} = sub {{ open my $f, \">>\", \"{log}\"; print $f \"perl $_[0]\\n\"; close $f }} }} open my $f, \">>\", \"{log}\"; print $f \"ready\\n\"; close $f; sleep 1 while 1' & \
         while :; do sleep 0.05; done"
    );
    let mut lr = on(&url).args(["sig", "-c", &script]).spawn();
    assert!(wait_until(Duration::from_secs(20), || scratch
        .read("log")
        .contains("ready")));
    for (sig, name) in [
        (libc::SIGHUP, "HUP"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGWINCH, "WINCH"),
    ] {
        signal(lr.id() as i32, sig);
        let both = wait_until(Duration::from_secs(10), || {
            let l = scratch.read("log");
            l.contains(&format!("sh {name}")) && l.contains(&format!("perl {name}"))
        });
        assert!(
            both,
            "{name} did not reach both processes: {}",
            scratch.read("log")
        );
    }
    signal(lr.id() as i32, libc::SIGTERM);
    wait_child(&mut lr, Duration::from_secs(20));
}

#[test]
fn killing_lockrun_outright_kills_its_direct_child() {
    // No server needed: the local engine in a scratch directory.
    let locks = Scratch::new();
    let url = locks.file_url();
    let scratch = Scratch::new();
    let mut lr = on(&url)
        .args(["k", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 100",
            scratch.path("pid").display()
        ))
        .spawn();
    let job = scratch.pid_in("pid");
    signal(lr.id() as i32, libc::SIGKILL);
    wait_child(&mut lr, Duration::from_secs(20));
    assert!(
        wait_until(Duration::from_secs(1), || !alive(job)),
        "job outlived a SIGKILLed lockrun"
    );
}

#[test]
fn exec_failures_and_signals_map_to_shell_codes() {
    // No server needed: the local engine in a scratch directory.
    let locks = Scratch::new();
    let url = locks.file_url();
    let scratch = Scratch::new();
    on(&url).args(["e", "-c", "kill -USR2 $$"]).code(140);
    let out = on(&url)
        .args(["e", "--", "/nonexistent/command"])
        .code(127)
        .out;
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
    let file = scratch.path("plain");
    std::fs::write(&file, "echo hi\n").unwrap();
    let out = on(&url).args(["e", "--"]).arg(&file).code(126).out;
    assert_eq!(text(&out.stderr).lines().count(), 1);
    assert!(
        is_free(&url, "e"),
        "the lease is released when the job cannot start"
    );
}

#[test]
fn job_dies_of_sigint_so_lockrun_does_too() {
    // No server needed: the local engine in a scratch directory.
    let locks = Scratch::new();
    let url = locks.file_url();
    let out = run(on(&url).args(["i", "-c", "kill -INT $$"]));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGINT), "{:?}", out.status);
    assert!(is_free(&url, "i"));
}

fn status_field(status: &str, field: &str) -> u64 {
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    u64::from_str_radix(line[field.len()..].trim(), 16).unwrap()
}

/// As under nohup: HUP (and PIPE) ignored when lockrun starts, USR1 blocked.
fn with_nohup_and_a_mask(cmd: &mut std::process::Command) {
    // SAFETY: signal(2) and sigprocmask(2) are async-signal-safe and take
    // only locals.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        });
    }
}

#[test]
fn the_job_starts_with_a_clean_slate() {
    // No server needed: the local engine in a scratch directory.
    let locks = Scratch::new();
    let url = locks.file_url();
    let mut cmd = on(&url).args(["clean", "--", "cat", "/proc/self/status"]);
    with_nohup_and_a_mask(cmd.command());
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0));
    let st = text(&out.stdout);
    // What the caller ignored stays ignored, nothing more (the test's own
    // environment may ignore signals too, so compare with a direct run).
    let mut direct = std::process::Command::new("cat");
    direct.arg("/proc/self/status");
    default_interrupts(&mut direct);
    with_nohup_and_a_mask(&mut direct);
    let expected = status_field(&text(&direct.output().unwrap().stdout), "SigIgn:");
    let ign = status_field(&st, "SigIgn:");
    assert!(
        ign & (1 << (libc::SIGHUP - 1)) != 0,
        "HUP must stay ignored: {ign:x}"
    );
    assert_eq!(ign, expected, "ignored set {ign:x}, caller's {expected:x}");
    assert_eq!(status_field(&st, "SigBlk:"), 0, "the mask must be empty");
    assert_eq!(status_field(&st, "SigCgt:"), 0, "no handlers survive exec");
}

fn fds_of(cmd: &mut std::process::Command) -> (Vec<String>, String) {
    // Start from 0, 1 and 2 alone: descriptors other tests running at the
    // same time leave open without close-on-exec must not leak into the
    // comparison.
    // SAFETY: close_range is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    let extra = s
        .lines()
        .find_map(|l| l.strip_prefix("fd="))
        .unwrap_or("")
        .to_string();
    let fds = s
        .lines()
        .filter(|l| !l.starts_with("fd="))
        .flat_map(|l| l.split_whitespace())
        .map(String::from)
        .collect();
    (fds, extra)
}

#[test]
fn no_descriptor_of_lockrun_leaks_into_the_job() {
    let redis = Redis::start();
    let script = "ls /proc/$$/fd; echo fd=$LOCKRUN_LOCK_FD";
    // Whatever the test process itself passes down is the baseline.
    let (baseline, _) = fds_of(
        std::process::Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null()),
    );
    let (fds, _) = fds_of(
        on(&redis)
            .args(["fds", "--", "sh", "-c", script])
            .stdin(Stdio::null())
            .command(),
    );
    assert_eq!(fds, baseline, "Redis backend: no extra descriptor");
    // Local backend: exactly one more, the lock descriptor it names.
    let scratch = Scratch::new();
    let (fds, lock_fd) = fds_of(
        lockrun()
            .args([
                "--url",
                &scratch.file_url(),
                "fds",
                "--",
                "sh",
                "-c",
                script,
            ])
            .stdin(Stdio::null()),
    );
    let mut expected = baseline.clone();
    expected.push(lock_fd.clone());
    expected.sort();
    let mut fds = fds;
    fds.sort();
    assert!(!lock_fd.is_empty());
    assert_eq!(
        fds, expected,
        "local backend: only the lock descriptor is added"
    );
}

/// A job that traps SIGTERM and keeps forking (a loop of short sleeps) gets
/// SIGTERM once when its lease is lost, whoever stops it: lockrun (the
/// server stopped answering), its guard (lockrun stopped), or both (lockrun
/// continued while its guard stops the job). A second one would run the
/// job's TERM trap again.
#[test]
fn a_lost_lease_tells_each_process_to_stop_once() {
    let redis = Redis::start();
    for how in ["the server stopped", "lockrun stopped", "lockrun continued"] {
        let scratch = Scratch::new();
        let terms = scratch.path("terms");
        let mut lr = on(&redis)
            .args(["--ttl", "3s", "--kill-after", "1s", "once", "bash", "-c"])
            .arg(format!(
                "trap 'echo TERM >> {}' TERM; echo $$ > {}; while :; do sleep 0.05; done",
                terms.display(),
                scratch.path("pid").display()
            ))
            .stderr(Stdio::piped())
            .spawn();
        let job = scratch.pid_in("pid");
        let told = || scratch.exists("terms");
        match how {
            "the server stopped" => redis.pause(),
            _ => signal(lr.id() as i32, libc::SIGSTOP),
        }
        assert!(
            wait_until(Duration::from_secs(20), told),
            "{how}: the job was never told to stop"
        );
        if how == "lockrun continued" {
            // Within the grace: lockrun runs again while the job is stopping.
            signal(lr.id() as i32, libc::SIGCONT);
        }
        let code = {
            if how == "lockrun stopped" {
                // The guard kills the job whatever lockrun does.
                let _ = wait_until(Duration::from_secs(20), || !alive(job));
                signal(lr.id() as i32, libc::SIGCONT);
            }
            wait_child(&mut lr, Duration::from_secs(30)).code()
        };
        if how == "the server stopped" {
            redis.resume();
        }
        let seen = scratch.read("terms");
        assert_eq!(code, Some(76), "{how}");
        assert_eq!(
            seen.lines().count(),
            1,
            "{how}: the job's TERM trap ran {} times",
            seen.lines().count()
        );
    }
}
