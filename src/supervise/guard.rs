//! The guard: a small process between lockrun and the job. It starts the job,
//! reaps everything the job leaves behind (it is their subreaper), tells
//! lockrun when the job's main process ends, and exits only when no process
//! of the job is left. If lockrun dies (`kill -9`, the OOM killer), the guard
//! kills every process of the job before it exits, so none outlives the lease.
//! It learns of lockrun's death through a pidfd, which no process of the job
//! can hold open on lockrun's behalf (a pipe from lockrun, reopened by a job
//! through /proc, could be).
//!
//! The guard also holds the lease's deadline: lockrun tells it each deadline
//! its renewals earn, and if one comes near without lockrun moving it
//! (lockrun stopped, traced, hung or starved), the guard stops the job on the
//! schedule lockrun would have kept. A pause of lockrun alone never lets its
//! job outlive the lease.

mod stop;

use std::io::{ErrorKind, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Pid, WaitOptions, WaitStatus, wait, waitpid};

use std::collections::HashSet;
use std::time::Duration;

use crate::clock::{Boot, BootTimer};
use crate::exit::JobEnd;
use crate::schedule::Timing;
use crate::spawn::Prepared;
use crate::sys;
use stop::{kill_everything, stop_new};

/// The signal lockrun sends the guard to have it kill every process of the
/// job (when lockrun cannot walk them itself, at its descriptor limit).
/// Only lockrun's own is obeyed.
pub const KILL_REQUEST: i32 = libc::SIGUSR1;

/// What the guard tells lockrun, one fixed-size message each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The job runs with this pid.
    Started(i32),
    /// exec failed with this errno; nothing runs.
    NotStarted(i32),
    /// The job's main process ended (others may remain).
    Ended(JobEnd),
    /// A deadline came near that lockrun had not moved: the guard is
    /// stopping the job itself.
    TookOver,
    /// The lease's time was up before the job could start: nothing runs.
    Late,
}

const MSG: usize = 5;

impl Report {
    fn encode(self) -> [u8; MSG] {
        let (tag, n) = match self {
            Report::Started(p) => (b'S', p),
            Report::NotStarted(e) => (b'N', e),
            Report::Ended(JobEnd::Exited(c)) => (b'X', c),
            Report::Ended(JobEnd::Signaled(s)) => (b'K', s),
            Report::TookOver => (b'T', 0),
            Report::Late => (b'L', 0),
        };
        let mut m = [0u8; MSG];
        m[0] = tag;
        m[1..].copy_from_slice(&n.to_le_bytes());
        m
    }

    fn decode(m: &[u8]) -> Option<Report> {
        let n = i32::from_le_bytes(m.get(1..MSG)?.try_into().ok()?);
        Some(match m[0] {
            b'S' => Report::Started(n),
            b'N' => Report::NotStarted(n),
            b'X' => Report::Ended(JobEnd::Exited(n)),
            b'K' => Report::Ended(JobEnd::Signaled(n)),
            b'T' => Report::TookOver,
            b'L' => Report::Late,
            _ => return None,
        })
    }
}

/// What lockrun tells the guard about the lease, one fixed-size message
/// each: a tag and a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// The lease's deadline moved to this boot time.
    Deadline(Boot),
    /// Killing the job is now expected to take this long.
    Cost(Duration),
    /// lockrun is stopping the job itself: the guard sends no SIGTERM, only
    /// the SIGKILL of the schedule should lockrun stop before it.
    Stopping,
}

const ORDER: usize = 9;

