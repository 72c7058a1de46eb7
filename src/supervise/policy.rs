//! The supervisor's decisions, free of system calls: events and the clock in,
//! actions out. What to signal and when, when to suspend, how the run ended.
//! Unit-tested below with a fake clock and a fake process table.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::clock::Boot;
use crate::exit::JobEnd;
use crate::schedule::Timing;

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
/// What the kernel takes to tear down one killed process: part of the
/// kill's cost that no walk of /proc shows. About 0.12 ms on an idle 2-core
/// machine (6,000 processes die in 0.7 s there); rounded up for a loaded
/// one, where 8,000 processes outlived a 150 µs allowance by 0.19 s.
const DEATH_PER_PROCESS: Duration = Duration::from_micros(250);

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
    /// The guard found the lease's time near with no renewal from lockrun
    /// (lockrun was stopped or starved) and is stopping the job: lost.
    GuardTookOver(String),
    /// A renewal attempt failed; it is retried while time allows.
    RenewalFailed(String),
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
    /// When the schedule started: SIGKILL follows `grace` later at most.
    since: Boot,
    since_kill: Option<Boot>,
    /// Processes that got SIGTERM already.
    told: HashSet<i32>,
    /// The guard is stopping the job (lockrun was stopped past its time):
    /// it tells each process itself, lockrun only sees to the SIGKILL.
    by_guard: bool,
}

const NONE: &[i32] = &[];
const KILL: &[i32] = &[libc::SIGKILL];
const FREEZE: &[i32] = &[libc::SIGSTOP];
const TERM: &[i32] = &[libc::SIGTERM, libc::SIGCONT];

/// Where supervision is.
#[derive(Debug)]
enum Phase {
    /// The main process runs and nothing is being stopped.
    Running,
    /// The main process ended: each process left gets SIGTERM when found and
    /// SIGKILL after the grace, while the lease is still renewed.
    Draining(HashMap<i32, Leftover>),
    /// The kill schedule runs: the lease was lost, or lockrun failed.
    Stopping(Stopping),
}

/// How the supervisor walks the job's processes before the next `tick`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walk {
    /// Only list them.
    List,
    /// Stop (SIGSTOP) each process not seen before the moment it is found,
    /// so that it cannot fork behind the walk; `tick` sends SIGTERM and
    /// SIGCONT to those.
    Freeze,
    /// SIGKILL the job's group, then each process the moment it is found.
    Kill,
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
    /// The job was started (false: the lease's time was up first).
    pub started: bool,
}

pub struct Policy {
    timing: Timing,
    /// The job stays in lockrun's process group (lockrun runs at a terminal).
    shares_group: bool,
    /// How the main process ended, whatever the phase.
    end: Option<JobEnd>,
    phase: Phase,
    warned_unkillable: bool,
    /// What killing the job is expected to take, from the last walk: its own
    /// length and the teardown of what it found. The kill schedule starts
    /// earlier by that much (lockrun-safety(7) "HOW LOCKRUN TREATS THE JOB").
    kill_cost: Duration,
    /// How many processes the last walk found.
    found: usize,
    warned_size: bool,
    /// Why the last renewal attempt failed, for the line that says why the
    /// lease was lost.
    last_failure: Option<String>,
}

impl Policy {
    pub fn new(timing: Timing, shares_group: bool) -> Policy {
        Policy {
            timing,
            shares_group,
            end: None,
            phase: Phase::Running,
            warned_unkillable: false,
            kill_cost: Duration::ZERO,
            found: 0,
            warned_size: false,
            last_failure: None,
        }
    }

    /// A walk of the job's processes found `found` of them in `took`.
    pub fn measured(&mut self, found: usize, took: Duration) {
        self.kill_cost = took + DEATH_PER_PROCESS * u32::try_from(found).unwrap_or(u32::MAX);
        self.found = found;
    }

    /// Once: a line saying that the job has grown too big to be stopped
    /// within its lease, and which ttl would do.
    fn size_warning(&mut self, deadline: Option<Boot>) -> Option<Action> {
        if self.warned_size || deadline.is_none() || self.timing.kill_fits(self.kill_cost) {
            return None;
        }
        self.warned_size = true;
        Some(Action::Alert(format!(
            "the job has {} processes; stopping them takes about {:.1?}, more than --ttl {} \
             leaves, so on a lost lease some could outlive it; use --ttl {} or more",
            self.found,
            self.kill_cost,
            crate::text::duration(self.timing.ttl),
            crate::text::duration(self.timing.ttl_for_kill(self.kill_cost)),
        )))
    }

