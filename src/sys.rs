//! The system calls the supervisor needs that Rust's std does not wrap: signal
//! dispositions, process groups and descendants, the terminal, fork. Every
//! `unsafe` block of the supervisor lives here (and in `spawn`).

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};

/// One malloc arena for every thread: the few threads lockrun starts
/// (a release, a renewal, a bounded call) each do little, and a new arena
/// costs a 128 MiB reservation and fresh pages on a thread's first
/// allocation, measured at about a third of a millisecond per run.
#[cfg_attr(test, allow(dead_code))] // called from the C entry point only
pub fn one_malloc_arena() {
    // SAFETY: mallopt only sets a tunable; called before any thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

/// Make sure descriptors 0–2 are open before lockrun opens anything of its
/// own: a closed one would otherwise be reused by a lock file or a socket, and
/// the job's output (or lockrun's log lines) would land in it.
#[cfg_attr(test, allow(dead_code))] // called from the C entry point only
pub fn open_std_fds() {
    for fd in 0..=2 {
        // SAFETY: fcntl on a descriptor number; open of a constant C string.
        unsafe {
            if libc::fcntl(fd, libc::F_GETFD) == -1 {
                // The lowest free number is `fd`, since the lower ones are open.
                let opened = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if opened >= 0 && opened != fd {
                    libc::dup2(opened, fd);
                    libc::close(opened);
                }
            }
        }
    }
}

/// Keep other processes of the same user (the job among them) from reading
/// lockrun's memory, `/proc/PID/environ` or `/proc/PID/fd` (or let them again).
pub fn set_dumpable(on: bool) {
    use rustix::process::{DumpableBehavior, set_dumpable_behavior};
    let _ = set_dumpable_behavior(if on {
        DumpableBehavior::Dumpable
    } else {
        DumpableBehavior::NotDumpable
    });
}

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
fn signal_group(pgid: i32, sig: i32) {
    if pgid > 1
        && let (Some(p), Some(s)) = (
            rustix::process::Pid::from_raw(pgid),
            rustix::process::Signal::from_named_raw(sig),
        )
    {
        let _ = rustix::process::kill_process_group(p, s);
    }
}

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

/// Become the reaper of our descendants' orphans.
pub fn set_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    Ok(())
}

/// What a walk of the job's processes found.
pub struct Walked {
    /// Every process found, in the order found.
    pub pids: Vec<i32>,
    /// False when some part could not be read for want of a descriptor (or
    /// memory): processes may have been missed.
    pub complete: bool,
}

/// Every descendant of `root` (not `root` itself), whatever group or session
/// it moved to, found through the kernel's per-thread children lists.
///
/// Each process is held by a pidfd from the moment it is found, and taken as
/// found only when its parent, still alive, is the process whose list named
/// it: a pid that was recycled meanwhile never is. `found` gets the pidfd
/// (to signal exactly that process) before the process's own children are
/// read, so one stopped or killed there cannot fork behind the walk; `done`
/// gets it once everything below it has been walked (so a process frozen by
/// `found` stays frozen, its children in place, until then). A
/// process forking or dying meanwhile may be missed: callers walk again.
/// `root` must be a process that cannot be recycled under the caller (the
/// caller itself, or its unreaped child).
pub fn walk(
    root: i32,
    mut found: impl FnMut(BorrowedFd<'_>, i32),
    mut done: impl FnMut(BorrowedFd<'_>, i32),
) -> Walked {
    let mut w = Walked {
        pids: Vec::new(),
        complete: true,
    };
    let mut seen = HashSet::new();
    // Depth first, one pidfd per level of the path being walked.
    let mut stack: Vec<(i32, Option<OwnedFd>, std::vec::IntoIter<i32>)> = Vec::new();
    let kids = children(root, true, &mut w.complete);
    stack.push((root, None, kids.into_iter()));
    while let Some((parent, parent_fd, kids)) = stack.last_mut() {
        let Some(c) = kids.next() else {
            if let Some((p, Some(fd), _)) = stack.pop() {
                done(fd.as_fd(), p);
            }
            continue;
        };
        let (parent, parent_fd) = (*parent, parent_fd.as_ref().map(|f| f.as_fd()));
        if c <= 1 || seen.contains(&c) {
            continue;
        }
        let fd = match pidfd_checked(c) {
            Ok(Some(fd)) => fd,
            Ok(None) => continue,
            Err(()) => {
                w.complete = false;
                continue;
            }
        };
        // `c` is the child the list named only if its parent is still that
        // parent, alive (so its number is its own), and the pidfd's process
        // is the one /proc showed (alive after the look).
        // The parent of the pidfd's process, or (on kernels without
        // PIDFD_GET_INFO) of whatever /proc shows, which must then still be
        // the pidfd's process after the look.
        let ppid = match parent_by_pidfd(fd.as_fd()) {
            Some(p) => Some(p),
            None => parent_of(c, &mut w.complete).filter(|_| !exited(fd.as_fd())),
        };
        if ppid != Some(parent) || parent_fd.is_some_and(exited) {
            continue;
        }
        seen.insert(c);
        w.pids.push(c);
        found(fd.as_fd(), c);
        let grandkids = children(c, false, &mut w.complete);
        // A list read after its process ended may belong to another.
        let grandkids = if exited(fd.as_fd()) {
            Vec::new()
        } else {
            grandkids
        };
        stack.push((c, Some(fd), grandkids.into_iter()));
    }
    w
}

/// The pids in `p`'s children lists, one per thread. The root of a walk
/// cannot be gone: if its list cannot be read, /proc shows the walk
/// nothing, which is not "nothing is left".
fn children(p: i32, root: bool, complete: &mut bool) -> Vec<i32> {
    let mut out = Vec::new();
    let tasks = match std::fs::read_dir(format!("/proc/{p}/task")) {
        Ok(t) => t,
        Err(e) => {
            if root {
                *complete = false;
            }
            note(&e, complete);
            return out;
        }
    };
    for t in tasks {
        let path = match t {
            Ok(t) => t.path().join("children"),
            Err(e) => {
                note(&e, complete);
                continue;
            }
        };
        match read_proc(&path) {
            Ok(s) => out.extend(s.split_whitespace().filter_map(|c| c.parse::<i32>().ok())),
            Err(e) => note(&e, complete),
        }
    }
    out
}

/// The parent pid of the process of `pidfd`, asked of the kernel through
/// the pidfd itself (PIDFD_GET_INFO, Linux 6.13 and later).
fn parent_by_pidfd(pidfd: BorrowedFd<'_>) -> Option<i32> {
    use std::os::fd::AsRawFd;
    // struct pidfd_info, its first version (PIDFD_INFO_SIZE_VER0): a mask,
    // the cgroup id, then pid, tgid, ppid, the eight ids and the exit code;
    // 64 bytes in all, as the request below says.
    #[repr(C)]
    struct PidfdInfo {
        mask: u64,
        cgroupid: u64,
        pid: u32,
        tgid: u32,
        ppid: u32,
        rest: [u32; 9],
    }
    const SIZE: usize = std::mem::size_of::<PidfdInfo>();
    const _: () = assert!(SIZE == 64);
    const PIDFD_INFO_PID: u64 = 1;
    // _IOWR(0xFF, 11, struct pidfd_info): direction 3, the size, type, number.
    const PIDFD_GET_INFO: libc::c_ulong =
        (3 << 30) | ((SIZE as libc::c_ulong) << 16) | (0xFF << 8) | 11;
    let mut info = PidfdInfo {
        mask: PIDFD_INFO_PID,
        cgroupid: 0,
        pid: 0,
        tgid: 0,
        ppid: 0,
        rest: [0; 9],
    };
    // SAFETY: the kernel writes at most the size encoded in the request,
    // which is exactly size_of::<PidfdInfo>(), into our local.
    let r = unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_INFO, &mut info) };
    (r == 0 && info.mask & PIDFD_INFO_PID != 0).then_some(info.ppid as i32)
}

