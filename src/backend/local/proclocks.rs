//! What the kernel says about flocks (/proc/locks), and the search for the
//! holder of a lock file deleted while it was held.

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{Mode as FileMode, OFlags, fstat, open};

/// One flock in /proc/locks: the inode, the pid that took (or waits for)
/// it, whether it is exclusive, and whether it is only waited for.
#[derive(PartialEq, Eq)]
pub(super) struct Flock {
    pub(super) ino: u64,
    pub(super) pid: u32,
    pub(super) exclusive: bool,
    pub(super) waiting: bool,
}

/// The flocks held on files of device `dev`, and those waited for.
/// /proc/locks is made in pieces as it is read, and a lock that goes while
/// it is read can make the next piece skip one that stays: it is read twice
/// and what either read shows is kept.
pub(super) fn all_flocks(dev: u64) -> Vec<Flock> {
    let mut out = parse_flocks(dev, "/proc/locks");
    for again in parse_flocks(dev, "/proc/locks") {
        if !out.contains(&again) {
            out.push(again);
        }
    }
    out
}

fn parse_flocks(dev: u64, file: &str) -> Vec<Flock> {
    let Ok(text) = std::fs::read_to_string(file) else {
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
pub(super) fn flocks(dev: u64) -> Vec<Flock> {
    let mut all = all_flocks(dev);
    all.retain(|l| !l.waiting);
    all
}

/// Inodes on `dev` under a flock other than `ours` (exclusive ones only,
/// unless `any`).
pub(super) fn other_flocked_inodes(dev: u64, ours: u64, any: bool) -> Vec<u64> {
    flocks(dev)
        .into_iter()
        .filter(|l| l.ino != ours && (any || l.exclusive))
        .map(|l| l.ino)
        .collect()
}

/// A descriptor (reopened through /proc) of a deleted lock file for `path` that
/// some process still holds locked: its holder must finish before we may run.
pub(super) fn find_orphan_holder(path: &Path, dev: u64, ours: u64, any: bool) -> Option<OwnedFd> {
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

/// The pids holding a flock on `ino` (of device `dev`).
pub(super) fn lockers(dev: u64, ino: u64) -> Vec<(u32, bool)> {
    flocks(dev)
        .into_iter()
        .filter(|l| l.ino == ino)
        .map(|l| (l.pid, l.exclusive))
        .collect()
}

/// Where the flocks of a file are read from: /proc/locks as it is now (a
/// status of one name), or a table read for many files at once (a
/// listing: /proc/locks lists every flock of the machine, and reading it
/// once per name makes a listing of N held names cost N²), read again
/// once it is a second old, so no name is judged by an older table.
pub(super) enum Lockers {
    Now,
    Table {
        dev: u64,
        read: std::time::Instant,
        held: Vec<Flock>,
    },
}

impl Lockers {
    /// A table of the flocks on `dev`, read now.
    pub(super) fn table(dev: u64) -> Lockers {
        Lockers::Table {
            dev,
            read: std::time::Instant::now(),
            held: flocks(dev),
        }
    }

    /// The pids holding a flock on `ino` (of device `dev`).
    pub(super) fn of(&mut self, dev: u64, ino: u64) -> Vec<(u32, bool)> {
        match self {
            Lockers::Table { dev: d, read, held } if *d == dev => {
                if read.elapsed() > std::time::Duration::from_secs(1) {
                    *self = Lockers::table(dev);
                    return self.of(dev, ino);
                }
                held.iter()
                    .filter(|l| l.ino == ino)
                    .map(|l| (l.pid, l.exclusive))
                    .collect()
            }
            // Another device (a file mounted into the directory): now.
            _ => lockers(dev, ino),
        }
    }
}
