//! The MySQL/MariaDB engine end to end, beyond the conformance suite (which
//! also covers a server restarted or stopped, bad URLs, passwords and the
//! documented grants): the tables and their token counter, connections
//! killed under a holder, a stopped server's message, a read-only server,
//! users without rights, doctor for the documented user, foreign tables,
//! `MYSQL_PWD`, the session time zone, and what waiting costs the server.
//! Tests share one server (a database each) unless they break it. The
//! attacks on the engine (server settings, URLs and races) are in
//! `mysql/attacks.rs`; its concurrency groups in `groups/mysql.rs`.

mod attacks;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::docs::documented_mysql_grants;
use crate::support::*;

/// A holder whose job runs until the scratch file `done` appears (or 60 s
/// pass); returns once its job runs.
pub(crate) fn holder(url: &str, scratch: &Scratch, name: &str, ttl: &str) -> (Child, i32) {
    let err = std::fs::File::create(scratch.path("err")).unwrap();
    let done = scratch.path("done");
    let child = on(url)
        .args(["-vv", "--ttl", ttl, name, "-c"])
        .arg(format!(
            "echo $$ > {}; i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
            scratch.path("pid").display(),
            done.display()
        ))
        .stderr(Stdio::from(err))
        .spawn();
    (child, scratch.pid_in("pid"))
}

pub(crate) fn finish(scratch: &Scratch, child: &mut Child) -> Option<i32> {
    std::fs::write(scratch.path("done"), "").unwrap();
    wait_child(child, Duration::from_secs(30)).code()
}

