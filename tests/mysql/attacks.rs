//! Attacks on the MySQL/MariaDB engine: server settings an operator may
//! have chosen, URLs an operator may have written, and races. Each test
//! states what it shows; a failing one is a defect of the engine.

use std::process::{Child, Stdio};
use std::time::Duration;

use crate::support::*;

/// A job that records its shell's pid in `pid_file`, then sleeps `secs`.
fn long_job(pid_file: &std::path::Path, secs: u32) -> String {
    format!("echo $$ > {}; sleep {secs}", pid_file.display())
}

/// A server whose global `autocommit` is off (a setting some operators
/// choose in my.cnf, or give non-SUPER users through init_connect): the
/// holder's renewals and its release are plain statements that the server
/// then never commits (src/backend/mysql/sql.rs `session` sets no
/// `autocommit = 1`; src/backend/mysql/mod.rs `MyRenewer::renew` and
/// `MyHeld::release` send no COMMIT). On the server the lease lapses one
/// ttl after the grant while the job runs on; only the row lock of the
/// uncommitted renewal keeps a waiter out (it then fails on lock wait
/// timeouts until it gives up, well before its -w). Once that connection is cut
/// (a KILL, a proxy, a failover: what lockrun otherwise rides out), the
/// waiter is granted at once while the first job still runs: two jobs at
/// once. The release is rolled back too: the row stays behind, and the
/// holder is told its lease was "no longer ours".
#[test]
fn autocommit_off_on_the_server_still_renews_and_releases() {
    let _h = heavy();
    let my = Mariadb::start_with(&["--autocommit=0"]);
    let url = my.url();
    let scratch = Scratch::new();
    let a_pid = scratch.path("a_pid");
    let mut a = on(&url)
        .args(["-v", "--ttl", "3s", "ac", "-c", &long_job(&a_pid, 10)])
        .stderr(Stdio::from(
            std::fs::File::create(scratch.path("a_err")).unwrap(),
        ))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("a_pid")));
    // B waits for the name; when its job starts, A's job must be gone.
    let b = on(&url)
        .args(["-v", "--ttl", "3s", "-w", "40s", "ac", "-c"])
        .arg(format!(
            "if kill -0 $(cat {}) 2>/dev/null; then echo overlap; else echo alone; fi",
            a_pid.display()
        ))
        .stderr(Stdio::from(
            std::fs::File::create(scratch.path("b_err")).unwrap(),
        ))
        .stdout(Stdio::piped())
        .spawn();
    // A renews every second; what the server has committed lapses anyway.
    let lapsed = wait_until(Duration::from_secs(15), || {
        my.sql(
            "SELECT COUNT(*) FROM app.lockrun_leases \
             WHERE name = 'ac' AND expires_at < UTC_TIMESTAMP(6)",
        )
        .trim()
            == "1"
    });
    // Cut every connection of lockrun's once, as the engine's own tests
    // do to show the lease survives it.
    let ids = my.sql(
        "SELECT id FROM information_schema.processlist WHERE db = 'app' \
         AND id <> CONNECTION_ID()",
    );
    for id in ids.split_whitespace() {
        my.try_kill(id);
    }
    let out = b.wait_with_output().unwrap();
    let _ = wait_child(&mut a, Duration::from_secs(30));
    let logs = format!("A: {}\nB: {}", scratch.read("a_err"), scratch.read("b_err"));
    assert_eq!(
        text(&out.stdout).trim(),
        "alone",
        "B's job ran while A's did; {logs}"
    );
    assert!(
        !lapsed,
        "the running job's lease lapsed on the server; {logs}"
    );
    assert!(
        !scratch.read("a_err").contains("no longer ours"),
        "A's lease was lost without a word from the server; {logs}"
    );
    let left = my.sql("SELECT COUNT(*) FROM app.lockrun_leases");
    assert_eq!(left.trim(), "0", "a released lease stayed behind; {logs}");
}

/// A password that holds `/` or `?` unescaped (as passwords made by a
/// generator often do): lockrun must not print any part of it, as the
/// Redis engine does not. The MySQL URL reader splits at the first `?`
/// and `/` before it looks for the `@`, so the password's start becomes
/// a "port" quoted in the error, or the whole password becomes part of
/// the "host:port/database" shown in every message.
#[test]
fn a_password_with_a_slash_or_question_mark_is_never_printed() {
    let my = MyDb::new();
    let port = my.server.port;
    for (pw, pieces) in [
        ("Zq9?Xw7", &["Zq9", "Xw7"][..]),
        ("Zq9/Xw7", &["Zq9", "Xw7"][..]),
        ("4321/Xw7", &["4321", "Xw7"][..]),
    ] {
        for url in [
            format!("mysql://root:{pw}@127.0.0.1:{port}/{}", my.db),
            format!("mysql://root:{pw}@127.0.0.1"),
        ] {
            let out = on(&url).args(["--timeout", "5s", "pw", "true"]).output();
            let all = format!("{}{}", out.stdout(), out.stderr());
            for p in pieces {
                assert!(
                    !all.contains(p),
                    "{url}: part {p:?} of the password shown: {all}"
                );
            }
        }
    }
}

/// A holder whose job runs until the scratch file `done` appears (or 60 s
/// pass); returns once its job runs.
fn holder(url: &str, scratch: &Scratch, name: &str, ttl: &str) -> Child {
    let child = on(url)
        .args(["--ttl", ttl, name, "-c"])
        .arg(format!(
            "echo $$ > {}; i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
            scratch.path("pid").display(),
            scratch.path("done").display()
        ))
        .stderr(Stdio::null())
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("pid")));
    child
}