    /// When the job must start being stopped if no renewal succeeded.
    fn lost_at(&self, deadline: Boot) -> Boot {
        self.timing.stop_at(deadline, self.kill_cost)
    }

    /// When SIGKILL goes out in the schedule under way.
    fn kill_at(&self, s: &Stopping, deadline: Option<Boot>) -> Boot {
        self.timing.kill_at(s.since, deadline, self.kill_cost)
    }

    /// What killing the job is expected to take, as last measured.
    pub fn kill_cost(&self) -> Duration {
        self.kill_cost
    }

    /// How to walk the job's processes now, if the next `tick` needs them.
    pub fn walk(&self, now: Boot, deadline: Option<Boot>) -> Walk {
        let Phase::Stopping(s) = &self.phase else {
            return Walk::List;
        };
        if s.since_kill.is_some() || now >= self.kill_at(s, deadline) {
            Walk::Kill
        } else {
            Walk::Freeze
        }
    }

    /// Whether the lease counts as lost by time at `now` (no renewal in time).
    fn loses(&self, now: Boot, deadline: Option<Boot>) -> bool {
        deadline.is_some_and(|d| now >= self.lost_at(d))
    }

    /// Whether `pid` was already told to stop (a later walk does not freeze it again).
    #[cfg(test)]
    pub fn knows(&self, pid: i32) -> bool {
        matches!(&self.phase, Phase::Stopping(s) if s.told.contains(&pid))
    }

    /// What a walk at `now` sends to process `pid`: the moment it finds it,
    /// and once it has walked everything below it (a process told to stop is
    /// frozen in between). These are the signals `tick` decides for it at the same
    /// `now`, sent while the walk holds the process by a pidfd, so that a
    /// recycled pid never gets them.
    pub fn signals_for(
        &self,
        pid: i32,
        now: Boot,
        deadline: Option<Boot>,
    ) -> (&'static [i32], &'static [i32]) {
        match &self.phase {
            Phase::Running => (NONE, NONE),
            Phase::Stopping(s) if s.since_kill.is_some() || now >= self.kill_at(s, deadline) => {
                (KILL, NONE)
            }
            Phase::Stopping(s) if s.by_guard || s.told.contains(&pid) => (NONE, NONE),
            Phase::Stopping(_) => (FREEZE, TERM),
            Phase::Draining(left) => match left.get(&pid) {
                None => (NONE, TERM),
                Some(l) if l.killed.is_none() && now >= l.found.add(self.timing.grace) => {
                    (KILL, NONE)
                }
                Some(_) => (NONE, NONE),
            },
        }
    }

