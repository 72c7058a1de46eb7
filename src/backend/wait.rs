//! The driver's clocks (`drive.rs`), which no engine holds: when a request
//! gives up (`-n`, `-w`), the one line it prints after a second (unless
//! `-q`), how long it rides out a failing server or a full one, and the
//! pauses between tries that came to nothing. An engine is only told a
//! deadline.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::quit::{self, Leave};
use super::{Request, Wait};
use crate::clock::{Boot, backoff};

/// One request's patience.
pub struct Patience {
    name: String,
    start: Boot,
    give_up_at: Option<Boot>,
    announce_at: Option<Boot>,
    /// Says the waiting line when it is due, once the request waits.
    announcer: Option<Announcer>,
    /// The engine's way out of the queue on a signal, and its bound: armed
    /// when the request first waits.
    way_out: Option<(Leave, Duration)>,
}

impl Patience {
    pub fn new(req: &Request, wait: Wait) -> Patience {
        let start = Boot::now();
        Patience {
            name: req.name.to_string(),
            start,
            give_up_at: match wait {
                Wait::No => Some(start),
                Wait::For(d) => Some(start.add(d)),
                Wait::Forever => None,
            },
            // Under -q there is no line to print, and no reason to wake for it.
            announce_at: (!req.quiet).then(|| start.add(Duration::from_secs(1))),
            announcer: None,
            way_out: None,
        }
    }

    /// Once the request waits, a signal that would end lockrun runs
    /// `leave` (within `op`) first (`quit`).
    pub fn leave_on_signal(&mut self, leave: Leave, op: Duration) {
        self.way_out = Some((leave, op));
    }

    pub fn started(&self) -> Boot {
        self.start
    }

    /// The wait ran out (at once for `-n`).
    pub fn over(&self) -> bool {
        self.give_up_at.is_some_and(|g| Boot::now() >= g)
    }

    /// A full server is ridden out until the wait is over, and under `-n`
    /// for the bound on one request (`op`): a connection may be free a
    /// moment later.
    pub fn over_when_full(&self, op: Duration) -> bool {
        self.until_full(op).is_some_and(|g| Boot::now() >= g)
    }

    /// When a request riding out a full server gives up (`over_when_full`).
    pub fn until_full(&self, op: Duration) -> Option<Boot> {
        self.give_up_at.map(|g| g.max(self.start.add(op)))
    }

    /// Until when a waiter may block before the driver must hear from it
    /// (to give up): none when it may block for ever. The waiting line
    /// needs no wake-up: it is said from a thread of its own.
    pub fn until(&self) -> Option<Boot> {
        self.give_up_at
    }

    /// Called each time the request is blocked by `holder` and about to
    /// wait: the first time, a signal that ends lockrun leaves the queue
    /// from now on, and the waiting line is said once the wait has lasted
    /// a second, so a CI log says why it is stuck.
    pub fn tick(&mut self, holder: Option<&str>) {
        if let Some((leave, op)) = self.way_out.take() {
            quit::arm(leave, op);
        }
        let Some(at) = self.announce_at else { return };
        if let Some(a) = &self.announcer {
            a.held_by(holder);
            return;
        }
        if Boot::now() < at {
            // A wait need not come back to say it: the local engine's
            // cannot without letting go of what it holds.
            self.announcer = Announcer::start(waiting_line(&self.name), at, holder);
            if self.announcer.is_some() {
                return;
            }
        }
        if Boot::now() >= at {
            self.announce_at = None;
            crate::log::warn(waiting_line(&self.name)(holder));
        }
    }
}

impl Drop for Patience {
    fn drop(&mut self) {
        if let Some(a) = &self.announcer {
            a.stop();
        }
    }
}

/// The waiting line for name `name`, held by a holder.
fn waiting_line(name: &str) -> impl Fn(Option<&str>) -> String + Send + 'static {
    let name = name.to_string();
    move |holder| {
        format!(
            "waiting for {name}: held by {}",
            holder.unwrap_or("another process (no holder recorded)")
        )
    }
}

