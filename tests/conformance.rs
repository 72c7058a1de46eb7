//! The behaviour every engine promises (lockrun-engines(7)), tested once and
//! run on each engine the machine has: one line per engine at the bottom.
//! What an engine cannot do (say, `release --force` on the local engine) is
//! checked as its one-line refusal. The engines and what each must provide
//! are in `fixtures`; users and passwords in `passwords`; the server at
//! fault in `servers`. A behaviour of several engines is written here once,
//! not in their files.

use std::process::Child;
use std::time::{Duration, Instant};

use crate::support::*;

mod fixtures;
mod passwords;
mod servers;
pub use fixtures::*;
pub use passwords::*;
pub use servers::*;

/// One job's run as it logged it: `start|end WHO SLOT TOKEN NANOS`.
#[derive(Debug, Clone)]
pub struct Span {
    pub who: String,
    pub slot: Option<u32>,
    pub token: u64,
    pub start: u128,
    pub end: u128,
}

/// The job every holder runs: log start and end with the slot, token and
/// the wall clock in ns (from one clock, so spans compare).
pub fn logging_job(scratch: &Scratch, who: &str, hold: &str) -> String {
    let log = scratch.path("log");
    let log = log.display();
    format!(
        "echo \"start {who} ${{LOCKRUN_SLOT:--}} $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}; \
         sleep {hold}; \
         echo \"end {who} ${{LOCKRUN_SLOT:--}} $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}"
    )
}

#[track_caller]
pub fn spans(scratch: &Scratch) -> Vec<Span> {
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

/// The most spans running at one instant.
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

/// Tokens follow grant order, and none is granted twice.
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

/// `status --json NAME` as parsed JSON.
pub fn status(e: &dyn Fixture, name: &str) -> serde_json::Value {
    status_json(&e.url(), name)
}

pub fn waiters(e: &dyn Fixture, name: &str) -> u64 {
    status(e, name)["waiters"].as_u64().unwrap_or(0)
}

/// Start a holder whose job runs until stopped; returns once it runs.
fn holder(e: &dyn Fixture, scratch: &Scratch, tag: &str, args: &[&str]) -> (Child, i32) {
    let child = on(&e.url())
        .args(args)
        .arg("-c")
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path(tag).display()
        ))
        .spawn();
    let pid = scratch.pid_in(tag);
    (child, pid)
}

pub fn stop(child: &mut Child) -> Option<i32> {
    signal(child.id() as i32, libc::SIGTERM);
    wait_child(child, Duration::from_secs(30)).code()
}

/// The job's exit code, its death by a signal and an exec failure come back
/// as a shell would report them, and the name is free after each.
pub fn runs_and_passes_exit_codes(e: &dyn Fixture) {
    let url = e.url();
    on(&url).args(["c", "true"]).code(0);
    on(&url).args(["c", "-c", "exit 3"]).code(3);
    on(&url).args(["c", "-c", "exit 255"]).code(255);
    on(&url).args(["c", "-c", "kill -TERM $$"]).code(143);
    on(&url).args(["c", "no-such-command-here"]).code(127);
    let out = on(&url)
        .args(["c", "--", "sh", "-c", "echo $LOCKRUN_NAME $LOCKRUN_TTL_MS"])
        .succeeds();
    assert_eq!(out.stdout(), "c 30000\n");
    on(&url).args(["status", "c"]).code(1);
}

/// Jobs under one name never overlap, and every grant's token is higher
/// than the one before.
pub fn excludes_and_tokens_grow(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let children: Vec<Child> = (0..6)
        .map(|i| {
            on(&e.url())
                .args(["x", "-c"])
                .arg(logging_job(&scratch, &format!("j{i}"), "0.1"))
                .spawn()
        })
        .collect();
    all_succeed(children);
    let spans = spans(&scratch);
    assert_eq!(spans.len(), 6);
    assert_eq!(most_at_once(&spans), 1, "two holders at once: {spans:#?}");
    tokens_follow_grants(&spans);
    // -n gives up at once while the name is held; silently, with 75.
    let (mut h, _) = holder(e, &scratch, "h", &["x"]);
    let out = on(&e.url()).args(["-n", "x", "true"]).code(75);
    assert_eq!(out.stderr(), "");
    on(&e.url()).args(["-n", "-E", "0", "x", "true"]).code(0);
    stop(&mut h);
}

/// Five waiters, each queued before the next comes, are served in the order
/// they came.
pub fn first_come_first_served(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let order = scratch.path("order");
    let (mut first, _) = holder(e, &scratch, "h", &["--ttl", "2s", "fifo"]);
    let mut children = Vec::new();
    for i in 0..5 {
        children.push(
            on(&e.url())
                .args(["-q", "--ttl", "2s", "fifo", "-c"])
                .arg(format!("echo {i} >> {}; sleep 0.3", order.display()))
                .spawn(),
        );
        let queued = wait_until(Duration::from_secs(20), || waiters(e, "fifo") > i);
        assert!(queued, "waiter {i} never showed in status");
    }
    stop(&mut first);
    all_succeed(children);
    let got: Vec<String> = scratch.read("order").lines().map(String::from).collect();
    let want: Vec<String> = (0..5).map(|i| i.to_string()).collect();
    assert_eq!(got, want, "grants out of arrival order");
}

