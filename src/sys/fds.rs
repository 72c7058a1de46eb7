//! Descriptors: the standard three kept open, the rest closed after a fork.

use std::os::fd::RawFd;

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
