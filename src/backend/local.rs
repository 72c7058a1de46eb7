//! The local engine: `flock(2)` on files in a per-user directory, one per
//! name (LOCK_EX or LOCK_SH), N slot files for `--limit N`, and a gate that
//! every request passes in turn, so that waiters are served in arrival
//! order across modes. The locked descriptor is inherited by the job, as
//! flock(1) does.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{
    FlockOperation, Mode as FileMode, OFlags, flock, fstat, lstat, mkdir, open, stat,
};
use rustix::io::Errno;

use super::{
    Acquired, Broken, Engine, Force, Held, Holder, Lease, Mode, Request, Status,
    is_own_outer_holder,
};
use crate::clock::Boot;
use crate::config::Wait;
use crate::exit::{Class, Failure, fail};
use crate::log;
use crate::watchdog::Renewer;

/// Size of the record at the start of each lock file, written in one `pwrite`.
const RECORD: usize = 256;

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
    match mkdir(&dir, FileMode::from_raw_mode(0o700)) {
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
    /// The mode of the grant that wrote it: with the file locked, the mode in force.
    mode: Mode,
}

fn mode_code(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "x".into(),
        Mode::Shared => "s".into(),
        Mode::Limit(n) => format!("n{n}"),
    }
}

fn mode_from_code(code: &str) -> Mode {
    match code {
        "s" => Mode::Shared,
        c => c
            .strip_prefix('n')
            .and_then(|n| n.parse().ok())
            .map_or(Mode::Exclusive, Mode::Limit),
    }
}

fn read_record(fd: impl AsFd) -> Option<Record> {
    let mut buf = [0u8; RECORD];
    let n = rustix::io::pread(fd, &mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let mut token = None;
    let mut granted_ms = None;
    let mut label = None;
    let mut ino = None;
    let mut mode = Mode::Exclusive;
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
        } else if let Some(v) = field.strip_prefix("mode=") {
            mode = mode_from_code(v);
        }
    }
    Some(Record {
        token: token?,
        granted_ms: granted_ms.unwrap_or(0),
        label: label.unwrap_or_default(),
        ino,
        mode,
    })
}

