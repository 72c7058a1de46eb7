//! The PostgreSQL engine end to end, beyond the conformance suite (which
//! covers exclusion, first come first served, `--limit`, `-s`, status,
//! `release --force`, `kill -9` of a holder's lockrun, a server restarted
//! or stopped, bad URLs, passwords and the documented grants): the lease
//! table and its token sequence, connections terminated under a holder,
//! roles without rights, foreign tables, libpq's URLs and variables, and
//! PgBouncer in transaction pooling mode.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::conformance::{Span, logging_job, spans};
use crate::support::*;

/// A holder whose job runs until the scratch file `done` appears (or 60 s
/// pass); returns once its job runs.
fn holder(url: &str, scratch: &Scratch, name: &str, ttl: &str) -> (Child, i32) {
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

fn finish(scratch: &Scratch, child: &mut Child) -> Option<i32> {
    std::fs::write(scratch.path("done"), "").unwrap();
    wait_child(child, Duration::from_secs(30)).code()
}

pub(crate) fn run_token(url: &str, name: &str) -> u64 {
    on(url)
        .args([name, "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds()
        .stdout()
        .trim()
        .parse()
        .unwrap()
}

#[track_caller]
fn serial(spans: &[Span]) {
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            assert!(
                a.end <= b.start || b.end <= a.start,
                "two holders at once: {a:?} {b:?}"
            );
            assert!(
                (a.start < b.start) == (a.token < b.token),
                "tokens out of grant order: {a:?} {b:?}"
            );
        }
    }
}

/// Kill every connection lockrun has to the server, as an operator or a
/// pooler's restart would.
fn terminate_lockrun_backends(pg: &Postgres) -> usize {
    let n = pg.sql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'lockrun' AND pid <> pg_backend_pid()",
    );
    n.trim().parse().unwrap_or(0)
}

/// The sequence hands out one token at a time, released rows are gone,
/// and another `--prefix` is a schema of its own. (First use and rising
/// tokens: the conformance suite.)
#[test]
fn the_sequence_is_uncached_and_each_prefix_is_a_schema() {
    let pg = Postgres::start();
    let url = pg.url();
    run_token(&url, "tok");
    // Tokens follow grant order across sessions: the sequence hands out
    // one value at a time.
    let cache = pg.sql(
        "SELECT cache_size FROM pg_sequences \
         WHERE schemaname = 'lockrun' AND sequencename = 'lockrun_tokens'",
    );
    assert_eq!(cache.trim(), "1");
    // Released rows are gone; nothing waits.
    assert_eq!(pg.rows(), 0);
    // Another --prefix is another schema with tables of its own.
    on(&url)
        .args(["--prefix", "ci_locks", "tok", "true"])
        .succeeds();
    let tables = pg.sql(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'ci_locks' \
         AND tablename IN ('lockrun_leases', 'lockrun_waiters')",
    );
    assert_eq!(tables.trim(), "2");
    on(&url)
        .args(["--prefix", "Not-A-Schema", "tok", "true"])
        .code(64)
        .says(&["--prefix", "schema"]);
}

