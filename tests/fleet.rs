//! A fleet on one name: more lockruns waiting for one name than the
//! server has connections for. The holder keeps its lease (its renewals
//! and its release need no new connection), the waiters ride out the
//! full server (never 69), and a request whose wait ends while the server
//! is full ends with the conflict code (75) and a line naming the limit.
//! A long queue costs the server little per waiter, and a burst of
//! arrivals keeps every place.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::mysql::{finish, holder};
use crate::support::*;

/// The holder's job: runs until the test lets it go (the file `go`), at
/// most a minute.
fn holding(scratch: &Scratch) -> String {
    format!(
        "echo $$ > {pid}; i=0; while [ ! -e {go} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done",
        pid = scratch.path("pid").display(),
        go = scratch.path("go").display()
    )
}

/// A lockrun at `url` with `args` (ending in the name) running `job`
/// (`holding`), once its job runs.
fn hold(url: &str, scratch: &Scratch, args: &[&str], job: &str) -> Reap {
    let holder = on(url)
        .args(args)
        .args(["-c", job])
        .stderr(Stdio::piped())
        .spawn();
    let holder = Reap(holder);
    assert!(
        wait_until(Duration::from_secs(20), || scratch.exists("pid")),
        "the holder never ran"
    );
    holder
}

/// A lockrun's exit code and stderr, waited for at most `limit`.
fn ended(r: &mut Reap, limit: Duration) -> (Option<i32>, String) {
    let status = wait_child(&mut r.0, limit);
    let mut err = String::new();
    if let Some(mut e) = r.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (status.code(), err)
}

/// Hold `fleet` with a short ttl (renewals every second), queue `waiters`
/// behind it, then take every connection the server has left for `url`'s
/// user with sessions of the test's own (`fill`) until `connections()`
/// reaches `slots`, and keep it so through a few renewals: the holder's job
/// ends 0 (its lease was never lost), a request that waits 3 s meanwhile
/// on another name ends 75 naming `limit`, as `-n` does; once the sessions
/// end, every waiter gets its turn (none gives up with 69).
fn fleet_keeps_its_holder(
    url: &str,
    waiters: usize,
    slots: usize,
    connections: impl Fn() -> usize,
    fill: impl Fn() -> Child,
    limit: &str,
) {
    let scratch = Scratch::new();
    let mut holder = hold(url, &scratch, &["--ttl", "3s", "fleet"], &holding(&scratch));
    let mut fleet: Vec<Reap> = (0..waiters)
        .map(|_| {
            Reap(
                on(url)
                    .args(["--ttl", "3s", "-w", "120s", "fleet", "true"])
                    .stderr(Stdio::piped())
                    .spawn(),
            )
        })
        .collect();
    let queued = wait_until(Duration::from_secs(60), || {
        status_json(url, "fleet")["waiters"].as_u64() == Some(waiters as u64)
    });
    assert!(queued, "the {waiters} waiters did not all queue");
    // One session more than the slots left: some are turned away, the
    // rest keep the server full.
    let mut sessions: Vec<Reap> = Vec::new();
    let mut peak = 0;
    let full = wait_until(Duration::from_secs(30), || {
        peak = peak.max(connections());
        if peak < slots && sessions.len() < 2 * slots {
            sessions.push(Reap(fill()));
        }
        peak >= slots
    });
    assert!(
        full,
        "the server never filled: {peak} of {slots} connections"
    );
    // Full for a few of the holder's renewals (one a second): a request
    // that waits 3 s on another name never gets a connection, nor does
    // -n within its bound on one request.
    let w = on(url).args(["-w", "3s", "other", "true"]).output();
    let err = w.stderr();
    assert_eq!(w.out.status.code(), Some(75), "-w on a full server: {err}");
    assert!(err.contains(limit), "the limit is not named: {err}");
    assert!(err.lines().count() <= 2, "one line per outage: {err}");
    let n = on(url).args(["-n", "other", "true"]).output();
    let err = n.stderr();
    assert_eq!(n.out.status.code(), Some(75), "-n on a full server: {err}");
    assert!(err.contains(limit), "the limit is not named: {err}");
    assert!(
        matches!(holder.0.try_wait(), Ok(None)),
        "the holder ended while the server was full"
    );
    sessions.clear();
    std::fs::write(scratch.path("go"), "").unwrap();
    let (code, err) = ended(&mut holder, Duration::from_secs(20));
    assert_eq!(code, Some(0), "the holder lost its lease: {err}");
    for (i, w) in fleet.iter_mut().enumerate() {
        let (code, err) = ended(w, Duration::from_secs(60));
        assert_eq!(code, Some(0), "waiter {i}: {err}");
        // Said once per outage, not once per try.
        let said = err.matches("waiting for a connection").count();
        assert!(said <= 2, "waiter {i} said the outage {said} times: {err}");
    }
}

