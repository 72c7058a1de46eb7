//! Attacks on the ZooKeeper engine: races, pauses, expiries, odd input and
//! secrets: each test says what it protects against.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// A fresh chroot on the shared server: its URL, port and chroot.
pub(crate) fn chroot_url() -> (String, u16, String) {
    let (port, chroot) = zk_chroot();
    (format!("zk://127.0.0.1:{port}{chroot}"), port, chroot)
}

/// A job that writes its pid to `pid` and runs until `go` exists.
pub(crate) fn gated_job(scratch: &Scratch, pid: &str, go: &str) -> String {
    format!(
        "echo $$ > {}; while [ ! -e {} ]; do sleep 0.05; done",
        scratch.path(pid).display(),
        scratch.path(go).display()
    )
}

/// A job that notes whether the process in the file `other` is still alive
/// when it starts (`beside` or `alone` in `seen`), and when it started.
pub(crate) fn checking_job(scratch: &Scratch, other: &str, seen: &str) -> String {
    format!(
        "if kill -0 $(cat {o}) 2>/dev/null; then echo beside > {s}; else echo alone > {s}; fi; \
         date +%s%N > {s}.at",
        o = scratch.path(other).display(),
        s = scratch.path(seen).display()
    )
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A standalone server of our own with `extra` lines in its configuration
/// (and without the support's min/max session timeouts and TTL nodes).
struct OwnServer {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl OwnServer {
    fn start(extra: &str) -> OwnServer {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let port = free_port();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let cfg = dir.path().join("zoo.cfg");
        std::fs::write(
            &cfg,
            format!(
                "tickTime=200\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n{extra}",
                data.display()
            ),
        )
        .unwrap();
        let child = Command::new("java")
            .args([
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Dznode.container.checkIntervalMs=500",
                "-Dzookeeper.admin.enableServer=false",
                "-cp",
                "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar",
                "org.apache.zookeeper.server.ZooKeeperServerMain",
            ])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ZooKeeper");
        let s = OwnServer {
            port,
            child,
            _dir: dir,
        };
        // Serving: lockrun reads a name on it (4lw may be off).
        let url = s.url();
        assert!(
            wait_until(Duration::from_secs(60), || {
                matches!(
                    on(&url)
                        .args(["status", "probe"])
                        .output()
                        .out
                        .status
                        .code(),
                    Some(0 | 1)
                )
            }),
            "own ZooKeeper did not come up"
        );
        s
    }

    fn url(&self) -> String {
        format!("zk://127.0.0.1:{}", self.port)
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn lockrun_nodes(port: u16, chroot: &str) -> Vec<(String, i64)> {
    zk_tree(port, Some(chroot))
}

// ---------------------------------------------------------------------
// Queue and session attacks
// ---------------------------------------------------------------------

/// A waiter whose lockrun is stopped past its session timeout loses its
/// session and its place; resumed, it takes a new session and a new place
/// and never runs beside the holder that took the name meanwhile.
#[test]
fn a_waiter_whose_session_expired_requeues_and_never_runs_beside_the_holder() {
    let (url, _, _) = chroot_url();
    let scratch = Scratch::new();
    let first = Reap(
        on(&url)
            .args(["--ttl", "6s", "wx", "-c"])
            .arg(gated_job(&scratch, "apid", "goa"))
            .spawn(),
    );
    scratch.pid_in("apid");
    let waiter = on(&url)
        .args(["--ttl", "1500ms", "-w", "120", "wx", "-c"])
        .arg(checking_job(&scratch, "bpid", "seen"))
        .spawn();
    let wpid = waiter.id() as i32;
    let waiter = Reap(waiter);
    wait_queued(&url, "wx", 1);
    signal(wpid, libc::SIGSTOP);
    // The first holder leaves and another takes the name while the waiter
    // is stopped (its session expires meanwhile).
    std::fs::write(scratch.path("goa"), "").unwrap();
    let second = Reap(
        on(&url)
            .args(["--ttl", "6s", "-w", "30", "wx", "-c"])
            .arg(gated_job(&scratch, "bpid", "gob"))
            .spawn(),
    );
    scratch.pid_in("bpid");
    std::thread::sleep(Duration::from_secs(4));
    signal(wpid, libc::SIGCONT);
    // Resumed: it must queue again behind the second holder.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let v = status_json(&url, "wx");
            v["waiters"].as_u64() == Some(1)
        }),
        "the resumed waiter is not queued: {}",
        status_json(&url, "wx")
    );
    assert!(!scratch.exists("seen"), "the waiter ran beside the holder");
    std::fs::write(scratch.path("gob"), "").unwrap();
    let released = now_ns();
    let mut w = waiter;
    let code = wait_child(&mut w.0, Duration::from_secs(60)).code();
    drop((first, second));
    assert_eq!(code, Some(0));
    assert_eq!(scratch.read("seen").trim(), "alone");
    let at: u128 = scratch.read("seen.at").trim().parse().unwrap();
    let waited = Duration::from_nanos((at - released) as u64);
    assert!(waited < Duration::from_secs(5), "hand-off took {waited:?}");
}

/// The holder's lockrun stopped past its session timeout, then continued:
/// the next holder gets the name once the session expired (a pause of
/// lockrun is the case the guarantees leave out), and the continued
/// lockrun stops its job at once and exits 76.
#[test]
fn a_stopped_holder_lockrun_continued_stops_its_job_at_once() {
    let (url, _, _) = chroot_url();
    let scratch = Scratch::new();
    let holder = on(&url)
        .args(["--ttl", "2s", "sh1", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("hpid").display()
        ))
        .spawn();
    let hpid = holder.id() as i32;
    let mut holder = Reap(holder);
    let job = scratch.pid_in("hpid");
    signal(hpid, libc::SIGSTOP);
    let next = on(&url)
        .args(["--ttl", "2s", "-w", "60", "sh1", "-c"])
        .arg(checking_job(&scratch, "hpid", "seen"))
        .spawn();
    let (code, err) = exited(next, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    let overlap = scratch.read("seen");
    signal(hpid, libc::SIGCONT);
    let cont = Instant::now();
    let code = wait_child(&mut holder.0, Duration::from_secs(30)).code();
    let took = cont.elapsed();
    assert_eq!(code, Some(76));
    assert!(!alive(job), "the job outlived its lease");
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after SIGCONT"
    );
    eprintln!("next holder found the paused holder's job: {overlap}");
}

/// Lockruns killed with SIGKILL at random points of their acquire: what
/// they made lives for their session, then the name is free and nothing
/// is left behind.
#[test]
fn kill_9_during_acquire_leaves_nothing_that_blocks_for_long() {
    let (url, port, chroot) = chroot_url();
    let scratch = Scratch::new();
    // Many acquires killed at random points of their run.
    for i in 0..6 {
        let c = on(&url)
            .args(["--ttl", "1500ms", &format!("k9-{i}"), "true"])
            .spawn();
        std::thread::sleep(Duration::from_millis(20 + 30 * i));
        signal(c.id() as i32, libc::SIGKILL);
        let mut c = c;
        let _ = c.wait();
    }
    for i in 0..6 {
        on(&url)
            .args(["-w", "20", &format!("k9-{i}"), "true"])
            .succeeds();
    }
    // Everything goes: the sessions' nodes, then the containers.
    assert!(
        wait_until(Duration::from_secs(30), || lockrun_nodes(port, &chroot)
            .iter()
            .all(|(p, _)| !p.contains("/q-") && !p.contains("/s-"))),
        "{:?}",
        lockrun_nodes(port, &chroot)
    );
    drop(scratch);
}

/// Many lockruns on one name at once, each with a short job, while the
/// server removes the name's container as it empties: no two jobs overlap,
/// every one runs, tokens increase, and nothing is left.
#[test]
fn container_removal_racing_new_requests() {
    let (url, port, chroot) = chroot_url();
    let scratch = Scratch::new();
    let log = scratch.path("log");
    let job = format!(
        "echo start $LOCKRUN_TOKEN >> {l}; sleep 0.02; echo end $LOCKRUN_TOKEN >> {l}",
        l = log.display()
    );
    let mut kids = Vec::new();
    for round in 0..4 {
        for _ in 0..6 {
            kids.push(
                on(&url)
                    .args(["--ttl", "3s", "-w", "60", "race", "-c", &job])
                    .stderr(Stdio::piped())
                    .spawn(),
            );
        }
        // Let the name empty and its container go between rounds.
        std::thread::sleep(Duration::from_millis(300 + 200 * round));
    }
    for k in kids {
        let (code, err) = exited(k, Duration::from_secs(90));
        assert_eq!(code, Some(0), "{err}");
    }
    // Jobs ran one at a time (tokens in the log's order need not grow
    // across the whole run, but each start is followed by its own end).
    let text = scratch.read("log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 48);
    for pair in lines.chunks(2) {
        let a = pair[0].strip_prefix("start ").unwrap();
        let b = pair[1].strip_prefix("end ").unwrap();
        assert_eq!(a, b, "two jobs overlapped: {pair:?}");
    }
    let mut tokens: Vec<u64> = lines
        .iter()
        .step_by(2)
        .map(|l| l[6..].parse().unwrap())
        .collect();
    let in_order = tokens.clone();
    tokens.sort();
    assert_eq!(tokens, in_order, "a token went backwards");
    assert!(
        wait_until(Duration::from_secs(20), || lockrun_nodes(port, &chroot)
            .is_empty()),
        "left behind: {:?}",
        lockrun_nodes(port, &chroot)
    );
}

/// A lost create reply under `--limit` and `-s`: found again, one node,
/// nothing left behind.
#[test]
fn a_lost_create_reply_under_limit_and_shared() {
    let port = shared_zookeeper();
    let (_, chroot) = zk_chroot();
    for mode in [&["--limit", "2"][..], &["-s"][..]] {
        let proxy = ZkProxy::start(port);
        let url = format!("{}{chroot}", proxy.url());
        proxy.lose_next_create();
        let out = on(&url)
            .args(mode)
            .args(["--ttl", "6s", "lostm", "-c", "echo $LOCKRUN_TOKEN"])
            .succeeds();
        assert_eq!(proxy.lost.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(out.stdout().trim().parse::<u64>().unwrap() > 0);
        assert!(
            wait_until(Duration::from_secs(20), || lockrun_nodes(port, &chroot)
                .iter()
                .all(|(p, _)| !p.contains("/q-") && !p.contains("/s-"))),
            "{mode:?}: {:?}",
            lockrun_nodes(port, &chroot)
        );
        on(&url).args(mode).args(["-n", "lostm", "true"]).succeeds();
    }
}

// ---------------------------------------------------------------------
// Operators
// ---------------------------------------------------------------------

/// `release --force --token` of one `--limit` holder stops that one only;
/// a wrong token changes nothing; the revoked slot is not given to a
/// waiter while the revoked job lives.
#[test]
fn release_force_of_one_limit_slot() {
    let (url, _, _) = chroot_url();
    let scratch = Scratch::new();
    let mut holders = Vec::new();
    for who in ["a", "b"] {
        holders.push(Reap(
            on(&url)
                .args(["--ttl", "3s", "--limit", "2", "lim", "-c"])
                .arg(format!(
                    "echo $$ > {}; echo $LOCKRUN_TOKEN > {}; exec sleep 60",
                    scratch.path(&format!("{who}pid")).display(),
                    scratch.path(&format!("{who}tok")).display()
                ))
                .spawn(),
        ));
        scratch.pid_in(&format!("{who}pid"));
    }
    assert!(wait_until(Duration::from_secs(10), || scratch
        .read("atok")
        .ends_with('\n')
        && scratch.read("btok").ends_with('\n')));
    let ta = scratch.read("atok").trim().to_string();
    let apid = scratch.pid_in("apid");
    let bpid = scratch.pid_in("bpid");
    let wrong = on(&url)
        .args(["release", "--force", "--token", "1", "lim"])
        .output();
    assert_ne!(wrong.out.status.code(), Some(0), "{}", wrong.stderr());
    assert!(alive(apid) && alive(bpid));
    let third = on(&url)
        .args(["--ttl", "3s", "--limit", "2", "-w", "60", "lim", "-c"])
        .arg(checking_job(&scratch, "apid", "seen"))
        .spawn();
    wait_queued(&url, "lim", 1);
    on(&url)
        .args(["release", "--force", "--token", &ta, "lim"])
        .succeeds();
    let mut a = holders.remove(0);
    assert_eq!(
        wait_child(&mut a.0, Duration::from_secs(20)).code(),
        Some(76)
    );
    let (code, err) = exited(third, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(scratch.read("seen").trim(), "alone");
    assert!(alive(bpid), "the other holder was disturbed");
}

/// `status` with no name on a big tree: many names (and foreign nodes
/// under the prefix) are listed in bounded time without an error.
#[test]
fn status_without_a_name_on_a_big_tree() {
    let (url, port, chroot) = chroot_url();
    zk_do(port, Some(&chroot), |z| async move {
        let opts = zookeeper_client::CreateMode::Persistent
            .with_acls(zookeeper_client::Acls::anyone_all());
        z.create("/lockrun", b"", &opts).await?;
        for i in 0..400 {
            z.create(&format!("/lockrun/n{i}"), b"", &opts).await?;
        }
        z.create("/lockrun/not.a.name", b"", &opts).await?;
        z.create("/lockrun/n7/q-zz", b"not json", &opts).await?;
        z.create("/lockrun/n8/s-0", b"nobody", &opts).await?;
        Ok(())
    });
    let scratch = Scratch::new();
    let _h = Reap(hold(Some(&url), "n5", "6s", &scratch));
    scratch.pid_in("pid");
    let started = Instant::now();
    let out = on(&url).args(["status"]).output();
    assert_eq!(out.out.status.code(), Some(0), "{}", out.stderr());
    assert!(out.stdout().contains("n5"), "{}", out.stdout());
    assert!(!out.stderr().contains("panick"), "{}", out.stderr());
    assert!(started.elapsed() < Duration::from_secs(30));
    let json = on(&url).args(["status", "--json"]).output();
    assert_eq!(
        json.json().as_array().map(|a| a.len()),
        Some(1),
        "{}",
        json.stdout()
    );
}

// ---------------------------------------------------------------------
// Names, prefixes, chroots
// ---------------------------------------------------------------------

/// Names that could reach each other ("a", "a/b", "a%2Fb", ".", ".."),
/// names ZooKeeper would refuse as they are (control characters, U+FFFF,
/// surrogate-range code points written as UTF-8), unicode and a long name:
/// each is its own lock, and `status` shows each as given.
#[test]
fn names_that_reach_each_other_and_names_zookeeper_forbids() {
    let (url, port, chroot) = chroot_url();
    let scratch = Scratch::new();
    let _h = Reap(hold(Some(&url), "a", "6s", &scratch));
    scratch.pid_in("pid");
    let long = "é".repeat(512);
    for name in [
        "a/b",
        "a%2Fb",
        "%61",
        ".",
        "..",
        "x\u{ffff}y",
        "日本",
        "zookeeper",
        &long,
    ] {
        let out = on(&url)
            .args(["-n", name, "-c", "echo $LOCKRUN_NAME"])
            .output();
        assert_eq!(out.out.status.code(), Some(0), "{name:?}: {}", out.stderr());
        assert_eq!(out.stdout().trim_end_matches('\n'), name);
    }
    on(&url).args(["-n", "a", "true"]).code(75);
    let listed = on(&url).args(["status", "--json"]).output().json();
    assert_eq!(listed.as_array().map(|a| a.len()), Some(1), "{listed}");
    // Every name's container goes with its last request.
    assert!(
        wait_until(Duration::from_secs(20), || lockrun_nodes(port, &chroot)
            .len()
            <= 3),
        "{:?}",
        lockrun_nodes(port, &chroot)
    );
}

/// Prefixes that reach each other: "p" and "p:" are one node; "p/x" and
/// a prefix from the environment that is not a plain node are refused with
/// 64 before anything is contacted.
#[test]
fn prefixes_from_the_command_line_and_the_environment() {
    for bad in ["p/x", "/p", "p:x:", "zookeeper", "", "p x", "é"] {
        let out = on("zk://127.0.0.1:1")
            .env("LOCKRUN_PREFIX", bad)
            .args(["x", "true"])
            .output();
        assert_eq!(out.out.status.code(), Some(64), "{bad:?}: {}", out.stderr());
        let out = on("zk://127.0.0.1:1")
            .args(["--prefix", bad, "x", "true"])
            .output();
        assert_eq!(out.out.status.code(), Some(64), "{bad:?}: {}", out.stderr());
    }
    // "p" and "p:" are the same prefix: a lock under one holds the other
    // (more exclusion, never less).
    let (url, _, _) = chroot_url();
    let scratch = Scratch::new();
    let mut c = lockrun();
    c.args(["--url", &url, "--prefix", "p", "--ttl", "6s", "same", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ));
    let _h = Reap(c.spawn().unwrap());
    scratch.pid_in("pid");
    on(&url)
        .args(["--prefix", "p:", "-n", "same", "true"])
        .code(75);
    on(&url)
        .args(["--prefix", "p.x", "-n", "same", "true"])
        .succeeds();
}

// ---------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------

/// A digest password (with URL-special characters in it) never shows: not
/// in -v logs, status, doctor, errors of an unreachable server, nor the
/// job's environment when the URL came from LOCKRUN_URL.
#[test]
fn the_password_never_shows() {
    let (port, chroot) = zk_chroot();
    let secret = "Zq9%40pw%3Ax";
    let raw = "Zq9@pw:x";
    let url = format!("zk://locker:{secret}@127.0.0.1:{port}{chroot}");
    let check = |what: &str, text: &str| {
        for s in [secret, raw, "Zq9"] {
            assert!(!text.contains(s), "{what} shows the password: {text}");
        }
    };
    let out = lockrun()
        .env("LOCKRUN_URL", &url)
        .args(["-v", "sec", "-c", "env; echo LOCKRUN_TOKEN=$LOCKRUN_TOKEN"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    check("the job's env / -v log", &text(&out.stdout));
    check("the -v log", &text(&out.stderr));
    for args in [
        &["status", "sec"][..],
        &["status"],
        &["status", "--json"],
        &["doctor"],
        &["-v", "release", "--force", "sec"],
    ] {
        let out = on(&url).args(args).output();
        check(&format!("{args:?}"), &out.stdout());
        check(&format!("{args:?}"), &out.stderr());
    }
    let down = format!("zk://locker:{secret}@127.0.0.1:1{chroot}");
    let out = on(&down).args(["-v", "x", "true"]).output();
    check("an unreachable server's error", &out.stderr());
    let bad = format!("zk://locker:{secret}@127.0.0.1:{port}/no such");
    let out = on(&bad).args(["x", "true"]).code(64);
    check("a malformed URL's error", &out.stderr());
}

// ---------------------------------------------------------------------
// Servers configured otherwise
// ---------------------------------------------------------------------

/// A server with its default session bounds (2 and 20 ticks: 400 ms ..
/// 4 s), few four-letter words and no TTL nodes: a ttl above 4 s is 64
/// naming what it accepts; doctor says what it could not check, without a
/// failure; `--min-hold` warns that it keeps no window.
#[test]
fn a_server_with_default_bounds_no_4lw_and_no_ttl_nodes() {
    let zk = OwnServer::start("4lw.commands.whitelist=ruok\n");
    let url = zk.url();
    let out = on(&url).args(["--ttl", "10s", "x", "true"]).code(64);
    let err = out.stderr();
    assert!(
        err.contains("4s"),
        "does not say which ttls it accepts: {err}"
    );
    on(&url).args(["--ttl", "4s", "x", "true"]).succeeds();
    on(&url).args(["--ttl", "1s", "x", "true"]).succeeds();
    let doc = on(&url).args(["doctor"]).output();
    let all = format!("{}{}", doc.stdout(), doc.stderr());
    assert_eq!(doc.out.status.code(), Some(1), "{all}");
    assert!(all.contains("extendedTypesEnabled"), "{all}");
    let out = on(&url)
        .args(["--ttl", "3s", "--min-hold", "5s", "mh", "true"])
        .output();
    assert_eq!(out.out.status.code(), Some(0), "{}", out.stderr());
    assert!(
        out.stderr().contains("extendedTypesEnabled"),
        "{}",
        out.stderr()
    );
}

/// A loopback TCP forwarder that can stall: while stalled nothing passes
/// either way and no connection is closed (a partition, not a crash).
struct Stall {
    port: u16,
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Stall {
    fn start(upstream: u16) -> Stall {
        use std::io::{Read, Write};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let on = Arc::new(AtomicBool::new(false));
        let flag = on.clone();
        std::thread::spawn(move || {
            for a in listener.incoming() {
                let Ok(a) = a else { return };
                let Ok(b) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                for (mut from, mut to) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)]
                {
                    let flag = flag.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 8192];
                        loop {
                            while flag.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            while flag.load(Ordering::SeqCst) {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        while flag.load(Ordering::SeqCst) {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Stall { port, on }
    }

    fn set(&self, on: bool) {
        self.on.store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A three-server ensemble in which server 1 reaches the others' quorum
/// ports through `Stall` forwarders: stalling them cuts server 1 off from
/// the leader while its clients stay connected to it.
struct SplitEnsemble {
    clients: Vec<u16>,
    cut: Vec<Stall>,
    kids: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl SplitEnsemble {
    fn start() -> SplitEnsemble {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let ports: Vec<(u16, u16, u16)> = (0..3)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let cut: Vec<Stall> = ports[1..].iter().map(|p| Stall::start(p.1)).collect();
        let mut kids = Vec::new();
        for i in 0..3 {
            let d = dir.path().join(format!("s{}", i + 1));
            std::fs::create_dir_all(d.join("data")).unwrap();
            std::fs::write(d.join("data/myid"), format!("{}\n", i + 1)).unwrap();
            let mut peers = String::new();
            for (j, (_, q, e)) in ports.iter().enumerate() {
                // Server 1 sees servers 2 and 3 through the forwarders.
                let q = if i == 0 && j > 0 { cut[j - 1].port } else { *q };
                peers.push_str(&format!("server.{}=127.0.0.1:{q}:{e}\n", j + 1));
            }
            let cfg = d.join("zoo.cfg");
            std::fs::write(
                &cfg,
                format!(
                    "tickTime=200\ninitLimit=50\nsyncLimit=25\ndataDir={}\nclientPort={}\n\
                     clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
                     minSessionTimeout=1000\nmaxSessionTimeout=120000\n\
                     4lw.commands.whitelist=*\n{peers}",
                    d.join("data").display(),
                    ports[i].0
                ),
            )
            .unwrap();
            kids.push(
                Command::new("java")
                    .args([
                        "-Xmx128m",
                        "-XX:+UseSerialGC",
                        "-XX:TieredStopAtLevel=1",
                        "-Dzookeeper.admin.enableServer=false",
                        "-cp",
                        "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar",
                        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    ])
                    .arg(&cfg)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start ZooKeeper"),
            );
        }
        let s = SplitEnsemble {
            clients: ports.iter().map(|p| p.0).collect(),
            cut,
            kids,
            _dir: dir,
        };
        for &p in &s.clients {
            assert!(
                wait_until(Duration::from_secs(90), || four_letters(p, "srvr")
                    .is_some_and(
                        |t| t.contains("Mode: leader") || t.contains("Mode: follower")
                    )),
                "an ensemble server did not come up"
            );
        }
        s
    }

    fn mode(&self, i: usize) -> String {
        four_letters(self.clients[i], "srvr")
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("Mode: ").map(String::from))
            })
            .unwrap_or_default()
    }

    fn url(&self, which: &[usize]) -> String {
        let hosts: Vec<String> = which
            .iter()
            .map(|&i| format!("127.0.0.1:{}", self.clients[i]))
            .collect();
        format!("zk://{}", hosts.join(","))
    }
}

impl Drop for SplitEnsemble {
    fn drop(&mut self) {
        for c in &self.cut {
            c.set(false);
        }
        for k in &mut self.kids {
            let _ = k.kill();
            let _ = k.wait();
        }
    }
}

/// A holder connected to a follower that is cut off from the leader (the
/// client's own link is fine): the follower answers reads from its stale
/// copy until it notices the leader is gone (syncLimit ticks, here 5 s),
/// while the leader expires the holder's session after its timeout (2 s)
/// and grants the name to a waiter on another server. Protects against
/// renewals that are only reads: a renewal must be answered through the
/// leader, or the two jobs run at once.
#[test]
fn a_holder_on_a_follower_cut_off_from_the_leader_stops_before_the_next_runs() {
    let _heavy = heavy();
    let ens = SplitEnsemble::start();
    if ens.mode(0) != "follower" {
        eprintln!(
            "server 1 leads ({}); the cut needs it to follow: not run",
            ens.mode(0)
        );
        return;
    }
    let scratch = Scratch::new();
    let holder = on(&ens.url(&[0]))
        .args(["--ttl", "2s", "split", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("hpid").display()
        ))
        .stderr(Stdio::piped())
        .spawn();
    let holder_pid = holder.id() as i32;
    let job = scratch.pid_in("hpid");
    let other = ens.url(&[1, 2]);
    let waiter = on(&other)
        .args(["--ttl", "2s", "-w", "60", "split", "-c"])
        .arg(checking_job(&scratch, "hpid", "seen"))
        .stderr(Stdio::piped())
        .spawn();
    wait_queued(&other, "split", 1);
    for c in &ens.cut {
        c.set(true);
    }
    let cut = now_ns();
    let (code, err) = exited(waiter, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    let at: u128 = scratch.read("seen.at").trim().parse().unwrap();
    let seen = scratch.read("seen");
    let (hcode, herr) = exited(holder, Duration::from_secs(60));
    let holder_gone = now_ns();
    let _ = holder_pid;
    for c in &ens.cut {
        c.set(false);
    }
    assert!(
        seen.trim() == "alone",
        "the waiter ran {:?} after the cut while the cut-off holder's job {job} was alive; \
         the holder's lockrun ended {:?} after the cut (two jobs at once for {:?}); \
         holder exited {hcode:?}: {herr}",
        Duration::from_nanos((at - cut) as u64),
        Duration::from_nanos((holder_gone - cut) as u64),
        Duration::from_nanos(holder_gone.saturating_sub(at) as u64),
    );
}

/// A waiter whose connection stalls for 4 s (a short partition, well
/// within its 9 s session) while the holder leaves. Protects against a
/// waiter that gives up on the client's "no response from connection"
/// (transient) and one that sleeps on after its link is back, having
/// missed the release: it runs promptly once reconnected.
#[test]
fn a_waiter_that_missed_the_release_in_a_partition_is_woken_promptly() {
    let port = shared_zookeeper();
    let (_, chroot) = zk_chroot();
    let direct = format!("zk://127.0.0.1:{port}{chroot}");
    let proxy = ZkProxy::start(port);
    let via = format!("{}{chroot}", proxy.url());
    let scratch = Scratch::new();
    let holder = Reap(
        on(&direct)
            .args(["--ttl", "6s", "miss", "-c"])
            .arg(gated_job(&scratch, "hpid", "go"))
            .spawn(),
    );
    scratch.pid_in("hpid");
    let waiter = on(&via)
        .args(["--ttl", "9s", "-w", "120", "miss", "-c"])
        .arg(checking_job(&scratch, "hpid", "seen"))
        .stderr(Stdio::piped())
        .spawn();
    wait_queued(&direct, "miss", 1);
    proxy.set_stall(true);
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(scratch.path("go"), "").unwrap();
    std::thread::sleep(Duration::from_secs(4));
    proxy.set_stall(false);
    let back = now_ns();
    let (code, err) = exited(waiter, Duration::from_secs(90));
    drop(holder);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(scratch.read("seen").trim(), "alone");
    let at: u128 = scratch.read("seen.at").trim().parse().unwrap();
    let waited = Duration::from_nanos(at.saturating_sub(back) as u64);
    assert!(
        waited < Duration::from_secs(5),
        "the waiter ran {waited:?} after its link came back (the name was free all along)"
    );
}

/// The server paused around the first renewal (ttl/3) for less than the
/// session timeout. Protects against a waiter (-w 60) that gives up on the
/// client's "no response from connection" (transient): it waits on; the
/// holder may keep its lease or stop with 76, and the waiter never runs
/// beside it.
#[test]
fn a_server_paused_around_the_first_renewal() {
    let zk = Zookeeper::start();
    let url = zk.url();
    for pause_ms in [900u64, 1200, 1500, 1900, 2300] {
        let scratch = Scratch::new();
        let name = format!("p{pause_ms}");
        let holder = on(&url)
            .args(["--ttl", "3s", &name, "-c"])
            .arg(format!(
                "echo $$ > {}; sleep 4",
                scratch.path("hpid").display()
            ))
            .stderr(Stdio::piped())
            .spawn();
        scratch.pid_in("hpid");
        let waiter = on(&url)
            .args(["--ttl", "3s", "-w", "60", &name, "-c"])
            .arg(checking_job(&scratch, "hpid", "seen"))
            .stderr(Stdio::piped())
            .spawn();
        wait_queued(&url, &name, 1);
        // The first renewal is due 1 s after the grant.
        zk.server.pause();
        std::thread::sleep(Duration::from_millis(pause_ms));
        zk.server.resume();
        let (code, err) = exited(holder, Duration::from_secs(60));
        assert!(matches!(code, Some(0 | 76)), "{pause_ms}: {code:?}: {err}");
        let (code, err) = exited(waiter, Duration::from_secs(60));
        assert_eq!(code, Some(0), "{pause_ms}: {err}");
        assert_eq!(scratch.read("seen").trim(), "alone", "{pause_ms}");
    }
}

/// A server silent for longer than the client's connection bound
/// (op = min(ttl/6, 2 s)) but far shorter than the session, a few times,
/// like stop-the-world pauses of its JVM. Protects against a waiter with
/// `-w 60` that gives up when a read is in flight as the client drops the
/// connection ("no response from connection in …" is transient).
#[test]
fn a_waiter_rides_out_a_short_server_pause() {
    let zk = Zookeeper::start();
    let url = zk.url();
    let scratch = Scratch::new();
    let holder = Reap(
        on(&url)
            .args(["--ttl", "20s", "gc", "-c"])
            .arg(gated_job(&scratch, "hpid", "go"))
            .spawn(),
    );
    scratch.pid_in("hpid");
    let waiter = on(&url)
        .args(["--ttl", "6s", "-w", "60", "gc", "-c"])
        .arg(checking_job(&scratch, "hpid", "seen"))
        .stderr(Stdio::piped())
        .spawn();
    wait_queued(&url, "gc", 1);
    // Like stop-the-world pauses of the server's JVM.
    for ms in [1500u64, 1200, 1700, 1300] {
        zk.server.pause();
        std::thread::sleep(Duration::from_millis(ms));
        zk.server.resume();
        std::thread::sleep(Duration::from_millis(400));
    }
    std::fs::write(scratch.path("go"), "").unwrap();
    let (code, err) = exited(waiter, Duration::from_secs(60));
    drop(holder);
    assert_eq!(code, Some(0), "a waiter gave up on a 1.5 s pause: {err}");
    assert_eq!(scratch.read("seen").trim(), "alone");
}

/// A holder whose server is silent a little longer than the client's
/// connection bound (1 s) but far shorter than its session (6 s), three
/// times at different phases of its renewal period, keeps its lease.
#[test]
fn a_holder_keeps_its_lease_through_a_short_server_pause() {
    let zk = Zookeeper::start();
    let url = zk.url();
    let scratch = Scratch::new();
    let holder = on(&url)
        .args(["--ttl", "6s", "keep", "-c"])
        .arg(format!(
            "echo $$ > {}; sleep 12",
            scratch.path("hpid").display()
        ))
        .stderr(Stdio::piped())
        .spawn();
    scratch.pid_in("hpid");
    // Three pauses of 1.3 s (the connection bound is 1 s, the session 6 s),
    // at different phases of the 2 s renewal period.
    for gap in [300u64, 700, 1100] {
        std::thread::sleep(Duration::from_millis(gap));
        zk.server.pause();
        std::thread::sleep(Duration::from_millis(1300));
        zk.server.resume();
    }
    let (code, err) = exited(holder, Duration::from_secs(60));
    assert_eq!(
        code,
        Some(0),
        "the lease was lost to a 1.3 s pause of a 6 s session: {err}"
    );
}

/// The index of the server (of `among`) where a client session is
/// connected now, by `cons`.
fn connected_on(ens: &SplitEnsemble, among: &[usize]) -> Option<usize> {
    among
        .iter()
        .copied()
        .find(|&i| four_letters(ens.clients[i], "cons").is_some_and(|t| t.contains("sid=0x")))
}

/// The follower a holder and a waiter are connected to is killed: both
/// move their sessions to the other follower within the session timeout;
/// the holder keeps its lease (its job ends on its own, 0) and the waiter
/// runs after it. A connection that breaks is a transient loss.
#[test]
fn the_follower_under_a_holder_and_a_waiter_dies() {
    let _heavy = heavy();
    let mut ens = SplitEnsemble::start();
    let followers: Vec<usize> = (0..3).filter(|&i| ens.mode(i) == "follower").collect();
    assert_eq!(followers.len(), 2);
    let url = ens.url(&followers);
    let scratch = Scratch::new();
    let holder = on(&url)
        .args(["--ttl", "6s", "fd", "-c"])
        .arg(format!(
            "echo $$ > {}; sleep 8",
            scratch.path("hpid").display()
        ))
        .stderr(Stdio::piped())
        .spawn();
    scratch.pid_in("hpid");
    let waiter = on(&url)
        .args(["--ttl", "6s", "-w", "60", "fd", "-c"])
        .arg(checking_job(&scratch, "hpid", "seen"))
        .stderr(Stdio::piped())
        .spawn();
    wait_queued(&url, "fd", 1);
    let victim = connected_on(&ens, &followers).expect("a session on a follower");
    let _ = ens.kids[victim].kill();
    let _ = ens.kids[victim].wait();
    let (hcode, herr) = exited(holder, Duration::from_secs(60));
    let (wcode, werr) = exited(waiter, Duration::from_secs(60));
    assert_eq!(hcode, Some(0), "the holder lost its lease: {herr}");
    assert_eq!(wcode, Some(0), "the waiter gave up: {werr}");
    assert_eq!(scratch.read("seen").trim(), "alone");
}

/// A loopback forwarder that delays everything the client sends by `ms`
/// (a slow link one way), in order.
pub(crate) fn delaying_forwarder(upstream: u16, ms: u64) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in listener.incoming() {
            let Ok(c) = c else { return };
            let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (mut c_read, mut s_write) = (c.try_clone().unwrap(), s.try_clone().unwrap());
            let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match c_read.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
            std::thread::spawn(move || {
                for (at, bytes) in rx {
                    let due = at + Duration::from_millis(ms);
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    if s_write.write_all(&bytes).is_err() {
                        return;
                    }
                }
                let _ = s_write.shutdown(std::net::Shutdown::Write);
            });
            let (mut s_read, mut c_write) = (s, c);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_read, &mut c_write);
            });
        }
    });
    port
}

/// `doctor` on a server whose maxSessionTimeout (here the default, 20
/// ticks = 4 s) is below the ttl in use, where a run with that ttl is
/// refused with 64. Protects against a doctor that passes the session it
/// asked for itself, or checks the default ttl instead of `--ttl`: it
/// learns the server's session bounds and warns when the ttl does not fit.
#[test]
fn doctor_checks_the_ttl_in_use_against_the_server_s_sessions() {
    let zk = OwnServer::start("");
    let url = zk.url();
    let session = |ttl: &str| {
        on(&url)
            .args(["--ttl", ttl, "x", "true"])
            .code(if ttl == "3s" { 0 } else { 64 });
        let doc = on(&url).args(["--ttl", ttl, "doctor"]).output();
        doc.stdout()
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("session:"))
            .unwrap_or_default()
            .to_string()
    };
    let long = session("10s");
    assert!(
        long.starts_with("warn") && long.contains("--ttl 10s"),
        "doctor passes a server that refuses the ttl in use: {long:?}"
    );
    let short = session("3s");
    assert!(
        short.starts_with("ok"),
        "doctor warns of a ttl the server grants: {short:?}"
    );
}

/// A request that disagrees with the mode in force (`--limit 3` against
/// `--limit 2` holders, `-s` against them) is 64 with one line, and leaves
/// no node of its own behind.
#[test]
fn a_disagreeing_request_leaves_nothing_behind() {
    let (url, port, chroot) = chroot_url();
    let scratch = Scratch::new();
    let mut c = lockrun();
    c.args(["--url", &url, "--limit", "2", "--ttl", "6s", "dis", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ));
    let _h = Reap(c.spawn().unwrap());
    scratch.pid_in("pid");
    for mode in [&["--limit", "3"][..], &["-s"], &[]] {
        let out = on(&url)
            .args(mode)
            .args(["-w", "5", "dis", "true"])
            .code(64);
        assert_eq!(
            out.stderr().trim_end().lines().count(),
            1,
            "{}",
            out.stderr()
        );
    }
    let q: Vec<String> = lockrun_nodes(port, &chroot)
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.contains("/q-"))
        .collect();
    assert_eq!(q.len(), 1, "{q:?}");
}

/// A foreign ephemeral node where a name's parent goes (another program's,
/// on a session of its own): lockrun cannot queue under it. Protects
/// against an internal error (70) for what is a foreign node in the way:
/// 69 with one line.
#[test]
fn a_foreign_ephemeral_node_at_a_name_s_parent() {
    let (url, port, chroot) = chroot_url();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let c = chroot.clone();
    let keeper = std::thread::spawn(move || {
        zk_do(port, Some(&c), move |z| async move {
            let opts = zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all());
            z.create("/lockrun", b"", &opts).await?;
            let eph = zookeeper_client::CreateMode::Ephemeral
                .with_acls(zookeeper_client::Acls::anyone_all());
            z.create("/lockrun/eph", b"", &eph).await?;
            ready_tx.send(()).unwrap();
            let _ = tokio::task::spawn_blocking(move || rx.recv()).await;
            Ok(())
        })
    });
    ready_rx.recv().unwrap();
    let out = on(&url).args(["-n", "eph", "true"]).output();
    let _ = tx.send(());
    let _ = keeper.join();
    let err = out.stderr();
    assert!(!err.contains("panick"), "{err}");
    assert_eq!(out.out.status.code(), Some(69), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// Two identities on one prefix (a digest user, and a client with no
/// credentials), on different names. Protects against the prefix's node
/// taking the ACL of whoever created it first, which would make the same
/// command work at one moment and be refused (NoAuth, 69) the next: the
/// prefix's node is open to every identity.
#[test]
fn the_prefix_s_acl_never_depends_on_who_came_first() {
    let (port, chroot) = zk_chroot();
    let anon = format!("zk://127.0.0.1:{port}{chroot}");
    let user = format!("zk://alice:pw-a@127.0.0.1:{port}{chroot}");
    // Nobody yet: the anonymous client locks "y".
    on(&anon).args(["-n", "y", "true"]).succeeds();
    // The prefix went with its last request; alice comes first now.
    assert!(wait_until(Duration::from_secs(20), || lockrun_nodes(
        port, &chroot
    )
    .is_empty()));
    let scratch = Scratch::new();
    let mut c = lockrun();
    c.args(["--url", &user, "--ttl", "6s", "x", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ));
    let _h = Reap(c.spawn().unwrap());
    scratch.pid_in("pid");
    let out = on(&anon).args(["-n", "y", "true"]).output();
    assert_eq!(
        out.out.status.code(),
        Some(0),
        "the same request on another name is refused now that alice made the prefix: {}",
        out.stderr()
    );
}

/// lockrun (the holder) stopped with SIGSTOP past its session timeout: its
/// guard stops the job before the session can expire, so the next holder,
/// granted once it did, never starts beside it.
#[test]
fn a_stopped_holder_s_job_is_not_running_when_the_next_starts() {
    let (url, _, _) = chroot_url();
    let scratch = Scratch::new();
    let holder = on(&url)
        .args(["--ttl", "2s", "sh2", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("hpid").display()
        ))
        .spawn();
    let hpid = holder.id() as i32;
    let _holder = Reap(holder);
    scratch.pid_in("hpid");
    signal(hpid, libc::SIGSTOP);
    let next = on(&url)
        .args(["--ttl", "2s", "-w", "60", "sh2", "-c"])
        .arg(format!(
            "s=$(awk '{{print $3}}' /proc/$(cat {p})/stat 2>/dev/null); echo ${{s:-gone}} > {o}",
            p = scratch.path("hpid").display(),
            o = scratch.path("state").display()
        ))
        .spawn();
    let (code, err) = exited(next, Duration::from_secs(60));
    signal(hpid, libc::SIGCONT);
    assert_eq!(code, Some(0), "{err}");
    let state = scratch.read("state");
    assert!(
        matches!(state.trim(), "gone" | "Z"),
        "the paused holder's job was in state {} when the next holder's job started",
        state.trim()
    );
}

/// A name's node made by a run without credentials (open to everyone),
/// then held by a digest user: every other identity (none, another user,
/// a wrong password) cannot read the holder's request node. Protects
/// against such a node being skipped as gone, which let those runs be
/// granted beside the holder and `status` call the name free: a node
/// lockrun cannot read is a holder it cannot judge, so it refuses (69,
/// one line naming the ACL). On one server and on an ensemble.
#[test]
fn a_request_node_of_another_identity_is_never_skipped() {
    let ensemble = shared_ensemble();
    for (port, hosts) in [
        (shared_zookeeper(), None),
        (
            ensemble[0],
            Some(
                ensemble
                    .iter()
                    .map(|p| format!("127.0.0.1:{p}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ),
    ] {
        let (_, chroot) = zk_chroot_on(port);
        let hosts = hosts.unwrap_or(format!("127.0.0.1:{port}"));
        let with = |auth: &str| format!("zk://{auth}{hosts}{chroot}");
        let anon = with("");
        let lra = with("lra:pw-right@");
        let scratch = Scratch::new();
        // The anonymous run makes the name's node and holds; another
        // waits, then the digest user queues behind both and holds once
        // they left, so the name's node (open to all) stays. The digest
        // user's request behind the anonymous waiter cannot hold before
        // it: that waiter still runs.
        let first = Reap(
            on(&anon)
                .args(["--ttl", "6s", "mixed", "-c"])
                .arg(gated_job(&scratch, "apid", "goa"))
                .spawn(),
        );
        scratch.pid_in("apid");
        let second = on(&anon)
            .args(["--ttl", "6s", "-w", "60", "mixed", "true"])
            .stderr(Stdio::piped())
            .spawn();
        wait_queued(&anon, "mixed", 1);
        let holder = Reap(
            on(&lra)
                .args(["--ttl", "6s", "-w", "60", "mixed", "-c"])
                .arg(gated_job(&scratch, "lpid", "gol"))
                .spawn(),
        );
        wait_queued(&lra, "mixed", 2);
        std::fs::write(scratch.path("goa"), "").unwrap();
        let (code, err) = exited(second, Duration::from_secs(30));
        assert_eq!(code, Some(0), "the anonymous waiter ahead: {err}");
        scratch.pid_in("lpid");
        drop(first);
        for (who, url) in [
            ("no credentials", anon.clone()),
            ("another user", with("other:pw@")),
            ("a wrong password", with("lra:WRONG@")),
        ] {
            let ran = scratch.path("ran");
            let out = on(&url)
                .args(["--ttl", "6s", "-n", "mixed", "-c"])
                .arg(format!("touch {}", ran.display()))
                .output();
            let err = out.stderr();
            assert!(
                !ran.exists(),
                "{who} (port {port}): its job ran beside the digest user's (exit {:?}): {err}",
                out.out.status.code()
            );
            assert_eq!(out.out.status.code(), Some(69), "{who}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{who}: {err}");
            assert!(err.contains("identity"), "{who}: {err}");
            let st = on(&url).args(["status", "mixed"]).output();
            let (code, said) = (st.out.status.code(), st.stdout() + &st.stderr());
            assert_eq!(code, Some(69), "{who}: status says: {said}");
            assert!(said.contains("identity"), "{who}: {said}");
        }
        // The digest user itself still reads its name.
        assert_eq!(status_json(&lra, "mixed")["held"], true);
        std::fs::write(scratch.path("gol"), "").unwrap();
        let mut holder = holder;
        let code = wait_child(&mut holder.0, Duration::from_secs(30)).code();
        assert_eq!(code, Some(0), "the digest user's run");
    }
}

/// A job that writes its pid to `pid`, then the time (ns) to `alive`
/// every 50 ms until it is stopped: the last time it was seen running.
fn beating_job(scratch: &Scratch, pid: &str, alive: &str) -> String {
    format!(
        "echo $$ > {p}; while :; do date +%s%N > {a}.new && mv {a}.new {a}; sleep 0.05; done",
        p = scratch.path(pid).display(),
        a = scratch.path(alive).display()
    )
}

/// A holder whose session reconnects to a server that now grants shorter
/// sessions (restarted with a smaller maxSessionTimeout, as a rolling
/// change of tickTime does): ZooKeeper negotiates the session timeout
/// again on every reconnect. Protects against the holder keeping the
/// deadline of the session it opened: cut off later, its session expired
/// 3 s after the cut and the next run was granted while the old job ran
/// on for seconds. The lease is what the server grants now: the holder's
/// next renewal stops its job (76) before anyone else can be granted.
#[test]
fn a_holder_whose_session_shrinks_on_reconnect_stops_before_the_next_runs() {
    let mut zk = Zookeeper::start();
    let proxy = ZkProxy::start(zk.server.port);
    let scratch = Scratch::new();
    let holder = on(&proxy.url())
        .args(["--ttl", "30s", "shrink", "-c"])
        .arg(beating_job(&scratch, "hpid", "alive"))
        .stderr(Stdio::piped())
        .spawn();
    let mut holder = Reap(holder);
    scratch.pid_in("hpid");
    zk.server.restart_with("maxSessionTimeout", "3000");
    // The holder reconnects with 3 s granted; its next renewal comes
    // within ttl/3 (10 s). Then the link is cut, for good.
    wait_until(Duration::from_secs(40), || {
        !matches!(holder.0.try_wait(), Ok(None))
    });
    proxy.set_stall(true);
    let next = on(&zk.url())
        .args(["--ttl", "3s", "-w", "90", "shrink", "-c"])
        .arg(format!("date +%s%N > {}", scratch.path("next").display()))
        .stderr(Stdio::piped())
        .spawn();
    let (code, err) = exited(next, Duration::from_secs(120));
    assert_eq!(code, Some(0), "the next run: {err}");
    let code = wait_child(&mut holder.0, Duration::from_secs(60)).code();
    let mut said = String::new();
    if let Some(mut e) = holder.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut said);
    }
    let next_at: u128 = scratch.read("next").trim().parse().unwrap();
    let last_alive: u128 = scratch.read("alive").trim().parse().unwrap();
    assert!(
        last_alive < next_at,
        "the holder's job still ran {:?} after the next run's job started (the holder \
         exited {code:?}: {said})",
        Duration::from_nanos((last_alive - next_at) as u64)
    );
    assert_eq!(code, Some(76), "{said}");
    assert!(
        said.contains("3s"),
        "does not say what the server grants: {said}"
    );
}

/// A waiter whose session expired while its lockrun was stopped, then
/// reconnected to a server that now grants shorter sessions than its ttl.
/// Protects against the new session's timeout going unchecked (it was
/// checked only when lockrun first connected): the waiter was granted on
/// a 3 s session with the schedule of an 8 s lease. It is refused as a
/// fresh run is (64, naming maxSessionTimeout), and its job never runs.
#[test]
fn a_waiter_whose_session_shrinks_is_refused_as_a_fresh_run_is() {
    let mut zk = Zookeeper::start();
    let url = zk.url();
    let scratch = Scratch::new();
    let _holder = Reap(
        on(&url)
            .args(["--ttl", "8s", "wshrink", "-c"])
            .arg(gated_job(&scratch, "hpid", "go"))
            .spawn(),
    );
    scratch.pid_in("hpid");
    let waiter = on(&url)
        .args(["--ttl", "8s", "-w", "120", "wshrink", "-c"])
        .arg(format!("touch {}", scratch.path("ran").display()))
        .stderr(Stdio::piped())
        .spawn();
    let wpid = waiter.id() as i32;
    let waiter = Reap(waiter);
    wait_queued(&url, "wshrink", 1);
    let requests = |port: u16| -> Vec<String> {
        let mut q: Vec<String> = zk_tree(port, None)
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| p.starts_with("/lockrun/wshrink/q-"))
            .collect();
        q.sort_by_key(|p| p.rsplit('-').next().unwrap_or("").to_string());
        q
    };
    let queued = requests(zk.server.port);
    assert_eq!(queued.len(), 2, "{queued:?}");
    let mine = queued[1].clone();
    // Stopped past its session timeout, while the server restarts with
    // smaller sessions.
    signal(wpid, libc::SIGSTOP);
    zk.server.restart_with("maxSessionTimeout", "3000");
    assert!(
        wait_until(Duration::from_secs(40), || !requests(zk.server.port)
            .contains(&mine)),
        "the stopped waiter's session never expired"
    );
    signal(wpid, libc::SIGCONT);
    std::fs::write(scratch.path("go"), "").unwrap();
    let mut waiter = waiter;
    let code = wait_child(&mut waiter.0, Duration::from_secs(90)).code();
    let mut err = String::new();
    if let Some(mut e) = waiter.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(
        !scratch.exists("ran"),
        "the waiter ran its job on a session shorter than its ttl (exit {code:?}): {err}"
    );
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("maxSessionTimeout"), "{err}");
}

/// A holder whose session reconnects to a server that now grants shorter
/// sessions, cut off right after that reconnect. Protects against the
/// deadline following the shorter session only at the next renewal (up
/// to ttl/3 later): cut off in that gap, the holder's session expired 3 s
/// after the cut, the next run was granted, and the old job ran on under
/// the deadline of a 30 s lease. The reconnect itself asks for a renewal
/// at once, so the deadline follows what was granted before a cut can
/// come.
#[test]
fn a_holder_cut_off_right_after_its_session_shrinks_stops_before_the_next_runs() {
    let mut zk = Zookeeper::start();
    let proxy = ZkProxy::start(zk.server.port);
    let scratch = Scratch::new();
    let mut holder = Reap(
        on(&proxy.url())
            .args(["--ttl", "30s", "gap", "-c"])
            .arg(beating_job(&scratch, "hpid", "alive"))
            .stderr(Stdio::piped())
            .spawn(),
    );
    scratch.pid_in("hpid");
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    let stderr = holder.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let connects = || proxy.connected.load(std::sync::atomic::Ordering::SeqCst);
    let before = connects();
    zk.server.restart_with("maxSessionTimeout", "3000");
    assert!(
        wait_until(Duration::from_secs(40), || connects() > before),
        "the holder never reconnected"
    );
    // Right after the reconnect: a renewal on it comes at once (its
    // warning says so), or not before the cut.
    let reconnected = Instant::now();
    let mut said = String::new();
    while reconnected.elapsed() < Duration::from_secs(1) {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(20)) {
            said += &line;
            said.push('\n');
            if line.contains("granted our session") {
                break;
            }
        }
    }
    proxy.set_stall(true);
    let next = on(&zk.url())
        .args(["--ttl", "3s", "-w", "90", "gap", "-c"])
        .arg(format!("date +%s%N > {}", scratch.path("next").display()))
        .stderr(Stdio::piped())
        .spawn();
    let (code, err) = exited(next, Duration::from_secs(120));
    assert_eq!(code, Some(0), "the next run: {err}");
    let code = wait_child(&mut holder.0, Duration::from_secs(60)).code();
    while let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
        said += &line;
        said.push('\n');
    }
    let next_at: u128 = scratch.read("next").trim().parse().unwrap();
    let last_alive: u128 = scratch.read("alive").trim().parse().unwrap();
    assert!(
        last_alive < next_at,
        "the holder's job still ran {:?} after the next run's job started (the holder \
         exited {code:?}: {said})",
        Duration::from_nanos((last_alive - next_at) as u64)
    );
    assert_eq!(code, Some(76), "{said}");
}

/// Plant a persistent node at `/lockrun/NAME` with only world:READ, as
/// anyone may under a prefix that grants world CREATE (an existing
/// deployment's prefix, made persistent by hand with READ|CREATE).
fn plant(port: u16, chroot: &str, make_prefix: bool, name: &str) {
    use zookeeper_client::{Acl, Acls, AuthId, CreateMode, Permission as P};
    let path = format!("/lockrun/{name}");
    zk_do(port, Some(chroot), move |z| async move {
        if make_prefix {
            let prefix = [Acl::new(P::READ | P::CREATE, AuthId::anyone())];
            let opts = CreateMode::Persistent.with_acls(Acls::new(&prefix));
            z.create("/lockrun", b"", &opts).await?;
        }
        let read = [Acl::new(P::READ, AuthId::anyone())];
        let opts = CreateMode::Persistent.with_acls(Acls::new(&read));
        z.create(&path, b"", &opts).await?;
        Ok(())
    });
}

/// A persistent node with ACL world:READ planted where a name's node
/// goes, under a prefix that lets anyone create. Protects against every
/// run on the name being refused (69) while `status` called it free (1),
/// `release --force` said "not held" and `doctor` said all was well:
/// each names the node and its ACL, and says it is not lockrun's.
#[test]
fn a_foreign_node_at_a_name_s_place_is_named_everywhere() {
    let (url, port, chroot) = chroot_url();
    plant(port, &chroot, true, "planted");
    let run = on(&url).args(["-n", "planted", "true"]).output();
    let st = on(&url).args(["status", "planted"]).output();
    let rel = on(&url).args(["release", "--force", "planted"]).output();
    let doc = on(&url).args(["doctor"]).output();
    for (what, out, code) in [
        ("run", &run, 69),
        ("status", &st, 69),
        ("release --force", &rel, 69),
        ("doctor", &doc, 69),
    ] {
        let said = out.stdout() + &out.stderr();
        assert_eq!(out.out.status.code(), Some(code), "{what}: {said}");
        assert!(
            said.contains("/lockrun/planted") && said.contains("world:anyone:READ"),
            "{what} does not name the node and its ACL: {said}"
        );
        assert!(said.contains("not lockrun's"), "{what}: {said}");
    }
    assert_eq!(
        run.stderr().trim_end().lines().count(),
        1,
        "{}",
        run.stderr()
    );
    assert_eq!(st.stderr().trim_end().lines().count(), 1, "{}", st.stderr());
}

/// A node planted at a name's place under a prefix that lockrun made.
/// Protects against the prefix's ACL letting anyone create a node there
/// that only ZooKeeper's superuser can delete: lockrun's prefix lets the
/// identity that runs lockrun delete it (here one with no credentials,
/// as lockrun's runs were).
#[test]
fn a_node_planted_under_lockrun_s_prefix_can_be_deleted() {
    let (url, port, chroot) = chroot_url();
    let scratch = Scratch::new();
    let _holder = Reap(
        on(&url)
            .args(["--ttl", "6s", "kept", "-c"])
            .arg(gated_job(&scratch, "pid", "go"))
            .spawn(),
    );
    scratch.pid_in("pid");
    plant(port, &chroot, false, "planted");
    let gone = zk_do(port, Some(&chroot), |z| async move {
        Ok(z.delete("/lockrun/planted", None).await)
    });
    assert!(gone.is_ok(), "the planted node cannot be deleted: {gone:?}");
    std::fs::write(scratch.path("go"), "").unwrap();
    on(&url).args(["-n", "planted", "true"]).succeeds();
}

/// `status` without a name, `status --json` and `list` on a prefix shared
/// by two identities, with a node planted at a third name's place.
/// Protects against the whole listing ending with 69 as soon as one name
/// belonged to another identity or was not lockrun's: what can be read is
/// listed, each name that cannot is marked (text and JSON), and the exit
/// code is the listing's (0: a name read is held).
#[test]
fn listings_mark_the_names_they_cannot_read() {
    let (port, chroot) = zk_chroot();
    let anon = format!("zk://127.0.0.1:{port}{chroot}");
    let alice = format!("zk://alice:pw-a@127.0.0.1:{port}{chroot}");
    let scratch = Scratch::new();
    let _mine = Reap(
        on(&anon)
            .args(["--ttl", "6s", "mine", "-c"])
            .arg(gated_job(&scratch, "mpid", "go"))
            .spawn(),
    );
    scratch.pid_in("mpid");
    let _hers = Reap(
        on(&alice)
            .args(["--ttl", "6s", "hers", "-c"])
            .arg(gated_job(&scratch, "hpid", "go"))
            .spawn(),
    );
    scratch.pid_in("hpid");
    plant(port, &chroot, false, "planted");
    for cmd in [&["status"][..], &["list"]] {
        let out = on(&anon).args(cmd).output();
        let (text, err) = (out.stdout(), out.stderr());
        assert_eq!(out.out.status.code(), Some(0), "{cmd:?}: {text}{err}");
        let line = |n: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{n}:")))
                .unwrap_or_default()
                .to_string()
        };
        assert!(line("mine").contains("held"), "{cmd:?}: {text}");
        assert!(line("hers").contains("cannot be read"), "{cmd:?}: {text}");
        assert!(line("planted").contains("not lockrun's"), "{cmd:?}: {text}");
    }
    let out = on(&anon).args(["status", "--json"]).output();
    assert_eq!(out.out.status.code(), Some(0), "{}", out.stderr());
    let all = out.json();
    let by = |n: &str| {
        all.as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(by("mine")["held"], true, "{all}");
    assert!(by("hers")["unreadable"].is_string(), "{all}");
    assert!(by("planted")["unreadable"].is_string(), "{all}");
    std::fs::write(scratch.path("go"), "").unwrap();
}

/// The chroot deleted, with everything under it, while a request waits
/// in it. Protects against the waiter's next create failing as an
/// internal error (70, "node not exists"): a missing chroot is the
/// server's refusal (69), one line naming it, as a fresh run says.
#[test]
fn a_chroot_deleted_while_a_request_waits() {
    let (url, port, chroot) = chroot_url();
    let scratch = Scratch::new();
    let _holder = Reap(
        on(&url)
            .args(["--ttl", "6s", "gone", "-c"])
            .arg(gated_job(&scratch, "pid", "go"))
            .stderr(Stdio::null())
            .spawn(),
    );
    scratch.pid_in("pid");
    let waiter = on(&url)
        .args(["--ttl", "6s", "-w", "60", "gone", "true"])
        .stderr(Stdio::piped())
        .spawn();
    let waiter = Reap(waiter);
    wait_queued(&url, "gone", 1);
    // Delete the chroot and all under it, deepest first, in one
    // transaction (retried while lockrun adds a node): deleted one by one,
    // the holder's node could go first and grant the waiter its turn in
    // the chroot before the chroot itself went.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let mut all: Vec<String> = lockrun_nodes(port, &chroot)
                .into_iter()
                .map(|(p, _)| format!("{chroot}{p}"))
                .collect();
            all.sort_by_key(|p| std::cmp::Reverse(p.matches('/').count()));
            all.push(chroot.clone());
            let c = chroot.clone();
            zk_do(port, None, move |z| async move {
                let mut gone = z.new_multi_writer();
                for p in &all {
                    gone.add_delete(p, None)?;
                }
                let _ = gone.commit().await;
                Ok(z.check_stat(&c).await?.is_none())
            })
        }),
        "the chroot could not be deleted"
    );
    let mut waiter = waiter;
    let code = wait_child(&mut waiter.0, Duration::from_secs(60)).code();
    let mut err = String::new();
    if let Some(mut e) = waiter.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert_eq!(code, Some(69), "{err}");
    assert!(
        err.contains(&chroot) && err.contains("does not exist"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// A chroot in ZooKeeper's own tree (`/zookeeper`, its quotas, its
/// configuration). Protects against lockrun writing its nodes there: such
/// a URL is refused (64, one line) as the prefix `zookeeper` is.
#[test]
fn a_chroot_in_zookeeper_s_own_tree_is_refused() {
    let port = shared_zookeeper();
    for chroot in [
        "/zookeeper",
        "/zookeeper/quota",
        "/zookeeper/x/y",
        "/zookeeper/",
    ] {
        let url = format!("zk://127.0.0.1:{port}{chroot}");
        let out = on(&url).args(["-n", "x", "true"]).code(64);
        let err = out.stderr();
        assert_eq!(err.trim_end().lines().count(), 1, "{chroot}: {err}");
        assert!(err.contains("ZooKeeper's own"), "{chroot}: {err}");
    }
}

/// The reply to a holder's release lost, on a server whose shortest
/// session (minSessionTimeout, 5 s) is longer than the ttl (3 s).
/// Protects against the holder saying "the lease expires on its own
/// within 3s" whatever happened: the release's answer was lost (the node
/// may well be gone), and if it is not, it goes with the session, within
/// the session timeout the server granted.
#[test]
fn a_lost_release_reply_says_what_is_known() {
    let zk = OwnServer::start("minSessionTimeout=5000\nmaxSessionTimeout=20000\n");
    let proxy = ZkProxy::start(zk.port);
    let scratch = Scratch::new();
    let holder = on(&proxy.url())
        .args(["--ttl", "3s", "lost", "-c"])
        .arg(gated_job(&scratch, "pid", "go"))
        .stderr(Stdio::piped())
        .spawn();
    scratch.pid_in("pid");
    proxy.lose_next_delete();
    std::fs::write(scratch.path("go"), "").unwrap();
    let (code, err) = exited(holder, Duration::from_secs(60));
    assert_eq!(
        proxy.lost.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "no release reply was lost: {err}"
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("within 3s"), "{err}");
    assert!(err.contains("answer") && err.contains("5s"), "{err}");
}

/// A holder's request node whose record this lockrun cannot read (written
/// by a newer lockrun with a mode it does not know, or changed by hand) is
/// a holder it cannot judge: never left out as "not lockrun's". A request
/// on the name is refused with one line naming the node, and the holder's
/// job is not joined by a second.
#[test]
fn a_request_node_lockrun_cannot_decode_is_never_left_out() {
    let (url, port, chroot) = chroot_url();
    let scratch = Scratch::new();
    let holder = on(&url)
        .args(["--ttl", "30s", "undecoded", "sh", "-c"])
        .arg(gated_job(&scratch, "pid", "go"))
        .spawn();
    let _holder = Reap(holder);
    scratch.pid_in("pid");
    let node = zk_tree(port, Some(&chroot))
        .into_iter()
        .map(|(p, _)| p)
        .find(|p| p.contains("/undecoded/q-"))
        .expect("the holder's request node");
    let path = node.clone();
    zk_do(port, Some(&chroot), move |z| async move {
        z.set_data(&path, br#"{"label":"x","mode":"r","ttl_ms":30000}"#, None)
            .await
            .map(|_| ())
    });
    let ran = scratch.path("second");
    let out = on(&url)
        .args(["-n", "undecoded", "touch"])
        .arg(&ran)
        .output();
    std::fs::write(scratch.path("go"), "").unwrap();
    assert!(
        !ran.exists(),
        "a second job ran beside the holder whose record was unreadable: {}",
        out.stderr()
    );
    assert_eq!(out.out.status.code(), Some(69), "{}", out.stderr());
    assert!(out.stderr().contains("cannot read"), "{}", out.stderr());
}
