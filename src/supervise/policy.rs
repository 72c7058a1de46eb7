//! The supervisor's decisions, free of system calls: events and the clock in,
//! actions out. What to signal and when, when to suspend, how the run ended.
//! Unit-tested below with a fake clock and a fake process table.

use std::collections::HashMap;
use std::time::Duration;

use crate::exit::JobEnd;
use crate::lease::{Boot, Timing};

/// Signals lockrun passes on to the job.
pub const FORWARDED: [i32; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
    libc::SIGCONT,
    libc::SIGWINCH,
];
/// Terminal stops: caught so that lockrun is only ever stopped on purpose.
pub const JOB_CONTROL: [i32; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// How long after SIGKILL a process may linger before we say it cannot be killed.
const UNKILLABLE_AFTER: Duration = Duration::from_secs(5);
/// Once SIGKILL is due, look for processes forked meanwhile this often.
const REKILL_EVERY: Duration = Duration::from_millis(50);

/// Something that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A signal reached lockrun; `from_terminal` when the kernel sent it for
    /// the terminal (Ctrl-C, Ctrl-Z, a resize), not another process.
    Signal { sig: i32, from_terminal: bool },
    /// The job's main process ended (others may remain).
    JobEnded(JobEnd),
    /// The lease is not ours any more (final).
    Lost(String),
    /// lockrun itself failed after the job started: stop the job as on loss.
    Failed(String),
}

/// Something to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Pass a signal on to the job (its group, or each of its processes when
    /// it shares lockrun's group at a terminal).
    Forward(i32),
    /// Send a signal to each of these processes.
    Signal(Vec<i32>, i32),
    /// Stop lockrun itself with this signal (terminal job control).
    Suspend(i32),
    /// A line for the user, shown even under -q.
    Alert(String),
}

/// Why the job is being stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Why {
    Lost(String),
    Failed(String),
}

/// The kill schedule under way.
#[derive(Debug)]
struct Stopping {
    why: Why,
    kill_at: Boot,
    since_kill: Option<Boot>,
}

/// A process found after the main one ended: SIGTERM when found, SIGKILL after the grace.
#[derive(Debug, Clone, Copy)]
struct Leftover {
    found: Boot,
    killed: Option<Boot>,
}

/// How supervision ended.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    /// How the main process ended (None: lockrun never learned it).
    pub end: Option<JobEnd>,
    /// The lease was lost while a process of the job was alive.
    pub lost: Option<String>,
    /// lockrun failed after the job started (exit 70 once all is gone).
    pub failed: Option<String>,
}

pub struct Policy {
    timing: Timing,
    /// The job stays in lockrun's process group (lockrun runs at a terminal).
    shares_group: bool,
    end: Option<JobEnd>,
    stopping: Option<Stopping>,
    leftovers: HashMap<i32, Leftover>,
    warned_unkillable: bool,
}

impl Policy {
    pub fn new(timing: Timing, shares_group: bool) -> Policy {
        Policy {
            timing,
            shares_group,
            end: None,
            stopping: None,
            leftovers: HashMap::new(),
            warned_unkillable: false,
        }
    }

    /// React to one event. `deadline` is the lease's local expiry estimate
    /// (None: the lease cannot expire, as a flock).
    pub fn on(&mut self, ev: Event, now: Boot, deadline: Option<Boot>) -> Vec<Action> {
        match ev {
            Event::Signal { sig, from_terminal } => self.on_signal(sig, from_terminal),
            Event::JobEnded(end) => {
                self.end.get_or_insert(end);
                Vec::new()
            }
            Event::Lost(reason) => self.stop(Why::Lost(reason), now, deadline),
            Event::Failed(reason) => self.stop(Why::Failed(reason), now, deadline),
        }
    }

    fn on_signal(&mut self, sig: i32, from_terminal: bool) -> Vec<Action> {
        // At a terminal the job shares our group: the terminal's own signals
        // reached it already, and only its stops concern lockrun itself.
        let terminal = from_terminal && self.shares_group;
        if JOB_CONTROL.contains(&sig) {
            return if terminal {
                vec![Action::Suspend(sig)]
            } else if sig == libc::SIGTSTP {
                vec![Action::Forward(sig)]
            } else {
                // TTIN/TTOU sent to lockrun by hand would only stop the job.
                Vec::new()
            };
        }
        if terminal || !FORWARDED.contains(&sig) {
            return Vec::new();
        }
        vec![Action::Forward(sig)]
    }

