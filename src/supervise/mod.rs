//! Runs the job: start it under a guard process, pass signals on, and carry
//! out the decisions of `policy` (the kill schedule, leftovers, terminal
//! stops) until no process of the job is left. Knows nothing of engines: the
//! lease reaches it as a deadline, a renewer and events.

mod guard;
mod policy;

use std::ffi::OsString;
use std::os::fd::{AsFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError, channel};

use rustix::event::{PollFd, PollFlags, poll};
use signal_hook::iterator::backend::SignalDelivery;
use signal_hook::iterator::exfiltrator::WithRawSiginfo;

use crate::backend::Renewing;
use crate::clock::{Boot, BootTimer};
use crate::exit::{Class, Failure, ResultExt, fail};
use crate::log;
use crate::schedule::Timing;
use crate::spawn::{Prepared, SpawnError};
use crate::sys;
use crate::watchdog::{Deadline, Event as LeaseEvent, Watchdog};
use guard::{Guard, Report};
pub use policy::Outcome;
use policy::{Action, Event, FORWARDED, JOB_CONTROL, Policy, Walk};

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
    sys::unblock(&caught);
    let (sig_rx, sig_tx) = UnixStream::pair().exit_as(Class::Internal)?;
    let mut signals = SignalDelivery::with_pipe(sig_rx, sig_tx, WithRawSiginfo, &caught)
        .exit_as(Class::Internal)?;
    caught_here();
    let (wake_rx, wake_tx) = UnixStream::pair().exit_as(Class::Internal)?;
    wake_rx.set_nonblocking(true).exit_as(Class::Internal)?;
    wake_tx.set_nonblocking(true).exit_as(Class::Internal)?;
    let timer = BootTimer::new().exit_as(Class::Internal)?;
    let shares_group = sys::at_terminal();

    let env_remove: Vec<&str> = job.env_remove.iter().map(String::as_str).collect();
    let spec = crate::spawn::Spec {
        argv: &job.command,
        env: &job.env,
        env_remove: &env_remove,
        inherit_fd: job.inherit_fd,
        caught: &caught,
        // At a terminal the job joins lockrun's group (the guard has its own).
        group: if shares_group {
            rustix::process::getpgrp().as_raw_nonzero().get()
        } else {
            0
        },
        keep_sigpipe_ignored: SIGPIPE_IGNORED.load(std::sync::atomic::Ordering::Relaxed),
    };
    let shown = job.command[0].to_string_lossy().into_owned();
    let mut prepared =
        Prepared::new(&spec).map_err(|e| spawn_failure(&shown, SpawnError::Other(e)))?;
    let watch = guard::Watch {
        timing: job.timing,
        deadline: deadline.as_ref().map(|d| d.get()),
        shares_group,
    };
    let mut guard = Guard::start(&mut prepared, !job.secret, watch).map_err(|e| {
        fail(
            Class::Internal,
            format!("cannot start the guard process: {e}"),
        )
    })?;
    // The guard hears of every deadline the renewals earn, from the thread
    // that renewed: should lockrun stop, it stops the job in time itself.
    if let Some(d) = &deadline {
        let orders = guard.orders.clone();
        d.watch(move |at| orders.deadline(at));
    }
    let Some(main) = first_report(&mut guard).map_err(|e| spawn_failure(&shown, e))? else {
        return Ok(Outcome {
            end: None,
            lost: Some(
                "lockrun was stopped or starved between the grant and the job's start".into(),
            ),
            failed: None,
            started: false,
        });
    };
    log::info(format!("started job as pid {main}"));
    log::start_async();
    started();

    let mut renewer = renewer;
    let renew_now = renewer.wake();
    let mut sup = Supervisor {
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
        reserve: reserve_fds(),
        orphans_only: false,
        main_fd: None,
        delegated: false,
        groups: Vec::new(),
        probed: std::collections::HashSet::new(),
        known_groups: known_groups(),
        next_count: job.sent_at.add(job.timing.renew_every),
        told_cost: std::time::Duration::ZERO,
        told_stopping: false,
    };
    let (ev_tx, ev_rx) = channel::<LeaseEvent>();
    loop {
        let now = Boot::now();
        let mut events = Vec::new();
        for info in signals.pending() {
            events.push(Event::Signal {
                sig: info.si_signo,
                // The terminal's signals (Ctrl-C, Ctrl-Z, a resize) come from
                // the kernel; `kill` from another process says SI_USER.
                from_terminal: info.si_code == libc::SI_KERNEL,
            });
        }
        events.extend(lease_events(&ev_rx));
        let (gone, more) = sup.guard_news();
        events.extend(more);
        if sup.renewer.is_some()
            && let Some(w) = &sup.renew_now
            && readable(w.as_fd())
        {
            if crate::watchdog::drain(w.as_fd()) {
                sup.first_renew = sup.first_renew.min(now);
            } else {
                // Hung up with nothing to read: nobody is left to ask.
                sup.renew_now = None;
            }
        }
        if !gone && let Some(e) = sup.start_watchdog(now, &ev_tx, &wake_tx) {
            events.push(e);
        }

        let dl = sup.deadline.as_ref().map(|d| d.get());
        let just_ended = events.iter().any(|e| matches!(e, Event::JobEnded(_)));
        let mut actions = Vec::new();
        for ev in events {
            actions.extend(sup.policy.on(ev, now));
        }
        if gone {
            break;
        }
        // A lease past its time is lost now, before any walk: what a walk
        // then measures can no longer undo it (a walk that stopped processes
        // is always followed by their SIGTERM and SIGCONT).
        actions.extend(sup.policy.check_time(now, dl));
        if sup.policy_is_stopping() && !sup.told_stopping {
            // Before the first SIGTERM: the guard must not send its own.
            sup.told_stopping = true;
            sup.guard.orders.stopping();
        }
        // Right after the main process ended, the guard usually exits within
        // microseconds (nothing left): look for leftovers a moment later
        // rather than walk /proc on every run.
        let settling = just_ended && !sup.policy_is_stopping();
        // While the job runs under a lease that can expire, count its
        // processes once per renewal: the kill schedule allows for their number.
        let count = dl.is_some() && !sup.policy_is_stopping() && now >= sup.next_count;
        let walk = sup.policy.walk(now, dl);
        let walked = if (sup.policy.wants_procs() && !settling) || count {
            if count {
                sup.next_count = now.add(sup.timing.renew_every);
                // While the main process most likely still runs.
                let _ = sup.main_pidfd();
            }
            Some(sup.processes(walk, now, dl))
        } else {
            None
        };
        let procs = walked.as_ref().map_or(&[][..], |(w, _)| &w.pids[..]);
        actions.extend(sup.policy.tick(now, dl, procs));
        if let Some((w, took)) = &walked {
            // After tick, which decided with the cost the walk used.
            sup.policy.measured(w.pids.len(), *took);
            let cost = sup.policy.kill_cost();
            if cost != sup.told_cost {
                sup.told_cost = cost;
                sup.guard.orders.cost(cost);
            }
            if !w.complete && sup.policy_is_stopping() {
                // lockrun could not see every process (out of descriptors):
                // its guard, the subreaper of them all, kills the job.
                sup.delegate_kill();
            }
        }
        if sup.policy_is_stopping() {
            // Abandon any renewal in flight; the kill schedule never waits for it.
            sup.watchdog.take();
            sup.renewer.take();
        }
        for a in actions {
            sup.act(a);
        }

        let mut next = sup.policy.next_tick(Boot::now(), dl);
        if sup.renewer.is_some() && !sup.policy_is_stopping() {
            next = Some(next.map_or(sup.first_renew, |n| n.min(sup.first_renew)));
        }
        if dl.is_some() && !sup.policy_is_stopping() {
            next = Some(next.map_or(sup.next_count, |n| n.min(sup.next_count)));
        }
        if sup.orphans_only {
            next = Some(Boot::now().add(std::time::Duration::from_millis(50)));
        }
        if settling {
            next = Some(Boot::now().add(std::time::Duration::from_millis(2)));
        }
        let mut fds = vec![signals.get_read().as_fd(), wake_rx.as_fd()];
        // Before the watchdog runs, a renewal due at once starts it.
        if let Some(w) = sup.renew_now.as_ref().filter(|_| sup.renewer.is_some()) {
            fds.push(w.as_fd());
        }
        // Once the guard is gone its pipe stays at end-of-file: not a wake-up.
        if !sup.guard_gone {
            fds.push(sup.guard.reports_fd());
        }
        wait(&fds, &timer, next);
        drain(&wake_rx);
    }

    // Nothing of the job is left.
    sup.watchdog.take();
    log::stop_async();
    Ok(sup.policy.outcome())
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

