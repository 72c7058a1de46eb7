//! Operators and cron (lockrun(1) "COMMANDS", "Metrics for cron"): `status`
//! with and without a name, `release` and `release --force`, `doctor`
//! against healthy, broken and silent servers, logging levels, and
//! `--metrics-file` read back by a real Prometheus parser. What is one
//! engine's alone (its grants, its tables) is in that engine's file.

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::support::*;

/// A lockrun holding a name; dropped, it is asked to stop (SIGTERM goes to
/// its job), so that it releases the lease rather than leave it to expire.
pub(crate) struct Holding(Child);

impl Drop for Holding {
    fn drop(&mut self) {
        signal(self.0.id() as i32, libc::SIGTERM);
        wait_child(&mut self.0, Duration::from_secs(20));
    }
}

/// Start lockrun holding `name` around a long job; returns once `status`
/// shows it held.
pub(crate) fn hold_name(url: &str, name: &str) -> Holding {
    let child: Child = on(url)
        .args(["--ttl", "30s", name, "--", "sleep", "60"])
        .spawn();
    assert!(
        wait_until(Duration::from_secs(20), || status_json(url, name)["held"]
            == true),
        "{name} never showed as held"
    );
    Holding(child)
}

#[test]
fn status_without_a_name_says_it_is_no_snapshot_and_lists_nothing_else() {
    let redis = Redis::start();
    // Keys under the prefix that are not lockrun's, and another prefix.
    redis.cmd::<()>(&["SET", "lockrun:stray", "x"]);
    redis.cmd::<()>(&["SET", "other:{x}:fence", "1"]);
    let ran = on(&redis.url()).arg("status").code(1);
    assert_eq!(ran.stdout(), "");
    ran.says(&["SCAN", "not as one snapshot"]);
    assert_eq!(on(&redis.url()).args(["-q", "status"]).code(1).stderr(), "");
}