    /// Start the kill schedule: SIGTERM now, SIGKILL after the grace, and
    /// always `slack` before the lease can end. Lost is final.
    fn stop(&mut self, why: Why, now: Boot, deadline: Option<Boot>) -> Vec<Action> {
        if self.stopping.is_some() {
            return Vec::new();
        }
        let mut kill_at = now.add(self.timing.grace);
        if let Some(d) = deadline {
            kill_at = kill_at.min(d.sub(self.timing.slack));
        }
        self.stopping = Some(Stopping {
            why,
            kill_at,
            since_kill: None,
        });
        // The per-process leftover schedule is replaced by this one.
        self.leftovers.clear();
        Vec::new()
    }

    /// Look at the clock and the job's processes (`procs`: every live process
    /// of the job, the main one included while it runs).
    pub fn tick(&mut self, now: Boot, deadline: Option<Boot>, procs: &[i32]) -> Vec<Action> {
        let mut out = Vec::new();
        if self.stopping.is_none()
            && let Some(d) = deadline
            && now >= self.timing.lost_at(d)
        {
            out.extend(self.stop(
                Why::Lost("the lease could not be renewed in time".into()),
                now,
                deadline,
            ));
        }
        if let Some(s) = &mut self.stopping {
            if now >= s.kill_at {
                // Again on every look: a process forked since the last one
                // must not escape.
                if !procs.is_empty() {
                    out.push(Action::Signal(procs.to_vec(), libc::SIGKILL));
                }
                let first = *s.since_kill.get_or_insert(now);
                if !procs.is_empty()
                    && now >= first.add(UNKILLABLE_AFTER)
                    && !self.warned_unkillable
                {
                    self.warned_unkillable = true;
                    out.push(Action::Alert(format!(
                        "process {} of the job survives SIGKILL; keeping the lease held until it exits",
                        procs[0]
                    )));
                }
            } else if !procs.is_empty() {
                // SIGTERM to everything not yet told, with SIGCONT so that a
                // stopped process sees it.
                let fresh: Vec<i32> = procs
                    .iter()
                    .copied()
                    .filter(|p| !self.leftovers.contains_key(p))
                    .collect();
                if !fresh.is_empty() {
                    for &p in &fresh {
                        self.leftovers.insert(
                            p,
                            Leftover {
                                found: now,
                                killed: None,
                            },
                        );
                    }
                    out.push(Action::Signal(fresh.clone(), libc::SIGTERM));
                    out.push(Action::Signal(fresh, libc::SIGCONT));
                }
            }
            return out;
        }
        if self.end.is_some() {
            out.extend(self.leftovers(now, procs));
        }
        out
    }

    /// After the main process ended: SIGTERM each leftover when found,
    /// SIGKILL after the grace.
    fn leftovers(&mut self, now: Boot, procs: &[i32]) -> Vec<Action> {
        self.leftovers.retain(|p, _| procs.contains(p));
        let mut term = Vec::new();
        let mut kill = Vec::new();
        for &p in procs {
            let l = self.leftovers.entry(p).or_insert_with(|| {
                term.push(p);
                Leftover {
                    found: now,
                    killed: None,
                }
            });
            if l.killed.is_none() && now >= l.found.add(self.timing.grace) {
                l.killed = Some(now);
                kill.push(p);
            }
        }
        let mut out = Vec::new();
        if !term.is_empty() {
            out.push(Action::Signal(term.clone(), libc::SIGTERM));
            out.push(Action::Signal(term, libc::SIGCONT));
        }
        if !kill.is_empty() {
            out.push(Action::Signal(kill, libc::SIGKILL));
        }
        let stuck = self
            .leftovers
            .iter()
            .find(|(_, l)| l.killed.is_some_and(|k| now >= k.add(UNKILLABLE_AFTER)));
        if let Some((p, _)) = stuck
            && !self.warned_unkillable
        {
            self.warned_unkillable = true;
            out.push(Action::Alert(format!(
                "process {p} of the job survives SIGKILL; keeping the lease held until it exits"
            )));
        }
        out
    }