impl Order {
    fn encode(self) -> [u8; ORDER] {
        let (tag, n) = match self {
            Order::Deadline(at) => (b'D', at.nanos()),
            Order::Cost(d) => (b'C', u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            Order::Stopping => (b'S', 0),
        };
        let mut m = [0u8; ORDER];
        m[0] = tag;
        m[1..].copy_from_slice(&n.to_le_bytes());
        m
    }

    fn decode(m: &[u8]) -> Option<Order> {
        let n = u64::from_le_bytes(m.get(1..ORDER)?.try_into().ok()?);
        Some(match m[0] {
            b'D' => Order::Deadline(Boot::from_nanos(n)),
            b'C' => Order::Cost(Duration::from_nanos(n)),
            b'S' => Order::Stopping,
            _ => return None,
        })
    }
}

/// lockrun's end of the guard's orders. Writes never block, and each
/// message is one record of the socket, written whole or not at all,
/// whichever thread writes; a guard that stopped reading cannot act on it
/// anyway.
#[derive(Clone)]
pub struct Orders(std::sync::Arc<OwnedFd>);

impl Orders {
    fn send(&self, o: Order) {
        let _ = rustix::net::send(&*self.0, &o.encode(), rustix::net::SendFlags::NOSIGNAL);
    }
    pub fn deadline(&self, at: Boot) {
        self.send(Order::Deadline(at));
    }
    pub fn cost(&self, d: Duration) {
        self.send(Order::Cost(d));
    }
    pub fn stopping(&self) {
        self.send(Order::Stopping);
    }
}

/// What the guard knows of the lease when it starts.
pub struct Watch {
    pub timing: Timing,
    /// None for a lease that cannot lapse (a flock).
    pub deadline: Option<Boot>,
    /// The job stays in lockrun's process group (at a terminal): the guard
    /// never signals that group, which holds lockrun and the caller's
    /// pipeline too.
    pub shares_group: bool,
}

/// lockrun's side of a running guard.
pub struct Guard {
    pub pid: i32,
    pub orders: Orders,
    /// lockrun's end of the one socket it shares with the guard: reports
    /// come in, orders go out (one descriptor, for lockrun at its limit).
    line: std::sync::Arc<OwnedFd>,
    /// Bytes read but not yet handed out (whole messages are handed out in order).
    partial: Vec<u8>,
}

impl Guard {
    /// Fork the guard, which starts the job from `job`. The guard is a copy
    /// of this process without its other threads: it takes no lock but
    /// malloc's (see `sys::fork`).
    pub fn start(job: &mut Prepared, dumpable: bool, watch: Watch) -> std::io::Result<Guard> {
        let (ours, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC | rustix::net::SocketFlags::NONBLOCK,
            None,
        )?;
        // The guard runs with every signal blocked: the terminal's keys and
        // lockrun's forwarding are for the job, never for the guard.
        let mask = sys::block_all();
        let lockrun = rustix::process::getpid().as_raw_nonzero().get();
        let forked = sys::fork();
        match forked {
            Ok(sys::Forked::Child) => {
                drop(ours);
                // lockrun itself is never dumpable. The guard is, unless
                // lockrun holds a password: it keeps the local lock's
                // descriptor for as long as the job runs, and a request that
                // finds the lock file deleted looks for such a descriptor
                // through /proc to wait on (lockrun-safety(7) "HOW LOCKRUN
                // TREATS THE JOB").
                if dumpable {
                    sys::set_dumpable(true);
                }
                guard_main(job, lockrun, theirs, watch)
            }
            Ok(sys::Forked::Parent(pid)) => {
                sys::set_mask(&mask);
                drop(theirs);
                let line = std::sync::Arc::new(ours);
                Ok(Guard {
                    pid,
                    orders: Orders(std::sync::Arc::clone(&line)),
                    line,
                    partial: Vec::new(),
                })
            }
            Err(e) => {
                sys::set_mask(&mask);
                Err(e)
            }
        }
    }

    pub fn reports_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.line.as_fd()
    }

