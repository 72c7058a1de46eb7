//! The etcd engine end to end, beyond the conformance suite (which covers
//! exclusion, first come first served, `--limit`, `-s`, status, `release
//! --force`, `kill -9` of a holder's lockrun, a restart and a stop of the
//! server, users and URLs): leases revoked or starved behind lockrun's
//! back, endpoints, the smallest lease, a role's prefix.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::*;

/// The conformance suite's `-vv` holder (every renewal logged to the
/// scratch file `err`), whose job runs until stopped.
pub(crate) use crate::conformance::logged_holder as holder;

/// The lease etcd holds for `name`'s first key (decimal id), from etcdctl.
fn lease_of(etcd: &Etcd, name: &str) -> i64 {
    let out = etcd.ctl(&["get", "--prefix", &format!("lockrun:{name}/"), "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["kvs"][0]["lease"]
        .as_i64()
        .unwrap_or_else(|| panic!("no lease on {name}: {out}"))
}

#[test]
fn a_lease_revoked_with_etcdctl_stops_the_job_in_time() {
    let etcd = Etcd::start();
    let scratch = Scratch::new();
    let (mut h, job) = holder(&etcd.url(), &scratch, "rev", "3s");
    let lease = lease_of(&etcd, "rev");
    let revoked = Instant::now();
    etcd.ctl(&["lease", "revoke", &format!("{lease:x}")]);
    assert_eq!(wait_child(&mut h, Duration::from_secs(20)).code(), Some(76));
    // ttl/3 + op + grace = 1 s + 0.5 s + 0.3 s, and a second for the
    // processes of this test on a busy machine.
    let took = revoked.elapsed();
    assert!(took < Duration::from_millis(2800), "stopped after {took:?}");
    assert!(!alive(job), "the job outlived its revoked lease");
}

#[test]
fn unreachable_endpoints_are_69_and_a_dead_first_one_is_passed_over() {
    let etcd = Etcd::start();
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let dead = format!("etcd://127.0.0.1:{},127.0.0.1:{}", free_port(), free_port());
    on(&dead)
        .args(["away", "-c"])
        .arg(format!("touch {}", ran.display()))
        .code(69)
        .says(&["cannot reach etcd"]);
    assert!(!ran.exists());
    let url = format!("etcd://127.0.0.1:{},127.0.0.1:{}", free_port(), etcd.port);
    on(&url).args(["first", "-c", "echo ran"]).succeeds();
    on(&url).args(["status", "first"]).code(1);
}

/// A ttl below etcd's smallest lease is 64 before anything is contacted
/// (bad URLs: the conformance suite).
#[test]
fn short_ttls_are_64_before_anything_is_contacted() {
    let etcd = Etcd::start();
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let job = format!("touch {}", ran.display());
    on(&etcd)
        .args(["--ttl", "1s", "bad", "-c", &job])
        .code(64)
        .says(&["smallest lease of 2s"]);
    assert!(!ran.exists(), "a job ran on bad input");
    assert!(etcd.keys().is_empty() && etcd.leases().is_empty());
    // Rounded up to whole seconds: the job sees what etcd granted.
    let out = on(&etcd)
        .args(["--ttl", "2.2s", "ok", "-c", "echo $LOCKRUN_TTL_MS"])
        .succeeds();
    assert_eq!(out.stdout(), "3000\n");
}

/// A wrong password is refused at once, naming the user; a prefix outside
/// the role's keys too. (A user's password reaching no line and no job:
/// the conformance suite.)
#[test]
fn a_wrong_password_or_a_prefix_outside_the_role_is_refused_at_once() {
    let etcd = Etcd::start();
    let url = etcd.with_locker("s3cretpw");
    let wrong = format!("etcd://locker:wrongpw@127.0.0.1:{}", etcd.port);
    let out = on(&wrong)
        .args(["auth", "true"])
        .code(69)
        .says(&["refused", "locker"]);
    assert!(!out.stderr().contains("wrongpw"));
    // A prefix outside the role's keys: refused at once, not retried.
    let started = Instant::now();
    on(&url)
        .args(["--prefix", "other:", "auth", "true"])
        .code(69)
        .says(&["permission denied"]);
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// A loopback proxy in front of etcd, for one lockrun, that loses one reply:
/// requests pass until the first transaction that moves a key onto another
/// lease with nothing else compared (a waiter's move onto its short lease).
/// That one reaches etcd and commits, its reply is dropped, and from then
/// on every request is cut unforwarded until `heal`: the client can only
/// learn what happened by reading etcd again. Started `without_watch`, it
/// loses nothing but answers every watch 404, as a proxy that does not
/// pass streams would.
struct LosesReply {
    port: u16,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    watches: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl LosesReply {
    fn start(upstream: u16) -> LosesReply {
        Self::launch(upstream, false)
    }

    fn without_watch(upstream: u16) -> LosesReply {
        Self::launch(upstream, true)
    }

    fn launch(upstream: u16, no_watch: bool) -> LosesReply {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // With no watch, no reply is ever lost.
        let fired = Arc::new(AtomicBool::new(no_watch));
        let cut = Arc::new(AtomicBool::new(false));
        let watches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (f, c, w) = (Arc::clone(&fired), Arc::clone(&cut), Arc::clone(&watches));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (f, c, w) = (Arc::clone(&f), Arc::clone(&c), Arc::clone(&w));
                std::thread::spawn(move || {
                    Self::pass(client, server, &f, &c, no_watch.then_some(&*w))
                });
            }
        });
        LosesReply {
            port,
            fired,
            cut,
            watches,
        }
    }

    /// One connection: whole requests (headers and Content-Length body)
    /// forwarded one at a time, replies copied back on a thread of their own.
    fn pass(
        client: std::net::TcpStream,
        mut server: std::net::TcpStream,
        fired: &std::sync::atomic::AtomicBool,
        cut: &std::sync::atomic::AtomicBool,
        refused_watches: Option<&std::sync::atomic::AtomicUsize>,
    ) {
        use std::io::{Read, Write};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
        let drop_reply = Arc::new(AtomicBool::new(false));
        let (mut from_server, mut to_client) =
            (server.try_clone().unwrap(), client.try_clone().unwrap());
        let dropping = Arc::clone(&drop_reply);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            loop {
                let n = match from_server.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if dropping.load(SeqCst) || to_client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to_client.shutdown(std::net::Shutdown::Both);
        });
        let mut client = client;
        let mut pending: Vec<u8> = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = match client.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&pending[..end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if pending.len() < end + 4 + length {
                    break;
                }
                let request: Vec<u8> = pending.drain(..end + 4 + length).collect();
                if cut.load(SeqCst) {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    let _ = server.shutdown(std::net::Shutdown::Both);
                    return;
                }
                if let Some(n) = refused_watches
                    && head.starts_with("post /v3/watch")
                {
                    n.fetch_add(1, SeqCst);
                    let _ =
                        client.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                    continue;
                }
                let body = String::from_utf8_lossy(&request[end + 4..]).to_string();
                let onto_lease = head.starts_with("post /v3/kv/txn")
                    && body.contains("request_put")
                    && !body.contains("CREATE");
                if onto_lease && !fired.swap(true, SeqCst) {
                    drop_reply.store(true, SeqCst);
                    cut.store(true, SeqCst);
                }
                if server.write_all(&request).is_err() {
                    return;
                }
            }
        }
        let _ = server.shutdown(std::net::Shutdown::Both);
    }

    fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn watches(&self) -> usize {
        self.watches.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn heal(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The ttl etcd granted the lease `lease` (decimal id), from etcdctl.
fn granted_ttl(etcd: &Etcd, lease: i64) -> i64 {
    let out = etcd.ctl(&["lease", "timetolive", &format!("{lease:x}"), "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["granted-ttl"]
        .as_i64()
        .unwrap_or_else(|| panic!("no granted ttl: {out}"))
}

#[test]
fn a_waiter_whose_move_to_its_short_lease_lost_its_reply_holds_on_a_full_lease() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    let (mut a, _) = holder(&url, &scratch, "lost", "6s");
    let proxy = LosesReply::start(etcd.port);
    let (start, end, overlap) = (
        scratch.path("b_start"),
        scratch.path("b_end"),
        scratch.path("overlap"),
    );
    let mut b = on(&proxy.url())
        .args(["-q", "--ttl", "6s", "lost", "-c"])
        .arg(format!(
            "touch {}; sleep 4; touch {}",
            start.display(),
            end.display()
        ))
        .spawn();
    // B's key went onto its 2 s waiter lease; B never heard so.
    assert!(
        wait_until(Duration::from_secs(20), || proxy.fired()),
        "B never moved onto a waiter lease"
    );
    signal(a.id() as i32, libc::SIGTERM);
    wait_child(&mut a, Duration::from_secs(20));
    assert!(wait_until(Duration::from_secs(10), || etcd.keys().len() == 1));
    proxy.heal();
    assert!(
        wait_until(Duration::from_secs(20), || start.exists()),
        "B never ran"
    );
    // The key B holds must sit on a lease of the full ttl (the one it renews),
    // not on the waiter lease that nobody keeps alive.
    assert_eq!(granted_ttl(&etcd, lease_of(&etcd, "lost")), 6);
    let mut c = on(&url)
        .args(["-q", "--ttl", "6s", "lost", "-c"])
        .arg(format!(
            "test -e {} || touch {}",
            end.display(),
            overlap.display()
        ))
        .spawn();
    assert_eq!(
        wait_child(&mut b, Duration::from_secs(30)).code(),
        Some(0),
        "B lost its lease"
    );
    assert_eq!(wait_child(&mut c, Duration::from_secs(30)).code(), Some(0));
    assert!(!overlap.exists(), "C ran while B's job ran");
}

#[test]
fn a_limit_waiter_paused_while_a_later_one_runs_still_gets_a_higher_token() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    let lim = |job: String| {
        on(&url)
            .args(["-q", "--limit", "2", "--ttl", "15s", "lim", "-c"])
            .arg(job)
            .spawn()
    };
    let mut a = lim("exec sleep 60".into());
    let mut b = lim("exec sleep 60".into());
    assert!(wait_until(Duration::from_secs(20), || status_json(
        &url, "lim"
    )["holders"]
        .as_array()
        .is_some_and(|h| h.len() == 2)));
    let record = |tag: &str| {
        format!(
            "echo $LOCKRUN_TOKEN $LOCKRUN_SLOT > {}",
            scratch.path(tag).display()
        )
    };
    let mut w = lim(record("w"));
    wait_queued(&url, "lim", 1);
    let mut x = lim(record("x"));
    wait_queued(&url, "lim", 2);
    // W, first in line, is stopped (well within its 5 s waiter lease) while
    // both slots free up: X, behind it, is granted first.
    signal(w.id() as i32, libc::SIGSTOP);
    for h in [&mut a, &mut b] {
        signal(h.id() as i32, libc::SIGTERM);
        wait_child(h, Duration::from_secs(20));
    }
    let x_done = wait_child(&mut x, Duration::from_secs(10));
    signal(w.id() as i32, libc::SIGCONT);
    assert_eq!(x_done.code(), Some(0));
    assert_eq!(wait_child(&mut w, Duration::from_secs(20)).code(), Some(0));
    let read = |tag: &str| -> (u64, String) {
        let s = scratch.read(tag);
        let mut it = s.split_whitespace();
        (
            it.next().unwrap().parse().unwrap(),
            it.next().unwrap_or("").to_string(),
        )
    };
    let ((wt, ws), (xt, xs)) = (read("w"), read("x"));
    assert!(
        wt > xt,
        "W was granted after X with token {wt} (slot {ws}), X had {xt} (slot {xs})"
    );
}

#[test]
fn a_waiter_whose_watch_is_refused_keeps_its_place_and_does_not_spin() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    let (mut a, _) = holder(&url, &scratch, "nowatch", "6s");
    let proxy = LosesReply::without_watch(etcd.port);
    let ran = scratch.path("ran");
    let mut b = on(&proxy.url())
        .args(["-q", "--ttl", "6s", "nowatch", "-c"])
        .arg(format!("touch {}", ran.display()))
        .spawn();
    wait_queued(&url, "nowatch", 1);
    let place = etcd.keys();
    let watched = proxy.watches();
    // Two and a half waiter leases (2 s each): a waiter that keeps none
    // alive would have queued again by then.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(etcd.keys(), place, "the waiter lost its place in the queue");
    let tries = proxy.watches() - watched;
    assert!(tries <= 25, "{tries} watches opened in 5 s");
    signal(a.id() as i32, libc::SIGTERM);
    wait_child(&mut a, Duration::from_secs(20));
    let freed = Instant::now();
    assert_eq!(wait_child(&mut b, Duration::from_secs(20)).code(), Some(0));
    assert!(ran.exists());
    let took = freed.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "waited {took:?} after the release"
    );
}

