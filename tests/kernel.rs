//! Kernels without pidfds (Linux before 5.3) and sandboxes that refuse them,
//! simulated by a seccomp filter that answers `pidfd_open`,
//! `pidfd_send_signal` and `pidfd_getfd` with ENOSYS (no such call) or EPERM
//! (a policy's refusal). Whatever the kernel, lockrun never runs a job it
//! could not stop: either every promise holds, or no job starts.

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use crate::support::*;

const OPEN: i64 = libc::SYS_pidfd_open;
const SEND: i64 = libc::SYS_pidfd_send_signal;
const GETFD: i64 = libc::SYS_pidfd_getfd;

/// Install, in `cmd`'s process before it execs, a seccomp filter that fails
/// each of `calls` with `errno` and allows every other call. The filter is
/// inherited by lockrun, its guard and the job.
fn refuse(cmd: &mut Command, calls: &[i64], errno: i32) {
    const LD_NR: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET: u16 = 0x06; // BPF_RET | BPF_K
    const ALLOW: u32 = 0x7fff_0000;
    const ERRNO: u32 = 0x0005_0000;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    // seccomp_data.nr is the first word.
    let mut prog = vec![op(LD_NR, 0, 0, 0)];
    for &nr in calls {
        prog.push(op(JEQ, 0, 1, nr as u32));
        prog.push(op(RET, 0, 0, ERRNO | errno as u32));
    }
    prog.push(op(RET, 0, 0, ALLOW));
    // SAFETY: prctl with plain integers and a pointer to a filter program
    // built before the fork, which stays alive until exec.
    unsafe {
        cmd.pre_exec(move || {
            let fprog = libc::sock_fprog {
                len: prog.len() as u16,
                filter: prog.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &fprog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The kernels and policies simulated: what is refused, and how.
fn refusals() -> Vec<(&'static str, Vec<i64>, i32)> {
    vec![
        (
            "no pidfds (before 5.1)",
            vec![OPEN, SEND, GETFD],
            libc::ENOSYS,
        ),
        ("no pidfd_open (5.1, 5.2)", vec![OPEN, GETFD], libc::ENOSYS),
        (
            "a policy refusing pidfds",
            vec![OPEN, SEND, GETFD],
            libc::EPERM,
        ),
        (
            "a policy refusing pidfd_send_signal",
            vec![SEND],
            libc::EPERM,
        ),
    ]
}

/// Without the calls, lockrun either refuses with one line and 70 (and the
/// job never ran, nothing is held), or it ran the job: then `started` must
/// hold every promise. Returns true when the job ran.
fn refused_or_ran(case: &str, out: &std::process::Output, scratch: &Scratch) -> bool {
    if scratch.exists("pid") {
        return true;
    }
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{case}: stderr: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{case}: one line: {err}");
    assert!(
        err.contains("pidfd") && err.contains("no job"),
        "{case}: the line names what is missing: {err}"
    );
    false
}

#[test]
fn a_filter_that_refuses_nothing_changes_nothing() {
    // The harness itself: the same filter with no call listed, and a
    // SIGKILLed lockrun still takes its job along.
    let locks = Scratch::new();
    let scratch = Scratch::new();
    let mut cmd = lockrun();
    cmd.args(["--url", &locks.file_url(), "k9", "-c"])
        .arg(format!(
            "sleep 100 & echo $! > {bg}; echo $$ > {pid}; wait",
            bg = scratch.path("bg").display(),
            pid = scratch.path("pid").display()
        ));
    refuse(&mut cmd, &[], libc::ENOSYS);
    let mut lr = cmd.spawn().unwrap();
    let job = scratch.pid_in("pid");
    let bg = scratch.pid_in("bg");
    signal(lr.id() as i32, libc::SIGKILL);
    wait_child(&mut lr, Duration::from_secs(20));
    assert!(
        wait_until(Duration::from_secs(5), || !alive(job) && !alive(bg)),
        "the job outlived a SIGKILLed lockrun under an empty filter"
    );
}

#[test]
fn without_pidfds_a_lost_lease_never_leaves_the_job_running() {
    let redis = Redis::start();
    for (i, (case, calls, errno)) in refusals().into_iter().enumerate() {
        let scratch = Scratch::new();
        let name = format!("old{i}");
        let mut cmd = lockrun();
        cmd.args(["--url", &redis.url(), "--ttl", "3s", &name, "-c"])
            .arg(format!(
                "trap '' TERM; echo $$ > {}; sleep 100; sleep 100",
                scratch.path("pid").display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        refuse(&mut cmd, &calls, errno);
        let mut lr = cmd.spawn().unwrap();
        // Either the job starts, or lockrun ends without starting it.
        assert!(
            wait_until(Duration::from_secs(20), || scratch.exists("pid")
                || lr.try_wait().unwrap().is_some()),
            "{case}: neither started nor ended"
        );
        if scratch.exists("pid") {
            let job = scratch.pid_in("pid");
            let _: () = redis.cmd(&["DEL", &format!("lockrun:{{{name}}}")]);
            let st = wait_child(&mut lr, Duration::from_secs(20));
            assert_eq!(st.code(), Some(76), "{case}");
            assert!(!alive(job), "{case}: the job outlived its lost lease");
        } else {
            let out = lr.wait_with_output().unwrap();
            assert!(!refused_or_ran(case, &out, &scratch));
            let keys: Vec<String> = redis.cmd(&["KEYS", &format!("*{name}*")]);
            assert!(keys.is_empty(), "{case}: left behind {keys:?}");
        }
    }
}

#[test]
fn without_pidfds_a_killed_lockrun_never_leaves_the_job_running() {
    for (case, calls, errno) in refusals() {
        let locks = Scratch::new();
        let scratch = Scratch::new();
        let mut cmd = lockrun();
        cmd.args(["--url", &locks.file_url(), "k9", "-c"])
            .arg(format!(
                "sleep 100 & echo $! > {bg}; echo $$ > {pid}; wait",
                bg = scratch.path("bg").display(),
                pid = scratch.path("pid").display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        refuse(&mut cmd, &calls, errno);
        let mut lr = cmd.spawn().unwrap();
        assert!(
            wait_until(Duration::from_secs(20), || scratch.exists("bg")
                || lr.try_wait().unwrap().is_some()),
            "{case}: neither started nor ended"
        );
        if scratch.exists("bg") {
            let job = scratch.pid_in("pid");
            let bg = scratch.pid_in("bg");
            signal(lr.id() as i32, libc::SIGKILL);
            wait_child(&mut lr, Duration::from_secs(20));
            let dead = wait_until(Duration::from_secs(5), || !alive(job) && !alive(bg));
            if !dead {
                signal(job, libc::SIGKILL);
                signal(bg, libc::SIGKILL);
            }
            assert!(dead, "{case}: the job outlived a SIGKILLed lockrun");
        } else {
            let out = lr.wait_with_output().unwrap();
            assert!(!refused_or_ran(case, &out, &scratch));
            // Nothing is held: the next run takes the name at once.
            on(&locks.file_url()).args(["-n", "k9", "true"]).succeeds();
        }
    }
}

/// Without a /proc that shows lockrun as itself (none mounted, or the /proc
/// of the parent PID namespace under `unshare --pid`), lockrun could not
/// find the job's processes: no job starts, one line says why.
#[test]
fn without_its_own_proc_no_job_starts() {
    if !is_root() {
        panic!("this test makes PID and mount namespaces and needs root");
    }
    for tool in ["unshare", "umount"] {
        if Command::new(tool).arg("--version").output().is_err() {
            panic!("{tool} not found: install util-linux and mount");
        }
    }
    let locks = Scratch::new();
    let url = locks.file_url();
    let cases: [(&str, Vec<String>); 2] = [
        (
            "another namespace's /proc",
            vec!["unshare".into(), "--pid".into(), "--fork".into()],
        ),
        (
            "no /proc",
            vec![
                "unshare".into(),
                "--mount".into(),
                "--propagation".into(),
                "private".into(),
                "sh".into(),
                "-c".into(),
                "umount -l /proc && exec \"$@\"".into(),
                "sh".into(),
            ],
        ),
    ];
    for (case, wrap) in cases {
        let scratch = Scratch::new();
        let out = Command::new(&wrap[0])
            .args(&wrap[1..])
            .arg(BIN)
            .args(["--url", &url, "--ttl", "3s", "np", "-c"])
            .arg(format!("echo $$ > {}", scratch.path("pid").display()))
            .env_remove("LOCKRUN_URL")
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(!scratch.exists("pid"), "{case}: the job ran: {err}");
        assert_eq!(out.status.code(), Some(70), "{case}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{case}: {err}");
        assert!(err.contains("/proc"), "{case}: {err}");
        on(&url).args(["-n", "np", "true"]).succeeds();
    }
}
