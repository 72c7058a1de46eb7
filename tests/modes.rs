//! Shared locks, `--limit N` and first come, first served, on Redis and on
//! the local engine: what the jobs saw, from their own timestamps.

use std::time::{Duration, Instant};

use crate::support::*;

/// With `--limit`, the job is told its slot; without, an outer LOCKRUN_SLOT
/// does not pass through.
#[test]
fn the_slot_reaches_the_job_and_nothing_else_does() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let out = on(&url)
        .args([
            "--limit",
            "4",
            "s",
            "--",
            "sh",
            "-c",
            "echo ${LOCKRUN_SLOT-unset}",
        ])
        .succeeds();
    assert_eq!(out.stdout(), "0\n");
    let out = on(&url)
        .env("LOCKRUN_SLOT", "7")
        .args(["p", "--", "sh", "-c", "echo ${LOCKRUN_SLOT-unset}"])
        .succeeds();
    assert_eq!(out.stdout(), "unset\n");
}

/// A request that waited for any of N slots leaves no other slot taken: its
/// helpers still waiting on the others hold nothing once they get one, and
/// nothing of lockrun's (the guard included) keeps a copy of their files.
#[test]
fn a_waiter_for_a_slot_takes_one_slot_only() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let holder = |tag: &str| {
        on(&url)
            .args(["--limit", "2", "slots", "-c"])
            .arg(format!(
                "echo $$ > {}; exec sleep 60",
                scratch.path(tag).display()
            ))
            .spawn()
    };
    let mut a = holder("a");
    let mut b = holder("b");
    scratch.pid_in("a");
    scratch.pid_in("b");
    // C waits for a slot, gets A's, and runs on.
    let mut c = holder("c");
    assert!(wait_until(Duration::from_secs(20), || {
        let v = on(&url).args(["status", "--json", "slots"]).output().json();
        v["waiters"].as_u64().unwrap_or(0) >= 1
    }));
    signal(a.id() as i32, libc::SIGTERM);
    wait_child(&mut a, Duration::from_secs(20));
    scratch.pid_in("c");
    // B's slot, once B ends, is free for D at once.
    signal(b.id() as i32, libc::SIGTERM);
    wait_child(&mut b, Duration::from_secs(20));
    on(&url)
        .args(["--limit", "2", "-n", "slots", "true"])
        .succeeds();
    signal(c.id() as i32, libc::SIGTERM);
    wait_child(&mut c, Duration::from_secs(20));
}

/// A holder killed outright (its lease runs out, no release) is followed by
/// the next waiter, also one that became the head of the queue while only
/// keeping its place.
#[test]
fn the_next_waiter_follows_a_holder_killed_outright() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let mut first = on(&redis)
        .args(["--ttl", "3s", "k", "--", "sleep", "1"])
        .spawn();
    wait_queued(&redis.url(), "k", 0);
    let mut doomed = on(&redis)
        .args(["-q", "--ttl", "3s", "k", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("a").display()
        ))
        .spawn();
    wait_queued(&redis.url(), "k", 1);
    let mut next = on(&redis)
        .args(["-q", "--ttl", "3s", "k", "-c"])
        .arg(format!("touch {}", scratch.path("b").display()))
        .spawn();
    scratch.pid_in("a");
    let killed = Instant::now();
    signal(doomed.id() as i32, libc::SIGKILL);
    let _ = doomed.wait();
    assert_eq!(
        wait_child(&mut first, Duration::from_secs(20)).code(),
        Some(0)
    );
    assert_eq!(
        wait_child(&mut next, Duration::from_secs(30)).code(),
        Some(0)
    );
    assert!(scratch.exists("b"));
    assert!(
        killed.elapsed() < Duration::from_secs(6),
        "the next waiter started {:?} after the holder was killed (ttl 3 s)",
        killed.elapsed()
    );
}
