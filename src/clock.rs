//! The clock every lease time is on: CLOCK_BOOTTIME, which keeps counting
//! through suspend; a timer on it that polls with other descriptors; jitter.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, clock_gettime,
    timerfd_create, timerfd_settime,
};

/// A point on CLOCK_BOOTTIME, as the time since boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Boot(pub Duration);

impl Boot {
    pub fn now() -> Boot {
        let ts = clock_gettime(ClockId::Boottime);
        Boot(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }
    /// `self + d`, saturating (durations are bounded far below overflow).
    pub fn add(self, d: Duration) -> Boot {
        Boot(self.0.saturating_add(d))
    }
    /// `self - d`, clamped at boot.
    pub fn sub(self, d: Duration) -> Boot {
        Boot(self.0.saturating_sub(d))
    }
    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Boot) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
    pub fn nanos(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }
    pub fn from_nanos(n: u64) -> Boot {
        Boot(Duration::from_nanos(n))
    }
}

/// A timer on CLOCK_BOOTTIME that can be waited on together with other descriptors.
pub struct BootTimer(OwnedFd);

impl BootTimer {
    pub fn new() -> std::io::Result<BootTimer> {
        let fd = timerfd_create(
            TimerfdClockId::Boottime,
            TimerfdFlags::CLOEXEC | TimerfdFlags::NONBLOCK,
        )?;
        Ok(BootTimer(fd))
    }

    /// Arm for an absolute boot time (an instant in the past fires at once).
    pub fn arm(&self, at: Boot) -> std::io::Result<()> {
        // A zero it_value would disarm the timer; the earliest instant is 1 ns.
        let value = if at.0.is_zero() {
            Duration::from_nanos(1)
        } else {
            at.0
        };
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: value.as_secs() as i64,
                tv_nsec: value.subsec_nanos() as i64,
            },
        };
        timerfd_settime(&self.0, TimerfdTimerFlags::ABSTIME, &spec)?;
        Ok(())
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A uniformly random duration in [0, max) ("full jitter").
pub fn jitter(max: Duration) -> Duration {
    let mut b = [0u8; 8];
    let n = match rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()) {
        Ok(_) => u64::from_ne_bytes(b),
        Err(_) => Boot::now().nanos(),
    };
    let max_ns = max.as_nanos().max(1) as u64;
    Duration::from_nanos(n % max_ns)
}

/// Jittered exponential backoff after `failures` failures in a row: below
/// `base` × 2^failures, never above `cap`.
pub fn backoff(failures: u32, base: Duration, cap: Duration) -> Duration {
    jitter(base.saturating_mul(1 << failures.min(16)).min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_moves_forward() {
        let a = Boot::now();
        let b = Boot::now();
        assert!(b >= a);
    }

    #[test]
    fn jitter_stays_below_its_bound() {
        for _ in 0..100 {
            assert!(jitter(Duration::from_millis(5)) < Duration::from_millis(5));
        }
    }

    #[test]
    fn backoff_grows_and_stays_capped() {
        let ms = Duration::from_millis;
        for _ in 0..100 {
            assert!(backoff(1, ms(10), ms(500)) < ms(20));
            assert!(backoff(40, ms(10), ms(500)) < ms(500));
        }
    }
}