    /// Reports that arrived, without blocking. `closed` becomes true once the
    /// guard has exited (or died).
    pub fn read(&mut self, closed: &mut bool) -> Vec<Report> {
        let mut buf = [0u8; 64];
        loop {
            match rustix::io::read(&*self.line, &mut buf) {
                Ok(0) => {
                    *closed = true;
                    break;
                }
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
        }
        let whole = self.partial.len() / MSG * MSG;
        let out = self.partial[..whole]
            .chunks(MSG)
            .filter_map(Report::decode)
            .collect();
        self.partial.drain(..whole);
        out
    }

    /// Hand reports back, to be returned first by the next `read`.
    pub fn unread(&mut self, reports: &[Report]) {
        let mut bytes: Vec<u8> = reports.iter().flat_map(|r| r.encode()).collect();
        bytes.append(&mut self.partial);
        self.partial = bytes;
    }

    /// Block until the guard is reaped (its end of the line has closed, so it is
    /// exiting). True when it ended on its own after the last process of the job.
    pub fn reap(&self) -> bool {
        loop {
            match waitpid(Pid::from_raw(self.pid), WaitOptions::empty()) {
                Ok(Some((_, st))) => return st.exit_status() == Some(0),
                Err(rustix::io::Errno::INTR) => continue,
                _ => return false,
            }
        }
    }
}

fn send(out: &mut std::fs::File, r: Report) {
    // One record of the socket: written whole or not at all.
    let _ = rustix::net::send(&*out, &r.encode(), rustix::net::SendFlags::NOSIGNAL);
}

fn job_end(st: WaitStatus) -> Option<JobEnd> {
    if let Some(code) = st.exit_status() {
        Some(JobEnd::Exited(code))
    } else {
        st.terminating_signal().map(JobEnd::Signaled)
    }
}

/// How long after lockrun's own stop time the guard takes over, at most
/// (and never more than half the grace): a live lockrun says it is stopping
/// the job before then, so that the job is never told twice.
const TAKEOVER_LAG: Duration = Duration::from_millis(100);

/// The guard's hold on the lease's deadline.
struct Holding {
    timing: Timing,
    deadline: Option<Boot>,
    cost: Duration,
    /// lockrun said it is stopping the job itself.
    lockrun_stops: bool,
    /// The guard took over: the processes it told to stop so far.
    took_over: Option<HashSet<i32>>,
    /// lockrun's end of the line is open (its orders may still come).
    open: bool,
    partial: Vec<u8>,
}

impl Holding {
    /// Take in every order that arrived, without blocking. Lost is final:
    /// once the guard took over, no deadline moves it back.
    fn read_orders(&mut self, line: &mut std::fs::File) {
        if !self.open {
            return;
        }
        let mut buf = [0u8; 16 * ORDER];
        loop {
            match line.read(&mut buf) {
                Ok(0) => {
                    self.open = false;
                    break;
                }
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let whole = self.partial.len() / ORDER * ORDER;
        for m in self.partial[..whole].chunks(ORDER) {
            match Order::decode(m) {
                Some(Order::Deadline(at)) if self.took_over.is_none() => self.deadline = Some(at),
                Some(Order::Cost(d)) => self.cost = d,
                Some(Order::Stopping) => self.lockrun_stops = true,
                _ => {}
            }
        }
        self.partial.drain(..whole);
    }

    /// When the guard sends SIGTERM and when SIGKILL, for a lease that can
    /// lapse: lockrun's own schedule, SIGTERM a moment later.
    fn times(&self) -> Option<(Boot, Boot)> {
        let d = self.deadline?;
        let stop = self.timing.stop_at(d, self.cost);
        let kill = self.timing.kill_at(stop, Some(d), self.cost);
        let term = stop.add(TAKEOVER_LAG.min(self.timing.grace / 2)).min(kill);
        Some((term, kill))
    }

    /// Whether the guard sends SIGTERM now (lockrun is not doing it).
    fn terms(&self, now: Boot) -> bool {
        !self.lockrun_stops && self.times().is_some_and(|(term, _)| now >= term)
    }

    /// When to look again at the latest.
    fn next(&self, now: Boot) -> Option<Boot> {
        let (term, kill) = self.times()?;
        Some(if self.took_over.is_some() && !self.lockrun_stops {
            // Processes forked during the grace get SIGTERM too.
            kill.min(now.add(Duration::from_millis(50)))
        } else if self.lockrun_stops {
            kill
        } else {
            term
        })
    }
}

/// The guard's whole life. Never returns.
fn guard_main(job: &mut Prepared, lockrun: i32, line: OwnedFd, watch: Watch) -> ! {
    // Reports go out and orders come in on this one socket.
    let mut out = std::fs::File::from(line);
    // lockrun's pidfd: its own, inherited (opened before any job could
    // start), or else opened while lockrun is still our parent; neither can
    // refer to a recycled pid. Without one, look at our parent every 50 ms.
    let opened;
    let life = match sys::own_pidfd() {
        Some(fd) => Some(fd),
        None => {
            opened = sys::pidfd(lockrun);
            opened.as_ref().map(|f| f.as_fd())
        }
    };
    settle_in(job, lockrun, life, &mut out);
    let mut holding = Holding {
        timing: watch.timing,
        deadline: watch.deadline,
        cost: Duration::ZERO,
        lockrun_stops: false,
        took_over: None,
        open: true,
        partial: Vec::new(),
    };
    let chld = sys::signal_fd(&[libc::SIGCHLD, KILL_REQUEST]);
    let main = launch(job, &holding, &mut out);
    // A pidfd of the main process, opened while it is our unreaped child:
    // through it, the job's group is signalled and never a group that
    // reused its number.
    let main_fd = sys::pidfd(main);
    let group = (!watch.shares_group).then_some(main_fd.as_ref()).flatten();
    // Last, as it matters least at a descriptor limit: without a timer the
    // guard looks at the clock every 50 ms instead.
    let timer = BootTimer::new().ok();
    send(&mut out, Report::Started(main));
    let mut main_ended = false;
    loop {
        reap(main, &mut main_ended, &mut out);
        // The deadline: lockrun's renewals move it; if lockrun does not,
        // the guard keeps the schedule itself, whatever lockrun is doing.
        holding.read_orders(&mut out);
        let now = Boot::now();
        keep_schedule(&mut holding, now, &mut out, group, main, job, main_ended);
        let lockrun_died = sleep(life, &chld, &holding, &out, &timer, now, lockrun);
        if lockrun_died {
            kill_everything(group, main, job.inherit_fd(), None);
        }
        if let Ok(c) = &chld
            && sys::read_signals(c.as_fd())
                .iter()
                .any(|&(sig, from)| sig == KILL_REQUEST && from == lockrun)
        {
            let report = (!main_ended).then_some(&mut out);
            kill_everything(group, main, job.inherit_fd(), report);
        }
    }
}

/// The guard's first steps, before the job starts: make sure lockrun is
/// still its parent, leave lockrun's group and descriptors, and become the
/// reaper of the job's orphans (exits if any of it fails).
fn settle_in(job: &Prepared, lockrun: i32, life: Option<BorrowedFd<'_>>, out: &mut std::fs::File) {
    if parent() != lockrun {
        sys::exit_now(1);
    }
    // A group of its own: a SIGKILL to lockrun's whole process group (as
    // `timeout -k` and CI runners send) must not take the guard along.
    let _ = rustix::process::setpgid(None, None);
    // None of lockrun's other descriptors stays open here: a copy would keep
    // its open file alive for as long as the job runs, and with it any lock
    // on it (the gate a request passes, a slot a helper thread took after
    // another one won). One close_range per gap, no scan.
    let mut keep = [
        life.map_or(-1, |f| f.as_raw_fd()),
        out.as_raw_fd(),
        job.inherit_fd().unwrap_or(-1),
    ];
    sys::close_all_but(&mut keep);
    if sys::set_subreaper().is_err() {
        send(out, Report::NotStarted(libc::EPERM));
        sys::exit_now(1);
    }
}

/// Start the job, unless the lease's time is up; the main process's pid
/// (exits, having reported why, when the job did not start).
fn launch(job: &mut Prepared, holding: &Holding, out: &mut std::fs::File) -> i32 {
    // lockrun may have been stopped since the grant: a job started now
    // would run outside its lease.
    if let Some(d) = holding.deadline
        && Boot::now() >= holding.timing.stop_at(d, Duration::ZERO)
    {
        send(out, Report::Late);
        sys::exit_now(0);
    }
    match job.launch() {
        Ok(pid) => pid,
        Err(errno) => {
            send(out, Report::NotStarted(errno));
            sys::exit_now(0);
        }
    }
}

/// What lockrun would do on the lease's schedule, when lockrun does not:
/// SIGTERM to the job's processes once it is due, SIGKILL to everything
/// (never returning) once the time is up.
fn keep_schedule(
    holding: &mut Holding,
    now: Boot,
    out: &mut std::fs::File,
    group: Option<&OwnedFd>,
    main: i32,
    job: &Prepared,
    main_ended: bool,
) {
    if holding.terms(now) {
        let told = holding.took_over.get_or_insert_with(|| {
            send(out, Report::TookOver);
            HashSet::new()
        });
        stop_new(told);
    }
    if let Some((_, kill)) = holding.times()
        && now >= kill
    {
        if holding.took_over.is_none() && !holding.lockrun_stops {
            send(out, Report::TookOver);
        }
        let report = (!main_ended).then_some(out);
        kill_everything(group, main, job.inherit_fd(), report);
    }
}

/// Reap whatever ended; the main process is reported, the rest is silent.
/// Exits once nothing of the job is left.
fn reap(main: i32, main_ended: &mut bool, out: &mut std::fs::File) {
    loop {
        match wait(WaitOptions::NOHANG) {
            Ok(Some((pid, st))) => {
                if pid.as_raw_nonzero().get() == main
                    && let Some(end) = job_end(st)
                {
                    *main_ended = true;
                    send(out, Report::Ended(end));
                }
            }
            Ok(None) => break,
            Err(rustix::io::Errno::INTR) => continue,
            // No child left: since orphans come to us, nothing of the job is.
            Err(rustix::io::Errno::CHILD) if *main_ended => sys::exit_now(0),
            Err(_) => break,
        }
    }
}

/// Sleep until lockrun dies, a child ends, a signal or an order comes, or
/// the next step of the schedule is due; true when lockrun died.
fn sleep(
    life: Option<BorrowedFd<'_>>,
    chld: &std::io::Result<OwnedFd>,
    holding: &Holding,
    out: &std::fs::File,
    timer: &Option<BootTimer>,
    now: Boot,
    lockrun: i32,
) -> bool {
    let next = holding.next(now);
    let armed = match (next, timer) {
        (Some(at), Some(t)) => t.arm(at).is_ok(),
        _ => false,
    };
    let mut fds = Vec::with_capacity(4);
    if let Some(l) = life {
        fds.push(PollFd::from_borrowed_fd(l, PollFlags::IN));
    }
    if let Ok(c) = chld {
        fds.push(PollFd::from_borrowed_fd(c.as_fd(), PollFlags::IN));
    }
    if holding.open {
        fds.push(PollFd::from_borrowed_fd(out.as_fd(), PollFlags::IN));
    }
    if let (true, Some(t)) = (armed, timer) {
        fds.push(PollFd::from_borrowed_fd(t.fd(), PollFlags::IN));
    }
    // Without one of the descriptors above, look again every 50 ms.
    let limit = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 50_000_000,
    };
    let blind = life.is_none() || chld.is_err() || (next.is_some() && !armed);
    let _ = poll(&mut fds, blind.then_some(&limit));
    if let (true, Some(t)) = (armed, timer) {
        // Reading the timer resets it.
        let mut buf = [0u8; 8];
        let _ = rustix::io::read(t.fd(), &mut buf);
    }
    match &life {
        Some(_) => !fds[0].revents().is_empty(),
        None => parent() != lockrun,
    }
}

fn parent() -> i32 {
    rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_the_line() {
        for r in [
            Report::Started(1234),
            Report::NotStarted(libc::ENOENT),
            Report::Ended(JobEnd::Exited(3)),
            Report::Ended(JobEnd::Signaled(9)),
            Report::TookOver,
            Report::Late,
        ] {
            assert_eq!(Report::decode(&r.encode()), Some(r));
        }
        assert_eq!(Report::decode(b"?0000"), None);
    }

    #[test]
    fn orders_survive_the_line() {
        for o in [
            Order::Deadline(Boot::from_nanos(123_456_789_012)),
            Order::Cost(Duration::from_micros(2500)),
            Order::Stopping,
        ] {
            assert_eq!(Order::decode(&o.encode()), Some(o));
        }
    }

    fn holding(ttl_ms: u64, deadline: Boot) -> Holding {
        let timing = Timing::new(Duration::from_millis(ttl_ms), None).unwrap();
        Holding {
            timing,
            deadline: Some(deadline),
            cost: Duration::ZERO,
            lockrun_stops: false,
            took_over: None,
            open: false,
            partial: Vec::new(),
        }
    }

    #[test]
    fn the_guard_keeps_lockrun_s_schedule_a_moment_later() {
        let d = Boot::from_nanos(100_000_000_000);
        let h = holding(30_000, d);
        let t = h.timing;
        let (term, kill) = h.times().unwrap();
        // SIGTERM just after lockrun's own time, never before it.
        assert!(term > t.lost_at(d));
        assert!(term <= t.lost_at(d).add(TAKEOVER_LAG));
        // Every process dead `slack` before the lease can end.
        assert!(kill.add(t.slack) <= d);
        assert_eq!(kill, t.lost_at(d).add(t.grace));
        assert!(!h.terms(term.sub(Duration::from_millis(1))));
        assert!(h.terms(term));
    }

    #[test]
    fn a_costly_kill_starts_earlier_in_the_guard_too() {
        let d = Boot::from_nanos(100_000_000_000);
        let mut h = holding(30_000, d);
        let (term0, _) = h.times().unwrap();
        h.cost = Duration::from_millis(800);
        let (term, kill) = h.times().unwrap();
        assert!(term < term0);
        assert!(kill.add(h.timing.slack + h.cost) <= d);
    }

    #[test]
    fn no_deadline_no_takeover_and_lockrun_stopping_means_no_sigterm() {
        let mut h = holding(30_000, Boot::from_nanos(1));
        h.deadline = None;
        assert_eq!(h.times(), None);
        assert!(!h.terms(Boot::from_nanos(u64::MAX / 2)));
        let mut h = holding(30_000, Boot::from_nanos(10_000_000_000));
        h.lockrun_stops = true;
        assert!(!h.terms(Boot::from_nanos(u64::MAX / 2)));
        // Its SIGKILL stays due.
        assert!(h.next(Boot::from_nanos(0)).is_some());
    }
}