#[test]
fn ten_thousand_names_on_redis_are_listed_in_seconds() {
    let redis = Redis::start();
    // Held leases written as lockrun's scripts write them, in one call. A
    // signal to this test process (a child of another test ending) can cut
    // the read short; the script writes the same keys again, so ask again.
    let script = redis::cmd("EVAL")
        .arg(
            "local t = redis.call('TIME') \
             local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
             for i = 1, tonumber(ARGV[1]) do \
               local k = 'lockrun:{n' .. string.format('%05d', i) .. '}' \
               redis.call('HSET', k, 'h:owner' .. i, \
                 i .. '|' .. (now + 600000) .. '|x|1|-1|' .. now .. '|host:' .. i) \
               redis.call('PEXPIRE', k, 600000) \
               redis.call('SET', k .. ':fence', i) \
             end \
             return tonumber(ARGV[1])",
        )
        .arg(0)
        .arg(10_000)
        .clone();
    let made: i64 = (0..3)
        .find_map(|_| script.query(&mut redis.conn()).ok())
        .expect("the script that writes 10,000 leases never answered");
    assert_eq!(made, 10_000);
    let started = Instant::now();
    let ran = on(&redis.url()).arg("status").code(0);
    let took = started.elapsed();
    println!("status of 10,000 names on Redis: {took:?}");
    let out = ran.stdout();
    assert_eq!(out.lines().count(), 10_000);
    assert!(out.lines().all(|l| l.contains("held by host:")));
    assert!(
        out.starts_with("n00001: held by host:1, token 1,"),
        "{}",
        &out[..80]
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    let started = Instant::now();
    let v = on(&redis.url()).args(["status", "--json"]).code(0).json();
    println!(
        "status --json of 10,000 names on Redis: {:?}",
        started.elapsed()
    );
    assert_eq!(v.as_array().unwrap().len(), 10_000);
}

/// doctor's lines as (verdict, topic) → the line.
fn doctor_lines(out: &str) -> BTreeMap<(String, String), String> {
    out.lines()
        .map(|l| {
            let (verdict, rest) = l.split_once("  ").expect("verdict, two spaces");
            let topic = rest.trim_start().split(':').next().unwrap();
            ((verdict.trim().into(), topic.into()), l.to_string())
        })
        .collect()
}

#[test]
fn doctor_on_a_healthy_redis_is_all_ok() {
    let redis = Redis::start_with(&["--appendonly", "yes"]);
    let ran = on(&redis.url()).arg("doctor").code(0);
    let out = ran.stdout();
    println!("{out}");
    for topic in [
        "reachable",
        "round trip",
        "clock",
        "version",
        "maxmemory-policy",
        "persistence",
        "replicas",
        "permissions",
    ] {
        assert!(
            doctor_lines(&out).contains_key(&("ok".into(), topic.into())),
            "no ok {topic}: {out}"
        );
    }
    assert!(out.lines().all(|l| l.starts_with("ok  ")), "{out}");
    // Read-only: not one key, before or after.
    assert_eq!(redis.keys(), Vec::<String>::new());
}

#[test]
fn doctor_says_what_a_redis_without_persistence_loses() {
    let redis = Redis::start();
    let out = on(&redis.url()).arg("doctor").code(1).stdout();
    let lines = doctor_lines(&out);
    let line = &lines[&("warn".into(), "persistence".into())];
    assert!(line.contains("a restart loses the leases"), "{line}");
    assert!(line.contains("appendonly yes"), "{line}");
    assert_eq!(
        out.lines().filter(|l| !l.starts_with("ok")).count(),
        1,
        "{out}"
    );
}

#[test]
fn doctor_fails_a_redis_that_evicts() {
    let redis = Redis::start_with(&["--appendonly", "yes", "--maxmemory-policy", "allkeys-lru"]);
    let out = on(&redis.url()).arg("doctor").code(69).stdout();
    let lines = doctor_lines(&out);
    let line = &lines[&("fail".into(), "maxmemory-policy".into())];
    assert!(
        line.contains("allkeys-lru") && line.contains("noeviction"),
        "{line}"
    );
}

#[test]
fn doctor_fails_a_user_without_blpop() {
    let redis = Redis::start_with(&["--appendonly", "yes"]);
    // lockrun-engines(7) "REDIS", less +blpop.
    let rules = "on >pw-no-blpop resetchannels -@all +evalsha +script|load +rpush +pexpire \
                 +pexpireat +hget +hset +hdel +hgetall +pttl +time +incr +set +del +zadd +zrange \
                 +zrangebyscore +zrem +zscore +zcard +zcount +scan ~lockrun:*";
    let mut acl = redis::cmd("ACL");
    acl.arg("SETUSER").arg("locker");
    for r in rules.split_whitespace() {
        acl.arg(r);
    }
    acl.query::<()>(&mut redis.conn()).unwrap();
    let url = format!("redis://locker:pw-no-blpop@127.0.0.1:{}", redis.port);
    let out = on(&url).arg("doctor").code(69).stdout();
    let lines = doctor_lines(&out);
    let line = &lines[&("fail".into(), "permissions".into())];
    assert!(line.contains("+blpop"), "{line}");
    assert!(!line.contains("+hset"), "only what is missing: {line}");
    // The same user with +blpop passes that check.
    redis.cmd::<()>(&["ACL", "SETUSER", "locker", "+blpop"]);
    let out = on(&url).arg("doctor").output().stdout();
    assert!(
        doctor_lines(&out).contains_key(&("ok".into(), "permissions".into())),
        "{out}"
    );
    assert_eq!(redis.keys(), Vec::<String>::new());
}

#[test]
fn doctor_on_a_server_that_does_not_answer_is_69() {
    let port = free_port();
    let ran = on(&format!("redis://127.0.0.1:{port}"))
        .arg("doctor")
        .code(69);
    assert!(
        ran.stdout().starts_with("fail  reachable:"),
        "{}",
        ran.stdout()
    );
    assert_eq!(ran.stdout().lines().count(), 1);
}

/// A key under the prefix that is not lockrun's costs its name a note, not
/// the whole list.
#[test]
fn a_foreign_key_on_etcd_leaves_the_rest_of_the_list() {
    let etcd = Etcd::start();
    let url = etcd.url();
    on(&url).args(["--min-hold", "30s", "good", "true"]).code(0);
    etcd.ctl(&["put", "lockrun:zz/q/0000000000000007", "garbage"]);
    let ran = on(&url).arg("status").code(0);
    assert!(
        ran.stdout().starts_with("good: held by"),
        "{}",
        ran.stdout()
    );
    assert!(ran.stderr().contains("zz: left out"), "{}", ran.stderr());
}

#[test]
fn doctor_on_etcd_is_all_ok() {
    let etcd = Etcd::start();
    let out = on(&etcd.url()).arg("doctor").code(0).stdout();
    for topic in [
        "reachable",
        "version",
        "leader",
        "round trip",
        "permissions",
    ] {
        assert!(
            doctor_lines(&out).contains_key(&("ok".into(), topic.into())),
            "no ok {topic}: {out}"
        );
    }
    // The permission probe wrote nothing.
    assert_eq!(etcd.keys(), Vec::<String>::new());
}

#[test]
fn doctor_on_the_local_engine_checks_the_directory() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let dir = scratch.path("locks");
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let out = on(&url).arg("doctor").code(0).stdout();
    for topic in ["not a link", "owner", "mode", "file system"] {
        assert!(
            doctor_lines(&out).contains_key(&("ok".into(), topic.into())),
            "no ok {topic}: {out}"
        );
    }
    // Writable by anyone: a warning, and what to do.
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out = on(&url).arg("doctor").code(1).stdout();
    let lines = doctor_lines(&out);
    assert!(
        lines[&("warn".into(), "mode".into())].contains("chmod o-w"),
        "{out}"
    );
    // A link: a warning for a directory given with --url.
    let link = scratch.path("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let out = on(&format!("file://{}", link.display()))
        .arg("doctor")
        .code(1)
        .stdout();
    assert!(
        doctor_lines(&out).contains_key(&("warn".into(), "not a link".into())),
        "{out}"
    );
    // Read-only: a directory that does not exist is not made.
    let missing = scratch.path("not-yet");
    let out = on(&format!("file://{}", missing.display()))
        .arg("doctor")
        .code(0)
        .stdout();
    assert!(out.contains("does not exist yet"), "{out}");
    assert!(!missing.exists());
}

/// A Python that has the `prometheus_client` package (tests/run.sh
/// installs it when missing).
fn python() -> &'static str {
    for py in ["python3", "/usr/bin/python3"] {
        let ok = Command::new(py)
            .args(["-c", "import prometheus_client"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return py;
        }
    }
    panic!(
        "no python3 with prometheus_client: these tests read the metrics file with a real \
         Prometheus parser; install it with `apt-get install -y python3-prometheus-client` \
         (or `pip install prometheus-client`)"
    );
}

/// The metrics file parsed by prometheus_client's text parser: sample name
/// → (labels, value).
pub fn parse_metrics(path: &std::path::Path) -> BTreeMap<String, (BTreeMap<String, String>, f64)> {
    let script = "import json, sys\n\
                  from prometheus_client.parser import text_string_to_metric_families\n\
                  out = {}\n\
                  for fam in text_string_to_metric_families(open(sys.argv[1]).read()):\n\
                  \x20   assert fam.type == 'gauge', fam.type\n\
                  \x20   for s in fam.samples:\n\
                  \x20       out[s.name] = [s.labels, s.value]\n\
                  print(json.dumps(out))\n";
    let out = Command::new(python())
        .args(["-c", script])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "parser: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, pair)| {
            let labels = pair[0]
                .as_object()
                .unwrap()
                .iter()
                .map(|(l, v)| (l.clone(), v.as_str().unwrap().to_string()))
                .collect();
            (k.clone(), (labels, pair[1].as_f64().unwrap()))
        })
        .collect()
}