/// The parent pid of `pid`, from /proc.
fn parent_of(pid: i32, complete: &mut bool) -> Option<i32> {
    match read_proc(std::path::Path::new(&format!("/proc/{pid}/stat"))) {
        Ok(stat) => stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok(),
        Err(e) => {
            note(&e, complete);
            None
        }
    }
}

/// A /proc file's text, read without the size query std's helpers make
/// (/proc files have none).
fn read_proc(path: &std::path::Path) -> io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = Vec::with_capacity(512);
    f.read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A failure to read that is not "that process is gone" means the walk may
/// have missed something.
fn note(e: &io::Error, complete: &mut bool) {
    if !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) {
        *complete = false;
    }
}

/// A pidfd of `pid`: Ok(None) if it is gone, Err if none could be had.
fn pidfd_checked(pid: i32) -> Result<Option<OwnedFd>, ()> {
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        return Ok(None);
    };
    match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::SRCH) | Err(rustix::io::Errno::INVAL) => Ok(None),
        Err(_) => Err(()),
    }
}

/// The process of `pidfd` has exited (its pidfd is readable).
pub fn exited(pidfd: BorrowedFd<'_>) -> bool {
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

/// The result of `fork`.
pub enum Forked {
    Child,
    Parent(i32),
}

/// fork(2). glibc's fork keeps malloc usable in the child even when other
/// threads exist.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: fork has no memory-safety preconditions. Other threads may be
    // alive (an engine's watch or probe that has not yet ended); the child
    // copies none of them, so it must not wait on a lock one of them held.
    // The only lock the guard takes is malloc's, which the C library makes
    // safe in the child of fork (glibc and musl take it around the fork and
    // reset it in the child); it prints nothing and reads no environment.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// End a forked child at once, without running lockrun's exit-time code.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit ends the process; nothing is left to be unsafe.
    unsafe { libc::_exit(code) }
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

/// Close every descriptor from 3 up except those in `keep` (sorted here, in
/// place: no allocation, as after a fork). One close_range per gap.
pub fn close_all_but(keep: &mut [RawFd]) {
    keep.sort_unstable();
    let mut first: RawFd = 3;
    for &k in keep.iter() {
        if k >= first {
            if k > first {
                close_range(first, k - 1);
            }
            first = k + 1;
        }
    }
    close_range(first, RawFd::MAX);
}

fn close_range(first: RawFd, last: RawFd) {
    // SAFETY: close_range takes plain integers; the caller owns no Rust
    // object that uses these descriptors again.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            last as libc::c_uint,
            0,
        )
    };
    if r != 0 {
        for fd in first..=last.min(1023) {
            // SAFETY: as above, on kernels without close_range.
            unsafe { libc::close(fd) };
        }
    }
}
