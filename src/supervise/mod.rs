//! Runs the job: start it under a guard process, pass signals on, and carry
//! out the decisions of `policy` (the kill schedule, leftovers, terminal
//! stops) until no process of the job is left. Knows nothing of engines: the
//! lease reaches it as a deadline, a renewer and events.

mod guard;
mod policy;
mod procs;
mod wakeups;

use std::ffi::OsString;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};

use rustix::event::{PollFd, PollFlags, poll};
use signal_hook::iterator::backend::SignalDelivery;
use signal_hook::iterator::exfiltrator::WithRawSiginfo;

use crate::backend::Renewing;
use crate::clock::Boot;
use crate::exit::{Class, Failure, ResultExt, fail};
use crate::log;
use crate::schedule::Timing;
use crate::spawn::{Prepared, SpawnError};
use crate::sys;
use crate::watchdog::{Deadline, Event as LeaseEvent, Watchdog};
use guard::{Guard, Report};
pub use policy::Outcome;
use policy::{Action, Event, FORWARDED, JOB_CONTROL, Policy};
use wakeups::{Wakeups, readable};

/// Everything the supervisor needs to run one job under one lease.
pub struct Job {
    pub command: Vec<OsString>,
    pub env: Vec<(String, String)>,
    /// Inherited variables the job must not see (a URL with a password, an
    /// outer lockrun's slot or descriptor).
    pub env_remove: Vec<String>,
    /// The local backend's lock descriptor, inherited by the job.
    pub inherit_fd: Option<RawFd>,
    pub timing: Timing,
    /// When the granting request was sent.
    pub sent_at: Boot,
    /// lockrun holds a password: the guard, a copy of lockrun, must stay
    /// out of reach of the job's user too.
    pub secret: bool,
}

