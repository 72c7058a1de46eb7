//! How the supervisor reaches the job's processes: the walk of /proc, the
//! groups signalled through pidfds, the descriptors kept in reserve for the
//! walk, and the decisions carried out on them.

use std::os::fd::AsFd;

use super::policy::{Action, Walk};
use super::{Supervisor, guard, signal_name};
use crate::clock::Boot;
use crate::log;
use crate::sys;

/// Two descriptors (copies of stdin) to free when lockrun needs to open files
/// while it may be at its descriptor limit.
pub(super) fn reserve_fds() -> Vec<std::os::fd::OwnedFd> {
    (0..2)
        .filter_map(|_| rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3).ok())
        .collect()
}

impl Supervisor {
    /// Signal the job's process group (through the main process's pidfd);
    /// false when there is none to signal: at a terminal the job shares
    /// lockrun's group, and without a pidfd the group is not provably the job's.
    pub(super) fn signal_group(&mut self, sig: i32) -> bool {
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

    pub(super) fn main_pidfd(&mut self) -> Option<&std::os::fd::OwnedFd> {
        let (main, guard) = (self.main, self.guard.pid);
        self.main_fd
            .get_or_insert_with(|| sys::pidfd_of_child(main, guard))
            .as_ref()
    }

    /// Walk every live process of the job, sending each what the policy
    /// decides for it at `now` while the walk holds it by a pidfd; how long
    /// the walk took comes back with what it found.
    pub(super) fn processes(
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

    pub(super) fn walk_root(&self) -> i32 {
        if self.orphans_only {
            rustix::process::getpid().as_raw_nonzero().get()
        } else {
            self.guard.pid
        }
    }

    /// Ask the guard to kill every process of the job (it walks with its own
    /// few descriptors), once.
    pub(super) fn delegate_kill(&mut self) {
        if !self.delegated && !self.guard_gone {
            self.delegated = true;
            log::info("asking the guard to kill the job");
            sys::signal_pid(self.guard.pid, guard::KILL_REQUEST);
        }
    }

    /// Carry out one decision. Signals to single processes went out during
    /// the walk; here the job's group gets them too.
    pub(super) fn act(&mut self, a: Action) {
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
pub(super) fn known_groups() -> usize {
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
