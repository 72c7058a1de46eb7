//! Supervision: nothing of the job outlives the lease, signals reach the whole
//! job, and the job starts clean. Jobs that try to outlive their lease:
//! trees of thousands of processes that ignore SIGTERM in many groups and
//! sessions, a pid recycled by an unrelated process, a job that reopens
//! lockrun's descriptors to disarm its guard; lockrun killed, paused or
//! short of descriptors, and descriptors it must not reuse.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::support::*;

/// The bound on a job's end or a lease's release in the fault tests.
const LONG: Duration = Duration::from_secs(20);

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

/// How many processes the big-tree tests start, and the holder's ttl (by
/// hand: LOCKRUN_TEST_TREE=20000 LOCKRUN_TEST_TREE_TTL=10s).
fn tree_size() -> usize {
    std::env::var("LOCKRUN_TEST_TREE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8000)
}

fn tree_ttl() -> String {
    std::env::var("LOCKRUN_TEST_TREE_TTL").unwrap_or_else(|_| "5s".into())
}

/// A perl job that starts `k` processes ignoring SIGTERM, spread over
/// `groups` process groups (every other one a session of its own), each
/// holding fd 9 (the write end of a FIFO the test reads: its end-of-file is
/// the moment the last of them died). `ready.N` appears once group N forked.
/// `close_fd` names a descriptor every process closes (the local lock's).
fn tree_job(scratch: &Scratch, k: usize, groups: usize, close_fd: bool) -> String {
    let d = scratch.dir.path().display();
    let close = if close_fd {
        "POSIX::close($ENV{LOCKRUN_LOCK_FD});"
    } else {
        ""
    };
    format!(
        "exec 9>{d}/fifo; exec perl -MPOSIX -e '
         $SIG{{TERM}} = q(IGNORE); {close}
         for my $j (1..{groups}) {{
           my $p = fork; die unless defined $p;
           next if $p;
           if ($j % 2) {{ POSIX::setsid() }} else {{ setpgrp(0, 0) }}
           for (1..{per}) {{
             my $c = fork;
             if (defined $c && !$c) {{ sleep 1000 while 1 }}
           }}
           open my $f, q(>), qq({d}/ready.$j); close $f;
           sleep 1000 while 1;
         }}
         sleep 1000 while 1'",
        per = k / groups,
    )
}

/// The reader of the FIFO: returns when every process holding its write end
/// is gone, with the wall time of that moment.
fn deaths(scratch: &Scratch) -> (std::fs::File, std::sync::mpsc::Receiver<SystemTime>) {
    let fifo = scratch.path("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // Opened read-write so the job's open for writing never blocks, and so
    // that a second, read-only descriptor sees end-of-file only when every
    // writer of the job is gone.
    let keep = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let mut reader = std::fs::File::open(&fifo).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        while reader.read(&mut buf).is_ok_and(|n| n > 0) {}
        let _ = tx.send(SystemTime::now());
    });
    (keep, rx)
}

fn wait_ready(scratch: &Scratch, groups: usize) {
    let ok = wait_until(Duration::from_secs(120), || {
        (1..=groups).all(|j| scratch.exists(&format!("ready.{j}")))
    });
    assert!(ok, "the job's tree never finished forking");
}

