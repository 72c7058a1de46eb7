//! The queue of places beside a name's lock file, and one request's wait:
//! its place kept by refreshing it, blocking on a lock from a helper thread
//! until the deadline the driver set.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use std::path::Path;

use rustix::fs::{FlockOperation, Mode as FileMode, OFlags, flock, open};
use rustix::io::Errno;

use super::files::{flock_blocking, suffixed};
use crate::backend::{Error, Request, Wait};
use crate::clock::Boot;

/// CLOCK_MONOTONIC in nanoseconds: the queue's clock. Every process of the
/// machine reads the same one, and unlike CLOCK_BOOTTIME it stands still
/// through a suspend, which stops every waiter alike and must not cost any
/// of them its place.
pub(super) fn mono_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// A new file for place `path`, locked LOCK_EX, put at the path in one
/// rename while the caller holds the old file locked (so no other request
/// takes the place meanwhile). A waiter that watches the old file gets its
/// share of it as soon as the request that was there is gone.
pub(super) fn fresh_place(path: &Path) -> Result<OwnedFd, Errno> {
    let tmp = suffixed(path, &format!(".new{}", std::process::id()));
    let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::CREATE | OFlags::EXCL;
    // One left by a lockrun of the same pid killed mid-way: ours to remove.
    let _ = rustix::fs::unlink(&tmp);
    let fd = open(&tmp, flags, FileMode::from_raw_mode(0o666))?;
    let done = flock(&fd, FlockOperation::NonBlockingLockExclusive)
        .and_then(|()| rustix::fs::rename(&tmp, path));
    if let Err(e) = done {
        let _ = rustix::fs::unlink(&tmp);
        return Err(e);
    }
    Ok(fd)
}

/// Size of a place's record, written in one `pwrite`.
pub(super) const PLACE_RECORD: usize = 80;

/// How often a `--supersede` waiter looks whether it was replaced (ns):
/// four reads of its own place a second, to leave within a fraction of one.
const REPLACED_LOOK: u64 = 250_000_000;

/// Most places a name's queue has (one file each).
pub(super) const MAX_PLACES: u32 = 10_000;

/// A queued request's place (lockrun-engines(7) "LOCAL"): a place file it
/// holds LOCK_EX, so the place goes with the process, and a record of when
/// it came (its rank in the queue) and until when it keeps the place.
pub(super) struct Place {
    pub(super) fd: OwnedFd,
    pub(super) index: u32,
    pub(super) arrived: u64,
    /// `--supersede`: recorded in the place, so a later request with it
    /// knows it may replace this one.
    pub(super) supersede: bool,
    pub(super) until: u64,
    /// How long one refresh keeps the place (ttl/3), and how often it is
    /// refreshed (ttl/5), as a Redis waiter keeps its place.
    pub(super) keep: u64,
    pub(super) every: u64,
    pub(super) refresh_at: u64,
}

/// A place as another request sees it: its file, open, and its record.
pub(super) struct Seen {
    pub(super) file: OwnedFd,
    pub(super) index: u32,
    pub(super) arrived: u64,
    pub(super) until: u64,
    pub(super) pid: u32,
    /// It asked for `--supersede`.
    pub(super) supersede: bool,
    /// A later `--supersede` request replaced it: it is leaving.
    pub(super) replaced: bool,
}

impl Seen {
    pub(super) fn rank(&self) -> (u64, u32) {
        (self.arrived, self.pid)
    }
}

pub(super) fn write_place(
    fd: impl AsFd,
    arrived: u64,
    until: u64,
    supersede: bool,
) -> std::io::Result<()> {
    // An older lockrun reads the fields it knows and skips `sup=1`.
    let sup = if supersede { " sup=1" } else { "" };
    let text = format!(
        "arrived={arrived} until={until} pid={}{sup}",
        std::process::id()
    );
    let mut buf = [b' '; PLACE_RECORD];
    buf[..text.len()].copy_from_slice(text.as_bytes());
    buf[PLACE_RECORD - 1] = b'\n';
    let n = rustix::io::pwrite(fd, &buf, 0)?;
    if n != PLACE_RECORD {
        return Err(std::io::Error::other("short write of a place in the queue"));
    }
    Ok(())
}

