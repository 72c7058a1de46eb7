//! The engine's server at fault, on every engine whose server a test can
//! restart or stop alone: a holder rides out what it can and stops its job
//! in time when it cannot.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime};

use super::{Fixture, stop};
use crate::support::*;

/// A holder with `-vv` (every renewal logged to the scratch file `err`)
/// whose job runs until stopped; returns once its job runs.
pub fn logged_holder(url: &str, scratch: &Scratch, name: &str, ttl: &str) -> (Child, i32) {
    let err = std::fs::File::create(scratch.path("err")).unwrap();
    let child = on(url)
        .args(["-vv", "--ttl", ttl, name, "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stderr(Stdio::from(err))
        .spawn();
    (child, scratch.pid_in("pid"))
}

/// The token of `name`'s holder, as `status` shows it.
fn token_of(url: &str, name: &str) -> u64 {
    let v = status_json(url, name);
    v["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} is not held: {v}"))
}

/// The token a job of its own is given.
fn run_token(url: &str, name: &str) -> u64 {
    let out = on(url)
        .args([name, "-c", "echo $LOCKRUN_TOKEN"])
        .succeeds()
        .stdout();
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no token: {out:?}"))
}

/// A server restarted while a job holds a 10 s lease (about 3 s of outage
/// to ride out once a renewal is due): the job runs on, the lease stays
/// the holder's and still excludes, renewals go on after the restart, and
/// the next token is above every one before.
pub fn a_server_restart_mid_job_is_ridden_out(e: &dyn Fixture) {
    let Some(mut server) = e.own_server() else {
        return;
    };
    let url = server.url();
    let scratch = Scratch::new();
    let before = run_token(&url, "rs");
    let (mut h, job) = logged_holder(&url, &scratch, "rs", "10s");
    let token = token_of(&url, "rs");
    assert!(token > before, "token {token} after {before}");
    server.restart();
    let err = || scratch.read("err");
    assert!(
        alive(job),
        "the job was stopped by a short restart: {}",
        err()
    );
    assert_eq!(token_of(&url, "rs"), token, "the lease changed hands");
    on(&url).args(["-n", "rs", "true"]).code(75);
    let renewed = err().matches("renewed in ").count();
    assert!(
        wait_until(Duration::from_secs(30), || err()
            .matches("renewed in ")
            .count()
            > renewed),
        "no renewal after the restart: {}",
        err()
    );
    assert!(alive(job), "the job was stopped: {}", err());
    assert_eq!(stop(&mut h), Some(143), "{}", err());
    let after = run_token(&url, "rs");
    assert!(
        after > token,
        "token {after} after a restart, {token} before"
    );
}

/// The wall-clock time of the last `renewed in X` line of a `-vv` log,
/// minus X: no later than the last renewal was sent.
fn last_renewal(log: &str) -> Option<SystemTime> {
    let line = log.lines().rev().find(|l| l.contains("renewed in "))?;
    let at = humantime::parse_rfc3339(line.split(' ').next()?).ok()?;
    let took = line.rsplit("renewed in ").next()?.trim();
    let took = if let Some(ms) = took.strip_suffix("ms") {
        Duration::from_secs_f64(ms.parse::<f64>().ok()? / 1000.0)
    } else if let Some(us) = took.strip_suffix("µs") {
        Duration::from_secs_f64(us.parse::<f64>().ok()? / 1e6)
    } else {
        Duration::from_secs_f64(took.strip_suffix('s')?.parse().ok()?)
    };
    Some(at - took)
}

/// A server stopped (SIGSTOP: connections kept, nothing answered) while a
/// job holds a 3 s lease: the job is dead before the lease could lapse on
/// the server (the last renewal sent plus the ttl; lockrun aims 150 ms
/// before), lockrun exits 76 with one line that says why, not as a
/// warning, and the name comes free once the server is back.
pub fn a_stopped_server_stops_the_job_before_its_lease_could_lapse(e: &dyn Fixture) {
    let Some(server) = e.own_server() else {
        return;
    };
    let url = server.url();
    let scratch = Scratch::new();
    let (mut h, job) = logged_holder(&url, &scratch, "stall", "3s");
    // Two renewals in: the lease runs on the renewal schedule.
    let err = || scratch.read("err");
    assert!(
        wait_until(Duration::from_secs(20), || err()
            .matches("renewed in ")
            .count()
            >= 2),
        "no renewals: {}",
        err()
    );
    server.pause();
    let paused = Instant::now();
    let expires = last_renewal(&err()).expect("a renewal line") + Duration::from_secs(3);
    let dead = wait_until(Duration::from_secs(10), || !alive(job));
    let seen = SystemTime::now();
    let took = paused.elapsed();
    let code = wait_child(&mut h, Duration::from_secs(20)).code();
    server.resume();
    assert!(dead, "the job still ran 10 s into the stop: {}", err());
    // Seen up to one 10 ms poll late.
    let late = seen.duration_since(expires).unwrap_or_default();
    assert!(
        late <= Duration::from_millis(50),
        "the job outlived its lease by {late:?}: {}",
        err()
    );
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the stop"
    );
    assert_eq!(code, Some(76), "{}", err());
    let log = err();
    let line = log
        .lines()
        .find(|l| l.contains("lease on stall lost"))
        .unwrap_or_else(|| panic!("no line says the lease was lost: {log}"));
    // The last attempt may have been a request on a live connection or
    // a new connection (then named first): either way it says the server
    // did not answer in time, and for how long it was given.
    let last = line.split_once("(last attempt: ").map(|(_, a)| a);
    assert!(
        last.is_some_and(|a| a.contains("no answer within")) && !line.contains("warning"),
        "the line does not say why the lease was lost: {line}"
    );
    on(&url).args(["-w", "20", "stall", "true"]).succeeds();
}