/// Two descriptors (copies of stdin) to free when lockrun needs to open files
/// while it may be at its descriptor limit.
fn reserve_fds() -> Vec<std::os::fd::OwnedFd> {
    (0..2)
        .filter_map(|_| rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3).ok())
        .collect()
}

impl Supervisor {
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

    /// Signal the job's process group (through the main process's pidfd);
    /// false when there is none to signal: at a terminal the job shares
    /// lockrun's group, and without a pidfd the group is not provably the job's.
    fn signal_group(&mut self, sig: i32) -> bool {
        if self.policy.shares_group() {
            return false;
        }
        let main = self.main;
        match self.main_pidfd() {
            Some(fd) => {
                sys::signal_group_of(fd.as_fd(), main, sig);
                true
            }
            None => false,
        }
    }

    fn main_pidfd(&mut self) -> Option<&std::os::fd::OwnedFd> {
        let (main, guard) = (self.main, self.guard.pid);
        self.main_fd
            .get_or_insert_with(|| sys::pidfd_of_child(main, guard))
            .as_ref()
    }

    /// Walk every live process of the job, sending each what the policy
    /// decides for it at `now` while the walk holds it by a pidfd; how long
    /// the walk took comes back with what it found.
    fn processes(
        &mut self,
        how: Walk,
        now: Boot,
        dl: Option<Boot>,
    ) -> (sys::Walked, std::time::Duration) {
        let root = self.walk_root();
        // The walk opens files: give it the descriptors kept in reserve, so
        // that lockrun at its descriptor limit still finds every process.
        self.reserve.clear();
        let started = Boot::now();
        if how == Walk::Kill {
            // A call per known group stops them whole before the walk starts.
            self.signal_group(libc::SIGKILL);
            for g in &self.groups {
                sys::signal_led_group(g.as_fd(), libc::SIGKILL);
            }
        }
        // Only a walk that merely counts looks for groups: a pidfd kept
        // while the job is being stopped could take a descriptor the walk
        // needs at lockrun's limit.
        let probing = how == Walk::List && !self.policy.is_stopping();
        if probing {
            // Groups that emptied give their place to new ones.
            self.groups.retain(|g| sys::leads_group(g.as_fd()));
        }
        let max = if probing { self.known_groups } else { 0 };
        let (policy, groups, probed) = (&self.policy, &mut self.groups, &mut self.probed);
        let send = |fd: std::os::fd::BorrowedFd<'_>, sigs: &[i32]| {
            for &sig in sigs {
                sys::signal_pidfd(fd, sig);
            }
        };
        let walked = sys::walk(
            root,
            |fd, p| {
                send(fd, policy.signals_for(p, now, dl).0);
                probe_group(groups, probed, max, fd, p);
            },
            |fd, p| send(fd, policy.signals_for(p, now, dl).1),
        );
        if probing {
            let live: std::collections::HashSet<i32> = walked.pids.iter().copied().collect();
            self.probed.retain(|p| live.contains(p));
        }
        let took = Boot::now().since(started);
        log::debug(format!(
            "{how:?} walk: {} process(es) in {took:.1?}{}",
            walked.pids.len(),
            if walked.complete { "" } else { " (incomplete)" }
        ));
        self.reserve = reserve_fds();
        (walked, took)
    }

    fn walk_root(&self) -> i32 {
        if self.orphans_only {
            rustix::process::getpid().as_raw_nonzero().get()
        } else {
            self.guard.pid
        }
    }

    /// Ask the guard to kill every process of the job (it walks with its own
    /// few descriptors), once.
    fn delegate_kill(&mut self) {
        if !self.delegated && !self.guard_gone {
            self.delegated = true;
            log::info("asking the guard to kill the job");
            sys::signal_pid(self.guard.pid, guard::KILL_REQUEST);
        }
    }

    /// Carry out one decision. Signals to single processes went out during
    /// the walk; here the job's group gets them too.
    fn act(&mut self, a: Action) {
        match a {
            Action::Forward(sig) => {
                log::info(format!("forwarding {}", signal_name(sig)));
                if self.policy.shares_group() || !self.signal_group(sig) {
                    // At a terminal, or with no group to reach: each process.
                    let root = self.walk_root();
                    sys::walk(root, |fd, _| sys::signal_pidfd(fd, sig), |_, _| {});
                }
            }
            Action::Signal(pids, sig) => {
                if sig == libc::SIGTERM {
                    log::info(format!("stopping {} process(es) of the job", pids.len()));
                }
                // The job's own group gets SIGKILL too, in case a walk of
                // /proc missed some; never SIGTERM, which each process got
                // from the walk once already (a second one would run a
                // job's TERM trap twice).
                if sig == libc::SIGKILL {
                    self.signal_group(sig);
                }
            }
            Action::Suspend(sig) => {
                log::info("stopped at the terminal; suspending lockrun with the job");
                sys::stop_like(sig);
            }
            Action::Alert(msg) => log::alert(msg),
        }
    }
}

/// How many other groups of the job lockrun keeps a pidfd for: each costs a
/// descriptor, so at most 32 and none under a tight descriptor limit (beyond
/// these, the walk reaches every process one by one).
fn known_groups() -> usize {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    (soft.saturating_sub(64) / 8).min(32) as usize
}

/// Note whether process `p`, just found under the subreaper (so the job's),
/// leads a process group: its pidfd then reaches that group in one call.
fn probe_group(
    groups: &mut Vec<std::os::fd::OwnedFd>,
    probed: &mut std::collections::HashSet<i32>,
    max: usize,
    fd: std::os::fd::BorrowedFd<'_>,
    p: i32,
) {
    if groups.len() >= max || !probed.insert(p) {
        return;
    }
    if sys::leads_group(fd)
        && let Ok(kept) = fd.try_clone_to_owned()
    {
        groups.push(kept);
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

/// `fd` has something to read (or hung up), without waiting.
fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
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
fn wait(fds: &[std::os::fd::BorrowedFd<'_>], timer: &BootTimer, at: Option<Boot>) {
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
