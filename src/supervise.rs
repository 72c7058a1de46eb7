//! Runs the job: spawn, forward signals, reap everything it leaves behind, and
//! carry out the kill schedule when the watchdog says the lease is lost.
//! Knows nothing of Redis: the lease reaches it as a deadline and events.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError, channel};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Pid, WaitId, WaitIdOptions, waitid};

use crate::exit::{Failure, JobEnd, Kind, ResultExt, fail};
use crate::lease::{Boot, BootTimer, Deadline, Event, Renewer, Timing, Watchdog};
use crate::log;
use crate::spawn::SpawnError;

/// Signals lockrun passes on to the job's process group.
const FORWARDED: [i32; 9] = [
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
/// Caught so that lockrun itself is never stopped (a stopped lockrun cannot renew).
const JOB_CONTROL: [i32; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// How long after SIGKILL a process may linger before we say it cannot be killed.
const UNKILLABLE_AFTER: Duration = Duration::from_secs(5);

/// Everything the supervisor needs to run one job under one lease.
pub struct Job {
    pub command: Vec<OsString>,
    pub env: Vec<(String, String)>,
    /// Inherited variables the job must not see (a URL with a password).
    pub env_remove: Vec<&'static str>,
    /// The local backend's lock descriptor, inherited by the job.
    pub inherit_fd: Option<RawFd>,
    pub timing: Timing,
    /// When the granting request was sent.
    pub granted_at: Boot,
}

/// How supervision ended.
#[derive(Debug)]
pub struct Outcome {
    pub end: JobEnd,
    /// The lease was lost while a process of the job was alive.
    pub lost: Option<String>,
}

/// Signals that were ignored when lockrun started (nohup): they stay ignored
/// in the job, so lockrun leaves them alone. A bit per signal, as in SigIgn.
fn ignored_at_start() -> u64 {
    let mut mask = 0u64;
    for sig in FORWARDED.iter().chain(JOB_CONTROL.iter()) {
        // SAFETY: a query only (no new action); `old` is a local.
        let ignored = unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(*sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        };
        if ignored {
            mask |= 1u64 << (sig - 1);
        }
    }
    mask
}

fn is_ignored(mask: u64, sig: i32) -> bool {
    sig > 0 && mask & (1u64 << (sig - 1)) != 0
}

/// Send `sig` to a process, never to pid ≤ 1 (which would mean "everyone").
fn signal_pid(pid: i32, sig: i32) {
    if pid > 1 {
        // SAFETY: kill(2) has no memory effects; the pid is a child we have not reaped.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Send `sig` to a process group, never to pgid ≤ 1.
fn signal_group(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: as above; the group leader is unreaped, so the id is not reused.
        unsafe { libc::kill(-pgid, sig) };
    }
}

/// Our children, from every thread's `children` list (orphans of the job are
/// re-parented to us as subreaper, to any of our threads).
fn children() -> Vec<i32> {
    let mut out = Vec::new();
    // Only the main thread forks, and the kernel hands orphans to the first
    // live thread of the reaper's group, the main thread: one file suffices
    // (this runs on the main thread). The full scan is the fallback.
    if let Ok(s) = std::fs::read_to_string("/proc/thread-self/children") {
        out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        return out;
    }
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The terminal the job should own, when lockrun is in its foreground.
struct Tty {
    fd: RawFd,
    our_pgrp: i32,
}

fn foreground_tty() -> Option<Tty> {
    let fd = libc::STDIN_FILENO;
    // SAFETY: plain syscalls on a descriptor number.
    let fg = unsafe { libc::tcgetpgrp(fd) };
    let ours = unsafe { libc::getpgrp() };
    (fg > 0 && fg == ours).then_some(Tty { fd, our_pgrp: ours })
}

/// Give the terminal's foreground to `pgrp`. From a background group this would
/// raise SIGTTOU, so it is blocked for the call.
fn set_foreground(fd: RawFd, pgrp: i32) {
    // SAFETY: sigset manipulation on a local; tcsetpgrp on a descriptor number.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        libc::tcsetpgrp(fd, pgrp);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// Stop lockrun with the signal that stopped the job, so the calling shell
/// reports the same thing it would without lockrun (as sudo does). Our handler
/// for it is set aside for the moment and restored once we are continued.
fn stop_like(sig: i32) {
    // SAFETY: sigaction on a local struct; raise on ourselves.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        let mut saved: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        let swapped = sig != libc::SIGSTOP && libc::sigaction(sig, &dfl, &mut saved) == 0;
        libc::raise(if swapped { sig } else { libc::SIGSTOP });
        if swapped {
            libc::sigaction(sig, &saved, std::ptr::null_mut());
        }
    }
}

/// SIGPIPE was ignored when lockrun started (lockrun itself always ignores it).
static SIGPIPE_IGNORED: AtomicBool = AtomicBool::new(false);

#[cfg_attr(test, allow(dead_code))] // called from the C entry point only
pub fn set_sigpipe_ignored_at_start(ignored: bool) {
    SIGPIPE_IGNORED.store(ignored, Ordering::Relaxed);
}

/// A flag per signal, set by the handler and taken by the supervisor loop.
static PENDING: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

/// The signal plumbing: one handler per signal sets its flag and wakes poll.
struct Signals {
    /// The signals that now have lockrun's handler (the job resets them).
    caught: Vec<i32>,
}

impl Signals {
    fn install(wake: &UnixStream, ignored: u64) -> std::io::Result<Signals> {
        // The handler owns a duplicate of the wake-up socket for good: lockrun
        // exits soon after the job, and an uninstalled handler would let a
        // late SIGTERM kill lockrun in the middle of its release.
        let fd = wake.try_clone()?.into_raw_fd();
        // SAFETY: sigset manipulation on a local.
        let mut unblock: libc::sigset_t = unsafe { std::mem::zeroed() };
        unsafe { libc::sigemptyset(&mut unblock) };
        let mut caught = Vec::new();
        for sig in FORWARDED
            .iter()
            .chain(JOB_CONTROL.iter())
            .chain([libc::SIGCHLD].iter())
        {
            if is_ignored(ignored, *sig) {
                continue;
            }
            // A signal blocked when lockrun started could never be forwarded.
            unsafe { libc::sigaddset(&mut unblock, *sig) };
            let sig = *sig;
            caught.push(sig);
            // SAFETY: the action only stores an atomic and calls send(2) with
            // MSG_DONTWAIT, both async-signal-safe.
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    PENDING[sig as usize].store(true, Ordering::SeqCst);
                    libc::send(fd, [1u8].as_ptr().cast(), 1, libc::MSG_DONTWAIT);
                })?;
            }
        }
        // SAFETY: changes only this thread's mask; the helper threads are
        // started later and inherit it.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &unblock, std::ptr::null_mut()) };
        Ok(Signals { caught })
    }

    fn take(&self, sig: i32) -> bool {
        PENDING[sig as usize].swap(false, Ordering::SeqCst)
    }
}

fn spawn(job: &Job, signals: &Signals, ignored: u64, tty: Option<&Tty>) -> Result<i32, Failure> {
    let spec = crate::spawn::Spec {
        argv: &job.command,
        env: &job.env,
        // An outer lockrun's lock descriptor must not leak through to this job.
        env_remove: &[&["LOCKRUN_LOCK_FD"][..], &job.env_remove[..]].concat(),
        inherit_fd: job.inherit_fd,
        caught: &signals.caught,
        tty_fd: tty.map(|t| t.fd),
        keep_ttou_ignored: is_ignored(ignored, libc::SIGTTOU),
        keep_sigpipe_ignored: SIGPIPE_IGNORED.load(Ordering::Relaxed),
    };
    let shown = job.command[0].to_string_lossy();
    crate::spawn::spawn(&spec).map_err(|e| match e {
        SpawnError::NotFound => fail(Kind::NotFound, format!("{shown}: command not found")),
        SpawnError::NotExecutable(e) => {
            fail(Kind::NotExecutable, format!("{shown}: cannot execute: {e}"))
        }
        SpawnError::Other(e) => fail(Kind::Internal, format!("{shown}: cannot start: {e}")),
    })
}

fn drain(mut wake: &UnixStream) {
    let mut buf = [0u8; 64];
    loop {
        match wake.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return,
        }
    }
}

