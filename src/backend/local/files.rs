//! The lock directory and its files: where it is and whether it is safe to
//! trust, how a name becomes a file name, and opening and flocking a file.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode as FileMode, OFlags, flock, lstat, mkdir, open};
use rustix::io::Errno;

use crate::backend::{Check, Error};
use crate::clock::Boot;

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

/// The lock name a main lock file stands for (None: not a main lock file).
/// A name too long to keep whole in a file name (cut, with a hash) comes
/// back as its kept part followed by `…`.
pub(super) fn name_of_file(file: &str) -> Option<String> {
    let stem = file.strip_suffix(".lock")?;
    if stem.is_empty() || stem.starts_with('.') {
        return None;
    }
    let (kept, cut) = match stem.split_once('~') {
        Some((kept, _hash)) => (kept, true),
        None => (stem, false),
    };
    let raw = kept.as_bytes();
    let mut bytes = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' {
            let hex = std::str::from_utf8(raw.get(i + 1..i + 3)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            bytes.push(raw[i]);
            i += 1;
        }
    }
    // A cut may fall inside a character: keep what reads.
    let mut name = String::from_utf8_lossy(&bytes).into_owned();
    if cut {
        name = name.trim_end_matches('\u{FFFD}').to_string() + "…";
    }
    Some(name)
}

/// `lockrun doctor` on the lock directory: that it exists (or can be
/// made), is a real directory of ours that others cannot write, and sits
/// on a file system whose flock(2) is trustworthy. Only looks.
pub(super) fn doctor(given: Option<&Path>) -> Vec<Check> {
    let dir = given.map(Path::to_path_buf).unwrap_or_else(default_dir);
    let shown = dir.display().to_string();
    // The default directory is refused outright when it is not ours alone;
    // a directory given with --url may be shared on purpose.
    let strict = given.is_none();
    let st = match lstat(&dir) {
        Ok(st) => st,
        Err(Errno::NOENT) => return missing_directory(&dir, &shown),
        Err(e) => return vec![Check::fail("directory", format!("{shown}: {e}"))],
    };
    let mut out = Vec::new();
    let Some(st) = real_directory(&dir, &shown, strict, st, &mut out) else {
        return out;
    };
    out.push(owner_check(&st, strict));
    out.push(mode_check(&dir, &shown, &st, strict));
    out.extend(file_system(&dir));
    out
}

/// A directory not made yet is fine when lockrun can make it.
fn missing_directory(dir: &Path, shown: &str) -> Vec<Check> {
    let mut out = Vec::new();
    let parent = dir.parent().unwrap_or(Path::new("/"));
    if rustix::fs::access(parent, rustix::fs::Access::WRITE_OK).is_ok() {
        out.push(Check::ok(
            "directory",
            format!("{shown} does not exist yet; lockrun creates it (mode 0700) on first use"),
        ));
        out.extend(file_system(parent));
    } else {
        out.push(Check::fail(
            "directory",
            format!(
                "{shown} does not exist and {} is not writable: create it, or choose \
                 another directory with --url file:///path",
                parent.display()
            ),
        ));
    }
    out
}

/// Checks that the directory is one and not a link, and gives the stat of
/// the directory to look at further, or None when there is none.
fn real_directory(
    dir: &Path,
    shown: &str,
    strict: bool,
    st: rustix::fs::Stat,
    out: &mut Vec<Check>,
) -> Option<rustix::fs::Stat> {
    let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
    // Past a link, what matters is the directory it leads to.
    let st = match kind {
        rustix::fs::FileType::Symlink => match rustix::fs::stat(dir) {
            Ok(target) => target,
            Err(e) => {
                out.push(Check::fail(
                    "directory",
                    format!("{shown} is a symbolic link that leads nowhere ({e}): remove it"),
                ));
                return None;
            }
        },
        _ => st,
    };
    if kind == rustix::fs::FileType::Symlink {
        let what =
            format!("{shown} is a symbolic link: whoever can change the link can move your locks");
        out.push(if strict {
            Check::fail(
                "not a link",
                format!("{what}; lockrun refuses it: have it removed"),
            )
        } else {
            Check::warn(
                "not a link",
                format!("{what}; give the real directory in --url"),
            )
        });
    } else if kind != rustix::fs::FileType::Directory {
        out.push(Check::fail(
            "directory",
            format!(
                "{shown} is not a directory: remove it, or choose another with --url file:///path"
            ),
        ));
        return None;
    } else {
        out.push(Check::ok(
            "not a link",
            format!("{shown} is a directory, not a link"),
        ));
    }
    Some(st)
}