/// Who holds the name as last heard, and whether the request still waits.
#[derive(Default)]
struct Heard {
    holder: Option<String>,
    over: bool,
}

/// A thread that says the waiting line at its time, unless the request
/// is over by then.
struct Announcer {
    heard: Arc<(Mutex<Heard>, Condvar)>,
}

impl Announcer {
    /// None: no thread could be had (the line is then said by `tick`).
    fn start(
        line: impl Fn(Option<&str>) -> String + Send + 'static,
        at: Boot,
        holder: Option<&str>,
    ) -> Option<Announcer> {
        let heard = Arc::new((
            Mutex::new(Heard {
                holder: holder.map(str::to_string),
                over: false,
            }),
            Condvar::new(),
        ));
        let theirs = Arc::clone(&heard);
        std::thread::Builder::new()
            .name("lockrun-waiting".into())
            .spawn(move || {
                let (lock, cvar) = &*theirs;
                let mut h = lock.lock().unwrap_or_else(PoisonError::into_inner);
                while !h.over && Boot::now() < at {
                    let left = at.since(Boot::now());
                    h = cvar
                        .wait_timeout(h, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                if !h.over {
                    crate::log::warn(line(h.holder.as_deref()));
                }
            })
            .ok()
            .map(|_| Announcer { heard })
    }

    fn held_by(&self, holder: Option<&str>) {
        let mut h = self.heard.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(holder) = holder {
            h.holder = Some(holder.to_string());
        }
    }

    fn stop(&self) {
        let (lock, cvar) = &*self.heard;
        lock.lock().unwrap_or_else(PoisonError::into_inner).over = true;
        cvar.notify_all();
    }
}

/// Pauses that grow while tries keep coming to nothing in a row.
#[derive(Default)]
pub struct Backoff {
    times: u32,
}

impl Backoff {
    /// The pause after one more try that came to nothing.
    pub fn pause(&mut self) -> Duration {
        self.times += 1;
        backoff(
            self.times,
            Duration::from_millis(25),
            Duration::from_secs(1),
        )
    }

    /// A try went through: the next pause is the shortest again.
    pub fn reset(&mut self) {
        self.times = 0;
    }
}

/// How long a request keeps trying through transient failures in a row.
pub struct Retry {
    budget: Duration,
    failing_since: Option<Boot>,
    pauses: Backoff,
}

impl Retry {
    /// A server that keeps failing for `budget` (or, when waiting, past the
    /// wait) is given up on.
    pub fn new(budget: Duration) -> Retry {
        Retry {
            budget,
            failing_since: None,
            pauses: Backoff::default(),
        }
    }

    /// A request went through: the next failure starts a new outage.
    pub fn succeeded(&mut self) {
        self.failing_since = None;
        self.pauses.reset();
    }

    /// After a transient failure: how long to back off before the next try,
    /// or None once the outage has outlasted its budget or `patience`.
    pub fn failed(&mut self, patience: &Patience) -> Option<Duration> {
        let pause = self.pauses.pause();
        let since = *self.failing_since.get_or_insert_with(Boot::now);
        if patience.over() || Boot::now().since(since) >= self.budget {
            return None;
        }
        Some(pause)
    }
}

/// A server that refuses connections for want of a free one, as one
/// request rides it out: pauses of their own (the retry budget is not
/// spent: a full server is up), and one line per outage.
#[derive(Default)]
pub struct Outage {
    since: Option<Boot>,
    times: u32,
    said: bool,
}

impl Outage {
    /// How long an outage lasts before it is said: a blip is not worth a line.
    const SAY_AFTER: Duration = Duration::from_secs(1);

    /// One more refusal: the pause before the next try, no later than
    /// `until`. With `say`, `line` is said (unless `-q`) once the outage
    /// has lasted a second; without (`-n`), the request's end says it.
    pub fn full(
        &mut self,
        until: Option<Boot>,
        say: bool,
        line: impl FnOnce() -> String,
    ) -> Duration {
        let since = *self.since.get_or_insert_with(Boot::now);
        self.times += 1;
        if say && !self.said && Boot::now().since(since) >= Self::SAY_AFTER {
            self.said = true;
            crate::log::warn(line());
        }
        let pause = full_pause(self.times);
        until.map_or(pause, |u| pause.min(u.since(Boot::now())))
    }

    /// A try went through: the outage, if any, is over (said at -v).
    pub fn over(&mut self, server: &str) {
        if let Some(since) = self.since.take() {
            if self.said {
                crate::log::info(format!(
                    "connected to {server} again after {}",
                    crate::text::duration(Boot::now().since(since))
                ));
            }
            *self = Outage::default();
        }
    }
}

/// The pause after the `n`th refusal in a row from a full server: from a
/// quarter second, doubling up to 4 s, jittered to half or up to one and
/// a half of that so that a fleet refused at once does not come back at once.
pub fn full_pause(n: u32) -> Duration {
    let d = Duration::from_millis(250)
        .saturating_mul(1 << n.saturating_sub(1).min(4))
        .min(Duration::from_secs(4));
    d / 2 + crate::clock::jitter(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Mode, Owner};
    use crate::schedule::Timing;

    fn request<'a>(owner: &'a Owner, quiet: bool) -> Request<'a> {
        Request {
            name: "n",
            owner,
            timing: Timing::new(Duration::from_secs(3), None).unwrap(),
            mode: Mode::Exclusive,
            outer: None,
            inherited_fd: None,
            quiet,
            min_hold: None,
            group: Default::default(),
        }
    }