#[test]
fn terminating_the_holder_s_connections_keeps_the_lease() {
    let pg = Postgres::start();
    let url = pg.url();
    let scratch = Scratch::new();
    // A ttl that leaves each renewal room for a new connection (a backend
    // start and password authentication) on a loaded machine.
    let (mut h, job) = holder(&url, &scratch, "term", "3s");
    // Over several renewals (one a second), every connection of lockrun's is cut.
    let until = Instant::now() + Duration::from_secs(5);
    let mut cut = 0;
    while Instant::now() < until {
        cut += terminate_lockrun_backends(&pg);
        let got = on(&url).args(["-n", "term", "true"]).output();
        // Free while the holder runs: say what the holder saw.
        assert_eq!(
            got.out.status.code(),
            Some(75),
            "job alive: {}; holder: {}",
            alive(job),
            scratch.read("err")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(cut > 0, "no lockrun connection was ever cut");
    assert!(alive(job), "the job was stopped: {}", scratch.read("err"));
    assert_eq!(finish(&scratch, &mut h), Some(0), "{}", scratch.read("err"));
}

#[test]
fn a_role_without_rights_is_refused_with_one_line() {
    let pg = Postgres::start();
    pg.sql("CREATE ROLE norights LOGIN PASSWORD 'nr-pw'");
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let job = format!("touch {}", ran.display());
    // Before the tables exist: it may not create them.
    on(&pg.url_as("norights", "nr-pw"))
        .args(["x", "-c", &job])
        .code(69)
        .says(&["permission denied", "lockrun-engines(7)"]);
    // Once they exist: it may not use them.
    on(&pg.url()).args(["x", "true"]).succeeds();
    let out = on(&pg.url_as("norights", "nr-pw"))
        .args(["x", "-c", &job])
        .code(69)
        .says(&["permission denied"]);
    assert!(!out.stderr().contains("nr-pw"));
    // A wrong password: at once, one line, no password in it.
    let started = Instant::now();
    let out = on(&pg.url_as("postgres", "wrong-pw"))
        .args(["x", "-c", &job])
        .code(69)
        .says(&["password authentication failed"]);
    assert!(!out.stderr().contains("wrong-pw"), "{}", out.stderr());
    assert!(started.elapsed() < Duration::from_secs(5), "retried");
    assert!(!ran.exists(), "a job ran without a lease");
}

/// The role lockrun-engines(7) gives may move the sequence up to a token
/// floored by the clock (its UPDATE grant). (That the grants are enough
/// for every command: the conformance suite.)
#[test]
fn the_documented_role_moves_the_token_sequence_up() {
    let pg = Postgres::start();
    on(&pg.url()).args(["x", "true"]).succeeds();
    pg.sql(&format!(
        "CREATE ROLE ci LOGIN PASSWORD 'ci-pw'; {}",
        crate::docs::documented_postgres_grants("ci")
    ));
    let url = pg.url_as("ci", "ci-pw");
    let t = run_token(&url, "x");
    assert!(t > 0);
    assert!(sequence_value(&pg) >= t);
}

#[test]
fn a_foreign_table_in_the_way_is_refused_with_one_line() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE SCHEMA other; \
         CREATE TABLE other.lockrun_leases (id int PRIMARY KEY, note text); \
         CREATE TABLE other.lockrun_waiters (id int); \
         CREATE SEQUENCE other.lockrun_tokens",
    );
    on(&pg.url())
        .args(["--prefix", "other", "x", "true"])
        .code(69)
        .says(&["not lockrun's", "--prefix"]);
    assert_eq!(
        pg.sql("SELECT count(*) FROM other.lockrun_leases").trim(),
        "0"
    );
}

/// A CA file on an address that asks for no TLS (bad URLs themselves:
/// the conformance suite).
#[test]
fn a_ca_file_on_an_address_without_tls_is_refused() {
    on("postgres://h/d?sslmode=disable")
        .args(["--tls-ca", "/etc/hostname", "x", "true"])
        .code(64)
        .says(&["--tls-ca"]);
}

/// A password from `PGPASSWORD` is kept from lines and the job as one in
/// the URL is (that one: the conformance suite).
#[test]
fn a_password_from_pgpassword_is_never_printed_nor_given_to_the_job() {
    let pg = Postgres::start();
    // From PGPASSWORD, the URL without one: kept from the job too.
    let bare = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    let out = on(&bare)
        .env("PGPASSWORD", PG_PASSWORD)
        .args(["-vv", "x", "-c", "env"])
        .succeeds();
    let all = format!("{}{}", out.stdout(), out.stderr());
    assert!(!all.contains(PG_PASSWORD), "{all}");
    // The PG* variables alone are an address too.
    let out = on("postgres://")
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", pg.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGPASSWORD", PG_PASSWORD)
        .env("PGDATABASE", "postgres")
        .args(["x", "-c", "echo ran"])
        .succeeds();
    assert_eq!(out.stdout(), "ran\n");
}