pub fn value(m: &BTreeMap<String, (BTreeMap<String, String>, f64)>, metric: &str) -> f64 {
    m.get(&format!("lockrun_last_run_{metric}"))
        .unwrap_or_else(|| panic!("no {metric}: {m:?}"))
        .1
}

fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

#[test]
fn metrics_after_a_run_a_skip_and_a_lost_lease() {
    let redis = Redis::start();
    let url = redis.url();
    let scratch = Scratch::new();
    let path = scratch.path("report.prom");

    // A run that held the lock for about 0.3 s and exited 3.
    let before = now_secs();
    on(&url)
        .args(["--label", "nightly \"7\"", "--metrics-file"])
        .arg(&path)
        .args(["report", "-c", "sleep 0.3; exit 3"])
        .code(3);
    let m = parse_metrics(&path);
    let (labels, _) = &m["lockrun_last_run_acquired"];
    assert_eq!(labels["name"], "report");
    assert_eq!(labels["label"], "nightly \"7\"");
    assert_eq!(value(&m, "acquired"), 1.0);
    assert_eq!(value(&m, "exit_code"), 3.0);
    assert_eq!(value(&m, "lease_lost"), 0.0);
    assert!(value(&m, "token") > 1e15, "{m:?}");
    let hold = value(&m, "hold_seconds");
    assert!((0.3..10.0).contains(&hold), "{hold}");
    assert!(value(&m, "wait_seconds") < 10.0);
    let end = value(&m, "end_time_seconds");
    assert!(end >= before - 1.0 && end <= now_secs() + 1.0, "{end}");
    assert_eq!(value(&m, "acquired_time_seconds"), end);
    // Every sample carries the same labels.
    assert!(m.values().all(|(l, _)| l == labels));

    // A skip: -n while another holds it, from the environment this time.
    let holder = hold_name(&url, "report");
    on(&url)
        .env("LOCKRUN_METRICS_FILE", &path)
        .args(["-n", "-E", "0", "report", "true"])
        .code(0);
    let m = parse_metrics(&path);
    assert_eq!(value(&m, "acquired"), 0.0);
    assert_eq!(value(&m, "exit_code"), 0.0);
    assert_eq!(value(&m, "hold_seconds"), 0.0);
    assert!(!m.contains_key("lockrun_last_run_token"), "{m:?}");
    // The last run that held the lock is still known after the skip.
    assert_eq!(value(&m, "acquired_time_seconds"), end);
    assert!(value(&m, "end_time_seconds") >= end);
    assert!(!m["lockrun_last_run_acquired"].0.contains_key("label"));
    drop(holder);

    // A lost lease: broken by release --force while the job runs.
    let mut job = on(&url)
        .arg("--metrics-file")
        .arg(&path)
        .args(["--ttl", "3s", "lost", "--", "sleep", "30"])
        .stderr(std::process::Stdio::null())
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || status_json(
        &url, "lost"
    )["held"]
        == true));
    on(&url).args(["release", "--force", "lost"]).succeeds();
    let st = wait_child(&mut job, Duration::from_secs(20));
    assert_eq!(st.code(), Some(76));
    let m = parse_metrics(&path);
    assert_eq!(m["lockrun_last_run_acquired"].0["name"], "lost");
    assert_eq!(value(&m, "acquired"), 1.0);
    assert_eq!(value(&m, "lease_lost"), 1.0);
    assert_eq!(value(&m, "exit_code"), 76.0);
    // Nothing but the file itself is left beside it.
    let left: Vec<_> = std::fs::read_dir(scratch.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["report.prom"]);
}

