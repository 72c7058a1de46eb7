//! Hostile cases for --max-waiters, --supersede and --preempt: bursts,
//! races with grants, paused lockruns, marks that outlive their holder.
//! Each runs on every engine: one line per engine at the bottom.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::conformance::ZookeeperEngine;
use crate::conformance::{
    EtcdEngine, Fixture, LocalEngine, MariadbEngine, PostgresEngine, RedisEngine, Span, spans,
    status, stop, waiter, waiters,
};
use crate::support::*;

// ---- helpers ----

/// A holder whose job runs until stopped (ignoring nothing); returns once
/// the job runs.
fn holder(e: &dyn Fixture, scratch: &Scratch, tag: &str, args: &[&str], name: &str) -> Child {
    let child = on(&e.url())
        .args(args)
        .args(["--label", tag, name, "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 120",
            scratch.path(tag).display()
        ))
        .stderr(Stdio::piped())
        .spawn();
    scratch.pid_in(tag);
    child
}

/// A job that logs its span (start/end with token) and ends its span on
/// TERM; it runs `secs` otherwise.
fn span_job(scratch: &Scratch, who: &str, secs: &str) -> String {
    let log = scratch.path("log");
    let log = log.display();
    format!(
        "echo \"start {who} - $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}; \
         trap 'trap \"\" TERM; echo \"end {who} - $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}; exit 0' TERM; \
         sleep {secs} & wait; \
         echo \"end {who} - $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}"
    )
}

fn spawn_span(
    e: &dyn Fixture,
    scratch: &Scratch,
    name: &str,
    who: &str,
    secs: &str,
    args: &[&str],
) -> Child {
    on(&e.url())
        .args(args)
        .args(["--label", who, name, "-c"])
        .arg(span_job(scratch, who, secs))
        .stderr(Stdio::piped())
        .spawn()
}