#[test]
fn through_pgbouncer_in_transaction_mode_jobs_exclude_wait_and_tokens_rise() {
    let pg = Postgres::start();
    let bouncer = Bouncer::start(&pg);
    let url = bouncer.url();
    let scratch = Scratch::new();
    let children: Vec<Child> = (0..6)
        .map(|i| {
            on(&url)
                .args(["-q", "--ttl", "3s", "pool", "-c"])
                .arg(logging_job(&scratch, &format!("j{i}"), "0.2"))
                .spawn()
        })
        .collect();
    for mut c in children {
        assert_eq!(wait_child(&mut c, Duration::from_secs(60)).code(), Some(0));
    }
    let s = spans(&scratch);
    assert_eq!(s.len(), 6);
    serial(&s);
    // A waiter gets in soon after the holder ends, notified or not (LISTEN
    // does not survive transaction pooling): within a nap of ttl/9.
    let (mut h, _) = holder(&url, &scratch, "hand", "3s");
    let ran = scratch.path("ran");
    let mut waiter = on(&url)
        .args(["-q", "--ttl", "3s", "hand", "-c"])
        .arg(format!("touch {}", ran.display()))
        .spawn();
    wait_queued(&url, "hand", 1);
    let released = Instant::now();
    assert_eq!(finish(&scratch, &mut h), Some(0));
    assert_eq!(
        wait_child(&mut waiter, Duration::from_secs(20)).code(),
        Some(0)
    );
    let took = released.elapsed();
    assert!(ran.exists());
    assert!(took < Duration::from_secs(3), "hand-off took {took:?}");
    // No session state was left on the server: every lockrun row is gone.
    assert_eq!(pg.rows(), 0);
}

#[test]
fn through_pgbouncer_waiters_are_served_in_arrival_order() {
    let pg = Postgres::start();
    let bouncer = Bouncer::start(&pg);
    let url = bouncer.url();
    let scratch = Scratch::new();
    let order = scratch.path("order");
    let (mut first, _) = holder(&url, &scratch, "fifo", "3s");
    let mut children = Vec::new();
    for i in 0..4 {
        children.push(
            on(&url)
                .args(["-q", "--ttl", "3s", "fifo", "-c"])
                .arg(format!("echo {i} >> {}", order.display()))
                .spawn(),
        );
        wait_queued(&url, "fifo", i + 1);
    }
    assert_eq!(finish(&scratch, &mut first), Some(0));
    for mut c in children {
        assert_eq!(wait_child(&mut c, Duration::from_secs(60)).code(), Some(0));
    }
    assert_eq!(scratch.read("order"), "0\n1\n2\n3\n");
}

/// A CA, another CA, and a server certificate for 127.0.0.1 signed by the
/// first, made with openssl in `dir` (readable by the server).
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
    // The server (as the postgres user) reads its key and certificate here.
    sh("chown postgres:postgres . srv.key srv.crt && chmod 600 srv.key");
}

#[test]
fn tls_as_sslmode_asks_checked_as_libpq_checks_it() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let p = |f: &str| certs.path().join(f).display().to_string();
    let pg = Postgres::start_with(&[
        "-c",
        "ssl=on",
        "-c",
        &format!("ssl_cert_file={}", p("srv.crt")),
        "-c",
        &format!("ssl_key_file={}", p("srv.key")),
    ]);
    let ca = certs.path().join("ca.crt").display().to_string();
    let other = certs.path().join("other.crt").display().to_string();
    let base = pg.url();
    // The job asks the server whether lockrun's own connection is encrypted.
    let used_tls = |url: &str, extra: &[&str]| -> bool {
        let out = on(url)
            .args(extra)
            .args(["x", "-c"])
            .arg(format!(
                "psql -X -Atc \"SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a \
                 USING (pid) WHERE a.application_name = 'lockrun'\" 'host={} port={} user=postgres dbname=postgres'",
                pg.dir().display(),
                pg.port
            ))
            .succeeds();
        out.stdout().trim() == "t"
    };
    // verify-full with the right CA: encrypted, and the name (127.0.0.1) checked.
    assert!(used_tls(
        &format!("{base}?sslmode=verify-full&sslrootcert={ca}"),
        &[]
    ));
    assert!(used_tls(
        &format!("{base}?sslmode=verify-full"),
        &["--tls-ca", &ca]
    ));
    // require without a CA: encrypted, not checked (as libpq).
    assert!(used_tls(&format!("{base}?sslmode=require"), &[]));
    // prefer (the default): encrypted when the server offers it.
    assert!(used_tls(&base, &[]));
    // disable: plain.
    assert!(!used_tls(&format!("{base}?sslmode=disable"), &[]));
    // A certificate of another CA: refused at once, one line, no password.
    for mode in ["verify-ca", "verify-full", "require"] {
        let out = on(&format!("{base}?sslmode={mode}&sslrootcert={other}"))
            .args(["x", "true"])
            .code(69)
            .says(&["certificate"]);
        assert!(!out.stderr().contains(PG_PASSWORD));
    }
    // A server without TLS cannot satisfy require.
    let plain = Postgres::start();
    on(&format!("{}?sslmode=require", plain.url()))
        .args(["x", "true"])
        .code(69)
        .says(&["TLS"]);
}

