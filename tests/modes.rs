//! Shared locks, `--limit N` and first come, first served, on Redis and on
//! the local engine: what the jobs saw, from their own timestamps.

use std::process::Child;
use std::time::{Duration, Instant};

use crate::support::*;

/// One job's run as it logged it: `start|end MODE SLOT TOKEN NANOS`.
#[derive(Debug, Clone)]
struct Span {
    who: String,
    slot: Option<u32>,
    token: u64,
    start: u128,
    end: u128,
}

/// The job every holder runs: log start and end with the slot, token and
/// the wall clock in ns (from one clock, so spans compare).
fn logging_job(scratch: &Scratch, who: &str, hold: &str) -> String {
    let log = scratch.path("log");
    let log = log.display();
    format!(
        "echo \"start {who} ${{LOCKRUN_SLOT:--}} $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}; \
         sleep {hold}; \
         echo \"end {who} ${{LOCKRUN_SLOT:--}} $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}"
    )
}

#[track_caller]
fn spans(scratch: &Scratch) -> Vec<Span> {
    let text = scratch.read("log");
    let mut open: Vec<(String, Option<u32>, u64, u128)> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 5, "{line}");
        let slot = f[2].parse().ok();
        let token: u64 = f[3].parse().unwrap();
        let at: u128 = f[4].parse().unwrap();
        match f[0] {
            "start" => open.push((f[1].to_string(), slot, token, at)),
            "end" => {
                let i = open
                    .iter()
                    .position(|o| o.2 == token && o.0 == f[1])
                    .expect(line);
                let (who, slot, token, start) = open.remove(i);
                out.push(Span {
                    who,
                    slot,
                    token,
                    start,
                    end: at,
                });
            }
            _ => panic!("{line}"),
        }
    }
    assert!(open.is_empty(), "jobs that never ended: {open:?}");
    out.sort_by_key(|s| s.start);
    out
}