#[test]
fn metrics_on_the_local_engine_and_for_a_failed_run() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let path = scratch.path("m.prom");
    on(&url)
        .arg("--metrics-file")
        .arg(&path)
        .args(["job", "true"])
        .succeeds();
    let m = parse_metrics(&path);
    assert_eq!(value(&m, "acquired"), 1.0);
    assert!(value(&m, "token") > 1e15);
    // A command that is not there: the run failed, and says so.
    on(&url)
        .arg("--metrics-file")
        .arg(&path)
        .args(["job", "/no/such/command"])
        .code(127);
    assert_eq!(value(&parse_metrics(&path), "exit_code"), 127.0);
    // An engine that cannot be reached: acquired 0, 69.
    let port = free_port();
    on(&format!("redis://127.0.0.1:{port}"))
        .arg("--metrics-file")
        .arg(&path)
        .args(["job", "true"])
        .code(69);
    let m = parse_metrics(&path);
    assert_eq!(value(&m, "acquired"), 0.0);
    assert_eq!(value(&m, "exit_code"), 69.0);
}

#[test]
fn an_unwritable_metrics_file_is_one_warning_and_changes_nothing() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let path = scratch.path("no/such/dir/m.prom");
    let ran = on(&url)
        .arg("--metrics-file")
        .arg(&path)
        .args(["job", "-c"])
        .arg(format!(
            "echo ran > {}; exit 5",
            scratch.path("out").display()
        ))
        .code(5);
    ran.says(&["warning", "metrics file", "m.prom"]);
    assert_eq!(scratch.read("out"), "ran\n");
    // Even under -q: a metric that never comes would be the only sign.
    on(&url)
        .args(["-q", "--metrics-file"])
        .arg(&path)
        .args(["job", "true"])
        .code(0)
        .says(&["metrics file"]);
    // The job does not inherit it: a lockrun inside writes its own, or none.
    on(&url)
        .env("LOCKRUN_METRICS_FILE", scratch.path("outer.prom"))
        .args(["outer", "-c"])
        .arg(format!(
            "echo \"${{LOCKRUN_METRICS_FILE-unset}}\" > {}",
            scratch.path("env").display()
        ))
        .succeeds();
    assert_eq!(scratch.read("env"), "unset\n");
    // Not a file path at all: refused before anything runs.
    on(&url)
        .args(["--metrics-file", "/", "job", "true"])
        .code(64)
        .says(&["--metrics-file"]);
}

#[test]
fn behind_sentinels_doctor_reads_the_master() {
    let s = Sentinels::start();
    s.wait_synced();
    let out = on(&s.url()).arg("doctor").output().stdout();
    let lines = doctor_lines(&out);
    let reachable = &lines[&("ok".into(), "reachable".into())];
    assert!(
        reachable.contains(&format!("master 127.0.0.1:{}", s.master_port())),
        "{out}"
    );
    // One replica, and no quorum of replicas for writes: said, with the fix.
    let replicas = &lines[&("warn".into(), "replicas".into())];
    assert!(replicas.contains("--replicas 1"), "{out}");
    // With --replicas 1 the same setup is fine.
    let out = on(&s.url())
        .args(["--replicas", "1", "doctor"])
        .output()
        .stdout();
    assert!(
        doctor_lines(&out).contains_key(&("ok".into(), "replicas".into())),
        "{out}"
    );
}

