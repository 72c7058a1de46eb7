//! The lease a local grant hands to the supervisor: the locked descriptor
//! the job inherits, released by closing it, "renewed" by checking that the
//! path still names the locked file.

use super::*;
use crate::backend::MinHold;

/// A local lease: the locked descriptor (inherited by the job), and with
/// `--limit` the main file's shared lock beside the slot's.
pub(super) struct LocalHeld {
    pub(super) fd: OwnedFd,
    pub(super) main: Option<OwnedFd>,
    pub(super) path: PathBuf,
    pub(super) id: (u64, u64),
    pub(super) name: String,
    /// The grant's token, and when its lock came (just after): which
    /// preemption marks are meant for it.
    pub(super) token: u64,
    pub(super) got_at: Boot,
}

impl Held for LocalHeld {
    fn renewer(&self) -> Renewing {
        let renewer = LocalRenewer {
            path: self.path.clone(),
            id: self.id,
            token: self.token,
            got_at: self.got_at,
        };
        Renewing::Anywhere(Box::new(move || Box::new(renewer.clone())))
    }

    fn inherit_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn release(self: Box<Self>, window: MinHold) -> Result<bool, Error> {
        // The window went into the record with the grant: out again, while
        // the lock is still ours, when it is forgotten; and when we were
        // preempted, so that it does not keep out the request that stopped
        // us (a shared record's window may be another holder's too: it
        // stays).
        if let Some(r) = read_record(&self.fd).filter(|r| r.window.is_some())
            && r.mode != Mode::Shared
            && (window == MinHold::Forget
                || r.token == self.token
                    && read_preempt(&self.fd).is_some_and(|p| p.stops(self.token, self.got_at)))
        {
            let _ = end_window(&self.fd, &r);
        }
        // Closing (not LOCK_UN) releases only when no process of the job still
        // holds the inherited descriptor: the safe side if one escaped.
        let still_ours = matches!(stat(&self.path), Ok(st) if identity(&st) == self.id);
        drop(self.fd);
        drop(self.main);
        log::info(format!("released {}", self.name));
        Ok(still_ours)
    }

    fn releases_locally(&self) -> bool {
        true
    }
}

#[derive(Clone)]
pub(super) struct LocalRenewer {
    path: PathBuf,
    id: (u64, u64),
    token: u64,
    got_at: Boot,
}

impl Renewer for LocalRenewer {
    fn renew(&mut self) -> Result<Renewal, Error> {
        // The flock cannot expire; the lease is lost only if the path stops
        // naming our file, since a new file there would admit a second holder.
        match stat(&self.path) {
            Ok(st) if identity(&st) == self.id => {}
            _ => return Ok(Renewal::Lost),
        }
        // A --preempt request asked us to stop: its mark is in our file, after
        // the record. Read on a descriptor of its own, which locks nothing.
        let mark = open(
            &self.path,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            FileMode::empty(),
        )
        .ok()
        .filter(|fd| matches!(fstat(fd), Ok(st) if identity(&st) == self.id))
        .and_then(read_preempt)
        .filter(|p| p.stops(self.token, self.got_at));
        Ok(match mark {
            Some(p) => Renewal::Preempted { by: p.by },
            None => Renewal::Renewed { ttl: Duration::MAX },
        })
    }
}