#[test]
fn a_server_defaulting_to_repeatable_read_still_never_lets_a_writer_beside_anyone() {
    // Under REPEATABLE READ a transaction's snapshot dates from its first
    // statement, before the name's lock was granted: lockrun asks for READ
    // COMMITTED itself.
    let pg = Postgres::start_with(&["-c", "default_transaction_isolation=repeatable read"]);
    let url = pg.url();
    let scratch = Scratch::new();
    let children: Vec<Child> = (0..8)
        .map(|i| {
            let mode: &[&str] = if i % 2 == 0 { &[] } else { &["-s"] };
            on(&url)
                .args(["-q"])
                .args(mode)
                .args(["rr", "-c"])
                .arg(logging_job(
                    &scratch,
                    &format!("{}{i}", if i % 2 == 0 { "w" } else { "r" }),
                    "0.1",
                ))
                .spawn()
        })
        .collect();
    for mut c in children {
        assert_eq!(wait_child(&mut c, Duration::from_secs(60)).code(), Some(0));
    }
    let s = spans(&scratch);
    assert_eq!(s.len(), 8);
    for a in s.iter().filter(|a| a.who.starts_with('w')) {
        for b in s.iter().filter(|b| b.token != a.token) {
            assert!(
                a.end <= b.start || b.end <= a.start,
                "a writer beside another holder: {a:?} {b:?}"
            );
        }
    }
}

#[test]
fn the_readme_guide_guards_an_alembic_migration_as_written() {
    // Debian's python3 with Debian's alembic and psycopg2.
    let python = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import alembic, psycopg2"])
        .output();
    if !python.is_ok_and(|o| o.status.success()) {
        panic!(
            "alembic or psycopg2 not found for /usr/bin/python3: the guide's test needs them \
             (apt-get install -y python3-alembic python3-psycopg2)"
        );
    }
    let pg = Postgres::start();
    // A password as a generator makes them: characters a URL would need
    // escaped.
    let password = "ab/cd+ef=";
    pg.sql(&format!("ALTER ROLE postgres PASSWORD '{password}'"));
    let scratch = Scratch::new();
    std::fs::write(
        scratch.path("guide.sh"),
        readme_guide("Guard a migration with PostgreSQL"),
    )
    .unwrap();
    let bin_dir = std::path::Path::new(BIN)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let psql_dir = std::path::Path::new("/usr/bin").display().to_string();
    let out = std::process::Command::new("bash")
        .args(["-e", "guide.sh"])
        .current_dir(scratch.dir.path())
        .env("PATH", format!("{bin_dir}:{psql_dir}:/bin"))
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", pg.port.to_string())
        .env("PGUSER", "postgres")
        .env("PGPASSWORD", password)
        .env("PGDATABASE", "postgres")
        .env("TMPDIR", scratch.dir.path())
        .env_remove("LOCKRUN_URL")
        .env_remove("PGPASSFILE")
        .output()
        .expect("run bash");
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&out.stdout).trim(), "0001", "{err}");
    // One pipeline migrated; the other three waited for it, then found
    // nothing to do.
    assert_eq!(err.matches("Running upgrade").count(), 1, "{err}");
    assert_eq!(err.matches("waiting for migrate").count(), 3, "{err}");
    assert!(!err.contains(password), "{err}");
}

