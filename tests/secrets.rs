//! Secrets: a password in the URL, however short, is hidden where the
//! address is shown and nowhere else (the words around it come out whole),
//! and reaches neither lockrun's output nor the job. What every engine's
//! users promise is in the conformance suite; here are the forms of one
//! engine or of none (a default user's password, a URL without its host,
//! /proc). How each engine reads its own credentials (libpq's and MySQL's
//! URL options, etcd users, ZooKeeper digests) is tested in that engine's
//! file.

use std::process::Command;
use std::time::Duration;

use crate::conformance::{masked_only_in_addresses, printed};
use crate::operators::hold_name;
use crate::support::*;

/// The default user's short password, as `requirepass` sets it: masked
/// in the address doctor shows, and no word garbled (every engine's own
/// users: the conformance suite).
#[test]
fn a_short_requirepass_on_redis_garbles_no_word() {
    let redis = Redis::start();
    redis.cmd::<String>(&["CONFIG", "SET", "requirepass", "lock"]);
    let url = format!("redis://:lock@127.0.0.1:{}", redis.port);
    let out = on(&url).arg("doctor").output().stdout();
    assert!(out.contains("lockrun-safety(7)"), "{out}");
    masked_only_in_addresses("doctor", "lock", &out);
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

#[test]
fn no_password_in_status_or_doctor() {
    let pw = "s3cret-pw-7f3a";
    let redis = Redis::start_with(&["--requirepass", pw]);
    let url = format!("redis://:{pw}@127.0.0.1:{}", redis.port);
    let _held = hold_name(&url, "job");
    for args in [
        vec!["status"],
        vec!["status", "--json"],
        vec!["status", "job"],
        vec!["doctor"],
        vec!["-v", "doctor"],
    ] {
        let ran = on(&url).args(&args).output();
        let all = format!("{}{}", ran.stdout(), ran.stderr());
        assert!(!all.contains(pw), "{args:?}: {all}");
        assert!(!all.is_empty(), "{args:?}");
    }
    // A wrong password: refused, and still not shown.
    let bad = format!("redis://:wrong-{pw}@127.0.0.1:{}", redis.port);
    let ran = on(&bad).arg("doctor").code(69);
    assert!(!format!("{}{}", ran.stdout(), ran.stderr()).contains(pw));
    assert!(
        ran.stdout().starts_with("fail  reachable:"),
        "{}",
        ran.stdout()
    );
}

/// A job of the same (non-root) user cannot read the password from lockrun's
/// /proc entries.
#[test]
fn a_job_cannot_read_the_password_from_proc() {
    if !is_root() {
        panic!("this test switches to the user nobody and needs root");
    }
    let redis = Redis::start_with(&["--requirepass", "sekrit-pw"]);
    let url = format!("redis://:sekrit-pw@127.0.0.1:{}", redis.port);
    let out = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN, "pp", "-c"])
        .arg("cat /proc/$PPID/environ /proc/${LOCKRUN_OWNER##*:}/environ 2>/dev/null | tr '\\0' '\\n'; true")
        .env("LOCKRUN_URL", &url)
        .env_remove("LOCKRUN_TTL"));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        !all.contains("sekrit-pw"),
        "the job read the password: {all}"
    );
}

/// A password in an inherited LOCKRUN_URL never reaches the job, whichever
/// URL is in effect.
#[test]
fn an_inherited_password_url_never_reaches_the_job() {
    let redis = Redis::start_with(&["--requirepass", "sekrit-pw"]);
    let plain = Redis::start();
    let scratch = Scratch::new();
    let with_pw = format!("redis://:sekrit-pw@127.0.0.1:{}", redis.port);
    for url in [plain.url(), scratch.file_url(), String::new()] {
        let out = run(lockrun()
            .env("LOCKRUN_URL", &with_pw)
            .args(["--url", &url, "pw", "--", "env"]));
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{url}: {all}");
        assert!(
            !all.contains("sekrit-pw"),
            "{url:?}: password reached the job: {all}"
        );
    }
    // Every URL form that can carry a secret, and one lockrun cannot read
    // (so cannot tell): overridden by --url, none reaches the job.
    for inherited in [
        "postgres://u:sekrit-pw@127.0.0.1:9/db",
        "postgres://u@127.0.0.1:9/db?password=sekrit-pw",
        "postgres://u@127.0.0.1:9/db?sslpassword=sekrit-pw",
        "postgres://u@127.0.0.1:9/db?%70assword=sekrit-pw",
        "etcd://u:sekrit-pw@127.0.0.1:9",
        "redis+sentinel://:sekrit-pw@127.0.0.1:9/m",
        "unknown://u:sekrit-pw@127.0.0.1:9",
    ] {
        let out = run(lockrun().env("LOCKRUN_URL", inherited).args([
            "--url",
            &scratch.file_url(),
            "pw",
            "--",
            "env",
        ]));
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{inherited}: {all}");
        assert!(
            !all.contains("sekrit-pw"),
            "{inherited:?}: a secret reached the job: {all}"
        );
    }
}

/// A secret in a Redis or etcd URL's query (`?password=`, as some clients
/// take it) or a lone user name (which some clients read as the password)
/// is never echoed, whether the URL is refused or the server unreachable.
#[test]
fn a_secret_in_a_query_or_a_lone_user_is_never_echoed() {
    for url in [
        "redis://127.0.0.1:9?password=S3CR",
        "redis+sentinel://127.0.0.1:9/m?sentinel_password=S3CR",
        "redis+sentinel://127.0.0.1:9?password=S3CR",
        "redis+cluster://127.0.0.1:9?password=S3CR",
        "etcd://127.0.0.1:9?password=S3CR",
        "etcd://u:S3CR@127.0.0.1:9?password=S3CR",
        "etcd://127.0.0.1:9/S3CR",
        "redis://S3CR@127.0.0.1:9",
        "redis+cluster://S3CR@127.0.0.1:9",
        "etcd://S3CR@127.0.0.1:9",
    ] {
        for args in [vec!["-n", "x", "true"], vec!["status", "x"], vec!["doctor"]] {
            let out = on(url).args(&args).output();
            let all = format!("{}{}", out.stdout(), out.stderr());
            assert!(!all.contains("S3CR"), "{url} {args:?}: {all}");
            assert!(
                matches!(out.out.status.code(), Some(64 | 69)),
                "{url} {args:?}: {all}"
            );
        }
    }
}

#[test]
fn wrong_password_is_unavailable_and_never_printed() {
    let redis = Redis::start_with(&["--requirepass", "right-horse-battery"]);
    let url = format!("redis://:wrong-staple-9@127.0.0.1:{}", redis.port);
    for args in [
        vec!["-vv", "x", "true"],
        vec!["status", "x"],
        vec!["release", "--force", "x"],
    ] {
        let out = run(lockrun().args(["--url", &url]).args(&args));
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(69), "{args:?}: {all}");
        assert!(!all.contains("wrong-staple-9"), "password leaked: {all}");
        assert!(all.contains("127.0.0.1"), "{all}");
    }
    // The right password works, and still is never printed.
    let url = format!("redis://:right-horse-battery@127.0.0.1:{}", redis.port);
    let out = run(lockrun().args(["-vv", "--url", &url, "x", "--", "env"]));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        !all.contains("right-horse-battery"),
        "password leaked: {all}"
    );
}
