//! A request for a name as the driver takes it (`backend::drive`): a look
//! takes the lock at once or joins the queue; a wait blocks in the queue
//! and on the lock until the driver's deadline, and the next look grants
//! what it got. The give-up clock, the waiting line and the "acquired"
//! line are the driver's.

use super::take::recorded_holder;
use super::*;
use crate::backend::drive::{Look, Remote, Take, Woke, drive};

/// Looks of one request that may find a file deleted or replaced
/// meanwhile (or its place lapsed) before it gives up.
const CHANGES: u32 = 100;

/// One request for a name in the lock directory, as the driver takes it.
struct Taking<'a> {
    local: &'a Local,
    req: &'a Request<'a>,
    files: Files,
    w: Waiter<'a>,
    /// What the last wait came to, for the next look: a lock to grant, a
    /// full queue, or a file changed under it.
    next: Option<Try>,
    /// Who was in the way when the last wait's deadline came.
    holder: Option<String>,
    /// Looks that found something changed under them.
    changed: u32,
}

impl Local {
    pub(super) fn take_name(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        let files = self.files(req.name);
        if Self::inside_holder(&files, req.inherited_fd) {
            return Err(crate::backend::nested(req.name));
        }
        let mut taking = Taking {
            local: self,
            req,
            files,
            w: Waiter {
                name: req.name,
                req,
                wait,
                until: None,
                last: false,
                queued: None,
                lapsed: false,
                replaced: None,
            },
            next: None,
            holder: None,
            changed: 0,
        };
        drive(&mut taking, req, wait)
    }
}

impl Take for Taking<'_> {
    fn look(&mut self, last: bool, until: Option<Boot>) -> Result<Look, Error> {
        (self.w.until, self.w.last) = (until, last);
        if let Some(by) = self.w.replaced.take() {
            return Ok(Look::Done(Acquired::Replaced { by }));
        }
        let tried = match self.next.take() {
            Some(tried) => tried,
            None if self.w.queued.is_some() => {
                let holder = self.holder.take();
                return Ok(Look::Blocked(
                    holder.or_else(|| recorded_holder(&self.files)),
                ));
            }
            None => self.local.take(&mut self.w, self.req, &self.files, false)?,
        };
        match tried {
            Try::Locked(got) => self.grant(got),
            Try::Busy(holder) => Ok(Look::Blocked(holder)),
            Try::Full(waiting) => Ok(Look::Done(Acquired::QueueFull { waiting })),
            Try::Retry => self.changed(),
        }
    }

    fn wait(&mut self, until: Option<Boot>) -> Result<Woke, Error> {
        self.w.until = until;
        match self.local.take(&mut self.w, self.req, &self.files, true)? {
            // The deadline came, or a later request replaced us.
            Try::Busy(holder) => self.holder = holder,
            tried => self.next = Some(tried),
        }
        Ok(Woke::Look)
    }

    /// Our place goes with its descriptor; a lock got and not granted too.
    fn leave(&mut self) {
        self.w.queued = None;
        self.next = None;
    }

    /// No server that could be away: the local engine's errors name their
    /// files already.
    fn remote(&self) -> Option<&Remote> {
        None
    }
}

impl Taking<'_> {
    /// Grant a lock taken; a grant that could not be made looks again.
    fn grant(&mut self, got: Got) -> Result<Look, Error> {
        match self.local.grant(&mut self.w, self.req, &self.files, got)? {
            Some(Acquired::Busy { .. }) if self.w.replaced.is_some() => {
                let by = self.w.replaced.take().unwrap_or_default();
                Ok(Look::Done(Acquired::Replaced { by }))
            }
            Some(Acquired::Busy { holder }) => Ok(Look::Blocked(holder)),
            Some(done) => Ok(Look::Done(done)),
            None => self.changed(),
        }
    }

    /// Something changed under the look (a file deleted or replaced, our
    /// place lapsed): look again, a bounded number of times.
    fn changed(&mut self) -> Result<Look, Error> {
        self.changed += 1;
        if self.changed >= CHANGES {
            return Err(Error::Refused(format!(
                "lock file {} keeps changing under us",
                self.files.main.display()
            )));
        }
        Ok(Look::Again)
    }
}
