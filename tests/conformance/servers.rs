//! The engine's server at fault, on every engine whose server a test can
//! restart or stop alone: a holder rides out what it can and stops its job
//! in time when it cannot.

use std::process::{Child, Stdio};
use std::time::Duration;

use super::{Fixture, stop};
use crate::support::*;

/// A holder with `-vv` (every renewal logged to the scratch file `err`)
/// whose job runs until stopped; returns once its job runs.
fn logged_holder(url: &str, scratch: &Scratch, name: &str, ttl: &str) -> (Child, i32) {
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
