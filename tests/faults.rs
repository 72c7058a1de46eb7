//! Faults found by users, operators and attackers: whatever happens to the
//! network, to lockrun or to its descriptors, nothing of the job outlives
//! its lease.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

const LONG: Duration = Duration::from_secs(20);

fn key_exists(redis: &Redis, name: &str) -> bool {
    let n: i64 = redis.cmd(&["EXISTS", &format!("lockrun:{{{name}}}")]);
    n == 1
}

/// A renewal whose reply trickles in must not hold up the kill: the job is
/// stopped on the loss schedule, not when the renewal finally returns.
#[test]
fn a_trickling_server_cannot_hold_up_the_kill() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let scratch = Scratch::new();
    let mut lr = hold(Some(&proxy.url()), "slow", "3s", &scratch);
    let job = scratch.pid_in("pid");
    proxy.trickle();
    let since = Instant::now();
    let died = wait_until(Duration::from_secs(60), || !alive(job));
    let took = since.elapsed();
    assert!(died);
    // The lease (3 s, counted from the last renewal before the trickle) is
    // over by then; lockrun must have acted within it, not ~30 s later.
    assert!(took < Duration::from_secs(3), "the job ran on for {took:?}");
    // The release goes through the same slow link; it may take a while.
    let st = wait_child(&mut lr, Duration::from_secs(90));
    assert_eq!(st.code(), Some(76));
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

/// A name server that stops answering (here: /etc/hosts turned into a FIFO
/// nobody writes, in a private mount namespace) must not hold up the kill:
/// renewals stall in name resolution, and the job still dies before the lease
/// can expire on the server.
#[test]
fn stalled_name_resolution_cannot_hold_up_the_kill() {
    if !is_root() {
        panic!("this test makes a private mount namespace and needs root");
    }
    for tool in ["unshare", "nsenter", "mount"] {
        if std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_err()
        {
            panic!(
                "{tool} not found: this test needs util-linux (apt-get install -y util-linux mount)"
            );
        }
    }
    let redis = Redis::start();
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    let fifo = scratch.path("hosts-fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let mut lr = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "echo $$ > {d}/ns; exec {BIN} --url redis://localhost:{} --ttl 3s dns -c 'echo $$ > {d}/pid; exec sleep 60'",
            redis.port
        ))
        .spawn()
        .unwrap();
    let ns = scratch.pid_in("ns");
    let job = scratch.pid_in("pid");
    // From now on, resolving "localhost" blocks in lockrun's namespace.
    let bound = std::process::Command::new("nsenter")
        .args(["-t", &ns.to_string(), "-m", "mount", "--bind"])
        .arg(&fifo)
        .arg("/etc/hosts")
        .status()
        .unwrap();
    assert!(bound.success(), "could not bind the FIFO over /etc/hosts");
    let pttl: i64 = redis.cmd(&["PTTL", "lockrun:{dns}"]);
    assert!(pttl > 0);
    let expires_at = Instant::now() + Duration::from_millis(pttl as u64);
    let died = wait_until(Duration::from_secs(30), || !alive(job));
    let seen = Instant::now();
    assert!(died, "the job never stopped");
    assert!(
        seen <= expires_at + Duration::from_millis(50),
        "the job outlived its lease by {:?}",
        seen - expires_at
    );
    // lockrun's release gives up on the stalled resolver within its bound.
    let st = wait_child(&mut lr, Duration::from_secs(30));
    assert_eq!(st.code(), Some(76));
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

/// A server whose replies trickle in (one byte every 0.3 s) once the job has
/// run: the job ends on its own, and lockrun exits within about one request's
/// budget of that, saying that the release did not complete, rather than
/// hanging in its final release for as long as the server takes. `status`
/// over the same link is bounded the same way.
#[test]
fn a_trickling_server_cannot_hold_up_the_end_of_a_run() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let scratch = Scratch::new();
    let d = scratch.dir.path().display();
    // ttl 6s: one request's budget (op) is 1 s, the first renewal is 2 s in.
    let lr = on(&proxy.url())
        .args(["--ttl", "6s", "drip", "-c"])
        .arg(format!("echo $$ > {d}/pid; sleep 1"))
        .stderr(Stdio::piped())
        .spawn();
    scratch.pid_in("pid");
    proxy.trickle();
    let since = Instant::now();
    let out = lr.wait_with_output().unwrap();
    let took = since.elapsed();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        took < Duration::from_secs(4),
        "lockrun took {took:?} to end after its job"
    );
    assert!(err.contains("expires on its own"), "{err}");
    let since = Instant::now();
    let out = run(on(&proxy.url()).args(["status", "drip"]));
    assert!(
        since.elapsed() < Duration::from_secs(6),
        "status took {:?}",
        since.elapsed()
    );
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
}

/// A TCP server on loopback that answers whatever it reads with `reply`
/// (an HTTP server, say, where Redis was expected); it lives as long as
/// the test binary.
fn junk_server(reply: &'static [u8]) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(reply).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// Something other than Redis at the address, whichever way it is reached:
/// one line, 69, no job.
#[test]
fn a_garbage_reply_is_one_line_and_69() {
    let scratch = Scratch::new();
    let marker = scratch.path("ran");
    let job = format!("touch {}", marker.display());
    let http = junk_server(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    let noise = junk_server(b"\xc8\xc9\xca\xff\x00\x01\r\n-\r\n*9\r\n\xfe\xfd");
    for port in [http, noise] {
        for url in [
            format!("redis://127.0.0.1:{port}"),
            format!("redis+sentinel://127.0.0.1:{port}/m"),
            format!("redis+cluster://127.0.0.1:{port}"),
        ] {
            for args in [vec!["--ttl", "3s", "g", "-c", &job], vec!["status", "g"]] {
                let ran = on(&url).args(&args).code(69);
                let err = ran.stderr();
                assert_eq!(err.trim().lines().count(), 1, "{url} {args:?}: {err}");
                assert!(err.contains("not Redis"), "{url} {args:?}: {err}");
            }
            let out = on(&url).arg("doctor").code(69).stdout();
            assert!(out.starts_with("fail"), "{url} doctor: {out}");
            assert!(!out.contains("allow"), "{url} doctor: {out}");
        }
    }
    assert!(!marker.exists(), "a job ran without a lease");
}
