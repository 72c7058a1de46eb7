//! One shape for every server a test starts of its own (Redis, etcd,
//! PostgreSQL, PgBouncer, MariaDB, ZooKeeper, a sentinel): its process,
//! stopped by PID when dropped, and what a test does to it: kill it,
//! restart it, pause it, resume it. Each server says only how it starts
//! again on its own port and data, and what its URL is.

use std::process::Child;
use std::time::Duration;

use super::{Engine, signal, wait_until};

/// The process of a running server; none once it is killed. Dropped, it
/// is continued (a paused server must not outlive its test) and killed.
#[derive(Default)]
pub struct Process(Option<Child>);

impl Process {
    pub fn new(child: Child) -> Process {
        Process(Some(child))
    }

    pub fn running(&self) -> bool {
        self.0.is_some()
    }

    pub fn pid(&self) -> i32 {
        self.0.as_ref().expect("running").id() as i32
    }

    /// The child itself, to ask whether it exited.
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        self.0.as_mut()
    }

    /// At once, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            // One that exited and was reaped (by `stop`) is signalled no
            // more: its pid may be another process's by now.
            if matches!(c.try_wait(), Ok(None)) {
                signal(c.id() as i32, libc::SIGCONT);
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }

    /// Ask it to stop with `sig` (none: it was asked some other way, say
    /// by a statement) and wait `grace` for it to exit; killed outright
    /// when it has not.
    pub fn stop(&mut self, sig: Option<i32>, grace: Duration) {
        if let Some(c) = &mut self.0 {
            let pid = c.id() as i32;
            if let Some(sig) = sig {
                signal(pid, libc::SIGCONT);
                signal(pid, sig);
            }
            wait_until(grace, || matches!(c.try_wait(), Ok(Some(_))));
        }
        self.kill();
    }

    /// SIGSTOP: it keeps its connections and answers nothing.
    pub fn pause(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    pub fn resume(&self) {
        signal(self.pid(), libc::SIGCONT);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What a test does to a server of its own. A server gives its process
/// and how it starts again; killing, restarting, pausing and resuming are
/// the same for each (a server that stops otherwise says how in `kill`).
pub trait Server: Engine {
    fn process(&self) -> &Process;

    fn process_mut(&mut self) -> &mut Process;

    /// Start again, after a kill, on the same port and (where it keeps
    /// any) the same data.
    fn start_again(&mut self);

    fn pid(&self) -> i32 {
        self.process().pid()
    }

    /// Stop the server at once, as a crash would.
    fn kill(&mut self) {
        self.process_mut().kill();
    }

    /// Kill and start again on the same port.
    fn restart(&mut self) {
        self.kill();
        self.start_again();
    }

    fn pause(&self) {
        self.process().pause();
    }

    fn resume(&self) {
        self.process().resume();
    }
}