/// `etcds://` against an etcd serving TLS: the server's certificate checked
/// against `--tls-ca` (or LOCKRUN_TLS_CA), a wrong CA refused with one line
/// and 69 before any job, `#insecure` taken as it says.
#[test]
fn tls_with_a_ca_file_a_wrong_ca_and_insecure() {
    let scratch = Scratch::new();
    let d = scratch.dir.path();
    make_certs(d);
    let p = |f: &str| d.join(f).display().to_string();
    let etcd = Etcd::start_tls(&d.join("srv.crt"), &d.join("srv.key"));
    let url = format!("etcds://127.0.0.1:{}", etcd.port);
    let out = run(on(&url).args([
        "--tls-ca",
        &p("ca.crt"),
        "t",
        "--",
        "sh",
        "-c",
        "echo $LOCKRUN_TOKEN",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).trim().parse::<u64>().is_ok_and(|t| t > 0));
    on(&url)
        .env("LOCKRUN_TLS_CA", p("ca.crt"))
        .args(["status", "t"])
        .code(1);

    let marker = scratch.path("ran");
    let t = Instant::now();
    let out = run(on(&url).args([
        "--tls-ca",
        &p("other.crt"),
        "t",
        "touch",
        &marker.display().to_string(),
    ]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    assert!(!marker.exists(), "a job ran over an unchecked connection");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());

    on(&format!("{url}#insecure")).args(["t", "true"]).code(0);
    // Plain HTTP to a TLS port is no etcd: 69, not a hang.
    on(&format!("etcd://127.0.0.1:{}", etcd.port))
        .args(["--ttl", "6s", "t", "true"])
        .code(69);
}

/// The waiter behind one killed in the queue wakes when that key lapses,
/// while the holder still runs: it must look again and wait on, not take
/// the name (it promotes itself in one call only if no key is older).
#[test]
fn a_waiter_woken_by_a_lapsed_key_ahead_waits_on_behind_the_holder() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "lk", "6s");
    let mut first = on(&url).args(["-q", "--ttl", "6s", "lk", "true"]).spawn();
    wait_queued(&url, "lk", 1);
    let started = scratch.path("started");
    let mut second = on(&url)
        .args(["-q", "--ttl", "6s", "lk", "-c"])
        .arg(format!("date +%s%N > {}", started.display()))
        .spawn();
    wait_queued(&url, "lk", 2);
    signal(first.id() as i32, libc::SIGKILL);
    let _ = first.wait();
    // The killed waiter's key lapses with its 2 s lease: one waiter left.
    let lapsed = wait_until(Duration::from_secs(20), || {
        status_json(&url, "lk")["waiters"].as_u64() == Some(1)
    });
    assert!(lapsed, "the killed waiter's key never lapsed");
    // Time for the woken waiter to act on it, wrongly or not.
    std::thread::sleep(Duration::from_secs(1));
    let freed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    assert!(!started.exists(), "the waiter ran beside the holder");
    signal(h.id() as i32, libc::SIGTERM);
    wait_child(&mut h, Duration::from_secs(20));
    assert_eq!(
        wait_child(&mut second, Duration::from_secs(30)).code(),
        Some(0)
    );
    let at: u128 = std::fs::read_to_string(&started)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        at > freed_at,
        "the waiter started before the holder was asked to end"
    );
}