/// SIGPIPE was ignored when lockrun started (lockrun itself always ignores it).
static SIGPIPE_IGNORED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Called first thing: lockrun ignores SIGPIPE (a closed stdout must give an
/// error, not kill it), and the job later gets what lockrun was given.
#[cfg_attr(test, allow(dead_code))] // called from the C entry point only
pub fn ignore_sigpipe() {
    SIGPIPE_IGNORED.store(sys::ignore_sigpipe(), std::sync::atomic::Ordering::Relaxed);
}

/// The signals lockrun catches: those it forwards or acts on, except the ones
/// ignored when it started (nohup), which stay ignored for the job too.
fn catchable() -> Vec<i32> {
    FORWARDED
        .iter()
        .chain(JOB_CONTROL.iter())
        .copied()
        .filter(|&s| !sys::is_ignored(s))
        .collect()
}

fn spawn_failure(shown: &str, e: SpawnError) -> Failure {
    match e {
        SpawnError::NotFound => fail(Class::NotFound, format!("{shown}: command not found")),
        SpawnError::NotExecutable(e) => fail(
            Class::NotExecutable,
            format!("{shown}: cannot execute: {e}"),
        ),
        SpawnError::Other(e) => fail(Class::Internal, format!("{shown}: cannot start: {e}")),
    }
}

/// Wait for the guard's first word: the job started (Some), could not, or
/// was not started because the lease's time was up (None).
fn first_report(guard: &mut Guard) -> Result<Option<i32>, SpawnError> {
    loop {
        let mut closed = false;
        let reports = guard.read(&mut closed);
        for (i, r) in reports.iter().enumerate() {
            match *r {
                Report::Started(pid) => {
                    // A short job may have ended already: keep that for the loop.
                    guard.unread(&reports[i + 1..]);
                    return Ok(Some(pid));
                }
                Report::Late => {
                    guard.reap();
                    return Ok(None);
                }
                Report::NotStarted(errno) => {
                    guard.reap();
                    return Err(SpawnError::from_errno(errno));
                }
                Report::Ended(_) | Report::TookOver => {}
            }
        }
        if closed {
            guard.reap();
            return Err(SpawnError::Other(std::io::Error::other(
                "the guard process died before the job started",
            )));
        }
        let mut fds = [PollFd::from_borrowed_fd(guard.reports_fd(), PollFlags::IN)];
        let _ = poll(&mut fds, None);
    }
}

/// Run the job under the lease and return when nothing of it is left.
/// `deadline` is None for a lease that cannot expire. The watchdog starts on
/// `renewer` only when the first renewal is due. `caught_here` is called once
/// the supervisor catches the signals itself, before the job starts (what
/// handled them until then may go); `started` once the job runs. Err only
/// when the job never started; after that, every failure of lockrun's own
/// goes through the kill schedule and comes back in the outcome.
pub fn supervise_job(
    job: Job,
    deadline: Option<Arc<Deadline>>,
    renewer: Renewing,
    caught_here: impl FnOnce(),
    started: impl FnOnce(),
) -> Result<Outcome, Failure> {
    // Orphans of the job come to the guard; if the guard itself dies, to us.
    sys::set_subreaper().exit_as(Class::Internal)?;
    let caught = catchable();
    let mut wakeups = Wakeups::new(&caught, caught_here)?;
    let shares_group = sys::at_terminal();

    let shown = job.command[0].to_string_lossy().into_owned();
    let mut prepared = prepare(&job, &caught, shares_group)
        .map_err(|e| spawn_failure(&shown, SpawnError::Other(e)))?;
    let Some((guard, main)) = start_guard(&job, &mut prepared, &deadline, shares_group, &shown)?
    else {
        return Ok(Outcome {
            end: None,
            lost: Some(
                "lockrun was stopped or starved between the grant and the job's start".into(),
            ),
            failed: None,
            started: false,
        });
    };
    // The guard shares these pages until it exits: freeing the job's
    // strings here would copy each page they lie in. They go with lockrun.
    std::mem::forget(prepared);
    log::info(format!("started job as pid {main}"));
    log::start_async();
    started();

    let mut sup = Supervisor::new(&job, deadline, renewer, guard, main, shares_group);
    let (ev_tx, ev_rx) = channel::<LeaseEvent>();
    sup.run(&mut wakeups, &ev_tx, &ev_rx);

    // Nothing of the job is left.
    sup.watchdog.take();
    log::stop_async();
    Ok(sup.policy.outcome())
}

/// The job's start, made ready in lockrun before the guard is forked.
fn prepare(job: &Job, caught: &[i32], shares_group: bool) -> std::io::Result<Prepared> {
    let env_remove: Vec<&str> = job.env_remove.iter().map(String::as_str).collect();
    let spec = crate::spawn::Spec {
        argv: &job.command,
        env: &job.env,
        env_remove: &env_remove,
        inherit_fd: job.inherit_fd,
        caught,
        // At a terminal the job joins lockrun's group (the guard has its own).
        group: if shares_group {
            rustix::process::getpgrp().as_raw_nonzero().get()
        } else {
            0
        },
        keep_sigpipe_ignored: SIGPIPE_IGNORED.load(std::sync::atomic::Ordering::Relaxed),
    };
    Prepared::new(&spec)
}

/// Fork the guard, which starts the job: the guard and the job's main pid,
/// or None when the job was not started because the lease's time was up.
fn start_guard(
    job: &Job,
    prepared: &mut Prepared,
    deadline: &Option<Arc<Deadline>>,
    shares_group: bool,
    shown: &str,
) -> Result<Option<(Guard, i32)>, Failure> {
    let watch = guard::Watch {
        timing: job.timing,
        deadline: deadline.as_ref().map(|d| d.get()),
        shares_group,
    };
    let mut guard = Guard::start(prepared, !job.secret, watch).map_err(|e| {
        fail(
            Class::Internal,
            format!("cannot start the guard process: {e}"),
        )
    })?;
    // The guard hears of every deadline the renewals earn, from the thread
    // that renewed: should lockrun stop, it stops the job in time itself.
    if let Some(d) = deadline {
        let orders = guard.orders.clone();
        d.watch(move |at| orders.deadline(at));
    }
    let main = first_report(&mut guard).map_err(|e| spawn_failure(shown, e))?;
    Ok(main.map(|main| (guard, main)))
}

fn lease_events(rx: &Receiver<LeaseEvent>) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(LeaseEvent::Renewed { took }) => log::debug(format!("renewed in {took:.1?}")),
            Ok(LeaseEvent::Retrying { error }) => {
                log::info(format!("renewal failed: {error}; retrying"));
                out.push(Event::RenewalFailed(error));
            }
            Ok(LeaseEvent::Lost { reason }) => out.push(Event::Lost(reason)),
            Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => return out,
        }
    }
}