/// A holder whose renewals stop (the server is paused) stops a tree of
/// thousands of processes that ignore SIGTERM, in several groups and
/// sessions, before the lease can expire on the server: the margin does not
/// shrink with the size of the tree.
#[test]
fn a_big_tree_dies_before_its_lease_expires() {
    let _alone = heavy();
    let redis = Redis::start();
    let scratch = Scratch::new();
    let (keep, died) = deaths(&scratch);
    let k = tree_size();
    let groups = 6;
    let mut lr = on(&redis)
        .args([
            "--ttl",
            &tree_ttl(),
            "big",
            "-c",
            &tree_job(&scratch, k, groups, false),
        ])
        .spawn();
    wait_ready(&scratch, groups);
    // The writers are the job's now: only they keep the FIFO open.
    drop(keep);
    // A renewal happens every second; take the lease's expiry right after one.
    let pttl_at = |r: &Redis| {
        let before = SystemTime::now();
        let pttl: i64 = r.cmd(&["PTTL", "lockrun:{big}"]);
        assert!(pttl > 0, "the lease has no expiry: {pttl}");
        before + Duration::from_millis(pttl as u64)
    };
    let mut expires = pttl_at(&redis);
    assert!(wait_until(Duration::from_secs(30), || {
        let e = pttl_at(&redis);
        let renewed = e > expires + Duration::from_millis(200);
        expires = e;
        renewed
    }));
    redis.pause();
    let dead = died.recv_timeout(Duration::from_secs(60));
    redis.resume();
    let dead = dead.expect("the tree outlived lockrun's kill schedule");
    let st = wait_child(&mut lr, Duration::from_secs(60));
    assert_eq!(st.code(), Some(76));
    match expires.duration_since(dead) {
        Ok(margin) => eprintln!("{k} processes: all dead {margin:?} before the expiry"),
        Err(e) => panic!(
            "{k} processes ran {:?} past the lease's expiry on the server",
            e.duration()
        ),
    }
}

/// `kill -9` of lockrun on the local backend: the guard kills a big tree
/// whose processes closed the lock descriptor, and the next holder starts
/// only once the last of them is dead.
#[test]
fn after_kill_9_the_next_local_holder_waits_for_a_big_tree() {
    let _alone = heavy();
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let (keep, died) = deaths(&scratch);
    let groups = 6;
    let mut lr = on(&url)
        .args(["big", "-c", &tree_job(&scratch, tree_size(), groups, true)])
        .spawn();
    wait_ready(&scratch, groups);
    drop(keep);
    let next = on(&url)
        .args(["-w", "60", "big", "--", "perl", "-MTime::HiRes=time", "-e"])
        .arg("printf qq(%.6f\\n), time")
        .stdout(Stdio::piped())
        .spawn();
    std::thread::sleep(Duration::from_millis(300));
    signal(lr.id() as i32, libc::SIGKILL);
    let _ = lr.wait();
    let dead = died
        .recv_timeout(Duration::from_secs(60))
        .expect("the tree outlived a SIGKILLed lockrun");
    let out = next.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let started: f64 = text(&out.stdout).trim().parse().unwrap();
    let dead = dead
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        started > dead,
        "the next holder started {:.3} s before the old tree was dead",
        dead - started
    );
}

/// The job's main process exits, leaving a process in a session of its own;
/// an unrelated process then takes the main process's pid and leads a group
/// with it (forced through ns_last_pid; pid wrap-around does it too). No
/// signal of lockrun's, forwarded or on the kill schedule, may reach it.
#[test]
fn a_recycled_pid_of_the_job_is_never_signalled() {
    if !is_root() {
        panic!("this test writes /proc/sys/kernel/ns_last_pid and needs root");
    }
    // Other tests start processes too: one of theirs may take the pid
    // first. Then the scenario starts again, a few times at most.
    let mut taken = Vec::new();
    let (mut lr, main, mut stranger) = loop {
        let scratch = Scratch::new();
        let d = scratch.dir.path().display();
        let url = scratch.file_url();
        let mut lr = on(&url)
            .args(["--kill-after", "3s", "recycle", "-c"])
            .arg(format!(
                "setsid perl -e '$SIG{{TERM}} = q(IGNORE); sleep 1000' & echo $! > {d}/bg; echo $$ > {d}/pid"
            ))
            .spawn();
        let main = scratch.pid_in("pid");
        scratch.pid_in("bg");
        assert!(wait_until(Duration::from_secs(10), || !alive(main)));
        // Start a stranger with the main process's pid, leading its own group.
        let mut stranger = None;
        let mut got = Vec::new();
        for _ in 0..50 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (main - 1).to_string()).unwrap();
            let mut child = Command::new("setsid")
                .args(["sleep", "100"])
                .spawn()
                .unwrap();
            if child.id() as i32 == main {
                stranger = Some(child);
                break;
            }
            got.push(child.id());
            let _ = child.kill();
            let _ = child.wait();
            if alive(main) {
                break; // another test's process has it now
            }
        }
        if let Some(child) = stranger {
            break (lr, main, child);
        }
        signal(lr.id() as i32, libc::SIGTERM);
        wait_child(&mut lr, Duration::from_secs(30));
        taken.push((main, got));
        assert!(
            taken.len() < 5,
            "could not start a process with the job's pid: {taken:?}"
        );
    };
    let spid = stranger.id() as i32;
    signal(lr.id() as i32, libc::SIGHUP);
    let st = wait_child(&mut lr, Duration::from_secs(30));
    let survived = stranger.try_wait().unwrap().is_none();
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert!(
        survived,
        "lockrun's signals reached process {spid}, which reused the job's pid {main}"
    );
    assert_eq!(st.code(), Some(0));
}