/// A queue twice as long as the server has connections for: `n` waiters
/// join one after another behind a holder, and the connections they hold
/// stay under the server's `slots` (only the front of the queue waits on
/// one; `connections()` is sampled throughout), so none is ever turned
/// away; once the holder ends they run one at a time, in the order they
/// came, tokens rising.
fn queue_longer_than_the_server_has_connections(
    url: &str,
    n: usize,
    slots: usize,
    connections: impl Fn() -> usize + Send + Sync,
) {
    let scratch = Scratch::new();
    // Held until the whole queue formed, however long that takes.
    let job = holding(&scratch).replace("1200", "6000");
    let mut holder = hold(url, &scratch, &["q"], &job);
    let log = scratch.path("log");
    let done = std::sync::atomic::AtomicBool::new(false);
    /// Stops the sampler however the test ends.
    struct Done<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for Done<'_> {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let peak = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = 0;
            let started = Instant::now();
            while !done.load(std::sync::atomic::Ordering::Relaxed)
                && started.elapsed() < Duration::from_secs(300)
            {
                peak = peak.max(connections());
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        });
        let _done = Done(&done);
        let mut fleet: Vec<(Reap, std::path::PathBuf)> = Vec::new();
        for i in 0..n {
            let err = scratch.path(&format!("err{i}"));
            let job = format!(
                "echo {i} $LOCKRUN_TOKEN start >> {0}; sleep 0.05; echo {i} end >> {0}",
                log.display()
            );
            let w = on(url)
                .args(["-w", "240s", "q", "-c", &job])
                .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
                .spawn();
            fleet.push((Reap(w), err));
            // In arrival order: each joins the queue before the next starts.
            let mut seen = String::new();
            let queued = wait_until(Duration::from_secs(30), || {
                let status = on(url).args(["status", "--json", "q"]).output();
                seen = format!("{}{}", status.stdout(), status.stderr());
                serde_json::from_slice::<serde_json::Value>(&status.out.stdout)
                    .is_ok_and(|v| v["waiters"].as_u64() == Some(i as u64 + 1))
            });
            assert!(queued, "waiter {i} did not queue; status: {seen}");
        }
        std::fs::write(scratch.path("go"), "").unwrap();
        let (code, err) = ended(&mut holder, Duration::from_secs(20));
        assert_eq!(code, Some(0), "the holder: {err}");
        for (i, (w, err)) in fleet.iter_mut().enumerate() {
            let status = wait_child(&mut w.0, Duration::from_secs(240));
            let err = std::fs::read_to_string(err).unwrap();
            assert_eq!(status.code(), Some(0), "waiter {i}: {err}");
            assert!(
                !err.contains("waiting for a connection"),
                "waiter {i} found the server full: {err}"
            );
        }
        drop(_done);
        sampler.join().unwrap()
    });
    let runs = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = runs.lines().collect();
    assert_eq!(lines.len(), 2 * n, "{runs}");
    let mut last_token = 0u64;
    for (i, pair) in lines.chunks(2).enumerate() {
        let start: Vec<&str> = pair[0].split(' ').collect();
        assert_eq!(start[0], i.to_string(), "out of arrival order:\n{runs}");
        assert_eq!(pair[1], format!("{i} end"), "two jobs at once:\n{runs}");
        let token: u64 = start[1].parse().unwrap();
        assert!(token > last_token, "the token went back:\n{runs}");
        last_token = token;
    }
    eprintln!("a queue of {n}: at most {peak} connections of {slots}");
    // The sixteen nearest the front wait on a connection each, the holder
    // has two; the rest look now and then, each on one for a moment.
    assert!(
        peak < slots,
        "a queue of {n} held {peak} connections of the server's {slots}"
    );
}