/// A place's record: (arrived, until, pid).
pub(super) fn read_place(fd: impl AsFd) -> Option<(u64, u64, u32)> {
    let mut buf = [0u8; PLACE_RECORD];
    let n = rustix::io::pread(fd, &mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let (mut arrived, mut until, mut pid) = (None, None, None);
    for field in text.split_whitespace() {
        if let Some(v) = field.strip_prefix("arrived=") {
            arrived = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("until=") {
            until = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("pid=") {
            pid = v.parse().ok();
        }
    }
    Some((arrived?, until?, pid?))
}

/// Whether a place's record says it asked for `--supersede`.
pub(super) fn reads_supersede(fd: impl AsFd) -> bool {
    let mut buf = [0u8; PLACE_RECORD];
    let Ok(n) = rustix::io::pread(fd, &mut buf, 0) else {
        return false;
    };
    std::str::from_utf8(&buf[..n]).is_ok_and(|t| t.split_whitespace().any(|f| f == "sup=1"))
}

/// Size of the replacement mark written after a place's record.
const REPLACED_MARK: usize = 256;

/// Mark a place replaced by the request shown as `by`: a line after the
/// place's record, which its waiter reads while it waits and its own
/// refreshes (of the record only) leave alone. An older lockrun reads only
/// the record. The mark goes with the file: a request that takes the place
/// later does so in a new file.
pub(super) fn mark_replaced(fd: impl AsFd, by: &str) -> std::io::Result<()> {
    let by: String = by
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(150)
        .collect();
    let mut text = format!("replaced_by={by}");
    let mut cut = text.len().min(REPLACED_MARK - 1);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    let mut buf = [b' '; REPLACED_MARK];
    buf[..text.len()].copy_from_slice(text.as_bytes());
    buf[REPLACED_MARK - 1] = b'\n';
    let n = rustix::io::pwrite(fd, &buf, PLACE_RECORD as u64)?;
    if n != REPLACED_MARK {
        return Err(std::io::Error::other("short write of a replacement mark"));
    }
    Ok(())
}

/// Who replaced the place, if a later `--supersede` request did.
pub(super) fn replaced_by(fd: impl AsFd) -> Option<String> {
    let mut buf = [0u8; REPLACED_MARK];
    let n = rustix::io::pread(fd, &mut buf, PLACE_RECORD as u64).ok()?;
    // Whole marks only: one being written ends in its newline.
    if n != REPLACED_MARK || buf[REPLACED_MARK - 1] != b'\n' {
        return None;
    }
    let text = std::str::from_utf8(&buf).ok()?;
    text.strip_prefix("replaced_by=")
        .map(|by| by.trim_end().to_string())
}

impl Place {
    pub(super) fn rank(&self) -> (u64, u32) {
        (self.arrived, std::process::id())
    }

    /// Keep the place: refresh its record when due. False when it lapsed
    /// (we were stopped, or starved, past `until`): a waiter behind may have
    /// gone ahead, so the place is taken again at the back of the queue.
    pub(super) fn tend(&mut self) -> bool {
        let now = mono_ns();
        let kept = now < self.until;
        if !kept {
            self.arrived = now;
        }
        if !kept || now >= self.refresh_at {
            self.until = now.saturating_add(self.keep);
            self.refresh_at = now.saturating_add(self.every);
            // A failed write only makes the place lapse, which we notice.
            let _ = write_place(&self.fd, self.arrived, self.until, self.supersede);
        }
        kept
    }
}

/// What a queued request holds: its place, and a share of the gate, which
/// tells requests that come later that someone is queued.
pub(super) struct Queued {
    pub(super) place: Place,
    pub(super) gate: OwnedFd,
    /// False while a request looking at the gate kept us from our share.
    pub(super) shared: bool,
}

impl Queued {
    /// Who replaced us, if a later `--supersede` request did (only a place
    /// that asked for it can be).
    pub(super) fn replaced_by(&self) -> Option<String> {
        self.place
            .supersede
            .then(|| replaced_by(&self.place.fd))
            .flatten()
    }

    pub(super) fn tend(&mut self) -> bool {
        if !self.shared {
            self.shared = share_gate(&self.gate, 1);
        }
        self.place.tend()
    }
}

/// Take a share of the gate (LOCK_SH), trying `tries` times a millisecond
/// apart: it is held exclusively only for the instant a request looks
/// whether anyone is queued, never while anyone waits.
pub(super) fn share_gate(gate: &OwnedFd, tries: u32) -> bool {
    for i in 0..tries {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        match flock(gate, FlockOperation::NonBlockingLockShared) {
            Ok(()) => return true,
            Err(Errno::WOULDBLOCK) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// What one wait ended with.
pub(super) enum Heard<T> {
    Got(T),
    /// The time asked for came.
    Woke,
    /// The driver's deadline came, a later request replaced us (`replaced`
    /// is set), or our place lapsed (`lapsed` is set).
    Over,
}

/// One request's wait: until when it may block (the driver's deadline)
/// and its place in the queue once it has one.
pub(super) struct Waiter<'a> {
    pub(super) name: &'a str,
    pub(super) req: &'a Request<'a>,
    pub(super) wait: Wait,
    pub(super) until: Option<Boot>,
    /// The wait is over: a request that could not join the queue at once
    /// is not to try again.
    pub(super) last: bool,
    pub(super) queued: Option<Queued>,
    /// Our place lapsed during a wait and was taken again at the back.
    pub(super) lapsed: bool,
    /// A later `--supersede` request replaced us (shown as `host:pid (label)`).
    pub(super) replaced: Option<String>,
}

impl Waiter<'_> {
    pub(super) fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::Refused(format!("{what} {}: {e}", self.name))
    }

    /// Block until `rx` delivers, as the wait allows. None: gave up, or our
    /// place lapsed.
    pub(super) fn receive<T>(&mut self, rx: &std::sync::mpsc::Receiver<T>) -> Option<T> {
        match self.hear(rx, None) {
            Heard::Got(v) => Some(v),
            Heard::Woke | Heard::Over => None,
        }
    }

    /// Block until `rx` delivers or, if given, until `wake` (on `mono_ns`),
    /// keeping our place meanwhile.
    pub(super) fn hear<T>(
        &mut self,
        rx: &std::sync::mpsc::Receiver<T>,
        wake: Option<u64>,
    ) -> Heard<T> {
        use std::sync::mpsc::RecvTimeoutError;
        loop {
            // Replaced: we leave, whatever else happened meanwhile.
            if let Some(by) = self.queued.as_ref().and_then(Queued::replaced_by) {
                self.replaced = Some(by);
                return Heard::Over;
            }
            // First, so that a wait resuming after a stop sees its place lapsed.
            if let Some(q) = self.queued.as_mut()
                && !q.tend()
            {
                self.lapsed = true;
                return Heard::Over;
            }
            if self.until.is_some_and(|u| Boot::now() >= u) {
                return Heard::Over;
            }
            if wake.is_some_and(|at| mono_ns() >= at) {
                return Heard::Woke;
            }
            let mono = mono_ns();
            // A waiter that may be replaced looks for the mark often: it is
            // to leave within a fraction of a second.
            let look = self
                .queued
                .as_ref()
                .filter(|q| q.place.supersede)
                .map(|_| mono.saturating_add(REPLACED_LOOK));
            let ours = [self.queued.as_ref().map(|q| q.place.refresh_at), wake, look]
                .into_iter()
                .flatten()
                .map(|at| Duration::from_nanos(at.saturating_sub(mono)))
                .min();
            let deadline = self.until.map(|u| u.since(Boot::now()));
            let next = match (ours, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let got = match next {
                Some(d) => rx.recv_timeout(d),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match got {
                Ok(v) => return Heard::Got(v),
                Err(RecvTimeoutError::Disconnected) => return Heard::Over,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Sleep while a `--min-hold` window runs for `left` more, keeping our
    /// place; false: gave up, or our place lapsed. Wakes at least every
    /// ttl/3 to look again: `release --force` may have ended the window.
    pub(super) fn sleep_for(&mut self, left: Duration) -> bool {
        let look = left
            .min(self.req.timing.ttl / 3)
            .max(Duration::from_millis(1));
        let wake = mono_ns().saturating_add(u64::try_from(look.as_nanos()).unwrap_or(u64::MAX));
        // Nothing is sent: only the time wakes us.
        let (_keep, rx) = std::sync::mpsc::channel::<()>();
        matches!(self.hear(&rx, Some(wake)), Heard::Woke)
    }

    /// Block on `fd`'s lock as the wait allows: when it came, just after.
    /// Ok(None): gave up (or `-n`).
    pub(super) fn block(
        &mut self,
        fd: &OwnedFd,
        op: FlockOperation,
    ) -> Result<Option<Boot>, Error> {
        if self.wait == Wait::No {
            return Ok(None);
        }
        // A helper thread blocks in flock on a duplicate of the same open file
        // (the lock belongs to the open file, so it is ours when it comes). If
        // we give up, lockrun is about to exit, which ends the helper and
        // drops any lock it got.
        let dup = fd.try_clone().map_err(|e| self.unavailable("dup", e))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .spawn(move || {
                let _ = tx.send(flock_blocking(&dup, op));
            })
            .map_err(|e| self.unavailable("cannot start a thread to wait for", e))?;
        match self.receive(&rx) {
            Some(Ok(at)) => Ok(Some(at)),
            Some(Err(e)) => Err(self.unavailable("locking", e)),
            None => Ok(None),
        }
    }
}