/// A server with `max_statement_time` set (MariaDB's guard against
/// runaway queries, often set globally): every GET_LOCK a waiter blocks
/// in is cut off after that time, and the waiter asks again at once, so
/// ten waiters cost the server several times the ten statements a second
/// they cost without it. The engine's session (src/backend/mysql/sql.rs
/// `session`) does not lift the limit for its own connections.
#[test]
fn max_statement_time_on_the_server_does_not_make_waiters_poll() {
    let _h = heavy();
    let my = Mariadb::start_with(&["--max-statement-time=0.5"]);
    let url = my.url();
    let scratch = Scratch::new();
    let mut h = holder(&url, &scratch, "q", "30s");
    let waiters: Vec<Reap> = (0..10)
        .map(|_| Reap(on(&url).args(["-q", "q", "true"]).spawn()))
        .collect();
    wait_queued(&url, "q", 10);
    let questions = || my.global_status("Questions");
    let before = questions();
    let watched = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    let spent = questions() - before - 1;
    let per_second = spent as f64 / watched.elapsed().as_secs_f64();
    std::fs::write(scratch.path("done"), "").unwrap();
    let _ = wait_child(&mut h, Duration::from_secs(30));
    for mut w in waiters {
        let _ = wait_child(&mut w.0, Duration::from_secs(30));
    }
    assert!(per_second < 10.0, "ten waiters: {spent} statements in 10 s");
}