fn run_token(url: &str, name: &str) -> u64 {
    on(url)
        .args([name, "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds()
        .stdout()
        .trim()
        .parse()
        .unwrap()
}

/// The counter holds the last token, released rows are gone, and
/// another `--prefix` has tables of its own. (First use by many at once:
/// the conformance suite.)
#[test]
fn the_counter_holds_the_last_token_and_each_prefix_has_tables_of_its_own() {
    let my = MyDb::new();
    let url = my.url();
    run_token(&url, "tok");
    let last = run_token(&url, "tok");
    // The counter holds the last token; released rows are gone.
    let counter = my.sql(&format!(
        "SELECT token FROM {}.lockrun_tokens WHERE name = 'tok'",
        my.db
    ));
    assert_eq!(counter.trim(), last.to_string());
    assert_eq!(my.rows(), 0);
    // Another --prefix: tables of its own.
    on(&url)
        .args(["--prefix", "ci_locks", "tok", "true"])
        .succeeds();
    let n = my.sql(&format!(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{}' \
         AND table_name LIKE 'ci\\_locks\\_%'",
        my.db
    ));
    assert_eq!(n.trim(), "3");
    on(&url)
        .args(["--prefix", "Not-A-Name", "tok", "true"])
        .code(64)
        .says(&["--prefix"]);
}

#[test]
fn killing_every_lockrun_connection_keeps_the_lease() {
    let my = MyDb::new();
    let url = my.url();
    let scratch = Scratch::new();
    let (mut h, job) = holder(&url, &scratch, "kill", "3s");
    let until = Instant::now() + Duration::from_secs(5);
    let mut cut = 0;
    while Instant::now() < until {
        let ids = my.sql(&format!(
            "SELECT id FROM information_schema.processlist WHERE db = '{}' \
             AND id <> CONNECTION_ID()",
            my.db
        ));
        for id in ids.lines().filter(|l| !l.is_empty()) {
            if my.server.try_kill(id) {
                cut += 1;
            }
        }
        let got = on(&url).args(["-n", "kill", "true"]).output();
        assert_eq!(
            got.out.status.code(),
            Some(75),
            "job alive: {}; holder: {}",
            alive(job),
            scratch.read("err")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(cut > 0, "no lockrun connection was ever killed");
    assert!(alive(job), "the job was stopped: {}", scratch.read("err"));
    assert_eq!(finish(&scratch, &mut h), Some(0), "{}", scratch.read("err"));
}

/// A counter lost with its table: tokens still rise (the clock floors
/// them). (A restart mid job: the conformance suite.)
#[test]
fn tokens_never_go_back_when_the_counter_is_lost() {
    let my = MyDb::new();
    let url = my.url();
    let after = run_token(&url, "rs");
    my.sql(&format!("DROP TABLE {}.lockrun_tokens", my.db));
    let lost = run_token(&url, "rs");
    assert!(
        lost > after,
        "token {lost} after a lost counter, {after} before"
    );
}

#[test]
fn a_stopped_server_is_said_not_to_answer_within_the_bound() {
    let my = Mariadb::start();
    let url = my.url();
    my.pause();
    let mut said = Vec::new();
    for args in [
        &["doctor"][..],
        &["--ttl", "2s", "--wait", "0", "x", "true"],
        &["status", "x"],
        &["release", "--force", "x"],
    ] {
        let started = Instant::now();
        let ran = on(&url).args(args).output();
        let took = started.elapsed();
        let out = format!("{}{}", ran.stdout(), ran.stderr());
        assert_ne!(ran.out.status.code(), Some(0), "{args:?}: {out}");
        assert!(out.contains("no answer within"), "{args:?}: {out}");
        assert!(!out.contains("os error"), "{args:?}: {out}");
        assert!(took < Duration::from_secs(10), "{args:?} took {took:?}");
        said.push(out);
    }
    my.resume();
    println!("{said:#?}");
}

#[test]
fn a_read_only_server_is_refused_at_once_with_one_line() {
    let my = Mariadb::start();
    on(&my.url()).args(["ro", "true"]).succeeds();
    my.sql(
        "CREATE USER 'app'@'%' IDENTIFIED BY 'app-pw'; \
         GRANT ALL ON app.* TO 'app'@'%'; SET GLOBAL read_only = ON",
    );
    let started = Instant::now();
    on(&my.url_as("app", "app-pw", "app"))
        .args(["ro", "true"])
        .code(69)
        .says(&["read-only"]);
    assert!(started.elapsed() < Duration::from_secs(5), "retried");
    let out = on(&my.url_as("app", "app-pw", "app"))
        .arg("doctor")
        .code(69);
    assert!(out.stdout().contains("read-only"), "{}", out.stdout());
    assert!(!out.stdout().contains("GRANT SELECT"), "{}", out.stdout());
}

#[test]
fn a_user_without_rights_is_refused_with_one_line_creating_nothing() {
    let my = MyDb::new();
    let user = format!("nr_{}", my.db);
    my.sql(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY 'nr-pw'; GRANT USAGE ON *.* TO '{user}'@'%'"
    ));
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let job = format!("touch {}", ran.display());
    let url = my.server.url_as(&user, "nr-pw", &my.db);
    let out = on(&url)
        .args(["x", "-c", &job])
        .code(69)
        .says(&["denied", "lockrun-engines(7)"]);
    assert!(!out.stderr().contains("nr-pw"));
    assert!(!my.server.has_tables(&my.db), "a table was created");
    // Tables made by another user: still no right to use them.
    on(&my.url()).args(["x", "true"]).succeeds();
    my.sql(&format!("GRANT SELECT ON {}.* TO '{user}'@'%'", my.db));
    on(&url).args(["x", "-c", &job]).code(69).says(&["denied"]);
    // A wrong password: at once, one line, no password in it.
    let started = Instant::now();
    let out = on(&my.server.url_as("root", "wrong-pw", &my.db))
        .args(["x", "-c", &job])
        .code(69)
        .says(&["Access denied"]);
    assert!(!out.stderr().contains("wrong-pw"), "{}", out.stderr());
    assert!(started.elapsed() < Duration::from_secs(5), "retried");
    assert!(!ran.exists(), "a job ran without a lease");
}

/// doctor, for the user lockrun-engines(7) gives, sees it may create the
/// tables and warns only that it cannot read the replication state. (That
/// the grants are enough for every command: the conformance suite.)
#[test]
fn doctor_warns_the_documented_user_only_of_replication() {
    let my = MyDb::new();
    let user = format!("ci_{}", my.db);
    my.sql(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY 'ci-pw'; {}",
        documented_mysql_grants(&user, &my.db)
    ));
    let url = my.server.url_as(&user, "ci-pw", &my.db);
    let out = on(&url).arg("doctor").code(1).stdout();
    let warned: Vec<&str> = out.lines().filter(|l| !l.starts_with("ok  ")).collect();
    assert_eq!(warned.len(), 1, "{out}");
    assert!(warned[0].starts_with("warn  replication:"), "{out}");
}

#[test]
fn a_foreign_table_in_the_way_is_refused_with_one_line() {
    let my = MyDb::new();
    let db = &my.db;
    my.sql(&format!(
        "CREATE TABLE {db}.other_tokens (id INT PRIMARY KEY, note TEXT); \
         CREATE TABLE {db}.other_leases (id INT PRIMARY KEY); \
         CREATE TABLE {db}.other_waiters (id INT)"
    ));
    on(&my.url())
        .args(["--prefix", "other", "x", "true"])
        .code(69)
        .says(&["not lockrun's", "--prefix"]);
    assert_eq!(
        my.sql(&format!("SELECT COUNT(*) FROM {db}.other_leases"))
            .trim(),
        "0"
    );
}

/// A CA file on an address that asks for no TLS (bad URLs themselves:
/// the conformance suite).
#[test]
fn a_ca_file_on_an_address_without_tls_is_refused() {
    on("mysql://h/d?ssl-mode=DISABLED")
        .args(["--tls-ca", "/etc/hostname", "x", "true"])
        .code(64)
        .says(&["--tls-ca"]);
}

/// A password from `MYSQL_PWD` is kept from lines and the job as one in
/// the URL is (that one: the conformance suite).
#[test]
fn a_password_from_mysql_pwd_is_never_printed_nor_given_to_the_job() {
    let my = MyDb::new();
    // From MYSQL_PWD, the URL without one: kept from the job too.
    let bare = format!("mysql://root@127.0.0.1:{}/{}", my.server.port, my.db);
    let out = on(&bare)
        .env("MYSQL_PWD", MY_PASSWORD)
        .args(["-vv", "x", "-c", "env"])
        .succeeds();
    let all = format!("{}{}", out.stdout(), out.stderr());
    assert!(!all.contains(MY_PASSWORD), "{all}");
}

#[test]
fn a_session_time_zone_far_from_utc_changes_nothing() {
    let my = Mariadb::start_with(&["--default-time-zone=+13:00"]);
    let url = my.url();
    assert_eq!(my.sql("SELECT @@global.time_zone").trim(), "+13:00");
    let scratch = Scratch::new();
    let (mut h, lr) = {
        let (h, _) = holder(&url, &scratch, "tz", "4s");
        let pid = h.id() as i32;
        (h, pid)
    };
    let v = status_json(&url, "tz");
    let left = v["ttl_left_ms"].as_u64().unwrap();
    assert!(left <= 4000 && left > 1000, "{v}");
    assert!(v["held_for_ms"].as_u64().unwrap() < 60_000, "{v}");
    // A lockrun killed outright: its lease lapses in its ttl, not 13 hours.
    signal(lr, libc::SIGKILL);
    let _ = h.wait();
    let started = Instant::now();
    on(&url).args(["-w", "20s", "tz", "true"]).succeeds();
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    // --min-hold counts on the server's clock too.
    on(&url).args(["--min-hold", "2s", "mh", "true"]).succeeds();
    on(&url).args(["-n", "mh", "true"]).code(75);
    let started = Instant::now();
    on(&url).args(["-w", "10s", "mh", "true"]).succeeds();
    assert!(started.elapsed() < Duration::from_secs(4));
    std::fs::write(scratch.path("done"), "").unwrap();
}

#[test]
fn ten_waiters_cost_fewer_than_ten_queries_a_second_together() {
    let my = Mariadb::start();
    let url = my.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "q", "30s");
    let waiters: Vec<Child> = (0..10)
        .map(|_| on(&url).args(["-q", "q", "true"]).spawn())
        .collect();
    wait_queued(&url, "q", 10);
    let questions = || my.global_status("Questions");
    let before = questions();
    let watched = Instant::now();
    std::thread::sleep(Duration::from_secs(10));
    // One of ours per reading, and the holder's renewals.
    let spent = questions() - before - 1;
    let per_second = spent as f64 / watched.elapsed().as_secs_f64();
    eprintln!("ten waiters: {spent} statements in {:?}", watched.elapsed());
    assert!(per_second < 10.0, "{spent} statements in 10 s");
    // A release hands the name on at once, down the whole queue.
    let started = Instant::now();
    assert_eq!(finish(&scratch, &mut h), Some(0));
    for w in waiters {
        let (code, err) = exited(w, Duration::from_secs(30));
        assert_eq!(code, Some(0), "{err}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A waiter killed with SIGKILL in the queue (`-w 60`, and one that asked
/// `--limit 1`): its connection ends with it, and with it the wake-up lock
/// its place is known by, so once the holder ends the name is free at
/// once, not a third of the ttl later when the place would lapse: `status`
/// shows no waiter, `-n` is granted rather than told the dead waiter holds
/// it (75), `--max-waiters 1` is not refused, and a plain request is not
/// refused for disagreeing with the dead waiter's `--limit 1` (64).
#[test]
fn a_waiter_killed_with_sigkill_leaves_the_name_free_at_once() {
    let my = MyDb::new();
    let url = my.url();
    let scratch = Scratch::new();
    // A name held (in `mode`), one waiter killed behind the holder, the
    // holder gone: the moment of the kill.
    let leave_dead_waiter = |name: &str, mode: &[&str]| -> Instant {
        let done = scratch.path(&format!("{name}.done"));
        let mut h = on(&url)
            .args(["--ttl", "60s"])
            .args(mode)
            .args([name, "-c"])
            .arg(format!(
                "i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
                done.display()
            ))
            .spawn();
        let held = wait_until(Duration::from_secs(20), || {
            status_json(&url, name)["held"] == true
        });
        assert!(held, "{name} never held");
        let mut w = on(&url)
            .args(["--ttl", "60s", "-q", "-w", "60"])
            .args(mode)
            .args([name, "true"])
            .spawn();
        wait_queued(&url, name, 1);
        let conn = my.sql(&format!(
            "SELECT conn FROM `{}`.lockrun_waiters WHERE name = '{name}'",
            my.db
        ));
        signal(w.id() as i32, libc::SIGKILL);
        let _ = w.wait();
        let killed = Instant::now();
        std::fs::write(&done, "").unwrap();
        assert_eq!(wait_child(&mut h, Duration::from_secs(30)).code(), Some(0));
        // The server ends the dead waiter's session once its wait is over
        // (the holder's release ends it): the answers below are wanted
        // from then on.
        let ended = wait_until(Duration::from_secs(5), || {
            my.sql(&format!(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {}",
                conn.trim()
            ))
            .trim()
                == "0"
        });
        assert!(ended, "the dead waiter's connection {conn} lives on");
        killed
    };
    // The place lapses 20 s after it was last kept (at most 7 s before the
    // kill): each answer is wanted well before. Every case is tried, and
    // what went wrong said together.
    let mut wrong = Vec::new();
    let mut check = |killed: Instant, what: &str, ok: bool, said: String| {
        if !ok || killed.elapsed() > Duration::from_secs(10) {
            wrong.push(format!(
                "{what}, {:?} after the kill: {said}",
                killed.elapsed()
            ));
        }
    };
    let killed = leave_dead_waiter("dn", &[]);
    let freed = wait_until(Duration::from_secs(5), || {
        let v = status_json(&url, "dn");
        v["held"] == false && v["waiters"].as_u64() == Some(0)
    });
    check(killed, "status", freed, status_json(&url, "dn").to_string());
    let n = on(&url).args(["-n", "dn", "true"]).output();
    check(killed, "-n", n.out.status.code() == Some(0), n.stderr());

    let killed = leave_dead_waiter("dm", &[]);
    let m = on(&url)
        .args(["--max-waiters", "1", "-w", "30", "dm", "true"])
        .output();
    check(
        killed,
        "--max-waiters 1",
        m.out.status.code() == Some(0),
        m.stderr(),
    );

    let killed = leave_dead_waiter("dl", &["--limit", "1"]);
    let p = on(&url).args(["-w", "30", "dl", "true"]).output();
    check(
        killed,
        "a plain request",
        p.out.status.code() == Some(0),
        p.stderr(),
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The first of two waiters has its connection cut (a failover, a proxy
/// restart): its wake-up lock is freed as a dead waiter's would be, and
/// the waiter behind it, woken by that, looks while the first is still
/// reconnecting. The first keeps its turn all the same.
#[test]
fn a_waiter_whose_connection_is_cut_keeps_its_turn() {
    let my = MyDb::new();
    let url = my.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "cut", "60s");
    let order = scratch.path("order");
    let waiter = |tag: &str| {
        on(&url)
            .args(["--ttl", "60s", "-q", "-w", "60", "cut", "-c"])
            .arg(format!("echo {tag} >> {}", order.display()))
            .spawn()
    };
    let mut first = waiter("first");
    wait_queued(&url, "cut", 1);
    let mut second = waiter("second");
    wait_queued(&url, "cut", 2);
    let row = my.sql(&format!(
        "SELECT seq, conn FROM `{}`.lockrun_waiters WHERE name = 'cut' ORDER BY seq LIMIT 1",
        my.db
    ));
    let (seq, conn) = row.trim().split_once(char::is_whitespace).unwrap();
    let conn = conn.trim();
    assert!(my.server.try_kill(conn));
    // The first waiter is back on a new connection, in its place (it may
    // not be: then its turn is lost, and said below).
    wait_until(Duration::from_secs(20), || {
        let now = my.sql(&format!(
            "SELECT conn FROM `{}`.lockrun_waiters WHERE seq = {seq} \
               AND expires_at > UTC_TIMESTAMP(6) AND conn > 0",
            my.db
        ));
        !now.trim().is_empty() && now.trim() != conn
    });
    assert_eq!(finish(&scratch, &mut h), Some(0));
    assert_eq!(
        wait_child(&mut first, Duration::from_secs(30)).code(),
        Some(0)
    );
    assert_eq!(
        wait_child(&mut second, Duration::from_secs(30)).code(),
        Some(0)
    );
    assert_eq!(scratch.read("order"), "first\nsecond\n");
}

#[test]
fn doctor_checks_the_server_and_the_user_creating_nothing() {
    let my = MyDb::new();
    let out = on(&my.url()).arg("doctor").succeeds();
    let text = out.stdout();
    for topic in [
        "reachable",
        "round trip",
        "clock",
        "version",
        "read-only",
        "time_zone",
        "replication",
        "wake-up",
        "tables",
    ] {
        assert!(text.contains(topic), "{topic}: {text}");
    }
    assert!(!my.server.has_tables(&my.db));
    on(&my.url()).args(["x", "true"]).succeeds();
    on(&my.url()).arg("doctor").succeeds();
}

#[test]
fn the_readme_guide_guards_an_alembic_migration_as_written() {
    // Debian's python3 with Debian's alembic and PyMySQL.
    let python = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import alembic, pymysql"])
        .output();
    if !python.is_ok_and(|o| o.status.success()) {
        panic!(
            "alembic or PyMySQL not found for /usr/bin/python3: the guide's test needs them \
             (apt-get install -y python3-alembic python3-pymysql)"
        );
    }
    let my = MyDb::new();
    let scratch = Scratch::new();
    std::fs::write(
        scratch.path("guide.sh"),
        readme_guide("Guard a migration with MySQL or MariaDB"),
    )
    .unwrap();
    let bin_dir = std::path::Path::new(BIN)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let out = std::process::Command::new("bash")
        .args(["-e", "guide.sh"])
        .current_dir(scratch.dir.path())
        .env("PATH", format!("{bin_dir}:/usr/bin:/bin"))
        .env("DB_HOST", "127.0.0.1")
        .env("DB_PORT", my.server.port.to_string())
        .env("DB_USERNAME", "root")
        .env("DB_PASSWORD", MY_PASSWORD)
        .env("DB_DATABASE", &my.db)
        .env_remove("LOCKRUN_URL")
        .env_remove("MYSQL_PWD")
        .output()
        .expect("run bash");
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&out.stdout).trim(), "0001", "{err}");
    assert_eq!(err.matches("Running upgrade").count(), 1, "{err}");
    assert_eq!(err.matches("waiting for migrate").count(), 3, "{err}");
    assert!(!err.contains(MY_PASSWORD));
}

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
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        panic!("openssl not found: the TLS tests need it (apt-get install -y openssl)");
    }
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=lockrun-test-ca 2>/dev/null",
    );
    sh(
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 2 -subj /CN=other-ca 2>/dev/null",
    );
    sh(
        "openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=db.internal 2>/dev/null",
    );
    sh("printf 'subjectAltName=IP:127.0.0.1\\n' > ext");
    sh(
        "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt -days 2 -extfile ext 2>/dev/null",
    );
    sh("chmod 644 srv.key");
}

#[test]
fn tls_as_ssl_mode_asks_checked_as_the_mysql_client_checks_it() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let p = |f: &str| certs.path().join(f).display().to_string();
    let my = Mariadb::start_with(&[
        &format!("--ssl-cert={}", p("srv.crt")),
        &format!("--ssl-key={}", p("srv.key")),
    ]);
    let (ca, other, base) = (p("ca.crt"), p("other.crt"), my.url());
    let accepts = || -> u64 {
        my.sql("SHOW GLOBAL STATUS LIKE 'Ssl_accepts'")
            .split_whitespace()
            .nth(1)
            .unwrap_or("0")
            .parse()
            .unwrap_or(0)
    };
    let used_tls = |url: &str, extra: &[&str]| -> bool {
        let before = accepts();
        on(url).args(extra).args(["x", "true"]).succeeds();
        accepts() > before
    };
    // VERIFY_IDENTITY with the right CA: encrypted, the name (127.0.0.1) checked.
    assert!(used_tls(
        &format!("{base}?ssl-mode=VERIFY_IDENTITY"),
        &["--tls-ca", &ca]
    ));
    assert!(used_tls(
        &format!("{base}?ssl-mode=VERIFY_CA"),
        &["--tls-ca", &ca]
    ));
    // REQUIRED without a CA: encrypted, not checked (as the mysql client).
    assert!(used_tls(&format!("{base}?ssl-mode=REQUIRED"), &[]));
    // PREFERRED (the default): encrypted when the server offers it.
    assert!(used_tls(&base, &[]));
    assert!(!used_tls(&format!("{base}?ssl-mode=DISABLED"), &[]));
    // A certificate of another CA: refused at once, one line, no password.
    for mode in ["VERIFY_CA", "VERIFY_IDENTITY", "REQUIRED"] {
        let out = on(&format!("{base}?ssl-mode={mode}"))
            .args(["--tls-ca", &other, "x", "true"])
            .code(69)
            .says(&["certificate"]);
        assert!(!out.stderr().contains(MY_PASSWORD));
    }
    // A server without TLS cannot satisfy REQUIRED.
    let plain = MyDb::new();
    on(&format!("{}?ssl-mode=REQUIRED", plain.url()))
        .args(["x", "true"])
        .code(69)
        .says(&["TLS"]);
}

