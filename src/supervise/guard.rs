//! The guard: a small process between lockrun and the job. It starts the job,
//! reaps everything the job leaves behind (it is their subreaper), tells
//! lockrun when the job's main process ends, and exits only when no process
//! of the job is left. If lockrun dies (`kill -9`, the OOM killer), the guard
//! kills every process of the job before it exits, so none outlives the lease.
//! It learns of lockrun's death through a pidfd, which no process of the job
//! can hold open on lockrun's behalf (a pipe from lockrun, reopened by a job
//! through /proc, could be).

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Pid, WaitOptions, WaitStatus, wait, waitpid};

use crate::exit::JobEnd;
use crate::spawn::Prepared;
use crate::sys;

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
}

const MSG: usize = 5;

impl Report {
    fn encode(self) -> [u8; MSG] {
        let (tag, n) = match self {
            Report::Started(p) => (b'S', p),
            Report::NotStarted(e) => (b'N', e),
            Report::Ended(JobEnd::Exited(c)) => (b'X', c),
            Report::Ended(JobEnd::Signaled(s)) => (b'K', s),
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
            _ => return None,
        })
    }
}

/// lockrun's side of a running guard.
pub struct Guard {
    pub pid: i32,
    reports: std::fs::File,
    /// Bytes read but not yet handed out (whole messages are handed out in order).
    partial: Vec<u8>,
}