/// `release --force --now` wakes the name's waiters with `KILL QUERY` of
/// the connection ids their rows recorded (src/backend/mysql/mod.rs, the
/// `waiting_conns` poke; src/backend/mysql/client.rs `poke`). Connection
/// ids start again from 1 when the server restarts, so the row of a
/// waiter that died just before a restart names a connection that is now
/// someone else's: lockrun interrupts an unrelated client's query.
#[test]
fn release_force_now_after_a_restart_interrupts_no_stranger() {
    let _h = heavy();
    let mut my = Mariadb::start();
    let url = my.url();
    let scratch = Scratch::new();
    let mut h = holder(&url, &scratch, "kq", "60s");
    let mut w = on(&url)
        .args(["--ttl", "60s", "-q", "kq", "true"])
        .stderr(Stdio::null())
        .spawn();
    wait_queued(&url, "kq", 1);
    let stale: u64 = my
        .sql("SELECT conn FROM app.lockrun_waiters")
        .trim()
        .parse()
        .unwrap();
    signal(w.id() as i32, libc::SIGKILL);
    let _ = w.wait();
    my.restart();
    // Strangers: clients that run a long query, on the ids that come next.
    let socket = my.socket();
    let strangers: Vec<Reap> = (0..stale + 20)
        .map(|_| {
            Reap(
                std::process::Command::new("mariadb")
                    .arg("--no-defaults")
                    .arg(format!("--socket={}", socket.display()))
                    .args(["--skip-ssl", "-uroot", "-N", "-B", "-e", "SELECT SLEEP(40)"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    let sleeping = |id: u64| {
        my.sql(&format!(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE id = {id} AND info LIKE 'SELECT SLEEP(40)%'"
        ))
        .trim()
            == "1"
    };
    let n = strangers.len();
    assert!(wait_until(Duration::from_secs(20), || {
        my.sql(
            "SELECT COUNT(*) FROM information_schema.processlist \
             WHERE info LIKE 'SELECT SLEEP(40)%'",
        )
        .trim()
            == n.to_string()
    }));
    let live = my.sql(&format!(
        "SELECT COUNT(*) FROM app.lockrun_waiters WHERE conn = {stale} \
         AND expires_at > UTC_TIMESTAMP(6)"
    ));
    assert_eq!(live.trim(), "1", "the dead waiter's place is still live");
    assert!(sleeping(stale), "connection {stale} is now a stranger's");
    on(&url)
        .args(["release", "--force", "--now", "kq"])
        .succeeds();
    std::thread::sleep(Duration::from_millis(500));
    let ok = sleeping(stale);
    let _ = wait_child(&mut h, Duration::from_secs(30));
    drop(strangers);
    assert!(
        ok,
        "lockrun interrupted connection {stale}, a stranger's query"
    );
}

/// A user that may create lockrun's tables through a grant written with
/// the escaped `_` the MySQL manual recommends (`my\_app`.*): doctor says
/// "fail" (exit 69) although the first run creates the tables. doctor
/// compares SHOW GRANTS text with the database name literally
/// (src/backend/mysql/doctor.rs `may_create`), so any grant pattern
/// (`\_`, `%`) is missed.
#[test]
fn doctor_does_not_fail_a_user_whose_grant_escapes_the_underscore() {
    let my = MyDb::new();
    let user = format!("dr{}", my.db);
    let escaped = my.db.replace('_', "\\_");
    my.sql(&format!(
        "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'Dr-pw-1'; \
         GRANT ALL PRIVILEGES ON `{escaped}`.* TO '{user}'@'127.0.0.1'"
    ));
    let url = my.server.url_as(&user, "Dr-pw-1", &my.db);
    let doctor = on(&url).arg("doctor").output();
    // The user may: the first run creates the tables and runs the job.
    on(&url).args(["x", "-c", "echo ran"]).succeeds();
    assert_ne!(
        doctor.out.status.code(),
        Some(69),
        "doctor failed a user that may create the tables: {}",
        doctor.stdout()
    );
}

/// A user that may only read lockrun's tables, but holds INSERT, UPDATE
/// and DELETE on another database: doctor says the user "may read and
/// write them" (ok), and the first run is refused. doctor looks for the
/// privilege words anywhere in SHOW GRANTS, whatever database a grant is
/// on (src/backend/mysql/doctor.rs `tables`).
#[test]
fn doctor_does_not_pass_a_user_that_may_not_write_the_tables() {
    let my = MyDb::new();
    on(&my.url()).args(["x", "true"]).succeeds();
    let other = my.server.database();
    let user = format!("rd{}", my.db);
    my.sql(&format!(
        "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'Rd-pw-1'; \
         GRANT SELECT ON `{db}`.* TO '{user}'@'127.0.0.1'; \
         GRANT INSERT, UPDATE, DELETE ON `{other}`.* TO '{user}'@'127.0.0.1'",
        db = my.db
    ));
    let url = my.server.url_as(&user, "Rd-pw-1", &my.db);
    let run = on(&url).args(["x", "true"]).output();
    assert_ne!(run.out.status.code(), Some(0), "a read-only user ran a job");
    let doctor = on(&url).arg("doctor").output();
    assert_ne!(
        doctor.out.status.code(),
        Some(0),
        "doctor passed a user that cannot take a lease ({}): {}",
        run.stderr(),
        doctor.stdout()
    );
}

/// A certificate made by our own CA for `db.internal` and 127.0.0.1 alone.
fn make_certs(dir: &std::path::Path) {
    let sh = |cmd: &str| {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(dir)
            .output()
            .expect("run sh");
        assert!(out.status.success(), "{cmd}: {}", text(&out.stderr));
    };
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
        -subj /CN=lockrun-red-ca 2>/dev/null",
    );
    sh(
        "openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr \
        -subj /CN=db.internal 2>/dev/null",
    );
    sh("printf 'subjectAltName=IP:127.0.0.1,DNS:db.internal\\n' > ext");
    sh(
        "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt \
        -days 2 -extfile ext 2>/dev/null",
    );
    sh("chmod 644 srv.key");
}

/// VERIFY_IDENTITY against a server whose certificate (of the right CA)
/// names another host than the URL's: refused, as the mysql client
/// refuses it; VERIFY_CA, which checks the CA alone, connects.
#[test]
fn verify_identity_refuses_a_certificate_for_another_name() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let p = |f: &str| certs.path().join(f).display().to_string();
    let my = Mariadb::start_with(&[
        &format!("--ssl-cert={}", p("srv.crt")),
        &format!("--ssl-key={}", p("srv.key")),
    ]);
    let ca = p("ca.crt");
    let base = format!("mysql://root:{MY_PASSWORD}@localhost:{}/app", my.port);
    on(&format!("{base}?ssl-mode=VERIFY_CA"))
        .args(["--tls-ca", &ca, "x", "true"])
        .succeeds();
    let out = on(&format!("{base}?ssl-mode=VERIFY_IDENTITY"))
        .args(["--tls-ca", &ca, "x", "true"])
        .code(69);
    assert!(!out.stderr().contains(MY_PASSWORD));
}

/// A user whose connections are capped (MAX_USER_CONNECTIONS, or the
/// server's max_user_connections): the holder opens its renewal
/// connection only at the first renewal, finds every connection taken by
/// waiters, and treats the server's 1226 ("has exceeded the
/// 'max_user_connections' resource"; 1203 likewise) as a refusal: "lease
/// lost", the job stopped at once, although the lease had two thirds of
/// its ttl left to retry in. A crowd of waiters kills the job it waits
/// for. (src/backend/mysql/client.rs `transient_code` lists 1040, too
/// many connections, but neither 1203 nor 1226.)
#[test]
fn waiters_that_fill_the_connections_do_not_stop_the_holders_job() {
    let my = MyDb::new();
    let user = format!("mc{}", my.db);
    my.sql(&format!(
        "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY 'Mc-pw-1' \
           WITH MAX_USER_CONNECTIONS 3; \
         GRANT ALL PRIVILEGES ON `{}`.* TO '{user}'@'127.0.0.1'",
        my.db
    ));
    let url = my.server.url_as(&user, "Mc-pw-1", &my.db);
    let scratch = Scratch::new();
    let h = on(&url)
        .args([
            "--ttl",
            "6s",
            "mc",
            "-c",
            &long_job(&scratch.path("pid"), 5),
        ])
        .stderr(Stdio::piped())
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("pid")));
    let waiters: Vec<Reap> = (0..2)
        .map(|_| {
            Reap(
                on(&url)
                    .args(["-q", "-w", "60s", "mc", "true"])
                    .stderr(Stdio::null())
                    .spawn(),
            )
        })
        .collect();
    let (code, err) = exited(h, Duration::from_secs(40));
    for mut w in waiters {
        let _ = wait_child(&mut w.0, Duration::from_secs(60));
    }
    assert_eq!(code, Some(0), "the holder's job was stopped: {err}");
}

/// Ten lockruns take one name in turn while every connection of theirs
/// is killed again and again (KILL CONNECTION, as a failover or a proxy
/// restart would): whatever is cut, no two jobs overlap and tokens only
/// rise. A job may be stopped (its lockrun exits 76 or 69), never doubled.
#[test]
fn connections_killed_at_random_never_let_two_jobs_overlap() {
    let _h = heavy();
    let my = MyDb::new();
    let url = my.url();
    let scratch = Scratch::new();
    let log = scratch.path("log");
    let job = format!(
        "echo start $LOCKRUN_TOKEN >> {l}; sleep 0.3; echo end $LOCKRUN_TOKEN >> {l}",
        l = log.display()
    );
    let children: Vec<Reap> = (0..10)
        .map(|_| {
            Reap(
                on(&url)
                    .args(["--ttl", "3s", "-w", "120s", "kc", "-c", &job])
                    .stderr(Stdio::null())
                    .spawn(),
            )
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let stop = stop.clone();
        let db = my.db.clone();
        let server = my.server;
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let ids = server.sql(&format!(
                    "SELECT id FROM information_schema.processlist WHERE db = '{db}' \
                     AND id <> CONNECTION_ID() ORDER BY RAND() LIMIT 2"
                ));
                for id in ids.split_whitespace() {
                    server.try_kill(id);
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(70 + (n * 37) % 90));
            }
        })
    };
    let mut codes = Vec::new();
    for mut c in children {
        codes.push(wait_child(&mut c.0, Duration::from_secs(150)).code());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    killer.join().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    // Every start is followed by its own end, or by nothing (a stopped
    // job) and then no other job's lines before the lease could lapse.
    let mut last = 0u64;
    let mut open: Option<u64> = None;
    for line in text.lines() {
        let (what, t) = line.split_once(' ').unwrap();
        let t: u64 = t.parse().unwrap();
        match what {
            "start" => {
                assert!(t > last, "token {t} after {last}: {text}");
                if let Some(o) = open {
                    // A job that never ended: it must have been stopped
                    // (not still running): allowed only if stopped.
                    assert!(
                        !text.contains(&format!("end {o}")),
                        "job {o} ended after job {t} started: {text}"
                    );
                }
                open = Some(t);
                last = t;
            }
            _ => {
                assert_eq!(
                    open,
                    Some(t),
                    "job {t} ended inside another's run: {text}\n{codes:?}"
                );
                open = None;
            }
        }
    }
}