    /// Whether `tick` needs the list of the job's processes (a walk of /proc).
    pub fn wants_procs(&self) -> bool {
        self.stopping.is_some() || self.end.is_some()
    }

    /// When to look again at the latest, if nothing happens before.
    pub fn next_tick(&self, now: Boot, deadline: Option<Boot>) -> Option<Boot> {
        let mut at: Option<Boot> = None;
        let mut consider = |t: Boot| at = Some(at.map_or(t, |a: Boot| a.min(t)));
        match &self.stopping {
            None => {
                if let Some(d) = deadline {
                    consider(self.timing.lost_at(d));
                }
                for l in self.leftovers.values() {
                    match l.killed {
                        None => consider(l.found.add(self.timing.grace)),
                        Some(k) if !self.warned_unkillable => consider(k.add(UNKILLABLE_AFTER)),
                        Some(_) => {}
                    }
                }
                if self.end.is_some() {
                    // New leftovers can appear without any event (a fork).
                    consider(now.add(REKILL_EVERY));
                }
            }
            Some(s) => match s.since_kill {
                None => {
                    consider(s.kill_at);
                    // Processes forked during the grace get SIGTERM too.
                    consider(now.add(REKILL_EVERY));
                }
                Some(_) => consider(now.add(REKILL_EVERY)),
            },
        }
        at
    }

