//! The acquire loop every engine that talks to a server shares, written once:
//! patience, the retry budget and its backoff, leaving the queue, the
//! "acquired" line, and the rule that a server never reached is not waited out.
//! An engine gives its step (one look at the name, and while blocked one wait)
//! and its transport; its own client sorts the server's errors into kinds.

use std::time::Duration;

use super::quit::{self, Leave};
use super::wait::{Patience, Retry};
use super::{Acquired, Error, Request, Wait};
use crate::clock::Boot;
use crate::log;

/// What an engine's connection to its server tells the driver.
pub trait Transport {
    /// The server has answered at least once: later transport errors may be
    /// a restart worth waiting out, earlier ones are misconfiguration.
    fn replied(&self) -> bool;

    /// The server as shown to the operator (no secrets).
    fn shown(&self) -> &str;

    /// A failure of `doing`, saying which server it was.
    fn failed(&self, doing: &str, e: Error) -> Error {
        e.doing(format_args!("{doing} on {}", self.shown()))
    }
}

/// What one step of an engine's take led to.
pub enum Step {
    /// Granted, or busy for good (`-n`, the wait ran out).
    Done(Acquired),
    /// The server answered: look again.
    Again,
    /// The request ends with this error as it stands: the engine has left
    /// the queue already and said what failed.
    Over(Error),
}

/// One engine's request for a name, step by step.
pub trait Take {
    type Transport: Transport;

    /// One look at the name and, blocked, one wait for news. A transient
    /// error is retried within the budget; any other ends the request.
    fn step(&mut self, patience: &mut Patience, retry: &mut Retry) -> Result<Step, Error>;

    /// Give up our place in the queue and any grant made meanwhile (best
    /// effort; nothing to do when there is none).
    fn leave(&mut self);

    /// The same from another thread, on a connection of its own, when a
    /// signal ends lockrun while it waits (`quit`): every place and grant
    /// of our owner on the name goes. None: the engine has none.
    fn way_out(&self) -> Option<Leave> {
        None
    }

    fn transport(&self) -> &Self::Transport;
}

/// Take `req`'s name by `take`'s steps until granted, busy or failed.
pub fn drive(take: &mut impl Take, req: &Request, wait: Wait) -> Result<Acquired, Error> {
    let mut patience = Patience::new(req, wait);
    if wait != Wait::No
        && let Some(leave) = take.way_out()
    {
        patience.leave_on_signal(leave, req.timing.op);
    }
    // A server that keeps failing is given up on after a ttl (or five
    // seconds, for a short one), or sooner when the wait runs out.
    let mut retry = Retry::new(req.timing.ttl.max(Duration::from_secs(5)));
    // Built only when something failed: the uncontended run allocates nothing here.
    let doing = || format!("acquiring {}", req.name);
    loop {
        // A signal is taking us out of the queue: no call may put us back.
        quit::stay_if_leaving();
        match take.step(&mut patience, &mut retry) {
            Ok(Step::Done(acquired)) => {
                if let Acquired::Granted(l) = &acquired {
                    log::info(format!(
                        "acquired {} with token {} after {:.1?}",
                        req.name,
                        l.token,
                        Boot::now().since(patience.started())
                    ));
                }
                return Ok(acquired);
            }
            Ok(Step::Again) => retry.succeeded(),
            Ok(Step::Over(e)) => return Err(e),
            // Final, or a server that never answered: misconfiguration,
            // not an outage to wait out.
            Err(e) if !e.is_transient() || !take.transport().replied() => {
                take.leave();
                return Err(match e {
                    Error::Request(_) => e,
                    e => take.transport().failed(&doing(), e),
                });
            }
            Err(e) => match retry.failed(&patience) {
                Some(pause) => {
                    log::info(format!("acquire failed: {e}; retrying"));
                    std::thread::sleep(pause);
                }
                None => {
                    take.leave();
                    return Err(take.transport().failed(&doing(), e));
                }
            },
        }
    }
}