struct Supervisor {
    policy: Policy,
    timing: Timing,
    deadline: Option<Arc<Deadline>>,
    /// How the lease is renewed, until the watchdog takes it.
    renewer: Option<Renewing>,
    /// Readable when the lease must be renewed at once (its session
    /// connected again): the watchdog starts then, and takes it.
    renew_now: Option<std::os::fd::OwnedFd>,
    watchdog: Option<Watchdog>,
    first_renew: Boot,
    main: i32,
    guard: Guard,
    guard_gone: bool,
    /// The guard died: lockrun reaps the job's orphans itself.
    orphans_only: bool,
    /// Descriptors held back for the walk of /proc (see `processes`).
    reserve: Vec<std::os::fd::OwnedFd>,
    /// The main process's pidfd, opened when first needed (a short job never
    /// pays for it): the job's group is signalled through it, never by a
    /// number that may have been recycled (lockrun-safety(7) "HOW LOCKRUN TREATS
    /// THE JOB"). Some(None): it could not be had.
    main_fd: Option<Option<std::os::fd::OwnedFd>>,
    /// Pidfds of other processes of the job that lead a process group (a
    /// session of their own among them), so that the kill reaches each of
    /// those groups in one call, whatever their size.
    groups: Vec<std::os::fd::OwnedFd>,
    /// Processes already looked at for `groups`.
    probed: std::collections::HashSet<i32>,
    /// How many of `groups` lockrun may keep open (see `known_groups`).
    known_groups: usize,
    /// The guard was asked to kill the job.
    delegated: bool,
    /// When to count the job's processes next (see `Policy::measured`).
    next_count: Boot,
    /// The kill's cost as the guard knows it.
    told_cost: std::time::Duration,
    /// The guard knows lockrun is stopping the job.
    told_stopping: bool,
}

impl Supervisor {
    fn new(
        job: &Job,
        deadline: Option<Arc<Deadline>>,
        renewer: Renewing,
        guard: Guard,
        main: i32,
        shares_group: bool,
    ) -> Supervisor {
        let mut renewer = renewer;
        let renew_now = renewer.wake();
        Supervisor {
            policy: Policy::new(job.timing, shares_group),
            timing: job.timing,
            deadline,
            renewer: Some(renewer),
            renew_now,
            watchdog: None,
            first_renew: job.sent_at.add(job.timing.renew_every),
            main,
            guard,
            guard_gone: false,
            reserve: procs::reserve_fds(),
            orphans_only: false,
            main_fd: None,
            delegated: false,
            groups: Vec::new(),
            probed: std::collections::HashSet::new(),
            known_groups: procs::known_groups(),
            next_count: job.sent_at.add(job.timing.renew_every),
            told_cost: std::time::Duration::ZERO,
            told_stopping: false,
        }
    }

    /// The loop, until nothing of the job is left: gather what happened, let
    /// the policy decide, carry out its actions, sleep until the next is due.
    fn run(&mut self, w: &mut Wakeups, ev_tx: &Sender<LeaseEvent>, ev_rx: &Receiver<LeaseEvent>) {
        loop {
            let now = Boot::now();
            let (gone, events) = self.gather(now, &mut w.signals, ev_tx, ev_rx, &w.wake_tx);
            let dl = self.deadline.as_ref().map(|d| d.get());
            let just_ended = events.iter().any(|e| matches!(e, Event::JobEnded(_)));
            let mut actions = Vec::new();
            for ev in events {
                actions.extend(self.policy.on(ev, now));
            }
            if gone {
                break;
            }
            // A lease past its time is lost now, before any walk: what a walk
            // then measures can no longer undo it (a walk that stopped processes
            // is always followed by their SIGTERM and SIGCONT).
            actions.extend(self.policy.check_time(now, dl));
            if self.policy_is_stopping() && !self.told_stopping {
                // Before the first SIGTERM: the guard must not send its own.
                self.told_stopping = true;
                self.guard.orders.stopping();
            }
            // Right after the main process ended, the guard usually exits within
            // microseconds (nothing left): look for leftovers a moment later
            // rather than walk /proc on every run.
            let settling = just_ended && !self.policy_is_stopping();
            actions.extend(self.walk_and_tick(now, dl, settling));
            if self.policy_is_stopping() {
                // Abandon any renewal in flight; the kill schedule never waits for it.
                self.watchdog.take();
                self.renewer.take();
            }
            for a in actions {
                self.act(a);
            }
            let next = self.next_wake(dl, settling);
            self.sleep(w, next);
        }
    }

