//! The concurrency groups on ZooKeeper, beyond the conformance suite: marks
//! racing grants, and a supersede mark that comes late to a granted
//! request.

use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;
use crate::zookeeper::attacks::{checking_job, chroot_url, delaying_forwarder, gated_job};

/// `--preempt` racing `--supersede` and `--max-waiters 1` on one name: the
/// preempted job is dead before the preemptor's starts; replaced waiters
/// give up with 75; never two jobs at once.
#[test]
fn preempt_supersede_and_max_waiters_race() {
    let (url, _, _) = chroot_url();
    let scratch = Scratch::new();
    let holder = on(&url)
        .args(["--ttl", "3s", "pre", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("hpid").display()
        ))
        .stderr(Stdio::piped())
        .spawn();
    scratch.pid_in("hpid");
    let mut sup = Vec::new();
    for _ in 0..3 {
        sup.push(
            on(&url)
                .args(["--ttl", "3s", "--supersede", "-w", "60", "pre", "true"])
                .stderr(Stdio::piped())
                .spawn(),
        );
    }
    let full = on(&url)
        .args([
            "--ttl",
            "3s",
            "--max-waiters",
            "1",
            "-w",
            "60",
            "pre",
            "true",
        ])
        .stderr(Stdio::piped())
        .spawn();
    let pre = on(&url)
        .args(["--ttl", "3s", "--preempt", "-w", "60", "pre", "-c"])
        .arg(checking_job(&scratch, "hpid", "seen"))
        .stderr(Stdio::piped())
        .spawn();
    let (code, err) = exited(holder, Duration::from_secs(30));
    assert_eq!(code, Some(76), "{err}");
    let (code, err) = exited(pre, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(scratch.read("seen").trim(), "alone");
    let mut zero = 0;
    for s in sup {
        let (code, err) = exited(s, Duration::from_secs(60));
        assert!(matches!(code, Some(0 | 75)), "{code:?}: {err}");
        zero += usize::from(code == Some(0));
    }
    assert!(zero <= 1, "more than one superseding waiter ran");
    let (code, err) = exited(full, Duration::from_secs(60));
    assert!(matches!(code, Some(0 | 75)), "{code:?}: {err}");
}

/// `--supersede` racing a release: a burst of superseding requests arrives
/// just as the holder leaves. A request that read an earlier one as a
/// waiter marks it replaced; if that one was granted in between and the
/// mark still succeeded, every reader would leave the replaced node out of
/// the queue and grant the next request while the first one's job runs.
/// Two jobs must never run at once.
#[test]
fn supersede_marks_racing_a_grant_never_make_two_holders() {
    use crate::conformance::{logging_job, spans};
    let (url, _, _) = chroot_url();
    let scratch = Scratch::new();
    let started = Instant::now();
    let mut trials = 0;
    while started.elapsed() < Duration::from_secs(70) && trials < 40 {
        trials += 1;
        let name = format!("sr{trials}");
        let mut kids = vec![
            on(&url)
                .args(["--ttl", "3s", &name, "-c"])
                .arg(logging_job(&scratch, &format!("h{trials}"), "0.35"))
                .stderr(Stdio::null())
                .spawn(),
        ];
        std::thread::sleep(Duration::from_millis(150));
        for i in 0..10 {
            kids.push(
                on(&url)
                    .args(["--ttl", "3s", "--supersede", "-w", "30", &name, "-c"])
                    .arg(logging_job(&scratch, &format!("s{trials}.{i}"), "0.2"))
                    .stderr(Stdio::null())
                    .spawn(),
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        for k in kids {
            let (code, err) = exited(k, Duration::from_secs(60));
            assert!(matches!(code, Some(0 | 75)), "{code:?}: {err}");
        }
        let mut s = spans(&scratch);
        s.sort_by_key(|x| x.start);
        for w in s.windows(2) {
            assert!(
                w[0].end <= w[1].start,
                "trial {trial}: {a} (token {ta}) and {b} (token {tb}) ran at once",
                trial = trials,
                a = w[0].who,
                ta = w[0].token,
                b = w[1].who,
                tb = w[1].token
            );
        }
    }
    eprintln!("{trials} trials");
}

/// A `--supersede` mark racing a grant, made wide: the later
/// `--supersede` request is on a slow link (300 ms added to everything it
/// sends), so its mark lands a round trip after its read; the holder
/// leaves in between and the earlier superseding request is granted.
/// Protects against a mark made on a stale read landing on a granted
/// request (every reader would then leave the running holder out of the
/// queue, and the late request take the name beside it): the grant of a
/// `--supersede` request writes its node, so the stale mark fails.
#[test]
fn a_late_supersede_mark_on_a_granted_request() {
    use crate::conformance::spans;
    let port = shared_zookeeper();
    let (_, chroot) = zk_chroot();
    let direct = format!("zk://127.0.0.1:{port}{chroot}");
    let slow = format!("zk://127.0.0.1:{}{chroot}", delaying_forwarder(port, 300));
    let job = |scratch: &Scratch, who: &str, gate: &str| {
        let log = scratch.path("log");
        format!(
            "echo \"start {who} - $LOCKRUN_TOKEN $(date +%s%N)\" >> {l}; \
             while [ ! -e {g} ]; do sleep 0.05; done; \
             echo \"end {who} - $LOCKRUN_TOKEN $(date +%s%N)\" >> {l}",
            l = log.display(),
            g = scratch.path(gate).display()
        )
    };
    // Steps shorter than the 300 ms delay: one of them lands in the window.
    for offset in (700..=2100).step_by(200) {
        let scratch = Scratch::new();
        let name = format!("late{offset}");
        let holder = Reap(
            on(&direct)
                .args(["--ttl", "6s", &name, "-c"])
                .arg(gated_job(&scratch, "hpid", "go"))
                .spawn(),
        );
        scratch.pid_in("hpid");
        let first = on(&direct)
            .args(["--ttl", "6s", "--supersede", "-w", "60", &name, "-c"])
            .arg(job(&scratch, "first", "go2"))
            .stderr(Stdio::piped())
            .spawn();
        wait_queued(&direct, &name, 1);
        let late = on(&slow)
            .args(["--ttl", "6s", "--supersede", "-w", "60", &name, "-c"])
            .arg(job(&scratch, "late", "go3"))
            .stderr(Stdio::piped())
            .spawn();
        std::thread::sleep(Duration::from_millis(offset));
        std::fs::write(scratch.path("go"), "").unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let first_runs = scratch.exists("log") && scratch.read("log").contains("start first");
        let shown = status_json(&direct, &name);
        let first_token: Option<u64> = first_runs.then(|| {
            scratch
                .read("log")
                .lines()
                .find(|l| l.starts_with("start first"))
                .and_then(|l| l.split(' ').nth(3))
                .and_then(|t| t.parse().ok())
                .unwrap()
        });
        let bad_state = first_token.is_some() && shown["token"].as_u64() != first_token;
        if bad_state {
            // The first job keeps running past the late request's next look.
            std::thread::sleep(Duration::from_secs(33));
        }
        std::fs::write(scratch.path("go2"), "").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(scratch.path("go3"), "").unwrap();
        let (c1, e1) = exited(first, Duration::from_secs(60));
        let (c2, e2) = exited(late, Duration::from_secs(60));
        drop(holder);
        assert!(matches!(c1, Some(0 | 75 | 76)), "{offset}: {c1:?} {e1}");
        assert!(matches!(c2, Some(0 | 75 | 76)), "{offset}: {c2:?} {e2}");
        let mut s = spans(&scratch);
        s.sort_by_key(|x| x.start);
        for w in s.windows(2) {
            assert!(
                w[0].end <= w[1].start,
                "release {offset} ms after the slow request started: {} (token {}) and {} \
                 (token {}) ran at once; status showed {shown} while the first ran; \
                 first: {e1}; late: {e2}",
                w[0].who,
                w[0].token,
                w[1].who,
                w[1].token
            );
        }
        assert!(
            !bad_state,
            "{offset}: the first superseding request runs (token {first_token:?}) but status \
             shows {shown}"
        );
    }
}
