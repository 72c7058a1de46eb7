//! Lease timing and the watchdog that renews a lease in the background.
//! Every lease time is on CLOCK_BOOTTIME, which keeps counting through suspend.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, poll};
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
    fn nanos(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }
    fn from_nanos(n: u64) -> Boot {
        Boot(Duration::from_nanos(n))
    }
}

/// The lease schedule of README "Lease timing", derived from the ttl and the kill grace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub ttl: Duration,
    /// SIGTERM → SIGKILL grace (`--kill-after`).
    pub grace: Duration,
    /// Timeout of one backend request.
    pub op: Duration,
    /// Margin between the job's death and the lease's end on the server.
    pub slack: Duration,
    /// Allowance for clock rate differences between us and the server.
    pub drift: Duration,
    pub renew_every: Duration,
}

impl Timing {
    fn derive(ttl: Duration, kill_after: Option<Duration>) -> Timing {
        Timing {
            ttl,
            grace: kill_after.unwrap_or(ttl / 10),
            op: (ttl / 6).min(Duration::from_secs(2)),
            slack: (ttl / 20).max(Duration::from_millis(50)),
            drift: ttl / 100 + Duration::from_millis(2),
            renew_every: ttl / 3,
        }
    }

    fn fits(&self) -> bool {
        !self.ttl.is_zero()
            && self.renew_every + self.op + self.grace + self.slack + self.drift <= self.ttl
    }

    /// Validate a ttl and kill grace; the error names the smallest ttl that works.
    pub fn new(ttl: Duration, kill_after: Option<Duration>) -> Result<Timing, String> {
        let t = Timing::derive(ttl, kill_after);
        if t.fits() {
            return Ok(t);
        }
        let min = Timing::min_ttl(kill_after);
        let grace = match kill_after {
            Some(g) => format!("--kill-after {}", humantime::format_duration(g)),
            None => "the default --kill-after of ttl/10".to_string(),
        };
        Err(format!(
            "--ttl {} is too short to renew and stop the job in time with {grace}; \
             the smallest ttl that works is {}",
            humantime::format_duration(ttl),
            humantime::format_duration(min)
        ))
    }

    /// Smallest whole-millisecond ttl whose schedule fits (the check is monotone in ttl).
    pub fn min_ttl(kill_after: Option<Duration>) -> Duration {
        Timing::smallest_ttl(kill_after, Timing::fits)
    }

    /// Smallest ttl, with this schedule's kill grace, that can stop a job
    /// whose kill takes `cost` before its lease ends (README "How lockrun
    /// treats your job").
    pub fn ttl_for_kill(&self, cost: Duration) -> Duration {
        let kill_after = (self.grace != self.ttl / 10).then_some(self.grace);
        let ms = Timing::smallest_ttl(kill_after, |t| t.fits() && t.kill_fits(cost));
        Duration::from_secs(ms.as_millis().div_ceil(1000) as u64)
    }

    /// Whether a kill that takes `cost` still ends `slack` before the lease.
    pub fn kill_fits(&self, cost: Duration) -> bool {
        self.spare() + self.grace >= cost
    }

    fn smallest_ttl(kill_after: Option<Duration>, ok: impl Fn(&Timing) -> bool) -> Duration {
        let ok = |ms: u64| ok(&Timing::derive(Duration::from_millis(ms), kill_after));
        let (mut lo, mut hi) = (1u64, 1000u64);
        while !ok(hi) {
            hi *= 2;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if ok(mid) { hi = mid } else { lo = mid + 1 }
        }
        Duration::from_millis(hi)
    }

    /// Time the schedule leaves over within a ttl (zero at the smallest
    /// valid ttl): what the kill may start earlier without cutting into the
    /// renewals' retries.
    pub fn spare(&self) -> Duration {
        self.ttl
            .saturating_sub(self.renew_every + self.op + self.grace + self.slack + self.drift)
    }

    /// When the job must start being stopped if no renewal succeeded.
    pub fn lost_at(&self, deadline: Boot) -> Boot {
        deadline.sub(self.grace + self.slack)
    }

    /// Last moment a renewal attempt may start and still finish before `lost_at`.
    fn last_attempt(&self, deadline: Boot) -> Boot {
        self.lost_at(deadline).sub(self.op)
    }