fn now_since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Next token: max(stored + 1, wall clock in µs), saturating (a record the
/// job wrote at u64::MAX must not wrap to a lower token).
fn next_token(fd: impl AsFd) -> u64 {
    let stored = read_record(fd).map(|r| r.token).unwrap_or(0);
    stored
        .saturating_add(1)
        .max(u64::try_from(now_since_epoch().as_micros()).unwrap_or(u64::MAX))
}

/// Write a grant's record in place in one write of fixed size, so a torn or
/// lost write never makes tokens go backwards.
fn write_record(fd: impl AsFd + Copy, token: u64, label: &str, mode: Mode) -> std::io::Result<()> {
    let label: String = label
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(150)
        .collect();
    let ino = fstat(fd).map(|st| st.st_ino).unwrap_or(0);
    // The label goes last: it is cut to fit.
    let mut text = format!(
        "token={token} granted_ms={} ino={ino} mode={} label={label}",
        now_since_epoch().as_millis(),
        mode_code(mode)
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
    Ok(())
}

#[cfg(test)]
fn write_token(fd: impl AsFd + Copy, label: &str) -> std::io::Result<u64> {
    let token = next_token(fd);
    write_record(fd, token, label, Mode::Exclusive)?;
    Ok(token)
}

/// One flock in /proc/locks: the inode, the pid that took (or waits for)
/// it, whether it is exclusive, and whether it is only waited for.
struct Flock {
    ino: u64,
    pid: u32,
    exclusive: bool,
    waiting: bool,
}

/// The flocks held on files of device `dev`, and those waited for.
fn all_flocks(dev: u64) -> Vec<Flock> {
    let Ok(text) = std::fs::read_to_string("/proc/locks") else {
        return Vec::new();
    };
    let (maj, min) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let mut out = Vec::new();
    for line in text.lines() {
        // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a waiter's line
        // has "->" after the number.
        let mut f: Vec<&str> = line.split_whitespace().collect();
        let waiting = f.get(1) == Some(&"->");
        if waiting {
            f.remove(1);
        }
        if f.len() < 6 || f[1] != "FLOCK" {
            continue;
        }
        let parts: Vec<&str> = f[5].split(':').collect();
        if parts.len() != 3 {
            continue;
        }
        let ok = u32::from_str_radix(parts[0], 16) == Ok(maj)
            && u32::from_str_radix(parts[1], 16) == Ok(min);
        if let (true, Ok(ino), Ok(pid)) = (ok, parts[2].parse::<u64>(), f[4].parse::<u32>()) {
            out.push(Flock {
                ino,
                pid,
                exclusive: f[3] == "WRITE",
                waiting,
            });
        }
    }
    out
}

/// The flocks held (not waited for) on files of device `dev`.
fn flocks(dev: u64) -> Vec<Flock> {
    let mut all = all_flocks(dev);
    all.retain(|l| !l.waiting);
    all
}

/// Inodes on `dev` under a flock other than `ours` (exclusive ones only,
/// unless `any`).
fn other_flocked_inodes(dev: u64, ours: u64, any: bool) -> Vec<u64> {
    flocks(dev)
        .into_iter()
        .filter(|l| l.ino != ours && (any || l.exclusive))
        .map(|l| l.ino)
        .collect()
}

/// A descriptor (reopened through /proc) of a deleted lock file for `path` that
/// some process still holds locked: its holder must finish before we may run.
fn find_orphan_holder(path: &Path, dev: u64, ours: u64, any: bool) -> Option<OwnedFd> {
    let candidates = other_flocked_inodes(dev, ours, any);
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
            if let Ok(opened) = open(
                fd.path(),
                OFlags::RDONLY | OFlags::CLOEXEC,
                FileMode::empty(),
            ) && let Ok(st) = fstat(&opened)
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
fn flock_blocking(fd: impl AsFd + Copy, op: FlockOperation) -> std::io::Result<()> {
    loop {
        match flock(fd, op) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

fn nonblocking(op: FlockOperation) -> FlockOperation {
    match op {
        FlockOperation::LockShared => FlockOperation::NonBlockingLockShared,
        _ => FlockOperation::NonBlockingLockExclusive,
    }
}

/// A lock taken: the descriptor the job inherits and its file's identity;
/// with `--limit`, also the main file's shared lock and the slot number.
struct Got {
    fd: OwnedFd,
    id: (u64, u64),
    main: Option<OwnedFd>,
    slot: Option<u32>,
}

enum Try {
    Locked(Got),
    /// Held by someone else (their label, if the file has one).
    Busy(Option<String>),
    /// The file changed under us; start over.
    Retry,
}

/// Open a lock file, creating it if needed. None: it vanished meanwhile.
fn open_lock_file(path: &Path) -> Result<Option<(OwnedFd, bool)>, Errno> {
    let flags = OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW;
    match open(
        path,
        flags | OFlags::CREATE | OFlags::EXCL,
        FileMode::from_raw_mode(0o666),
    ) {
        Ok(fd) => Ok(Some((fd, true))),
        Err(Errno::EXIST) => match open(path, flags, FileMode::empty()) {
            Ok(fd) => Ok(Some((fd, false))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// One request's wait: its limit, and the one line a long wait prints.
struct Waiter<'a> {
    name: &'a str,
    wait: Wait,
    start: Boot,
    announced: bool,
}

impl Waiter<'_> {
    fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> Failure {
        fail(Class::Unavailable, format!("{what} {}: {e}", self.name))
    }

    /// Block until `rx` delivers, as the wait allows. None: gave up.
    fn receive<T>(&mut self, rx: &std::sync::mpsc::Receiver<T>, holder: Option<&str>) -> Option<T> {
        use std::sync::mpsc::RecvTimeoutError;
        let limit = match self.wait {
            Wait::No => Some(self.start),
            Wait::For(d) => Some(self.start.add(d)),
            Wait::Forever => None,
        };
        let announce_at = self.start.add(Duration::from_secs(1));
        loop {
            let now = Boot::now();
            let next = match (limit, self.announced) {
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
                Ok(v) => return Some(v),
                Err(RecvTimeoutError::Disconnected) => return None,
                Err(RecvTimeoutError::Timeout) => {
                    if limit.is_some_and(|l| Boot::now() >= l) {
                        return None;
                    }
                    if !self.announced && Boot::now() >= announce_at {
                        self.announced = true;
                        super::announce_wait(self.name, holder);
                    }
                }
            }
        }
    }

    /// Block on `fd`'s lock as the wait allows. Ok(false): gave up (or `-n`).
    fn block(
        &mut self,
        fd: &OwnedFd,
        op: FlockOperation,
        holder: Option<&str>,
    ) -> Result<bool, Failure> {
        if self.wait == Wait::No {
            return Ok(false);
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
        match self.receive(&rx, holder) {
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(self.unavailable("locking", e)),
            None => Ok(false),
        }
    }
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
    readers: PathBuf,
}

impl Files {
    fn slot(&self, k: u32) -> PathBuf {
        suffixed(&self.main, &format!(".slot{k}"))
    }
}

/// A shared holder as the readers file lists it: `pid token granted_ms label`.
struct Reader {
    pid: u32,
    token: u64,
    granted_ms: u64,
    label: String,
}

fn read_readers(path: &Path) -> Vec<Reader> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(4, ' ');
            Some(Reader {
                pid: f.next()?.parse().ok()?,
                token: f.next()?.parse().ok()?,
                granted_ms: f.next()?.parse().ok()?,
                label: f.next().unwrap_or("").to_string(),
            })
        })
        .collect()
}

/// `path` with `suffix` appended to its last component.
fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(suffix);
    p.into()
}

/// The pids holding a flock on `ino` (of device `dev`).
fn lockers(dev: u64, ino: u64) -> Vec<(u32, bool)> {
    flocks(dev)
        .into_iter()
        .filter(|l| l.ino == ino)
        .map(|l| (l.pid, l.exclusive))
        .collect()
}

impl Local {
    pub fn open(dir: Option<&Path>) -> Result<Local, Failure> {
        Ok(Local {
            dir: prepare_dir(dir)?,
        })
    }

    fn files(&self, name: &str) -> Files {
        let main = self.dir.join(file_name(name));
        Files {
            gate: suffixed(&main, ".gate"),
            readers: suffixed(&main, ".readers"),
            main,
        }
    }

    fn unavailable(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> Failure {
        fail(
            Class::Unavailable,
            format!("{what} {}: {e}", path.display()),
        )
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
    ) -> Result<Try, Failure> {
        let Some((fd, created)) =
            open_lock_file(path).map_err(|e| self.unavailable("cannot open lock file", path, e))?
        else {
            return Ok(Try::Retry);
        };
        match flock(&fd, nonblocking(op)) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let holder = read_record(&fd).map(|r| r.label).filter(|l| !l.is_empty());
                if is_own_outer_holder(w.name, holder.as_deref()) {
                    return Err(super::nested(w.name));
                }
                if !block || !w.block(&fd, op, holder.as_deref())? {
                    return Ok(Try::Busy(holder));
                }
            }
            Err(e) => return Err(self.unavailable("cannot lock", path, e)),
        }
        // The path must still name the file we locked: a file deleted or
        // replaced meanwhile would let someone else lock the new one.
        let ours = fstat(&fd).map_err(|e| self.unavailable("fstat", path, e))?;
        match stat(path) {
            Ok(now) if identity(&now) == identity(&ours) => {}
            _ => return Ok(Try::Retry),
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
                    return Ok(Try::Busy(holder));
                }
            }
        }
        Ok(Try::Locked(Got {
            fd,
            id: identity(&ours),
            main: None,
            slot: None,
        }))
    }

    /// True when this process runs inside a job that holds a lock of `files`.
    fn inside_holder(files: &Files) -> bool {
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
    /// every grant writes it while passing the gate, which we hold.
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
        holder: Option<&str>,
    ) -> Result<Option<(u32, OwnedFd)>, Failure> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        if w.wait == Wait::No {
            return Ok(None);
        }
        let won = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        for k in 0..n {
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
        let got = w.receive(&rx, holder);
        // Giving up: a slot locked after this is let go by its thread.
        won.store(true, Ordering::SeqCst);
        Ok(got.or_else(|| rx.try_recv().ok()))
    }

    /// Take one of `n` slots (main file shared, slot file exclusive).
    fn lock_slot(&self, w: &mut Waiter, files: &Files, n: u32) -> Result<Try, Failure> {
        let main = match self.lock_path(w, &files.main, FlockOperation::LockShared, true)? {
            Try::Locked(got) => got.fd,
            other => return Ok(other),
        };
        let mut holder = None;
        for k in 0..n {
            match self.lock_path(w, &files.slot(k), FlockOperation::LockExclusive, false)? {
                Try::Locked(got) => return Ok(slotted(main, k, got.fd, got.id)),
                Try::Busy(h) => holder = holder.or(h),
                Try::Retry => return Ok(Try::Retry),
            }
        }
        match self.wait_any_slot(w, files, n, holder.as_deref())? {
            None => Ok(Try::Busy(holder)),
            Some((k, fd)) => {
                let ours = fstat(&fd).map_err(|e| self.unavailable("fstat", &files.slot(k), e))?;
                match stat(files.slot(k)) {
                    Ok(now) if identity(&now) == identity(&ours) => {
                        Ok(slotted(main, k, fd, identity(&ours)))
                    }
                    _ => Ok(Try::Retry),
                }
            }
        }
    }
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
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Failure> {
        let files = self.files(req.name);
        if Self::inside_holder(&files) {
            return Err(super::nested(req.name));
        }
        let mut w = Waiter {
            name: req.name,
            wait,
            start: Boot::now(),
            // Under -q there is no waiting line to print.
            announced: log::level() == 0,
        };
        // Bounded: each retry means a file was deleted or replaced meanwhile.
        for _ in 0..100 {
            // The gate: requests pass it one at a time, in the order the
            // kernel queues them, so a waiting exclusive request is not
            // overtaken by shared ones that come later. It is held until the
            // grant's record is written, which also orders the tokens.
            let Some((gate, _)) = open_lock_file(&files.gate)
                .map_err(|e| self.unavailable("cannot open lock file", &files.gate, e))?
            else {
                continue;
            };
            if !self.pass_gate(&mut w, &gate, &files)? {
                return Ok(Acquired::Busy {
                    holder: recorded_holder(&files),
                });
            }
            // An exclusive lock taken at once has no holders to disagree
            // with: the common case reads no /proc/locks.
            let at_once = match req.mode {
                Mode::Exclusive => {
                    self.lock_path(&mut w, &files.main, FlockOperation::LockExclusive, false)?
                }
                _ => Try::Busy(None),
            };
            if !matches!(at_once, Try::Locked(..))
                && let Some(in_force) = Self::mode_in_force(&files)
                && !req.mode.agrees_with(in_force)
            {
                return Err(req.mode.disagreement(req.name, in_force));
            }
            let got = match (req.mode, at_once) {
                (_, Try::Locked(got)) => Try::Locked(got),
                (_, Try::Retry) => continue,
                (Mode::Exclusive, Try::Busy(_)) => {
                    self.lock_path(&mut w, &files.main, FlockOperation::LockExclusive, true)?
                }
                (Mode::Shared, _) => {
                    self.lock_path(&mut w, &files.main, FlockOperation::LockShared, true)?
                }
                (Mode::Limit(n), _) => self.lock_slot(&mut w, &files, n)?,
            };
            let Got { fd, id, main, slot } = match got {
                Try::Locked(got) => got,
                Try::Busy(holder) => return Ok(Acquired::Busy { holder }),
                Try::Retry => continue,
            };
            let sent_at = Boot::now();
            let store = main.as_ref().unwrap_or(&fd);
            let token = next_token(store);
            let label = &req.owner.shown;
            let written = write_record(store, token, label, req.mode).and_then(|()| {
                if slot.is_some() {
                    write_record(&fd, token, label, req.mode)?;
                }
                if req.mode == Mode::Shared {
                    self.add_reader(&files, id, token, label)?;
                }
                Ok(())
            });
            written.map_err(|e| self.unavailable("writing the token to", &files.main, e))?;
            drop(gate);
            log::info(format!(
                "acquired {} with token {token} after {:.1?}",
                req.name,
                Boot::now().since(w.start)
            ));
            let path = slot.map_or_else(|| files.main.clone(), |k| files.slot(k));
            let held = LocalHeld {
                fd,
                main,
                path,
                id,
                name: req.name.to_string(),
            };
            return Ok(Acquired::Granted(Lease::new(
                token,
                slot,
                sent_at,
                Box::new(held),
            )));
        }
        Err(fail(
            Class::Unavailable,
            format!("lock file {} keeps changing under us", files.main.display()),
        ))
    }

    fn status(&mut self, name: &str) -> Result<Status, Failure> {
        let files = self.files(name);
        // Read-only: a probing flock could make a concurrent `-n` fail.
        let file = match std::fs::File::open(&files.main) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Status::default()),
            Err(e) => return Err(self.unavailable("cannot read", &files.main, e)),
        };
        let st = fstat(&file).map_err(|e| self.unavailable("fstat", &files.main, e))?;
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
                    });
                }
            }
        }
        // Waiters: whoever holds the gate waits, and those queued behind it.
        let waiters = std::fs::File::open(&files.gate)
            .ok()
            .and_then(|g| fstat(&g).ok())
            .map_or(0, |g| waiting_on(g.st_dev, g.st_ino));
        Ok(Status {
            holders,
            waiters: Some(waiters),
        })
    }

    fn force_release(&mut self, _name: &str, _force: Force) -> Result<Broken, Failure> {
        Err(fail(
            Class::Usage,
            "release --force is not available on the local engine: flock locks end only \
             with their holder; stop the holder's process instead",
        ))
    }
}

