//! Secrets: a password in the URL, however short, is hidden where the
//! address is shown and nowhere else (the words around it come out whole),
//! and reaches neither lockrun's output nor the job.

use std::time::Duration;

use crate::support::*;

/// Short passwords whose letters are in lockrun's own words.
const SHORT: [&str; 3] = ["lock", "ok", "x"];

/// Everything one invocation printed, stdout then stderr.
fn printed(ran: &Ran) -> String {
    format!("{}{}", ran.stdout(), ran.stderr())
}

/// No password as userinfo, and no mask anywhere but in the userinfo of an
/// address (`user:***@`): a mask elsewhere garbles a word and gives away
/// which letters the password has.
#[track_caller]
fn masked_only_in_addresses(what: &str, pw: &str, out: &str) {
    assert!(!out.contains(&format!(":{pw}@")), "{what}: {out}");
    let outside = out.replace(":***@", "");
    assert!(
        !outside.contains("***"),
        "{what}: a mask outside an address: {out}"
    );
}

/// doctor, a `-v` run of a job and `status` with `url`, whose password is `pw`.
fn plain_words(url: &str, pw: &str) {
    let doctor = on(url).arg("doctor").output();
    let out = printed(&doctor);
    assert!(
        matches!(doctor.out.status.code(), Some(0 | 1)),
        "doctor with {pw:?}: {out}"
    );
    masked_only_in_addresses(&format!("doctor with {pw:?}"), pw, &out);

    let run = on(url)
        .args(["-v", "--ttl", "10s", "nox", "--", "true"])
        .succeeds();
    let err = run.stderr();
    masked_only_in_addresses(&format!("-v run with {pw:?}"), pw, &err);
    assert!(err.contains("acquired nox"), "-v run with {pw:?}: {err}");
    assert!(err.contains("exited with 0"), "-v run with {pw:?}: {err}");

    for args in [
        vec!["status", "nox"],
        vec!["status"],
        vec!["status", "--json", "nox"],
    ] {
        let ran = on(url).args(&args).output();
        let out = printed(&ran);
        masked_only_in_addresses(&format!("{args:?} with {pw:?}"), pw, &out);
        assert!(
            args.len() == 1 || out.contains("nox"),
            "{args:?} with {pw:?}: {out}"
        );
    }
}

#[test]
fn short_passwords_on_redis_garble_no_word() {
    let redis = Redis::start();
    for (i, pw) in SHORT.iter().enumerate() {
        let user = format!("u{i}");
        redis.cmd::<String>(&[
            "ACL",
            "SETUSER",
            &user,
            "on",
            &format!(">{pw}"),
            "~*",
            "&*",
            "+@all",
        ]);
        plain_words(&format!("redis://{user}:{pw}@127.0.0.1:{}", redis.port), pw);
    }
    // The default user's password, as `requirepass` sets it.
    redis.cmd::<String>(&["CONFIG", "SET", "requirepass", "lock"]);
    let url = format!("redis://:lock@127.0.0.1:{}", redis.port);
    let out = on(&url).arg("doctor").output().stdout();
    assert!(out.contains("lockrun-safety(7)"), "{out}");
    masked_only_in_addresses("doctor", "lock", &out);
}

#[test]
fn short_passwords_on_etcd_garble_no_word() {
    let etcd = Etcd::start();
    let url = etcd.with_locker("lock");
    plain_words(&url, "lock");
    for pw in ["ok", "x"] {
        let user = format!("locker-{pw}");
        etcd.ctl(&[
            "--user",
            "root:rootpw",
            "user",
            "add",
            &format!("{user}:{pw}"),
        ]);
        etcd.ctl(&[
            "--user",
            "root:rootpw",
            "user",
            "grant-role",
            &user,
            "locking",
        ]);
        plain_words(&format!("etcd://{user}:{pw}@127.0.0.1:{}", etcd.port), pw);
    }
}

#[test]
fn short_passwords_on_postgres_garble_no_word() {
    let pg = Postgres::start();
    for (i, pw) in SHORT.iter().enumerate() {
        pg.sql(&format!("CREATE ROLE u{i} LOGIN SUPERUSER PASSWORD '{pw}'"));
        plain_words(&pg.url_as(&format!("u{i}"), pw), pw);
    }
    let out = on(&pg.url_as("u1", "ok")).arg("doctor").output().stdout();
    assert!(out.contains("tokens"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("ok  ")), "{out}");
}

#[test]
fn short_passwords_on_mysql_garble_no_word() {
    let db = MyDb::new();
    for (i, pw) in SHORT.iter().enumerate() {
        let user = format!("{}_u{i}", db.db);
        db.sql(&format!(
            "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{pw}'; \
             GRANT ALL ON `{}`.* TO '{user}'@'127.0.0.1'",
            db.db
        ));
        plain_words(&db.server.url_as(&user, pw, &db.db), pw);
    }
}

#[test]
fn short_passwords_on_zookeeper_garble_no_word() {
    for pw in SHORT {
        let (port, chroot) = zk_chroot();
        plain_words(&format!("zk://locker:{pw}@127.0.0.1:{port}{chroot}"), pw);
    }
}