    /// What happened since the last look: the signals caught, the lease's
    /// news, the guard's, a renewal due at once; (true, _) once nothing of
    /// the job is left.
    fn gather(
        &mut self,
        now: Boot,
        signals: &mut SignalDelivery<UnixStream, WithRawSiginfo>,
        ev_tx: &Sender<LeaseEvent>,
        ev_rx: &Receiver<LeaseEvent>,
        wake_tx: &UnixStream,
    ) -> (bool, Vec<Event>) {
        let mut events = Vec::new();
        for info in signals.pending() {
            events.push(Event::Signal {
                sig: info.si_signo,
                // The terminal's signals (Ctrl-C, Ctrl-Z, a resize) come from
                // the kernel; `kill` from another process says SI_USER.
                from_terminal: info.si_code == libc::SI_KERNEL,
            });
        }
        events.extend(lease_events(ev_rx));
        let (gone, more) = self.guard_news();
        events.extend(more);
        if self.renewer.is_some()
            && let Some(w) = &self.renew_now
            && readable(w.as_fd())
        {
            if crate::watchdog::drain(w.as_fd()) {
                self.first_renew = self.first_renew.min(now);
            } else {
                // Hung up with nothing to read: nobody is left to ask.
                self.renew_now = None;
            }
        }
        if !gone && let Some(e) = self.start_watchdog(now, ev_tx, wake_tx) {
            events.push(e);
        }
        (gone, events)
    }

    /// Walk the job's processes when the policy wants them (not while the
    /// job's end is `settling`) or when they are due to be counted, then let
    /// the policy decide with what the walk found.
    fn walk_and_tick(&mut self, now: Boot, dl: Option<Boot>, settling: bool) -> Vec<Action> {
        // While the job runs under a lease that can expire, count its
        // processes once per renewal: the kill schedule allows for their number.
        let count = dl.is_some() && !self.policy_is_stopping() && now >= self.next_count;
        let walk = self.policy.walk(now, dl);
        let walked = if (self.policy.wants_procs() && !settling) || count {
            if count {
                self.next_count = now.add(self.timing.renew_every);
                // While the main process most likely still runs.
                let _ = self.main_pidfd();
            }
            Some(self.processes(walk, now, dl))
        } else {
            None
        };
        let procs = walked.as_ref().map_or(&[][..], |(w, _)| &w.pids[..]);
        let actions = self.policy.tick(now, dl, procs);
        if let Some((w, took)) = &walked {
            // After tick, which decided with the cost the walk used.
            self.policy.measured(w.pids.len(), *took);
            let cost = self.policy.kill_cost();
            if cost != self.told_cost {
                self.told_cost = cost;
                self.guard.orders.cost(cost);
            }
            if !w.complete && self.policy_is_stopping() {
                // lockrun could not see every process (out of descriptors):
                // its guard, the subreaper of them all, kills the job.
                self.delegate_kill();
            }
        }
        actions
    }