    /// Local expiry estimate from the moment the granting request was sent.
    pub fn deadline_from(&self, sent_at: Boot) -> Boot {
        sent_at.add(self.ttl).sub(self.drift)
    }
}

/// One backend lease as the watchdog sees it: renew, or learn it is gone.
pub trait Renewer: Send {
    /// Ok(true): renewed for a full ttl; Ok(false): the lease is not ours any more.
    fn renew(&mut self) -> anyhow::Result<bool>;
    /// A renewer for the same lease with no connection yet, used when an
    /// attempt had to be abandoned (it may still be stuck somewhere).
    fn fresh(&self) -> Box<dyn Renewer>;
}

/// The lease deadline, shared between the watchdog (writer) and the supervisor.
#[derive(Debug)]
pub struct Deadline(AtomicU64);

impl Deadline {
    pub fn new(at: Boot) -> Deadline {
        Deadline(AtomicU64::new(at.nanos()))
    }
    pub fn get(&self) -> Boot {
        Boot::from_nanos(self.0.load(Ordering::SeqCst))
    }
    fn set(&self, at: Boot) {
        self.0.store(at.nanos(), Ordering::SeqCst);
    }
}

/// What the watchdog tells the supervisor.
#[derive(Debug)]
pub enum Event {
    Renewed {
        took: Duration,
    },
    Retrying {
        error: String,
    },
    /// Final: the supervisor must stop the job.
    Lost {
        reason: String,
    },
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

/// Wait until `at` on the boot clock or until `stop` becomes readable or hung up.
/// Returns true when asked to stop.
fn wait_until(timer: &BootTimer, stop: BorrowedFd<'_>, at: Boot) -> bool {
    if timer.arm(at).is_err() {
        // Without a timer we cannot wait safely; stopping early is the safe side.
        return true;
    }
    loop {
        if Boot::now() >= at {
            return false;
        }
        let mut fds = [
            PollFd::from_borrowed_fd(stop, PollFlags::IN),
            PollFd::from_borrowed_fd(timer.fd(), PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {
                if !fds[0].revents().is_empty() {
                    return true;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
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

/// The running watchdog. Stopping it never waits for it: a renewal in
/// flight may be stuck in name resolution or a trickling reply.
pub struct Watchdog {
    stop: Option<OwnedFd>,
}

impl Watchdog {
    /// Start renewing now (the first renewal is due). `deadline` is None for a
    /// lease that cannot expire (it is only checked, never extended).
    pub fn spawn(
        renewer: Box<dyn Renewer>,
        timing: Timing,
        deadline: Option<Arc<Deadline>>,
        events: Sender<Event>,
        wake: UnixStream,
    ) -> std::io::Result<Watchdog> {
        let (stop_rx, stop_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let timer = BootTimer::new()?;
        std::thread::Builder::new()
            .name("lockrun-watchdog".into())
            .spawn(move || {
                let mut wake = wake;
                let mut send = |ev: Event| {
                    let _ = events.send(ev);
                    // Non-blocking: a full wake socket already means "look".
                    let _ = wake.write(&[1]);
                };
                renew_loop(
                    renewer,
                    &timing,
                    deadline.as_deref(),
                    &timer,
                    stop_rx.as_fd(),
                    &mut send,
                );
            })?;
        Ok(Watchdog {
            stop: Some(stop_tx),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // The thread sees the pipe close and ends after its current attempt;
        // nobody waits for that.
        self.stop.take();
    }
}

/// How one renewal attempt ended.
enum Attempt {
    Done(anyhow::Result<bool>),
    /// It did not finish within its bound; it was left to finish on its own.
    Abandoned,
}

/// One whole renewal attempt (name resolution, connect, handshake, script
/// reload, call) on a thread of its own, waited for at most `limit`.
fn attempt(
    slot: &mut Option<Box<dyn Renewer>>,
    template: &dyn Renewer,
    limit: Duration,
) -> Attempt {
    let mut renewer = slot.take().unwrap_or_else(|| template.fresh());
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("lockrun-renew".into())
        .spawn(move || {
            let r = renewer.renew();
            let _ = tx.send((r, renewer));
        });
    if let Err(e) = spawned {
        return Attempt::Done(Err(anyhow::anyhow!("cannot start a thread: {e}")));
    }
    match rx.recv_timeout(limit) {
        Ok((r, renewer)) => {
            *slot = Some(renewer);
            Attempt::Done(r)
        }
        Err(_) => Attempt::Abandoned,
    }
}

fn renew_loop(
    renewer: Box<dyn Renewer>,
    timing: &Timing,
    deadline: Option<&Deadline>,
    timer: &BootTimer,
    stop: BorrowedFd<'_>,
    send: &mut dyn FnMut(Event),
) {
    let template = renewer.fresh();
    let mut slot = Some(renewer);
    let mut failures: u32 = 0;
    loop {
        let current = deadline.map(Deadline::get);
        let now = Boot::now();
        if let Some(c) = current
            && now > timing.last_attempt(c)
        {
            send(Event::Lost {
                reason: "could not renew the lease in time".into(),
            });
            return;
        }
        let limit = match current {
            Some(c) => timing.op.min(timing.lost_at(c).since(now)),
            None => timing.op,
        };
        let sent_at = Boot::now();
        let error = match attempt(&mut slot, &*template, limit) {
            Attempt::Done(Ok(true)) => {
                failures = 0;
                // A late success cannot undo "lost": the supervisor also checks
                // the deadline it had, and lost is final there.
                if let Some(d) = deadline {
                    d.set(timing.deadline_from(sent_at));
                }
                send(Event::Renewed {
                    took: Boot::now().since(sent_at),
                });
                if wait_until(timer, stop, sent_at.add(timing.renew_every)) {
                    return;
                }
                continue;
            }
            Attempt::Done(Ok(false)) => {
                send(Event::Lost {
                    reason: "the lease is no longer ours (deleted, expired or taken over)".into(),
                });
                return;
            }
            Attempt::Done(Err(e)) => format!("{e:#}"),
            Attempt::Abandoned => format!(
                "no answer within {}",
                humantime::format_duration(Duration::from_millis(limit.as_millis() as u64))
            ),
        };
        failures += 1;
        send(Event::Retrying { error });
        let cap = (timing.renew_every / 4).max(Duration::from_millis(10));
        let base = Duration::from_millis(20).saturating_mul(1 << failures.min(16));
        let mut retry_at = Boot::now().add(jitter(base.min(cap)));
        if let Some(c) = current {
            retry_at = retry_at.min(timing.last_attempt(c));
        }
        if wait_until(timer, stop, retry_at) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn default_schedule_fits() {
        let t = Timing::new(Duration::from_secs(30), None).unwrap();
        assert_eq!(t.grace, Duration::from_secs(3));
        assert_eq!(t.op, Duration::from_secs(2));
        assert_eq!(t.slack, ms(1500));
        assert_eq!(t.drift, ms(302));
        assert_eq!(t.renew_every, Duration::from_secs(10));
    }

    #[test]
    fn too_short_ttl_names_the_minimum() {
        let min = Timing::min_ttl(None);
        assert!(Timing::new(min, None).is_ok());
        let e = Timing::new(min - ms(1), None).unwrap_err();
        assert!(
            e.contains(&humantime::format_duration(min).to_string()),
            "{e}"
        );
        assert!(Timing::new(Duration::ZERO, None).is_err());
        // A long grace needs a long ttl.
        assert!(Timing::new(Duration::from_secs(10), Some(Duration::from_secs(8))).is_err());
        let min = Timing::min_ttl(Some(Duration::from_secs(8)));
        assert!(min > Duration::from_secs(10));
        assert!(Timing::new(min, Some(Duration::from_secs(8))).is_ok());
    }

    #[test]
    fn job_dies_before_the_lease_expires() {
        let t = Timing::new(Duration::from_secs(1), None).unwrap();
        let sent = Boot(Duration::from_secs(100));
        let deadline = t.deadline_from(sent);
        // SIGKILL goes out at lost_at + grace, which must leave slack before expiry.
        let kill = t.lost_at(deadline).add(t.grace);
        let server_expiry = sent.add(t.ttl);
        assert!(kill.add(t.slack) <= server_expiry);
        assert!(t.last_attempt(deadline).add(t.op) <= t.lost_at(deadline));
    }

    #[test]
    fn boot_clock_moves_forward() {
        let a = Boot::now();
        let b = Boot::now();
        assert!(b >= a);
    }

    #[test]
    fn jitter_stays_below_its_bound() {
        for _ in 0..100 {
            assert!(jitter(ms(5)) < ms(5));
        }
    }
}
