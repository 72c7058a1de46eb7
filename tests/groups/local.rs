//! The concurrency groups on the local engine, beyond the conformance
//! suite: a preemption reaches every holder and ends their `--min-hold`
//! windows; a replaced waiter leaves nothing behind.

use std::time::Duration;

use crate::local::{only_known_files, waiters};
use crate::support::*;

/// A `--min-hold` window, with or without its job, keeps out no
/// `--preempt` request: the window with no job is ended at once, and a
/// holder stopped by the preemption ends its own window as it releases.
#[test]
fn a_preemption_ends_min_hold_windows() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    on(&url).args(["--min-hold", "60s", "win", "true"]).code(0);
    on(&url).args(["-n", "win", "true"]).code(75);
    let started = std::time::Instant::now();
    on(&url).args(["--preempt", "win", "true"]).code(0);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let mut holder = on(&url)
        .args(["--min-hold", "60s", "--ttl", "60s", "win", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .spawn();
    scratch.pid_in("pid");
    let started = std::time::Instant::now();
    on(&url).args(["--preempt", "win", "true"]).code(0);
    assert_eq!(
        wait_child(&mut holder, Duration::from_secs(30)).code(),
        Some(76)
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    only_known_files(&scratch, "win");
}

/// A holder caught between taking its flock and writing its grant (here
/// held there by the holder of a deleted copy of the lock file, which it
/// must outwait) is a holder to `status`, so to `--preempt` too: a mark
/// written then stops its job once it runs, even after the preempting
/// request gave up. The mark used to be taken for an earlier holder's.
#[test]
fn a_preemption_reaches_a_holder_still_making_its_grant() {
    use std::os::fd::AsRawFd;
    let scratch = Scratch::new();
    let url = scratch.file_url();
    // An old holder whose file was deleted: this test, by hand.
    let path = scratch.path("locks").join("mid.lock");
    let old = std::fs::File::create(&path).unwrap();
    // SAFETY: flock on a descriptor this test owns, open for the call.
    assert_eq!(unsafe { libc::flock(old.as_raw_fd(), libc::LOCK_EX) }, 0);
    std::fs::remove_file(&path).unwrap();
    let h = on(&url)
        .args(["--ttl", "10s", "--kill-after", "1s", "mid", "-c"])
        .arg("trap '' TERM; while :; do sleep 0.1; done")
        .stderr(std::process::Stdio::piped())
        .spawn();
    // Caught there: holding the new file's flock and blocked on the old
    // one's. Its first try, which gives the flock back at once when it
    // finds the old holder, is not that moment: a mark made then is for
    // a lock that ended, and the holder rightly takes it as no one's.
    let pid = h.id().to_string();
    let blocked = || {
        std::fs::read_to_string("/proc/locks")
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains("->") && l.split_whitespace().nth(5) == Some(pid.as_str()))
    };
    let held = || {
        let st = on(&url).args(["status", "--json", "mid"]).output().json();
        blocked() && st["held"] == true && blocked()
    };
    assert!(wait_until(Duration::from_secs(20), held));
    on(&url)
        .args(["--preempt", "-w", "1s", "--label", "new", "mid", "true"])
        .code(75);
    drop(old);
    let (code, err) = exited(h, Duration::from_secs(30));
    assert_eq!(code, Some(76), "{err}");
    assert!(err.contains("new"), "{err}");
}

/// `--preempt` with `--limit`: each slot's holder is marked in its own
/// file and stops; a later holder of the same slot is never stopped by the
/// old mark, and `status` does not show it marked.
#[test]
fn a_preemption_stops_every_slot_holder_and_no_later_one() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let holders: Vec<_> = ["a", "b"]
        .iter()
        .map(|tag| {
            let c = on(&url)
                .args(["--limit", "2", "--ttl", "60s", "--label", tag, "pre", "-c"])
                .arg(format!(
                    "echo $$ > {}; exec sleep 60",
                    scratch.path(tag).display()
                ))
                .spawn();
            scratch.pid_in(tag);
            c
        })
        .collect();
    let started = std::time::Instant::now();
    let mut new = on(&url)
        .args(["--limit", "2", "--preempt", "--label", "new", "pre", "true"])
        .spawn();
    for mut h in holders {
        assert_eq!(wait_child(&mut h, Duration::from_secs(30)).code(), Some(76));
    }
    assert_eq!(
        wait_child(&mut new, Duration::from_secs(30)).code(),
        Some(0)
    );
    // Seen at the holders' next look, every second, whatever the ttl.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // The marks stay in the slot files, meant for the holders of then only.
    let mut later = on(&url)
        .args([
            "--limit", "2", "--ttl", "2s", "--label", "later", "pre", "-c",
        ])
        .arg(format!(
            "echo $$ > {}; sleep 2.5",
            scratch.path("later").display()
        ))
        .spawn();
    scratch.pid_in("later");
    let st = on(&url).args(["status", "--json", "pre"]).output().json();
    assert!(st["preempted_by"].is_null(), "{st}");
    let holders = st["holders"].as_array().unwrap();
    assert!(
        !holders.is_empty() && holders.iter().all(|h| h["preempted_by"].is_null()),
        "{st}"
    );
    assert_eq!(
        wait_child(&mut later, Duration::from_secs(30)).code(),
        Some(0)
    );
    only_known_files(&scratch, "pre");
}

/// A waiter replaced by a later `--supersede` request leaves within a
/// fraction of a second, not at its next refresh (ttl/5 = 12 s here), and
/// the line moves on; nothing is left in the directory but the name's files.
#[test]
fn a_replaced_waiter_leaves_at_once_and_leaves_nothing_behind() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut holder = hold(Some(&url), "sup", "60s", &scratch);
    scratch.pid_in("pid");
    let mut old = on(&url)
        .args(["--ttl", "60s", "--supersede", "--label", "old"])
        .args(["sup", "true"])
        .stderr(std::process::Stdio::piped())
        .spawn();
    assert!(wait_until(Duration::from_secs(20), || waiters(&url, "sup") == 1));
    let started = std::time::Instant::now();
    let mut new = on(&url)
        .args(["-q", "--ttl", "60s", "--supersede", "--label", "new"])
        .args(["sup", "true"])
        .spawn();
    let code = wait_child(&mut old, Duration::from_secs(30)).code();
    let took = started.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut old.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(code, Some(75), "{err}");
    assert!(err.contains("replaced") && err.contains("(new)"), "{err}");
    assert!(took < Duration::from_secs(3), "left after {took:?}");
    let st = on(&url).args(["status", "--json", "sup"]).output().json();
    assert_eq!(
        (st["waiters"].as_u64(), st["superseding"].as_u64()),
        (Some(1), Some(1)),
        "{st}"
    );
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    assert_eq!(
        wait_child(&mut new, Duration::from_secs(30)).code(),
        Some(0)
    );
    only_known_files(&scratch, "sup");
}
