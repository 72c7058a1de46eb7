//! The local engine: `flock(2)` on files in a per-user directory, one per
//! name (LOCK_EX or LOCK_SH), N slot files for `--limit N`, and beside them
//! a queue of places that waiters keep by refreshing them, so that waiters
//! are served in arrival order across modes and one that stops keeping its
//! place (stopped, or dead) holds nobody up for long. The locked descriptor
//! is inherited by the job, as flock(1) does.
//!
//! By layer: `files.rs` is the directory (and why it is safe to trust), file
//! names and flocking; `record.rs` the text a lock file holds; `proclocks.rs`
//! what /proc/locks says and the search for a deleted file's holder;
//! `queue.rs` the places in the queue and one request's wait. This file
//! holds the engine's row and address, taking and granting a name, status,
//! and the lease.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FlockOperation, Mode as FileMode, OFlags, flock, fstat, open, stat};
use rustix::io::Errno;

use std::sync::Arc;

use super::{
    Acquired, Address, AddressOptions, Broken, Check, Engine, EngineInfo, Error, Force, Held,
    Holder, Lease, ListBound, Listing, Mode, Opening, Request, Status, Wait,
};
mod files;
mod proclocks;
mod queue;
mod record;

use files::{
    file_name, flock_blocking, identity, name_of_file, nonblocking, open_lock_file, prepare_dir,
    suffixed,
};
use proclocks::{find_orphan_holder, flocks, lockers};
use queue::{
    Heard, MAX_PLACES, Place, Queued, Seen, Waiter, fresh_place, mono_ns, read_place, share_gate,
    write_place,
};
#[cfg(test)]
use record::write_token;
use record::{
    Record, Window, end_window, next_token, now_since_epoch, read_readers, read_record,
    write_record,
};

use super::{Renewal, Renewer, Renewing};
use crate::backend::wait::Patience;
use crate::clock::Boot;
use crate::log;

/// A lock taken: the descriptor the job inherits and its file's identity;
/// with `--limit`, also the main file's shared lock and the slot number.
struct Got {
    fd: OwnedFd,
    id: (u64, u64),
    main: Option<OwnedFd>,
    slot: Option<u32>,
}

/// One try at a lock file.
enum Locked {
    Got(Got),
    Not(Try),
    /// Free of flocks, but a `--min-hold` window holds it for `left` more.
    Kept {
        holder: Option<String>,
        left: Duration,
    },
}

/// How long a `--min-hold` window recorded by a grant of `mode` keeps out
/// a lock of `op` for a request of `asked`. A slot file and an exclusive
/// lock wait for every window; the main file's shared lock only for a
/// window of another kind of grant: shared grants hold their place together,
/// `--limit` grants each in its slot file.
fn keeps_out(win: &Window, mode: Mode, op: FlockOperation, asked: Mode) -> Option<Duration> {
    let together = matches!(
        (mode, asked),
        (Mode::Shared, Mode::Shared) | (Mode::Limit(_), Mode::Limit(_))
    );
    if op == FlockOperation::LockShared && together {
        return None;
    }
    win.left()
}

enum Try {
    Locked(Got),
    /// Held by someone else (their label, if the file has one).
    Busy(Option<String>),
    /// The file changed under us; start over.
    Retry,
}

/// The local engine's row of the scheme table: the default, with no URL.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "local",
    schemes: &["file"],
    form: "file:///dir",
    parse,
    // Leases are asked for in milliseconds (PX / the boot clock).
    ttl_step: Duration::from_millis(1),
    ttl_min: Duration::ZERO,
    expires: false,
};

/// A lock directory (README "Local (the default)"); None is the per-user default.
#[derive(Debug, Clone)]
pub struct LocalDir {
    pub dir: Option<PathBuf>,
    /// `--prefix` came from the environment (meant for another engine).
    prefix_from_env: bool,
}

impl Address for LocalDir {
    fn engine(&self) -> &'static EngineInfo {
        &ENGINE
    }
    fn shown(&self) -> String {
        match &self.dir {
            Some(d) => format!("file://{}", d.display()),
            None => "the local default directory".into(),
        }
    }
    /// A prefix would not part one name's lock from another's here (the
    /// directory is the namespace): refused rather than ignored, so that
    /// two runs that look apart are never one lock.
    fn check_prefix(&self, prefix: &str) -> Result<(), Error> {
        if self.prefix_from_env || prefix == crate::cli::DEFAULT_PREFIX {
            return Ok(());
        }
        let shown: String = prefix.chars().take(60).collect();
        Err(Error::Request(format!(
            "--prefix {shown:?} does not apply to the local engine: its namespace is the lock \
             directory; give another one with --url file:///DIR"
        )))
    }
    fn open(&self, _how: &Opening) -> Result<Box<dyn Engine>, Error> {
        Ok(Box::new(Local::open(self.dir.as_deref())?))
    }
    fn doctor(&self, _how: &Opening) -> Vec<Check> {
        files::doctor(self.dir.as_deref())
    }
}

/// Parse `file:///dir` (empty: the default directory).
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    let usage = Error::Request;
    let dir = if raw.is_empty() {
        None
    } else {
        let expected = format!("expected {}", ENGINE.form);
        let url =
            url::Url::parse(raw).map_err(|e| usage(format!("invalid --url: {e}; {expected}")))?;
        let display = url.to_string();
        if url
            .host_str()
            .is_some_and(|h| !h.is_empty() && h != "localhost")
        {
            return Err(usage(format!(
                "invalid --url {display}: a file URL names a local directory, file:///dir"
            )));
        }
        Some(
            url.to_file_path()
                .map_err(|()| usage(format!("invalid --url {display}: {expected}")))?,
        )
    };
    let addr = LocalDir {
        dir,
        prefix_from_env: opts.prefix_from_env,
    };
    opts.no_tls(&addr.shown())?;
    opts.no_replicas(&addr.shown())?;
    Ok(Arc::new(addr))
}

