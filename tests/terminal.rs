//! Interactive use under a pseudo-terminal: the job owns the terminal, Ctrl-C
//! and Ctrl-Z behave as without lockrun, and the terminal comes back.

use std::time::Duration;

use crate::support::*;

const LONG: Duration = Duration::from_secs(20);

/// The terminal's foreground group as seen from the session leader, printed
/// with the leader's own group for comparison.
const SHOW_FG: &str = r#"echo "fg=$(cut -d' ' -f8 /proc/$$/stat) me=$$""#;

fn fg_is_callers(seen: &str, marker: &str) {
    let line = seen
        .lines()
        .find(|l| l.contains(marker) && l.contains("fg="))
        .unwrap_or_else(|| panic!("no {marker} line in:\n{seen}"));
    let fg = line
        .split("fg=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let me = line
        .split("me=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    assert_eq!(fg, me, "the terminal must be the caller's again: {line}");
}

#[test]
fn the_job_reads_the_terminal() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut pty = Pty::bash(&format!(
        "set -m; lockrun --url {url} t -- sh -c 'echo ready; read l; echo got:$l'; echo rc=$?; echo -n after; {SHOW_FG}"
    ));
    pty.expect("ready", LONG);
    pty.type_(b"hello\n");
    let seen = pty.expect("me=", LONG);
    assert!(seen.contains("got:hello"), "{seen}");
    assert!(seen.contains("rc=0"), "{seen}");
    fg_is_callers(&seen, "after");
    assert!(pty.finish(LONG).success());
}

/// Ctrl-C at a `for` loop of lockrun runs under `shell`: the loop must stop
/// at once, as it would without lockrun, and the lock be released.
fn ctrl_c_stops_the_loop(shell: &str) {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut pty = Pty::shell(
        shell,
        &format!(
            "set -m; for i in 1 2; do lockrun --url {url} t -- sh -c 'echo ready; exec sleep 100'; echo iteration-$i-done; done"
        ),
    );
    pty.expect("ready", LONG);
    pty.type_(b"\x03");
    let st = pty.finish(LONG);
    use std::os::unix::process::ExitStatusExt;
    // bash exits with 130, dash dies of SIGINT: both mean "interrupted".
    assert!(
        st.code() == Some(130) || st.signal() == Some(libc::SIGINT),
        "{shell} must stop as interrupted, got {st:?}: {}",
        pty.seen
    );
    assert!(!pty.seen.contains("iteration-1-done"), "{}", pty.seen);
    let out = run(lockrun().args(["--url", &url, "-n", "t", "true"]));
    assert_eq!(out.status.code(), Some(0), "the lock was released");
}

#[test]
fn ctrl_c_ends_the_job_and_stops_a_bash_loop() {
    ctrl_c_stops_the_loop("bash");
}

#[test]
fn ctrl_c_ends_the_job_and_stops_a_dash_loop() {
    ctrl_c_stops_the_loop("sh");
}

/// Ctrl-Z a job under bash's job control, wait `suspended` seconds, `fg` it,
/// and return everything the terminal showed.
fn ctrl_z_then_fg(url: &str, ttl: &str, job_secs: u32, suspended: &str) -> String {
    let mut pty = Pty::bash(&format!(
        "set -m; lockrun --url {url} --ttl {ttl} z -- sh -c 'echo ready; sleep {job_secs}; echo job-\"finished\"'; \
         echo -n 'stopped rc='$?' '; {SHOW_FG}; sleep {suspended}; fg %1 >/dev/null; echo final rc=$?; echo -n 'end '; {SHOW_FG}"
    ));
    pty.expect("ready", LONG);
    pty.type_(b"\x1a");
    let all = pty.expect("stopped rc=", LONG);
    assert!(!all.contains("job-finished"), "the job must stop: {all}");
    pty.expect("end fg=", LONG);
    let _ = pty.finish(LONG);
    let all = pty.seen.clone();
    assert!(
        all.contains("stopped rc=148"),
        "lockrun must stop with its job: {all}"
    );
    fg_is_callers(&all, "stopped");
    fg_is_callers(&all, "end");
    all
}

#[test]
fn ctrl_z_suspends_and_fg_resumes_within_the_ttl() {
    let redis = Redis::start();
    let all = ctrl_z_then_fg(&redis.url(), "5s", 1, "0.5");
    assert!(all.contains("job-finished"), "{all}");
    assert!(all.contains("final rc=0"), "{all}");
    let held: i64 = redis.cmd(&["EXISTS", "lockrun:{z}"]);
    assert_eq!(held, 0);
}

#[test]
fn ctrl_z_past_the_ttl_ends_the_job_with_76() {
    let redis = Redis::start();
    let all = ctrl_z_then_fg(&redis.url(), "1s", 3, "2.5");
    assert!(all.contains("final rc=76"), "{all}");
    assert!(
        !all.contains("job-finished"),
        "the job must not continue: {all}"
    );
}

#[test]
fn a_background_lockrun_never_takes_the_terminal() {
    let scratch = Scratch::new();
    let url = scratch.file_url();
    let mut pty = Pty::bash(&format!(
        "set -m; lockrun --url {url} bg -- sh -c 'sleep 0.5; echo job-fg=$(cut -d\" \" -f8 /proc/$$/stat)' & \
         wait; echo -n after; {SHOW_FG}"
    ));
    let all = pty.expect("me=", LONG);
    let job_fg = all
        .split("job-fg=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let me = all
        .split("me=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(job_fg, me, "the terminal stays with the shell: {all}");
    fg_is_callers(&all, "after");
}