#[test]
fn a_revoked_lease_keeps_the_next_holder_out_until_it_would_have_ended() {
    let pg = Postgres::start();
    let url = pg.url();
    let scratch = Scratch::new();
    let (mut h, job) = holder(&url, &scratch, "rv", "3s");
    let started = scratch.path("started");
    let mut waiter = on(&url)
        .args(["-q", "--ttl", "3s", "rv", "-c"])
        .arg(format!("date +%s%N > {}", started.display()))
        .spawn();
    wait_queued(&url, "rv", 1);
    let left = status_json(&url, "rv")["ttl_left_ms"].as_u64().unwrap();
    let revoked_at = now_ns();
    on(&url).args(["release", "--force", "rv"]).succeeds();
    // The holder's next renewal finds the row not its own: its job stops.
    assert_eq!(wait_child(&mut h, Duration::from_secs(20)).code(), Some(76));
    assert!(!alive(job));
    assert_eq!(
        wait_child(&mut waiter, Duration::from_secs(20)).code(),
        Some(0)
    );
    let start: u128 = scratch.read("started").trim().parse().unwrap();
    let waited = Duration::from_nanos((start - revoked_at) as u64);
    // Not before the revoked row's expiry (less the time `status` took).
    assert!(
        waited + Duration::from_millis(300) >= Duration::from_millis(left),
        "the next holder started {waited:?} after the revoke, {left} ms were left"
    );
}

fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

// ---- doctor, status without a name, --min-hold (lockrun(1) "COMMANDS", "Once per window") ----

/// `lockrun doctor`'s lines as (verdict, topic, text).
fn doctor_lines(out: &str) -> Vec<(String, String, String)> {
    out.lines()
        .map(|l| {
            let (v, rest) = l.split_once("  ").expect("verdict, two spaces");
            let (topic, said) = rest.trim().split_once(": ").expect("topic: text");
            (v.trim().to_string(), topic.to_string(), said.to_string())
        })
        .collect()
}

#[track_caller]
fn verdict_of(lines: &[(String, String, String)], topic: &str) -> String {
    lines
        .iter()
        .find(|(_, t, _)| t == topic)
        .unwrap_or_else(|| panic!("no {topic} check: {lines:?}"))
        .0
        .clone()
}

#[test]
fn doctor_checks_the_server_the_tables_and_the_role_s_rights_creating_nothing() {
    let pg = Postgres::start();
    // Healthy and untouched: all ok, and still untouched.
    let out = on(&pg.url()).arg("doctor").code(0).stdout();
    let lines = doctor_lines(&out);
    for topic in [
        "reachable",
        "round trip",
        "clock",
        "version",
        "pooler",
        "default_transaction_isolation",
        "idle_in_transaction_session_timeout",
        "connections",
        "tables",
    ] {
        assert_eq!(verdict_of(&lines, topic), "ok", "{out}");
    }
    assert!(!pg.has_schema() && pg.rows() == 0, "doctor created: {out}");

    // Once the tables exist: each is checked; still nothing written.
    on(&pg.url()).args(["x", "true"]).succeeds();
    let before = pg.sql("SELECT last_value FROM lockrun.lockrun_tokens");
    let out = on(&pg.url()).arg("doctor").code(0).stdout();
    let lines = doctor_lines(&out);
    for topic in ["leases table", "waiters table", "token sequence"] {
        assert_eq!(verdict_of(&lines, topic), "ok", "{out}");
    }
    assert_eq!(
        pg.sql("SELECT last_value FROM lockrun.lockrun_tokens"),
        before
    );

    // A role without the grants: each missing right is a failure, 69.
    pg.sql("CREATE ROLE norights LOGIN PASSWORD 'nr-pw'");
    let ran = on(&pg.url_as("norights", "nr-pw")).arg("doctor").code(69);
    let out = ran.stdout();
    assert!(!out.contains("nr-pw") && !ran.stderr().contains("nr-pw"));
    let lines = doctor_lines(&out);
    assert_eq!(verdict_of(&lines, "schema"), "fail", "{out}");
    assert_eq!(verdict_of(&lines, "leases table"), "fail", "{out}");
    assert!(out.contains("GRANT"), "{out}");

    // The grants lockrun-engines(7) lists are enough for every check.
    pg.sql(
        "GRANT USAGE ON SCHEMA lockrun TO norights; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON lockrun.lockrun_leases, lockrun.lockrun_waiters TO norights; \
         GRANT USAGE ON SEQUENCE lockrun.lockrun_tokens TO norights",
    );
    // USAGE alone (the grants of older versions): runs work, tokens are
    // floored by the clock, but the sequence is not moved up: a warning.
    let out = on(&pg.url_as("norights", "nr-pw"))
        .arg("doctor")
        .code(1)
        .stdout();
    assert_eq!(
        verdict_of(&doctor_lines(&out), "token sequence"),
        "warn",
        "{out}"
    );
    pg.sql("GRANT UPDATE ON SEQUENCE lockrun.lockrun_tokens TO norights");
    on(&pg.url_as("norights", "nr-pw")).arg("doctor").code(0);

    // A foreign table in the way: a failure naming --prefix.
    pg.sql("CREATE SCHEMA other; CREATE TABLE other.lockrun_leases (id int PRIMARY KEY)");
    let out = on(&pg.url())
        .args(["--prefix", "other", "doctor"])
        .code(69)
        .stdout();
    let lines = doctor_lines(&out);
    assert_eq!(verdict_of(&lines, "leases table"), "fail", "{out}");
    assert!(out.contains("--prefix"), "{out}");
}