    /// When the loop must look again even if nothing wakes it.
    fn next_wake(&self, dl: Option<Boot>, settling: bool) -> Option<Boot> {
        let mut next = self.policy.next_tick(Boot::now(), dl);
        if self.renewer.is_some() && !self.policy_is_stopping() {
            next = Some(next.map_or(self.first_renew, |n| n.min(self.first_renew)));
        }
        if dl.is_some() && !self.policy_is_stopping() {
            next = Some(next.map_or(self.next_count, |n| n.min(self.next_count)));
        }
        if self.orphans_only {
            next = Some(Boot::now().add(std::time::Duration::from_millis(50)));
        }
        if settling {
            next = Some(Boot::now().add(std::time::Duration::from_millis(2)));
        }
        next
    }

    /// Sleep until something wakes the loop or `next` comes.
    fn sleep(&self, w: &Wakeups, next: Option<Boot>) {
        let mut more = Vec::new();
        // Before the watchdog runs, a renewal due at once starts it.
        if let Some(r) = self.renew_now.as_ref().filter(|_| self.renewer.is_some()) {
            more.push(r.as_fd());
        }
        // Once the guard is gone its pipe stays at end-of-file: not a wake-up.
        if !self.guard_gone {
            more.push(self.guard.reports_fd());
        }
        w.sleep(&more, next);
    }

    fn policy_is_stopping(&self) -> bool {
        self.policy.is_stopping()
    }

    /// What the guard said; (true, _) once nothing of the job is left.
    fn guard_news(&mut self) -> (bool, Vec<Event>) {
        let mut out = Vec::new();
        if !self.guard_gone {
            let mut closed = false;
            for r in self.guard.read(&mut closed) {
                match r {
                    Report::Ended(end) => {
                        log::info(format!("job {}", describe_end(end)));
                        out.push(Event::JobEnded(end));
                    }
                    Report::TookOver => out.push(Event::GuardTookOver(
                        "lockrun did not run when the lease had to be renewed (it was stopped, \
                         traced or starved), and its guard process took over"
                            .into(),
                    )),
                    Report::Started(_) | Report::NotStarted(_) | Report::Late => {}
                }
            }
            if closed {
                self.guard_gone = true;
                if self.guard.reap() {
                    return (true, out);
                }
                // The guard died (OOM killer, kill -9): its orphans are ours now.
                self.orphans_only = true;
                out.push(Event::Failed("the guard process died".into()));
            }
        }
        if self.orphans_only && reap_orphans() {
            return (true, out);
        }
        (false, out)
    }

    /// Start renewing once the first renewal is due. Short jobs never pay for
    /// the thread; failing to start it after the job started is a failure of
    /// lockrun's own.
    fn start_watchdog(
        &mut self,
        now: Boot,
        ev_tx: &std::sync::mpsc::Sender<LeaseEvent>,
        wake_tx: &UnixStream,
    ) -> Option<Event> {
        if self.watchdog.is_some() || now < self.first_renew || self.policy_is_stopping() {
            return None;
        }
        let r = self.renewer.take()?;
        let renew_now = self.renew_now.take();
        let started = wake_tx.try_clone().and_then(|wake| {
            Watchdog::spawn(
                r,
                self.timing,
                self.deadline.clone(),
                ev_tx.clone(),
                wake,
                renew_now,
            )
        });
        match started {
            Ok(w) => {
                self.watchdog = Some(w);
                None
            }
            Err(e) => Some(Event::Failed(format!(
                "cannot start renewing the lease: {e}"
            ))),
        }
    }
}

/// Reap whatever of the job came to lockrun; true once nothing is left.
fn reap_orphans() -> bool {
    use rustix::process::{WaitOptions, wait};
    loop {
        match wait(WaitOptions::NOHANG) {
            Ok(Some(_)) => continue,
            Ok(None) => return false,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return true,
        }
    }
}

/// "exited with 3", "killed by SIGKILL".
pub fn describe_end(end: crate::exit::JobEnd) -> String {
    match end {
        crate::exit::JobEnd::Exited(c) => format!("exited with {c}"),
        crate::exit::JobEnd::Signaled(s) => format!("killed by {}", signal_name(s)),
    }
}

pub fn signal_name(sig: i32) -> String {
    signal_hook::low_level::signal_name(sig)
        .map(str::to_string)
        .unwrap_or_else(|| format!("signal {sig}"))
}