/// A job that reopens, through /proc, every descriptor of lockrun it can
/// (the pipe a guard would watch among them) and daemonizes: `kill -9` of
/// lockrun still kills it within a second.
#[test]
fn a_job_holding_lockrun_s_descriptors_still_dies_with_it() {
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    let url = scratch.file_url();
    let mut lr = on(&url)
        .args(["disarm", "-c"])
        .arg(format!(
            "L=$(cut -d' ' -f4 /proc/$PPID/stat); \
             setsid bash -c 'n=20; for f in /proc/'$L'/fd/*; do n=$((n+1)); eval \"exec $n<>$f\" 2>/dev/null; done; \
               echo $$ > {d}/daemon; exec sleep 100' & \
             wait"
        ))
        .spawn();
    let daemon = scratch.pid_in("daemon");
    let kids = std::fs::read_dir(format!("/proc/{daemon}/fd"))
        .unwrap()
        .count();
    assert!(kids > 3, "the daemon reopened nothing of lockrun's");
    signal(lr.id() as i32, libc::SIGKILL);
    let _ = lr.wait();
    let gone = wait_until(Duration::from_secs(3), || !alive(daemon));
    if !gone {
        signal(daemon, libc::SIGKILL);
    }
    assert!(gone, "a job that held lockrun's descriptors outlived it");
    // The guard lets the lock go once it has reaped the last process.
    let freed = wait_until(Duration::from_secs(5), || {
        on(&url)
            .args(["-n", "disarm", "true"])
            .output()
            .out
            .status
            .code()
            == Some(0)
    });
    assert!(freed, "the lock never came free");
}

/// A job of the same (non-root) user cannot look into lockrun through /proc,
/// password or not: lockrun is never dumpable.
#[test]
fn a_job_cannot_open_lockrun_s_descriptors() {
    if !is_root() {
        panic!("this test switches to the user nobody and needs root");
    }
    let scratch = Scratch::new();
    let dir = scratch.path("nobody");
    std::fs::create_dir(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(scratch.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let out = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN])
        .arg("--url")
        .arg(format!("file://{}", dir.display()))
        .args(["peek", "-c"])
        .arg("L=$(cut -d' ' -f4 /proc/$PPID/stat); ls /proc/$L/fd >/dev/null 2>&1 && echo readable || echo denied")
        .env_remove("LOCKRUN_URL"));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert_eq!(text(&out.stdout).trim(), "denied", "{all}");
}

/// A lock file deleted while held, by a job that closed its own copy of the
/// lock descriptor, for a user who is not root: the next request still waits
/// for the holder's job to end (the holder is found through its guard's
/// descriptor) instead of running beside it.
#[test]
fn a_deleted_lock_file_keeps_the_next_holder_out_without_root() {
    if !is_root() {
        panic!("this test switches to the user nobody and needs root");
    }
    let _alone = heavy();
    let scratch = Scratch::new();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(scratch.dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let d = scratch.dir.path().display();
    // A copy the user nobody can run, wherever the build tree lives.
    let bin = scratch.path("lockrun");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = bin.display();
    let script = format!(
        "L={bin}; U=file://{d}/nobody; mkdir {d}/nobody; \
         $L -u $U --ttl 6s job -c 'eval \"exec $LOCKRUN_LOCK_FD>&-\"; for i in $(seq 40); do echo \"A $(date +%s%N)\" >> {d}/log; sleep 0.05; done' & \
         for i in $(seq 400); do grep -q '^A' {d}/log 2>/dev/null && break; sleep 0.05; done; \
         rm -f {d}/nobody/*; \
         $L -u $U --ttl 6s -w 20 job -c 'echo \"B $(date +%s%N)\" >> {d}/log'; \
         wait"
    );
    let out = run(Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sh",
            "-c",
        ])
        .arg(&script)
        .env_remove("LOCKRUN_URL"));
    let log = scratch.read("log");
    let times = |who: &str| -> Vec<u128> {
        log.lines()
            .filter_map(|l| l.strip_prefix(who))
            .map(|t| t.trim().parse().unwrap())
            .collect()
    };
    let (a, b) = (times("A "), times("B "));
    assert!(!a.is_empty() && b.len() == 1, "{}{log}", text(&out.stderr));
    assert!(
        b[0] > *a.iter().max().unwrap(),
        "a second holder ran beside the first:\n{log}"
    );
}