#[test]
fn doctor_sees_a_transaction_pooling_pgbouncer() {
    let pg = Postgres::start();
    let bouncer = Bouncer::start(&pg);
    let out = on(&bouncer.url()).arg("doctor").code(1).stdout();
    assert_eq!(verdict_of(&doctor_lines(&out), "pooler"), "warn", "{out}");
    assert!(out.contains("ttl/9"), "{out}");
}

#[test]
fn status_without_a_name_creates_nothing_and_lists_waiters() {
    let pg = Postgres::start();
    on(&pg.url()).arg("status").code(1);
    on(&pg.url()).arg("list").code(1);
    assert!(!pg.has_schema());
    let scratch = Scratch::new();
    let (mut h, _) = holder(&pg.url(), &scratch, "busy", "30s");
    let mut waiter = on(&pg.url()).args(["-q", "busy", "true"]).spawn();
    wait_queued(&pg.url(), "busy", 1);
    let text = on(&pg.url()).arg("list").code(0).stdout();
    assert!(text.starts_with("busy: held by"), "{text}");
    assert!(text.contains("1 waiting"), "{text}");
    assert_eq!(finish(&scratch, &mut h), Some(0));
    assert_eq!(
        wait_child(&mut waiter, Duration::from_secs(20)).code(),
        Some(0)
    );
}

