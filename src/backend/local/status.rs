//! A name's status: its holders (from the flocks and the record beside
//! them, read without taking any lock) and its waiters.

use super::*;

impl Local {
    pub(super) fn status_of(&self, files: &Files) -> Result<Status, Error> {
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
        // A --preempt request's mark, shown on the holders it is meant for.
        let preempted = |mark: Option<&Preempt>, token: u64, granted_ms: u64| {
            mark.filter(|m| m.shown_on(token, granted_ms))
                .map(|m| m.by.clone())
        };
        let main_mark = read_preempt(&file);
        let holder = |r: &Record, mode, slot, mark: Option<&Preempt>| Holder {
            label: Some(r.label.clone()).filter(|l| !l.is_empty()),
            token: Some(r.token),
            mode,
            slot,
            ttl_left: None,
            held_for: held_for(r.granted_ms),
            revoked: false,
            min_hold: false,
            preempted_by: preempted(mark, r.token, r.granted_ms),
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
                        let mark = read_preempt(&slot);
                        holders.push(holder(&r, Mode::Limit(n), Some(k), mark.as_ref()));
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
                            preempted_by: preempted(main_mark.as_ref(), r.token, r.granted_ms),
                        });
                    }
                }
            }
            _ => {
                if let Some(r) = &rec {
                    holders.push(holder(r, Mode::Exclusive, None, main_mark.as_ref()));
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
        // --min-hold: windows that hold a place with no flock and no job.
        let window = |r: &Record, mode, slot| {
            r.window.as_ref().and_then(Window::left).map(|left| Holder {
                ttl_left: Some(left),
                min_hold: true,
                preempted_by: None,
                ..holder(r, mode, slot, None)
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
        // Waiters: the places kept in the queue, but those replaced by a
        // later --supersede request (leaving now).
        let places: Vec<Seen> = live_places(files, None)
            .into_iter()
            .filter(|p| !p.replaced)
            .collect();
        let superseding = places.iter().filter(|p| p.supersede).count() as u64;
        Ok(Status {
            holders,
            waiters: Some(places.len() as u64),
            superseding: Some(superseding),
        })
    }
}
