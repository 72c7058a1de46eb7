//! Settings of lockrun's own process, and fork with the child's quick exit.

use std::io;

/// One malloc arena for every thread: the few threads lockrun starts
/// (a release, a renewal, a bounded call) each do little, and a new arena
/// costs a 128 MiB reservation and fresh pages on a thread's first
/// allocation, measured at about a third of a millisecond per run.
#[cfg_attr(test, allow(dead_code))] // called from the C entry point only
pub fn one_malloc_arena() {
    // SAFETY: mallopt only sets a tunable; called before any thread exists.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
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

/// Become the reaper of our descendants' orphans.
pub fn set_subreaper() -> io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    Ok(())
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