#[test]
fn ten_thousand_names_are_listed_in_seconds_sorted_as_bytes() {
    let pg = Postgres::start();
    on(&pg.url()).args(["x", "true"]).succeeds();
    // Held leases as the grant writes them, in one statement; a name in
    // upper case sorts before lower case, as bytes do.
    pg.sql(
        "INSERT INTO lockrun.lockrun_leases (name, slot, owner, label, token, mode, lim, \
           expires_at, granted_at) \
         SELECT 'n' || lpad(i::text, 5, '0'), 0, md5(i::text), 'host:' || i, \
           nextval('lockrun.lockrun_tokens'), 'x', 1, clock_timestamp() + interval '10 min', \
           clock_timestamp() FROM generate_series(1, 10000) i; \
         INSERT INTO lockrun.lockrun_leases (name, slot, owner, label, token, mode, lim, \
           expires_at, granted_at) VALUES ('Z', 0, 'o', 'h:1', 1, 'x', 1, \
           clock_timestamp() + interval '10 min', clock_timestamp())",
    );
    let started = Instant::now();
    let out = on(&pg.url()).arg("status").code(0).stdout();
    let took = started.elapsed();
    println!("status of 10,000 names on PostgreSQL: {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let lines: Vec<&str> = out.lines().collect();
    // x was released cleanly: its row is gone, so it leaves no trace.
    assert_eq!(lines.len(), 10_001, "Z and 10,000 others");
    assert!(lines[0].starts_with("Z: held by h:1"), "{}", lines[0]);
    assert!(
        lines[1].starts_with("n00001: held by host:1,"),
        "{}",
        lines[1]
    );
    assert!(
        lines[10_000].starts_with("n10000: held by"),
        "{}",
        lines[10_000]
    );
    // Never an owner value.
    assert!(!out.contains(&pg.sql("SELECT md5('1')").trim().to_string()));
}

// ---- a lost counter, session settings, hand-written rows, secrets in the query ----

/// The sequence's value as the server has it now.
fn sequence_value(pg: &Postgres) -> u64 {
    pg.sql("SELECT last_value FROM lockrun.lockrun_tokens")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn tokens_never_go_back_when_the_schema_is_dropped_or_an_older_dump_restored() {
    let pg = Postgres::start();
    let url = pg.url();
    let mut last = 0;
    for _ in 0..3 {
        let t = run_token(&url, "drop");
        assert!(t > last, "token {t} after {last}");
        last = t;
    }
    // The sequence never hands out less than a token already given, so a
    // lockrun that only takes nextval (an older version in the fleet)
    // follows on.
    assert!(sequence_value(&pg) >= last);

    // Between two runs: an operator drops the schema, and with it the
    // sequence; the next run recreates both.
    pg.sql("DROP SCHEMA lockrun CASCADE");
    let t = run_token(&url, "drop");
    assert!(
        t > last,
        "token {t} after the schema was dropped, {last} before"
    );
    last = t;

    // While a job holds the name: the next holder gets a higher token.
    let scratch = Scratch::new();
    let err = std::fs::File::create(scratch.path("err")).unwrap();
    let mut h = on(&url)
        .args(["-vv", "--ttl", "6s", "drop", "-c"])
        .arg(format!(
            "echo $LOCKRUN_TOKEN > {}; sleep 60",
            scratch.path("token").display()
        ))
        .stderr(Stdio::from(err))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || !scratch
        .read("token")
        .trim()
        .is_empty()));
    let held: u64 = scratch.read("token").trim().parse().unwrap();
    assert!(held > last, "token {held} after {last}");
    pg.sql("DROP SCHEMA lockrun CASCADE");
    let t = run_token(&url, "drop");
    assert!(t > held, "token {t} while token {held} was still held");
    last = t;
    // The old holder finds its row gone and stops its job.
    assert_eq!(
        wait_child(&mut h, Duration::from_secs(30)).code(),
        Some(76),
        "{}",
        scratch.read("err")
    );

    // An older dump restored: the sequence goes back to a small value.
    pg.sql("SELECT setval('lockrun.lockrun_tokens', 5)");
    let t = run_token(&url, "drop");
    assert!(t > last, "token {t} after a restore, {last} before");
    // A grant of an older lockrun in the fleet (nextval alone) follows on.
    let old: u64 = pg
        .sql("SELECT nextval('lockrun.lockrun_tokens')")
        .trim()
        .parse()
        .unwrap();
    assert!(old > t, "nextval {old} after token {t}");
    last = old;

    // Several slots of one name granted at once: every token is new and
    // above every earlier one.
    let children: Vec<Child> = (0..4)
        .map(|_| {
            on(&url)
                .args(["--limit", "2", "-w", "60s", "drop", "-c"])
                .arg("echo $LOCKRUN_TOKEN; sleep 0.2")
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect();
    let mut tokens: Vec<u64> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success());
            text(&out.stdout).trim().parse().unwrap()
        })
        .collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 4, "{tokens:?}");
    assert!(tokens[0] > last, "{tokens:?} after {last}");
}

#[test]
fn doctor_fails_a_read_only_role_as_every_run_would() {
    let pg = Postgres::start();
    on(&pg.url()).args(["x", "true"]).succeeds();
    pg.sql(
        "CREATE ROLE ro LOGIN SUPERUSER PASSWORD 'ro-pw'; \
         ALTER ROLE ro SET default_transaction_read_only = on",
    );
    let url = pg.url_as("ro", "ro-pw");
    on(&url)
        .args(["--ttl", "3s", "x", "true"])
        .code(69)
        .says(&["read-only", "default_transaction_read_only"]);
    let out = on(&url).arg("doctor").code(69).stdout();
    let lines = doctor_lines(&out);
    assert_eq!(
        verdict_of(&lines, "default_transaction_read_only"),
        "fail",
        "{out}"
    );
}

#[test]
fn doctor_under_a_short_statement_timeout_agrees_with_a_run() {
    let pg = Postgres::start();
    on(&pg.url()).args(["x", "true"]).succeeds();
    pg.sql(
        "CREATE ROLE st LOGIN SUPERUSER PASSWORD 'st-pw'; \
         ALTER ROLE st SET statement_timeout = '1ms'",
    );
    let url = pg.url_as("st", "st-pw");
    // A run sets its own bounds inside its transactions: it works.
    let ran = on(&url).args(["x", "true"]).output();
    let out = on(&url).arg("doctor").output();
    let said = out.stdout();
    let lines = doctor_lines(&said);
    assert_eq!(ran.out.status.code(), Some(0), "{}", ran.stderr());
    assert_ne!(out.out.status.code(), Some(69), "{said}");
    for topic in ["leases table", "waiters table", "token sequence"] {
        assert_eq!(verdict_of(&lines, topic), "ok", "{said}");
    }
    assert!(!said.contains("could not be read"), "{said}");
    // The role's setting is still named, as a warning.
    assert_eq!(verdict_of(&lines, "statement_timeout"), "warn", "{said}");
}

