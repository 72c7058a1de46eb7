//! Pidfds: lockrun's check that it has them, opening them, and signals
//! sent through them to exactly one process or group.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::signals::signal_group;

/// The process of `pidfd` has exited (its pidfd is readable).
pub(super) fn exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::from_borrowed_fd(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).is_ok_and(|n| n > 0)
}

/// lockrun's own pidfd, opened by `check_pidfds` before the job starts and
/// inherited by the guard, which learns of lockrun's death through it.
static OWN_PIDFD: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();

/// Check, before anything is taken, that lockrun can find and stop every
/// process of a job here. Every signal to the job and the guard's watch on
/// lockrun go through pidfds (a pid alone could name a recycled process),
/// and the job's processes are found through /proc, which must show this
/// process as itself. A kernel without pidfds (before Linux 5.3), a sandbox
/// that refuses them, no /proc, or the /proc of another PID namespace gets
/// one line saying what is missing: lockrun runs no job it could not stop.
pub fn check_pidfds() -> Result<(), String> {
    let me = rustix::process::getpid();
    // /proc/self names this process as /proc's namespace numbers it: under
    // `unshare --pid` without a /proc of its own, another number.
    let shown = rustix::fs::readlink("/proc/self", Vec::new())
        .ok()
        .and_then(|l| l.into_string().ok());
    let own = me.as_raw_nonzero().get().to_string();
    if shown.as_deref() != Some(own.as_str()) {
        return Err(format!(
            "/proc does not show this process as pid {own} (/proc is not mounted, or belongs \
             to another PID namespace: mount one for this namespace): without it lockrun \
             cannot find every process of a job, and it runs no job it could not stop"
        ));
    }
    let fd = rustix::process::pidfd_open(me, rustix::process::PidfdFlags::empty())
        .map_err(|e| pidfds_missing("pidfd_open", e))?;
    // Signal 0 checks that a signal could be sent, and sends none.
    // SAFETY: pidfd_send_signal with a null siginfo; no memory is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r != 0 {
        return Err(pidfds_missing(
            "pidfd_send_signal",
            rustix::io::Errno::from_io_error(&io::Error::last_os_error())
                .unwrap_or(rustix::io::Errno::NOSYS),
        ));
    }
    let _ = OWN_PIDFD.set(fd);
    Ok(())
}

/// lockrun's own pidfd, when `check_pidfds` opened one.
pub fn own_pidfd() -> Option<BorrowedFd<'static>> {
    OWN_PIDFD.get().map(|f| f.as_fd())
}

fn pidfds_missing(call: &str, e: rustix::io::Errno) -> String {
    let why = match e {
        rustix::io::Errno::NOSYS => {
            let uname = rustix::system::uname();
            format!(
                "this kernel (Linux {}) has no {call}; lockrun needs Linux 5.3 or later",
                uname.release().to_string_lossy()
            )
        }
        rustix::io::Errno::PERM | rustix::io::Errno::ACCESS => format!(
            "{call} is refused here (a seccomp policy or sandbox; Docker's default \
             profile before 20.10 refused it); allow pidfd_open and pidfd_send_signal"
        ),
        e => format!("{call} failed: {e}"),
    };
    format!(
        "{why}: without pidfds lockrun cannot stop every process of a job, and it runs no job it could not stop"
    )
}

/// Send `sig` to exactly the process of `pidfd` (nothing if it is gone).
pub fn signal_pidfd(pidfd: BorrowedFd<'_>, sig: i32) {
    // SAFETY: pidfd_send_signal with a null siginfo; no memory is passed.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// A descriptor that becomes readable when process `pid` exits (None where
/// the kernel has no pidfds). Only meaningful for a pid that cannot have been
/// recycled: our parent (checked after opening) or a child not yet reaped.
pub fn pidfd(pid: i32) -> Option<std::os::fd::OwnedFd> {
    let pid = rustix::process::Pid::from_raw(pid)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// A pidfd of `pid`, a child of `parent` (the guard's child, the job's main
/// process, seen from lockrun). The pid is checked after the pidfd is open:
/// if it had been recycled meanwhile, the new process's parent would not be
/// `parent`, which starts nothing but the job.
pub fn pidfd_of_child(pid: i32, parent: i32) -> Option<std::os::fd::OwnedFd> {
    let fd = pidfd(pid)?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ppid: i32 = stat
        .rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    (ppid == parent).then_some(fd)
}

/// Send `sig` to the group led by the process of `pidfd`, if it has one
/// (Linux 6.9 and later; nothing on older kernels).
pub fn signal_led_group(pidfd: std::os::fd::BorrowedFd<'_>, sig: i32) {
    pidfd_group_signal(pidfd, sig);
}

/// Whether the process of `pidfd` leads a process group that has members
/// (false on kernels before 6.9, which cannot tell through a pidfd).
pub fn leads_group(pidfd: std::os::fd::BorrowedFd<'_>) -> bool {
    pidfd_group_signal(pidfd, 0) == 0
}

const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 4;

fn pidfd_group_signal(pidfd: std::os::fd::BorrowedFd<'_>, sig: i32) -> libc::c_long {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with a null siginfo; no memory is passed.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            PIDFD_SIGNAL_PROCESS_GROUP,
        )
    }
}

/// Send `sig` to the process group whose leader `pidfd` refers to (the
/// job's main process), and only to it: the kernel resolves the group by the
/// pidfd's process, not by number, so a group that reused the number after
/// the original one emptied is never reached (Linux 6.9 and later). On older
/// kernels, the group is signalled by number only while its leader still runs
/// (its pid taken, the number cannot have been reused).
pub fn signal_group_of(pidfd: std::os::fd::BorrowedFd<'_>, pgid: i32, sig: i32) {
    let r = pidfd_group_signal(pidfd, sig);
    if r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return;
    }
    let mut fds = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if rustix::event::poll(&mut fds, Some(&zero)) == Ok(0) {
        signal_group(pgid, sig);
    }
}
