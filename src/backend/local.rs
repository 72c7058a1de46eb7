//! The local backend: `flock(2)` on one file per lock name in a per-user
//! directory. The locked descriptor is inherited by the job, as flock(1) does.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{FlockOperation, Mode, OFlags, flock, fstat, lstat, mkdir, open, stat};
use rustix::io::Errno;

use super::{Acquired, Backend, Broken, Force, Grant, Holder, Inspect, Owner, is_own_outer_holder};
use crate::config::Wait;
use crate::exit::{Failure, Class, fail};
use crate::lease::{Boot, Renewer};
use crate::log;

/// Size of the record at the start of each lock file, written in one `pwrite`.
const RECORD: usize = 256;

pub struct Local {
    path: PathBuf,
    name: String,
    owner: Owner,
    fd: Option<OwnedFd>,
    id: (u64, u64),
}

/// The per-user default directory; it depends only on the uid, so cron and a
/// login shell find the same files.
fn default_dir() -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    let run_lock = Path::new("/run/lock");
    if rustix::fs::access(run_lock, rustix::fs::Access::WRITE_OK).is_ok() {
        run_lock.join(format!("lockrun-{uid}"))
    } else {
        // Not $TMPDIR: it differs between login sessions and cron.
        Path::new("/tmp").join(format!("lockrun-{uid}"))
    }
}

/// Create the directory if needed and check that it is safe to trust.
fn prepare_dir(given: Option<&Path>) -> Result<PathBuf, Failure> {
    let dir = given.map(Path::to_path_buf).unwrap_or_else(default_dir);
    let unusable = |why: String| {
        fail(
            Class::Unavailable,
            format!("lock directory {}: {why}", dir.display()),
        )
    };
    match mkdir(&dir, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(unusable(format!("cannot create it: {e}"))),
    }
    if given.is_none() {
        // A directory in a shared place must be ours alone: otherwise another
        // user could pre-create it and hold or fake our locks.
        let st = lstat(&dir).map_err(|e| unusable(e.to_string()))?;
        let is_dir =
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory;
        // Failing closed is right here; the message says what is wrong and
        // how to get going again.
        let elsewhere = "or choose a directory of your own with --url file:///path";
        if !is_dir {
            return Err(unusable(format!(
                "not a directory (a symbolic link or a file, perhaps planted by another user); \
                 have it removed (it is in a shared place), {elsewhere}"
            )));
        }
        if st.st_uid != rustix::process::getuid().as_raw() {
            return Err(unusable(format!(
                "owned by uid {}, not by you, so that user could hold or fake your locks; \
                 have it removed (as root), {elsewhere}",
                st.st_uid
            )));
        }
        if st.st_mode & 0o077 != 0 {
            return Err(unusable(format!(
                "mode {:o} lets other users in; run chmod 700 {}, {elsewhere}",
                st.st_mode & 0o777,
                dir.display()
            )));
        }
    } else if !dir.is_dir() {
        return Err(unusable("not a directory".into()));
    }
    Ok(dir)
}

/// Encode a lock name into one safe file name: no `/`, no leading dot, bounded length.
pub fn file_name(name: &str) -> String {
    let mut out = String::new();
    for (i, b) in name.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && i > 0);
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.len() > 200 {
        // FNV-1a keeps long names distinct and stable across versions.
        let mut h: u64 = 0xcbf29ce484222325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
        out.truncate(150);
        out = format!("{out}~{h:016x}");
    }
    out + ".lock"
}