/// lockrun at a tight descriptor limit, whose walks of /proc may not open
/// all they need: when the lease is lost (or renewing cannot even start),
/// every process of the job (here 200 in sessions of their own, ignoring
/// SIGTERM) is still dead when lockrun exits, killed by its guard if need be.
#[test]
fn at_a_tight_descriptor_limit_a_lost_lease_still_kills_the_job() {
    let redis = Redis::start();
    for limit in [12, 16, 18, 20] {
        let scratch = Scratch::new();
        let d = scratch.dir.path().display();
        let name = format!("tight{limit}");
        let job = format!(
            "for i in $(seq 200); do setsid sh -c 'trap \"\" TERM; exec sleep 60' & echo $! >> {d}/pids; done; \
             echo ready > {d}/ready; wait"
        );
        let mut lr = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {limit}; exec {BIN} --url {} --ttl 3s {name} -c \"$0\"",
                redis.url()
            ))
            .arg(&job)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let ready = wait_until(Duration::from_secs(30), || {
            scratch.exists("ready") || lr.try_wait().unwrap().is_some()
        });
        assert!(ready);
        let _: () = redis.cmd(&["DEL", &format!("lockrun:{{{name}}}")]);
        let st = wait_child(&mut lr, Duration::from_secs(30));
        let pids: Vec<i32> = scratch
            .read("pids")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        for &p in &left {
            signal(p, libc::SIGKILL);
        }
        assert!(
            left.is_empty(),
            "ulimit -n {limit}: {} of {} processes outlived lockrun",
            left.len(),
            pids.len()
        );
        assert!(
            matches!(st.code(), Some(70 | 76)),
            "ulimit -n {limit}: exit {st:?}"
        );
    }
}