/// PostgreSQL with 30 connections, 3 of them kept for superusers: the
/// role lockrun runs as has 27.
fn postgres_for_a_fleet() -> (Postgres, String) {
    let pg = Postgres::start_with(&["-c", "max_connections=30"]);
    on(&pg.url()).args(["x", "true"]).succeeds();
    pg.sql(&format!(
        "CREATE ROLE app LOGIN PASSWORD 'app-pw'; {}",
        crate::docs::documented_postgres_grants("app")
    ));
    let url = pg.url_as("app", "app-pw");
    (pg, url)
}

fn postgres_connections(pg: &Postgres) -> usize {
    pg.try_sql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'app'")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn postgres_holder_keeps_its_lease_on_a_full_server() {
    let _h = heavy();
    let (pg, url) = postgres_for_a_fleet();
    let fill = || pg.session_as("app", "app-pw", "SELECT pg_sleep(120)");
    fleet_keeps_its_holder(
        &url,
        10,
        27,
        || postgres_connections(&pg),
        fill,
        "max_connections",
    );
}

#[test]
fn postgres_queue_longer_than_the_server_has_connections() {
    let _h = heavy();
    let (pg, url) = postgres_for_a_fleet();
    queue_longer_than_the_server_has_connections(&url, 54, 27, || postgres_connections(&pg));
}

/// MariaDB with 30 connections (root may take one more, which the test's
/// own counting uses).
fn mariadb_for_a_fleet() -> (Mariadb, String) {
    let my = Mariadb::start_with(&["--max-connections=30"]);
    my.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'app-pw'; GRANT ALL ON app.* TO 'app'@'%'");
    let url = my.url_as("app", "app-pw", "app");
    on(&url).args(["x", "true"]).succeeds();
    (my, url)
}

/// Root's one connection past the limit may be taken for a moment by a
/// connection the server is still closing: a count that fails is none.
fn mariadb_connections(my: &Mariadb) -> usize {
    my.try_sql("SELECT COUNT(*) FROM information_schema.processlist WHERE user = 'app'")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn mariadb_holder_keeps_its_lease_on_a_full_server() {
    let _h = heavy();
    let (my, url) = mariadb_for_a_fleet();
    let fill = || my.session_as("app", "app-pw", "SELECT SLEEP(120)");
    fleet_keeps_its_holder(
        &url,
        10,
        30,
        || mariadb_connections(&my),
        fill,
        "max_connections",
    );
}

#[test]
fn mariadb_queue_longer_than_the_server_has_connections() {
    let _h = heavy();
    let (my, url) = mariadb_for_a_fleet();
    queue_longer_than_the_server_has_connections(&url, 60, 30, || mariadb_connections(&my));
}

/// ZooKeeper accepts a connection and closes it at once when its address
/// has `maxClientCnxns` already (the client saw only "no answer"): a
/// request rides that out as any full server, says the limit, and ends 75
/// when its wait does; once a connection is let go, a waiter gets in.
#[test]
fn zookeeper_full_address_is_waited_out() {
    let mut zk = Zookeeper::start();
    zk.server.restart_with("maxClientCnxns", "3");
    let url = zk.url();
    let port = zk.server.port;
    let closed_at_once = || {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        match std::io::Read::read(&mut s, &mut [0u8; 1]) {
            Ok(n) => n == 0,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    };
    // Three connections that say nothing take every one of this address.
    let mut taken = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            if taken.len() < 3 {
                taken.push(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
            }
            closed_at_once()
        }),
        "the server never refused a fourth connection"
    );
    let w = on(&url).args(["-w", "3s", "x", "true"]).output();
    let err = w.stderr();
    assert_eq!(w.out.status.code(), Some(75), "-w on a full server: {err}");
    assert!(
        err.contains("maxClientCnxns"),
        "the limit is not named: {err}"
    );
    let n = on(&url).args(["-n", "x", "true"]).output();
    let err = n.stderr();
    assert_eq!(n.out.status.code(), Some(75), "-n on a full server: {err}");
    assert!(
        err.contains("maxClientCnxns"),
        "the limit is not named: {err}"
    );
    let waiter = on(&url)
        .args(["-w", "60s", "x", "true"])
        .stderr(Stdio::piped())
        .spawn();
    let mut waiter = Reap(waiter);
    // Still waiting a moment later, not ended by the full server.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        matches!(waiter.0.try_wait(), Ok(None)),
        "the waiter gave up"
    );
    taken.clear();
    let (code, err) = ended(&mut waiter, Duration::from_secs(30));
    assert_eq!(code, Some(0), "the waiter did not get in: {err}");
}