fn wait_for(wake: BorrowedFd<'_>, timer: &BootTimer, at: Option<Boot>) {
    if let Some(at) = at
        && timer.arm(at).is_err()
    {
        // Fall back to a short poll so deadlines are still checked.
        let ts = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        let mut fds = [PollFd::from_borrowed_fd(wake, PollFlags::IN)];
        let _ = poll(&mut fds, Some(&ts));
        return;
    }
    let mut fds = [
        PollFd::from_borrowed_fd(wake, PollFlags::IN),
        PollFd::from_borrowed_fd(timer.fd(), PollFlags::IN),
    ];
    let n = if at.is_some() { 2 } else { 1 };
    let _ = poll(&mut fds[..n], None);
    // Reading the timer resets it; a fired timer is otherwise level-triggered.
    let mut buf = [0u8; 8];
    let _ = rustix::io::read(timer.fd(), &mut buf);
}

/// Run the job under the lease and return when nothing of it is left.
/// The watchdog starts on `renewer` only when the first renewal is due.
pub fn run(
    job: Job,
    deadline: Arc<Deadline>,
    mut renewer: Option<Box<dyn Renewer>>,
) -> Result<Outcome, Failure> {
    let ignored = ignored_at_start();
    let (wake_rx, wake_tx) = UnixStream::pair().kind(Kind::Internal)?;
    wake_rx.set_nonblocking(true).kind(Kind::Internal)?;
    wake_tx.set_nonblocking(true).kind(Kind::Internal)?;
    // Before spawning, so no exit or signal slips between spawn and install.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).kind(Kind::Internal)?;
    let signals = Signals::install(&wake_tx, ignored).kind(Kind::Internal)?;
    let tty = foreground_tty();
    let timer = BootTimer::new().kind(Kind::Internal)?;

    let pid = spawn(&job, &signals, ignored, tty.as_ref())?;
    // The job's group id is its leader's pid (setpgid(0, 0) in the child).
    let pgid = pid;
    if let Some(t) = &tty {
        set_foreground(t.fd, pgid);
    }
    log::info(format!("started job as pid {pid}"));
    log::start_async();

    let timing = job.timing;
    let (ev_tx, ev_rx) = channel::<Event>();
    let ev_rx: Receiver<Event> = ev_rx;
    let mut watchdog: Option<Watchdog> = None;
    let first_renew = job.granted_at.add(timing.renew_every);

    let mut main_end: Option<JobEnd> = None;
    let mut lost: Option<(String, Boot)> = None;
    let mut kill_sent = false;
    // Leftover processes: when we first sent them SIGTERM, and SIGKILL.
    let mut term_at: HashMap<i32, Boot> = HashMap::new();
    let mut killed_at: HashMap<i32, Boot> = HashMap::new();
    let mut warned_stuck = false;

    loop {
        let now = Boot::now();

        // Lease: watchdog news, then our own view of the deadline (this also
        // catches waking up from a long pause of lockrun itself).
        loop {
            match ev_rx.try_recv() {
                Ok(Event::Renewed { took }) => log::debug(format!("renewed in {took:.1?}")),
                Ok(Event::Retrying { error }) => {
                    log::info(format!("renewal failed: {error}; retrying"))
                }
                Ok(Event::Lost { reason }) => {
                    if lost.is_none() {
                        lost = Some((reason, now));
                    }
                }
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => break,
            }
        }
        if lost.is_none() && now >= timing.lost_at(deadline.get()) {
            lost = Some(("the lease could not be renewed in time".into(), now));
        }
        if lost.is_none()
            && watchdog.is_none()
            && now >= first_renew
            && let Some(r) = renewer.take()
        {
            // Started only when the job outlives the first renewal interval:
            // short jobs never pay for the thread.
            let w = Watchdog::spawn(
                r,
                timing,
                Arc::clone(&deadline),
                ev_tx.clone(),
                wake_tx.try_clone().kind(Kind::Internal)?,
            )
            .kind(Kind::Internal)?;
            watchdog = Some(w);
        }

        // Lost: SIGTERM (and SIGCONT, so a stopped job sees it) to everything,
        // SIGKILL after the grace, and always `slack` before the lease ends.
        let mut kill_at = None;
        if let Some((reason, since)) = &lost {
            if let Some(mut w) = watchdog.take() {
                w.stop();
            }
            let at = since
                .add(timing.grace)
                .min(deadline.get().sub(timing.slack));
            kill_at = Some(at);
            if !kill_sent {
                kill_sent = true;
                log::info(format!("lease lost: {reason}; stopping the job"));
                signal_group(pgid, libc::SIGTERM);
                signal_group(pgid, libc::SIGCONT);
                for c in children() {
                    signal_pid(c, libc::SIGTERM);
                    signal_pid(c, libc::SIGCONT);
                    term_at.entry(c).or_insert(now);
                }
            }
            if now >= at {
                signal_group(pgid, libc::SIGKILL);
                for c in children() {
                    if let std::collections::hash_map::Entry::Vacant(e) = killed_at.entry(c) {
                        signal_pid(c, libc::SIGKILL);
                        e.insert(now);
                    }
                }
            }
        }

        // Forward signals to the job's group.
        for sig in FORWARDED {
            if signals.take(sig) {
                log::info(format!("forwarding signal {sig}"));
                signal_group(pgid, sig);
            }
        }
        if signals.take(libc::SIGTSTP) {
            signal_group(pgid, libc::SIGTSTP);
        }
        // TTIN/TTOU sent to lockrun are dropped: they would only stop us.
        signals.take(libc::SIGTTIN);
        signals.take(libc::SIGTTOU);
        signals.take(libc::SIGCHLD);

        // Job control at a terminal: the job stopped (Ctrl-Z), so stop with it.
        if main_end.is_none()
            && let Some(t) = &tty
            && let Ok(Some(st)) = waitid(
                WaitId::Pid(Pid::from_raw(pid).expect("child pid > 0")),
                WaitIdOptions::STOPPED | WaitIdOptions::NOHANG,
            )
            && st.stopped()
        {
            set_foreground(t.fd, t.our_pgrp);
            log::info("job stopped at the terminal; suspending lockrun");
            stop_like(st.stopping_signal().unwrap_or(libc::SIGSTOP));
            // Resumed by fg/bg. The lease may have run out meanwhile.
            let now = Boot::now();
            if lost.is_none() && now >= timing.lost_at(deadline.get()) {
                lost = Some(("the lease ran out while suspended".into(), now));
                continue;
            }
            // SAFETY: plain syscalls.
            let in_foreground = unsafe { libc::tcgetpgrp(t.fd) == libc::getpgrp() };
            if in_foreground {
                set_foreground(t.fd, pgid);
            }
            signal_group(pgid, libc::SIGCONT);
            continue;
        }

        // Observe the main child's exit without reaping it, so its pid and
        // group id stay reserved while leftovers are signalled through them.
        if main_end.is_none()
            && let Ok(Some(st)) = waitid(
                WaitId::Pid(Pid::from_raw(pid).expect("child pid > 0")),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
            )
        {
            let end = match (st.exit_status(), st.terminating_signal()) {
                (Some(code), _) => JobEnd::Exited(code),
                (None, Some(sig)) => JobEnd::Signaled(sig),
                _ => JobEnd::Exited(0),
            };
            log::info(format!("job exited: {end:?}"));
            main_end = Some(end);
        }

        let mut next_timer: Option<Boot> = None;
        let mut consider = |t: Boot| {
            next_timer = Some(next_timer.map_or(t, |n: Boot| n.min(t)));
        };
        if lost.is_none() {
            consider(timing.lost_at(deadline.get()));
            if watchdog.is_none() && renewer.is_some() {
                consider(first_renew);
            }
        }
        if let Some(at) = kill_at
            && killed_at.is_empty()
        {
            consider(at);
        }

        if main_end.is_some() {
            // Reap leftovers that ended; terminate the rest: SIGTERM on
            // discovery, SIGKILL after the grace.
            let mut left = Vec::new();
            for c in children() {
                if c == pid {
                    continue;
                }
                match rustix::process::waitpid(
                    Pid::from_raw(c),
                    rustix::process::WaitOptions::NOHANG,
                ) {
                    Ok(Some(_)) => {
                        term_at.remove(&c);
                        killed_at.remove(&c);
                    }
                    Err(_) => {}
                    Ok(None) => left.push(c),
                }
            }
            if left.is_empty() {
                break;
            }
            for &c in &left {
                let first = *term_at.entry(c).or_insert_with(|| {
                    log::info(format!("stopping leftover process {c}"));
                    signal_group(pgid, libc::SIGTERM);
                    signal_pid(c, libc::SIGTERM);
                    signal_pid(c, libc::SIGCONT);
                    now
                });
                let kill_time = first.add(timing.grace);
                match killed_at.get(&c) {
                    None if now >= kill_time => {
                        signal_group(pgid, libc::SIGKILL);
                        signal_pid(c, libc::SIGKILL);
                        killed_at.insert(c, now);
                        consider(now.add(UNKILLABLE_AFTER));
                    }
                    None => consider(kill_time),
                    Some(&k) => {
                        if now >= k.add(UNKILLABLE_AFTER) && !warned_stuck {
                            warned_stuck = true;
                            log::alert(format!(
                                "process {c} of the job survives SIGKILL; keeping the lease held until it exits"
                            ));
                        } else if !warned_stuck {
                            consider(k.add(UNKILLABLE_AFTER));
                        }
                    }
                }
            }
        }

        wait_for(wake_rx.as_fd(), &timer, next_timer);
        drain(&wake_rx);
    }

    // Nothing of the job is left: reap the main child last.
    let _ = rustix::process::waitpid(Pid::from_raw(pid), rustix::process::WaitOptions::empty());
    if let Some(mut w) = watchdog.take() {
        w.stop();
    }
    drop(signals);
    if let Some(t) = &tty {
        set_foreground(t.fd, t.our_pgrp);
    }
    log::stop_async();
    let end = main_end.expect("loop ends after the main child exits");
    Ok(Outcome {
        end,
        lost: lost.map(|(r, _)| r),
    })
}
