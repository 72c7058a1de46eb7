//! Redis behind Sentinel (lockrun-engines(7) "REDIS SENTINEL and REDIS CLUSTER"): failovers and a
//! master's death while a job holds, tokens across them, and the errors a
//! wrong address gives. The behaviour every engine shares runs in the
//! conformance suite.

use std::time::Duration;

use crate::conformance::{logging_job, spans};
use crate::support::*;

/// Wait until the job of `who` has logged its start.
fn wait_started(scratch: &Scratch, who: &str) {
    let started = wait_until(Duration::from_secs(30), || {
        scratch.exists("log") && scratch.read("log").contains(&format!("start {who} "))
    });
    assert!(started, "{who} never started");
}

/// Like `logging_job`, but a job that lockrun stops also logs its end, at
/// the SIGTERM that stops it (with bash's own clock: a `date` started then
/// would be stopped too).
fn stoppable_job(scratch: &Scratch, who: &str, tenths: u32) -> String {
    let log = scratch.path("log");
    let script = scratch.path(&format!("{who}.sh"));
    std::fs::write(
        &script,
        format!(
            "stamp() {{ echo \"$1 {who} - $LOCKRUN_TOKEN ${{EPOCHREALTIME/./}}000\" >> {log}; }}\n\
             stamp start\n\
             trap 'stamp end; exit 0' TERM\n\
             for ((i = 0; i < {tenths}; i++)); do sleep 0.1; done\n\
             stamp end\n",
            log = log.display()
        ),
    )
    .unwrap();
    format!("exec bash {}", script.display())
}

/// Wait until the holder of `name` has renewed its lease on the master
/// (its expiry moved later).
fn wait_renewed(set: &Sentinels, name: &str) {
    let key = format!("lockrun:{{{name}}}");
    let pexpiretime = || -> i64 { set.master().cmd(&["PEXPIRETIME", &key]) };
    let first = pexpiretime();
    assert!(first > 0, "no lease on the master: {first}");
    let renewed = wait_until(Duration::from_secs(20), || pexpiretime() > first + 200);
    assert!(renewed, "the holder never renewed");
}

/// A graceful failover while a job holds: its renewals follow the master,
/// so the lease lives on there and a waiter that comes after the failover
/// waits for the job's end. (Renewals that stayed with the demoted master
/// would let the lease lapse on the new one and the waiter in beside the job.)
#[test]
fn a_failover_keeps_the_lease_on_the_new_master() {
    let set = Sentinels::start();
    let url = set.url();
    let scratch = Scratch::new();
    let mut holder = Reap(
        on(&url)
            .args(["--ttl", "3s", "fo", "-c", &logging_job(&scratch, "h", "9")])
            .stderr(std::process::Stdio::piped())
            .spawn(),
    );
    wait_started(&scratch, "h");
    // The holder's renewer must have its connection to the old master.
    wait_renewed(&set, "fo");
    set.failover();
    on(&url)
        .args([
            "--ttl",
            "3s",
            "-w",
            "40",
            "fo",
            "-c",
            &logging_job(&scratch, "w", "0"),
        ])
        .code(0);
    let st = wait_child(&mut holder.0, Duration::from_secs(40));
    let mut said = String::new();
    std::io::Read::read_to_string(&mut holder.0.stderr.take().unwrap(), &mut said).unwrap();
    assert_eq!(st.code(), Some(0), "the holder lost its lease: {said}");
    // Released where the lease lived: the waiter did not wait for it to lapse.
    assert!(!said.contains("no longer ours"), "{said}");
    let s = spans(&scratch);
    assert_eq!(s.len(), 2, "{s:?}");
    let (h, w) = (&s[0], &s[1]);
    assert!(w.start >= h.end, "the waiter ran beside the holder: {s:?}");
    assert!(
        w.token > h.token,
        "tokens must grow across a failover: {s:?}"
    );
}