/// Three times as many waiters on one address as ZooKeeper lets that
/// address connect (`maxClientCnxns` 5): those without a session ride the
/// full server out, and every one runs, one at a time, none refused.
#[test]
fn zookeeper_waiters_beyond_the_address_limit_all_run() {
    let _h = heavy();
    let mut zk = Zookeeper::start();
    zk.server.restart_with("maxClientCnxns", "5");
    let url = zk.url();
    let scratch = Scratch::new();
    let mut holder = hold(&url, &scratch, &["z"], &holding(&scratch));
    let log = scratch.path("log");
    let job = format!(
        "echo start >> {0}; sleep 0.05; echo end >> {0}",
        log.display()
    );
    let mut fleet: Vec<Reap> = (0..15)
        .map(|_| {
            Reap(
                on(&url)
                    .args(["-w", "120s", "z", "-c", &job])
                    .stderr(Stdio::piped())
                    .spawn(),
            )
        })
        .collect();
    // Long enough for the sessions the address may have to be taken, and
    // the others to be turned away a few times.
    std::thread::sleep(Duration::from_secs(3));
    std::fs::write(scratch.path("go"), "").unwrap();
    let (code, err) = ended(&mut holder, Duration::from_secs(20));
    assert_eq!(code, Some(0), "the holder: {err}");
    for (i, w) in fleet.iter_mut().enumerate() {
        let (code, err) = ended(w, Duration::from_secs(120));
        assert_eq!(code, Some(0), "waiter {i}: {err}");
    }
    let runs = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = runs.lines().collect();
    assert_eq!(lines.len(), 30, "{runs}");
    for pair in lines.chunks(2) {
        assert_eq!(pair, ["start", "end"], "two jobs at once:\n{runs}");
    }
}