/// The most spans running at one instant, and whether any two that overlap
/// share a slot.
fn most_at_once(spans: &[Span]) -> usize {
    spans
        .iter()
        .map(|s| {
            spans
                .iter()
                .filter(|o| o.start <= s.start && s.start < o.end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn overlap(a: &Span, b: &Span) -> bool {
    a.start < b.end && b.start < a.end
}

#[track_caller]
fn tokens_follow_grants(spans: &[Span]) {
    for a in spans {
        for b in spans {
            if a.end < b.start {
                assert!(a.token < b.token, "token went down: {a:?} then {b:?}");
            }
        }
        assert_eq!(
            spans.iter().filter(|o| o.token == a.token).count(),
            1,
            "token {} granted twice",
            a.token
        );
    }
}

#[track_caller]
fn all_succeed(children: Vec<Child>) {
    for mut c in children {
        assert_eq!(wait_child(&mut c, Duration::from_secs(60)).code(), Some(0));
    }
}

fn limit_never_exceeds_n_and_reaches_it(url: &str) {
    let scratch = Scratch::new();
    let children: Vec<Child> = (0..8)
        .map(|i| {
            on(url)
                .args(["--limit", "3", "sem", "-c"])
                .arg(logging_job(&scratch, &format!("j{i}"), "0.5"))
                .spawn()
        })
        .collect();
    all_succeed(children);
    let spans = spans(&scratch);
    assert_eq!(spans.len(), 8);
    assert_eq!(most_at_once(&spans), 3, "{spans:#?}");
    for a in &spans {
        let slot = a.slot.expect("LOCKRUN_SLOT is set with --limit");
        assert!(slot < 3, "{a:?}");
        for b in &spans {
            if a.token != b.token && overlap(a, b) {
                assert_ne!(a.slot, b.slot, "one slot, two holders: {a:?} {b:?}");
            }
        }
    }
    tokens_follow_grants(&spans);
}

#[test]
fn limit_never_exceeds_n_and_reaches_it_on_redis() {
    let redis = Redis::start();
    limit_never_exceeds_n_and_reaches_it(&redis.url());
}

#[test]
fn limit_never_exceeds_n_and_reaches_it_locally() {
    let scratch = Scratch::new();
    limit_never_exceeds_n_and_reaches_it(&scratch.file_url());
}

/// Readers run together; a writer runs alone; readers that came after a
/// waiting writer wait for it (first come, first served across modes).
fn readers_together_writer_alone(url: &str) {
    let scratch = Scratch::new();
    let mut children = Vec::new();
    for i in 0..3 {
        children.push(
            on(url)
                .args(["-s", "rw", "-c"])
                .arg(logging_job(&scratch, &format!("r{i}"), "1"))
                .spawn(),
        );
    }
    assert!(wait_until(Duration::from_secs(20), || scratch
        .read("log")
        .lines()
        .count()
        == 3));
    children.push(
        on(url)
            .args(["rw", "-c"])
            .arg(logging_job(&scratch, "w", "0.5"))
            .spawn(),
    );
    // The writer is queued before the late readers come.
    assert!(wait_until(Duration::from_secs(20), || {
        let st = on(url).args(["status", "--json", "rw"]).output().json();
        st["waiters"].as_u64().unwrap_or(0) >= 1
    }));
    for i in 0..2 {
        children.push(
            on(url)
                .args(["-s", "rw", "-c"])
                .arg(logging_job(&scratch, &format!("late{i}"), "0.5"))
                .spawn(),
        );
    }
    all_succeed(children);
    let spans = spans(&scratch);
    let writer = spans.iter().find(|s| s.who == "w").unwrap();
    let early: Vec<&Span> = spans.iter().filter(|s| s.who.starts_with('r')).collect();
    assert!(early.iter().all(|a| early.iter().all(|b| overlap(a, b))));
    for s in &spans {
        if s.who != "w" {
            assert!(
                !overlap(s, writer),
                "a writer beside a reader: {s:?} {writer:?}"
            );
        }
        if s.who.starts_with("late") {
            assert!(s.start > writer.end, "a later reader overtook the writer");
        }
    }
    let late: Vec<&Span> = spans.iter().filter(|s| s.who.starts_with("late")).collect();
    assert!(overlap(late[0], late[1]), "{late:?}");
    tokens_follow_grants(&spans);
}

#[test]
fn readers_together_writer_alone_on_redis() {
    let redis = Redis::start();
    readers_together_writer_alone(&redis.url());
}

#[test]
fn readers_together_writer_alone_locally() {
    let scratch = Scratch::new();
    readers_together_writer_alone(&scratch.file_url());
}

/// Ten waiters, each holding much longer than ttl/3, are served in the order
/// they came.
fn arrival_order(url: &str) {
    let scratch = Scratch::new();
    let order = scratch.path("order");
    let mut children = vec![
        on(url)
            .args(["--ttl", "1.2s", "fifo", "--", "sleep", "1"])
            .spawn(),
    ];
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..10 {
        children.push(
            on(url)
                .args(["-q", "--ttl", "1.2s", "fifo", "-c"])
                .arg(format!("echo {i} >> {}; sleep 0.6", order.display()))
                .spawn(),
        );
        // Queued before the next one comes.
        assert!(wait_until(Duration::from_secs(20), || {
            let st = on(url).args(["status", "--json", "fifo"]).output().json();
            st["waiters"].as_u64().unwrap_or(0) > i
                || std::fs::read_to_string(&order).is_ok_and(|o| o.lines().count() > 0)
        }));
    }
    all_succeed(children);
    let got: Vec<String> = scratch.read("order").lines().map(String::from).collect();
    let want: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    assert_eq!(got, want, "grants out of arrival order");
}

#[test]
fn waiters_are_served_in_arrival_order_on_redis() {
    let redis = Redis::start();
    arrival_order(&redis.url());
}

#[test]
fn waiters_are_served_in_arrival_order_locally() {
    let scratch = Scratch::new();
    arrival_order(&scratch.file_url());
}

/// A waiter killed while queued delays the next one by at most a third of
/// its ttl (here 2 s; a grant it could never confirm would last 6 s).
#[test]
fn a_killed_queued_waiter_delays_the_next_by_at_most_a_third_of_its_ttl() {
    let redis = Redis::start();
    let scratch = Scratch::new();
    let ended = scratch.path("ended");
    let started = scratch.path("started");
    let mut holder = on(&redis)
        .args(["--ttl", "6s", "q", "-c"])
        .arg(format!("sleep 2.5; date +%s%N > {}", ended.display()))
        .spawn();
    std::thread::sleep(Duration::from_millis(300));
    let mut doomed = on(&redis).args(["-q", "--ttl", "6s", "q", "true"]).spawn();
    std::thread::sleep(Duration::from_millis(300));
    let mut next = on(&redis)
        .args(["-q", "--ttl", "6s", "q", "-c"])
        .arg(format!("date +%s%N > {}", started.display()))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || {
        let st = on(&redis).args(["status", "--json", "q"]).output().json();
        st["waiters"] == 2
    }));
    // Killed at its place in the queue, just before the holder ends.
    std::thread::sleep(Duration::from_millis(1500));
    signal(doomed.id() as i32, libc::SIGKILL);
    let _ = doomed.wait();
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(30)).code(),
        Some(0)
    );
    assert_eq!(
        wait_child(&mut next, Duration::from_secs(30)).code(),
        Some(0)
    );
    let ns = |p: &std::path::Path| -> u128 {
        std::fs::read_to_string(p).unwrap().trim().parse().unwrap()
    };
    let delay = Duration::from_nanos((ns(&started) - ns(&ended)) as u64);
    assert!(
        delay < Duration::from_millis(3500),
        "the next waiter started {delay:?} after the holder ended"
    );
}