#[test]
fn waiters_ride_out_graceful_restarts_of_etcd() {
    let mut etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "gr", "10s");
    // A graceful stop closes the gateway's connection to the server while
    // watches and calls are under way ("the client connection is closing"):
    // a waiter that hears it must wait on, as for any other restart.
    let n = 16;
    let mut waiters: Vec<Child> = (0..n)
        .map(|_| {
            on(&url)
                .args(["-q", "--ttl", "10s", "gr", "true"])
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect();
    wait_queued(&url, "gr", n);
    for round in 0..3 {
        etcd.restart_gracefully();
        wait_queued(&url, "gr", n);
        for w in waiters.iter_mut() {
            if let Ok(Some(st)) = w.try_wait() {
                let mut err = String::new();
                use std::io::Read;
                let _ = w.stderr.take().unwrap().read_to_string(&mut err);
                panic!("a waiter ended in round {round} with {st}: {err}");
            }
        }
    }
    signal(h.id() as i32, libc::SIGTERM);
    wait_child(&mut h, Duration::from_secs(20));
    for mut w in waiters {
        let st = wait_child(&mut w, Duration::from_secs(120));
        let mut err = String::new();
        use std::io::Read;
        let _ = w.stderr.take().unwrap().read_to_string(&mut err);
        assert_eq!(st.code(), Some(0), "a waiter did not run: {err}");
    }
}

#[test]
fn names_under_different_prefixes_never_reach_each_other() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let scratch = Scratch::new();
    // `lockrun:foo/q/` + `bar` runs through the range of `lockrun:` + `foo`.
    let mut h = on(&url)
        .args(["--prefix", "lockrun:foo/q/", "bar", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn();
    let job = scratch.pid_in("pid");
    on(&url).args(["status", "foo"]).code(1);
    on(&url).args(["-n", "foo", "true"]).succeeds();
    on(&url).args(["release", "--force", "foo"]).code(1);
    assert!(
        alive(job),
        "release --force of another prefix's name stopped the job"
    );
    let listed = on(&url).args(["status"]).code(1);
    assert!(!listed.stdout().contains("foo"), "{}", listed.stdout());
    assert!(
        listed.stderr().contains("left out 1 key(s)"),
        "{}",
        listed.stderr()
    );
    on(&url)
        .args(["--prefix", "lockrun:foo/q/", "status", "bar"])
        .code(0);
    signal(h.id() as i32, libc::SIGTERM);
    wait_child(&mut h, Duration::from_secs(20));
    // Prefixes whose keys another prefix's names could write: refused
    // before anything is contacted.
    let before = etcd.keys();
    for prefix in ["lockrun:a", "lockrun:a:", "lockrun", ""] {
        on(&url)
            .args(["--prefix", prefix, "b", "-c", "true"])
            .code(64)
            .says(&["--prefix", "end it with '/'"]);
        on(&format!("etcd://127.0.0.1:{}", free_port()))
            .args(["--prefix", prefix, "status", "b"])
            .code(64);
    }
    assert_eq!(etcd.keys(), before, "a refused prefix wrote a key");
}

#[test]
fn a_key_whose_name_lockrun_would_not_write_is_left_out_of_the_list() {
    let etcd = Etcd::start();
    let url = etcd.url();
    for key in [
        "lockrun:bad%ZZenc/q/0000000000000005",
        "lockrun:bad%ZZenc/q/5",
    ] {
        etcd.ctl(&["put", key, "{}"]);
    }
    on(&url).args(["ok", "true"]).succeeds();
    let listed = on(&url).args(["status"]).code(1);
    assert!(!listed.stdout().contains("bad"), "{}", listed.stdout());
    assert!(
        listed.stderr().contains("left out 2 key(s)"),
        "{}",
        listed.stderr()
    );
}

/// etcd's v3 JSON gateway, spoken the way lockrun speaks it: POST `body`
/// to `path` on `agent` and return the reply.
fn gateway(
    agent: &ureq::Agent,
    etcd: &Etcd,
    path: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    let text = agent
        .post(format!("http://127.0.0.1:{}{path}", etcd.port))
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .into_body()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"))
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// `n` leases of `ttl` seconds, granted by a few threads at once.
fn grant_leases(etcd: &Etcd, n: usize, ttl: u64) -> Vec<i64> {
    let threads = 4;
    let each = n.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let agent = ureq::Agent::new_with_defaults();
                    (t * each..((t + 1) * each).min(n))
                        .map(|_| {
                            let v = gateway(&agent, etcd, "/v3/lease/grant", &json!({"TTL": ttl}));
                            v["ID"].as_str().unwrap().parse().unwrap()
                        })
                        .collect::<Vec<i64>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

/// A request's record as lockrun writes it: exclusive, shown as
/// `host:<i>`, its owner's secret `5ec2e7…`, granted at `granted_ms`
/// (0 while it waits).
fn record(i: usize, granted_ms: u128) -> String {
    json!({
        "owner": format!("5ec2e7{i:026x}"),
        "label": format!("host:{i}"),
        "mode": "x",
        "limit": 1,
        "slot": null,
        "granted_ms": granted_ms,
        "revoked": false,
        "min_hold": false,
        "token": null,
    })
    .to_string()
}

/// Put `kvs` (key, value, lease), 100 to a transaction (etcd allows 128
/// operations in one): the revision each key was written at.
fn put_all(etcd: &Etcd, kvs: &[(String, String, i64)]) -> Vec<u64> {
    let agent = ureq::Agent::new_with_defaults();
    let mut revisions = Vec::new();
    for batch in kvs.chunks(100) {
        let puts: Vec<serde_json::Value> = batch
            .iter()
            .map(|(k, v, lease)| {
                json!({"request_put": {"key": b64(k), "value": b64(v), "lease": lease.to_string()}})
            })
            .collect();
        let v = gateway(&agent, etcd, "/v3/kv/txn", &json!({"success": puts}));
        assert_eq!(v["succeeded"], true, "{v}");
        let rev: u64 = v["header"]["revision"].as_str().unwrap().parse().unwrap();
        revisions.extend(std::iter::repeat_n(rev, batch.len()));
    }
    revisions
}

fn wall_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

#[test]
fn ten_thousand_names_on_etcd_are_listed_in_seconds() {
    let etcd = Etcd::start();
    let n = 10_000;
    // Held leases as lockrun writes them: each name's one request, on a
    // lease of its own, granted (so its token is its key's revision).
    let made = Instant::now();
    let leases = grant_leases(&etcd, n, 600);
    let now = wall_ms();
    let kvs: Vec<(String, String, i64)> = (0..n)
        .map(|i| {
            let key = format!("lockrun:n{:05}/q/{:016x}", i + 1, leases[i]);
            (key, record(i + 1, now), leases[i])
        })
        .collect();
    let tokens = put_all(&etcd, &kvs);
    println!("10,000 held names written to etcd: {:?}", made.elapsed());
    let started = Instant::now();
    let ran = on(&etcd).arg("status").code(0);
    let took = started.elapsed();
    println!("status of 10,000 names on etcd: {took:?}");
    let out = ran.stdout();
    assert_eq!(out.lines().count(), n, "{}", ran.stderr());
    for (i, line) in out.lines().enumerate() {
        let want = format!(
            "n{:05}: held by host:{}, token {}, ",
            i + 1,
            i + 1,
            tokens[i]
        );
        assert!(line.starts_with(&want), "{line}, not {want}");
        assert!(line.contains(" left, for "), "{line}");
    }
    // One note: how the list was read.
    let ran = ran.says(&["one snapshot"]);
    assert!(!out.contains("5ec2e7") && !ran.stderr().contains("5ec2e7"));
    assert!(took < Duration::from_secs(10), "{took:?}");
    let started = Instant::now();
    let ran = on(&etcd).args(["status", "--json"]).code(0);
    let took = started.elapsed();
    println!("status --json of 10,000 names on etcd: {took:?}");
    let v = ran.json();
    let all = v.as_array().unwrap();
    assert_eq!(all.len(), n);
    for (i, st) in all.iter().enumerate() {
        assert_eq!(st["name"], format!("n{:05}", i + 1));
        assert_eq!(st["holder"], format!("host:{}", i + 1));
        assert_eq!(st["token"], tokens[i]);
        let left = st["ttl_left_ms"].as_u64().unwrap();
        assert!(left > 500_000 && left <= 600_000, "{st}");
        assert_eq!(st["waiters"], 0);
    }
    assert!(!ran.stdout().contains("5ec2e7"));
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn a_name_with_500_waiters_shows_in_one_read() {
    let etcd = Etcd::start();
    let n = 500;
    let leases = grant_leases(&etcd, n + 1, 600);
    let key = |i: usize| format!("lockrun:busy/q/{:016x}", leases[i]);
    // The holder first, then the waiters, each later than the one before.
    let token = put_all(&etcd, &[(key(0), record(0, wall_ms()), leases[0])])[0];
    let waiters: Vec<(String, String, i64)> =
        (1..=n).map(|i| (key(i), record(i, 0), leases[i])).collect();
    put_all(&etcd, &waiters);
    let started = Instant::now();
    let ran = on(&etcd).args(["status", "busy"]).code(0);
    let took = started.elapsed();
    println!("status of a name with 500 waiters on etcd: {took:?}");
    let want = format!("busy: held by host:0, token {token}, ");
    assert!(ran.stdout().starts_with(&want), "{}", ran.stdout());
    assert!(
        ran.stdout().trim_end().ends_with("; 500 waiting"),
        "{}",
        ran.stdout()
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    let started = Instant::now();
    let v = status_json(&etcd.url(), "busy");
    println!(
        "status --json of a name with 500 waiters on etcd: {:?}",
        started.elapsed()
    );
    assert_eq!(v["waiters"], 500);
    assert_eq!(v["holder"], "host:0");
    assert_eq!(v["token"], token);
    // Listed alike.
    let listed = on(&etcd).arg("status").code(0).stdout();
    assert!(listed.starts_with(&want), "{listed}");
    assert!(listed.trim_end().ends_with("; 500 waiting"), "{listed}");
}