/// A password long and distinctive enough to be found: not in any line,
/// whatever went wrong, a server's own error included.
#[test]
fn a_distinctive_password_is_in_no_line_even_in_a_server_error() {
    let pw = "Zq7-distinctive-9Xw";
    let pg = Postgres::start();
    pg.sql(&format!("CREATE ROLE lim LOGIN PASSWORD '{pw}'"));
    let good = pg.url_as("lim", pw);
    // A user without rights: the server's errors, and a run that fails.
    for args in [
        vec!["doctor"],
        vec!["-vv", "--ttl", "10s", "nox", "--", "true"],
        vec!["status", "nox"],
        vec!["release", "--force", "nox"],
    ] {
        let out = printed(&on(&good).args(&args).output());
        assert!(!out.contains(pw), "{args:?}: {out}");
        assert!(!out.is_empty(), "{args:?}");
    }
    // A wrong password, and a server that is not there.
    for url in [
        pg.url_as("lim", &format!("{pw}-wrong")),
        format!("postgres://lim:{pw}@127.0.0.1:1/postgres"),
        format!("redis://u:{pw}@127.0.0.1:1"),
        format!("mysql://u:{pw}@127.0.0.1:1/db"),
        format!("etcd://u:{pw}@127.0.0.1:1"),
        format!("zk://u:{pw}@127.0.0.1:1"),
    ] {
        for args in [
            vec!["doctor"],
            vec!["-vv", "--wait", "0", "nox", "--", "true"],
        ] {
            let ran = on(&url).args(&args).output();
            let out = printed(&ran);
            assert!(!out.contains(pw), "{args:?}: {out}");
            assert!(ran.out.status.code() != Some(0), "{args:?}: {out}");
        }
    }
}

/// A URL whose host was left out, so that `user:password` reads as a
/// host and a port (`zks://user:secret#insecure`), on every scheme; and a
/// password with a ':' in it, which reads as part of the host. Protects
/// against a URL reader echoing the "port" (or the "host") in its
/// refusal, or in the URL it shows: what may be a password never shows.
#[test]
fn a_url_without_its_host_never_shows_the_password() {
    for rest in [
        "u:s3cretpw",
        "u:x:s3cretpw",
        "u:s3cretpw/x",
        "[::1]:s3cretpw",
    ] {
        for scheme in [
            "zk",
            "zks",
            "etcd",
            "etcds",
            "redis",
            "rediss",
            "redis+cluster",
            "redis+sentinel",
            "postgres",
            "mysql",
            "mariadb",
        ] {
            let mut urls = vec![format!("{scheme}://{rest}")];
            if matches!(scheme, "zks" | "etcds" | "rediss") {
                urls.push(format!("{scheme}://{rest}#insecure"));
            }
            if scheme.ends_with("sentinel") {
                urls.push(format!("{scheme}://{rest}/master"));
            }
            for url in urls {
                let out = Ran {
                    out: lockrun()
                        .args(["--url", &url, "status", "x"])
                        .output()
                        .unwrap(),
                };
                let said = printed(&out);
                assert!(!said.contains("s3cretpw"), "{url}: {said}");
                assert_eq!(out.out.status.code(), Some(64), "{url}: {said}");
            }
        }
    }
}

#[test]
fn a_password_never_reaches_output_or_the_job() {
    let redis = Redis::start_with(&["--requirepass", "pa55-w0rd-xyz"]);
    let url = format!("redis://:pa55-w0rd-xyz@127.0.0.1:{}", redis.port);
    let scratch = Scratch::new();
    let mut outputs = Vec::new();
    // From the environment, as lockrun(1) recommends (keeps it out of ps).
    let out = run(lockrun().env("LOCKRUN_URL", &url).args([
        "-vv",
        "--ttl",
        "600ms",
        "p",
        "--",
        "sh",
        "-c",
        "env; sleep 0.5",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    outputs.push(out);
    let holder = on(&url)
        .args(["-vv", "--ttl", "3s", "p", "-c"])
        .arg(format!(
            "echo $$ > {}; env; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    scratch.pid_in("pid");
    outputs.push(run(on(&url).args(["-vv", "-n", "p", "true"])));
    outputs.push(run(on(&url).args(["-vv", "status", "p"])));
    outputs.push(run(on(&url).args(["-vv", "status", "--json", "p"])));
    outputs.push(run(
        on(&url).args(["-vv", "release", "--force", "--now", "p"])
    ));
    outputs.push(holder.wait_with_output_checked());
    outputs.push(run(on(&url).args(["--ttl", "nonsense", "p", "true"])));
    outputs.push(run(on(&format!(
        "redis://:pa55-w0rd-xyz@127.0.0.1:{}",
        free_port()
    ))
    .args(["-vv", "p", "true"])));
    for o in &outputs {
        let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
        assert!(!all.contains("pa55-w0rd-xyz"), "password leaked: {all}");
    }
}

trait WaitChecked {
    fn wait_with_output_checked(self) -> std::process::Output;
}

impl WaitChecked for std::process::Child {
    /// Collect a piped child's output, bounded in time (lease lost → 76).
    fn wait_with_output_checked(self) -> std::process::Output {
        let pid = self.id() as i32;
        let guard = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(30));
            if alive(pid) {
                signal(pid, libc::SIGKILL);
            }
        });
        let out = self.wait_with_output().unwrap();
        drop(guard);
        assert_eq!(out.status.code(), Some(76), "{}", text(&out.stderr));
        out
    }
}