/// While a walk makes its way through thousands of processes, one it listed
/// dies, and a stranger takes its pid and forks a child: the walk must not
/// take the stranger for the job's and signal its child. Run in a private
/// pid namespace, where the stranger's pid can be forced through
/// ns_last_pid without touching anything else on the machine.
#[test]
fn a_walk_never_descends_into_a_recycled_pid() {
    if !is_root() {
        panic!("this test makes a pid namespace and needs root");
    }
    let _alone = heavy();
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    std::fs::create_dir(scratch.path("locks")).unwrap();
    // The job: 3,000 TERM-ignoring processes in sessions of their own; the
    // first one's pid is the one the stranger will take.
    std::fs::write(
        scratch.path("job.sh"),
        format!(
            "setsid sh -c 'trap \"\" TERM; exec sleep 1000' & echo $! > {d}/V.tmp\n\
             i=1; while [ $i -lt 3000 ]; do setsid sh -c 'trap \"\" TERM; exec sleep 1000' & i=$((i+1)); done\n\
             mv {d}/V.tmp {d}/V; wait\n"
        ),
    )
    .unwrap();
    // The stranger: waits for that pid to be free, takes it (U), forks W.
    std::fs::write(
        scratch.path("racer.pl"),
        format!(
            r#"use Time::HiRes qw(sleep time);
            sleep 0.01 until -e "{d}/V";
            open my $f, '<', "{d}/V"; my $v = <$f>; chomp $v; close $f;
            sub last_pid {{ open my $n, '>', '/proc/sys/kernel/ns_last_pid' or die; print $n $_[0]; close $n }}
            # Another fork in the namespace (the script's own sleeps) may
            # take the pid between the write and our fork: then again.
            my $u;
            for my $try (1 .. 200) {{
            my $end = time + 60; sleep 0.001 while kill(0, $v) && time < $end;
            last_pid($v - 1);
            $u = fork // die;
            if (!$u) {{
              exit 0 if $$ != $v;
              last_pid(20000);
              my $w = fork // die;
              if (!$w) {{ sleep 1000 while 1 }}
              open my $o, '>', "{d}/U"; print $o "$$ $w\n"; close $o;
              waitpid($w, 0);
              open my $r, '>', "{d}/W-signalled"; print $r ($? & 127), "\n"; close $r;
              exit 0;
            }}
            last if $u == $v;
            waitpid($u, 0);
            }}
            sleep 8; kill 'KILL', $u; waitpid($u, 0);"#
        ),
    )
    .unwrap();
    let script = format!(
        "cd {d}; (timeout 60 {BIN} -u file://{d}/locks --ttl 3s race -- sh {d}/job.sh > {d}/lockrun.log 2>&1 &); \
         perl {d}/racer.pl & \
         for i in $(seq 600); do [ -e V ] && break; sleep 0.1; done; sleep 0.5; \
         rm -f {d}/locks/race.lock; \
         for i in $(seq 300); do [ -e U ] && break; sleep 0.1; done; wait"
    );
    let out = run(Command::new("timeout")
        .args([
            "-s",
            "KILL",
            "120",
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-c",
        ])
        .arg(&script));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: i32 = scratch
        .read("V")
        .trim()
        .parse()
        .expect("the job never started");
    let u = scratch.read("U");
    let upid: i32 = u
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the stranger never started");
    assert_eq!(upid, v, "the stranger did not get the recycled pid");
    assert!(
        !scratch.exists("W-signalled"),
        "the stranger's child got signal {} from lockrun's walk",
        scratch.read("W-signalled").trim()
    );
}

/// lockrun stopped between the grant and the job's start (here held by a
/// debugger for longer than the ttl): the job is never started outside its
/// lease; lockrun says so and exits 76.
#[test]
fn a_job_is_never_started_after_its_lease_ran_out() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let out = Command::new("gdb")
        .args([
            "-nx",
            "-batch",
            "-ex",
            "set breakpoint pending on",
            "-ex",
            "break lockrun::supervise::guard::Guard::start",
            "-ex",
            "run",
            "-ex",
            "shell sleep 2",
            "-ex",
            "continue",
            "--args",
            BIN,
            "--url",
            &redis.url(),
            "--ttl",
            "1s",
            "late",
            "touch",
        ])
        .arg(&ran)
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => panic!("gdb: {e}; the test needs it (apt-get install -y gdb)"),
    };
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        said.contains("Breakpoint 1,"),
        "the debugger never held lockrun before its job's start:\n{said}"
    );
    assert!(
        !ran.exists(),
        "the job ran after its lease ran out:\n{said}"
    );
    // gdb gives the exit code in octal: 76 is 0114.
    assert!(
        said.contains("exited with code 0114") && said.contains("before the job could start"),
        "{said}"
    );
}

/// The guard itself killed (the OOM killer picks it): lockrun takes over its
/// orphans, stops them, and only then releases and exits 70.
#[test]
fn a_killed_guard_leaves_lockrun_in_charge() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    let mut lr = lockrun()
        .args(["--url", &redis.url(), "--ttl", "3s", "gk", "-c"])
        .arg(format!(
            "echo $PPID > {d}/guard; setsid sh -c 'trap \"\" TERM; echo $$ > {d}/bg; exec sleep 100' & wait"
        ))
        .spawn()
        .unwrap();
    let guard = scratch.pid_in("guard");
    let bg = scratch.pid_in("bg");
    let start = Instant::now();
    signal(guard, libc::SIGKILL);
    let released = wait_until(LONG, || !key_exists(&redis, "gk"));
    let bg_alive = alive(bg);
    let st = wait_child(&mut lr, LONG);
    if bg_alive {
        signal(bg, libc::SIGKILL);
    }
    assert!(released);
    assert!(!bg_alive, "a process of the job was alive at release");
    assert_eq!(st.code(), Some(70));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
}