#[test]
fn doctor_on_etcd_checks_the_user_s_permissions_on_the_prefix() {
    let etcd = Etcd::start();
    let url = etcd.with_locker("s3cretpw-e");
    let ran = on(&url).arg("doctor").output();
    let out = ran.stdout();
    assert!(!format!("{out}{}", ran.stderr()).contains("s3cretpw-e"));
    assert!(
        doctor_lines(&out).contains_key(&("ok".into(), "permissions".into())),
        "{out}"
    );
    // Another prefix, outside the role's keys: a failure saying what to grant.
    let out = on(&url)
        .args(["--prefix", "other:", "doctor"])
        .code(69)
        .stdout();
    let lines = doctor_lines(&out);
    let line = &lines[&("fail".into(), "permissions".into())];
    assert!(
        line.contains("grant-permission") && line.contains("other:"),
        "{out}"
    );
    // A wrong password: not reachable as this user, and not shown.
    let wrong = format!("etcd://locker:wrong-s3cretpw-e@127.0.0.1:{}", etcd.port);
    let ran = on(&wrong).arg("doctor").code(69);
    assert!(
        ran.stdout().starts_with("fail  reachable:"),
        "{}",
        ran.stdout()
    );
    assert!(!ran.stdout().contains("s3cretpw-e"));
}

#[test]
fn doctor_on_redis_cluster_reads_every_master() {
    let c = Cluster::start();
    let out = on(&c.url()).arg("doctor").output().stdout();
    for n in &c.nodes {
        let master = format!("master 127.0.0.1:{}:", n.port);
        let about: Vec<&str> = out.lines().filter(|l| l.contains(&master)).collect();
        for topic in ["maxmemory-policy:", "replicas:", "permissions:"] {
            assert!(
                about
                    .iter()
                    .any(|l| l.starts_with("ok") && l.contains(topic)),
                "{master} {topic}: {out}"
            );
        }
    }
    // One master that evicts fails the check, naming it.
    let evicting = &c.nodes[1];
    evicting.cmd::<()>(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    let out = on(&c.url()).arg("doctor").code(69).stdout();
    let failed: Vec<&str> = out.lines().filter(|l| l.starts_with("fail")).collect();
    assert_eq!(failed.len(), 1, "{out}");
    assert!(
        failed[0].contains(&format!("master 127.0.0.1:{}: allkeys-lru", evicting.port)),
        "{out}"
    );
}

/// A file in a shared lock directory whose name decodes to control
/// characters cannot forge a line of `status`: they are shown escaped.
#[test]
fn a_name_with_a_newline_forges_no_line_of_the_listing() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    on(&url).args(["real", "true"]).code(0);
    let dir = url.trim_start_matches("file://");
    std::fs::write(
        format!("{dir}/evil%0Afake: held by root:1, token 9.lock"),
        "",
    )
    .unwrap();
    let out = on(&url).arg("status").output().stdout();
    assert!(
        !out.lines().any(|l| l.starts_with("fake:")),
        "a forged line: {out}"
    );
    assert!(out.contains("evil\\nfake"), "{out}");
}

/// A FIFO named like a lock in a shared directory neither holds the
/// listing up nor spoils it: its name is left out with a note.
#[test]
fn a_fifo_in_the_lock_directory_is_left_out_at_once() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    on(&url).args(["real", "true"]).code(0);
    let dir = url.trim_start_matches("file://");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        format!("{dir}/trap.lock"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o666),
        0,
    )
    .unwrap();
    let t = Instant::now();
    let ran = on(&url).args(["-v", "status"]).output();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(ran.out.status.code(), Some(1), "{}", ran.stderr());
    assert!(ran.stdout().contains("real: free"), "{}", ran.stdout());
    assert!(ran.stderr().contains("trap: left out"), "{}", ran.stderr());
}

