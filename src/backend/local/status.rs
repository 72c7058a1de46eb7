//! A name's status: its holders (from the flocks and the record beside
//! them, read without taking any lock) and its waiters.

use super::*;

impl Local {
    /// The status of the name of `files`, its flocks as `flocks` says.
    pub(super) fn status_of(&self, files: &Files, flocks: &mut Lockers) -> Result<Status, Error> {
        let Some((file, st)) = self.open_for_status(files)? else {
            return Ok(Status::default());
        };
        let now_ms = now_since_epoch().as_millis() as u64;
        let main_mark = read_preempt(&file);
        let lockers = flocks.of(st.st_dev, st.st_ino);
        let rec = read_record(&file);
        let mut holders = if lockers.is_empty() {
            Vec::new()
        } else {
            running_holders(
                files,
                &lockers,
                rec.as_ref(),
                main_mark.as_ref(),
                now_ms,
                flocks,
            )
        };
        add_min_hold_windows(files, rec.as_ref(), &mut holders, now_ms, flocks);
        let (waiters, superseding) = waiters(files);
        Ok(Status {
            holders,
            waiters: Some(waiters),
            superseding: Some(superseding),
        })
    }

    /// The name's main file and its stat, or None when no one ever took it.
    fn open_for_status(
        &self,
        files: &Files,
    ) -> Result<Option<(std::fs::File, rustix::fs::Stat)>, Error> {
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
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
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
        Ok(Some((file, st)))
    }
}

/// The holders whose job runs, when the main file has lockers: each slot's
/// flock under a limit, each reader still locking in shared mode, else the
/// one exclusive holder (unnamed when its record is missing).
fn running_holders(
    files: &Files,
    lockers: &[(u32, bool)],
    rec: Option<&Record>,
    main_mark: Option<&Preempt>,
    now_ms: u64,
    flocks: &mut Lockers,
) -> Vec<Holder> {
    let mut holders = Vec::new();
    match rec.map(|r| r.mode) {
        Some(Mode::Limit(n)) => {
            for k in 0..n {
                let Ok(slot) = std::fs::File::open(files.slot(k)) else {
                    continue;
                };
                if let (Ok(s), Some(r)) = (fstat(&slot), read_record(&slot))
                    && !flocks.of(s.st_dev, s.st_ino).is_empty()
                {
                    let mark = read_preempt(&slot);
                    holders.push(holder(&r, Mode::Limit(n), Some(k), mark.as_ref(), now_ms));
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
                        held_for: held_for(r.granted_ms, now_ms),
                        revoked: false,
                        min_hold: false,
                        preempted_by: preempted(main_mark, r.token, r.granted_ms),
                    });
                }
            }
        }
        _ => {
            if let Some(r) = rec {
                holders.push(holder(r, Mode::Exclusive, None, main_mark, now_ms));
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
                    preempted_by: None,
                });
            }
        }
    }
    holders
}

/// --min-hold: windows that hold a place with no flock and no job.
fn add_min_hold_windows(
    files: &Files,
    rec: Option<&Record>,
    holders: &mut Vec<Holder>,
    now_ms: u64,
    flocks: &mut Lockers,
) {
    let window = |r: &Record, mode, slot| {
        r.window.as_ref().and_then(Window::left).map(|left| Holder {
            ttl_left: Some(left),
            min_hold: true,
            preempted_by: None,
            ..holder(r, mode, slot, None, now_ms)
        })
    };
    match rec.map(|r| r.mode) {
        Some(Mode::Limit(n)) => {
            let running: Vec<Option<u32>> = holders.iter().map(|h| h.slot).collect();
            for k in (0..n).filter(|k| !running.contains(&Some(*k))) {
                let Ok(slot) = std::fs::File::open(files.slot(k)) else {
                    continue;
                };
                if let (Ok(s), Some(r)) = (fstat(&slot), read_record(&slot))
                    && flocks.of(s.st_dev, s.st_ino).is_empty()
                    && let Some(h) = window(&r, Mode::Limit(n), Some(k))
                {
                    holders.push(h);
                }
            }
            holders.sort_by_key(|h| h.slot);
        }
        Some(mode) if holders.is_empty() => {
            if let Some(h) = rec.and_then(|r| window(r, mode, None)) {
                holders.push(h);
            }
        }
        _ => {}
    }
}

/// Waiters: the places kept in the queue, but those replaced by a later
/// --supersede request (leaving now); and how many of them supersede.
fn waiters(files: &Files) -> (u64, u64) {
    let places: Vec<Seen> = live_places(files, None)
        .into_iter()
        .filter(|p| !p.replaced)
        .collect();
    let superseding = places.iter().filter(|p| p.supersede).count() as u64;
    (places.len() as u64, superseding)
}

/// The holder a record shows, with the mark of a --preempt request if meant for it.
fn holder(
    r: &Record,
    mode: Mode,
    slot: Option<u32>,
    mark: Option<&Preempt>,
    now_ms: u64,
) -> Holder {
    Holder {
        label: Some(r.label.clone()).filter(|l| !l.is_empty()),
        token: Some(r.token),
        mode,
        slot,
        ttl_left: None,
        held_for: held_for(r.granted_ms, now_ms),
        revoked: false,
        min_hold: false,
        preempted_by: preempted(mark, r.token, r.granted_ms),
    }
}

fn held_for(granted_ms: u64, now_ms: u64) -> Option<Duration> {
    (granted_ms > 0 && granted_ms <= now_ms).then(|| Duration::from_millis(now_ms - granted_ms))
}

/// A --preempt request's mark, shown on the holders it is meant for.
fn preempted(mark: Option<&Preempt>, token: u64, granted_ms: u64) -> Option<String> {
    mark.filter(|m| m.shown_on(token, granted_ms))
        .map(|m| m.by.clone())
}
