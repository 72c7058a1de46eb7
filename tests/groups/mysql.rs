//! The concurrency groups on MySQL/MariaDB, beyond the conformance suite.

use std::process::Stdio;
use std::time::Duration;

use crate::mysql::{finish, holder};
use crate::support::*;

/// A `--supersede` waiter is stopped and its connection cut, so its place
/// looks gone; a newer `--supersede` request then queues without finding
/// it live to replace. Continued and back, the older one must not take
/// its place back beside the newer: it is told it was replaced.
#[test]
fn a_cut_supersede_waiter_does_not_come_back_beside_a_newer_one() {
    let my = MyDb::new();
    let url = my.url();
    let scratch = Scratch::new();
    let (mut h, _) = holder(&url, &scratch, "cs", "60s");
    let waiter = |tag: &str| {
        on(&url)
            .args(["--ttl", "60s", "-w", "60", "--supersede", "--label", tag])
            .args(["cs", "true"])
            .stderr(Stdio::piped())
            .spawn()
    };
    let older = waiter("older");
    wait_queued(&url, "cs", 1);
    let row = my.sql(&format!(
        "SELECT seq, conn FROM `{}`.lockrun_waiters WHERE name = 'cs'",
        my.db
    ));
    let (seq, conn) = row.trim().split_once(char::is_whitespace).unwrap();
    signal(older.id() as i32, libc::SIGSTOP);
    assert!(my.server.try_kill(conn.trim()));
    let mut newer = waiter("newer");
    let newer_in = wait_until(Duration::from_secs(20), || {
        my.sql(&format!(
            "SELECT COUNT(*) FROM `{}`.lockrun_waiters WHERE name = 'cs' \
               AND expires_at > UTC_TIMESTAMP(6) AND seq > {seq}",
            my.db
        ))
        .trim()
            == "1"
    });
    signal(older.id() as i32, libc::SIGCONT);
    assert!(newer_in, "the newer request never queued");
    let out = older.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(err.contains("replaced") && err.contains("newer"), "{err}");
    assert_eq!(finish(&scratch, &mut h), Some(0));
    assert_eq!(
        wait_child(&mut newer, Duration::from_secs(30)).code(),
        Some(0)
    );
}