/// Whoever owns the directory can hold or fake the locks in it.
fn owner_check(st: &rustix::fs::Stat, strict: bool) -> Check {
    let me = rustix::process::getuid().as_raw();
    if st.st_uid == me {
        return Check::ok("owner", format!("owned by you (uid {me})"));
    }
    let what = format!(
        "owned by uid {}, not by you (uid {me}): that user can hold or fake your locks",
        st.st_uid
    );
    if strict {
        Check::fail(
            "owner",
            format!("{what}; lockrun refuses it: have it removed (as root)"),
        )
    } else {
        Check::warn(
            "owner",
            format!("{what}; fine if the directory is shared on purpose"),
        )
    }
}

/// Others must not write in the directory, and we must.
fn mode_check(dir: &Path, shown: &str, st: &rustix::fs::Stat, strict: bool) -> Check {
    let mode = st.st_mode & 0o7777;
    if strict && mode & 0o077 != 0 {
        Check::fail(
            "mode",
            format!("mode {mode:o} lets other users in; lockrun refuses it: chmod 700 {shown}"),
        )
    } else if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        Check::warn(
            "mode",
            format!(
                "mode {mode:o}: any user can remove or replace lock files; chmod o-w {shown} \
                 (or chmod +t)"
            ),
        )
    } else if rustix::fs::access(dir, rustix::fs::Access::WRITE_OK).is_err() {
        Check::fail(
            "mode",
            format!("mode {mode:o}: you cannot create lock files in it; chmod u+w {shown}"),
        )
    } else {
        Check::ok("mode", format!("mode {mode:o}"))
    }
}

/// flock(2) is only as good as the file system under it.
fn file_system(dir: &Path) -> Option<Check> {
    let fs = rustix::fs::statfs(dir).ok()?;
    // The magic numbers of linux/magic.h.
    let (name, network) = match fs.f_type as u64 {
        0x6969 => ("NFS", true),
        0xFF534D42 | 0xFE534D42 | 0x517B => ("SMB/CIFS", true),
        0x00C36400 => ("Ceph", true),
        0x65735546 => ("FUSE", true),
        0x0BD00BD0 => ("Lustre", true),
        0x01021994 => ("tmpfs", false),
        0xEF53 => ("ext4", false),
        0x58465342 => ("XFS", false),
        0x9123683E => ("Btrfs", false),
        0x2FC12FC1 => ("ZFS", false),
        0x794C7630 => ("overlayfs", false),
        _ => ("a local file system", false),
    };
    Some(if network {
        Check::warn(
            "file system",
            format!(
                "{} is on {name}: flock(2) there is emulated or served remotely, and a lock can \
                 be lost when the server restarts or this host loses its connection; keep the \
                 lock directory on a local disk, or use a server engine (redis://, etcd://) \
                 across machines",
                dir.display()
            ),
        )
    } else {
        Check::ok(
            "file system",
            format!("{name}: flock(2) is local and reliable"),
        )
    })
}

pub(super) fn identity(st: &rustix::fs::Stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// Block in flock(2) until it is ours, retrying interrupted calls.
pub(super) fn flock_blocking(fd: impl AsFd + Copy, op: FlockOperation) -> std::io::Result<Boot> {
    loop {
        match flock(fd, op) {
            Ok(()) => return Ok(Boot::now()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_file_names_its_lock() {
        for name in ["job", "a b/c", ".hidden", "50%", "ünï", "x.lock"] {
            assert_eq!(
                name_of_file(&file_name(name)).as_deref(),
                Some(name),
                "{name}"
            );
        }
        let long = "é".repeat(300);
        let shown = name_of_file(&file_name(&long)).unwrap();
        assert!(shown.ends_with('…') && long.starts_with(shown.trim_end_matches('…')));
        for other in [
            "job.lock.gate",
            "job.lock.join",
            "job.lock.slot0",
            ".job.lock",
            ".lock",
            "x.prom",
        ] {
            assert_eq!(name_of_file(other), None, "{other}");
        }
    }
}