fn disagreeing_requests_are_refused(url: &str) {
    let scratch = Scratch::new();
    let pid = scratch.path("pid");
    let mut holder = on(url)
        .args(["--limit", "2", "d", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 60", pid.display()))
        .spawn();
    scratch.pid_in("pid");
    on(url)
        .args(["d", "true"])
        .code(64)
        .says(&["--limit 2", "exclusive"]);
    on(url)
        .args(["--limit", "3", "d", "true"])
        .code(64)
        .says(&["--limit 2", "--limit 3"]);
    on(url)
        .args(["-s", "d", "true"])
        .code(64)
        .says(&["--limit 2", "shared"]);
    // The agreeing request still gets the second place.
    on(url).args(["--limit", "2", "-n", "d", "true"]).succeeds();
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));

    let mut plain = on(url)
        .args(["d2", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 60", pid.display()))
        .spawn();
    std::fs::remove_file(&pid).unwrap();
    scratch.pid_in("pid");
    on(url)
        .args(["--limit", "2", "d2", "true"])
        .code(64)
        .says(&["plain lock", "--limit 2"]);
    signal(plain.id() as i32, libc::SIGTERM);
    wait_child(&mut plain, Duration::from_secs(20));
}

#[test]
fn disagreeing_requests_are_refused_on_redis() {
    let redis = Redis::start();
    disagreeing_requests_are_refused(&redis.url());
}

#[test]
fn disagreeing_requests_are_refused_locally() {
    let scratch = Scratch::new();
    disagreeing_requests_are_refused(&scratch.file_url());
}

/// `status` lists every holder with its slot and the waiters; `--json` the same.
fn status_lists_holders_and_waiters(url: &str) {
    let scratch = Scratch::new();
    let mut children: Vec<Child> = (0..3)
        .map(|i| {
            on(url)
                .args(["--limit", "2", "--label", &format!("job {i}"), "st", "-c"])
                .arg(format!(
                    "touch {}; exec sleep 60",
                    scratch.path(&i.to_string()).display()
                ))
                .spawn()
        })
        .collect();
    assert!(wait_until(Duration::from_secs(20), || {
        let v = on(url).args(["status", "--json", "st"]).output().json();
        v["holders"].as_array().map_or(0, Vec::len) == 2 && v["waiters"] == 1
    }));
    let v = on(url).args(["status", "--json", "st"]).code(0).json();
    let mut slots: Vec<u64> = v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            assert_eq!(h["mode"], "limit 2");
            assert!(h["label"].as_str().unwrap().contains("(job "), "{h}");
            assert!(h["token"].as_u64().is_some());
            h["slot"].as_u64().unwrap()
        })
        .collect();
    slots.sort();
    assert_eq!(slots, [0, 1]);
    let text = on(url).args(["status", "st"]).code(0).stdout();
    assert!(
        text.starts_with("st: 2 holders (limit 2); 1 waiting\n"),
        "{text}"
    );
    assert!(
        text.contains("  slot 0: held by ") && text.contains("  slot 1: held by "),
        "{text}"
    );
    for c in &children {
        signal(c.id() as i32, libc::SIGTERM);
    }
    for c in &mut children {
        wait_child(c, Duration::from_secs(20));
    }
}