/// Redis with `maxclients` 8: connections that take every other one do
/// not cost the holder its lease, since its renewals borrow the
/// connection it was granted on (a renewal's new connection was told "max
/// number of clients reached", a refusal that ended the lease at once);
/// a request that finds the server full rides it out (it was 69 at once).
#[test]
fn redis_holder_keeps_its_lease_on_a_full_server() {
    let redis = Redis::start_with(&["--maxclients", "8"]);
    // A database other than 0: a connection asks for it (SELECT) as it
    // opens, and hears there that the server is full.
    let url = format!("{}/1", redis.url());
    let scratch = Scratch::new();
    let mut holder = hold(
        &url,
        &scratch,
        &["--ttl", "3s", "fleet"],
        &holding(&scratch),
    );
    let port = redis.port;
    let refused = || {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let _ = std::io::Write::write_all(&mut s, b"PING\r\n");
        let mut buf = [0u8; 128];
        let n = std::io::Read::read(&mut s, &mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).contains("max number of clients")
    };
    let mut taken = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            taken.push(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
            refused()
        }),
        "the server never filled"
    );
    // Full through a few of the holder's renewals (one a second): a
    // waiter rides it out, a wait that ends meanwhile ends 75.
    let waiter = on(&url)
        .args(["-w", "60s", "fleet", "true"])
        .stderr(Stdio::piped())
        .spawn();
    let mut waiter = Reap(waiter);
    let w = on(&url).args(["-w", "3s", "other", "true"]).output();
    let err = w.stderr();
    assert_eq!(w.out.status.code(), Some(75), "-w on a full server: {err}");
    assert!(err.contains("maxclients"), "the limit is not named: {err}");
    assert!(
        matches!(holder.0.try_wait(), Ok(None)),
        "the holder ended while the server was full"
    );
    assert!(
        matches!(waiter.0.try_wait(), Ok(None)),
        "the waiter gave up"
    );
    taken.clear();
    std::fs::write(scratch.path("go"), "").unwrap();
    let (code, err) = ended(&mut holder, Duration::from_secs(20));
    assert_eq!(code, Some(0), "the holder lost its lease: {err}");
    let (code, err) = ended(&mut waiter, Duration::from_secs(30));
    assert_eq!(code, Some(0), "the waiter did not get in: {err}");
}

/// PgBouncer with `max_client_conn` 4, every client connection taken: it
/// turns a request away ("no more connections allowed", SQLSTATE 08P01),
/// which rides that out and ends 75 naming max_client_conn when its wait
/// does (it was 69, a refusal).
#[test]
fn pgbouncer_max_client_conn_is_a_full_server() {
    let pg = Postgres::start();
    let bouncer = Bouncer::start_with(&pg, 4);
    let port = bouncer.port;
    // A connection PgBouncer turns away hears so when it starts up.
    let refused = || {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let params = b"user\0postgres\0database\0postgres\0\0";
        let mut startup = ((8 + params.len()) as u32).to_be_bytes().to_vec();
        startup.extend(196608u32.to_be_bytes());
        startup.extend(params);
        let _ = std::io::Write::write_all(&mut s, &startup);
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut s, &mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).contains("max_client_conn")
    };
    let mut taken = Vec::new();
    assert!(
        wait_until(Duration::from_secs(10), || {
            taken.push(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
            refused()
        }),
        "PgBouncer never filled"
    );
    let w = on(&bouncer.url()).args(["-w", "3s", "x", "true"]).output();
    let err = w.stderr();
    assert_eq!(w.out.status.code(), Some(75), "-w on a full pooler: {err}");
    assert!(
        err.contains("max_client_conn"),
        "the limit is not named: {err}"
    );
    taken.clear();
    assert!(wait_until(Duration::from_secs(10), || !refused()));
    on(&bouncer.url())
        .args(["-w", "10s", "x", "true"])
        .succeeds();
}

/// Sixty waiters blocked on one name: each costs the server under one
/// statement a second, as ten do. (Their wake-up waits form one chain,
/// each on the place ahead, and the server calls a wait-for chain deeper
/// than 32 a deadlock: a waiter that dropped its connection then and
/// queued again looped at about ten statements a second.) Every one still
/// runs once the holder ends.
#[test]
fn sixty_waiters_cost_under_a_statement_a_second_each() {
    let _alone = heavy();
    let my = Mariadb::start();
    let url = my.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "q", "30s");
    let n = 60;
    let waiters: Vec<Child> = (0..n)
        .map(|_| on(&url).args(["-q", "-w", "120s", "q", "true"]).spawn())
        .collect();
    // Sixty starting lockruns on two loaded cores take a while.
    let mut seen = 0;
    let queued = wait_until(Duration::from_secs(60), || {
        seen = status_json(&url, "q")["waiters"].as_u64().unwrap_or(0);
        seen >= n
    });
    assert!(queued, "{seen} of {n} waiters queued within 60 s");
    let status = |what: &str| my.global_status(what);
    let before = status("Questions");
    let watched = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let spent = status("Questions") - before - 1;
    let per_waiter = spent as f64 / watched.elapsed().as_secs_f64() / n as f64;
    eprintln!(
        "{n} waiters: {spent} statements in {:?}, {per_waiter:.2} a second each",
        watched.elapsed()
    );
    assert!(
        per_waiter < 1.0,
        "{n} blocked waiters sent {spent} statements in {:?}: {per_waiter:.2} a second each",
        watched.elapsed()
    );
    assert_eq!(finish(&scratch, &mut h), Some(0));
    for w in waiters {
        let (code, err) = exited(w, Duration::from_secs(90));
        assert_eq!(code, Some(0), "{err}");
    }
}

