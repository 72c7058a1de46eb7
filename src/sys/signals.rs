//! Signal dispositions and masks, signals sent by number, and signalfd.

use std::io;
use std::os::fd::BorrowedFd;

/// Whether `sig` is ignored right now (a query, no change).
pub fn is_ignored(sig: i32) -> bool {
    // SAFETY: a query only (no new action); `old` is a local.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Set the disposition of SIGPIPE to "ignore"; returns whether it was ignored before.
#[cfg_attr(test, allow(dead_code))]
pub fn ignore_sigpipe() -> bool {
    // SAFETY: replacing a signal disposition; called before any thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) == libc::SIG_IGN }
}

/// Unblock these signals in the calling thread (a signal blocked when lockrun
/// started could never be forwarded).
pub fn unblock(sigs: &[i32]) {
    // SAFETY: sigset manipulation on a local; changes only this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Block every signal in the calling thread; returns the previous mask.
pub fn block_all() -> libc::sigset_t {
    // SAFETY: sigset manipulation on locals.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    }
}

pub fn set_mask(mask: &libc::sigset_t) {
    // SAFETY: restores a mask obtained from `block_all`.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

/// Send `sig` to a process, never to pid ≤ 1 (which would mean "everyone").
pub fn signal_pid(pid: i32, sig: i32) {
    if pid > 1
        && let (Some(p), Some(s)) = (
            rustix::process::Pid::from_raw(pid),
            rustix::process::Signal::from_named_raw(sig),
        )
    {
        let _ = rustix::process::kill_process(p, s);
    }
}

/// Send `sig` to a process group, never to pgid ≤ 1.
pub(super) fn signal_group(pgid: i32, sig: i32) {
    if pgid > 1
        && let (Some(p), Some(s)) = (
            rustix::process::Pid::from_raw(pgid),
            rustix::process::Signal::from_named_raw(sig),
        )
    {
        let _ = rustix::process::kill_process_group(p, s);
    }
}

/// A descriptor that reports `sigs` (blocked by the caller) as readable.
pub fn signal_fd(sigs: &[i32]) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: sigset on a local; signalfd returns a new descriptor we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(std::os::fd::OwnedFd::from_raw_fd(fd))
    }
}

/// The signals waiting on a `signal_fd`, as (signal, sender's pid).
pub fn read_signals(fd: BorrowedFd<'_>) -> Vec<(i32, i32)> {
    let mut out = Vec::new();
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    while rustix::io::read(fd, &mut info).is_ok_and(|n| n == info.len()) {
        // SAFETY: the kernel wrote one whole signalfd_siginfo; read_unaligned
        // copies it out of the byte buffer.
        let si: libc::signalfd_siginfo = unsafe { std::ptr::read_unaligned(info.as_ptr().cast()) };
        out.push((si.ssi_signo as i32, si.ssi_pid as i32));
    }
    out
}
