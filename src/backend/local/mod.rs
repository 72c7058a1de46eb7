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
//! `places.rs` the places in the queue and one request's wait; `lockfile.rs`
//! taking one lock file; `take.rs` taking and granting a name; `taking.rs`
//! the request as the driver takes it (`backend::drive`); `status.rs` a
//! name's holders and waiters; `windows.rs` ending `--min-hold` windows;
//! `lease.rs` the lease held. This file holds the engine's row and address,
//! and the engine itself.

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
mod lease;
mod lockfile;
mod places;
mod preempt;
mod proclocks;
mod record;
mod status;
mod take;
mod taking;
mod windows;

use lease::LocalHeld;
use take::{Stops, live_places};

use files::{
    file_name, flock_blocking, identity, name_of_file, nonblocking, open_lock_file, prepare_dir,
    suffixed,
};
use places::{
    Heard, MAX_PLACES, Place, Queued, Seen, Waiter, fresh_place, mark_replaced, mono_ns,
    read_place, reads_supersede, replaced_by, share_gate, write_place,
};
use proclocks::{Lockers, find_orphan_holder, lockers};
#[cfg(test)]
use record::write_token;
use record::{
    Preempt, Record, Window, end_window, next_token, now_since_epoch, read_preempt, read_readers,
    read_record, write_preempt, write_record,
};

use super::plan::{self, Read, Standing, Stop};
use super::{Renewal, Renewer, Renewing};
use crate::clock::Boot;
use crate::log;

/// A lock taken: the descriptor the job inherits and its file's identity;
/// with `--limit`, also the main file's shared lock and the slot number.
struct Got {
    fd: OwnedFd,
    id: (u64, u64),
    main: Option<OwnedFd>,
    slot: Option<u32>,
    /// Just after the lock came: from then on `status` and `--preempt`
    /// see a holder, so a preemption mark made later is meant for it.
    locked_at: Boot,
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

enum Try {
    Locked(Got),
    /// Held by someone else (their label, if the file has one).
    Busy(Option<String>),
    /// The file changed under us; start over.
    Retry,
    /// `--max-waiters`: this many waited already; not queued.
    Full(u64),
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

/// A lock directory (lockrun-engines(7) "LOCAL"); None is the per-user default.
#[derive(Debug, Clone)]
pub struct LocalDir {
    pub dir: Option<PathBuf>,
    /// `--prefix` came from the environment (meant for another engine).
    prefix_from_env: bool,
}

impl Address for LocalDir {
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

    /// Held while a request joins the queue and counts who is ahead.
    fn join(&self) -> PathBuf {
        suffixed(&self.main, ".join")
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

    /// Each name's main file in the directory, with the name it stands for.
    fn main_files(&self) -> Result<Vec<(String, PathBuf)>, Error> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| self.unavailable("cannot list", &self.dir, e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.unavailable("cannot list", &self.dir, e))?;
            // A name's main file ends in `.lock`; its other files never do.
            if let Some(name) = entry.file_name().to_str().and_then(name_of_file) {
                names.push((name, entry.path()));
            }
        }
        Ok(names)
    }

    fn unavailable(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
        Error::Refused(format!("{what} {}: {e}", path.display()))
    }
}

impl Engine for Local {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        self.take_name(req, wait)
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        self.end_windows(name, force)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let files = self.files(name);
        self.status_of(&files, &mut Lockers::Now)
    }

    fn names(&mut self, _bound: ListBound) -> Result<plan::Names, Error> {
        let mut names: Vec<String> = self.main_files()?.into_iter().map(|(n, _)| n).collect();
        names.sort();
        Ok(plan::Names {
            names,
            notes: Vec::new(),
        })
    }

    /// File by file: a name too long to keep whole in its file's name is
    /// read from the file it was found in, not from the name.
    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let names = self.main_files()?;
        let how = "read file by file, not as one snapshot: a lock may change while it is read";
        let mut flocks = match rustix::fs::stat(&self.dir) {
            Ok(st) => Lockers::table(st.st_dev),
            Err(_) => Lockers::Now,
        };
        plan::listing(names, bound, Vec::new(), how, |name, main| {
            let files = Files {
                gate: suffixed(&main, ".gate"),
                grant: suffixed(&main, ".grant"),
                readers: suffixed(&main, ".readers"),
                main,
            };
            // One file that cannot be read (not a regular file, no
            // permission) costs its name a note, not the whole list.
            match self.status_of(&files, &mut flocks) {
                Ok(st) => Ok(Read::Listed(st)),
                Err(e) => Ok(Read::LeftOut(format!("{name}: left out: {e}"))),
            }
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
            supersede: false,
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
    fn a_replacement_mark_outlives_refreshes_and_older_readers_skip_it() {
        let dir = tempfile::tempdir().unwrap();
        let f = scratch_file(&dir, "p");
        let now = mono_ns();
        let sec = 1_000_000_000;
        let mut place = Place {
            fd: f.into(),
            index: 0,
            arrived: now,
            supersede: true,
            until: now + 2 * sec,
            keep: 3 * sec,
            every: 2 * sec,
            refresh_at: now - 1,
        };
        assert!(place.tend());
        assert!(reads_supersede(&place.fd) && replaced_by(&place.fd).is_none());
        mark_replaced(&place.fd, "h:2 (newer)").unwrap();
        place.refresh_at = 0;
        assert!(place.tend());
        assert_eq!(replaced_by(&place.fd).as_deref(), Some("h:2 (newer)"));
        // The record reads as an older lockrun reads it: its first
        // PLACE_RECORD bytes, whose fields it knows or skips.
        let (arrived, _, pid) = read_place(&place.fd).unwrap();
        assert_eq!((arrived, pid), (now, std::process::id()));
        let mut old = [0u8; places::PLACE_RECORD];
        rustix::io::pread(&place.fd, &mut old, 0).unwrap();
        let text = std::str::from_utf8(&old).unwrap();
        assert!(text.ends_with('\n') && !text.contains("replaced"), "{text}");
    }

    #[test]
    fn a_lease_given_back_leaves_no_window_and_a_released_one_does() {
        let dir = tempfile::tempdir().unwrap();
        let mut local = Local::open(Some(dir.path())).unwrap();
        let owner = crate::backend::Owner::new(None).unwrap();
        for (name, given_back) in [("kept", false), ("given", true)] {
            let req = Request {
                name,
                owner: &owner,
                timing: crate::schedule::Timing::new(Duration::from_secs(3), None).unwrap(),
                mode: Mode::Exclusive,
                outer: None,
                inherited_fd: None,
                quiet: true,
                min_hold: Some(Duration::from_secs(60)),
                group: Default::default(),
            };
            let Ok(Acquired::Granted(lease)) = local.acquire(&req, Wait::No) else {
                panic!("{name}: not granted")
            };
            let ours = if given_back {
                lease.give_back()
            } else {
                lease.release()
            };
            assert!(ours.unwrap(), "{name}");
            let windows = local.status(name).unwrap().holders;
            assert_eq!(windows.iter().any(|h| h.min_hold), !given_back, "{name}");
        }
    }

    #[test]
    fn the_file_name_is_an_os_str() {
        assert_eq!(file_name("a b"), "a%20b.lock");
    }
}
