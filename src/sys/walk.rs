//! Finding every process of the job through /proc, each held by a pidfd.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::pidfds::exited;

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