/// A hundred requests arriving at once behind a holder: every one keeps
/// the place it took (none says it queued again), the queue costs the
/// server under a statement a second per waiter once it formed, and all
/// run, one at a time, once the holder ends.
#[test]
fn a_burst_of_a_hundred_keeps_every_place_and_runs_one_at_a_time() {
    let _alone = heavy();
    let my = Mariadb::start();
    let url = my.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "b", "30s");
    let n = 100;
    let log = scratch.path("log");
    let job = format!(
        "echo start >> {0}; sleep 0.02; echo end >> {0}",
        log.display()
    );
    let waiters: Vec<(Child, std::path::PathBuf)> = (0..n)
        .map(|i| {
            let err = scratch.path(&format!("err{i}"));
            let child = on(&url)
                .args(["-v", "-w", "180s", "b", "-c", &job])
                .stderr(Stdio::from(std::fs::File::create(&err).unwrap()))
                .spawn();
            (child, err)
        })
        .collect();
    let mut seen = serde_json::Value::Null;
    let queued = wait_until(Duration::from_secs(90), || {
        seen = status_json(&url, "b");
        seen["waiters"].as_u64().unwrap_or(0) >= n
    });
    assert!(queued, "{n} waiters not queued within 90 s; status: {seen}");
    let questions = || my.global_status("Questions");
    let before = questions();
    let watched = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    let spent = questions() - before - 1;
    let per_waiter = spent as f64 / watched.elapsed().as_secs_f64() / n as f64;
    eprintln!("a burst of {n}: {per_waiter:.2} statements a second each once queued");
    assert!(
        per_waiter < 1.0,
        "{n} queued waiters sent {spent} statements in {:?}",
        watched.elapsed()
    );
    assert_eq!(finish(&scratch, &mut h), Some(0));
    for (w, err) in waiters {
        let (code, _) = exited(w, Duration::from_secs(120));
        let err = std::fs::read_to_string(&err).unwrap();
        assert_eq!(code, Some(0), "{err}");
        assert!(!err.contains("queueing again"), "a place was lost: {err}");
    }
    let runs = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = runs.lines().collect();
    assert_eq!(lines.len(), 2 * n as usize, "{runs}");
    for pair in lines.chunks(2) {
        assert_eq!(pair, ["start", "end"], "two jobs at once:\n{runs}");
    }
}

/// The connections line of `doctor` at `url`, checked to be a warning that
/// names the limit as `limit` says it.
fn doctor_warns_of(url: &str, limit: &str) {
    let out = on(url).arg("doctor").output();
    let said = out.stdout();
    let line = said
        .lines()
        .find(|l| l.contains("connections:"))
        .unwrap_or_else(|| panic!("no connections check: {said}"));
    assert!(line.trim_start().starts_with("warn"), "{said}");
    assert!(line.contains(limit), "the limit is not named: {said}");
}

/// A server of 30 connections is too small for a fleet's queue beside
/// its other clients: doctor says so, naming the limit.
#[test]
fn doctor_says_a_small_connection_limit_does_not_fit_a_fleet() {
    let (_pg, url) = postgres_for_a_fleet();
    doctor_warns_of(&url, "max_connections less the superusers' 27");
    let (_my, url) = mariadb_for_a_fleet();
    doctor_warns_of(&url, "max_connections 30");
}