/// The local engine: a directory of lock files.
pub struct Local {
    dir: PathBuf,
}

/// Paths of one name's files. The suffixes never end in `.lock`, so they
/// cannot meet another name's main file.
struct Files {
    main: PathBuf,
    gate: PathBuf,
    grant: PathBuf,
    readers: PathBuf,
}

impl Files {
    fn slot(&self, k: u32) -> PathBuf {
        suffixed(&self.main, &format!(".slot{k}"))
    }

    fn place(&self, k: u32) -> PathBuf {
        suffixed(&self.main, &format!(".place{k}"))
    }
}

impl Local {
    pub fn open(dir: Option<&Path>) -> Result<Local, Error> {
        Ok(Local {
            dir: prepare_dir(dir)?,
        })
    }

    fn files(&self, name: &str) -> Files {
        let main = self.dir.join(file_name(name));
        Files {
            gate: suffixed(&main, ".gate"),
            grant: suffixed(&main, ".grant"),
            readers: suffixed(&main, ".readers"),
            main,
        }
    }

    fn unavailable(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
        Error::Refused(format!("{what} {}: {e}", path.display()))
    }

    /// Take one lock file: at once, or (`block`) waiting as the request allows.
    /// Checks that the path still names the file locked, and waits for the
    /// holder of a deleted or replaced file that still runs.
    fn lock_path(
        &self,
        w: &mut Waiter,
        path: &Path,
        op: FlockOperation,
        block: bool,
    ) -> Result<Try, Error> {
        loop {
            match self.lock_path_once(w, path, op, block)? {
                Locked::Got(got) => return Ok(Try::Locked(got)),
                Locked::Not(t) => return Ok(t),
                // A --min-hold window holds the name with no flock: wait
                // for its end, as the request allows, keeping our place.
                Locked::Kept { holder, left } => {
                    if !block || !w.sleep_for(left, holder.as_deref()) {
                        return Ok(Try::Busy(holder));
                    }
                }
            }
        }
    }