/// A name found on a server or in a shared directory that holds a
/// right-to-left override (or another invisible character) is listed
/// escaped, so two names cannot be made to look alike: on every engine.
#[test]
fn a_bidi_name_is_listed_escaped_on_every_engine() {
    const RLO: char = '\u{202e}';
    let check = |engine: &str, url: &str| {
        for args in [vec!["status"], vec!["status", "--json"]] {
            let out = on(url).args(&args).output();
            let (stdout, stderr) = (out.stdout(), out.stderr());
            assert!(
                !stdout.contains(RLO) && !stderr.contains(RLO),
                "{engine}: a raw U+202E in {args:?}: {stdout}{stderr}"
            );
            if args.len() == 1 {
                assert!(
                    stdout.contains("\\u{202e}cba"),
                    "{engine}: {stdout}{stderr}"
                );
            }
        }
    };

    let scratch = Scratch::new();
    let url = scratch.file_url();
    on(&url).args(["real", "true"]).code(0);
    let dir = url.trim_start_matches("file://");
    std::fs::write(format!("{dir}/%E2%80%AEcba.lock"), "").unwrap();
    check("local", &url);

    let redis = Redis::start();
    let _held = hold_name(&redis.url(), "abc");
    for key in redis.keys() {
        if key.contains("{abc}") {
            let to = key.replace("{abc}", &format!("{{{RLO}cba}}"));
            let _: () = redis.cmd(&["RENAME", &key, &to]);
        }
    }
    check("redis", &redis.url());

    let pg = Postgres::start();
    let _held = hold_name(&pg.url(), "abc");
    let schema = pg.sql(
        "SELECT table_schema FROM information_schema.tables WHERE table_name = 'lockrun_leases'",
    );
    pg.sql(&format!(
        "UPDATE {}.lockrun_leases SET name = E'\\u202Ecba' WHERE name = 'abc'",
        schema.trim()
    ));
    check("postgres", &pg.url());
    // A label planted beside a holder: the lines that name the holder while
    // waiting carry no escape sequence or override either.
    let _labelled = hold_name(&pg.url(), "lbl");
    pg.sql(&format!(
        "UPDATE {}.lockrun_leases SET label = E'evil\\u202Egnp\\x1b[31mX' WHERE name = 'lbl'",
        schema.trim()
    ));
    for args in [
        vec!["--wait", "1500ms", "lbl", "true"],
        vec!["-v", "-n", "lbl", "true"],
    ] {
        let out = on(&pg.url()).args(&args).output();
        let err = out.stderr();
        assert_eq!(out.out.status.code(), Some(75), "{args:?}: {err}");
        assert!(err.contains("evil"), "{args:?}: the holder is named: {err}");
        assert!(
            !err.contains(RLO) && !err.contains('\u{1b}'),
            "{args:?}: raw control or override: {err:?}"
        );
    }

    let etcd = Etcd::start();
    let _held = hold_name(&etcd.url(), "abc");
    let listed = etcd.ctl(&[
        "get",
        "--prefix",
        "lockrun:abc/q/",
        "--print-value-only=false",
    ]);
    let mut lines = listed.lines();
    let (key, value) = (lines.next().unwrap(), lines.next().unwrap());
    let bidi = key.replacen("lockrun:abc/", &format!("lockrun:{RLO}cba/"), 1);
    etcd.ctl(&["put", &bidi, value]);
    check("etcd", &etcd.url());
}

#[test]
fn a_lock_named_like_a_subcommand_runs_a_job() {
    let redis = Redis::start();
    let out = on(&redis.url())
        .args(["--", "status", "--", "sh", "-c", "echo $LOCKRUN_NAME"])
        .code(0)
        .out;
    assert_eq!(text(&out.stdout), "status\n");
}

#[test]
fn force_release_is_refused_on_the_local_backend() {
    let scratch = Scratch::new();
    let out = on(&scratch.file_url())
        .args(["release", "--force", "x"])
        .code(64)
        .out;
    assert_eq!(text(&out.stderr).lines().count(), 1);
}

#[test]
fn force_release_revokes_safely() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let url = redis.url();
    let mut holder = hold(Some(&url), "rv", "6s", &scratch);
    let job = scratch.pid_in("pid");
    let mut waiter = on(&url)
        .args(["--ttl", "6s", "rv", "-c"])
        .arg(format!(
            "date +%s%N > {}",
            scratch.path("started").display()
        ))
        .spawn();
    wait_queued(&url, "rv", 1);
    let pttl: i64 = redis.cmd(&["PTTL", "lockrun:{rv}"]);
    let out = run(on(&url).args(["release", "--force", "rv"]));
    let revoked_at = Instant::now();
    let expiry = revoked_at + Duration::from_millis(pttl as u64);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!(":{}", holder.id())),
        "names whose lock it broke: {}",
        text(&out.stdout)
    );
    // The old holder's job is stopped at its next renewal, with 76.
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(20)).code(),
        Some(76)
    );
    assert!(!alive(job));
    // The waiter does not start before the revoked lease's time ran out.
    assert!(wait_child(&mut waiter, Duration::from_secs(30)).success());
    let started_ns: u128 = scratch.read("started").trim().parse().unwrap();
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let started = Instant::now() - Duration::from_nanos((now_ns - started_ns) as u64);
    assert!(
        started + Duration::from_millis(50) >= expiry,
        "waiter started {:?} before the old lease ended",
        expiry - started
    );
}