/// Names that MariaDB's default collations call equal ("Deploy" and
/// "deploy", "é" and "e", "a " and "a") are distinct locks everywhere:
/// taking, status and release agree.
#[test]
fn names_equal_under_a_collation_are_distinct_everywhere() {
    let my = MyDb::new();
    let url = my.url();
    for (a, b) in [
        ("Deploy", "deploy"),
        ("é", "e"),
        ("a ", "a"),
        ("x_y", "x%y"),
        ("𝄞", "\u{fffd}"),
    ] {
        let scratch = Scratch::new();
        let mut h = holder(&url, &scratch, a, "10s");
        on(&url).args(["-n", b, "true"]).succeeds();
        let st = on(&url).args(["status", "--json", b]).output().json();
        assert_eq!(
            st["held"], false,
            "{b:?} shows as held while {a:?} is: {st}"
        );
        on(&url).args(["release", "--force", b]).code(1);
        let st = on(&url).args(["status", "--json", a]).output().json();
        assert_eq!(st["held"], true, "{a:?}: {st}");
        std::fs::write(scratch.path("done"), "").unwrap();
        assert_eq!(wait_child(&mut h, Duration::from_secs(30)).code(), Some(0));
    }
}

/// Server-wide sql_mode values that change how SQL reads (ORACLE,
/// ANSI_QUOTES, NO_BACKSLASH_ESCAPES, PIPES_AS_CONCAT, none at all):
/// a hand-off through the queue, --supersede, --preempt and status work.
#[test]
fn sql_modes_that_change_how_sql_reads_change_nothing() {
    let _h = heavy();
    for mode in ["ORACLE", "ANSI,NO_BACKSLASH_ESCAPES", ""] {
        let my = Mariadb::start_with(&[&format!("--sql-mode={mode}")]);
        let url = my.url();
        let scratch = Scratch::new();
        let mut h = holder(&url, &scratch, "m", "10s");
        let mut w = on(&url).args(["-q", "-w", "30s", "m", "true"]).spawn();
        wait_queued(&url, "m", 1);
        let sup = on(&url)
            .args(["--supersede", "-q", "-w", "30s", "m", "true"])
            .spawn();
        wait_queued(&url, "m", 2);
        let sup2 = on(&url)
            .args(["--supersede", "-q", "-w", "30s", "m", "true"])
            .spawn();
        let (code, err) = exited(sup, Duration::from_secs(30));
        assert_eq!(
            code,
            Some(75),
            "{mode}: the older --supersede request: {err}"
        );
        std::fs::write(scratch.path("done"), "").unwrap();
        assert_eq!(
            wait_child(&mut h, Duration::from_secs(30)).code(),
            Some(0),
            "{mode}"
        );
        assert_eq!(
            wait_child(&mut w, Duration::from_secs(30)).code(),
            Some(0),
            "{mode}"
        );
        let (code, err) = exited(sup2, Duration::from_secs(30));
        assert_eq!(code, Some(0), "{mode}: {err}");
        let s2 = Scratch::new();
        let mut h2 = holder(&url, &s2, "p", "10s");
        on(&url)
            .args(["--preempt", "-q", "-w", "30s", "p", "true"])
            .succeeds();
        assert_ne!(
            wait_child(&mut h2, Duration::from_secs(30)).code(),
            Some(0),
            "{mode}"
        );
        assert_eq!(
            my.sql("SELECT COUNT(*) FROM app.lockrun_leases").trim(),
            "0",
            "{mode}"
        );
    }
}

/// Ten lockruns at once on a fresh --prefix, with a status and a doctor
/// among them: the tables are made once, every job runs, tokens differ.
#[test]
fn ten_first_users_of_a_fresh_prefix_all_succeed() {
    let my = MyDb::new();
    let url = my.url();
    let scratch = Scratch::new();
    let children: Vec<Child> = (0..10)
        .map(|i| {
            on(&url)
                .args(["--prefix", "fresh_p:", "-w", "60s", "t", "-c"])
                .arg(format!(
                    "echo $LOCKRUN_TOKEN > {}",
                    scratch.path(&format!("t{i}")).display()
                ))
                .stderr(Stdio::piped())
                .spawn()
        })
        .collect();
    on(&url)
        .args(["--prefix", "fresh_p:", "status", "t"])
        .output();
    on(&url).args(["--prefix", "fresh_p:", "doctor"]).output();
    for c in children {
        let (code, err) = exited(c, Duration::from_secs(90));
        assert_eq!(code, Some(0), "{err}");
    }
    let mut tokens: Vec<String> = (0..10).map(|i| scratch.read(&format!("t{i}"))).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 10, "{tokens:?}");
    let n = my.sql(&format!(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{}'",
        my.db
    ));
    assert_eq!(n.trim(), "3");
}

