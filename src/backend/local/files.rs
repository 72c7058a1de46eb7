//! The lock directory and its files: where it is and whether it is safe to
//! trust, how a name becomes a file name, and opening and flocking a file.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode as FileMode, OFlags, flock, lstat, mkdir, open};
use rustix::io::Errno;

use crate::backend::Error;

/// The per-user default directory; it depends only on the uid, so cron and a
/// login shell find the same files.
pub(super) fn default_dir() -> PathBuf {
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
pub(super) fn prepare_dir(given: Option<&Path>) -> Result<PathBuf, Error> {
    let dir = given.map(Path::to_path_buf).unwrap_or_else(default_dir);
    let unusable = |why: String| Error::Refused(format!("lock directory {}: {why}", dir.display()));
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

pub(super) fn identity(st: &rustix::fs::Stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// Block in flock(2) until it is ours, retrying interrupted calls.
pub(super) fn flock_blocking(fd: impl AsFd + Copy, op: FlockOperation) -> std::io::Result<()> {
    loop {
        match flock(fd, op) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

pub(super) fn nonblocking(op: FlockOperation) -> FlockOperation {
    match op {
        FlockOperation::LockShared => FlockOperation::NonBlockingLockShared,
        _ => FlockOperation::NonBlockingLockExclusive,
    }
}

/// Open a lock file, creating it if needed. None: it vanished meanwhile.
pub(super) fn open_lock_file(path: &Path) -> Result<Option<(OwnedFd, bool)>, Errno> {
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

/// `path` with `suffix` appended to its last component.
pub(super) fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(suffix);
    p.into()
}
