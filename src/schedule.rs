//! The lease schedule of lockrun-safety(7) "LEASE TIMING": from a ttl and a kill grace,
//! when to renew, when a lease counts as lost, and how long one request may take.

use std::time::Duration;

use crate::clock::Boot;

/// The lease schedule of lockrun-safety(7) "LEASE TIMING", derived from the ttl and the kill grace.
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

    /// The schedule of a lease that cannot lapse (a flock), renewed, that
    /// is looked at, at least every `every`: a `--preempt` request is seen
    /// within that, whatever the ttl. Looking sooner only moves the
    /// deadline-free checks; nothing else changes.
    pub fn looking_every(self, every: Duration) -> Timing {
        Timing {
            renew_every: self.renew_every.min(every),
            ..self
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
            Some(g) => format!("--kill-after {}", crate::text::duration(g)),
            None => "the default --kill-after of ttl/10".to_string(),
        };
        Err(format!(
            "--ttl {} is too short to renew and stop the job in time with {grace}; \
             the smallest ttl that works is {}",
            crate::text::duration(ttl),
            crate::text::duration(min)
        ))
    }

    /// Smallest whole-millisecond ttl whose schedule fits (the check is monotone in ttl).
    pub fn min_ttl(kill_after: Option<Duration>) -> Duration {
        Timing::smallest_ttl(kill_after, Timing::fits)
    }

    /// Smallest ttl, with this schedule's kill grace, that can stop a job
    /// whose kill takes `cost` before its lease ends (lockrun-safety(7)
    /// "HOW LOCKRUN TREATS THE JOB").
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

    /// When the job starts being stopped if no renewal moved `deadline`:
    /// `lost_at`, earlier by the kill's `cost` as far as the spare time
    /// allows (beyond it, the grace shrinks instead). lockrun and its guard
    /// both keep to it.
    pub fn stop_at(&self, deadline: Boot, cost: Duration) -> Boot {
        self.lost_at(deadline).sub(cost.min(self.spare()))
    }

    /// When SIGKILL goes out for a stop that started at `since`: after the
    /// grace, and early enough that a kill taking `cost` is over `slack`
    /// before the lease's end.
    pub fn kill_at(&self, since: Boot, deadline: Option<Boot>, cost: Duration) -> Boot {
        let mut at = since.add(self.grace);
        if let Some(d) = deadline {
            at = at.min(d.sub(self.slack + cost));
        }
        at.max(since)
    }

    /// Last moment a renewal attempt may start and still finish before `lost_at`.
    pub fn last_attempt(&self, deadline: Boot) -> Boot {
        self.lost_at(deadline).sub(self.op)
    }

    /// Local expiry estimate of a lease the server granted for `granted`
    /// (which may differ from the ttl asked for: an engine that grants whole
    /// seconds), from the moment the granting request was sent.
    pub fn deadline_for(&self, sent_at: Boot, granted: Duration) -> Boot {
        sent_at.add(granted).sub(self.drift)
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
        assert!(e.contains(&crate::text::duration(min).to_string()), "{e}");
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
        let deadline = t.deadline_for(sent, t.ttl);
        // SIGKILL goes out at lost_at + grace, which must leave slack before expiry.
        let kill = t.lost_at(deadline).add(t.grace);
        let server_expiry = sent.add(t.ttl);
        assert!(kill.add(t.slack) <= server_expiry);
        assert!(t.last_attempt(deadline).add(t.op) <= t.lost_at(deadline));
    }
}
