//! What wakes the supervisor's loop, and its sleep between two turns.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags, poll};
use signal_hook::iterator::backend::SignalDelivery;
use signal_hook::iterator::exfiltrator::WithRawSiginfo;

use crate::clock::{Boot, BootTimer};
use crate::exit::{Class, Failure, ResultExt};
use crate::sys;

/// What wakes the supervisor's loop: the signals it catches, the watchdog's
/// wake-up socket, and a timer on the boot clock.
pub(super) struct Wakeups {
    pub(super) signals: SignalDelivery<UnixStream, WithRawSiginfo>,
    wake_rx: UnixStream,
    pub(super) wake_tx: UnixStream,
    timer: BootTimer,
}

impl Wakeups {
    /// Catch `caught` from here on (then call `caught_here`), and make the
    /// wake-up socket and the timer.
    pub(super) fn new(caught: &[i32], caught_here: impl FnOnce()) -> Result<Wakeups, Failure> {
        sys::unblock(caught);
        let (sig_rx, sig_tx) = UnixStream::pair().exit_as(Class::Internal)?;
        let signals = SignalDelivery::with_pipe(sig_rx, sig_tx, WithRawSiginfo, caught)
            .exit_as(Class::Internal)?;
        caught_here();
        let (wake_rx, wake_tx) = UnixStream::pair().exit_as(Class::Internal)?;
        wake_rx.set_nonblocking(true).exit_as(Class::Internal)?;
        wake_tx.set_nonblocking(true).exit_as(Class::Internal)?;
        let timer = BootTimer::new().exit_as(Class::Internal)?;
        Ok(Wakeups {
            signals,
            wake_rx,
            wake_tx,
            timer,
        })
    }

    /// Sleep until one of these, or one of `more`, is readable, or the boot
    /// clock reaches `next`.
    pub(super) fn sleep(&self, more: &[BorrowedFd<'_>], next: Option<Boot>) {
        let mut fds = vec![self.signals.get_read().as_fd(), self.wake_rx.as_fd()];
        fds.extend_from_slice(more);
        wait(&fds, &self.timer, next);
        drain(&self.wake_rx);
    }
}

/// `fd` has something to read (or hung up), without waiting.
pub(super) fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut p = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    matches!(poll(&mut p, Some(&rustix::time::Timespec::default())), Ok(n) if n > 0)
}

fn drain(wake: &UnixStream) {
    use std::io::Read;
    let mut buf = [0u8; 64];
    let mut w = wake;
    while w.read(&mut buf).is_ok_and(|n| n > 0) {}
}

/// Sleep until one of `fds` is readable or the boot clock reaches `at`.
fn wait(fds: &[BorrowedFd<'_>], timer: &BootTimer, at: Option<Boot>) {
    let mut polled: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::from_borrowed_fd(*fd, PollFlags::IN))
        .collect();
    let mut fallback = None;
    if let Some(at) = at {
        if timer.arm(at).is_ok() {
            polled.push(PollFd::from_borrowed_fd(timer.fd(), PollFlags::IN));
        } else {
            // Without a timer, look again soon so deadlines are still checked.
            fallback = Some(rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 10_000_000,
            });
        }
    }
    let _ = poll(&mut polled, fallback.as_ref());
    // Reading the timer resets it; a fired timer is otherwise level-triggered.
    let mut buf = [0u8; 8];
    let _ = rustix::io::read(timer.fd(), &mut buf);
}