#[track_caller]
fn no_overlap(spans: &[Span]) {
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            assert!(
                !(a.start < b.end && b.start < a.end),
                "two jobs at once: {a:?} and {b:?}"
            );
        }
    }
    for w in spans.windows(2) {
        assert!(
            w[0].token < w[1].token,
            "token went down: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
}

#[track_caller]
fn nothing_endless(e: &dyn Fixture) {
    let left = e.endless();
    assert!(left.is_empty(), "left with no end: {left:?}");
}

// ---- correctness under bursts ----

/// 30 requests at once with `--max-waiters 2`, three rounds: never more than
/// two queued (watched all along), never more than two run afterwards.
pub fn burst_30_never_queues_more_than_n(e: &dyn Fixture) {
    // Dozens of lockruns at once: one such test at a time on the machine.
    let _alone = heavy();
    for round in 0..3 {
        let scratch = Scratch::new();
        let name = format!("burst{round}");
        let mut h = holder(e, &scratch, "h", &[], &name);
        let kids: Vec<Child> = (0..30)
            .map(|i| {
                waiter(
                    e,
                    &scratch,
                    &name,
                    &format!("b{i}"),
                    &["--max-waiters", "2"],
                )
            })
            .collect();
        let mut kids: Vec<Option<Child>> = kids.into_iter().map(Some).collect();
        let mut most = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut ended = 0;
        while ended < 28 && Instant::now() < deadline {
            most = most.max(waiters(e, &name));
            for slot in kids.iter_mut() {
                if let Some(c) = slot
                    && let Some(st) = c.try_wait().unwrap()
                {
                    assert_eq!(st.code(), Some(75), "round {round}");
                    ended += 1;
                    *slot = None;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        let settled = waiters(e, &name);
        assert!(
            settled <= 2,
            "round {round}: {settled} queued with --max-waiters 2 ({} lockruns left): {}",
            kids.iter().flatten().count(),
            status(e, &name)
        );
        if most > 2 {
            eprintln!("note: round {round}: status showed {most} waiting for a moment");
        }
        let left: Vec<Child> = kids.into_iter().flatten().collect();
        assert!(left.len() <= 2, "round {round}: {} still wait", left.len());
        assert!(!left.is_empty(), "round {round}: nobody queued at all");
        stop(&mut h);
        for c in left {
            let (code, err) = exited(c, Duration::from_secs(60));
            assert_eq!(code, Some(0), "round {round}: {err}");
        }
        let ran = (0..30).filter(|i| scratch.exists(&format!("b{i}"))).count();
        assert!((1..=2).contains(&ran), "round {round}: {ran} ran");
    }
    nothing_endless(e);
}

/// 30 `--supersede` requests at once beside 3 plain waiters: one of the 30
/// stays, every other ends 75 with one line naming its replacement, the
/// plain ones all run, and nothing is left behind.
pub fn burst_30_supersede_keeps_one(e: &dyn Fixture) {
    // Dozens of lockruns at once: one such test at a time on the machine.
    let _alone = heavy();
    let scratch = Scratch::new();
    let name = "sburst";
    let mut h = holder(e, &scratch, "h", &[], name);
    let plain: Vec<Child> = (0..3)
        .map(|i| waiter(e, &scratch, name, &format!("p{i}"), &[]))
        .collect();
    assert!(wait_until(Duration::from_secs(20), || waiters(e, name) == 3));
    let kids: Vec<Child> = (0..30)
        .map(|i| waiter(e, &scratch, name, &format!("s{i}"), &["--supersede"]))
        .collect();
    let mut kids: Vec<Option<Child>> = kids.into_iter().map(Some).collect();
    let mut replaced = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while replaced < 29 && Instant::now() < deadline {
        for slot in kids.iter_mut() {
            if slot
                .as_mut()
                .is_some_and(|c| c.try_wait().unwrap().is_some())
            {
                let (code, err) = exited(slot.take().unwrap(), Duration::from_secs(1));
                assert_eq!(code, Some(75), "{err}");
                // The waiting line, after a second, may come first.
                let said: Vec<&str> = err
                    .lines()
                    .filter(|l| !l.contains("warning: waiting for"))
                    .collect();
                assert_eq!(said.len(), 1, "{err}");
                assert!(said[0].contains("replaced"), "{err}");
                replaced += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<Child> = kids.into_iter().flatten().collect();
    assert_eq!(left.len(), 1, "{replaced} replaced");
    std::thread::sleep(Duration::from_millis(500));
    let st = status(e, name);
    assert_eq!(st["waiters"], 4, "{st}");
    assert_eq!(st["superseding"], 1, "{st}");
    assert!(h.try_wait().unwrap().is_none(), "the holder was disturbed");
    stop(&mut h);
    for c in plain.into_iter().chain(left) {
        let (code, err) = exited(c, Duration::from_secs(60));
        assert_eq!(code, Some(0), "{err}");
    }
    let ran = (0..30).filter(|i| scratch.exists(&format!("s{i}"))).count();
    assert_eq!(ran, 1);
    nothing_endless(e);
}

/// `--supersede --max-waiters 1`, 30 at once, three rounds: one pending.
pub fn burst_supersede_with_max_waiters_1(e: &dyn Fixture) {
    // Dozens of lockruns at once: one such test at a time on the machine.
    let _alone = heavy();
    for round in 0..3 {
        let scratch = Scratch::new();
        let name = format!("ci{round}");
        let mut h = holder(e, &scratch, "h", &[], &name);
        let kids: Vec<Child> = (0..30)
            .map(|i| {
                waiter(
                    e,
                    &scratch,
                    &name,
                    &format!("c{i}"),
                    &["--supersede", "--max-waiters", "1"],
                )
            })
            .collect();
        let mut kids: Vec<Option<Child>> = kids.into_iter().map(Some).collect();
        let mut most = 0;
        let mut ended = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while ended < 29 && Instant::now() < deadline {
            most = most.max(waiters(e, &name));
            for slot in kids.iter_mut() {
                if slot
                    .as_mut()
                    .is_some_and(|c| c.try_wait().unwrap().is_some())
                {
                    let (code, err) = exited(slot.take().unwrap(), Duration::from_secs(1));
                    assert_eq!(code, Some(75), "round {round}: {err}");
                    ended += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        let settled = waiters(e, &name);
        assert!(settled <= 1, "round {round}: {settled} queued");
        if most > 1 {
            eprintln!("note: round {round}: status showed {most} waiting for a moment");
        }
        let left: Vec<Child> = kids.into_iter().flatten().collect();
        assert_eq!(left.len(), 1, "round {round}");
        stop(&mut h);
        for c in left {
            let (code, err) = exited(c, Duration::from_secs(60));
            assert_eq!(code, Some(0), "{err}");
        }
        let ran = (0..30).filter(|i| scratch.exists(&format!("c{i}"))).count();
        assert_eq!(ran, 1, "round {round}");
    }
    nothing_endless(e);
}

// ---- supersede racing a grant ----

/// A `--supersede` waiter at the head is being granted the very moment a
/// newer `--supersede` request arrives: it either runs or is replaced,
/// never both, never beside another job, and a replaced one leaves no lease
/// (the newer one is not kept waiting for one).
pub fn supersede_racing_a_grant(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let name = "srace";
    for i in 0..8 {
        let first = spawn_span(e, &scratch, name, &format!("h{i}"), "0.4", &["--ttl", "6s"]);
        assert!(wait_until(
            Duration::from_secs(20),
            || status(e, name)["held"] == true
        ));
        let w = spawn_span(
            e,
            &scratch,
            name,
            &format!("w{i}"),
            "0.1",
            &["--ttl", "12s", "--supersede"],
        );
        // On a loaded machine the holder's short job may end before the
        // waiter is seen queued: the round then races nothing, and its
        // checks below still hold.
        let w_start = format!("start w{i} ");
        assert!(wait_until(Duration::from_secs(20), || {
            waiters(e, name) == 1
                || std::fs::read_to_string(scratch.path("log"))
                    .unwrap_or_default()
                    .contains(&w_start)
        }));
        // Aim the newer request at the holder's end, a little off each time.
        let held = Instant::now();
        let aim = Duration::from_millis(150 + 40 * i as u64);
        std::thread::sleep(aim.saturating_sub(held.elapsed()));
        let started = Instant::now();
        let s = spawn_span(
            e,
            &scratch,
            name,
            &format!("s{i}"),
            "0.1",
            &["--ttl", "12s", "--supersede"],
        );
        let (c1, e1) = exited(first, Duration::from_secs(60));
        assert_eq!(c1, Some(0), "{e1}");
        let (cw, ew) = exited(w, Duration::from_secs(60));
        let (cs, es) = exited(s, Duration::from_secs(60));
        assert_eq!(cs, Some(0), "{es}");
        assert!(cw == Some(0) || cw == Some(75), "{ew}");
        if cw == Some(75) {
            assert!(ew.contains("replaced"), "{ew}");
            // A grant the replaced waiter never took would keep the name
            // for ttl/3 (2 s) or its ttl.
            assert!(
                started.elapsed() < Duration::from_millis(1900),
                "round {i}: the newer request waited {:?} for a replaced waiter's grant",
                started.elapsed()
            );
        }
        let log = scratch.read("log");
        assert_eq!(
            log.contains(&format!("start w{i} ")),
            cw == Some(0),
            "round {i}: replaced but ran, or ran but said replaced: {ew}"
        );
    }
    no_overlap(&spans(&scratch));
    nothing_endless(e);
}

/// A `--supersede` holder (granted at once) is never replaced by a newer
/// `--supersede` request: it keeps running, undisturbed.
pub fn supersede_never_touches_a_supersede_holder(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let name = "sholder";
    let mut h = holder(e, &scratch, "h", &["--ttl", "2s", "--supersede"], name);
    let w = waiter(e, &scratch, name, "w", &["--supersede", "--ttl", "2s"]);
    assert!(wait_until(Duration::from_secs(20), || waiters(e, name) == 1));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        h.try_wait().unwrap().is_none(),
        "the --supersede holder was stopped"
    );
    assert_eq!(stop(&mut h), Some(143));
    let (code, err) = exited(w, Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
}

// ---- preempt ----

/// Two `--preempt` requests at once against a holder: the holder stops
/// (76), both run in turn, never two jobs at once, tokens grow.
pub fn two_preempts_at_once(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let name = "pp";
    for round in 0..3 {
        let h = spawn_span(
            e,
            &scratch,
            name,
            &format!("h{round}"),
            "60",
            &["--ttl", "3s"],
        );
        assert!(wait_until(
            Duration::from_secs(20),
            || status(e, name)["held"] == true
        ));
        let a = spawn_span(
            e,
            &scratch,
            name,
            &format!("a{round}"),
            "0.5",
            &["--ttl", "3s", "--preempt"],
        );
        let b = spawn_span(
            e,
            &scratch,
            name,
            &format!("b{round}"),
            "0.5",
            &["--ttl", "3s", "--preempt"],
        );
        let (ch, eh) = exited(h, Duration::from_secs(60));
        assert_eq!(ch, Some(76), "{eh}");
        let (ca, ea) = exited(a, Duration::from_secs(60));
        let (cb, eb) = exited(b, Duration::from_secs(60));
        // The later of the two may preempt the earlier: 76 then, else 0.
        assert!(matches!(ca, Some(0) | Some(76)), "{ea}");
        assert!(matches!(cb, Some(0) | Some(76)), "{eb}");
        assert!(ca == Some(0) || cb == Some(0), "{ea} / {eb}");
    }
    no_overlap(&spans(&scratch));
    nothing_endless(e);
}

/// `--preempt` with `-s` against three readers, and with `--limit 2`
/// against two slot holders: every holder stops, the job never overlaps a
/// holder it must not.
pub fn preempt_with_shared_and_limit(e: &dyn Fixture) {
    let scratch = Scratch::new();
    // Three readers, an exclusive preemptor.
    let readers: Vec<Child> = (0..3)
        .map(|i| {
            spawn_span(
                e,
                &scratch,
                "ps",
                &format!("r{i}"),
                "60",
                &["-s", "--ttl", "3s"],
            )
        })
        .collect();
    assert!(wait_until(Duration::from_secs(20), || {
        status(e, "ps")["holders"].as_array().map_or(0, |a| a.len()) == 3
    }));
    let p = spawn_span(
        e,
        &scratch,
        "ps",
        "px",
        "0.3",
        &["--preempt", "--ttl", "3s"],
    );
    for r in readers {
        let (c, err) = exited(r, Duration::from_secs(60));
        assert_eq!(c, Some(76), "{err}");
    }
    let (c, err) = exited(p, Duration::from_secs(60));
    assert_eq!(c, Some(0), "{err}");
    let sp = spans(&scratch);
    let px = sp.iter().find(|s| s.who == "px").unwrap();
    for r in sp.iter().filter(|s| s.who.starts_with('r')) {
        assert!(r.end < px.start, "reader {r:?} beside the writer {px:?}");
    }
    // --limit 2: two slot holders, a third with --preempt.
    let scratch = Scratch::new();
    let holders: Vec<Child> = (0..2)
        .map(|i| {
            spawn_span(
                e,
                &scratch,
                "pl",
                &format!("l{i}"),
                "60",
                &["--limit", "2", "--ttl", "3s"],
            )
        })
        .collect();
    assert!(wait_until(Duration::from_secs(20), || {
        status(e, "pl")["holders"].as_array().map_or(0, |a| a.len()) == 2
    }));
    let p = spawn_span(
        e,
        &scratch,
        "pl",
        "lp",
        "0.3",
        &["--limit", "2", "--preempt", "--ttl", "3s"],
    );
    for h in holders {
        let (c, err) = exited(h, Duration::from_secs(60));
        assert_eq!(c, Some(76), "{err}");
    }
    let (c, err) = exited(p, Duration::from_secs(60));
    assert_eq!(c, Some(0), "{err}");
    let sp = spans(&scratch);
    let most = sp
        .iter()
        .map(|s| {
            sp.iter()
                .filter(|o| o.start <= s.start && s.start < o.end)
                .count()
        })
        .max()
        .unwrap();
    assert!(most <= 2, "more than --limit 2 at once: {sp:#?}");
    nothing_endless(e);
}

/// A preempted holder whose lockrun is paused while the preemptor waits:
/// the preemptor's job must not start while the old job still runs.
pub fn preempt_a_paused_holder(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let name = "ppause";
    let h = on(&e.url())
        .args(["--ttl", "3s", "--label", "old", name, "-c"])
        .arg(format!(
            "echo $$ > {}; while :; do date +%s%N > {}; sleep 0.05; done",
            scratch.path("oldpid").display(),
            scratch.path("beat").display()
        ))
        .stderr(Stdio::piped())
        .spawn();
    let mut h = h;
    let started = wait_until(Duration::from_secs(20), || {
        scratch.exists("oldpid") || h.try_wait().is_ok_and(|s| s.is_some())
    });
    if !scratch.exists("oldpid") {
        let (code, err) = exited(h, Duration::from_secs(20));
        panic!("the first holder never started its job (started: {started}): {code:?} {err}");
    }
    let old_job = scratch.pid_in("oldpid");
    let hpid = h.id() as i32;
    let h = Reap(h);
    signal(hpid, libc::SIGSTOP);
    let p = on(&e.url())
        .args(["--preempt", "--ttl", "3s", "--label", "new", name, "-c"])
        .arg(format!(
            "date +%s%N > {}; if kill -0 {old_job} 2>/dev/null; then echo overlap > {}; fi",
            scratch.path("newstart").display(),
            scratch.path("overlap").display()
        ))
        .stderr(Stdio::piped())
        .spawn();
    let mut p = Reap(p);
    // Leave the holder paused well past its lease.
    std::thread::sleep(Duration::from_secs(8));
    let ran_while_paused = scratch.exists("newstart");
    let overlap_while_paused = scratch.exists("overlap");
    signal(hpid, libc::SIGCONT);
    let _ = wait_child(&mut p.0, Duration::from_secs(60));
    drop(h);
    signal(old_job, libc::SIGKILL);
    // This overlap is documented (a paused lockrun, lockrun-safety(7)) on
    // engines whose leases expire; report it distinctly.
    assert!(
        !overlap_while_paused || e.breaks(),
        "the preemptor ran beside the old job on an engine whose leases never expire"
    );
    if ran_while_paused {
        eprintln!(
            "note: preemptor started while the old holder's lockrun was paused (lease ran out)"
        );
    }
}

/// A mark a `--preempt` request left (it gave up with -w) must not stop the
/// next holder, nor one granted after the mark's holder ended on its own.
pub fn stale_mark_spares_the_next_holder(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let name = "stale";
    // 1: the marked holder ends on its own before its next renewal.
    let h = spawn_span(e, &scratch, name, "h1", "0.3", &["--ttl", "30s"]);
    assert!(wait_until(
        Duration::from_secs(20),
        || status(e, name)["held"] == true
    ));
    let out = on(&e.url())
        .args(["--preempt", "-w", "0.1", "--ttl", "2s", name, "true"])
        .output();
    assert_eq!(out.out.status.code(), Some(75), "{}", out.stderr());
    let _ = exited(h, Duration::from_secs(60));
    // 2: the next holder, short ttl, runs several renewals undisturbed.
    let mut h2 = spawn_span(e, &scratch, name, "h2", "4", &["--ttl", "2s"]);
    let st = wait_child(&mut h2, Duration::from_secs(60));
    let mut err = String::new();
    if let Some(mut s) = h2.stderr.take() {
        use std::io::Read;
        let _ = s.read_to_string(&mut err);
    }
    assert_eq!(
        st.code(),
        Some(0),
        "a later holder was hit by an old mark: {err}"
    );
    // 3: a holder marked and stopped; the next one, same slot/row/file.
    let h3 = spawn_span(e, &scratch, name, "h3", "60", &["--ttl", "2s"]);
    assert!(wait_until(
        Duration::from_secs(20),
        || status(e, name)["held"] == true
    ));
    let out = on(&e.url())
        .args(["--preempt", "-w", "0.2", "--ttl", "2s", name, "true"])
        .output();
    assert_eq!(out.out.status.code(), Some(75), "{}", out.stderr());
    let (c3, e3) = exited(h3, Duration::from_secs(60));
    assert_eq!(c3, Some(76), "{e3}");
    let h4 = spawn_span(e, &scratch, name, "h4", "4", &["--ttl", "2s"]);
    let (c4, e4) = exited(h4, Duration::from_secs(60));
    assert_eq!(c4, Some(0), "a later holder was hit by an old mark: {e4}");
    assert!(status(e, name)["preempted_by"].is_null());
    no_overlap(&spans(&scratch));
    nothing_endless(e);
}

/// `--preempt` aimed at the moment a `--min-hold` holder's job ends (a
/// running holder turning into a window): never two jobs at once.
pub fn preempt_racing_min_hold_end(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let name = "pmh";
    for i in 0..6 {
        let h = spawn_span(
            e,
            &scratch,
            name,
            &format!("h{i}"),
            "0.5",
            &["--ttl", "3s", "--min-hold", "3s"],
        );
        assert!(wait_until(
            Duration::from_secs(20),
            || status(e, name)["held"] == true
        ));
        std::thread::sleep(Duration::from_millis(350 + 50 * i as u64));
        let p = spawn_span(
            e,
            &scratch,
            name,
            &format!("p{i}"),
            "0.2",
            &["--ttl", "3s", "--preempt"],
        );
        let (ch, eh) = exited(h, Duration::from_secs(60));
        assert!(matches!(ch, Some(0) | Some(76)), "{eh}");
        let (cp, ep) = exited(p, Duration::from_secs(60));
        assert_eq!(cp, Some(0), "{ep}");
    }
    no_overlap(&spans(&scratch));
    nothing_endless(e);
}

/// `--preempt` then `release --force` of the marked holder (and the other
/// way round): never two jobs at once, the preemptor still runs.
pub fn preempt_racing_release_force(e: &dyn Fixture) {
    if !e.breaks() {
        return;
    }
    let scratch = Scratch::new();
    let name = "pforce";
    for i in 0..4 {
        let h = on(&e.url())
            .args(["--ttl", "3s", "--label", &format!("h{i}"), name, "-c"])
            .arg(format!(
                "echo \"start h{i} - $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}; \
                 trap 'trap \"\" TERM; sleep 0.05; echo \"end h{i} - $LOCKRUN_TOKEN $(date +%s%N)\" >> {log}; exit 0' TERM; \
                 sleep 60 & wait",
                log = scratch.path("log").display()
            ))
            .stderr(Stdio::piped())
            .spawn();
        assert!(wait_until(
            Duration::from_secs(20),
            || status(e, name)["held"] == true
        ));
        let p = spawn_span(
            e,
            &scratch,
            name,
            &format!("p{i}"),
            "0.2",
            &["--ttl", "3s", "--preempt"],
        );
        if i % 2 == 0 {
            std::thread::sleep(Duration::from_millis(100 * i as u64));
        }
        let _ = on(&e.url()).args(["release", "--force", name]).output();
        let (ch, eh) = exited(h, Duration::from_secs(60));
        assert!(matches!(ch, Some(76)), "{eh}");
        let (cp, ep) = exited(p, Duration::from_secs(60));
        assert_eq!(cp, Some(0), "{ep}");
    }
    no_overlap(&spans(&scratch));
    nothing_endless(e);
}

/// Grants racing `--preempt` and `--supersede` and plain requests, all at
/// once: jobs never overlap and tokens only grow.
pub fn mixed_storm_never_overlaps(e: &dyn Fixture) {
    // Dozens of lockruns at once: one such test at a time on the machine.
    let _alone = heavy();
    let scratch = Scratch::new();
    let name = "storm";
    let mut kids = Vec::new();
    for i in 0..18 {
        let args: &[&str] = match i % 3 {
            0 => &["--ttl", "12s", "--preempt"],
            1 => &["--ttl", "12s", "--supersede"],
            _ => &["--ttl", "12s", "--max-waiters", "3"],
        };
        kids.push(spawn_span(e, &scratch, name, &format!("j{i}"), "0.3", args));
        std::thread::sleep(Duration::from_millis(60));
    }
    for k in kids {
        let (c, err) = exited(k, Duration::from_secs(120));
        assert!(matches!(c, Some(0) | Some(75) | Some(76)), "{c:?}: {err}");
    }
    no_overlap(&spans(&scratch));
    nothing_endless(e);
}

/// `-w` with the three words: a preempting request that gives up still
/// leaves the holder stopped; a `--supersede` one replaced before its wait
/// runs out says so; neither waits past -w.
pub fn wait_limit_with_group_words(e: &dyn Fixture) {
    let _scratch = Scratch::new();
    let name = "wl";
    let h = on(&e.url())
        .args([
            "--ttl",
            "10s",
            "--kill-after",
            "1s",
            "--label",
            "h",
            name,
            "-c",
        ])
        .arg("trap '' TERM; while :; do sleep 0.1; done")
        .stderr(Stdio::piped())
        .spawn();
    assert!(wait_until(
        Duration::from_secs(20),
        || status(e, name)["held"] == true
    ));
    let started = Instant::now();
    on(&e.url())
        .args([
            "--preempt",
            "--supersede",
            "--max-waiters",
            "2",
            "-w",
            "1s",
            name,
            "true",
        ])
        .code(75);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let (ch, eh) = exited(h, Duration::from_secs(60));
    assert_eq!(ch, Some(76), "{eh}");
    nothing_endless(e);
}

/// `--max-waiters` is judged before `--preempt`: a request that finds the
/// queue full leaves at once and asks no holder to stop (the admission
/// table's row "a full queue preempts no one").
pub fn a_full_queue_preempts_no_one(e: &dyn Fixture) {
    let scratch = Scratch::new();
    let name = "fq";
    let mut h = holder(e, &scratch, "h", &[], name);
    let queued = waiter(e, &scratch, name, "w1", &[]);
    assert!(wait_until(Duration::from_secs(20), || waiters(e, name) == 1));
    on(&e.url())
        .args(["--max-waiters", "1", "--preempt", name, "true"])
        .code(75);
    let st = status(e, name);
    assert!(st["preempted_by"].is_null(), "{st}");
    stop(&mut h);
    let (code, err) = exited(queued, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    nothing_endless(e);
}

macro_rules! red {
    ($($engine:ident: $fixture:expr;)*) => {$(
        mod $engine {
            use super::*;
            #[test] fn burst_30_never_queues_more_than_n() { super::burst_30_never_queues_more_than_n(&$fixture) }
            #[test] fn burst_30_supersede_keeps_one() { super::burst_30_supersede_keeps_one(&$fixture) }
            #[test] fn burst_supersede_with_max_waiters_1() { super::burst_supersede_with_max_waiters_1(&$fixture) }
            #[test] fn supersede_racing_a_grant() { super::supersede_racing_a_grant(&$fixture) }
            #[test] fn supersede_never_touches_a_supersede_holder() { super::supersede_never_touches_a_supersede_holder(&$fixture) }
            #[test] fn two_preempts_at_once() { super::two_preempts_at_once(&$fixture) }
            #[test] fn preempt_with_shared_and_limit() { super::preempt_with_shared_and_limit(&$fixture) }
            #[test] fn preempt_a_paused_holder() { super::preempt_a_paused_holder(&$fixture) }
            #[test] fn stale_mark_spares_the_next_holder() { super::stale_mark_spares_the_next_holder(&$fixture) }
            #[test] fn preempt_racing_min_hold_end() { super::preempt_racing_min_hold_end(&$fixture) }
            #[test] fn preempt_racing_release_force() { super::preempt_racing_release_force(&$fixture) }
            #[test] fn mixed_storm_never_overlaps() { super::mixed_storm_never_overlaps(&$fixture) }
            #[test] fn wait_limit_with_group_words() { super::wait_limit_with_group_words(&$fixture) }
            #[test] fn a_full_queue_preempts_no_one() { super::a_full_queue_preempts_no_one(&$fixture) }
        }
    )*};
}

red! {
    local: LocalEngine::new();
    redis: RedisEngine::new();
    etcd: EtcdEngine::new();
    postgres: PostgresEngine::new();
    mariadb: MariadbEngine::new();
    zookeeper: ZookeeperEngine::new();
}