/// A queue that stood still behind a long job (its waiters far back
/// asleep for as long as their places allow) and then moves at a short
/// job's pace: each waiter far back is near again before the front reaches
/// it, so the queue never pauses for one still asleep.
#[test]
fn a_queue_that_stood_still_moves_without_waiting_for_sleepers() {
    let _alone = heavy();
    let my = Mariadb::start();
    let url = my.url();
    let scratch = Scratch::new();
    let job = holding(&scratch).replace("1200", "6000");
    let mut holder = hold(&url, &scratch, &["--ttl", "60s", "q"], &job);
    let log = scratch.path("log");
    let n = 40;
    let mut fleet = Vec::new();
    for i in 0..n {
        let job = format!(
            "echo {i} start $(date +%s%N) >> {0}; sleep 0.1; echo {i} end $(date +%s%N) >> {0}",
            log.display()
        );
        fleet.push(Reap(
            on(&url)
                .args(["--ttl", "60s", "-w", "240s", "q", "-c", &job])
                .spawn(),
        ));
        let queued = wait_until(Duration::from_secs(30), || {
            status_json(&url, "q")["waiters"].as_u64() == Some(i as u64 + 1)
        });
        assert!(queued, "waiter {i} did not queue");
    }
    // Long enough for the waiters far back to sleep as long as they may.
    std::thread::sleep(Duration::from_secs(10));
    std::fs::write(scratch.path("go"), "").unwrap();
    let (code, err) = ended(&mut holder, Duration::from_secs(20));
    assert_eq!(code, Some(0), "the holder: {err}");
    for (i, w) in fleet.iter_mut().enumerate() {
        let status = wait_child(&mut w.0, Duration::from_secs(240));
        assert_eq!(status.code(), Some(0), "waiter {i}");
    }
    let runs = std::fs::read_to_string(&log).unwrap();
    let stamps: Vec<(usize, &str, u64)> = runs
        .lines()
        .map(|l| {
            let v: Vec<&str> = l.split(' ').collect();
            (v[0].parse().unwrap(), v[1], v[2].parse().unwrap())
        })
        .collect();
    assert_eq!(stamps.len(), 2 * n, "{runs}");
    // From one job's end to the next one's start.
    let pauses: Vec<(usize, f64)> = stamps
        .chunks(2)
        .zip(stamps.chunks(2).skip(1))
        .map(|(a, b)| {
            assert_eq!(
                (a[0].0, a[0].1, a[1].0, a[1].1),
                (a[0].0, "start", a[0].0, "end"),
                "{runs}"
            );
            (b[0].0, (b[0].2 - a[1].2) as f64 / 1e6)
        })
        .collect();
    let (at, longest) = pauses
        .iter()
        .copied()
        .fold((0, 0.0), |m, p| if p.1 > m.1 { p } else { m });
    eprintln!("{n} hand-offs after a long job: the longest {longest:.1} ms, before waiter {at}");
    assert!(
        longest < 1000.0,
        "the queue paused {longest:.1} ms before waiter {at}: {pauses:?}"
    );
}

/// A fleet beyond an address's `maxClientCnxns`, its connections coming
/// and going: a waiter's session request is closed at once, while a
/// connection that asks nothing (lockrun's check of why) finds a slot
/// free. That is a full server too, ridden out until a session is had,
/// never 69 (one or two waiters of 500 exited 69, "no available hosts").
#[test]
fn zookeeper_sessions_closed_while_connections_are_taken_are_waited_out() {
    let zk = Zookeeper::start();
    let proxy = ZkProxy::start(zk.server.port);
    proxy.set_refuse_sessions(true);
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let waiter = on(&proxy.url())
        .args(["-w", "60s", "z", "--", "touch"])
        .arg(&ran)
        .stderr(Stdio::piped())
        .spawn();
    let mut waiter = Reap(waiter);
    // Longer than every try at a session takes (a call's bound for each
    // server, and once more).
    std::thread::sleep(Duration::from_secs(15));
    proxy.set_refuse_sessions(false);
    let (code, err) = ended(&mut waiter, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert!(scratch.exists("ran"), "{err}");
    assert!(err.contains("maxClientCnxns"), "{err}");
}