impl Guard {
    /// Fork the guard, which starts the job from `job`. The guard is a copy
    /// of this process without its other threads: it takes no lock but
    /// malloc's (see `sys::fork`).
    pub fn start(job: &mut Prepared, dumpable: bool) -> std::io::Result<Guard> {
        let (rep_rx, rep_tx) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )?;
        // The guard runs with every signal blocked: the terminal's keys and
        // lockrun's forwarding are for the job, never for the guard.
        let mask = sys::block_all();
        let lockrun = rustix::process::getpid().as_raw_nonzero().get();
        let forked = sys::fork();
        match forked {
            Ok(sys::Forked::Child) => {
                drop(rep_rx);
                // lockrun itself is never dumpable. The guard is, unless
                // lockrun holds a password: it keeps the local lock's
                // descriptor for as long as the job runs, and a request that
                // finds the lock file deleted looks for such a descriptor
                // through /proc to wait on (lockrun-safety(7) "HOW LOCKRUN
                // TREATS THE JOB").
                if dumpable {
                    sys::set_dumpable(true);
                }
                guard_main(job, lockrun, rep_tx)
            }
            Ok(sys::Forked::Parent(pid)) => {
                sys::set_mask(&mask);
                drop(rep_tx);
                Ok(Guard {
                    pid,
                    reports: std::fs::File::from(rep_rx),
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
        self.reports.as_fd()
    }

    /// Reports that arrived, without blocking. `closed` becomes true once the
    /// guard has exited (or died).
    pub fn read(&mut self, closed: &mut bool) -> Vec<Report> {
        let mut buf = [0u8; 64];
        loop {
            match self.reports.read(&mut buf) {
                Ok(0) => {
                    *closed = true;
                    break;
                }
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
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

    /// Block until the guard is reaped (its reports pipe has closed, so it is
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
    // One message is far below PIPE_BUF, so it is written whole or not at all.
    let _ = out.write_all(&r.encode());
}

fn job_end(st: WaitStatus) -> Option<JobEnd> {
    if let Some(code) = st.exit_status() {
        Some(JobEnd::Exited(code))
    } else {
        st.terminating_signal().map(JobEnd::Signaled)
    }
}

/// The guard's whole life. Never returns.
fn guard_main(job: &mut Prepared, lockrun: i32, reports: OwnedFd) -> ! {
    let mut out = std::fs::File::from(reports);
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
        send(&mut out, Report::NotStarted(libc::EPERM));
        sys::exit_now(1);
    }
    let chld = sys::signal_fd(&[libc::SIGCHLD, KILL_REQUEST]);
    let main = match job.launch() {
        Ok(pid) => pid,
        Err(errno) => {
            send(&mut out, Report::NotStarted(errno));
            sys::exit_now(0);
        }
    };
    // A pidfd of the main process, opened while it is our unreaped child:
    // through it, the job's group is signalled and never a group that
    // reused its number.
    let main_fd = sys::pidfd(main);
    send(&mut out, Report::Started(main));
    let mut main_ended = false;
    loop {
        // Reap whatever ended; the main process is reported, the rest is silent.
        loop {
            match wait(WaitOptions::NOHANG) {
                Ok(Some((pid, st))) => {
                    if pid.as_raw_nonzero().get() == main
                        && let Some(end) = job_end(st)
                    {
                        main_ended = true;
                        send(&mut out, Report::Ended(end));
                    }
                }
                Ok(None) => break,
                Err(rustix::io::Errno::INTR) => continue,
                // No child left: since orphans come to us, nothing of the job is.
                Err(rustix::io::Errno::CHILD) if main_ended => sys::exit_now(0),
                Err(_) => break,
            }
        }
        let mut fds = Vec::with_capacity(2);
        if let Some(l) = life {
            fds.push(PollFd::from_borrowed_fd(l, PollFlags::IN));
        }
        if let Ok(c) = &chld {
            fds.push(PollFd::from_borrowed_fd(c.as_fd(), PollFlags::IN));
        }
        // Without one of the descriptors above, look again every 50 ms.
        let limit = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        let blind = life.is_none() || chld.is_err();
        let _ = poll(&mut fds, blind.then_some(&limit));
        let lockrun_died = match &life {
            Some(_) => !fds[0].revents().is_empty(),
            None => parent() != lockrun,
        };
        if lockrun_died {
            kill_everything(main_fd.as_ref(), main, job.inherit_fd(), None);
        }
        if let Ok(c) = &chld
            && sys::read_signals(c.as_fd())
                .iter()
                .any(|&(sig, from)| sig == KILL_REQUEST && from == lockrun)
        {
            let report = (!main_ended).then_some(&mut out);
            kill_everything(main_fd.as_ref(), main, job.inherit_fd(), report);
        }
    }
}

fn parent() -> i32 {
    rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get())
}

/// SIGKILL every descendant, again and again until none is left: lockrun
/// is gone, or asked for it (`report`: lockrun still listens for the main
/// process's end). The job's group first, in one call; then every process
/// the moment a walk finds it, so that none forks again behind the walk.
fn kill_everything(
    main_fd: Option<&OwnedFd>,
    main: i32,
    lock: Option<std::os::fd::RawFd>,
    mut report: Option<&mut std::fs::File>,
) -> ! {
    // Every descriptor free for the walk below, whatever limit lockrun ran
    // under; but the local lock stays held until the last process is gone,
    // the main process's pidfd is what reaches the job's group, and lockrun
    // may still be listening.
    let mut keep = [
        lock.unwrap_or(-1),
        main_fd.map_or(-1, |f| f.as_raw_fd()),
        report.as_ref().map_or(-1, |r| r.as_raw_fd()),
    ];
    sys::close_all_but(&mut keep);
    let me = rustix::process::getpid().as_raw_nonzero().get();
    loop {
        if let Some(fd) = main_fd {
            sys::signal_group_of(fd.as_fd(), main, libc::SIGKILL);
        }
        sys::walk(me, |fd, _| sys::signal_pidfd(fd, libc::SIGKILL), |_, _| {});
        loop {
            match wait(WaitOptions::NOHANG) {
                Ok(Some((pid, st))) => {
                    if pid.as_raw_nonzero().get() == main
                        && let (Some(out), Some(end)) = (report.as_deref_mut(), job_end(st))
                    {
                        send(out, Report::Ended(end));
                    }
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::CHILD) => sys::exit_now(0),
                _ => break,
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_the_pipe() {
        for r in [
            Report::Started(1234),
            Report::NotStarted(libc::ENOENT),
            Report::Ended(JobEnd::Exited(3)),
            Report::Ended(JobEnd::Signaled(9)),
        ] {
            assert_eq!(Report::decode(&r.encode()), Some(r));
        }
        assert_eq!(Report::decode(b"?0000"), None);
    }
}