    /// One try of `lock_path`: a lock whose record holds a `--min-hold`
    /// window that keeps out a lock of `op` is let go again at once.
    fn lock_path_once(
        &self,
        w: &mut Waiter,
        path: &Path,
        op: FlockOperation,
        block: bool,
    ) -> Result<Locked, Error> {
        let Some((fd, created)) =
            open_lock_file(path).map_err(|e| self.unavailable("cannot open lock file", path, e))?
        else {
            return Ok(Locked::Not(Try::Retry));
        };
        match flock(&fd, nonblocking(op)) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let holder = read_record(&fd).map(|r| r.label).filter(|l| !l.is_empty());
                if w.req.is_own_outer_holder(holder.as_deref()) {
                    return Err(super::nested(w.name));
                }
                if !block || !w.block(&fd, op, holder.as_deref())? {
                    return Ok(Locked::Not(Try::Busy(holder)));
                }
            }
            Err(e) => return Err(self.unavailable("cannot lock", path, e)),
        }
        // The path must still name the file we locked: a file deleted or
        // replaced meanwhile would let someone else lock the new one.
        let ours = fstat(&fd).map_err(|e| self.unavailable("fstat", path, e))?;
        match stat(path) {
            Ok(now) if identity(&now) == identity(&ours) => {}
            _ => return Ok(Locked::Not(Try::Retry)),
        }
        let fresh = read_record(&fd).is_none_or(|r| r.ino != Some(ours.st_ino));
        if created || fresh {
            // A file no holder has written to yet, or a copy of another one
            // (`cp NAME.lock t && mv t NAME.lock`), may have replaced a
            // deleted one whose holder still runs; its holder must finish
            // first. A shared lock only conflicts with an exclusive one.
            let any = op != FlockOperation::LockShared;
            while let Some(orphan) = find_orphan_holder(path, ours.st_dev, ours.st_ino, any) {
                log::info(format!(
                    "{} was deleted while held; waiting for its holder to finish",
                    path.display()
                ));
                let holder = read_record(&orphan).map(|r| r.label);
                if !block || !w.block(&orphan, FlockOperation::LockExclusive, holder.as_deref())? {
                    return Ok(Locked::Not(Try::Busy(holder)));
                }
            }
        }
        if let Some(r) = read_record(&fd)
            && let Some(left) = r
                .window
                .as_ref()
                .and_then(|win| keeps_out(win, r.mode, op, w.req.mode))
        {
            // Let the lock go: `status`, `-n` and the next in the queue
            // see the name held by the window, not by us.
            drop(fd);
            let holder = Some(format!("the min-hold window of {}", r.label));
            return Ok(Locked::Kept { holder, left });
        }
        Ok(Locked::Got(Got {
            fd,
            id: identity(&ours),
            main: None,
            slot: None,
        }))
    }

    /// True when this process runs inside a job that holds a lock of
    /// `files` on the descriptor it inherited.
    fn inside_holder(files: &Files, inherited: Option<RawFd>) -> bool {
        let Some(n) = inherited else {
            return false;
        };
        // SAFETY: the descriptor number only lives for this call; fstat on a
        // closed or foreign number just fails.
        let inherited = unsafe { std::os::fd::BorrowedFd::borrow_raw(n) };
        let Ok(st) = fstat(inherited) else {
            return false;
        };
        let same = |p: &Path| matches!(stat(p), Ok(s) if identity(&s) == identity(&st));
        if same(&files.main) {
            return true;
        }
        // A slot of this name: the inherited file's path starts with the main one's.
        std::fs::read_link(format!("/proc/self/fd/{n}")).is_ok_and(|target| {
            let slot = suffixed(&files.main, ".slot");
            target
                .as_os_str()
                .as_bytes()
                .starts_with(slot.as_os_str().as_bytes())
        })
    }

    /// The mode of the holders in force, read from the main file's record:
    /// every grant writes it once it holds its lock (shared and `--limit`
    /// grants one at a time, under the grant lock).
    fn mode_in_force(files: &Files) -> Option<Mode> {
        let file = std::fs::File::open(&files.main).ok()?;
        let st = fstat(&file).ok()?;
        let me = std::process::id();
        if lockers(st.st_dev, st.st_ino)
            .iter()
            .all(|(pid, _)| *pid == me)
        {
            return None;
        }
        read_record(&file).map(|r| r.mode)
    }

    /// Wait for any of the slot files; the first one locked wins. Threads
    /// that lock another later let it go at once.
    fn wait_any_slot(
        &self,
        w: &mut Waiter,
        files: &Files,
        n: u32,
        skip: &[u32],
        wake: Option<Duration>,
        holder: Option<&str>,
    ) -> Result<Slot, Error> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        if w.wait == Wait::No {
            return Ok(Slot::Over);
        }
        let won = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        // With a time to wake at, the wait ends then even when no slot is
        // waited on (every one kept by a window).
        let _keep = wake.map(|_| tx.clone());
        let wake =
            wake.map(|d| mono_ns().saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)));
        for k in (0..n).filter(|k| !skip.contains(k)) {
            let path = files.slot(k);
            let Some((fd, _)) = open_lock_file(&path)
                .map_err(|e| self.unavailable("cannot open lock file", &path, e))?
            else {
                continue;
            };
            let (tx, won) = (tx.clone(), won.clone());
            std::thread::Builder::new()
                .spawn(move || {
                    if flock_blocking(&fd, FlockOperation::LockExclusive).is_ok()
                        && !won.swap(true, Ordering::SeqCst)
                    {
                        let _ = tx.send((k, fd));
                    }
                    // Otherwise the descriptor closes here, letting the slot go.
                })
                .map_err(|e| w.unavailable("cannot start a thread to wait for", e))?;
        }
        drop(tx);
        let heard = w.hear(&rx, holder, wake);
        // Giving up: a slot locked after this is let go by its thread.
        won.store(true, Ordering::SeqCst);
        Ok(match heard {
            Heard::Got((k, fd)) => Slot::Got(k, fd),
            other => match rx.try_recv() {
                Ok((k, fd)) => Slot::Got(k, fd),
                Err(_) if matches!(other, Heard::Woke) => Slot::Woke,
                Err(_) => Slot::Over,
            },
        })
    }

    /// Take one of `n` slots (main file shared, slot file exclusive): at
    /// once, or (`block`) waiting as the request allows.
    fn lock_slot(&self, w: &mut Waiter, files: &Files, n: u32, block: bool) -> Result<Try, Error> {
        let main = match self.lock_path(w, &files.main, FlockOperation::LockShared, block)? {
            Try::Locked(got) => got.fd,
            other => return Ok(other),
        };
        loop {
            let mut holder = None;
            // Slots free of flocks but kept by a --min-hold window are not
            // waited on: the soonest window's end is.
            let mut kept = Vec::new();
            let mut soonest: Option<Duration> = None;
            for k in 0..n {
                match self.lock_path_once(
                    w,
                    &files.slot(k),
                    FlockOperation::LockExclusive,
                    false,
                )? {
                    Locked::Got(got) => return Ok(slotted(main, k, got.fd, got.id)),
                    Locked::Not(Try::Busy(h)) => holder = holder.or(h),
                    Locked::Not(_) => return Ok(Try::Retry),
                    Locked::Kept { holder: h, left } => {
                        holder = holder.or(h);
                        kept.push(k);
                        soonest = Some(soonest.map_or(left, |s: Duration| s.min(left)));
                    }
                }
            }
            if !block {
                return Ok(Try::Busy(holder));
            }
            let wake = soonest.map(|left| left.min(w.req.timing.ttl / 3));
            match self.wait_any_slot(w, files, n, &kept, wake, holder.as_deref())? {
                Slot::Over => return Ok(Try::Busy(holder)),
                // A window ran out (or is looked at again): try every slot.
                Slot::Woke => {}
                Slot::Got(k, fd) => {
                    let ours =
                        fstat(&fd).map_err(|e| self.unavailable("fstat", &files.slot(k), e))?;
                    match stat(files.slot(k)) {
                        Ok(now) if identity(&now) == identity(&ours) => {}
                        _ => return Ok(Try::Retry),
                    }
                    // The holder that let it go may have left its window.
                    let windowed = read_record(&fd).is_some_and(|r| {
                        r.window
                            .as_ref()
                            .and_then(|win| {
                                keeps_out(win, r.mode, FlockOperation::LockExclusive, w.req.mode)
                            })
                            .is_some()
                    });
                    if !windowed {
                        return Ok(slotted(main, k, fd, identity(&ours)));
                    }
                }
            }
        }
    }
}

/// What a wait for any of the slots ended with.
enum Slot {
    Got(u32, OwnedFd),
    /// The time asked for came.
    Woke,
    /// Gave up, or our place lapsed.
    Over,
}

