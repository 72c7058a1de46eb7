//! How the guard stops the job itself: SIGTERM to every process not yet
//! told when it takes over, SIGKILL to everything when the time is up or
//! lockrun is gone.

use std::cell::RefCell;
use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::process::{WaitOptions, wait};

use super::{Report, job_end, send};
use crate::sys;

/// SIGTERM, with SIGCONT so that a stopped process sees it, to every
/// process of the job not yet told, once; each is frozen the moment the
/// walk finds it, so that none forks behind the walk, and told once
/// everything below it was found.
pub(super) fn stop_new(told: &mut HashSet<i32>) {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let told = RefCell::new(told);
    let fresh = RefCell::new(HashSet::new());
    sys::walk(
        me,
        |fd, p| {
            if told.borrow_mut().insert(p) {
                sys::signal_pidfd(fd, libc::SIGSTOP);
                fresh.borrow_mut().insert(p);
            }
        },
        |fd, p| {
            if fresh.borrow().contains(&p) {
                sys::signal_pidfd(fd, libc::SIGTERM);
                sys::signal_pidfd(fd, libc::SIGCONT);
            }
        },
    );
}

/// SIGKILL every descendant, again and again until none is left: lockrun
/// is gone, or asked for it (`report`: lockrun still listens for the main
/// process's end). The job's group first, in one call; then every process
/// the moment a walk finds it, so that none forks again behind the walk.
pub(super) fn kill_everything(
    group: Option<&OwnedFd>,
    main: i32,
    lock: Option<std::os::fd::RawFd>,
    mut report: Option<&mut std::fs::File>,
) -> ! {
    // Every descriptor free for the walk below, whatever limit lockrun ran
    // under; but the local lock stays held until the last process is gone,
    // the main process's pidfd is what reaches the job's group, and lockrun
    // may still be listening.
    let mut keep = [
        lock.unwrap_or(-1),
        group.map_or(-1, |f| f.as_raw_fd()),
        report.as_ref().map_or(-1, |r| r.as_raw_fd()),
    ];
    sys::close_all_but(&mut keep);
    let me = rustix::process::getpid().as_raw_nonzero().get();
    loop {
        if let Some(fd) = group {
            sys::signal_group_of(fd.as_fd(), main, libc::SIGKILL);
        }
        sys::walk(me, |fd, _| sys::signal_pidfd(fd, libc::SIGKILL), |_, _| {});
        loop {
            match wait(WaitOptions::NOHANG) {
                Ok(Some((pid, st))) => {
                    if pid.as_raw_nonzero().get() == main
                        && let (Some(out), Some(end)) = (report.as_deref_mut(), job_end(st))
                    {
                        send(out, Report::Ended(end));
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::CHILD) => sys::exit_now(0),
                _ => break,
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