/// The connection a waiter blocks in (GET_LOCK) is killed again and
/// again: the waiter neither gives up nor loses its turn, and is granted
/// at the release.
#[test]
fn killing_the_waiters_blocking_connection_keeps_it_waiting() {
    let my = MyDb::new();
    let url = my.url();
    let scratch = Scratch::new();
    let mut h = holder(&url, &scratch, "kw", "30s");
    let w = on(&url)
        .args(["-q", "-w", "60s", "kw", "-c", "echo got"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    wait_queued(&url, "kw", 1);
    for _ in 0..5 {
        let ids = my.sql(
            "SELECT id FROM information_schema.processlist WHERE info LIKE '%GET_LOCK%' \
             AND id <> CONNECTION_ID()",
        );
        for id in ids.split_whitespace() {
            my.server.try_kill(id);
        }
        std::thread::sleep(Duration::from_millis(400));
    }
    wait_queued(&url, "kw", 1);
    let released = std::time::Instant::now();
    std::fs::write(scratch.path("done"), "").unwrap();
    assert_eq!(wait_child(&mut h, Duration::from_secs(30)).code(), Some(0));
    let out = w.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "{:?}",
        released.elapsed()
    );
}

/// A server that logs statements for replication (binlog_format =
/// STATEMENT, the MySQL 5.x default still found on old primaries):
/// lockrun runs a job and hands the name on. It does not: every session
/// is READ COMMITTED (src/backend/mysql/sql.rs `session`), under which
/// InnoDB cannot log statements, so every write fails with 1665 (exit 69)
/// after the tables were created; and doctor passes the server.
#[test]
fn a_statement_binlog_server_runs_jobs() {
    let _h = heavy();
    let my = Mariadb::start_with(&[
        "--log-bin=binlog",
        "--binlog-format=STATEMENT",
        "--server-id=1",
    ]);
    let url = my.url();
    let doctor = on(&url).arg("doctor").output();
    let out = on(&url).args(["sb", "-c", "echo ran"]).output();
    if out.out.status.code() != Some(0) {
        assert_ne!(
            doctor.out.status.code(),
            Some(0),
            "doctor passed a server where no job can run: {}",
            doctor.stdout()
        );
    }
    assert_eq!(out.out.status.code(), Some(0), "{}", out.stderr());
    let scratch = Scratch::new();
    let mut h = holder(&url, &scratch, "sb", "3s");
    let w = on(&url)
        .args(["-q", "-w", "30s", "sb", "-c", "echo got"])
        .stderr(Stdio::piped())
        .spawn();
    wait_queued(&url, "sb", 1);
    std::fs::write(scratch.path("done"), "").unwrap();
    assert_eq!(wait_child(&mut h, Duration::from_secs(30)).code(), Some(0));
    let (code, err) = exited(w, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
}

/// A server that puts every new table in Aria (enforce_storage_engine,
/// without NO_ENGINE_SUBSTITUTION; the same tables an operator made or
/// altered to a non-transactional engine): lockrun's CREATE TABLE …
/// ENGINE=InnoDB silently makes tables without transactions or row locks,
/// so `SELECT … FOR UPDATE` on the counter serializes nothing: lockruns
/// that start together all take the name. lockrun must refuse such
/// tables, or keep the jobs apart; also a request that found no tables at
/// its first look and then finds those another request just made.
#[test]
fn tables_without_transactions_are_refused_or_still_exclusive() {
    let _h = heavy();
    let my = Mariadb::start_with(&["--enforce-storage-engine=Aria", "--sql-mode="]);
    let url = my.url();
    let engines = || {
        my.sql(
            "SELECT GROUP_CONCAT(DISTINCT engine) FROM information_schema.tables \
             WHERE table_schema = 'app'",
        )
    };
    for round in 0..4 {
        let scratch = Scratch::new();
        let log = scratch.path("log");
        let job = format!(
            "echo start $LOCKRUN_TOKEN >> {l}; sleep 0.1; echo end $LOCKRUN_TOKEN >> {l}",
            l = log.display()
        );
        let name = format!("e{round}");
        // Tables of their own each round: all sixteen meet them missing,
        // and one of them creates them while the others look.
        let prefix = format!("r{round}");
        let children: Vec<Child> = (0..16)
            .map(|_| {
                on(&url)
                    .args(["--prefix", &prefix])
                    .args(["--ttl", "5s", "-w", "90s", &name, "-c", &job])
                    .stderr(Stdio::piped())
                    .spawn()
            })
            .collect();
        for c in children {
            let _ = exited(c, Duration::from_secs(120));
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for pair in lines.chunks(2) {
            let same =
                pair.len() == 2 && pair[0].strip_prefix("start ") == pair[1].strip_prefix("end ");
            assert!(
                same,
                "tables in {}: jobs overlapped: {text}",
                engines().trim()
            );
        }
    }
}

/// A waiter stopped (SIGSTOP, a debugger, a frozen container) between the
/// two round trips of one look keeps its transaction open, and with it the
/// row lock on the name's counter: every later request then fails on lock
/// wait timeouts. The server ends such a connection once it has been idle in
/// the transaction for twice the bound on one request, so the name is free
/// again within seconds, not after the server's `wait_timeout` (8 hours).
#[test]
fn a_waiter_stopped_inside_its_look_blocks_the_name_for_seconds_only() {
    let db = MyDb::new();
    let url = db.url();
    on(&url).args(["sw", "true"]).succeeds();
    let tokens = format!("`{}`.`lockrun_tokens`", db.db);
    let scratch = Scratch::new();
    let go = scratch.path("go");
    // A holder with a short lease: a blocked waiter that sees nothing move
    // keeps its place without a look, and looks again when what is in its
    // way could lapse, here every few seconds.
    let holder = on(&url)
        .args(["--ttl", "6s", "sw", "-c"])
        .arg(format!(
            "while [ ! -e {} ]; do sleep 0.05; done",
            go.display()
        ))
        .spawn();
    let _holder = Reap(holder);
    wait_until(Duration::from_secs(20), || {
        status_json(&url, "sw")["holders"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    });
    // A short ttl: the waiter's looks wait on a row lock a second at most.
    let werr = std::fs::File::create(scratch.path("waiter")).unwrap();
    let waiter = on(&url)
        .args(["-vv", "--ttl", "3s", "-w", "60", "sw", "true"])
        .stderr(werr)
        .spawn();
    let wpid = waiter.id() as i32;
    let _waiter = Reap(waiter);
    let trx = |state: &str| {
        db.sql(&format!(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE {state}"
        ))
        .trim()
            != "0"
    };
    // An operator's transaction holds the counter row; the waiter's look
    // blocks on it and is stopped right there; the operator commits, and
    // the stopped waiter's transaction has the row. (Tried again in the
    // rare case that its lock wait ran out in between.)
    let mut held = false;
    for _ in 0..5 {
        let mut root = std::process::Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", db.server.socket().display()))
            .args(["--skip-ssl", "-uroot"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("run mariadb");
        let mut sql = root.stdin.take().unwrap();
        use std::io::Write;
        writeln!(
            sql,
            "START TRANSACTION; SELECT token FROM {tokens} WHERE name = 'sw' FOR UPDATE;"
        )
        .unwrap();
        // Its looks now wait on the row, each for its lock wait bound (a
        // second) before it tries again: once one ran out, the next one is
        // under way a moment later.
        let waits = || {
            scratch
                .read("waiter")
                .matches("Lock wait timeout exceeded")
                .count()
        };
        let before = waits();
        let blocked = wait_until(Duration::from_secs(20), || waits() > before);
        std::thread::sleep(Duration::from_millis(300));
        signal(wpid, libc::SIGSTOP);
        writeln!(sql, "COMMIT;").unwrap();
        drop(sql);
        let _ = root.wait();
        assert!(
            blocked,
            "the waiter's look never waited on the row lock; it said:\n{}",
            scratch.read("waiter")
        );
        if wait_until(Duration::from_secs(5), || trx("trx_rows_locked > 0")) {
            held = true;
            break;
        }
        signal(wpid, libc::SIGCONT);
    }
    assert!(held, "the stopped waiter never held the row");
    std::fs::write(&go, "").unwrap();
    // The stopped waiter now holds the row lock in an open transaction.
    let started = std::time::Instant::now();
    let out = on(&url).args(["-w", "30", "sw", "true"]).output();
    let took = started.elapsed();
    assert_eq!(
        out.out.status.code(),
        Some(0),
        "a request behind a stopped waiter, after {took:?}: {}",
        out.stderr()
    );
}

/// The tables as lockrun-engines(7) shows them, made by hand with the
/// name a `VARCHAR(255)`: a name longer than that is cut by the counter's
/// `INSERT IGNORE`, its counter row is never found, and `-n` looked again
/// at once for ever (thousands of statements a second); doctor passed the
/// tables. A run must give up after a few tries, one line naming the
/// table and its column (69); doctor must name the column that differs.
#[test]
fn hand_made_tables_with_a_short_name_column_are_refused_not_spun_on() {
    let my = MyDb::new();
    let db = &my.db;
    my.sql(&format!(
        "CREATE TABLE {db}.lockrun_tokens ( \
           name VARCHAR(255) NOT NULL, token BIGINT NOT NULL, \
           PRIMARY KEY (name)) ENGINE=InnoDB; \
         CREATE TABLE {db}.lockrun_leases ( \
           name VARCHAR(255) NOT NULL, slot INT NOT NULL, \
           owner VARBINARY(128) NOT NULL, label VARBINARY(2048) NOT NULL, \
           token BIGINT NOT NULL, mode VARBINARY(8) NOT NULL, lim INT NOT NULL, \
           expires_at DATETIME(6) NOT NULL, granted_at DATETIME(6) NOT NULL, \
           revoked BOOLEAN NOT NULL DEFAULT FALSE, \
           PRIMARY KEY (name, slot)) ENGINE=InnoDB; \
         CREATE TABLE {db}.lockrun_waiters ( \
           seq BIGINT NOT NULL AUTO_INCREMENT, name VARCHAR(255) NOT NULL, \
           owner VARBINARY(128) NOT NULL, label VARBINARY(2048) NOT NULL, \
           mode VARBINARY(8) NOT NULL, lim INT NOT NULL, \
           expires_at DATETIME(6) NOT NULL, conn BIGINT NOT NULL DEFAULT 0, \
           PRIMARY KEY (seq), KEY (name, seq)) ENGINE=InnoDB"
    ));
    let name = "n".repeat(300);
    let started = std::time::Instant::now();
    let run = on(&my.url())
        .args(["-n", &name, "true"])
        .stderr(Stdio::piped())
        .spawn();
    let mut run = Reap(run);
    let limit = Duration::from_secs(15);
    let ended = wait_until(limit, || matches!(run.0.try_wait(), Ok(Some(_))));
    assert!(ended, "-n on a 300-byte name still runs after {limit:?}");
    let code = run.0.try_wait().unwrap().and_then(|s| s.code());
    let mut err = String::new();
    std::io::Read::read_to_string(run.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(code, Some(69), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("lockrun_tokens") && err.contains("name"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    let out = on(&my.url()).arg("doctor").code(69);
    let text = out.stdout();
    assert!(
        text.contains("lockrun_tokens.name") && text.contains("varchar(255)"),
        "{text}"
    );
}

/// A server that makes every new table in MyISAM
/// (`enforce_storage_engine`): with NO_ENGINE_SUBSTITUTION (the default
/// sql_mode) the CREATE TABLE was refused with a line calling the server
/// read-only and sending the operator to the primary; without it, with
/// "Specified key was too long (1071)". Either way the line must name the
/// table and the engine, and say InnoDB is required; nothing is made.
#[test]
fn enforce_storage_engine_myisam_is_named_with_the_table() {
    let _h = heavy();
    let my = Mariadb::start_with(&["--enforce-storage-engine=MyISAM"]);
    for sql_mode in ["NO_ENGINE_SUBSTITUTION", ""] {
        my.sql(&format!("SET GLOBAL sql_mode = '{sql_mode}'"));
        let out = on(&my.url()).args(["-n", "es", "true"]).code(69).says(&[
            "lockrun_tokens",
            "MyISAM",
            "InnoDB",
            "enforce_storage_engine",
        ]);
        assert!(!out.stderr().contains("read-only"), "{}", out.stderr());
        assert!(
            !my.has_tables("app"),
            "sql_mode {sql_mode:?}: a table was made"
        );
    }
}

/// A server whose new InnoDB tables are COMPACT or REDUNDANT
/// (`innodb_default_row_format`), whose index keys hold 767 bytes: every
/// first run failed with "Index column size too large" (1709), naming
/// neither the setting nor a fix, and doctor passed. lockrun's tables must
/// be made so that they work there.
#[test]
fn an_old_default_row_format_still_makes_working_tables() {
    let _h = heavy();
    let my = Mariadb::start_with(&["--innodb-default-row-format=COMPACT"]);
    for format in ["COMPACT", "REDUNDANT"] {
        my.sql(&format!(
            "SET GLOBAL innodb_default_row_format = '{format}'"
        ));
        let db = my.database();
        let url = my.url_in(&db);
        on(&url).arg("doctor").succeeds();
        let out = on(&url).args(["-n", "rf", "-c", "echo ran"]).output();
        assert_eq!(
            out.out.status.code(),
            Some(0),
            "innodb_default_row_format = {format}: {}",
            out.stderr()
        );
        on(&url).arg("doctor").succeeds();
    }
}

/// A server whose InnoDB is read-only (`innodb_read_only`): without
/// lockrun's tables doctor passed while every run failed with "Table is
/// read only"; with them doctor failed but advised grants. Doctor must say
/// the server is read-only, without a GRANT, and a run must say so too.
#[test]
fn doctor_on_an_innodb_read_only_server_says_so_and_advises_no_grant() {
    let _h = heavy();
    let mut my = Mariadb::start();
    on(&my.url()).args(["ro", "true"]).succeeds();
    my.sql("CREATE DATABASE bare");
    my.restart_with(&["--innodb-read-only"]);
    for db in ["app", "bare"] {
        let url = my.url_in(db);
        let out = on(&url).arg("doctor").code(69);
        let text = out.stdout();
        assert!(text.contains("innodb_read_only"), "{db}: {text}");
        assert!(!text.contains("GRANT"), "{db}: {text}");
        on(&url)
            .args(["-n", "ro", "true"])
            .code(69)
            .says(&["innodb_read_only"]);
    }
}

/// A lease row written by hand with a mode lockrun never writes: `status`
/// without a name failed (69) for every name. That row is left out, with
/// a warning, and the other names are listed.
#[test]
fn a_hand_written_lease_row_of_an_unknown_mode_does_not_hide_the_others() {
    let my = MyDb::new();
    let url = my.url();
    on(&url).args(["good", "true"]).succeeds();
    let scratch = Scratch::new();
    let _h = Reap(hold(Some(&url), "held", "30s", &scratch));
    wait_until(Duration::from_secs(20), || {
        status_json(&url, "held")["holders"]
            .as_array()
            .is_some_and(|h| !h.is_empty())
    });
    my.sql(&format!(
        "INSERT INTO {}.lockrun_leases VALUES ('odd', 0, 'o', 'by hand', 7, 'q', 1, \
         UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, UTC_TIMESTAMP(6), FALSE)",
        my.db
    ));
    let out = on(&url).arg("status").output();
    assert_eq!(out.out.status.code(), Some(0), "{}", out.stderr());
    assert!(out.stdout().contains("held"), "{}", out.stdout());
    assert!(out.stderr().contains("odd"), "{}", out.stderr());
}

/// A counter row at BIGINT's maximum (written by hand, or imported): the
/// name failed 69 for ever with "BIGINT value is out of range". The line
/// must say what it is and how to clear it, naming the row.
#[test]
fn a_counter_at_its_maximum_is_said_with_the_row_to_clear() {
    let my = MyDb::new();
    let url = my.url();
    on(&url).args(["mx", "true"]).succeeds();
    my.sql(&format!(
        "UPDATE {}.lockrun_tokens SET token = 9223372036854775807 WHERE name = 'mx'",
        my.db
    ));
    let started = std::time::Instant::now();
    let out =
        on(&url)
            .args(["mx", "true"])
            .code(69)
            .says(&["lockrun_tokens", "maximum", "mx", "DELETE"]);
    assert!(!out.stderr().contains("out of range"), "{}", out.stderr());
    assert!(started.elapsed() < Duration::from_secs(5), "retried");
    on(&url).args(["other", "true"]).succeeds();
}

/// Database names the server accepts (a backtick in it, 40 Cyrillic
/// letters: 80 bytes, 40 characters) were refused with 64.
#[test]
fn database_names_the_server_accepts_are_accepted() {
    let my = Mariadb::shared();
    let cyrillic = "б".repeat(40);
    for (db, in_url) in [
        ("a`b", "a%60b".to_string()),
        (cyrillic.as_str(), cyrillic.clone()),
    ] {
        my.sql(&format!(
            "CREATE DATABASE IF NOT EXISTS `{}`",
            db.replace('`', "``")
        ));
        let url = my.url_in(&in_url);
        let out = on(&url).args(["db", "-c", "echo ran"]).output();
        assert_eq!(out.out.status.code(), Some(0), "{db}: {}", out.stderr());
        on(&url).arg("doctor").succeeds();
    }
}

/// A socket path with an `@` in it was read as the end of a user, and
/// the URL then "names no database"; a `#fragment` became part of the
/// database's name; a socket that is not there was not named.
#[test]
fn socket_urls_read_and_say_their_socket() {
    let my = MyDb::new();
    let scratch = Scratch::new();
    let dir = scratch.path("a@b");
    std::fs::create_dir(&dir).unwrap();
    let link = dir.join("sock");
    std::os::unix::fs::symlink(my.server.socket(), &link).unwrap();
    let url = format!(
        "mariadb://root@localhost/{}?socket={}",
        my.db,
        link.display()
    );
    let out = on(&url).args(["at", "-c", "echo ran"]).output();
    assert_eq!(out.out.status.code(), Some(0), "{}", out.stderr());
    on(&format!("{}#frag", my.url()))
        .args(["fr", "true"])
        .code(64)
        .says(&["--url", "fragment"]);
    let gone = scratch.path("gone.sock");
    let url = format!(
        "mariadb://root@localhost/{}?socket={}",
        my.db,
        gone.display()
    );
    on(&url)
        .args(["-n", "gs", "true"])
        .code(69)
        .says(&[&gone.display().to_string()]);
}

/// A server whose connections are all taken (1040, Too many connections):
/// `-n` gave up at once. It is an outage, not a refusal: tried again
/// within the bound on one request, and given up as a busy name is (75)
/// with one line naming the server's limit.
#[test]
fn too_many_connections_is_waited_out_within_the_bound() {
    let _h = heavy();
    let my = Mariadb::start();
    my.sql(
        "CREATE USER 'app'@'%' IDENTIFIED BY 'app-pw'; GRANT ALL ON app.* TO 'app'@'%'; \
         SET GLOBAL max_connections = 10",
    );
    let url = my.url_as("app", "app-pw", "app");
    let client = |sql: &str| {
        let mut c = std::process::Command::new("mariadb");
        c.arg("--no-defaults")
            .args(["--protocol=TCP", "-h127.0.0.1"])
            .arg(format!("-P{}", my.port))
            .args(["--skip-ssl", "-uapp", "-papp-pw", "-e", sql]);
        c
    };
    // Every connection taken (MariaDB's least max_connections is 10).
    let take_all = || -> Vec<Reap> {
        let mut takers = Vec::new();
        for _ in 0..30 {
            let o = client("SELECT 1").output().unwrap();
            if text(&o.stderr).contains("Too many connections") {
                return takers;
            }
            for _ in 0..3 {
                let c = client("SELECT SLEEP(60)")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                takers.push(Reap(c));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!("the connections were not all taken");
    };
    let free_all = || {
        let ids = my.sql("SELECT id FROM information_schema.processlist WHERE user = 'app'");
        for id in ids.split_whitespace() {
            my.try_kill(id);
        }
    };
    // Taken when -n starts, free a moment later: granted.
    let takers = take_all();
    let run = on(&url)
        .args(["-n", "tm", "-c", "echo ran"])
        .stderr(Stdio::piped())
        .spawn();
    std::thread::sleep(Duration::from_millis(500));
    free_all();
    drop(takers);
    let (code, err) = exited(run, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{err}");
    // Taken for longer than the bound: one line naming the limit.
    let _takers = take_all();
    let started = std::time::Instant::now();
    on(&url)
        .args(["-n", "tm", "true"])
        .code(75)
        .says(&["max_connections"]);
    assert!(started.elapsed() < Duration::from_secs(10));
    free_all();
}

/// A server under FLUSH TABLES WITH READ LOCK (a backup running) holds
/// every write: doctor says the write got no answer and why that may be,
/// and advises no GRANT (the user's rights are fine).
#[test]
fn doctor_under_a_global_read_lock_advises_no_grant() {
    let my = Mariadb::start();
    on(&my.url()).args(["ftwrl", "true"]).succeeds();
    let mut root = std::process::Command::new("mariadb")
        .arg("--no-defaults")
        .arg(format!("--socket={}", my.socket().display()))
        .args(["--skip-ssl", "-uroot"])
        .args(["-N", "-B", "--unbuffered"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run mariadb");
    let mut sql = root.stdin.take().unwrap();
    use std::io::Write;
    writeln!(sql, "FLUSH TABLES WITH READ LOCK; SELECT 'locked';").unwrap();
    let mut line = String::new();
    let mut said_locked = std::io::BufReader::new(root.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut said_locked, &mut line).unwrap();
    let locked = line.trim() == "locked";
    let out = on(&my.url()).arg("doctor").output();
    writeln!(sql, "UNLOCK TABLES;").unwrap();
    drop(sql);
    let _ = root.wait();
    let said = out.stdout();
    assert!(locked, "the read lock was never seen held");
    assert_ne!(out.out.status.code(), Some(0), "{said}");
    assert!(
        !said.contains("GRANT"),
        "a held write read as missing rights:\n{said}"
    );
    assert!(said.contains("read lock"), "{said}");
}
