//! The local engine: `flock(2)` on files in a per-user directory, one per
//! name (LOCK_EX or LOCK_SH), N slot files for `--limit N`, and beside them
//! a queue of places that waiters keep by refreshing them, so that waiters
//! are served in arrival order across modes and one that stops keeping its
//! place (stopped, or dead) holds nobody up for long. The locked descriptor
//! is inherited by the job, as flock(1) does.

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::{
    FlockOperation, Mode as FileMode, OFlags, flock, fstat, lstat, mkdir, open, stat,
};
use rustix::io::Errno;

use std::sync::Arc;

use super::{
    Acquired, Address, AddressOptions, Caps, Engine, EngineInfo, Held, Holder, Lease, Mode,
    Request, Status, Wait,
};
use crate::clock::Boot;
use crate::exit::{Class, Failure, fail};
use crate::log;
use crate::watchdog::{Renewal, Renewer};

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
        Mode::Limit(n) => format!("{}{n}", mode.code()),
        _ => mode.code().into(),
    }
}

fn mode_from_code(code: &str) -> Mode {
    match code.split_at(code.len().min(1)) {
        // A limit that does not read back is taken as the strictest mode.
        ("n", n) if n.parse::<u32>().is_err() => Mode::Exclusive,
        (letter, n) => Mode::from_code(letter, n.parse().ok()),
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

/// CLOCK_MONOTONIC in nanoseconds: the queue's clock. Every process of the
/// machine reads the same one, and unlike CLOCK_BOOTTIME it stands still
/// through a suspend, which stops every waiter alike and must not cost any
/// of them its place.
fn mono_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Size of a place's record, written in one `pwrite`.
const PLACE_RECORD: usize = 80;

/// Most places a name's queue has (one file each).
const MAX_PLACES: u32 = 10_000;

/// A queued request's place (README "Local (the default)"): a place file it
/// holds LOCK_EX, so the place goes with the process, and a record of when
/// it came (its rank in the queue) and until when it keeps the place.
struct Place {
    fd: OwnedFd,
    index: u32,
    arrived: u64,
    until: u64,
    /// How long one refresh keeps the place (ttl/3), and how often it is
    /// refreshed (ttl/5), as a Redis waiter keeps its place.
    keep: u64,
    every: u64,
    refresh_at: u64,
}

/// A place as another request sees it: its file, open, and its record.
struct Seen {
    file: OwnedFd,
    arrived: u64,
    until: u64,
    pid: u32,
}

impl Seen {
    fn rank(&self) -> (u64, u32) {
        (self.arrived, self.pid)
    }
}

fn write_place(fd: impl AsFd, arrived: u64, until: u64) -> std::io::Result<()> {
    let text = format!("arrived={arrived} until={until} pid={}", std::process::id());
    let mut buf = [b' '; PLACE_RECORD];
    buf[..text.len()].copy_from_slice(text.as_bytes());
    buf[PLACE_RECORD - 1] = b'\n';
    let n = rustix::io::pwrite(fd, &buf, 0)?;
    if n != PLACE_RECORD {
        return Err(std::io::Error::other("short write of a place in the queue"));
    }
    Ok(())
}

/// A place's record: (arrived, until, pid).
fn read_place(fd: impl AsFd) -> Option<(u64, u64, u32)> {
    let mut buf = [0u8; PLACE_RECORD];
    let n = rustix::io::pread(fd, &mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let (mut arrived, mut until, mut pid) = (None, None, None);
    for field in text.split_whitespace() {
        if let Some(v) = field.strip_prefix("arrived=") {
            arrived = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("until=") {
            until = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("pid=") {
            pid = v.parse().ok();
        }
    }
    Some((arrived?, until?, pid?))
}

impl Place {
    fn rank(&self) -> (u64, u32) {
        (self.arrived, std::process::id())
    }

    /// Keep the place: refresh its record when due. False when it lapsed
    /// (we were stopped, or starved, past `until`): a waiter behind may have
    /// gone ahead, so the place is taken again at the back of the queue.
    fn tend(&mut self) -> bool {
        let now = mono_ns();
        let kept = now < self.until;
        if !kept {
            self.arrived = now;
        }
        if !kept || now >= self.refresh_at {
            self.until = now.saturating_add(self.keep);
            self.refresh_at = now.saturating_add(self.every);
            // A failed write only makes the place lapse, which we notice.
            let _ = write_place(&self.fd, self.arrived, self.until);
        }
        kept
    }
}

/// What a queued request holds: its place, and a share of the gate, which
/// tells requests that come later that someone is queued.
struct Queued {
    place: Place,
    gate: OwnedFd,
    /// False while a request looking at the gate kept us from our share.
    shared: bool,
}

impl Queued {
    fn tend(&mut self) -> bool {
        if !self.shared {
            self.shared = share_gate(&self.gate, 1);
        }
        self.place.tend()
    }
}

/// Take a share of the gate (LOCK_SH), trying `tries` times a millisecond
/// apart: it is held exclusively only for the instant a request looks
/// whether anyone is queued, never while anyone waits.
fn share_gate(gate: &OwnedFd, tries: u32) -> bool {
    for i in 0..tries {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        match flock(gate, FlockOperation::NonBlockingLockShared) {
            Ok(()) => return true,
            Err(Errno::WOULDBLOCK) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// What one wait ended with.
enum Heard<T> {
    Got(T),
    /// The time asked for came.
    Woke,
    /// The wait ran out (`-w`, `-n`), or our place lapsed (`lapsed` is set).
    Over,
}

/// One request's wait: its limit, the one line a long wait prints, and its
/// place in the queue once it has one.
struct Waiter<'a> {
    name: &'a str,
    req: &'a Request<'a>,
    wait: Wait,
    start: Boot,
    announced: bool,
    queued: Option<Queued>,
    /// Our place lapsed during a wait and was taken again at the back.
    lapsed: bool,
}

impl Waiter<'_> {
    fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> Failure {
        fail(Class::Unavailable, format!("{what} {}: {e}", self.name))
    }

    /// Block until `rx` delivers, as the wait allows. None: gave up, or our
    /// place lapsed.
    fn receive<T>(&mut self, rx: &std::sync::mpsc::Receiver<T>, holder: Option<&str>) -> Option<T> {
        match self.hear(rx, holder, None) {
            Heard::Got(v) => Some(v),
            Heard::Woke | Heard::Over => None,
        }
    }

    /// Block until `rx` delivers or, if given, until `wake` (on `mono_ns`),
    /// keeping our place meanwhile.
    fn hear<T>(
        &mut self,
        rx: &std::sync::mpsc::Receiver<T>,
        holder: Option<&str>,
        wake: Option<u64>,
    ) -> Heard<T> {
        use std::sync::mpsc::RecvTimeoutError;
        let limit = match self.wait {
            Wait::No => Some(self.start),
            Wait::For(d) => Some(self.start.add(d)),
            Wait::Forever => None,
        };
        let announce_at = self.start.add(Duration::from_secs(1));
        loop {
            // First, so that a wait resuming after a stop sees its place lapsed.
            if let Some(q) = self.queued.as_mut()
                && !q.tend()
            {
                self.lapsed = true;
                return Heard::Over;
            }
            let now = Boot::now();
            let mono = mono_ns();
            let mut next: Option<Duration> = None;
            let mut upto = |d: Duration| next = Some(next.map_or(d, |n| n.min(d)));
            if let Some(l) = limit {
                upto(l.since(now));
            }
            if !self.announced {
                upto(announce_at.since(now));
            }
            if let Some(q) = &self.queued {
                upto(Duration::from_nanos(
                    q.place.refresh_at.saturating_sub(mono),
                ));
            }
            if let Some(at) = wake {
                upto(Duration::from_nanos(at.saturating_sub(mono)));
            }
            let got = match next {
                Some(d) => rx.recv_timeout(d),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match got {
                Ok(v) => return Heard::Got(v),
                Err(RecvTimeoutError::Disconnected) => return Heard::Over,
                Err(RecvTimeoutError::Timeout) => {
                    if limit.is_some_and(|l| Boot::now() >= l) {
                        return Heard::Over;
                    }
                    if wake.is_some_and(|at| mono_ns() >= at) {
                        return Heard::Woke;
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

/// The local engine's row of the scheme table: the default, with no URL.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "local",
    schemes: &["file"],
    form: "file:///dir",
    parse,
    // Leases are asked for in milliseconds (PX / the boot clock).
    ttl_step: Duration::from_millis(1),
    ttl_min: Duration::ZERO,
    caps: Caps {
        expires: false,
        force_release: false,
        shared: true,
        limit: true,
    },
};

/// A lock directory (README "Local (the default)"); None is the per-user default.
#[derive(Debug, Clone)]
pub struct LocalDir {
    pub dir: Option<PathBuf>,
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
    fn open(&self, _prefix: &str, _op: Duration) -> Result<Box<dyn Engine>, Failure> {
        Ok(Box::new(Local::open(self.dir.as_deref())?))
    }
}

/// Parse `file:///dir` (empty: the default directory).
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Failure> {
    let usage = |msg: String| fail(Class::Usage, msg);
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
    let addr = LocalDir { dir };
    opts.no_tls(&addr.shown())?;
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
            grant: suffixed(&main, ".grant"),
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
                if w.req.is_own_outer_holder(holder.as_deref()) {
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

    /// Take one of `n` slots (main file shared, slot file exclusive): at
    /// once, or (`block`) waiting as the request allows.
    fn lock_slot(
        &self,
        w: &mut Waiter,
        files: &Files,
        n: u32,
        block: bool,
    ) -> Result<Try, Failure> {
        let main = match self.lock_path(w, &files.main, FlockOperation::LockShared, block)? {
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
        if !block {
            return Ok(Try::Busy(holder));
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
            req,
            wait,
            start: Boot::now(),
            // Under -q there is no waiting line to print.
            announced: req.quiet,
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
        // Waiters: the places kept in the queue.
        let waiters = live_places(&files, None).len() as u64;
        Ok(Status {
            holders,
            waiters: Some(waiters),
        })
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
    fn nobody_queued(&self, files: &Files) -> Result<bool, Failure> {
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
    fn take(&self, w: &mut Waiter, req: &Request, files: &Files) -> Result<Try, Failure> {
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
    ) -> Result<Try, Failure> {
        match req.mode {
            Mode::Exclusive => self.lock_path(w, &files.main, FlockOperation::LockExclusive, block),
            Mode::Shared => self.lock_path(w, &files.main, FlockOperation::LockShared, block),
            Mode::Limit(n) => self.lock_slot(w, files, n, block),
        }
    }

    fn refuse_disagreement(&self, req: &Request, files: &Files) -> Result<(), Failure> {
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
    fn join_queue(&self, w: &mut Waiter, files: &Files, ttl: Duration) -> Result<bool, Failure> {
        let Some((gate, _)) = open_lock_file(&files.gate)
            .map_err(|e| self.unavailable("cannot open lock file", &files.gate, e))?
        else {
            return Ok(false);
        };
        let shared = share_gate(&gate, 20);
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        for k in 0..MAX_PLACES {
            let path = files.place(k);
            let Some((fd, _)) = open_lock_file(&path)
                .map_err(|e| self.unavailable("cannot open lock file", &path, e))?
            else {
                continue;
            };
            match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(Errno::WOULDBLOCK) => continue,
                Err(e) => return Err(self.unavailable("cannot lock", &path, e)),
            }
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
    fn wait_turn(&self, w: &mut Waiter, files: &Files) -> Result<bool, Failure> {
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
    fn lock_grant(&self, w: &mut Waiter, files: &Files) -> Result<Option<OwnedFd>, Failure> {
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
        Err(fail(
            Class::Unavailable,
            format!(
                "lock file {} keeps changing under us",
                files.grant.display()
            ),
        ))
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
    ) -> Result<Option<Acquired>, Failure> {
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
        let written = write_record(store, token, label, req.mode).and_then(|()| {
            if slot.is_some() {
                write_record(&fd, token, label, req.mode)?;
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
    fn renew(&mut self) -> anyhow::Result<Renewal> {
        // The flock cannot expire; the lease is lost only if the path stops
        // naming our file, since a new file there would admit a second holder.
        Ok(match stat(&self.path) {
            Ok(st) if identity(&st) == self.id => Renewal::Renewed { ttl: Duration::MAX },
            _ => Renewal::Lost,
        })
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