/// The holder label in the name's record, for waiting lines.
fn recorded_holder(files: &Files) -> Option<String> {
    std::fs::File::open(&files.main)
        .ok()
        .and_then(|f| read_record(&f))
        .map(|r| r.label)
        .filter(|l| !l.is_empty())
}

/// Requests at the gate `ino`: the one holding it and those queued behind it.
fn waiting_on(dev: u64, ino: u64) -> u64 {
    all_flocks(dev).iter().filter(|l| l.ino == ino).count() as u64
}

impl Local {
    /// Pass the gate: wait for it as the request allows. With `-n` a gate
    /// held for a moment by another request on its way through is waited
    /// for briefly; one held longer means a waiter ahead of us.
    fn pass_gate(&self, w: &mut Waiter, gate: &OwnedFd, files: &Files) -> Result<bool, Failure> {
        if w.wait != Wait::No {
            // Most requests find the gate open: no helper thread, no record
            // read for them.
            return match flock(gate, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => Ok(true),
                Err(Errno::WOULDBLOCK) => {
                    let holder = recorded_holder(files);
                    w.block(gate, FlockOperation::LockExclusive, holder.as_deref())
                }
                Err(e) => Err(w.unavailable("cannot lock the gate of", e)),
            };
        }
        for _ in 0..20 {
            match flock(gate, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(true),
                Err(Errno::WOULDBLOCK) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => return Err(w.unavailable("cannot lock the gate of", e)),
            }
        }
        Ok(false)
    }

    /// List a shared holder in the readers file (replaced whole, under the
    /// gate), dropping those no longer holding the main file.
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
    fn renewer(&self) -> Option<Box<dyn Renewer>> {
        Some(Box::new(LocalRenewer {
            path: self.path.clone(),
            id: self.id,
        }))
    }

    fn inherit_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }

    fn release(self: Box<Self>) -> Result<bool, Failure> {
        // Closing (not LOCK_UN) releases only when no process of the job still
        // holds the inherited descriptor: the safe side if one escaped.
        let still_ours = matches!(stat(&self.path), Ok(st) if identity(&st) == self.id);
        drop(self.fd);
        drop(self.main);
        log::info(format!("released {}", self.name));
        Ok(still_ours)
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
