//! Taking a name: the queue of places, the wait for our turn, and the
//! grant that hands a name on in arrival order.

use super::*;
/// What joining the queue came to.
pub(super) enum Joined {
    /// Queued; `--preempt` then stops these holders.
    Queued(Stops),
    /// The gate vanished meanwhile: start over.
    Again,
    /// `--max-waiters`: this many wait ahead; not queued.
    Full(u64),
}

/// The holders of the moment a request joined, and what `--preempt`
/// does to each (by index).
pub(super) struct Stops {
    pub(super) holders: Vec<Holder>,
    pub(super) stops: Vec<(usize, Stop)>,
}

/// The holder label in the name's record, for waiting lines.
pub(super) fn recorded_holder(files: &Files) -> Option<String> {
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
pub(super) fn live_places(files: &Files, except: Option<u32>) -> Vec<Seen> {
    let now = mono_ns();
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
        // Kept by a waiter: its exclusive flock refuses us a share. Asked of
        // the kernel file by file, at the moment of the look: /proc/locks,
        // read in pieces while locks come and go, can skip a held place.
        match flock(&file, FlockOperation::NonBlockingLockShared) {
            Err(Errno::WOULDBLOCK) => {}
            Ok(()) => {
                let _ = flock(&file, FlockOperation::Unlock);
                continue;
            }
            Err(_) => continue,
        }
        if let Some((arrived, until, pid)) = read_place(&file)
            && until > now
        {
            let supersede = reads_supersede(&file);
            let replaced = supersede && replaced_by(&file).is_some();
            out.push(Seen {
                file,
                index: k,
                arrived,
                until,
                pid,
                supersede,
                replaced,
            });
        }
    }
    out
}