fn identity(st: &rustix::fs::Stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

struct Record {
    token: u64,
    granted_ms: u64,
    label: String,
    /// The inode the record was written to: a copy of the file carries the
    /// old one, which tells a replaced file from the one that was locked.
    ino: Option<u64>,
}

fn read_record(fd: impl AsFd) -> Option<Record> {
    let mut buf = [0u8; RECORD];
    let n = rustix::io::pread(fd, &mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let mut token = None;
    let mut granted_ms = None;
    let mut label = None;
    let mut ino = None;
    for field in text.trim_end().split(' ') {
        if let Some(v) = field.strip_prefix("token=") {
            token = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("granted_ms=") {
            granted_ms = v.parse().ok();
        } else if field.starts_with("label=") {
            // The label is the rest of the line (it may hold spaces).
            let at = text.find(" label=").map_or(0, |i| i + 1);
            label = text[at..]
                .trim_end()
                .strip_prefix("label=")
                .map(str::to_string);
            break;
        } else if let Some(v) = field.strip_prefix("ino=") {
            ino = v.parse().ok();
        }
    }
    Some(Record {
        token: token?,
        granted_ms: granted_ms.unwrap_or(0),
        label: label.unwrap_or_default(),
        ino,
    })
}

fn now_since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Next token: max(stored + 1, wall clock in µs), written in place in one write
/// of fixed size, so a torn or lost write never makes tokens go backwards.
fn write_token(fd: impl AsFd + Copy, label: &str) -> std::io::Result<u64> {
    let now = now_since_epoch();
    let stored = read_record(fd).map(|r| r.token).unwrap_or(0);
    // Saturating: a record the job wrote at u64::MAX must not wrap to a lower token.
    let token = stored
        .saturating_add(1)
        .max(u64::try_from(now.as_micros()).unwrap_or(u64::MAX));
    let label: String = label
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(150)
        .collect();
    let ino = fstat(fd).map(|st| st.st_ino).unwrap_or(0);
    // The label goes last: it is cut to fit.
    let mut text = format!(
        "token={token} granted_ms={} ino={ino} label={label}",
        now.as_millis()
    );
    // Cut at a character boundary: the label may be any text.
    let mut cut = text.len().min(RECORD - 1);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    let mut buf = [b' '; RECORD];
    buf[..text.len()].copy_from_slice(text.as_bytes());
    buf[RECORD - 1] = b'\n';
    let n = rustix::io::pwrite(fd, &buf, 0)?;
    if n != RECORD {
        return Err(std::io::Error::other("short write of the token record"));
    }
    Ok(token)
}

/// Inodes on `dev` that /proc/locks shows under an exclusive flock, except `ours`.
fn other_flocked_inodes(dev: u64, ours: u64) -> Vec<u64> {
    let Ok(text) = std::fs::read_to_string("/proc/locks") else {
        return Vec::new();
    };
    let (maj, min) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let mut out = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF" (a "->" marks a waiter).
        if f.len() < 6 || f.contains(&"->") || f[1] != "FLOCK" || f[3] != "WRITE" {
            continue;
        }
        let parts: Vec<&str> = f[5].split(':').collect();
        if parts.len() != 3 {
            continue;
        }
        let ok = u32::from_str_radix(parts[0], 16) == Ok(maj)
            && u32::from_str_radix(parts[1], 16) == Ok(min);
        if let (true, Ok(ino)) = (ok, parts[2].parse::<u64>())
            && ino != ours
        {
            out.push(ino);
        }
    }
    out
}

/// Whether `ino` on `dev` is under an exclusive flock right now.
fn is_flocked(dev: u64, ino: u64) -> bool {
    other_flocked_inodes(dev, u64::MAX).contains(&ino)
}

/// A descriptor (reopened through /proc) of a deleted lock file for `path` that
/// some process still holds locked: its holder must finish before we may run.
fn find_orphan_holder(path: &Path, dev: u64, ours: u64) -> Option<OwnedFd> {
    let candidates = other_flocked_inodes(dev, ours);
    if candidates.is_empty() {
        return None;
    }
    let mut deleted = path.as_os_str().as_bytes().to_vec();
    deleted.extend_from_slice(b" (deleted)");
    for proc_entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if target.as_os_str().as_bytes() != deleted.as_slice() {
                continue;
            }
            if let Ok(opened) = open(fd.path(), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
                && let Ok(st) = fstat(&opened)
                && st.st_dev == dev
                && candidates.contains(&st.st_ino)
            {
                return Some(opened);
            }
        }
    }
    None
}

/// Block in flock(2) until it is ours, retrying interrupted calls.
fn flock_blocking(fd: impl AsFd + Copy) -> std::io::Result<()> {
    loop {
        match flock(fd, FlockOperation::LockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

enum Try {
    Locked,
    /// Held by someone else (their label, if the file has one).
    Busy(Option<String>),
    /// The file changed under us; start over.
    Retry,
}

impl Local {
    pub fn open(dir: Option<&Path>, name: &str, owner: Owner) -> Result<Local, Failure> {
        let dir = prepare_dir(dir)?;
        Ok(Local {
            path: dir.join(file_name(name)),
            name: name.to_string(),
            owner,
            fd: None,
            id: (0, 0),
        })
    }

    pub fn open_for_inspect(dir: Option<&Path>, name: &str) -> Result<Local, Failure> {
        Local::open(
            dir,
            name,
            Owner {
                secret: String::new(),
                label: String::new(),
                shown: String::new(),
            },
        )
    }

    fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> Failure {
        fail(
            Class::Unavailable,
            format!("{what} {}: {e}", self.path.display()),
        )
    }

    /// True when this process runs inside the job that holds this very file.
    fn inside_holder(&self, fd: &OwnedFd) -> bool {
        // Anything but a plain descriptor number is not ours to look at.
        let Some(n) = std::env::var("LOCKRUN_LOCK_FD")
            .ok()
            .and_then(|v| v.parse::<RawFd>().ok())
            .filter(|n| *n >= 0)
        else {
            return false;
        };
        // SAFETY: the descriptor number only lives for this call; fstat on a
        // closed or foreign number just fails.
        let inherited = unsafe { std::os::fd::BorrowedFd::borrow_raw(n) };
        match (fstat(inherited), fstat(fd)) {
            (Ok(a), Ok(b)) => identity(&a) == identity(&b),
            _ => false,
        }
    }

    fn try_lock(&mut self, wait: Wait, start: Boot) -> Result<Try, Failure> {
        let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let (fd, created) = match open(
            &self.path,
            flags | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o666),
        ) {
            Ok(fd) => (fd, true),
            Err(Errno::EXIST) => match open(&self.path, flags, Mode::empty()) {
                Ok(fd) => (fd, false),
                Err(Errno::NOENT) => return Ok(Try::Retry),
                Err(e) => return Err(self.unavailable("cannot open lock file", e)),
            },
            Err(e) => return Err(self.unavailable("cannot create lock file", e)),
        };
        if self.inside_holder(&fd) {
            return Err(super::nested(&self.name));
        }
        match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let holder = read_record(&fd).map(|r| r.label);
                if is_own_outer_holder(&self.name, holder.as_deref()) {
                    return Err(super::nested(&self.name));
                }
                if !self.wait_for_lock(&fd, wait, start, holder.as_deref())? {
                    return Ok(Try::Busy(holder));
                }
            }
            Err(e) => return Err(self.unavailable("cannot lock", e)),
        }
        // The path must still name the file we locked: a file deleted or
        // replaced meanwhile would let someone else lock the new one.
        let ours = fstat(&fd).map_err(|e| self.unavailable("fstat", e))?;
        match stat(&self.path) {
            Ok(now) if identity(&now) == identity(&ours) => {}
            _ => return Ok(Try::Retry),
        }
        let fresh = read_record(&fd).is_none_or(|r| r.ino != Some(ours.st_ino));
        if created || fresh {
            // A file no holder has written to yet, or a copy of another one
            // (`cp NAME.lock t && mv t NAME.lock`), may have replaced a
            // deleted one whose holder still runs; its holder must finish first.
            while let Some(orphan) = find_orphan_holder(&self.path, ours.st_dev, ours.st_ino) {
                log::info(format!(
                    "{} was deleted while held; waiting for its holder to finish",
                    self.path.display()
                ));
                let holder = read_record(&orphan).map(|r| r.label);
                if !self.wait_for_lock(&orphan, wait, start, holder.as_deref())? {
                    return Ok(Try::Busy(holder));
                }
            }
        }
        self.id = identity(&ours);
        self.fd = Some(fd);
        Ok(Try::Locked)
    }

    /// Block on `fd`'s lock as `wait` allows. Ok(false): gave up (or `-n`).
    /// A wait that lasts over a second says once who holds the lock.
    fn wait_for_lock(
        &self,
        fd: &OwnedFd,
        wait: Wait,
        start: Boot,
        holder: Option<&str>,
    ) -> Result<bool, Failure> {
        use std::sync::mpsc::RecvTimeoutError;
        let limit = match wait {
            Wait::No => return Ok(false),
            Wait::For(d) => Some(start.add(d)),
            Wait::Forever => None,
        };
        // A helper thread blocks in flock on a duplicate of the same open file
        // (the lock belongs to the open file, so it is ours when it comes). If
        // we give up, lockrun is about to exit, which ends the helper and
        // drops any lock it got.
        let dup = fd.try_clone().map_err(|e| self.unavailable("dup", e))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .spawn(move || {
                let _ = tx.send(flock_blocking(&dup));
            })
            .map_err(|e| self.unavailable("cannot start a thread to wait for", e))?;
        let announce_at = start.add(Duration::from_secs(1));
        let mut announced = false;
        loop {
            let now = Boot::now();
            let next = match (limit, announced) {
                (Some(l), false) => Some(l.min(announce_at)),
                (Some(l), true) => Some(l),
                (None, false) => Some(announce_at),
                (None, true) => None,
            };
            let got = match next {
                Some(at) => rx.recv_timeout(at.since(now)),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match got {
                Ok(Ok(())) => return Ok(true),
                Ok(Err(e)) => return Err(self.unavailable("locking", e)),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(self.unavailable("locking", "the waiting thread ended"));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if limit.is_some_and(|l| Boot::now() >= l) {
                        return Ok(false);
                    }
                    if !announced {
                        announced = true;
                        super::announce_wait(&self.name, holder);
                    }
                }
            }
        }
    }
}

impl Backend for Local {
    fn acquire(&mut self, wait: Wait) -> Result<Acquired, Failure> {
        let start = Boot::now();
        // Bounded: each retry means the file was deleted or replaced meanwhile.
        for _ in 0..100 {
            match self.try_lock(wait, start)? {
                Try::Locked => {
                    let fd = self.fd.as_ref().expect("locked");
                    let sent_at = Boot::now();
                    let token = write_token(fd, &self.owner.shown)
                        .map_err(|e| self.unavailable("writing the token to", e))?;
                    log::info(format!(
                        "acquired {} with token {token} after {:.1?}",
                        self.name,
                        Boot::now().since(start)
                    ));
                    return Ok(Acquired::Granted(Grant { token, sent_at }));
                }
                Try::Busy(holder) => {
                    return Ok(Acquired::Busy {
                        holder: holder.filter(|l| !l.is_empty()),
                    });
                }
                Try::Retry => continue,
            }
        }
        Err(fail(
            Class::Unavailable,
            format!("lock file {} keeps changing under us", self.path.display()),
        ))
    }

    fn renewer(&mut self) -> anyhow::Result<Box<dyn Renewer>> {
        Ok(Box::new(LocalRenewer {
            path: self.path.clone(),
            id: self.id,
        }))
    }

    fn release(&mut self) -> anyhow::Result<bool> {
        // Closing (not LOCK_UN) releases only when no process of the job still
        // holds the inherited descriptor: the safe side if one escaped.
        let still_ours = matches!(stat(&self.path), Ok(st) if identity(&st) == self.id);
        self.fd = None;
        log::info(format!("released {}", self.name));
        Ok(still_ours)
    }

    fn job_fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(|fd| fd.as_raw_fd())
    }

    fn expires(&self) -> bool {
        false
    }
}