#[test]
fn force_release_with_a_token_acts_only_on_that_lease() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let url = redis.url();
    on(&url).args(["release", "--force", "t"]).code(1);
    let mut holder = hold(Some(&url), "t", "3s", &scratch);
    scratch.pid_in("pid");
    let out = run(on(&url).args(["status", "--json", "t"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let token = v["token"].as_u64().unwrap().to_string();
    let out = on(&url)
        .args(["release", "--force", "--token", "12345", "t"])
        .code(1)
        .out;
    assert!(text(&out.stderr).contains(&token), "{}", text(&out.stderr));
    on(&url).args(["status", "t"]).code(0);
    on(&url)
        .args(["release", "--force", "--now", "--token", &token, "t"])
        .code(0);
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(20)).code(),
        Some(76)
    );
}

#[test]
fn release_without_force_refuses() {
    let redis = Redis::start();
    let out = on(&redis.url()).args(["release", "x"]).code(64).out;
    assert!(text(&out.stderr).contains("--force"));
}

#[test]
fn status_of_an_unreachable_backend_is_69() {
    let url = format!("redis://127.0.0.1:{}", free_port());
    on(&url).args(["status", "x"]).code(69);
}

#[test]
fn status_shows_held_and_free() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let out = on(&redis.url()).args(["status", "job"]).code(1).out;
    assert_eq!(text(&out.stdout), "job: free\n");

    let mut holder = hold(Some(&redis.url()), "job", "30s", &scratch);
    scratch.pid_in("pid");
    let out = on(&redis.url()).args(["status", "job"]).code(0).out;
    let s = text(&out.stdout);
    assert!(s.starts_with("job: held by "), "{s}");
    assert!(
        s.contains(&format!(":{}", holder.id())),
        "holder label host:pid: {s}"
    );
    assert!(s.contains("token 1"), "{s}");
    assert!(s.contains("left"), "{s}");

    let out = on(&redis.url())
        .args(["status", "--json", "job"])
        .code(0)
        .out;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["name"], "job");
    assert_eq!(v["held"], true);
    assert!(
        v["holder"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", holder.id()))
    );
    assert!(v["token"].as_u64().unwrap() > 1_000_000_000_000_000);
    let left = v["ttl_left_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 30_000, "{left}");
    assert!(v["held_for_ms"].as_u64().is_some());
    assert_eq!(v["revoked"], false);
    // The secret owner value appears nowhere.
    let fields: Vec<String> = redis.cmd(&["HKEYS", "lockrun:{job}"]);
    let secret = fields[0].strip_prefix("h:").unwrap().to_string();
    assert!(secret.len() >= 32, "{fields:?}");
    assert!(!text(&out.stdout).contains(&secret) && !s.contains(&secret));

    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    let out = on(&redis.url())
        .args(["status", "--json", "job"])
        .code(1)
        .out;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], false);
    assert!(v["token"].is_null());
}

#[test]
fn status_works_on_the_local_backend() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    on(&url).args(["status", "job"]).code(1);
    let mut holder = hold(Some(&url), "job", "30s", &scratch);
    scratch.pid_in("pid");
    // status must not disturb the lock: a concurrent -n still sees it held.
    let out = on(&url).args(["status", "--json", "job"]).code(0).out;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["held"], true);
    assert!(
        v["holder"]
            .as_str()
            .unwrap()
            .ends_with(&format!(":{}", holder.id()))
    );
    assert!(v["token"].as_u64().is_some());
    assert!(v["ttl_left_ms"].is_null(), "a flock has no expiry");
    on(&url).args(["-n", "job", "true"]).code(75);
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    on(&url).args(["status", "job"]).code(1);
}

#[test]
fn verbose_quiet_and_default_output() {
    let redis = Redis::start();
    let url = redis.url();
    let out = run(on(&url).args(["x", "true"]));
    assert_eq!(text(&out.stderr), "", "silent on success, like flock");
    // A ttl that renews twice in the job, with a bound on each request
    // (ttl/6) that a loaded machine still meets.
    let out = run(on(&url).args(["-vv", "--ttl", "1800ms", "x", "sleep", "1.4"]));
    let err = text(&out.stderr);
    for step in [
        "connecting to",
        "acquired x with token",
        "lockrun: renewed in",
        "released x in",
    ] {
        assert!(err.contains(step), "-vv must show {step:?}: {err}");
    }
    assert!(
        err.lines().all(|l| l.starts_with("20")),
        "timestamped: {err}"
    );
    let out = run(on(&url).args(["-v", "--ttl", "1800ms", "x", "sleep", "1.4"]));
    assert!(
        !text(&out.stderr).contains("lockrun: renewed in"),
        "renewals only at -vv: {}",
        text(&out.stderr)
    );
    let out = run(on(&url).args(["-q", "x", "true"]));
    assert_eq!(text(&out.stderr), "");
}

