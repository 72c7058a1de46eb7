//! `release --force` on the local engine: a flock ends only with its
//! holder, but a `--min-hold` window runs no job and can be ended.

use super::*;
use crate::backend::plan::{self, Cut, ForcePlan, Standing};

impl Local {
    /// `release --force`: a flock ends only with its holder, but a
    /// `--min-hold` window runs no job and can be ended: its record is
    /// rewritten without it, under the file's lock.
    pub(super) fn end_windows(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let files = self.files(name);
        let st = self.status(name)?;
        let standing: Vec<Standing> = st.holders.iter().map(Standing::of).collect();
        let cuts = match plan::force(&standing, force) {
            ForcePlan::Done(Broken::NotHeld) => Vec::new(),
            ForcePlan::Done(done) => return Ok(done),
            ForcePlan::Cut(cuts) => cuts,
        };
        if cuts.is_empty() || cuts.iter().any(|(_, cut)| *cut != Cut::EndWindow) {
            let what = if cuts.is_empty() {
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
        let matched: Vec<&Holder> = cuts.iter().map(|(i, _)| &st.holders[*i]).collect();
        let ended = self.end_held_windows(&files, &matched)?;
        if ended.is_empty() {
            // It ended, or was taken, while we looked.
            return Ok(Broken::NotHeld);
        }
        Ok(Broken::Leases(ended))
    }

    /// End the `--min-hold` windows of `matched` (holders that `status`
    /// showed kept by a window): each record is rewritten without it, under
    /// its file's lock. Returns those ended.
    pub(super) fn end_held_windows(
        &self,
        files: &Files,
        matched: &[&Holder],
    ) -> Result<Vec<Holder>, Error> {
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
                ended.push((*h).clone());
            }
        }
        // `--limit` grants also left their latest window in the main record
        // (it keeps other kinds of request out): once no slot keeps one, it
        // goes too, under the grant lock every such grant writes it under.
        let limited = ended.iter().any(|h| h.slot.is_some());
        if limited
            && !self
                .status_of(files, &mut Lockers::Now)?
                .holders
                .iter()
                .any(|h| h.min_hold)
        {
            self.end_main_window(files)?;
        }
        Ok(ended)
    }

    pub(super) fn end_main_window(&self, files: &Files) -> Result<(), Error> {
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