#[test]
fn status_lists_holders_and_waiters_on_redis() {
    let redis = Redis::start();
    status_lists_holders_and_waiters(&redis.url());
}

#[test]
fn status_lists_holders_and_waiters_locally() {
    let scratch = Scratch::new();
    status_lists_holders_and_waiters(&scratch.file_url());
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

#[test]
fn mode_flags_are_checked_before_anything_is_contacted() {
    // Nothing listens on this port: a 64 proves nothing was contacted.
    let url = format!("redis://127.0.0.1:{}", free_port());
    on(&url)
        .args(["-s", "--limit", "2", "x", "true"])
        .code(64)
        .says(&["--limit"]);
    on(&url)
        .args(["--limit", "0", "x", "true"])
        .code(64)
        .says(&["1 to 1000"]);
    on(&url).args(["--limit", "abc", "x", "true"]).code(64);
    on(&url).args(["--limit", "1001", "x", "true"]).code(64);
    on(&url).args(["-x", "-s", "x", "true"]).code(64);
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

/// `lockrun X` from inside a job holding X would wait for itself once
/// anyone queues between them: refused with 64 in every mode, also when
/// another holder's label is the one a waiter sees first.
fn nested_requests_are_refused_in_every_mode(url: &str) {
    let scratch = Scratch::new();
    for flags in [&["-s"][..], &["--limit", "2"][..]] {
        let other = on(url).args(flags).args(["nest", "-c"]).arg(format!(
            "touch {}; exec sleep 60",
            scratch.path("other").display()
        ));
        let mut other = other.spawn();
        assert!(wait_until(Duration::from_secs(20), || scratch.exists("other")));
        let inner = format!("{BIN} --url {url} {} nest true", flags.join(" "));
        let out = on(url).args(flags).args(["nest", "-c", &inner]).code(64);
        assert!(
            out.stderr().contains("deadlock"),
            "{flags:?}: {}",
            out.stderr()
        );
        signal(other.id() as i32, libc::SIGTERM);
        wait_child(&mut other, Duration::from_secs(20));
        std::fs::remove_file(scratch.path("other")).unwrap();
    }
}

#[test]
fn nested_requests_are_refused_in_every_mode_on_redis() {
    let redis = Redis::start();
    nested_requests_are_refused_in_every_mode(&redis.url());
}

#[test]
fn nested_requests_are_refused_in_every_mode_locally() {
    let scratch = Scratch::new();
    nested_requests_are_refused_in_every_mode(&scratch.file_url());
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
    std::thread::sleep(Duration::from_millis(200));
    let mut doomed = on(&redis)
        .args(["-q", "--ttl", "3s", "k", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("a").display()
        ))
        .spawn();
    std::thread::sleep(Duration::from_millis(200));
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