/// The local backend has no expiry: a pause of lockrun (SIGSTOP, a laptop
/// suspend, `docker pause`) longer than the ttl must not stop the job.
#[test]
fn a_paused_lockrun_keeps_a_local_job() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut lr = lockrun()
        .args(["--url", &url, "--ttl", "1s", "pause", "-c"])
        .arg(format!(
            "echo $$ > {}; sleep 3",
            scratch.path("pid").display()
        ))
        .spawn()
        .unwrap();
    scratch.pid_in("pid");
    signal(lr.id() as i32, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2000));
    signal(lr.id() as i32, libc::SIGCONT);
    let st = wait_child(&mut lr, LONG);
    assert_eq!(st.code(), Some(0));
}

/// `timeout -s KILL` kills lockrun's whole process group, lockrun and all
/// that shares its group: the job must die too, grandchildren included.
#[test]
fn a_sigkill_to_lockrun_s_whole_group_kills_the_job() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    let mut t = std::process::Command::new("timeout")
        .args(["-s", "KILL", "2", BIN, "--url", &redis.url(), "tk", "-c"])
        .arg(format!(
            "sleep 100 & echo $! > {d}/a; setsid sleep 100 & echo $! > {d}/b; echo $$ > {d}/pid; wait"
        ))
        .spawn()
        .unwrap();
    let pids: Vec<i32> = ["a", "b", "pid"]
        .iter()
        .map(|f| scratch.pid_in(f))
        .collect();
    let _ = wait_child(&mut t, LONG);
    let dead = wait_until(Duration::from_secs(2), || pids.iter().all(|&p| !alive(p)));
    let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &left {
        signal(p, libc::SIGKILL);
    }
    assert!(dead, "processes {left:?} outlived a group-wide SIGKILL");
}

/// A leftover that exits on SIGTERM, leaving a child of its own behind: that
/// child is re-parented to lockrun's side and must be dead before release.
#[test]
fn children_of_a_dying_leftover_are_found() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    for i in 0..5 {
        let g = scratch.path(&format!("g{i}"));
        let g = g.display();
        let name = format!("lo{i}");
        let script = format!(
            "sh -c 'trap \"sleep 30 & echo \\$! > {g}; exit 0\" TERM; while :; do sleep 0.01; done' & \
             sleep 0.2; exit 0"
        );
        let mut lr = lockrun()
            .args(["--url", &redis.url(), "--ttl", "3s", &name, "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // lockrun releases only once nothing of the job is left: by the
        // time it has exited, the leftover's child must be dead.
        assert_eq!(wait_child(&mut lr, LONG).code(), Some(0));
        assert!(!key_exists(&redis, &name));
        let grandchild: i32 = scratch.read(&format!("g{i}")).trim().parse().unwrap_or(0);
        assert!(
            grandchild > 0,
            "the leftover never started its child on SIGTERM"
        );
        let was_alive = alive(grandchild);
        if was_alive {
            signal(grandchild, libc::SIGKILL);
        }
        assert!(
            !was_alive,
            "the leftover's child {grandchild} was alive at release"
        );
    }
}

/// Ctrl-C reaches the other members of a pipeline, as without lockrun.
#[test]
fn ctrl_c_reaches_the_other_members_of_a_pipeline() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut pty = Pty::bash(&format!(
        "set -m; lockrun --url {url} pipe -- sh -c 'echo ready; exec sleep 30' | \
         (trap 'echo member-saw-int; exit 0' INT; cat)"
    ));
    pty.expect("ready", LONG);
    pty.type_(b"\x03");
    pty.expect("member-saw-int", LONG);
    pty.finish(LONG);
}

/// One Ctrl-C stops a script that loops over lockrun, and its INT trap runs,
/// as with a plain command (the script has no job control).
#[test]
fn ctrl_c_runs_the_trap_of_a_script_looping_over_lockrun() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut pty = Pty::bash(&format!(
        "trap 'echo trapped; exit 7' INT; for i in 1 2 3; do \
         lockrun --url {url} loop -- sh -c 'echo ready; exec sleep 30'; echo iteration-$i; done"
    ));
    pty.expect("ready", LONG);
    pty.type_(b"\x03");
    let st = pty.finish(LONG);
    assert!(pty.seen.contains("trapped"), "{}", pty.seen);
    assert!(!pty.seen.contains("iteration-1"), "{}", pty.seen);
    assert_eq!(st.code(), Some(7), "{}", pty.seen);
}