/// The master killed outright while a job holds: the job keeps its lease
/// on the promoted replica or is stopped (76) before its lease could lapse
/// there, and a waiter never runs beside it.
#[test]
fn a_dead_master_never_lets_a_waiter_in_beside_the_job() {
    let mut set = Sentinels::start();
    let url = set.url();
    let scratch = Scratch::new();
    let mut holder = Reap(
        on(&url)
            .args([
                "--ttl",
                "3s",
                "km",
                "-c",
                &stoppable_job(&scratch, "h", 120),
            ])
            .spawn(),
    );
    wait_started(&scratch, "h");
    let before = set.master_port();
    // A waiter rides out an outage for max(ttl, 5 s): longer than the
    // sentinels take to promote the replica.
    let waiter = on(&url)
        .args([
            "--ttl",
            "10s",
            "-w",
            "60",
            "km",
            "-c",
            &logging_job(&scratch, "w", "0"),
        ])
        .spawn();
    let mut waiter = Reap(waiter);
    let at = set.nodes.iter().position(|n| n.port == before).unwrap();
    set.nodes[at].kill();
    set.wait_new_master(before);
    let st = wait_child(&mut holder.0, Duration::from_secs(60));
    assert!(matches!(st.code(), Some(0 | 76)), "holder: {st:?}");
    let ws = wait_child(&mut waiter.0, Duration::from_secs(60));
    assert_eq!(ws.code(), Some(0), "waiter: {ws:?}");
    let s = spans(&scratch);
    let h = s.iter().find(|x| x.who == "h").expect("h ran");
    let w = s.iter().find(|x| x.who == "w").expect("w ran");
    assert!(w.start >= h.end, "the waiter ran beside the holder: {s:?}");
    assert!(
        w.token > h.token,
        "tokens must grow across a failover: {s:?}"
    );
}

/// Tokens keep growing across failovers back and forth.
#[test]
fn tokens_grow_across_failovers() {
    let set = Sentinels::start();
    let url = set.url();
    let token = || -> u64 {
        on(&url)
            .args(["tok", "-c", "echo $LOCKRUN_TOKEN"])
            .code(0)
            .stdout()
            .trim()
            .parse()
            .unwrap()
    };
    let mut last = token();
    for _ in 0..2 {
        set.wait_synced();
        set.failover();
        for _ in 0..3 {
            let t = token();
            assert!(t > last, "token {t} after {last}");
            last = t;
        }
    }
}

/// A master name no sentinel knows, and sentinels that are not there: one
/// line and 69, no job started.
#[test]
fn a_wrong_master_name_or_no_sentinel_is_69() {
    let set = Sentinels::start();
    let scratch = Scratch::new();
    let marker = scratch.path("ran");
    let job = format!("touch {}", marker.display());
    let hosts: Vec<String> = set
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let wrong = format!("redis+sentinel://{}/no-such-master", hosts.join(","));
    let ran = on(&wrong).args(["n", "-c", &job]).code(69);
    assert!(
        ran.stderr()
            .contains("no sentinel knows a master named \"no-such-master\""),
        "{}",
        ran.stderr()
    );
    assert_eq!(ran.stderr().trim().lines().count(), 1, "{}", ran.stderr());
    let nowhere = format!("redis+sentinel://127.0.0.1:{}/{MASTER}", free_port());
    on(&nowhere).args(["n", "-c", &job]).code(69);
    assert!(!marker.exists(), "a job ran without a lease");
}

/// `-v` says which node the sentinels named master.
#[test]
fn verbose_names_the_master() {
    let set = Sentinels::start();
    let ran = on(&set.url()).args(["-v", "vm", "true"]).code(0);
    let expected = format!("master of {MASTER} is 127.0.0.1:{}", set.master_port());
    assert!(ran.stderr().contains(&expected), "{}", ran.stderr());
}