impl Local {
    /// True when nobody is queued for the name: nobody holds a share of the
    /// gate. The look takes the gate for an instant and lets it go.
    pub(super) fn nobody_queued(&self, files: &Files) -> Result<bool, Error> {
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
    /// Unless `block`, a request that joins the queue stops there (busy:
    /// the wait is the driver's next step).
    pub(super) fn take(
        &self,
        w: &mut Waiter,
        req: &Request,
        files: &Files,
        block: bool,
    ) -> Result<Try, Error> {
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
            match self.join_queue(w, files, req)? {
                Joined::Queued(stops) => {
                    // Queued, so the queue had room (`--max-waiters` is
                    // judged first, as `plan::join` says): now ask the
                    // holders to stop.
                    self.preempt(files, req, &stops)?;
                    if !block {
                        return Ok(Try::Busy(recorded_holder(files)));
                    }
                }
                Joined::Again if w.last => {
                    return Ok(Try::Busy(recorded_holder(files)));
                }
                Joined::Again => return Ok(Try::Retry),
                Joined::Full(waiting) => return Ok(Try::Full(waiting)),
            }
        } else if !block {
            return Ok(Try::Busy(recorded_holder(files)));
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
    pub(super) fn lock(
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

    pub(super) fn refuse_disagreement(&self, req: &Request, files: &Files) -> Result<(), Error> {
        match Self::mode_in_force(files) {
            Some(in_force) if !req.mode.agrees_with(in_force) => {
                Err(req.mode.disagreement(req.name, in_force))
            }
            _ => Ok(()),
        }
    }

    /// Join the back of the queue: a share of the gate, then the first free
    /// place file, with a record saying when we came; then, still under the
    /// join lock, carry out the join plan (`plan::join`): count who waits
    /// ahead of us (`--max-waiters`), replace the earlier `--supersede`
    /// waiters (if we asked for it too), and say which holders `--preempt`
    /// stops (done once queued, by `preempt`).
    pub(super) fn join_queue(
        &self,
        w: &mut Waiter,
        files: &Files,
        req: &Request,
    ) -> Result<Joined, Error> {
        // One request at a time joins and counts: arrival order is then the
        // order of joining, and no two requests miss each other's place.
        let joining = self.join_lock(files, req.timing.ttl)?;
        // Without it a count could miss a request joining beside us, so a
        // request that counts (or replaces) tries again rather than join
        // without it; a burst of joiners on a loaded machine can keep it
        // away for seconds, and its wait's patience still bounds the try.
        if joining.is_none() && (req.group.supersede || req.group.max_waiters.is_some()) {
            return Ok(Joined::Again);
        }
        let Some((gate, _)) = open_lock_file(&files.gate)
            .map_err(|e| self.unavailable("cannot open lock file", &files.gate, e))?
        else {
            return Ok(Joined::Again);
        };
        let shared = share_gate(&gate, 20);
        let Some(place) = self.take_place(files, req.timing.ttl, req.group.supersede)? else {
            return Err(w.unavailable(
                &format!("more than {MAX_PLACES} requests are queued for"),
                "give up some",
            ));
        };
        let rank = place.rank();
        let ahead: Vec<Seen> = if req.group.supersede || req.group.max_waiters.is_some() {
            live_places(files, Some(place.index))
                .into_iter()
                .filter(|p| p.rank() < rank && !p.replaced)
                .collect()
        } else {
            Vec::new()
        };
        let holders = if req.group.preempt {
            self.status_of(files, &mut Lockers::Now)?.holders
        } else {
            Vec::new()
        };
        let standing: Vec<Standing> = holders.iter().map(Standing::of).collect();
        let waiting: Vec<Standing> = ahead
            .iter()
            .map(|p| Standing {
                supersede: p.supersede,
                ..Standing::default()
            })
            .collect();
        let plan = plan::join(req.group, &standing, &waiting);
        if let Some(waiting) = plan.full {
            // Not queued: our place goes with its descriptor here, and
            // nobody was replaced.
            return Ok(Joined::Full(waiting));
        }
        for &i in &plan.replace {
            self.replace(files, &ahead[i], &req.owner.shown);
        }
        w.queued = Some(Queued {
            place,
            gate,
            shared,
        });
        Ok(Joined::Queued(Stops {
            holders,
            stops: plan.preempt,
        }))
    }

    /// The first free place file, taken: locked, written with when we
    /// came. None: every place is taken.
    fn take_place(
        &self,
        files: &Files,
        ttl: Duration,
        supersede: bool,
    ) -> Result<Option<Place>, Error> {
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
            // never for us, who came after it. (A mark left in the old one
            // stays there.)
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
                supersede,
                until: now.saturating_add(nanos(ttl / 3)),
                keep: nanos(ttl / 3),
                every: nanos(ttl / 5),
                refresh_at: now.saturating_add(nanos(ttl / 5)),
            };
            write_place(&place.fd, place.arrived, place.until, place.supersede)
                .map_err(|e| self.unavailable("writing", &path, e))?;
            return Ok(Some(place));
        }
        Ok(None)
    }

    /// The join lock, held while a request joins the queue and counts who
    /// is ahead. Held for an instant only; a holder that stopped there
    /// (SIGSTOP) holds the others up for a few seconds at most, then they
    /// join without it (but those that count or replace try again).
    fn join_lock(&self, files: &Files, ttl: Duration) -> Result<Option<OwnedFd>, Error> {
        let path = files.join();
        let Some((fd, _)) = open_lock_file(&path)
            .map_err(|e| self.unavailable("cannot open lock file", &path, e))?
        else {
            return Ok(None);
        };
        let bound = (ttl / 3).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(Some(fd)),
                Err(Errno::WOULDBLOCK) if start.elapsed() < bound => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(10));
                }
                Err(Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(self.unavailable("cannot lock", &path, e)),
            }
        }
    }

    /// Mark the waiter at `p` replaced by `by`; it reads the mark within a
    /// fraction of a second and leaves the queue. One that left meanwhile
    /// (its place is another file now, or another request's) is not marked.
    fn replace(&self, files: &Files, p: &Seen, by: &str) {
        let path = files.place(p.index);
        let Ok(fd) = open(
            &path,
            OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            FileMode::empty(),
        ) else {
            return;
        };
        let same = match (fstat(&fd), fstat(&p.file)) {
            (Ok(a), Ok(b)) => identity(&a) == identity(&b),
            _ => false,
        };
        let still = read_place(&p.file).is_some_and(|(arrived, _, pid)| (arrived, pid) == p.rank());
        if same
            && still
            && let Err(e) = mark_replaced(&fd, by)
        {
            log::warn(format!("cannot mark {} replaced: {e}", path.display()));
        }
    }

    /// Wait until no place ahead of ours is kept: each predecessor in turn
    /// until it lets its place go (granted, gave up or died: its flock
    /// goes) or stops refreshing it. False: the wait ran out.
    pub(super) fn wait_turn(&self, w: &mut Waiter, files: &Files) -> Result<bool, Error> {
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
                match w.hear(&rx, Some(until)) {
                    Heard::Got(Ok(_)) => break,
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
    pub(super) fn lock_grant(
        &self,
        w: &mut Waiter,
        files: &Files,
    ) -> Result<Option<OwnedFd>, Error> {
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
            if !locked && w.block(&fd, FlockOperation::LockExclusive)?.is_none() {
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
    pub(super) fn grant(
        &self,
        w: &mut Waiter,
        req: &Request,
        files: &Files,
        got: Got,
    ) -> Result<Option<Acquired>, Error> {
        // Replaced while the lock came: it goes to whoever is next.
        if let Some(by) = w.queued.as_ref().and_then(Queued::replaced_by) {
            return Ok(Some(Acquired::Replaced { by }));
        }
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
        let Got {
            fd,
            id,
            main,
            slot,
            locked_at,
        } = got;
        let sent_at = Boot::now();
        let token = self.write_grant(req, files, &fd, main.as_ref(), id, slot, sent_at)?;
        drop(turn);
        // Out of the queue: the next waiter's turn.
        w.queued = None;
        let path = slot.map_or_else(|| files.main.clone(), |k| files.slot(k));
        let held = LocalHeld {
            fd,
            main,
            path,
            id,
            name: req.name.to_string(),
            token,
            got_at: locked_at,
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

    /// Write a grant's token and record (with its `--min-hold` window)
    /// to the lock files it holds: its token.
    #[allow(clippy::too_many_arguments)]
    fn write_grant(
        &self,
        req: &Request,
        files: &Files,
        fd: &OwnedFd,
        main: Option<&OwnedFd>,
        id: (u64, u64),
        slot: Option<u32>,
        sent_at: Boot,
    ) -> Result<u64, Error> {
        let store = main.unwrap_or(fd);
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
                    write_record(fd, token, label, req.mode, window.as_ref())?;
                }
                if req.mode == Mode::Shared {
                    self.add_reader(files, id, token, label)?;
                }
                Ok(())
            });
        written.map_err(|e| self.unavailable("writing the token to", &files.main, e))?;
        Ok(token)
    }

    /// List a shared holder in the readers file (replaced whole, under the
    /// grant lock), dropping those no longer holding the main file.
    pub(super) fn add_reader(
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