    #[test]
    fn a_wait_blocks_no_longer_than_its_limit() {
        let owner = Owner::new(None).unwrap();
        let no = Patience::new(&request(&owner, false), Wait::No);
        assert!(no.over());
        let long = Patience::new(&request(&owner, false), Wait::For(Duration::from_secs(60)));
        assert!(!long.over());
        assert!(long.until().unwrap() >= Boot::now().add(Duration::from_secs(59)));
        let quiet = Patience::new(&request(&owner, true), Wait::Forever);
        assert_eq!(quiet.until(), None);
    }

    #[test]
    fn retries_stop_when_the_outage_outlasts_its_budget() {
        let owner = Owner::new(None).unwrap();
        let p = Patience::new(&request(&owner, true), Wait::Forever);
        let mut r = Retry::new(Duration::from_millis(30));
        let first = r.failed(&p).expect("the first failure is retried");
        assert!(first <= Duration::from_millis(50), "{first:?}");
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(r.failed(&p), None);
        r.succeeded();
        assert!(r.failed(&p).is_some(), "a success starts a new outage");
        let no = Patience::new(&request(&owner, true), Wait::No);
        assert_eq!(Retry::new(Duration::from_secs(9)).failed(&no), None);
    }

    #[test]
    fn a_full_server_is_ridden_out_for_the_wait_or_one_request_with_no_wait() {
        let owner = Owner::new(None).unwrap();
        let req = request(&owner, true);
        let no = Patience::new(&req, Wait::No);
        assert!(no.over());
        assert!(!no.over_when_full(Duration::from_millis(50)));
        std::thread::sleep(Duration::from_millis(60));
        assert!(no.over_when_full(Duration::from_millis(50)));
        let w = Patience::new(&req, Wait::For(Duration::from_secs(60)));
        assert!(!w.over_when_full(Duration::from_millis(50)));
        let forever = Patience::new(&req, Wait::Forever);
        assert!(!forever.over_when_full(Duration::ZERO));
    }

    #[test]
    fn pauses_on_a_full_server_grow_from_a_quarter_second_to_a_few() {
        for _ in 0..50 {
            let first = full_pause(1);
            assert!(first >= Duration::from_millis(125) && first < Duration::from_millis(375));
            let late = full_pause(30);
            assert!(late >= Duration::from_secs(2) && late < Duration::from_secs(6));
        }
        let mut o = Outage::default();
        let until = Boot::now().add(Duration::from_millis(10));
        assert!(o.full(Some(until), true, String::new) <= Duration::from_millis(10));
    }
}