    /// React to one event.
    pub fn on(&mut self, ev: Event, now: Boot) -> Vec<Action> {
        match ev {
            Event::Signal { sig, from_terminal } => self.on_signal(sig, from_terminal),
            Event::JobEnded(end) => {
                self.end.get_or_insert(end);
                if matches!(self.phase, Phase::Running) {
                    self.phase = Phase::Draining(HashMap::new());
                }
                Vec::new()
            }
            Event::Lost(reason) => self.stop(Why::Lost(reason), now),
            Event::GuardTookOver(reason) => {
                let out = self.stop(Why::Lost(reason), now);
                if let Phase::Stopping(s) = &mut self.phase
                    && s.told.is_empty()
                {
                    s.by_guard = true;
                }
                out
            }
            Event::Failed(reason) => self.stop(Why::Failed(reason), now),
            Event::RenewalFailed(error) => {
                self.last_failure = Some(error);
                Vec::new()
            }
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
    fn stop(&mut self, why: Why, now: Boot) -> Vec<Action> {
        if !self.is_stopping() {
            // The per-process leftover schedule is replaced by this one.
            self.phase = Phase::Stopping(Stopping {
                why,
                since: now,
                since_kill: None,
                told: HashSet::new(),
                by_guard: false,
            });
        }
        Vec::new()
    }

    /// The lease is lost by time (no renewal came in time): start the kill
    /// schedule now. Lost is final.
    pub fn check_time(&mut self, now: Boot, deadline: Option<Boot>) -> Vec<Action> {
        if !self.is_stopping() && self.loses(now, deadline) {
            let why = crate::watchdog::lost_in_time(self.last_failure.as_deref());
            return self.stop(Why::Lost(why), now);
        }
        Vec::new()
    }

    /// Look at the clock and the job's processes (`procs`: every live process
    /// of the job, the main one included while it runs).
    pub fn tick(&mut self, now: Boot, deadline: Option<Boot>, procs: &[i32]) -> Vec<Action> {
        let mut out: Vec<Action> = self.size_warning(deadline).into_iter().collect();
        out.extend(self.check_time(now, deadline));
        let kill_at = match &self.phase {
            Phase::Stopping(s) => Some(self.kill_at(s, deadline)),
            _ => None,
        };
        if let (Phase::Stopping(s), Some(kill_at)) = (&mut self.phase, kill_at) {
            if now >= kill_at {
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
            } else if !procs.is_empty() && !s.by_guard {
                // SIGTERM to everything not yet told, with SIGCONT so that a
                // stopped process sees it.
                let fresh: Vec<i32> = procs
                    .iter()
                    .copied()
                    .filter(|&p| s.told.insert(p))
                    .collect();
                if !fresh.is_empty() {
                    out.push(Action::Signal(fresh.clone(), libc::SIGTERM));
                    out.push(Action::Signal(fresh, libc::SIGCONT));
                }
            }
            return out;
        }
        if let Phase::Draining(left) = &mut self.phase {
            let grace = self.timing.grace;
            out.extend(drain(left, grace, &mut self.warned_unkillable, now, procs));
        }
        out
    }

    /// Whether `tick` needs the list of the job's processes (a walk of /proc).
    pub fn wants_procs(&self) -> bool {
        !matches!(self.phase, Phase::Running)
    }

    /// When to look again at the latest, if nothing happens before.
    pub fn next_tick(&self, now: Boot, deadline: Option<Boot>) -> Option<Boot> {
        let mut at: Option<Boot> = None;
        let mut consider = |t: Boot| at = Some(at.map_or(t, |a: Boot| a.min(t)));
        match &self.phase {
            Phase::Running => {
                if let Some(d) = deadline {
                    consider(self.lost_at(d));
                }
            }
            Phase::Draining(left) => {
                if let Some(d) = deadline {
                    consider(self.lost_at(d));
                }
                for l in left.values() {
                    match l.killed {
                        None => consider(l.found.add(self.timing.grace)),
                        Some(k) if !self.warned_unkillable => consider(k.add(UNKILLABLE_AFTER)),
                        Some(_) => {}
                    }
                }
                // New leftovers can appear without any event (a fork).
                consider(now.add(REKILL_EVERY));
            }
            Phase::Stopping(s) => match s.since_kill {
                None => {
                    consider(self.kill_at(s, deadline));
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
        let (lost, failed) = match self.phase {
            Phase::Stopping(Stopping {
                why: Why::Lost(r), ..
            }) => (Some(r), None),
            Phase::Stopping(Stopping {
                why: Why::Failed(r),
                ..
            }) => (None, Some(r)),
            _ => (None, None),
        };
        Outcome {
            end: self.end,
            lost,
            failed,
            started: true,
        }
    }

    pub fn is_stopping(&self) -> bool {
        matches!(self.phase, Phase::Stopping(_))
    }

    pub fn shares_group(&self) -> bool {
        self.shares_group
    }
}

/// After the main process ended: SIGTERM each leftover when found, SIGKILL
/// after the grace; one line if one survives SIGKILL.
fn drain(
    left: &mut HashMap<i32, Leftover>,
    grace: Duration,
    warned_unkillable: &mut bool,
    now: Boot,
    procs: &[i32],
) -> Vec<Action> {
    left.retain(|p, _| procs.contains(p));
    let mut term = Vec::new();
    let mut kill = Vec::new();
    for &p in procs {
        let l = left.entry(p).or_insert_with(|| {
            term.push(p);
            Leftover {
                found: now,
                killed: None,
            }
        });
        if l.killed.is_none() && now >= l.found.add(grace) {
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
    let stuck = left
        .iter()
        .find(|(_, l)| l.killed.is_some_and(|k| now >= k.add(UNKILLABLE_AFTER)));
    if let Some((p, _)) = stuck
        && !*warned_unkillable
    {
        *warned_unkillable = true;
        out.push(Action::Alert(format!(
            "process {p} of the job survives SIGKILL; keeping the lease held until it exits"
        )));
    }
    out
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
