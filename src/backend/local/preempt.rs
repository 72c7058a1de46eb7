//! `--preempt` on the local engine: a flock ends only with its holder, so
//! a preempting request writes a mark into each holder's lock file, after
//! the record, which the holder's renewer reads (every second); a
//! `--min-hold` window, which runs no job, is ended at once.

use super::*;

impl Local {
    /// Carry out the join plan's `stops`: mark the holders it names
    /// preempted by `req`, and end the `--min-hold` windows that keep the
    /// name. Holders of another lockrun that knows no marks are not
    /// stopped: the request waits for them as usual.
    pub(super) fn preempt(&self, files: &Files, req: &Request, plan: &Stops) -> Result<(), Error> {
        let held = |stop: Stop| {
            plan.stops
                .iter()
                .filter(move |&&(_, s)| s == stop)
                .map(|&(i, _)| &plan.holders[i])
        };
        let windows: Vec<&Holder> = held(Stop::End).collect();
        if !windows.is_empty() {
            let ended = self.end_held_windows(files, &windows)?;
            for h in &ended {
                log::info(format!(
                    "ended the --min-hold window of {} on {} (--preempt)",
                    h.label.as_deref().unwrap_or("a holder"),
                    req.name
                ));
            }
        }
        // One mark per file: the main file for exclusive and shared holders
        // (for all of them at once), a slot's file for its holder.
        let mut marks: Vec<(Option<u32>, u64)> = Vec::new();
        for h in held(Stop::Mark) {
            let token = h.token.unwrap_or(0);
            match marks.iter_mut().find(|(slot, _)| *slot == h.slot) {
                Some((_, upto)) => *upto = (*upto).max(token),
                None => marks.push((h.slot, token)),
            }
        }
        for (slot, upto) in marks {
            let path = slot.map_or_else(|| files.main.clone(), |k| files.slot(k));
            let fd = match open(
                &path,
                OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK,
                FileMode::empty(),
            ) {
                Ok(fd) => fd,
                // It went meanwhile, and its holder with it.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(self.unavailable("cannot open lock file", &path, e)),
            };
            // The record may have moved on to a later holder meanwhile: the
            // mark names the highest token of the moment, and its time.
            let upto = read_record(&fd).map_or(upto, |r| r.token.max(upto));
            write_preempt(&fd, &Preempt::now(upto, &req.owner.shown))
                .map_err(|e| self.unavailable("writing", &path, e))?;
            log::info(format!(
                "asked the holder of {} to stop (--preempt)",
                req.name
            ));
        }
        Ok(())
    }
}