fn slotted(main: OwnedFd, k: u32, fd: OwnedFd, id: (u64, u64)) -> Try {
    Try::Locked(Got {
        fd,
        id,
        main: Some(main),
        slot: Some(k),
    })
}

impl Engine for Local {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        let files = self.files(req.name);
        if Self::inside_holder(&files, req.inherited_fd) {
            return Err(super::nested(req.name));
        }
        let mut w = Waiter {
            name: req.name,
            req,
            wait,
            patience: Patience::new(req, wait),
            queued: None,
            lapsed: false,
        };
        // Bounded: each retry means a file was deleted or replaced meanwhile,
        // or our place in the queue lapsed (we were stopped).
        for _ in 0..100 {
            let got = match self.take(&mut w, req, &files)? {
                Try::Locked(got) => got,
                Try::Busy(holder) => return Ok(Acquired::Busy { holder }),
                Try::Retry => continue,
            };
            if let Some(done) = self.grant(&mut w, req, &files, got)? {
                return Ok(done);
            }
        }
        Err(Error::Refused(format!(
            "lock file {} keeps changing under us",
            files.main.display()
        )))
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        self.end_windows(name, force)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let files = self.files(name);
        self.status_of(&files)
    }

    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| self.unavailable("cannot list", &self.dir, e))?;
        let mut names = Vec::new();
        let mut notes = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.unavailable("cannot list", &self.dir, e))?;
            // A name's main file ends in `.lock`; its other files never do.
            let Some(name) = entry.file_name().to_str().and_then(name_of_file) else {
                continue;
            };
            if names.len() >= bound.names || bound.passed() {
                notes.push(format!(
                    "stopped after {} names: the list is incomplete",
                    names.len()
                ));
                break;
            }
            let main = entry.path();
            let files = Files {
                gate: suffixed(&main, ".gate"),
                grant: suffixed(&main, ".grant"),
                readers: suffixed(&main, ".readers"),
                main,
            };
            // One file that cannot be read (not a regular file, no
            // permission) costs its name a note, not the whole list.
            match self.status_of(&files) {
                Ok(st) => names.push((name, st)),
                Err(e) => notes.push(format!("{name}: left out: {e}")),
            }
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        notes.push(
            "read file by file, not as one snapshot: a lock may change while it is read".into(),
        );
        Ok(Listing { names, notes })
    }
}

impl Local {
    fn status_of(&self, files: &Files) -> Result<Status, Error> {
        // Read-only: a probing flock could make a concurrent `-n` fail.
        // Opened without blocking and without following a link: a FIFO or
        // a link planted in a shared directory must not hold `status` up.
        let opened = {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
                .open(&files.main)
        };
        let file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Status::default()),
            Err(e) => return Err(self.unavailable("cannot read", &files.main, e)),
        };
        let st = fstat(&file).map_err(|e| self.unavailable("fstat", &files.main, e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(self.unavailable(
                "cannot read",
                &files.main,
                std::io::Error::other("not a regular file"),
            ));
        }
        let now_ms = now_since_epoch().as_millis() as u64;
        let held_for = |granted_ms: u64| {
            (granted_ms > 0 && granted_ms <= now_ms)
                .then(|| Duration::from_millis(now_ms - granted_ms))
        };
        let holder = |r: &Record, mode, slot| Holder {
            label: Some(r.label.clone()).filter(|l| !l.is_empty()),
            token: Some(r.token),
            mode,
            slot,
            ttl_left: None,
            held_for: held_for(r.granted_ms),
            revoked: false,
            min_hold: false,
        };
        let lockers = lockers(st.st_dev, st.st_ino);
        let rec = read_record(&file);
        let mut holders = Vec::new();
        match rec.as_ref().map(|r| r.mode) {
            _ if lockers.is_empty() => {}
            Some(Mode::Limit(n)) => {
                for k in 0..n {
                    let Ok(slot) = std::fs::File::open(files.slot(k)) else {
                        continue;
                    };
                    if let (Ok(s), Some(r)) = (fstat(&slot), read_record(&slot))
                        && !self::lockers(s.st_dev, s.st_ino).is_empty()
                    {
                        holders.push(holder(&r, Mode::Limit(n), Some(k)));
                    }
                }
            }
            Some(Mode::Shared) if lockers.iter().all(|(_, x)| !x) => {
                for r in read_readers(&files.readers) {
                    if lockers.iter().any(|(pid, _)| *pid == r.pid) {
                        holders.push(Holder {
                            label: Some(r.label).filter(|l| !l.is_empty()),
                            token: Some(r.token),
                            mode: Mode::Shared,
                            slot: None,
                            ttl_left: None,
                            held_for: held_for(r.granted_ms),
                            revoked: false,
                            min_hold: false,
                        });
                    }
                }
            }
            _ => {
                if let Some(r) = &rec {
                    holders.push(holder(r, Mode::Exclusive, None));
                } else {
                    holders.push(Holder {
                        label: None,
                        token: None,
                        mode: Mode::Exclusive,
                        slot: None,
                        ttl_left: None,
                        held_for: None,
                        revoked: false,
                        min_hold: false,
                    });
                }
            }
        }
        // --min-hold: windows that hold a place with no flock and no job.
        let window = |r: &Record, mode, slot| {
            r.window.as_ref().and_then(Window::left).map(|left| Holder {
                ttl_left: Some(left),
                min_hold: true,
                ..holder(r, mode, slot)
            })
        };
        match rec.as_ref().map(|r| r.mode) {
            Some(Mode::Limit(n)) => {
                let running: Vec<Option<u32>> = holders.iter().map(|h| h.slot).collect();
                for k in (0..n).filter(|k| !running.contains(&Some(*k))) {
                    let Ok(slot) = std::fs::File::open(files.slot(k)) else {
                        continue;
                    };
                    if let (Ok(s), Some(r)) = (fstat(&slot), read_record(&slot))
                        && self::lockers(s.st_dev, s.st_ino).is_empty()
                        && let Some(h) = window(&r, Mode::Limit(n), Some(k))
                    {
                        holders.push(h);
                    }
                }
                holders.sort_by_key(|h| h.slot);
            }
            Some(mode) if holders.is_empty() => {
                if let Some(h) = rec.as_ref().and_then(|r| window(r, mode, None)) {
                    holders.push(h);
                }
            }
            _ => {}
        }
        // Waiters: the places kept in the queue.
        let waiters = live_places(files, None).len() as u64;
        Ok(Status {
            holders,
            waiters: Some(waiters),
        })
    }
}

