//! One lock file taken: at once or waiting, checked to still be the file
//! its path names, a `--min-hold` window respected; and the wait for any
//! of a `--limit` name's slot files.

use super::*;

/// How long a `--min-hold` window recorded by a grant of `mode` keeps out
/// a lock of `op` for a request of `asked`. A slot file and an exclusive
/// lock wait for every window; the main file's shared lock only for a
/// window of another kind of grant: shared grants hold their place together,
/// `--limit` grants each in its slot file.
pub(super) fn keeps_out(
    win: &Window,
    mode: Mode,
    op: FlockOperation,
    asked: Mode,
) -> Option<Duration> {
    let together = matches!(
        (mode, asked),
        (Mode::Shared, Mode::Shared) | (Mode::Limit(_), Mode::Limit(_))
    );
    if op == FlockOperation::LockShared && together {
        return None;
    }
    win.left()
}

impl Local {
    /// Take one lock file: at once, or (`block`) waiting as the request allows.
    /// Checks that the path still names the file locked, and waits for the
    /// holder of a deleted or replaced file that still runs.
    pub(super) fn lock_path(
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
                    if !block || !w.sleep_for(left) {
                        return Ok(Try::Busy(holder));
                    }
                }
            }
        }
    }

    /// One try of `lock_path`: a lock whose record holds a `--min-hold`
    /// window that keeps out a lock of `op` is let go again at once.
    pub(super) fn lock_path_once(
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
        let locked_at = match flock(&fd, nonblocking(op)) {
            Ok(()) => Boot::now(),
            Err(Errno::WOULDBLOCK) => {
                let holder = read_record(&fd).map(|r| r.label).filter(|l| !l.is_empty());
                if w.req.is_own_outer_holder(holder.as_deref()) {
                    return Err(crate::backend::nested(w.name));
                }
                let came = if block { w.block(&fd, op)? } else { None };
                match came {
                    Some(at) => at,
                    None => return Ok(Locked::Not(Try::Busy(holder))),
                }
            }
            Err(e) => return Err(self.unavailable("cannot lock", path, e)),
        };
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
                if !block || w.block(&orphan, FlockOperation::LockExclusive)?.is_none() {
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
            locked_at,
        }))
    }

    /// True when this process runs inside a job that holds a lock of
    /// `files` on the descriptor it inherited.
    pub(super) fn inside_holder(files: &Files, inherited: Option<RawFd>) -> bool {
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
    pub(super) fn mode_in_force(files: &Files) -> Option<Mode> {
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
    pub(super) fn wait_any_slot(
        &self,
        w: &mut Waiter,
        files: &Files,
        n: u32,
        skip: &[u32],
        wake: Option<Duration>,
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
                    if let Ok(at) = flock_blocking(&fd, FlockOperation::LockExclusive)
                        && !won.swap(true, Ordering::SeqCst)
                    {
                        let _ = tx.send((k, fd, at));
                    }
                    // Otherwise the descriptor closes here, letting the slot go.
                })
                .map_err(|e| w.unavailable("cannot start a thread to wait for", e))?;
        }
        drop(tx);
        let heard = w.hear(&rx, wake);
        // Giving up: a slot locked after this is let go by its thread.
        won.store(true, Ordering::SeqCst);
        Ok(match heard {
            Heard::Got((k, fd, at)) => Slot::Got(k, fd, at),
            other => match rx.try_recv() {
                Ok((k, fd, at)) => Slot::Got(k, fd, at),
                Err(_) if matches!(other, Heard::Woke) => Slot::Woke,
                Err(_) => Slot::Over,
            },
        })
    }

    /// Take one of `n` slots (main file shared, slot file exclusive): at
    /// once, or (`block`) waiting as the request allows.
    pub(super) fn lock_slot(
        &self,
        w: &mut Waiter,
        files: &Files,
        n: u32,
        block: bool,
    ) -> Result<Try, Error> {
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
                    Locked::Got(got) => return Ok(slotted(main, k, got)),
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
            match self.wait_any_slot(w, files, n, &kept, wake)? {
                Slot::Over => return Ok(Try::Busy(holder)),
                // A window ran out (or is looked at again): try every slot.
                Slot::Woke => {}
                Slot::Got(k, fd, locked_at) => {
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
                        let got = Got {
                            fd,
                            id: identity(&ours),
                            main: None,
                            slot: None,
                            locked_at,
                        };
                        return Ok(slotted(main, k, got));
                    }
                }
            }
        }
    }
}

/// What a wait for any of the slots ended with.
pub(super) enum Slot {
    /// A slot, its lock, and when it came.
    Got(u32, OwnedFd, Boot),
    /// The time asked for came.
    Woke,
    /// Gave up, or our place lapsed.
    Over,
}

/// A slot's lock, with the main file's shared lock beside it.
pub(super) fn slotted(main: OwnedFd, k: u32, slot: Got) -> Try {
    Try::Locked(Got {
        main: Some(main),
        slot: Some(k),
        ..slot
    })
}
