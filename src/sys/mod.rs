//! The system calls the supervisor needs that Rust's std does not wrap: signal
//! dispositions, process groups and descendants, the terminal, fork. Every
//! `unsafe` block of the supervisor lives here (and in `spawn`).

mod fds;
mod pidfds;
mod process;
mod signals;
mod terminal;
mod walk;

pub use fds::close_all_but;
#[cfg_attr(test, allow(unused_imports))] // called from the C entry point only
pub use fds::open_std_fds;
pub use pidfds::{
    check_pidfds, leads_group, own_pidfd, pidfd, pidfd_of_child, signal_group_of, signal_led_group,
    signal_pidfd,
};
#[cfg_attr(test, allow(unused_imports))] // called from the C entry point only
pub use process::one_malloc_arena;
pub use process::{Forked, exit_now, fork, set_dumpable, set_subreaper};
pub use signals::{
    block_all, ignore_sigpipe, is_ignored, read_signals, set_mask, signal_fd, signal_pid, unblock,
};
pub use terminal::{at_terminal, stop_like};
pub use walk::{Walked, walk};
