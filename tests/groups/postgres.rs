//! Concurrency groups on PostgreSQL, beyond the conformance suite: they
//! work on tables made by an older lockrun with the grants
//! lockrun-engines(7) lists, each mark is kept in a column every lockrun's
//! tables have, a replaced waiter learns it at once (and through a
//! transaction-pooling proxy within its nap), and a preempted lease ends
//! without a --min-hold window.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// The tables as a lockrun before the concurrency groups made them, and a
/// role with the grants lockrun-engines(7) lists only: its URL.
fn old_tables(pg: &Postgres) -> String {
    pg.create_earlier_tables();
    pg.sql(&format!(
        "CREATE ROLE ci LOGIN PASSWORD 'ci-pw'; {}",
        crate::docs::documented_postgres_grants("ci")
    ));
    pg.url_as("ci", "ci-pw")
}

/// A holder whose job runs until the scratch file `done` appears (or 60 s
/// pass); returns once its job runs.
fn holder(url: &str, scratch: &Scratch, name: &str, args: &[&str]) -> Child {
    let child = on(url)
        .args(args)
        .args(["--label", "holder", name, "-c"])
        .arg(format!(
            "echo $$ > {}; i=0; while [ ! -e {} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
            scratch.path("pid").display(),
            scratch.path("done").display()
        ))
        .stderr(Stdio::piped())
        .spawn();
    scratch.pid_in("pid");
    child
}

fn waiter(url: &str, name: &str, tag: &str, args: &[&str]) -> Child {
    on(url)
        .args(args)
        .args(["--label", tag, name, "true"])
        .stderr(Stdio::piped())
        .spawn()
}

#[test]
fn the_groups_work_on_tables_made_before_them_with_the_documented_grants() {
    let pg = Postgres::start();
    let url = old_tables(&pg);
    let scratch = Scratch::new();
    let h = holder(&url, &scratch, "g", &["--ttl", "3s"]);
    // A place that asked for --supersede is an owner value with a prefix:
    // to an older lockrun, someone else's place.
    let w1 = waiter(&url, "g", "w1", &["--ttl", "90s", "--supersede"]);
    wait_queued(&url, "g", 1);
    assert_eq!(
        pg.sql("SELECT owner LIKE 'supersede:%' FROM lockrun.lockrun_waiters")
            .trim(),
        "t"
    );
    // The newer one replaces it: woken by a notification, not at its next
    // keeping of its place (ttl/9, ten seconds here).
    let joined = Instant::now();
    let w2 = waiter(&url, "g", "w2", &["--ttl", "90s", "--supersede"]);
    let (code, err) = exited(w1, Duration::from_secs(30));
    let took = joined.elapsed();
    assert_eq!(code, Some(75), "{err}");
    assert!(err.contains("replaced") && err.contains("w2"), "{err}");
    assert!(
        took < Duration::from_secs(5),
        "the replaced waiter took {took:?}"
    );
    let st = status_json(&url, "g");
    assert_eq!(st["waiters"], 1, "{st}");
    assert_eq!(st["superseding"], 1, "{st}");
    // --max-waiters counts the live places only.
    on(&url).args(["--max-waiters", "1", "g", "true"]).code(75);
    on(&url)
        .args(["--max-waiters", "2", "-w", "1s", "g", "true"])
        .code(75);
    // --preempt: the holder's renewal finds the mark and stops its job.
    let p = waiter(&url, "g", "p", &["--preempt"]);
    let (code, err) = exited(h, Duration::from_secs(30));
    assert_eq!(code, Some(76), "{err}");
    assert!(err.contains("preempted by") && err.contains("(p)"), "{err}");
    let (code, err) = exited(w2, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = exited(p, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    // Nothing is left behind: no mark, no place, no lease.
    assert!(wait_until(Duration::from_secs(10), || pg.rows() == 0));
}

#[test]
fn a_preempt_mark_shows_in_status_and_the_marked_lease_ends_without_its_window() {
    let pg = Postgres::start();
    let url = pg.url();
    let scratch = Scratch::new();
    let h = holder(&url, &scratch, "m", &["--ttl", "10s", "--min-hold", "60s"]);
    // The holder's lockrun is stopped: it renews nothing until it goes on.
    let lockrun_pid = h.id() as i32;
    signal(lockrun_pid, libc::SIGSTOP);
    on(&url)
        .args(["--preempt", "--label", "pre", "-w", "1s", "m", "true"])
        .code(75);
    let st = status_json(&url, "m");
    assert!(
        st["preempted_by"].as_str().unwrap_or("").contains("(pre)"),
        "{st}"
    );
    assert_eq!(
        st["holder"].as_str().map(|l| l.ends_with("(holder)")),
        Some(true),
        "{st}"
    );
    assert!(
        on(&url)
            .args(["status", "m"])
            .output()
            .stdout()
            .contains("preempted by")
    );
    // The mark is in the label: the owner value, which releases it, stays.
    assert_eq!(
        pg.sql(
            "SELECT owner ~ '^[0-9a-f]{32}$' AND label LIKE '%(holder) ' || chr(31) || 'preempted by %(pre)' \
             FROM lockrun.lockrun_leases WHERE name = 'm'"
        )
        .trim(),
        "t"
    );
    signal(lockrun_pid, libc::SIGCONT);
    let (code, err) = exited(h, Duration::from_secs(30));
    assert_eq!(code, Some(76), "{err}");
    assert!(
        err.contains("preempted by") && err.contains("(pre)"),
        "{err}"
    );
    // Released at once: a preempted lease leaves no --min-hold window.
    on(&url).args(["-n", "m", "true"]).succeeds();
    assert_eq!(pg.rows(), 0);
}

#[test]
fn a_preempt_ends_a_min_hold_window_at_once() {
    let pg = Postgres::start();
    let url = pg.url();
    on(&url)
        .args(["--min-hold", "60s", "win", "true"])
        .succeeds();
    on(&url).args(["-n", "win", "true"]).code(75);
    let started = Instant::now();
    on(&url)
        .args(["--preempt", "-w", "10s", "win", "true"])
        .succeeds();
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn through_pgbouncer_a_replaced_waiter_learns_it_within_its_nap() {
    let pg = Postgres::start();
    let bouncer = Bouncer::start(&pg);
    let url = bouncer.url();
    let scratch = Scratch::new();
    let h = holder(&url, &scratch, "pb", &["--ttl", "3s"]);
    let w1 = waiter(&url, "pb", "w1", &["--ttl", "3s", "--supersede"]);
    wait_queued(&url, "pb", 1);
    let joined = Instant::now();
    let w2 = waiter(&url, "pb", "w2", &["--ttl", "3s", "--supersede"]);
    let (code, err) = exited(w1, Duration::from_secs(30));
    assert_eq!(code, Some(75), "{err}");
    assert!(err.contains("replaced") && err.contains("w2"), "{err}");
    // No notification comes through transaction pooling: a nap is ttl/9.
    assert!(
        joined.elapsed() < Duration::from_secs(3),
        "{:?}",
        joined.elapsed()
    );
    std::fs::write(scratch.path("done"), "").unwrap();
    assert_eq!(exited(h, Duration::from_secs(30)).0, Some(0));
    let (code, err) = exited(w2, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(pg.rows(), 0);
}