#[test]
fn hand_written_rows_with_infinite_or_absent_times_can_be_read_and_cleared() {
    let pg = Postgres::start();
    let url = pg.url();
    on(&url).args(["x", "true"]).succeeds();
    // The table as an operator might have it: expires_at allowed to be NULL.
    pg.sql(
        "ALTER TABLE lockrun.lockrun_leases ALTER COLUMN expires_at DROP NOT NULL; \
         INSERT INTO lockrun.lockrun_leases (name, slot, owner, label, token, mode, lim, \
           expires_at, granted_at) VALUES \
         ('inf', 0, 'o1', 'hand:1', 900, 'x', 1, 'infinity', clock_timestamp()), \
         ('far', 0, 'o2', 'hand:2', 901, 'x', 1, '200000-01-01', '-infinity'), \
         ('ninf', 0, 'o3', 'hand:3', 902, 'x', 1, '-infinity', 'infinity'), \
         ('nul', 0, 'o4', 'hand:4', 903, 'x', 1, NULL, clock_timestamp())",
    );
    let out = on(&url).arg("status").code(0).stdout();
    assert!(out.contains("inf: held by hand:1"), "{out}");
    assert!(out.contains("far: held by hand:2"), "{out}");
    for name in ["inf", "far"] {
        on(&url).args(["status", name]).code(0);
        on(&url).args(["status", "--json", name]).code(0);
        on(&url).args(["-n", name, "true"]).code(75);
        on(&url)
            .args(["release", "--force", "--now", name])
            .succeeds();
        on(&url).args(["-n", name, "true"]).succeeds();
    }
    // Lapsed forever, or never said: free.
    for name in ["ninf", "nul"] {
        on(&url).args(["status", name]).code(1);
        on(&url).args(["-n", name, "true"]).succeeds();
    }
    on(&url).arg("status").code(1);
    // An absurd token by hand: the name's next grant is above it, and the
    // sequence every name shares is not used up by it.
    pg.sql(
        "INSERT INTO lockrun.lockrun_leases (name, slot, owner, label, token, mode, lim, \
           expires_at, granted_at) VALUES \
         ('top', 1, 'o5', 'hand:5', 9223372036854775806, 'n', 2, 'infinity', clock_timestamp())",
    );
    let t: u64 = on(&url)
        .args(["--limit", "2", "top", "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds()
        .stdout()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(t, i64::MAX as u64);
    run_token(&url, "other");
    run_token(&url, "other");
}

#[test]
fn secrets_in_the_query_of_a_url_are_never_printed() {
    const SECRET: &str = "Qs3cr3tQ";
    for url in [
        format!("postgres://u@127.0.0.1:9/db?sslpassword={SECRET}"),
        format!("postgres://u@127.0.0.1:9/db?%70assword={SECRET}"),
        format!("postgres://u@127.0.0.1:9/db?%73slpassword={SECRET}&sslmode=disable"),
        format!("postgres://u@127.0.0.1:9/db?scram_client_key={SECRET}"),
        format!("postgres://u@127.0.0.1:9/db?oauth_client_secret={SECRET}"),
        format!("postgres://u@127.0.0.1:9/db?pass%77ord={SECRET}&sslmode=bad"),
    ] {
        for args in [
            &["x", "true"][..],
            &["doctor"][..],
            &["status"][..],
            &["status", "x"][..],
        ] {
            let out = on(&url).args(["-vv"]).args(args).output();
            let code = out.out.status.code();
            assert!(matches!(code, Some(64 | 69)), "{url} {args:?}: {code:?}");
            let all = format!("{}{}", out.stdout(), out.stderr());
            assert!(!all.contains(SECRET), "{url} {args:?}: {all}");
            assert!(all.contains("127.0.0.1"), "{url} {args:?}: {all}");
        }
    }
}