impl Local {
    /// `release --force`: a flock ends only with its holder, but a
    /// `--min-hold` window runs no job and can be ended: its record is
    /// rewritten without it, under the file's lock.
    fn end_windows(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let files = self.files(name);
        let st = self.status(name)?;
        let matched: Vec<&Holder> = st
            .holders
            .iter()
            .filter(|h| force.token.is_none_or(|t| h.token == Some(t)))
            .collect();
        if !st.holders.is_empty() && matched.is_empty() {
            return Ok(Broken::TokenMismatch(
                st.holders.iter().filter_map(|h| h.token).collect(),
            ));
        }
        if matched.is_empty() || matched.iter().any(|h| !h.min_hold) {
            let what = if matched.is_empty() {
                format!("{name} is not held")
            } else {
                format!("{name} is held by a running job; stop the holder's process instead")
            };
            return Err(Error::Request(format!(
                "release --force is not available on the local engine, whose locks end only \
                 with their holder: {what} (only a --min-hold window, which runs no job, can be \
                 ended)"
            )));
        }
        let mut ended = Vec::new();
        for h in matched {
            let path = h.slot.map_or_else(|| files.main.clone(), |k| files.slot(k));
            let Some((fd, _)) = open_lock_file(&path)
                .map_err(|e| self.unavailable("cannot open lock file", &path, e))?
            else {
                continue;
            };
            // Held only for the instant a request looks at the window, or
            // by a grant that just came: then it is no window of ours.
            let mut locked = false;
            for _ in 0..50 {
                match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => {
                        locked = true;
                        break;
                    }
                    Err(Errno::WOULDBLOCK) => std::thread::sleep(Duration::from_millis(2)),
                    Err(e) => return Err(self.unavailable("cannot lock", &path, e)),
                }
            }
            let Some(r) = read_record(&fd).filter(|_| locked) else {
                continue;
            };
            if Some(r.token) == h.token && r.window.as_ref().and_then(Window::left).is_some() {
                end_window(&fd, &r).map_err(|e| self.unavailable("writing", &path, e))?;
                ended.push(h.clone());
            }
        }
        if ended.is_empty() {
            // It ended, or was taken, while we looked.
            return Ok(Broken::NotHeld);
        }
        // `--limit` grants also left their latest window in the main record
        // (it keeps other kinds of request out): once no slot keeps one, it
        // goes too, under the grant lock every such grant writes it under.
        let limited = ended.iter().any(|h| h.slot.is_some());
        if limited && !self.status(name)?.holders.iter().any(|h| h.min_hold) {
            self.end_main_window(&files)?;
        }
        Ok(Broken::Leases(ended))
    }

    fn end_main_window(&self, files: &Files) -> Result<(), Error> {
        let Some((grant, _)) = open_lock_file(&files.grant)
            .map_err(|e| self.unavailable("cannot open lock file", &files.grant, e))?
        else {
            return Ok(());
        };
        let mut locked = false;
        for _ in 0..50 {
            match flock(&grant, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    locked = true;
                    break;
                }
                Err(Errno::WOULDBLOCK) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => return Err(self.unavailable("cannot lock", &files.grant, e)),
            }
        }
        // A grant writing the record now may be writing a window of its own.
        if !locked {
            return Ok(());
        }
        let Ok(main) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&files.main)
        else {
            return Ok(());
        };
        if let Some(r) = read_record(&main).filter(|r| r.window.is_some()) {
            end_window(&main, &r).map_err(|e| self.unavailable("writing", &files.main, e))?;
        }
        Ok(())
    }
}

/// The holder label in the name's record, for waiting lines.
fn recorded_holder(files: &Files) -> Option<String> {
    let f = std::fs::File::open(&files.main).ok()?;
    let r = read_record(&f)?;
    let st = fstat(&f).ok()?;
    // No one holds the lock but a --min-hold window: say so.
    if r.window.as_ref().and_then(Window::left).is_some()
        && lockers(st.st_dev, st.st_ino).is_empty()
    {
        return Some(format!("the min-hold window of {}", r.label));
    }
    Some(r.label).filter(|l| !l.is_empty())
}

/// The places kept in a name's queue, but ours (`except`): held (the flock
/// of a waiter that died is gone) and refreshed (the `until` of one that was
/// stopped passes).
fn live_places(files: &Files, except: Option<u32>) -> Vec<Seen> {
    let now = mono_ns();
    let mut held: Option<Vec<u64>> = None;
    let mut out = Vec::new();
    for k in 0..MAX_PLACES {
        if except == Some(k) {
            continue;
        }
        let file = match open(
            files.place(k),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            FileMode::empty(),
        ) {
            Ok(f) => f,
            // Places are taken lowest first: the first missing ends the queue.
            Err(Errno::NOENT) => break,
            Err(_) => continue,
        };
        let Ok(st) = fstat(&file) else { continue };
        let held = held.get_or_insert_with(|| {
            flocks(st.st_dev)
                .into_iter()
                .filter(|l| l.exclusive)
                .map(|l| l.ino)
                .collect()
        });
        if !held.contains(&st.st_ino) {
            continue;
        }
        if let Some((arrived, until, pid)) = read_place(&file)
            && until > now
        {
            out.push(Seen {
                file,
                arrived,
                until,
                pid,
            });
        }
    }
    out
}