    /// The final word, once no process of the job is left.
    pub fn outcome(self) -> Outcome {
        let (lost, failed) = match self.stopping.map(|s| s.why) {
            Some(Why::Lost(r)) => (Some(r), None),
            Some(Why::Failed(r)) => (None, Some(r)),
            None => (None, None),
        };
        Outcome {
            end: self.end,
            lost,
            failed,
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.is_some()
    }

    pub fn shares_group(&self) -> bool {
        self.shares_group
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing::new(Duration::from_secs(3), None).unwrap()
    }

    fn at(ms: u64) -> Boot {
        Boot(Duration::from_secs(1000) + Duration::from_millis(ms))
    }

    fn signals(actions: &[Action], sig: i32) -> Vec<i32> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Signal(p, s) if *s == sig => Some(p.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn terminal_keys_are_not_forwarded_twice() {
        let mut p = Policy::new(timing(), true);
        let int = |t| Event::Signal {
            sig: libc::SIGINT,
            from_terminal: t,
        };
        assert!(p.on(int(true), at(0), None).is_empty());
        assert_eq!(
            p.on(int(false), at(0), None),
            [Action::Forward(libc::SIGINT)]
        );
        // Without a shared group, a signal always goes on to the job.
        let mut p = Policy::new(timing(), false);
        assert_eq!(
            p.on(int(true), at(0), None),
            [Action::Forward(libc::SIGINT)]
        );
    }

    #[test]
    fn only_the_terminal_suspends_lockrun() {
        let mut p = Policy::new(timing(), true);
        let stop = |sig, t| Event::Signal {
            sig,
            from_terminal: t,
        };
        assert_eq!(
            p.on(stop(libc::SIGTSTP, true), at(0), None),
            [Action::Suspend(libc::SIGTSTP)]
        );
        assert_eq!(
            p.on(stop(libc::SIGTTIN, true), at(0), None),
            [Action::Suspend(libc::SIGTTIN)]
        );
        // `kill -TSTP lockrun` stops the job, never lockrun.
        assert_eq!(
            p.on(stop(libc::SIGTSTP, false), at(0), None),
            [Action::Forward(libc::SIGTSTP)]
        );
        assert!(p.on(stop(libc::SIGTTOU, false), at(0), None).is_empty());
    }

    #[test]
    fn loss_terms_everything_then_kills_before_expiry() {
        let t = timing();
        let mut p = Policy::new(t, false);
        let deadline = at(3000);
        let procs = [10, 11, 12];
        assert!(
            p.on(Event::Lost("gone".into()), at(1000), Some(deadline))
                .is_empty()
        );
        let a = p.tick(at(1000), Some(deadline), &procs);
        assert_eq!(signals(&a, libc::SIGTERM), procs);
        assert_eq!(signals(&a, libc::SIGCONT), procs);
        assert!(signals(&a, libc::SIGKILL).is_empty());
        // A process forked during the grace gets SIGTERM too, once.
        let a = p.tick(at(1100), Some(deadline), &[10, 11, 12, 13]);
        assert_eq!(signals(&a, libc::SIGTERM), [13]);
        // SIGKILL after the grace (ttl/10), to whatever is there then.
        let kill = at(1000).add(t.grace);
        assert!(
            signals(
                &p.tick(kill.sub(Duration::from_millis(1)), Some(deadline), &procs),
                libc::SIGKILL
            )
            .is_empty()
        );
        assert_eq!(
            signals(&p.tick(kill, Some(deadline), &procs), libc::SIGKILL),
            procs
        );
        assert_eq!(
            signals(&p.tick(kill, Some(deadline), &[14]), libc::SIGKILL),
            [14]
        );
        let o = p.outcome();
        assert_eq!(o.lost.as_deref(), Some("gone"));
    }

    #[test]
    fn the_kill_comes_slack_before_expiry_even_with_a_long_grace() {
        let t = Timing::new(Duration::from_secs(10), Some(Duration::from_secs(2))).unwrap();
        let mut p = Policy::new(t, false);
        let deadline = at(2500);
        p.on(Event::Lost("x".into()), at(1000), Some(deadline));
        let kill_at = deadline.sub(t.slack);
        assert!(kill_at < at(1000).add(t.grace));
        assert!(signals(&p.tick(kill_at, Some(deadline), &[5]), libc::SIGKILL) == [5]);
    }

    #[test]
    fn a_missed_deadline_is_a_loss() {
        let t = timing();
        let mut p = Policy::new(t, false);
        let deadline = at(3000);
        assert_eq!(
            p.next_tick(at(0), Some(deadline)),
            Some(t.lost_at(deadline))
        );
        assert!(
            p.tick(
                t.lost_at(deadline).sub(Duration::from_millis(1)),
                Some(deadline),
                &[]
            )
            .is_empty()
        );
        p.tick(t.lost_at(deadline), Some(deadline), &[7]);
        assert!(p.outcome().lost.is_some());
    }

    #[test]
    fn no_deadline_means_no_loss_by_time() {
        let mut p = Policy::new(timing(), false);
        assert_eq!(p.next_tick(at(0), None), None);
        assert!(p.tick(at(1_000_000), None, &[]).is_empty());
        p.on(Event::JobEnded(JobEnd::Exited(0)), at(0), None);
        let o = p.outcome();
        assert_eq!(o.lost, None);
        assert_eq!(o.end, Some(JobEnd::Exited(0)));
    }

    #[test]
    fn leftovers_get_term_then_kill_after_the_grace() {
        let t = timing();
        let mut p = Policy::new(t, false);
        p.on(Event::JobEnded(JobEnd::Exited(3)), at(0), None);
        let a = p.tick(at(0), None, &[20]);
        assert_eq!(signals(&a, libc::SIGTERM), [20]);
        let a = p.tick(at(100), None, &[20, 21]);
        assert_eq!(signals(&a, libc::SIGTERM), [21]);
        let a = p.tick(at(0).add(t.grace), None, &[20, 21]);
        assert_eq!(signals(&a, libc::SIGKILL), [20]);
        let a = p.tick(at(100).add(t.grace), None, &[21]);
        assert_eq!(signals(&a, libc::SIGKILL), [21]);
        let a = p.tick(at(100).add(t.grace).add(UNKILLABLE_AFTER), None, &[21]);
        assert!(matches!(a.as_slice(), [Action::Alert(_)]), "{a:?}");
        assert_eq!(p.outcome().end, Some(JobEnd::Exited(3)));
    }

    #[test]
    fn a_failure_after_the_start_stops_the_job_and_reports_it() {
        let mut p = Policy::new(timing(), false);
        p.on(Event::Failed("no thread".into()), at(0), None);
        let a = p.tick(at(0), None, &[1234]);
        assert_eq!(signals(&a, libc::SIGTERM), [1234]);
        // A later loss does not change why.
        p.on(Event::Lost("x".into()), at(1), None);
        let o = p.outcome();
        assert_eq!(o.failed.as_deref(), Some("no thread"));
        assert_eq!(o.lost, None);
    }
}