impl Inspect for Local {
    fn inspect(&mut self) -> Result<Option<Holder>, Failure> {
        // Read-only: a probing flock could make a concurrent `-n` fail.
        let file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.unavailable("cannot read", e)),
        };
        let st = fstat(&file).map_err(|e| self.unavailable("fstat", e))?;
        if !is_flocked(st.st_dev, st.st_ino) {
            return Ok(None);
        }
        let rec = read_record(&file);
        let now_ms = now_since_epoch().as_millis() as u64;
        Ok(Some(Holder {
            label: rec
                .as_ref()
                .map(|r| r.label.clone())
                .filter(|l| !l.is_empty()),
            token: rec.as_ref().map(|r| r.token),
            ttl_left: None,
            held_for: rec
                .as_ref()
                .filter(|r| r.granted_ms > 0 && r.granted_ms <= now_ms)
                .map(|r| Duration::from_millis(now_ms - r.granted_ms)),
            revoked: false,
        }))
    }

    fn force_release(&mut self, _force: Force) -> Result<Broken, Failure> {
        Err(fail(
            Class::Usage,
            "release --force is not available on the local backend: flock locks end only \
             with their holder; stop the holder's process instead",
        ))
    }
}

#[derive(Clone)]
struct LocalRenewer {
    path: PathBuf,
    id: (u64, u64),
}

impl Renewer for LocalRenewer {
    fn renew(&mut self) -> anyhow::Result<bool> {
        // The flock cannot expire; the lease is lost only if the path stops
        // naming our file, since a new file there would admit a second holder.
        Ok(matches!(stat(&self.path), Ok(st) if identity(&st) == self.id))
    }

    fn fresh(&self) -> Box<dyn Renewer> {
        Box::new(self.clone())
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

    #[test]
    fn tokens_grow_and_survive_a_torn_record() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.path().join("t"))
            .unwrap();
        let a = write_token(&f, "h:1").unwrap();
        let b = write_token(&f, "h:2").unwrap();
        assert!(b > a);
        assert_eq!(read_record(&f).unwrap().label, "h:2");
        rustix::io::pwrite(&f, b"XXXXXX", 0).unwrap();
        let c = write_token(&f, "h:3").unwrap();
        assert!(c > 0);
    }

    #[test]
    fn the_file_name_is_an_os_str() {
        assert_eq!(file_name("a b"), "a%20b.lock");
    }
}