impl Local {
    /// True when nobody is queued for the name: nobody holds a share of the
    /// gate. The look takes the gate for an instant and lets it go.
    fn nobody_queued(&self, files: &Files) -> Result<bool, Error> {
        let Some((gate, _)) = open_lock_file(&files.gate)
            .map_err(|e| self.unavailable("cannot open lock file", &files.gate, e))?
        else {
            return Ok(false);
        };
        match flock(&gate, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(true),
            Err(Errno::WOULDBLOCK) => Ok(false),
            Err(e) => Err(self.unavailable("cannot lock", &files.gate, e)),
        }
    }

    /// Take the request's lock: at once when nobody is queued, else through
    /// the queue, first come, first served across modes.
    fn take(&self, w: &mut Waiter, req: &Request, files: &Files) -> Result<Try, Error> {
        if w.queued.is_none() {
            let open = self.nobody_queued(files)?;
            if !open && w.wait == Wait::No && !live_places(files, None).is_empty() {
                return Ok(Try::Busy(recorded_holder(files)));
            }
            // With only lapsed places in the queue, `-n` may try too.
            if open || w.wait == Wait::No {
                match self.lock(w, req, files, false)? {
                    Try::Busy(h) if w.wait == Wait::No => return Ok(Try::Busy(h)),
                    Try::Busy(_) => {}
                    other => return Ok(other),
                }
            }
            // A request that disagrees with the holders is refused, not queued.
            self.refuse_disagreement(req, files)?;
            if !self.join_queue(w, files, req.timing.ttl)? {
                return Ok(Try::Retry);
            }
        }
        loop {
            if !self.wait_turn(w, files)? {
                return Ok(Try::Busy(recorded_holder(files)));
            }
            // Nobody ahead of us: wait for the lock itself.
            self.refuse_disagreement(req, files)?;
            match self.lock(w, req, files, true)? {
                // Our place lapsed while we waited: queued again at the back.
                Try::Busy(_) if std::mem::take(&mut w.lapsed) => continue,
                other => return Ok(other),
            }
        }
    }

    /// The request's lock: at once, or (`block`) waiting as the request allows.
    fn lock(
        &self,
        w: &mut Waiter,
        req: &Request,
        files: &Files,
        block: bool,
    ) -> Result<Try, Error> {
        match req.mode {
            Mode::Exclusive => self.lock_path(w, &files.main, FlockOperation::LockExclusive, block),
            Mode::Shared => self.lock_path(w, &files.main, FlockOperation::LockShared, block),
            Mode::Limit(n) => self.lock_slot(w, files, n, block),
        }
    }

    fn refuse_disagreement(&self, req: &Request, files: &Files) -> Result<(), Error> {
        match Self::mode_in_force(files) {
            Some(in_force) if !req.mode.agrees_with(in_force) => {
                Err(req.mode.disagreement(req.name, in_force))
            }
            _ => Ok(()),
        }
    }