/// Readers run together; a writer runs alone; readers that came after a
/// waiting writer wait for it (first come, first served across modes).
pub fn readers_together_writer_alone(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let mut children = Vec::new();
    for i in 0..3 {
        children.push(
            on(&url)
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
        on(&url)
            .args(["rw", "-c"])
            .arg(logging_job(&scratch, "w", "0.5"))
            .spawn(),
    );
    // The writer is queued before the late readers come.
    assert!(wait_until(Duration::from_secs(20), || waiters(e, "rw") >= 1));
    for i in 0..2 {
        children.push(
            on(&url)
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

/// `--limit 3`: never more than three at once, three reached, slots unique.
pub fn limit_never_exceeds_n_and_reaches_it(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let children: Vec<Child> = (0..8)
        .map(|i| {
            on(&e.url())
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

/// A request that disagrees with the mode in force is refused with one line.
pub fn disagreeing_requests_are_refused(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let (mut h, _) = holder(e, &scratch, "a", &["--limit", "2", "d"]);
    on(&url)
        .args(["d", "true"])
        .code(64)
        .says(&["--limit 2", "exclusive"]);
    on(&url)
        .args(["--limit", "3", "d", "true"])
        .code(64)
        .says(&["--limit 2", "--limit 3"]);
    on(&url)
        .args(["-s", "d", "true"])
        .code(64)
        .says(&["--limit 2", "shared"]);
    // The agreeing request still gets the second place.
    on(&url)
        .args(["--limit", "2", "-n", "d", "true"])
        .succeeds();
    stop(&mut h);
    let (mut plain, _) = holder(e, &scratch, "b", &["d2"]);
    on(&url)
        .args(["--limit", "2", "d2", "true"])
        .code(64)
        .says(&["plain lock", "--limit 2"]);
    stop(&mut plain);
}

/// `status` lists every holder with its slot and the waiters; `--json` the
/// same; a free name is 1, a held one 0.
pub fn status_lists_holders_and_waiters(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    on(&url).args(["status", "st"]).code(1);
    let mut children: Vec<Child> = (0..3)
        .map(|i| {
            on(&url)
                .args(["--limit", "2", "--label", &format!("job {i}"), "st", "-c"])
                .arg(format!(
                    "touch {}; exec sleep 60",
                    scratch.path(&i.to_string()).display()
                ))
                .spawn()
        })
        .collect();
    assert!(wait_until(Duration::from_secs(20), || {
        let v = status(e, "st");
        v["holders"].as_array().map_or(0, Vec::len) == 2 && v["waiters"] == 1
    }));
    let v = on(&url).args(["status", "--json", "st"]).code(0).json();
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
    let text = on(&url).args(["status", "st"]).code(0).stdout();
    assert!(
        text.starts_with("st: 2 holders (limit 2); 1 waiting\n"),
        "{text}"
    );
    assert!(
        text.contains("  slot 0: held by ") && text.contains("  slot 1: held by "),
        "{text}"
    );
    for c in &mut children {
        stop(c);
    }
}

/// `release --force` revokes (the holder's job is stopped, 76), `--token`
/// acts only on that grant, `--now` lets a waiter in at once; an engine
/// that cannot break a lease says so in one line, with 64.
pub fn release_force_token_and_now(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let (mut h, job) = holder(e, &scratch, "a", &["--ttl", "3s", "brk"]);
    if !e.breaks() {
        on(&url)
            .args(["release", "--force", "brk"])
            .code(64)
            .says(&["not available"]);
        assert!(alive(job));
        stop(&mut h);
        return;
    }
    let token = status(e, "brk")["token"].as_u64().unwrap();
    on(&url)
        .args([
            "release",
            "--force",
            "--token",
            &(token + 1).to_string(),
            "brk",
        ])
        .code(1);
    assert!(alive(job), "a token mismatch broke the lease");
    on(&url)
        .args(["release", "--force", "--token", &token.to_string(), "brk"])
        .code(0);
    assert_eq!(wait_child(&mut h, Duration::from_secs(20)).code(), Some(76));
    assert!(!alive(job));
    on(&url).args(["release", "--force", "brk"]).code(1);
    // --now: a waiter gets in without waiting for the old lease to end.
    let (mut h, _) = holder(e, &scratch, "b", &["--ttl", "30s", "now"]);
    let mut waiter = on(&url)
        .args(["-q", "now", "-c"])
        .arg(format!("touch {}", scratch.path("ran").display()))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || waiters(e, "now") == 1));
    let since = Instant::now();
    on(&url)
        .args(["release", "--force", "--now", "now"])
        .code(0);
    // Woken: well before a waiter would look again by itself.
    assert!(
        wait_until(Duration::from_secs(3), || scratch.exists("ran")),
        "the waiter did not start within 3 s of release --force --now"
    );
    let took = since.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the waiter started after {took:?}"
    );
    assert_eq!(
        wait_child(&mut waiter, Duration::from_secs(20)).code(),
        Some(0)
    );
    // The old holder finds out at its next renewal.
    assert_eq!(wait_child(&mut h, Duration::from_secs(30)).code(), Some(76));
}

/// A lease taken away from its holder stops the job: 76, and the job is
/// dead when lockrun exits.
pub fn a_lost_lease_stops_the_job(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let (mut h, job) = holder(e, &scratch, "a", &["--ttl", "1.5s", "lost"]);
    e.take_away("lost");
    assert_eq!(wait_child(&mut h, Duration::from_secs(20)).code(), Some(76));
    assert!(!alive(job), "the job outlived its lost lease");
}

/// lockrun stopped (SIGSTOP, a debugger) while its job runs: its guard stops
/// every process of the job before the lease can lapse, so the next holder
/// never runs beside it, and lockrun, once continued, exits 76 and says why.
/// A flock never lapses: there the job runs on and the name stays held.
pub fn a_stopped_lockrun_never_lets_its_job_outlive_the_lease(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let d = scratch.dir.path().display();
    let ttl = Duration::from_secs(3);
    // A job of two processes, one in a session of its own that ignores SIGTERM.
    let mut lr = on(&url)
        .args(["--ttl", "3s", "paused", "-c"])
        .arg(format!(
            "setsid sh -c 'trap \"\" TERM; echo $$ > {d}/bg; exec sleep 120' & echo $$ > {d}/pid; wait"
        ))
        .stderr(std::process::Stdio::piped())
        .spawn();
    let pids = [scratch.pid_in("pid"), scratch.pid_in("bg")];
    let gone = |p: i32| matches!(state_of(p), None | Some('Z') | Some('X'));
    signal(lr.id() as i32, libc::SIGSTOP);
    let stopped = Instant::now();
    if !e.lapses() {
        // Nothing renews a flock: a whole ttl later the job still runs, and
        // the name is still held.
        std::thread::sleep(ttl + Duration::from_millis(500));
        assert!(pids.iter().all(|&p| !gone(p)), "the job was stopped");
        on(&url).args(["-n", "paused", "true"]).code(75);
        signal(lr.id() as i32, libc::SIGCONT);
        assert_eq!(stop(&mut lr), Some(143));
        return;
    }
    // The next request waits, then looks at the old job from inside its own.
    let next = on(&url)
        .args(["--ttl", "3s", "-w", "60", "paused", "-c"])
        .arg(format!(
            "for p in {} {}; do cat /proc/$p/stat 2>/dev/null; done > {d}/seen; echo checked >> {d}/seen",
            pids[0], pids[1]
        ))
        .stderr(std::process::Stdio::piped())
        .spawn();
    let died = wait_until(Duration::from_secs(60), || pids.iter().all(|&p| gone(p)));
    let took = stopped.elapsed();
    let (code, next_err) = exited(next, Duration::from_secs(60));
    let out = scratch.read("seen");
    signal(lr.id() as i32, libc::SIGCONT);
    let status = wait_child(&mut lr, Duration::from_secs(30));
    let mut err = String::new();
    if let Some(mut s) = lr.stderr.take() {
        use std::io::Read;
        let _ = s.read_to_string(&mut err);
    }
    assert!(
        died,
        "the stopped lockrun's job still ran {took:?} after the stop"
    );
    assert!(
        took < ttl,
        "the job of a lockrun stopped {took:?} ago outlived its ttl of {ttl:?}"
    );
    assert_eq!(code, Some(0), "the next request: {next_err}");
    assert!(out.contains("checked"), "the next job did not run: {out}");
    for line in out.lines().filter(|l| *l != "checked") {
        let state = line.rsplit(')').next().unwrap_or("").trim_start();
        assert!(
            state.starts_with('Z') || state.starts_with('X'),
            "the next holder ran beside a process of the stopped holder's job: {line}"
        );
    }
    assert_eq!(
        status.code(),
        Some(76),
        "the stopped holder, continued: {err}"
    );
    assert!(
        err.contains("lease on paused lost") && err.contains("guard") && !err.contains("warning"),
        "the line says why the lease was lost: {err}"
    );
}

/// `kill -9` of a holder's lockrun: the next holder starts only once every
/// process of the old job, one in a session of its own included, is dead.
pub fn kill_9_frees_the_name_only_after_the_job(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let d = scratch.dir.path().display();
    let mut lr = on(&url)
        .args(["--ttl", "2s", "k9", "-c"])
        .arg(format!(
            "setsid sh -c 'trap \"\" TERM; echo $$ > {d}/bg; exec sleep 60' & echo $$ > {d}/pid; wait"
        ))
        .spawn();
    let pids = [scratch.pid_in("pid"), scratch.pid_in("bg")];
    signal(lr.id() as i32, libc::SIGKILL);
    let _ = lr.wait();
    let out = on(&url)
        .args(["-w", "30", "k9", "-c"])
        .arg(format!(
            "for p in {} {}; do cat /proc/$p/stat 2>/dev/null; done; echo checked",
            pids[0], pids[1]
        ))
        .succeeds();
    let seen = out.stdout();
    for line in seen.lines().filter(|l| *l != "checked") {
        let state = line.rsplit(')').next().unwrap_or("").trim_start();
        assert!(
            state.starts_with('Z') || state.starts_with('X'),
            "the next holder ran beside a process of the old job: {line}"
        );
    }
    assert!(pids.iter().all(|&p| !alive(p)));
}

/// Bad input is refused with 64 and one line before anything is contacted:
/// nothing is stored, no job runs.
pub fn bad_input_is_refused_before_anything_happens(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let job = format!("touch {}", ran.display());
    for args in [
        &["--ttl", "1ms", "bad"][..],
        &["--ttl", "soon", "bad"],
        &["-n", "-w", "1", "bad"],
        &["-E", "76", "bad"],
        &["--limit", "0", "bad"],
        &["-s", "--limit", "2", "bad"],
        &[""],
        &["bad\u{7}name"],
        &["--min-hold", "0", "bad"],
        &["--min-hold", "-1s", "bad"],
        &["--min-hold", "soon", "bad"],
        &["--min-hold", "99999999h", "bad"],
    ] {
        on(&e.url())
            .args(args)
            .arg("-c")
            .arg(&job)
            .code(64)
            .says(&[]);
    }
    assert!(!ran.exists(), "a job ran on bad input");
    assert!(e.untouched(), "bad input left state behind");
}

/// An engine that cannot be reached: 69 with one line, no job.
pub fn unreachable_is_69(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    on(&e.unreachable())
        .args(["-w", "1", "away", "-c"])
        .arg(format!("touch {}", ran.display()))
        .code(69)
        .says(&[]);
    assert!(!ran.exists());
    on(&e.unreachable()).args(["status", "away"]).code(69);
}

/// Pairs of (prefix, name) whose keys come close on some engine: the
/// first pair's prefix and name, then the other's.
const CLOSE_PAIRS: [(&str, &str, &str, &str); 8] = [
    // `lockrun:foo/q/` + `bar` runs through the range of `lockrun:` + `foo`.
    ("lockrun:foo/q/", "bar", "lockrun:", "foo"),
    ("lockrun:", "foo", "lockrun:foo/q/", "bar"),
    // Written one after the other, the same text.
    ("lockrun:a", "b", "lockrun:", "ab"),
    ("lockrun:", "ab", "lockrun:a", "b"),
    ("team:", "x:y", "team:x:", "y"),
    ("a/", "b", "a/b/", "q"),
    ("a/b/", "q", "a/", "b"),
    ("team:", "job", "lockrun:", "job"),
];

/// A holder under one (prefix, name) is never seen as a holder of another,
/// never keeps another from running and is never broken through another;
/// a prefix the engine cannot keep apart is refused with 64 before
/// anything is contacted or written.
pub fn prefixes_keep_names_apart(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let ran = scratch.path("ran");
    let job = format!("touch {}", ran.display());
    let mut prefixes: Vec<&str> = CLOSE_PAIRS.iter().flat_map(|p| [p.0, p.2]).collect();
    prefixes.sort();
    prefixes.dedup();
    // Where nothing answers, a prefix the engine takes is 69 and one it
    // refuses is 64: the refusal comes before any contact.
    let refused: Vec<&str> = prefixes
        .iter()
        .copied()
        .filter(|p| {
            let out = on(&e.unreachable())
                .args(["--prefix", p, "status", "x"])
                .output();
            match out.out.status.code() {
                Some(64) => true,
                Some(69) => false,
                other => panic!(
                    "--prefix {p:?} where nothing answers: {other:?}: {}",
                    out.stderr()
                ),
            }
        })
        .collect();
    for p in &refused {
        for args in [
            &["x", "-c", &job][..],
            &["status", "x"],
            &["status"],
            &["release", "--force", "x"],
        ] {
            on(&e.url())
                .args(["--prefix", p])
                .args(args)
                .code(64)
                .says(&["--prefix"]);
        }
    }
    assert!(!ran.exists(), "a job ran under a refused prefix");
    assert!(e.untouched(), "a refused prefix left state behind");

    for (i, (pa, na, pb, nb)) in CLOSE_PAIRS.into_iter().enumerate() {
        if refused.contains(&pa) || refused.contains(&pb) {
            continue;
        }
        let a = |args: &[&str]| on(&e.url()).args(["--prefix", pa]).args(args);
        let b = |args: &[&str]| on(&e.url()).args(["--prefix", pb]).args(args);
        let tag = format!("holder{i}");
        let mut h = a(&[na, "-c"])
            .arg(format!(
                "echo $$ > {}; exec sleep 60",
                scratch.path(&tag).display()
            ))
            .spawn();
        let held = scratch.pid_in(&tag);
        let seen = b(&["status", "--json", nb]).output().json();
        assert_eq!(
            seen["held"], false,
            "{pa:?} {na:?} seen as {pb:?} {nb:?}: {seen}"
        );
        let out = b(&["-n", nb, "-c", "echo ran"]).code(0);
        assert_eq!(out.stdout(), "ran\n", "{pb:?} {nb:?} did not run");
        if e.breaks() {
            b(&["release", "--force", nb]).code(1);
        }
        // The other prefix's listing holds nothing held.
        b(&["status"]).code(1);
        assert!(alive(held), "{pb:?} {nb:?} broke {pa:?} {na:?}");
        assert_eq!(a(&["status", "--json", na]).output().json()["held"], true);
        stop(&mut h);
    }
}

/// `lockrun X` from inside a job holding X would wait for itself once
/// anyone queues between them: refused with 64 in every mode, also when
/// another holder's label is the one a waiter sees first. Another name
/// inside is fine.
pub fn nested_requests_are_refused_in_every_mode(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let inner = format!("{BIN} --url {url} nest true");
    on(&url)
        .args(["nest", "-c", &inner])
        .code(64)
        .says(&["deadlock"]);
    for flags in [&["-s"][..], &["--limit", "2"][..]] {
        let tag = flags.len().to_string();
        let mut args = flags.to_vec();
        args.push("nest");
        let (mut other, _) = holder(e, &scratch, &tag, &args);
        let inner = format!("{BIN} --url {url} {} nest true", flags.join(" "));
        on(&url)
            .args(flags)
            .args(["nest", "-c", &inner])
            .code(64)
            .says(&["deadlock"]);
        stop(&mut other);
    }
    // Another name inside is no deadlock.
    on(&url)
        .args(["nest", "-c", &format!("{BIN} --url {url} inner true")])
        .code(0);
}

/// `status` without a name, `doctor` and `--metrics-file` (lockrun(1) "COMMANDS",
/// "Metrics for cron"): the held names listed, each as `status --json NAME`
/// shows it, exit 0 while any is held and 1 once none is; doctor's lines
/// and exit code agree, and it leaves nothing behind; the metrics file of a
/// run and of a skip reads back with a Prometheus parser.
pub fn operators_see_every_name_doctor_and_metrics(e: &dyn Fixture) {
    let url = e.url();
    // First, on the untouched engine: doctor is read-only.
    let ran = on(&url).arg("doctor").output();
    let out = ran.stdout();
    let mut worst = 0;
    for line in out.lines() {
        let (verdict, rest) = line.split_once("  ").expect("verdict, two spaces");
        worst = worst.max(match verdict.trim() {
            "ok" => 0,
            "warn" => 1,
            "fail" => 69,
            other => panic!("verdict {other:?}: {out}"),
        });
        assert!(rest.contains(": "), "{line}");
    }
    assert!(!out.is_empty());
    assert_eq!(ran.out.status.code(), Some(worst), "{out}");
    assert!(e.untouched(), "doctor left something behind: {out}");
    on(&e.unreachable()).arg("doctor").code(69);

    let scratch = Scratch::new();
    let metrics = scratch.path("m.prom");
    for name in ["e-free", "b-free"] {
        on(&url)
            .arg("--metrics-file")
            .arg(&metrics)
            .args([name, "true"])
            .succeeds();
    }
    let m = crate::operators::parse_metrics(&metrics);
    assert_eq!(crate::operators::value(&m, "acquired"), 1.0);
    assert_eq!(m["lockrun_last_run_acquired"].0["name"], "b-free");
    let mut holders = Vec::new();
    for name in ["d-held", "a-held", "c-held"] {
        let (child, _) = holder(e, &scratch, name, &[name]);
        holders.push(child);
        assert!(wait_until(
            Duration::from_secs(20),
            || status(e, name)["held"] == true
        ));
    }
    on(&url)
        .arg("--metrics-file")
        .arg(&metrics)
        .args(["-n", "c-held", "true"])
        .code(75);
    let m = crate::operators::parse_metrics(&metrics);
    assert_eq!(crate::operators::value(&m, "acquired"), 0.0);
    assert_eq!(crate::operators::value(&m, "exit_code"), 75.0);

    every_name_listed_sorted(e);

    for mut h in holders {
        stop(&mut h);
    }
    assert!(wait_until(Duration::from_secs(20), || {
        on(&url).arg("status").output().out.status.code() == Some(1)
    }));
}

/// With b-free and e-free used once, and a-held, c-held and d-held held:
/// `status` and `list` show the names sorted, one line each, the held ones
/// held and the free ones free (listed where the engine keeps a trace of
/// them); `--json` is an array of the objects `status --json NAME` prints.
#[track_caller]
fn every_name_listed_sorted(e: &dyn Fixture) {
    let url = e.url();
    let text = on(&url).arg("status").code(0).stdout();
    let names: Vec<&str> = text.lines().map(|l| l.split(':').next().unwrap()).collect();
    let expected = if e.keeps_free_names() {
        &["a-held", "b-free", "c-held", "d-held", "e-free"][..]
    } else {
        &["a-held", "c-held", "d-held"]
    };
    assert_eq!(names, expected, "{text}");
    for l in text.lines() {
        assert_eq!(l.contains("held by"), l.contains("-held:"), "{l}");
        if l.contains("-free:") {
            assert!(l.ends_with(": free"), "{l}");
        }
    }
    // `list` is the same command (the times in it move on).
    let listed = on(&url).arg("list").code(0).stdout();
    let listed: Vec<&str> = listed
        .lines()
        .map(|l| l.split(':').next().unwrap())
        .collect();
    assert_eq!(listed, names, "list and status differ");
    for args in [&["status", "--json"], &["list", "--json"]] {
        let v = on(&url).args(args).code(0).json();
        let all = v.as_array().expect("an array");
        assert_eq!(all.len(), expected.len(), "{args:?}: {v}");
        for obj in all {
            let name = obj["name"].as_str().unwrap();
            assert_eq!(obj["held"], name.ends_with("-held"), "{obj}");
            // The same object `status --json NAME` prints, but for what moves.
            let one = status(e, name);
            let keys =
                |o: &serde_json::Value| o.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(obj), keys(&one), "{args:?}: {obj} beside {one}");
            assert_eq!(obj["token"], one["token"], "{obj}");
            assert_eq!(obj["holder"], one["holder"], "{obj}");
        }
    }
}

// --min-hold (lockrun(1) "Once per window").

/// What `status --json` says of a name kept by a `--min-hold` window:
/// held, by no running job, until when, and why.
#[track_caller]
fn shows_a_window(e: &dyn Fixture, name: &str) -> serde_json::Value {
    let v = status(e, name);
    assert_eq!(v["held"], true, "{v}");
    assert_eq!(v["min_hold"], true, "{v}");
    assert_eq!(v["holder_gone"], false, "{v}");
    let h = &v["holders"][0];
    assert_eq!(h["min_hold"], true, "{v}");
    assert_eq!(h["revoked"], false, "{v}");
    assert!(
        h["held_until"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{v}"
    );
    v
}

/// Five requests started 0–2 s apart, as one crontab line fires on five
/// hosts whose clocks differ, with a 3 s window and a 0.1 s job: the job
/// runs once. `status` shows the window; once it ends, a sixth request
/// runs the job again, with a higher token.
pub fn min_hold_runs_once_per_window(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let ran = scratch.path("ran");
    let job = format!("echo $LOCKRUN_TOKEN >> {}; sleep 0.1", ran.display());
    let cron = || {
        on(&url)
            .args(["-n", "-E", "0", "--min-hold", "3s", "tick", "-c"])
            .arg(&job)
    };
    let tokens = || -> Vec<u64> {
        std::fs::read_to_string(&ran)
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    };
    let first = Instant::now();
    let mut children = vec![cron().spawn()];
    assert_eq!(
        wait_child(&mut children[0], Duration::from_secs(20)).code(),
        Some(0)
    );
    let v = shows_a_window(e, "tick");
    let left = v["ttl_left_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 4000, "{v}");
    let text = on(&url).args(["status", "tick"]).code(0).stdout();
    for part in ["min-hold", "until", "no job running"] {
        assert!(text.contains(part), "status lacks {part:?}: {text}");
    }
    for i in 1..5u32 {
        // Started on a schedule, as cron on hosts whose clocks differ.
        std::thread::sleep((Duration::from_millis(500) * i).saturating_sub(first.elapsed()));
        children.push(cron().spawn());
    }
    let last = first.elapsed();
    all_succeed(children);
    assert!(
        last < Duration::from_millis(2800),
        "the requests were started over {last:?}, not within the window"
    );
    let once = tokens();
    assert_eq!(
        once.len(),
        1,
        "five requests within the window ran {once:?}"
    );
    assert!(wait_until(
        Duration::from_secs(30),
        || status(e, "tick")["held"] == false
    ));
    assert!(
        first.elapsed() >= Duration::from_millis(2900),
        "the window ended early"
    );
    cron().code(0);
    let twice = tokens();
    assert_eq!(twice.len(), 2, "{twice:?}");
    assert!(twice[1] > twice[0], "the token went down: {twice:?}");
}

/// `release --force` ends a window at once (on every engine: no job runs
/// under it), `--token` only that grant's; the next grant's token is higher.
pub fn release_force_ends_a_min_hold_window(e: &dyn Fixture) {
    let url = e.url();
    on(&url).args(["--min-hold", "60s", "win", "true"]).code(0);
    on(&url).args(["-n", "win", "true"]).code(75);
    let token = shows_a_window(e, "win")["token"].as_u64().unwrap();
    on(&url)
        .args([
            "release",
            "--force",
            "--token",
            &(token + 1).to_string(),
            "win",
        ])
        .code(1);
    on(&url).args(["-n", "win", "true"]).code(75);
    let out = on(&url)
        .args(["release", "--force", "--token", &token.to_string(), "win"])
        .code(0)
        .stdout();
    assert!(out.contains("min-hold"), "{out}");
    let after = on(&url)
        .args(["-n", "win", "-c", "echo $LOCKRUN_TOKEN"])
        .code(0)
        .stdout();
    assert!(after.trim().parse::<u64>().unwrap() > token, "{after}");
    assert_eq!(status(e, "win")["held"], false);
}

/// A waiter (no `-n`) on a window starts once the window ends: not before,
/// and soon after (woken, not left asleep).
pub fn a_waiter_starts_when_the_min_hold_window_ends(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let ran = scratch.path("ran");
    let before_grant = Instant::now();
    on(&url).args(["--min-hold", "3s", "queue", "true"]).code(0);
    let mut waiter = on(&url)
        .args(["-q", "queue", "-c"])
        .arg(format!("touch {}", ran.display()))
        .spawn();
    assert!(wait_until(Duration::from_secs(30), || ran.exists()));
    let at = before_grant.elapsed();
    assert!(
        at >= Duration::from_millis(2900),
        "the waiter ran {at:?} after the grant, inside its 3s window"
    );
    assert!(
        at < Duration::from_secs(13),
        "the waiter ran {at:?} after the grant, long after its window ended"
    );
    assert_eq!(
        wait_child(&mut waiter, Duration::from_secs(20)).code(),
        Some(0)
    );
}

/// With `--limit N` each grant keeps its place for the window; with `-s`
/// a reader's window lets readers in and keeps a writer out.
pub fn min_hold_keeps_each_place_with_limit_and_shared(e: &dyn Fixture) {
    let url = e.url();
    let lim = ["--limit", "2"];
    for _ in 0..2 {
        on(&url)
            .args(lim)
            .args(["--min-hold", "60s", "lim", "true"])
            .code(0);
    }
    on(&url).args(lim).args(["-n", "lim", "true"]).code(75);
    let v = shows_a_window(e, "lim");
    let holders = v["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 2, "{v}");
    assert!(holders.iter().all(|h| h["min_hold"] == true), "{v}");
    on(&url).args(["release", "--force", "lim"]).code(0);
    on(&url).args(lim).args(["-n", "lim", "true"]).code(0);

    on(&url)
        .args(["-s", "--min-hold", "60s", "rw", "true"])
        .code(0);
    on(&url).args(["-n", "-s", "rw", "true"]).code(0);
    on(&url).args(["-n", "rw", "true"]).code(75);
    shows_a_window(e, "rw");
    on(&url).args(["release", "--force", "rw"]).code(0);
    on(&url).args(["-n", "rw", "true"]).code(0);
}

// End of --min-hold.

// ---- concurrency groups: --max-waiters, --supersede, --preempt ----

/// A waiting request with a piped stderr, its job marking `tag` once it runs.
pub fn waiter(e: &dyn Fixture, scratch: &Scratch, name: &str, tag: &str, args: &[&str]) -> Child {
    on(&e.url())
        .args(args)
        .args(["--label", tag, name, "-c"])
        .arg(format!(
            "echo $LOCKRUN_TOKEN > {}",
            scratch.path(tag).display()
        ))
        .stderr(std::process::Stdio::piped())
        .spawn()
}

/// `--max-waiters 1` coalesces: the holder runs, one request waits, a third
/// gives up at once with the conflict code (silently, as `-n` does), and the
/// queued one runs once the holder is done.
pub fn max_waiters_coalesces(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let (mut h, _) = holder(e, &scratch, "h", &["co"]);
    let queued = waiter(e, &scratch, "co", "w1", &["--max-waiters", "1"]);
    assert!(wait_until(Duration::from_secs(20), || waiters(e, "co") == 1));
    let started = Instant::now();
    let out = on(&e.url())
        .args(["--max-waiters", "1", "co", "true"])
        .code(75);
    assert_eq!(out.stderr(), "", "a coalesced request is silent without -v");
    assert!(started.elapsed() < Duration::from_secs(10), "it waited");
    on(&e.url())
        .args(["--max-waiters", "1", "-E", "0", "co", "true"])
        .code(0);
    // Under -v it says why.
    let out = on(&e.url())
        .args(["-v", "--max-waiters", "1", "co", "true"])
        .code(75);
    assert!(out.stderr().contains("--max-waiters"), "{}", out.stderr());
    // A request without --max-waiters still queues behind them.
    assert_eq!(waiters(e, "co"), 1);
    assert!(
        !scratch.exists("w1"),
        "the queued run started beside the holder"
    );
    stop(&mut h);
    let (code, err) = exited(queued, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert!(scratch.exists("w1"));
}

/// Twenty requests fired at once with `--max-waiters 2` leave exactly two
/// queued: the count is read in the step that joins the queue.
pub fn max_waiters_counts_in_the_joining_step(e: &dyn Fixture) {
    // Dozens of lockruns at once: one such test at a time on the machine.
    let _alone = heavy();
    let scratch = Scratch::new();
    let (mut h, _) = holder(e, &scratch, "h", &["burst"]);
    let children: Vec<Child> = (0..20)
        .map(|i| {
            waiter(
                e,
                &scratch,
                "burst",
                &format!("b{i}"),
                &["--max-waiters", "2"],
            )
        })
        .collect();
    // The refused ones end at once; the queued ones wait for the holder.
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    let mut refused = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while refused < 18 && Instant::now() < deadline {
        for slot in children.iter_mut() {
            if let Some(c) = slot
                && let Some(st) = c.try_wait().unwrap()
            {
                assert_eq!(st.code(), Some(75), "a request beyond the two ended so");
                refused += 1;
                *slot = None;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let queued: Vec<Child> = children.into_iter().flatten().collect();
    assert_eq!(queued.len(), 2, "{refused} refused");
    assert_eq!(waiters(e, "burst"), 2);
    stop(&mut h);
    for c in queued {
        let (code, err) = exited(c, Duration::from_secs(60));
        assert_eq!(code, Some(0), "{err}");
    }
    let ran = (0..20).filter(|i| scratch.exists(&format!("b{i}"))).count();
    assert_eq!(ran, 2);
}

/// Three `--supersede` waiters arriving in turn leave only the newest; each
/// replaced one gives up with the conflict code and a line naming its
/// replacement; a plain waiter beside them is kept, and the holder is never
/// touched.
pub fn supersede_keeps_only_the_newest(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let (mut h, _) = holder(e, &scratch, "h", &["sup"]);
    let plain = waiter(e, &scratch, "sup", "plain", &[]);
    assert!(wait_until(Duration::from_secs(20), || waiters(e, "sup") == 1));
    let mut older: Option<(Child, String)> = None;
    for tag in ["s1", "s2", "s3"] {
        let c = waiter(e, &scratch, "sup", tag, &["--supersede"]);
        if let Some((old, old_tag)) = older.take() {
            let (code, err) = exited(old, Duration::from_secs(60));
            assert_eq!(code, Some(75), "{old_tag}: {err}");
            assert_eq!(err.lines().count(), 1, "{old_tag}: {err}");
            assert!(
                err.contains("replaced") && err.contains(tag),
                "{old_tag}: {err}"
            );
            assert!(!scratch.exists(&old_tag));
        }
        assert!(wait_until(Duration::from_secs(20), || waiters(e, "sup") == 2));
        older = Some((c, tag.to_string()));
    }
    let st = status(e, "sup");
    assert_eq!(st["waiters"], 2, "{st}");
    assert_eq!(st["superseding"], 1, "{st}");
    // The holder was never disturbed.
    assert!(h.try_wait().unwrap().is_none(), "the holder was stopped");
    stop(&mut h);
    let (code, err) = exited(plain, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = exited(older.unwrap().0, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    let plain: u64 = scratch.read("plain").trim().parse().unwrap();
    let newest: u64 = scratch.read("s3").trim().parse().unwrap();
    assert!(plain < newest, "served out of arrival order");
}

/// `--preempt` stops a holder whose job ignores SIGTERM (76, one line
/// naming the request), and its own job starts only once every process of
/// the old job is dead, with a higher token.
pub fn preempt_stops_the_holder_first(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let old = on(&e.url())
        .args(["--ttl", "3s", "--label", "old", "pre", "-c"])
        .arg(format!(
            "trap '' TERM; echo $LOCKRUN_TOKEN > {}; echo $$ > {}; while :; do sleep 0.1; done",
            scratch.path("old-token").display(),
            scratch.path("old-pid").display()
        ))
        .stderr(std::process::Stdio::piped())
        .spawn();
    let old_pid = scratch.pid_in("old-pid");
    let started = Instant::now();
    let new = on(&e.url())
        .args(["--preempt", "--label", "new", "pre", "-c"])
        .arg(format!(
            "if kill -0 -- -{old_pid} 2>/dev/null; then echo overlap > {}; fi; echo $LOCKRUN_TOKEN > {}",
            scratch.path("overlap").display(),
            scratch.path("new-token").display()
        ))
        .spawn();
    let (code, err) = exited(old, Duration::from_secs(60));
    assert_eq!(code, Some(76), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("preempted by") && err.contains("new"), "{err}");
    let mut new = new;
    assert_eq!(
        wait_child(&mut new, Duration::from_secs(60)).code(),
        Some(0)
    );
    assert!(
        !scratch.exists("overlap"),
        "the new job ran beside the old one"
    );
    let old_token: u64 = scratch.read("old-token").trim().parse().unwrap();
    let new_token: u64 = scratch.read("new-token").trim().parse().unwrap();
    assert!(new_token > old_token);
    // Seen at the next renewal (every second on the local engine), not a
    // lease later.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// Nothing a request does without `--preempt` disturbs a holder.
pub fn only_preempt_disturbs_a_holder(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let (mut h, _) = holder(e, &scratch, "h", &["--ttl", "2s", "calm"]);
    on(&e.url()).args(["-w", "1s", "calm", "true"]).code(75);
    on(&e.url())
        .args([
            "--max-waiters",
            "1",
            "-w",
            "1s",
            "--supersede",
            "calm",
            "true",
        ])
        .code(75);
    on(&e.url()).args(["-n", "calm", "true"]).code(75);
    // Two renewals later it still runs, and is not marked.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(h.try_wait().unwrap().is_none(), "the holder was stopped");
    assert!(status(e, "calm")["preempted_by"].is_null());
    assert_eq!(stop(&mut h), Some(143));
}

/// Combinations that make no sense are refused before anything is contacted.
pub fn group_words_refused_with_no_wait(e: &dyn Fixture) {
    for args in [
        &["-n", "--max-waiters", "1"][..],
        &["-n", "--supersede"],
        &["-n", "--preempt"],
        &["--max-waiters", "0"],
        &["--max-waiters", "x"],
    ] {
        on(&e.url())
            .args(args)
            .args(["g", "true"])
            .code(64)
            .says(&[]);
    }
    assert!(e.untouched(), "something was stored");
    // From the environment, --max-waiters is a default that -n ignores.
    on(&e.url())
        .env("LOCKRUN_MAX_WAITERS", "1")
        .args(["-n", "g", "true"])
        .code(0);
}

// End of concurrency groups.

/// A waiter ended by SIGINT or SIGTERM gives up its place before it dies
/// (lockrun(1) "Waiting"), and dies of the signal as it did before: the
/// name's next request is served at once, not when the place would lapse.
pub fn a_signalled_waiter_leaves_at_once(e: &dyn Fixture) {
    use std::os::unix::process::ExitStatusExt;
    let scratch = Scratch::new();
    let url = e.url();
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let name = format!("quit{sig}");
        let (mut h, _) = holder(e, &scratch, &format!("h{sig}"), &[&name]);
        let mut w = on(&url)
            .args(["-w", "60", &name, "-c"])
            .arg(format!(
                "touch {}",
                scratch.path(&format!("w{sig}")).display()
            ))
            .stderr(std::process::Stdio::piped())
            .spawn();
        // The waiting line, a second into the wait, comes once it waits.
        let mut err = std::io::BufReader::new(w.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("waiting for") {
            line.clear();
            let read = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
            assert!(read > 0, "the waiter ended before it waited");
        }
        assert_eq!(waiters(e, &name), 1);
        let sent = Instant::now();
        signal(w.id() as i32, sig);
        let st = wait_child(&mut w, Duration::from_secs(30));
        // A shell reports it as 128 + the signal (130, 143).
        assert_eq!(st.signal(), Some(sig), "{st:?}");
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "{:?}",
            sent.elapsed()
        );
        let v = status(e, &name);
        assert_eq!(v["waiters"], 0, "the place outlived its waiter: {v}");
        assert_eq!(stop(&mut h), Some(143));
        on(&url).args(["-n", &name, "true"]).code(0);
        on(&url)
            .args(["--max-waiters", "1", "-w", "10", &name, "true"])
            .code(0);
        assert!(
            !scratch.exists(&format!("w{sig}")),
            "the killed waiter's job ran"
        );
    }
}

/// Reading creates nothing (`status`, with and without a name, and
/// `release --force` of a name never used); then eight first users at once
/// all succeed, one at a time, each with a token of its own, and the tokens
/// after rise above them.
pub fn first_use_by_many_at_once_creates_what_it_needs_and_tokens_rise(e: &dyn Fixture) {
    let url = e.url();
    on(&url).args(["status", "tok"]).code(1);
    on(&url).arg("status").code(1);
    let force = if e.breaks() { 1 } else { 64 };
    on(&url).args(["release", "--force", "tok"]).code(force);
    assert!(e.untouched(), "reading left something behind");
    let scratch = Scratch::new();
    let children: Vec<Child> = (0..8)
        .map(|i| {
            on(&url)
                .args(["tok", "-c"])
                .arg(logging_job(&scratch, &format!("j{i}"), "0.05"))
                .spawn()
        })
        .collect();
    all_succeed(children);
    let spans = spans(&scratch);
    assert_eq!(spans.len(), 8);
    assert_eq!(
        most_at_once(&spans),
        1,
        "two first users at once: {spans:#?}"
    );
    tokens_follow_grants(&spans);
    let mut last = spans.iter().map(|s| s.token).max().unwrap();
    for _ in 0..3 {
        let out = on(&url)
            .args(["tok", "-c", "echo $LOCKRUN_TOKEN"])
            .succeeds()
            .stdout();
        let t: u64 = out.trim().parse().unwrap();
        assert!(t > last, "token {t} after {last}");
        last = t;
    }
}

/// Beside a holder, `-n` gives up at once (75, or `-E`'s code) and its
/// job never starts; `-w 1s` gives up after a second, not before and not
/// much later.
pub fn no_wait_gives_up_at_once_and_wait_gives_up_in_time(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let (mut h, _) = holder(e, &scratch, "h", &["held"]);
    let job = format!("touch {}", scratch.path("ran").display());
    let start = Instant::now();
    on(&url).args(["-n", "held", "-c", &job]).code(75);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "-n took {took:?}");
    on(&url).args(["-n", "-E", "3", "held", "true"]).code(3);
    let start = Instant::now();
    on(&url).args(["-w", "1s", "held", "-c", &job]).code(75);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(950),
        "gave up too early: {took:?}"
    );
    assert!(took < Duration::from_secs(6), "gave up too late: {took:?}");
    assert!(!scratch.exists("ran"), "a job ran beside the holder");
    assert_eq!(stop(&mut h), Some(143));
}

/// A waiter starts within a second of the holder's job ending, with a 30 s
/// ttl: only the release's wake-up explains a start this soon.
pub fn a_waiter_starts_promptly_after_release(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let mut h = on(&url)
        .args(["--ttl", "30s", "handoff", "-c"])
        .arg(format!(
            "touch {0}; while [ ! -e {1} ]; do sleep 0.01; done; date +%s%N > {2}",
            scratch.path("holding").display(),
            scratch.path("go").display(),
            scratch.path("end").display()
        ))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || scratch.exists("holding")));
    let mut waiter = on(&url)
        .args(["--ttl", "30s", "handoff", "-c"])
        .arg(format!("date +%s%N > {}", scratch.path("start").display()))
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || waiters(
        e, "handoff"
    ) == 1));
    std::fs::write(scratch.path("go"), "").unwrap();
    assert_eq!(wait_child(&mut h, Duration::from_secs(20)).code(), Some(0));
    assert_eq!(
        wait_child(&mut waiter, Duration::from_secs(20)).code(),
        Some(0)
    );
    let end: u128 = scratch.read("end").trim().parse().unwrap();
    let start: u128 = scratch.read("start").trim().parse().unwrap();
    let gap = Duration::from_nanos((start - end) as u64);
    assert!(gap < Duration::from_secs(1), "hand-off took {gap:?}");
}

/// A waiter killed with SIGKILL in the queue, behind the holder and ahead
/// of another, cannot end its place itself: the one behind starts once the
/// place is gone, at most the engine's `dead_place` after the holder ends
/// (a third of the ttl where a place is renewed), not a whole ttl or never.
pub fn a_waiter_killed_in_the_queue_holds_the_next_up_by_at_most_its_place(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let url = e.url();
    let ttl = e.queue_ttl();
    let ttl_arg = format!("{}ms", ttl.as_millis());
    let (mut h, job) = holder(e, &scratch, "h", &["--ttl", &ttl_arg, "kq"]);
    let mut dead = on(&url)
        .args(["-q", "--ttl", &ttl_arg, "kq", "true"])
        .spawn();
    wait_queued(&url, "kq", 1);
    let started = scratch.path("started");
    let mut next = on(&url)
        .args(["-q", "--ttl", &ttl_arg, "kq", "-c"])
        .arg(format!(
            "kill -0 {job} 2>/dev/null && touch {}; date +%s%N > {}",
            scratch.path("beside").display(),
            started.display()
        ))
        .spawn();
    wait_queued(&url, "kq", 2);
    signal(dead.id() as i32, libc::SIGKILL);
    let _ = dead.wait();
    let released = now_ns();
    assert_eq!(stop(&mut h), Some(143));
    assert_eq!(
        wait_child(&mut next, Duration::from_secs(30)).code(),
        Some(0)
    );
    let at: u128 = scratch.read("started").trim().parse().unwrap();
    let waited = Duration::from_nanos((at - released) as u64);
    let bound = e.dead_place(ttl) + Duration::from_millis(1500);
    assert!(
        waited < bound,
        "the waiter behind a killed one started {waited:?} after the holder was told to \
         end (ttl {ttl:?}, a dead place lasts {:?} here)",
        e.dead_place(ttl)
    );
    assert!(
        !scratch.exists("beside"),
        "the next job ran beside the holder's"
    );
    assert_eq!(waiters(e, "kq"), 0, "a place outlived its waiter");
}

/// The wall clock in ns, as `date +%s%N` gives it to a job.
fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Every test above, on each engine: one line per engine.
macro_rules! conformance {
    ($($engine:ident: $fixture:expr;)*) => {$(
        mod $engine {
            use super::*;
            #[test] fn runs_and_passes_exit_codes() { super::runs_and_passes_exit_codes(&$fixture) }
            #[test] fn excludes_and_tokens_grow() { super::excludes_and_tokens_grow(&$fixture) }
            #[test] fn first_come_first_served() { super::first_come_first_served(&$fixture) }
            #[test] fn readers_together_writer_alone() { super::readers_together_writer_alone(&$fixture) }
            #[test] fn limit_never_exceeds_n_and_reaches_it() { super::limit_never_exceeds_n_and_reaches_it(&$fixture) }
            #[test] fn disagreeing_requests_are_refused() { super::disagreeing_requests_are_refused(&$fixture) }
            #[test] fn status_lists_holders_and_waiters() { super::status_lists_holders_and_waiters(&$fixture) }
            #[test] fn release_force_token_and_now() { super::release_force_token_and_now(&$fixture) }
            #[test] fn a_lost_lease_stops_the_job() { super::a_lost_lease_stops_the_job(&$fixture) }
            #[test] fn a_stopped_lockrun_never_lets_its_job_outlive_the_lease() { super::a_stopped_lockrun_never_lets_its_job_outlive_the_lease(&$fixture) }
            #[test] fn kill_9_frees_the_name_only_after_the_job() { super::kill_9_frees_the_name_only_after_the_job(&$fixture) }
            #[test] fn bad_input_is_refused_before_anything_happens() { super::bad_input_is_refused_before_anything_happens(&$fixture) }
            #[test] fn unreachable_is_69() { super::unreachable_is_69(&$fixture) }
            #[test] fn prefixes_keep_names_apart() { super::prefixes_keep_names_apart(&$fixture) }
            #[test] fn nested_requests_are_refused_in_every_mode() { super::nested_requests_are_refused_in_every_mode(&$fixture) }
            #[test] fn operators_see_every_name_doctor_and_metrics() { super::operators_see_every_name_doctor_and_metrics(&$fixture) }
            #[test] fn min_hold_runs_once_per_window() { super::min_hold_runs_once_per_window(&$fixture) }
            #[test] fn release_force_ends_a_min_hold_window() { super::release_force_ends_a_min_hold_window(&$fixture) }
            #[test] fn a_waiter_starts_when_the_min_hold_window_ends() { super::a_waiter_starts_when_the_min_hold_window_ends(&$fixture) }
            #[test] fn min_hold_keeps_each_place_with_limit_and_shared() { super::min_hold_keeps_each_place_with_limit_and_shared(&$fixture) }
            #[test] fn max_waiters_coalesces() { super::max_waiters_coalesces(&$fixture) }
            #[test] fn max_waiters_counts_in_the_joining_step() { super::max_waiters_counts_in_the_joining_step(&$fixture) }
            #[test] fn supersede_keeps_only_the_newest() { super::supersede_keeps_only_the_newest(&$fixture) }
            #[test] fn preempt_stops_the_holder_first() { super::preempt_stops_the_holder_first(&$fixture) }
            #[test] fn only_preempt_disturbs_a_holder() { super::only_preempt_disturbs_a_holder(&$fixture) }
            #[test] fn group_words_refused_with_no_wait() { super::group_words_refused_with_no_wait(&$fixture) }
            #[test] fn a_signalled_waiter_leaves_at_once() { super::a_signalled_waiter_leaves_at_once(&$fixture) }
            #[test] fn no_wait_gives_up_at_once_and_wait_gives_up_in_time() { super::no_wait_gives_up_at_once_and_wait_gives_up_in_time(&$fixture) }
            #[test] fn a_waiter_starts_promptly_after_release() { super::a_waiter_starts_promptly_after_release(&$fixture) }
            #[test] fn first_use_by_many_at_once_creates_what_it_needs_and_tokens_rise() { super::first_use_by_many_at_once_creates_what_it_needs_and_tokens_rise(&$fixture) }
            #[test] fn a_waiter_killed_in_the_queue_holds_the_next_up_by_at_most_its_place() { super::a_waiter_killed_in_the_queue_holds_the_next_up_by_at_most_its_place(&$fixture) }
            #[test] fn short_passwords_garble_no_word() { super::short_passwords_garble_no_word(&$fixture) }
            #[test] fn the_password_is_never_printed_nor_given_to_the_job() { super::the_password_is_never_printed_nor_given_to_the_job(&$fixture) }
            #[test] fn bad_urls_are_refused_with_one_line_and_no_password() { super::bad_urls_are_refused_with_one_line_and_no_password(&$fixture) }
            #[test] fn a_server_restart_mid_job_is_ridden_out() { super::a_server_restart_mid_job_is_ridden_out(&$fixture) }
            #[test] fn the_rights_the_manual_lists_are_enough() { super::the_rights_the_manual_lists_are_enough(&$fixture) }
            #[test] fn a_stopped_server_stops_the_job_before_its_lease_could_lapse() { super::a_stopped_server_stops_the_job_before_its_lease_could_lapse(&$fixture) }
        }
    )*};
}

conformance! {
    local: LocalEngine::new();
    redis: RedisEngine::new();
    sentinel: SentinelEngine::new();
    cluster: ClusterEngine::new();
    etcd: EtcdEngine::new();
    postgres: PostgresEngine::new();
    mariadb: MariadbEngine::new();
    zookeeper: ZookeeperEngine::new();
    zookeeper_ensemble: ZookeeperEngine::ensemble();
}