/// `--replicas 1`: with no replica the job never starts (69 once the
/// retries are spent, nothing left behind); with one it runs.
#[test]
fn replicas_must_acknowledge_a_grant() {
    let alone = Redis::start();
    let scratch = Scratch::new();
    let marker = scratch.path("ran");
    let job = format!("touch {}", marker.display());
    let ran = on(&alone)
        .args(["--replicas", "1", "--ttl", "1s", "r", "-c", &job])
        .code(69);
    assert!(
        ran.stderr()
            .contains("only 0 of 1 replicas acknowledged the grant"),
        "{}",
        ran.stderr()
    );
    assert!(!marker.exists(), "the job ran without a replica");
    let mut conn = alone.conn();
    assert!(
        alone.keys_without_expiry(&mut conn, "lockrun:*").is_empty(),
        "{:?}",
        alone.keys()
    );
    let _: () = alone.cmd(&["DEL", "lockrun:{r}:fence"]);
    assert!(
        alone.keys().iter().all(|k| !k.starts_with("lockrun:{r}")),
        "{:?}",
        alone.keys()
    );

    let set = Sentinels::start();
    on(&set.url())
        .args(["--replicas", "1", "r", "-c", &job])
        .code(0);
    assert!(marker.exists());
}

/// `--replicas` on an engine without replicas is refused, unless it only
/// came from the environment (meant for another engine).
#[test]
fn replicas_on_an_engine_without_them() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    on(&url)
        .args(["--replicas", "1", "x", "true"])
        .code(64)
        .says(&["--replicas only applies"]);
    on(&url)
        .env("LOCKRUN_REPLICAS", "1")
        .args(["x", "true"])
        .code(0);
}

/// A sentinel that names another server master (one cut off from the
/// others, still naming the old master) must not decide alone: lockrun
/// follows what a majority of the sentinels say, whichever it asks first.
/// Trusting the first answer, two lockruns listing the sentinels in two
/// orders would both hold the name, on two servers.
#[test]
fn a_stray_sentinel_cannot_send_a_holder_to_another_master() {
    let set = Sentinels::start();
    let stray = StraySentinel::start();
    let real: Vec<String> = set
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let stray_first = format!(
        "redis+sentinel://127.0.0.1:{},{}/{MASTER}",
        stray.port,
        real.join(",")
    );
    let stray_last = format!(
        "redis+sentinel://{},127.0.0.1:{}/{MASTER}",
        real.join(","),
        stray.port
    );
    let scratch = Scratch::new();
    let mut holder = Reap(
        on(&stray_first)
            .args(["--ttl", "3s", "stray", "-c"])
            .arg(format!("touch {}; sleep 3", scratch.path("held").display()))
            .spawn(),
    );
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("held")));
    on(&stray_last).args(["-n", "stray", "true"]).code(75);
    assert!(
        stray.server.keys().is_empty(),
        "a lease was taken on the stray sentinel's server: {:?}",
        stray.server.keys()
    );
    wait_child(&mut holder.0, Duration::from_secs(20));
}

/// A sentinel that accepts connections and never answers (a host gone
/// silent) holds nothing up: the others are asked at the same time, and a
/// job holds and renews as usual.
#[test]
fn a_silent_sentinel_holds_up_nothing() {
    let set = Sentinels::start();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let real: Vec<String> = set
        .ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    let url = format!(
        "redis+sentinel://127.0.0.1:{silent_port},{}/{MASTER}",
        real.join(",")
    );
    // Three renewals at least, each of which asks the sentinels.
    on(&url)
        .args(["--ttl", "3s", "silent", "-c", "sleep 4"])
        .code(0);
    drop(silent);
}

/// Two of three sentinels stopped: no majority can name the master, and
/// the message says so, with how many answered of how many (not a stalled
/// connect).
#[test]
fn a_sentinel_majority_gone_silent_is_named() {
    let set = Sentinels::start();
    set.pause_sentinel(0);
    set.pause_sentinel(1);
    let start = std::time::Instant::now();
    let ran = on(&set.url())
        .args(["--ttl", "3s", "nomaj", "-c", "true"])
        .code(69);
    let took = start.elapsed();
    set.resume_sentinel(0);
    set.resume_sentinel(1);
    let err = ran.stderr();
    assert!(took < Duration::from_secs(60), "took {took:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("1 of the 3 sentinels") && err.contains("majority"),
        "{err}"
    );
    assert!(!err.contains("stalled"), "{err}");
}