/// A server that accepts connections and never answers (stopped, or
/// overloaded) is not reachable: doctor says so in one bound, and does not
/// mistake the silence for a permission problem.
#[test]
fn doctor_fails_a_server_that_accepts_and_never_answers() {
    let redis = Redis::start();
    redis.pause();
    let start = Instant::now();
    let ran = on(&redis).arg("doctor").code(69);
    let took = start.elapsed();
    redis.resume();
    let out = ran.stdout();
    assert!(took < Duration::from_secs(10), "took {took:?}:\n{out}");
    let first = out.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("fail") && first.contains("reachable") && first.contains("answer"),
        "{out}"
    );
    assert!(!out.contains("ok    reachable"), "{out}");
    assert!(
        !out.contains("allow") && !out.contains("not allowed"),
        "a silent server read as an ACL problem:\n{out}"
    );
}

/// doctor through a link that trickles every reply: each read comes in
/// time, the whole answer does not. The first slow answer ends the checks,
/// and the round trip says why, well within doctor's own bound.
#[test]
fn doctor_stops_at_the_first_answer_slower_than_its_bound() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    proxy.trickle();
    let start = Instant::now();
    let ran = on(&proxy.url()).arg("doctor").code(69);
    let took = start.elapsed();
    let out = ran.stdout();
    assert!(took < Duration::from_secs(25), "took {took:?}:\n{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("fail") && l.contains("round trip")),
        "{out}"
    );
    assert!(!out.contains("not allowed"), "{out}");
}

/// `release --force --token T` breaks that holder alone.
#[test]
fn force_release_by_token_breaks_one_holder_of_several() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut children: Vec<Child> = (0..2)
        .map(|i| {
            on(&redis)
                .args(["--ttl", "3s", "--limit", "2", "two", "-c"])
                .arg(format!(
                    "echo $LOCKRUN_TOKEN > {}; exec sleep 60",
                    scratch.path(&i.to_string()).display()
                ))
                .spawn()
        })
        .collect();
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("0")
        && scratch.exists("1")
        && !scratch.read("1").is_empty()));
    let token = scratch.read("0").trim().to_string();
    let out = on(&redis)
        .args(["release", "--force", "--token", &token, "two"])
        .succeeds();
    assert!(out.stdout().contains(&token), "{}", out.stdout());
    let started = Instant::now();
    assert_eq!(
        wait_child(&mut children[0], Duration::from_secs(20)).code(),
        Some(76)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        children[1].try_wait().unwrap().is_none(),
        "the other holder runs on"
    );
    let v = on(&redis).args(["status", "--json", "two"]).code(0).json();
    let holders = v["holders"].as_array().unwrap();
    let revoked = holders.iter().filter(|h| h["revoked"] == true).count();
    assert_eq!((holders.len(), revoked), (2, 1), "{v}");
    signal(children[1].id() as i32, libc::SIGTERM);
    wait_child(&mut children[1], Duration::from_secs(20));
}

/// doctor on a cluster names each master's state, one line each, and a
/// master that stopped answering costs one bound, not one per check.
#[test]
fn doctor_names_the_master_that_does_not_answer() {
    let cluster = Cluster::start();
    let url = cluster.url();
    on(&url).arg("doctor").output();
    // The first node of the URL: the one a client asks first.
    let stopped = &cluster.nodes[0];
    stopped.pause();
    let start = Instant::now();
    let ran = on(&url).arg("doctor").code(69);
    let took = start.elapsed();
    stopped.resume();
    let out = ran.stdout();
    assert!(took < Duration::from_secs(20), "took {took:?}:\n{out}");
    for n in &cluster.nodes {
        let at = format!("127.0.0.1:{}", n.port);
        let line = out
            .lines()
            .find(|l| l.contains("reachable") && l.contains(&at))
            .unwrap_or_else(|| panic!("no line for master {at}:\n{out}"));
        let want = if n.port == stopped.port { "fail" } else { "ok" };
        assert!(line.starts_with(want), "{line}\n{out}");
    }
}

#[test]
fn releasing_a_revoked_lease_again_says_so() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut holder = hold(Some(&redis.url()), "rev", "30s", &scratch);
    scratch.pid_in("pid");
    on(&redis.url()).args(["release", "--force", "rev"]).code(0);
    let out = on(&redis.url())
        .args(["release", "--force", "rev"])
        .code(1)
        .out;
    assert!(
        text(&out.stderr).contains("already revoked"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(30)).code(),
        Some(76)
    );
}
