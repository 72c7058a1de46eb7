//! The controlling terminal and its job control.

use std::os::fd::RawFd;

/// Stop lockrun with the signal that stopped its terminal's foreground group,
/// so the calling shell reports what it would without lockrun (as sudo does).
/// Our handler is set aside for the moment and restored once we are continued.
pub fn stop_like(sig: i32) {
    // SAFETY: sigaction on local structs; raise on ourselves.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        let mut saved: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        let swapped = libc::sigaction(sig, &dfl, &mut saved) == 0;
        libc::raise(if swapped { sig } else { libc::SIGSTOP });
        if swapped {
            libc::sigaction(sig, &saved, std::ptr::null_mut());
        }
    }
}

/// lockrun runs in the foreground of its controlling terminal (or leads a job
/// of a job-control shell there): the job then stays in lockrun's process group,
/// so the terminal's keys reach it, the calling shell and the other members of
/// a pipeline together, as they would without lockrun.
pub fn at_terminal() -> bool {
    // SAFETY: plain queries on descriptor numbers and our own ids.
    unsafe {
        let ours = libc::getpgrp();
        let session = libc::getsid(0);
        (0..=2).any(|fd: RawFd| {
            let fg = libc::tcgetpgrp(fd);
            fg > 0 && libc::tcgetsid(fd) == session && (fg == ours || ours == libc::getpid())
        })
    }
}