/// Whatever descriptor limit lockrun runs under, it either refuses before the
/// job starts or keeps the lease until nothing of the job is left.
#[test]
fn exhausted_descriptors_never_release_a_live_job() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    // Wide enough for whatever descriptors the test runner passes down: the
    // limit that lets the job start but not the watchdog must be in range.
    let mut started = 0;
    for n in 8..=24 {
        let name = format!("fd{n}");
        let pidfile = format!("{d}/bg{n}");
        let script = format!("sleep 30 & echo $! > {pidfile}; sleep 0.8");
        let out = run(std::process::Command::new("sh").arg("-c").arg(format!(
            "ulimit -n {n}; exec {BIN} --url {} --ttl 1500ms {name} -c '{script}'",
            redis.url()
        )));
        let code = out.status.code();
        let bg: i32 = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0);
        if bg > 0 {
            started += 1;
            let was_alive = alive(bg);
            if was_alive {
                signal(bg, libc::SIGKILL);
            }
            assert!(
                !was_alive,
                "ulimit -n {n}: lockrun exited {code:?} with a process of the job alive: {}",
                text(&out.stderr)
            );
        }
        assert!(
            matches!(code, Some(0) | Some(69) | Some(70) | Some(76)),
            "ulimit -n {n}: exit {code:?}: {}",
            text(&out.stderr)
        );
    }
    // Not a test of refusals alone: some limits let the job start.
    assert!(started > 0, "no limit from 8 to 24 let the job start");
}

/// `kill -9` of lockrun at a descriptor limit: the guard still finds and
/// kills every process of the job.
#[test]
fn kill_9_at_a_descriptor_limit_still_kills_everything() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    let mut tried = 0;
    for n in 8..=14 {
        let _ = std::fs::remove_file(scratch.path("a"));
        let _ = std::fs::remove_file(scratch.path("b"));
        let mut lr = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit -n {n}; exec {BIN} --url {} k9fd{n} -c 'sleep 100 & echo $! > {d}/a; setsid sleep 100 & echo $! > {d}/b; wait'",
                redis.url()
            ))
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut exited = false;
        let started = wait_until(Duration::from_secs(5), || {
            exited = exited || lr.try_wait().unwrap().is_some();
            exited
                || (scratch.read("a").trim().parse::<i32>().is_ok()
                    && scratch.read("b").trim().parse::<i32>().is_ok())
        }) && !exited;
        if !started {
            // Refused before the job started at this limit.
            wait_child(&mut lr, LONG);
            continue;
        }
        tried += 1;
        let pids = [scratch.pid_in("a"), scratch.pid_in("b")];
        signal(lr.id() as i32, libc::SIGKILL);
        let _ = lr.wait();
        let dead = wait_until(Duration::from_secs(2), || pids.iter().all(|&p| !alive(p)));
        for &p in &pids {
            if alive(p) {
                signal(p, libc::SIGKILL);
            }
        }
        assert!(dead, "ulimit -n {n}: processes of the job outlived lockrun");
    }
    assert!(tried > 0, "no limit let the job start");
}

/// `kill -9` of lockrun (CI cancellation, the OOM killer) kills every process
/// of the job: background children, and processes in other groups and sessions.
#[test]
fn kill_9_of_lockrun_kills_every_process_of_the_job() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    let script = format!(
        "sleep 100 & echo $! > {d}/a; setsid sleep 100 & echo $! > {d}/b; \
         (set -m; sleep 100 & echo $! > {d}/c; wait) & \
         (sh -c 'sleep 100 & echo $! > {d}/d' &); echo $$ > {d}/pid; wait"
    );
    let mut lr = lockrun()
        .args(["--url", &redis.url(), "k9", "-c", &script])
        .spawn()
        .unwrap();
    let pids: Vec<i32> = ["a", "b", "c", "d", "pid"]
        .iter()
        .map(|f| scratch.pid_in(f))
        .collect();
    signal(lr.id() as i32, libc::SIGKILL);
    let _ = lr.wait();
    let died = Instant::now();
    let all_dead = wait_until(Duration::from_secs(5), || pids.iter().all(|&p| !alive(p)));
    let left: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &left {
        signal(p, libc::SIGKILL);
    }
    assert!(all_dead, "processes {left:?} outlived a SIGKILLed lockrun");
    assert!(
        died.elapsed() < Duration::from_secs(1),
        "took {:?}",
        died.elapsed()
    );
}