    /// Join the back of the queue: a share of the gate, then the first free
    /// place file, with a record saying when we came. False: the gate
    /// vanished meanwhile; start over.
    fn join_queue(&self, w: &mut Waiter, files: &Files, ttl: Duration) -> Result<bool, Error> {
        let Some((gate, _)) = open_lock_file(&files.gate)
            .map_err(|e| self.unavailable("cannot open lock file", &files.gate, e))?
        else {
            return Ok(false);
        };
        let shared = share_gate(&gate, 20);
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        for k in 0..MAX_PLACES {
            let path = files.place(k);
            let Some((fd, created)) = open_lock_file(&path)
                .map_err(|e| self.unavailable("cannot open lock file", &path, e))?
            else {
                continue;
            };
            match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(Errno::WOULDBLOCK) => continue,
                Err(e) => return Err(self.unavailable("cannot lock", &path, e)),
            }
            // Another request may have put a fresh file at the path meanwhile.
            match (fstat(&fd), stat(&path)) {
                (Ok(ours), Ok(now)) if identity(&ours) == identity(&now) => {}
                _ => continue,
            }
            // A place left is taken again in a file of its own: a waiter
            // still blocked on the old one waits for the request it saw,
            // never for us, who came after it.
            let fd = if created {
                fd
            } else {
                fresh_place(&path).map_err(|e| self.unavailable("cannot replace", &path, e))?
            };
            let now = mono_ns();
            let place = Place {
                fd,
                index: k,
                arrived: now,
                until: now.saturating_add(nanos(ttl / 3)),
                keep: nanos(ttl / 3),
                every: nanos(ttl / 5),
                refresh_at: now.saturating_add(nanos(ttl / 5)),
            };
            write_place(&place.fd, place.arrived, place.until)
                .map_err(|e| self.unavailable("writing", &path, e))?;
            w.queued = Some(Queued {
                place,
                gate,
                shared,
            });
            return Ok(true);
        }
        Err(w.unavailable(
            &format!("more than {MAX_PLACES} requests are queued for"),
            "give up some",
        ))
    }

    /// Wait until no place ahead of ours is kept: each predecessor in turn
    /// until it lets its place go (granted, gave up or died: its flock
    /// goes) or stops refreshing it. False: the wait ran out.
    fn wait_turn(&self, w: &mut Waiter, files: &Files) -> Result<bool, Error> {
        let holder = recorded_holder(files);
        loop {
            let Some(q) = &w.queued else { return Ok(true) };
            let (mine, rank) = (q.place.index, q.place.rank());
            let Some(ahead) = live_places(files, Some(mine))
                .into_iter()
                .filter(|p| p.rank() < rank)
                .max_by_key(Seen::rank)
            else {
                return Ok(true);
            };
            // A helper blocks for a share of its place file: that comes when
            // its holder lets it go, and goes with the helper at once.
            let watch = ahead
                .file
                .try_clone()
                .map_err(|e| w.unavailable("dup", e))?;
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .spawn(move || {
                    let _ = tx.send(flock_blocking(&watch, FlockOperation::LockShared));
                })
                .map_err(|e| w.unavailable("cannot start a thread to wait for", e))?;
            let mut until = ahead.until;
            loop {
                match w.hear(&rx, holder.as_deref(), Some(until)) {
                    Heard::Got(Ok(())) => break,
                    Heard::Got(Err(e)) => return Err(w.unavailable("waiting in the queue of", e)),
                    // Taken again at the back: look again who is ahead.
                    Heard::Over if std::mem::take(&mut w.lapsed) => break,
                    Heard::Over => return Ok(false),
                    // Its refresh was due: it either kept its place or lost it.
                    Heard::Woke => match read_place(&ahead.file) {
                        Some((arrived, next, _))
                            if arrived == ahead.arrived && next > mono_ns() =>
                        {
                            until = next;
                        }
                        _ => break,
                    },
                }
            }
        }
    }

    /// Hold the grant lock, as the wait allows. None: gave up, or our place
    /// lapsed meanwhile (`lapsed` is set).
    fn lock_grant(&self, w: &mut Waiter, files: &Files) -> Result<Option<OwnedFd>, Error> {
        for _ in 0..100 {
            let Some((fd, _)) = open_lock_file(&files.grant)
                .map_err(|e| self.unavailable("cannot open lock file", &files.grant, e))?
            else {
                continue;
            };
            let mut locked = false;
            // Held only while another grant writes its record: `-n` waits for
            // that briefly too.
            for _ in 0..20 {
                match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => {
                        locked = true;
                        break;
                    }
                    Err(Errno::WOULDBLOCK) if w.wait == Wait::No => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(Errno::WOULDBLOCK) => break,
                    Err(e) => return Err(self.unavailable("cannot lock", &files.grant, e)),
                }
            }
            if !locked && !w.block(&fd, FlockOperation::LockExclusive, None)? {
                return Ok(None);
            }
            // A replaced file would let two grants write at once.
            let ours = fstat(&fd).map_err(|e| self.unavailable("fstat", &files.grant, e))?;
            if matches!(stat(&files.grant), Ok(now) if identity(&now) == identity(&ours)) {
                return Ok(Some(fd));
            }
        }
        Err(Error::Refused(format!(
            "lock file {} keeps changing under us",
            files.grant.display()
        )))
    }

    /// Make a lock taken a grant: check it against the holders, write its
    /// token and record, leave the queue. None: our place lapsed before
    /// (we were stopped), so we queue again at the back.
    fn grant(
        &self,
        w: &mut Waiter,
        req: &Request,
        files: &Files,
        got: Got,
    ) -> Result<Option<Acquired>, Error> {
        if std::mem::take(&mut w.lapsed) || w.queued.as_mut().is_some_and(|q| !q.tend()) {
            return Ok(None);
        }
        // Shared and `--limit` holders hold the name's lock together, so
        // their grants take turns at the grant lock to read and write the
        // record; an exclusive lock keeps every other grant out by itself.
        let turn = match req.mode {
            Mode::Exclusive => None,
            _ => match self.lock_grant(w, files)? {
                Some(fd) => Some(fd),
                None if std::mem::take(&mut w.lapsed) => return Ok(None),
                None => {
                    return Ok(Some(Acquired::Busy {
                        holder: recorded_holder(files),
                    }));
                }
            },
        };
        if req.mode != Mode::Exclusive {
            self.refuse_disagreement(req, files)?;
        }
        let Got { fd, id, main, slot } = got;
        let sent_at = Boot::now();
        let store = main.as_ref().unwrap_or(&fd);
        let token = next_token(store);
        let label = &req.owner.shown;
        // --min-hold: the window is in the record from the grant on, so it
        // holds however lockrun ends. Shared and `--limit` grants share the
        // main record: it keeps the latest window of them all (which keeps
        // out other kinds of request), and a slot keeps its own.
        let window = req
            .min_hold
            .map(|hold| Window::new(sent_at, now_since_epoch(), hold));
        let main_window = match req.mode {
            Mode::Exclusive => window.clone(),
            _ => Window::later(read_record(store).and_then(|r| r.window), window.clone()),
        };
        let written =
            write_record(store, token, label, req.mode, main_window.as_ref()).and_then(|()| {
                if slot.is_some() {
                    write_record(&fd, token, label, req.mode, window.as_ref())?;
                }
                if req.mode == Mode::Shared {
                    self.add_reader(files, id, token, label)?;
                }
                Ok(())
            });
        written.map_err(|e| self.unavailable("writing the token to", &files.main, e))?;
        drop(turn);
        // Out of the queue: the next waiter's turn.
        w.queued = None;
        log::info(format!(
            "acquired {} with token {token} after {:.1?}",
            req.name,
            Boot::now().since(w.patience.started())
        ));
        let path = slot.map_or_else(|| files.main.clone(), |k| files.slot(k));
        let held = LocalHeld {
            fd,
            main,
            path,
            id,
            name: req.name.to_string(),
        };
        Ok(Some(Acquired::Granted(Lease::new(
            token,
            slot,
            sent_at,
            // A flock has no end of its own; the job is told the ttl asked.
            req.timing.ttl,
            Box::new(held),
        ))))
    }

    /// List a shared holder in the readers file (replaced whole, under the
    /// grant lock), dropping those no longer holding the main file.
    fn add_reader(
        &self,
        files: &Files,
        id: (u64, u64),
        token: u64,
        label: &str,
    ) -> std::io::Result<()> {
        let lockers = lockers(id.0, id.1);
        let me = std::process::id();
        let mut text = String::new();
        for r in read_readers(&files.readers) {
            if r.pid != me && lockers.iter().any(|(pid, _)| *pid == r.pid) {
                text.push_str(&format!(
                    "{} {} {} {}\n",
                    r.pid, r.token, r.granted_ms, r.label
                ));
            }
        }
        let label: String = label.chars().filter(|c| !c.is_control()).collect();
        text.push_str(&format!(
            "{me} {token} {} {label}\n",
            now_since_epoch().as_millis()
        ));
        let tmp = suffixed(&files.readers, ".new");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &files.readers)
    }
}

