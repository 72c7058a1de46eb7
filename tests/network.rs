//! The network at fault: a server that trickles its replies or answers
//! garbage, name resolution that stalls, a closed port. Whatever happens,
//! the job ends on the lease's schedule and lockrun says one line.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

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

/// A name server that stops answering (here: /etc/hosts turned into a FIFO
/// nobody writes, in a private mount namespace) must not hold up the kill:
/// once the server cuts lockrun's connections, renewals stall in name
/// resolution (a renewal borrows the lease's connection while it lives, so
/// it is cut first), and the job still dies before the lease can expire on
/// the server.
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
    // Every connection of lockrun's goes: the next renewal resolves the
    // name again.
    let cut: i64 = redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(cut > 0, "lockrun had no connection to cut");
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

#[test]
fn closed_port_is_unavailable_quickly() {
    let port = free_port();
    let start = Instant::now();
    let out = run(lockrun().args(["--url", &format!("redis://127.0.0.1:{port}"), "x", "true"]));
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(text(&out.stderr).lines().count(), 1);
}