/// On loss, a process in another process group gets SIGTERM (and can clean
/// up) before SIGKILL, even when the job's main process ignores SIGTERM.
#[test]
fn on_loss_every_process_gets_sigterm_first() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let log = scratch.path("log");
    let log = log.display();
    let script = format!(
        "trap '' TERM; \
         setsid perl -e '$SIG{{TERM}} = sub {{ open my $f, \">>\", \"{log}\"; print $f \"worker got TERM\\n\"; close $f; exit 0 }}; \
                  open my $f, \">>\", \"{log}\"; print $f \"ready\\n\"; close $f; sleep 1 while 1' & \
         echo $$ > {d}/pid; wait; sleep 100",
        d = scratch.dir.path().display()
    );
    let mut lr = lockrun()
        .args([
            "--url",
            &redis.url(),
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "grp",
            "-c",
        ])
        .arg(&script)
        .spawn()
        .unwrap();
    assert!(wait_until(LONG, || scratch.read("log").contains("ready")));
    let _: () = redis.cmd(&["DEL", "lockrun:{grp}"]);
    let st = wait_child(&mut lr, LONG);
    assert_eq!(st.code(), Some(76));
    assert!(
        scratch.read("log").contains("worker got TERM"),
        "the worker in its own group was killed without SIGTERM: {}",
        scratch.read("log")
    );
}

/// A SIGSTOP sent to the job by another process is not Ctrl-Z: lockrun keeps
/// running and renewing, at a terminal too.
#[test]
fn sigstop_from_elsewhere_does_not_suspend_lockrun() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    let mut pty = Pty::bash(&format!(
        "set -m; lockrun --url {} --ttl 2s st -c 'echo $$ > {d}/pid; echo ${{LOCKRUN_OWNER##*:}} > {d}/lr; echo ready; sleep 5'; echo rc=$?",
        redis.url()
    ));
    pty.expect("ready", LONG);
    let job = scratch.pid_in("pid");
    let lr = scratch.pid_in("lr");
    signal(job, libc::SIGSTOP);
    // Longer than the ttl: without renewals the lease would be gone.
    std::thread::sleep(Duration::from_millis(3000));
    assert_ne!(state_of(lr), Some('T'), "lockrun was suspended");
    assert!(key_exists(&redis, "st"), "the lease must still be renewed");
    signal(job, libc::SIGCONT);
    let seen = pty.expect("rc=", LONG);
    assert!(seen.contains("rc=0"), "{seen}");
}

/// With stderr closed, -v lines must not go into the Redis connection.
#[test]
fn a_closed_stderr_is_not_reused_for_the_redis_connection() {
    let redis = Redis::start();
    let out = run(std::process::Command::new("sh").arg("-c").arg(format!(
        "exec {BIN} -v --url {} fd2 -- true 2>&-",
        redis.url()
    )));
    assert_eq!(out.status.code(), Some(0));
    assert!(!key_exists(&redis, "fd2"), "the lease must be released");
}

/// With stdout closed when lockrun starts, the job's output must not land in
/// lockrun's own files (the local lock file's token record).
#[test]
fn a_closed_stdout_is_not_reused_for_the_lock_file() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let out = run(std::process::Command::new("sh").arg("-c").arg(format!(
        "exec {BIN} --url {url} fd -- sh -c 'echo XXXXXXXXXXXXXXXXXXXXXXXX' >&-"
    )));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let record = std::fs::read_to_string(scratch.path("locks").join("fd.lock")).unwrap();
    assert!(
        record.starts_with("token="),
        "record overwritten: {record:?}"
    );
}