/// A local lease: the locked descriptor (inherited by the job), and with
/// `--limit` the main file's shared lock beside the slot's.
struct LocalHeld {
    fd: OwnedFd,
    main: Option<OwnedFd>,
    path: PathBuf,
    id: (u64, u64),
    name: String,
}

impl Held for LocalHeld {
    fn renewer(&self) -> Renewing {
        let renewer = LocalRenewer {
            path: self.path.clone(),
            id: self.id,
        };
        Renewing::Anywhere(Box::new(move || Box::new(renewer.clone())))
    }

    fn inherit_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn release(self: Box<Self>) -> Result<bool, Error> {
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

    fn give_back(self: Box<Self>) -> Result<bool, Error> {
        // The window went into the record with the grant: out again, while
        // the lock is still ours (a shared record's window may be another
        // holder's too: it stays).
        if let Some(r) = read_record(&self.fd).filter(|r| r.window.is_some())
            && r.mode != Mode::Shared
        {
            let _ = end_window(&self.fd, &r);
        }
        self.release()
    }
}

#[derive(Clone)]
struct LocalRenewer {
    path: PathBuf,
    id: (u64, u64),
}

impl Renewer for LocalRenewer {
    fn renew(&mut self) -> Result<Renewal, Error> {
        // The flock cannot expire; the lease is lost only if the path stops
        // naming our file, since a new file there would admit a second holder.
        Ok(match stat(&self.path) {
            Ok(st) if identity(&st) == self.id => Renewal::Renewed { ttl: Duration::MAX },
            _ => Renewal::Lost,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_inside_the_directory() {
        for name in ["../../x", "a/b", ".", "..", ".hidden", "/etc/passwd"] {
            let f = file_name(name);
            assert!(!f.contains('/'), "{f}");
            assert!(!f.starts_with('.'), "{f}");
        }
        assert_eq!(file_name("nightly-report"), "nightly-report.lock");
        assert_ne!(file_name("a/b"), file_name("a%2Fb"));
    }

    #[test]
    fn long_names_are_bounded_and_distinct() {
        let a = file_name(&"x".repeat(1000));
        let b = file_name(&format!("{}y", "x".repeat(999)));
        assert!(a.len() < 255 && b.len() < 255);
        assert_ne!(a, b);
    }

    fn scratch_file(dir: &tempfile::TempDir, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.path().join(name))
            .unwrap()
    }

    #[test]
    fn tokens_grow_and_survive_a_torn_record() {
        let dir = tempfile::tempdir().unwrap();
        let f = scratch_file(&dir, "t");
        let a = write_token(&f, "h:1").unwrap();
        let b = write_token(&f, "h:2").unwrap();
        assert!(b > a);
        assert_eq!(read_record(&f).unwrap().label, "h:2");
        rustix::io::pwrite(&f, b"XXXXXX", 0).unwrap();
        let c = write_token(&f, "h:3").unwrap();
        assert!(c > b, "a torn record sent the token down: {c} after {b}");
    }

    #[test]
    fn a_place_is_refreshed_when_due_and_lapses_once_its_time_passed() {
        let dir = tempfile::tempdir().unwrap();
        let f = scratch_file(&dir, "p");
        let now = mono_ns();
        let sec = 1_000_000_000;
        let mut place = Place {
            fd: f.into(),
            index: 0,
            arrived: now - 5 * sec,
            until: now + 2 * sec,
            keep: 3 * sec,
            every: 2 * sec,
            refresh_at: now - 1,
        };
        assert!(place.tend(), "kept: its time has not passed");
        let (arrived, until, pid) = read_place(&place.fd).unwrap();
        assert_eq!(arrived, now - 5 * sec, "a refresh keeps the rank");
        assert!(until >= now + 3 * sec && pid == std::process::id());
        place.until = mono_ns() - 1;
        assert!(!place.tend(), "lapsed: its time passed unrefreshed");
        let (arrived, until, _) = read_place(&place.fd).unwrap();
        assert!(arrived > now, "taken again at the back of the queue");
        assert!(until > mono_ns() && place.tend());
    }

    #[test]
    fn the_file_name_is_an_os_str() {
        assert_eq!(file_name("a b"), "a%20b.lock");
    }
}