#[test]
fn doctor_gives_the_grants_a_user_lacks() {
    let my = MyDb::new();
    let user = format!("ng_{}", my.db);
    my.sql(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY 'ng-pw'; GRANT USAGE ON *.* TO '{user}'@'%'"
    ));
    on(&my.url()).args(["x", "true"]).succeeds();
    let url = my.server.url_as(&user, "ng-pw", &my.db);
    // No right to the database at all: the statement that gives it.
    let out = on(&url).arg("doctor").code(69).stdout();
    assert!(out.starts_with("fail  reachable:"), "{out}");
    assert!(out.matches("lockrun-engines(7)").count() <= 1, "{out}");
    let grant = &out[out.find("GRANT ").expect(&out)..].trim_end();
    assert_eq!(
        *grant,
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{}`.* TO '{user}'@'%'",
            my.db
        )
    );
    // Rights to read, not write: the statement that gives the rest.
    my.sql(&format!("GRANT SELECT ON `{}`.* TO '{user}'@'%'", my.db));
    let out = on(&url).arg("doctor").code(69).stdout();
    let lines: Vec<&str> = out.lines().collect();
    // Not knowing whether the server is a replica is no "ok".
    let repl = lines
        .iter()
        .find(|l| l.contains("replication:"))
        .expect(&out);
    assert!(repl.starts_with("warn  "), "{out}");
    assert!(repl.contains(&format!("TO '{user}'@'%'")), "{out}");
    let tables = lines.iter().find(|l| l.contains("tables:")).expect(&out);
    assert!(
        tables.matches("lockrun-engines(7)").count() <= 1,
        "{tables}"
    );
    // The statement it prints is the one to run: after it, the tables are ok.
    let grant = &tables[tables.find("GRANT ").expect("a GRANT statement")..];
    assert!(grant.contains(&format!("`{}`.*", my.db)), "{grant}");
    my.sql(grant);
    let out = on(&url).arg("doctor").code(1).stdout();
    assert!(out.contains("ok    tables:"), "{out}");
    // The grant to read the replication state, likewise.
    let grant = &repl[repl.find("GRANT ").unwrap()..];
    my.sql(grant);
    let out = on(&url).arg("doctor").succeeds().stdout();
    assert!(out.contains("ok    replication:"), "{out}");
}

#[test]
fn doctor_fails_a_user_that_may_neither_find_nor_create_the_tables() {
    let my = MyDb::new();
    let user = format!("nc_{}", my.db);
    my.sql(&format!(
        "CREATE USER '{user}'@'%' IDENTIFIED BY 'nc-pw'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON {}.* TO '{user}'@'%'",
        my.db
    ));
    let out = on(&my.server.url_as(&user, "nc-pw", &my.db))
        .arg("doctor")
        .code(69);
    assert!(out.stdout().contains("no CREATE"), "{}", out.stdout());
    assert!(
        out.stdout().contains(&format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON `{}`.* TO '{user}'@'%'",
            my.db
        )),
        "{}",
        out.stdout()
    );
    assert!(!my.server.has_tables(&my.db));
}

#[test]
fn mariadb_urls_and_unix_sockets_reach_the_same_tables() {
    let my = MyDb::new();
    let socket = my.server.socket().display().to_string();
    let over_socket = format!("mariadb://root@localhost/{}?socket={socket}", my.db);
    let first = run_token(&over_socket, "sock");
    // The same name over TCP with mysql://: the next token.
    assert!(run_token(&my.url(), "sock") > first);
    on(&over_socket)
        .args(["--tls-ca", "/etc/hostname", "sock", "true"])
        .code(64)
        .says(&["--tls-ca"]);
}

/// A server whose binary log takes statements, and a user that may not
/// make its sessions log rows: refused at once with one line saying why,
/// before any table is made; doctor fails it with the same reason. A
/// user that may (root) runs jobs.
#[test]
fn a_statement_binlog_is_refused_before_any_table_unless_rows_can_be_logged() {
    let _h = heavy();
    let my = Mariadb::start_with(&[
        "--log-bin=binlog",
        "--binlog-format=STATEMENT",
        "--server-id=1",
    ]);
    my.sql(
        "CREATE USER 'app'@'%' IDENTIFIED BY 'app-pw'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON app.* TO 'app'@'%'",
    );
    let url = my.url_as("app", "app-pw", "app");
    let started = Instant::now();
    on(&url)
        .args(["sb", "true"])
        .code(69)
        .says(&["binlog_format = STATEMENT"]);
    assert!(started.elapsed() < Duration::from_secs(5), "retried");
    assert!(!my.has_tables("app"), "a table was created");
    let out = on(&url).arg("doctor").code(69);
    assert!(
        out.stdout().contains("binlog_format = STATEMENT"),
        "{}",
        out.stdout()
    );
    on(&my.url()).args(["sb", "true"]).succeeds();
    on(&my.url()).arg("doctor").succeeds();
}

/// Tables an operator altered to an engine without transactions: a run
/// and `release --force` are refused with one line naming the table and
/// its engine; doctor fails them.
#[test]
fn tables_in_an_engine_without_transactions_are_refused_with_one_line() {
    let my = MyDb::new();
    on(&my.url()).args(["x", "true"]).succeeds();
    my.sql(&format!(
        "ALTER TABLE {}.lockrun_tokens ENGINE=MEMORY",
        my.db
    ));
    on(&my.url())
        .args(["x", "true"])
        .code(69)
        .says(&["lockrun_tokens", "MEMORY"]);
    on(&my.url())
        .args(["release", "--force", "x"])
        .code(69)
        .says(&["MEMORY"]);
    let out = on(&my.url()).arg("doctor").code(69);
    assert!(out.stdout().contains("MEMORY"), "{}", out.stdout());
}

/// At a fleet's size: 10,000 held names are listed, and a name with 500
/// waiters is read, each in one statement. The rows are written as the
/// grant and a waiter far back write them (MariaDB's sequence tables
/// number them).
#[test]
fn ten_thousand_names_and_five_hundred_waiters_are_read_in_seconds() {
    let my = MyDb::new();
    let url = my.url();
    on(&url).args(["x", "true"]).succeeds();
    my.sql(&format!(
        "INSERT INTO {0}.lockrun_leases (name, slot, owner, label, token, mode, lim, \
           expires_at, granted_at) \
         SELECT CONCAT('n', LPAD(seq, 5, '0')), 0, MD5(seq), CONCAT('host:', seq), seq, 'x', 1, \
           UTC_TIMESTAMP(6) + INTERVAL 10 MINUTE, UTC_TIMESTAMP(6) FROM {0}.seq_1_to_10000; \
         INSERT INTO {0}.lockrun_waiters (name, owner, label, mode, lim, expires_at) \
         SELECT 'n00001', MD5(CONCAT('w', seq)), CONCAT('w:', seq), 'x', 1, \
           UTC_TIMESTAMP(6) + INTERVAL 10 MINUTE FROM {0}.seq_1_to_500",
        my.db
    ));
    let started = Instant::now();
    let out = on(&url).arg("status").code(0).stdout();
    let took = started.elapsed();
    println!("status of 10,000 names on MariaDB: {took:?}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 10_000, "{}", &out[..out.len().min(400)]);
    assert!(
        lines[0].starts_with("n00001: held by host:1, token 1,")
            && lines[0].contains("500 waiting"),
        "{}",
        lines[0]
    );
    assert!(lines[9_999].starts_with("n10000: held by host:10000, token 10000,"));
    let started = Instant::now();
    let v = status_json(&url, "n00001");
    let took = started.elapsed();
    println!("status of a name with 500 waiters on MariaDB: {took:?}");
    assert_eq!(v["waiters"], 500, "{v}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // Never an owner value.
    assert!(!out.contains(my.sql("SELECT MD5(1)").trim()));
}
