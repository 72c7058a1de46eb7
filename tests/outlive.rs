//! Jobs that try to outlive their lease: trees of thousands of processes that
//! ignore SIGTERM in many groups and sessions, a pid recycled by an unrelated
//! process, a job that reopens lockrun's descriptors to disarm its guard.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use crate::support::*;

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
            my $end = time + 60; sleep 0.001 while kill(0, $v) && time < $end;
            sub last_pid {{ open my $n, '>', '/proc/sys/kernel/ns_last_pid' or die; print $n $_[0]; close $n }}
            last_pid($v - 1);
            my $u = fork // die;
            if (!$u) {{
              last_pid(20000);
              my $w = fork // die;
              if (!$w) {{ sleep 1000 while 1 }}
              open my $o, '>', "{d}/U"; print $o "$$ $w\n"; close $o;
              waitpid($w, 0);
              open my $r, '>', "{d}/W-signalled"; print $r ($? & 127), "\n"; close $r;
              exit 0;
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
