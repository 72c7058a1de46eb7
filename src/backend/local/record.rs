//! The record at the start of each lock file (token, grant time, inode,
//! mode, holder's label) and the readers file of a shared lock: the only
//! text formats the local engine writes.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::fstat;

use crate::backend::Mode;

/// Size of the record at the start of each lock file, written in one `pwrite`.
pub(super) const RECORD: usize = 256;

pub(super) struct Record {
    pub(super) token: u64,
    pub(super) granted_ms: u64,
    pub(super) label: String,
    /// The inode the record was written to: a copy of the file carries the
    /// old one, which tells a replaced file from the one that was locked.
    pub(super) ino: Option<u64>,
    /// The mode of the grant that wrote it: with the file locked, the mode in force.
    pub(super) mode: Mode,
}

pub(super) fn mode_code(mode: Mode) -> String {
    match mode {
        Mode::Limit(n) => format!("{}{n}", mode.code()),
        _ => mode.code().into(),
    }
}

pub(super) fn mode_from_code(code: &str) -> Mode {
    match code.split_at(code.len().min(1)) {
        // A limit that does not read back is taken as the strictest mode.
        ("n", n) if n.parse::<u32>().is_err() => Mode::Exclusive,
        (letter, n) => Mode::from_code(letter, n.parse().ok()),
    }
}

pub(super) fn read_record(fd: impl AsFd) -> Option<Record> {
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

pub(super) fn now_since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Next token: max(stored + 1, wall clock in µs), saturating (a record the
/// job wrote at u64::MAX must not wrap to a lower token).
pub(super) fn next_token(fd: impl AsFd) -> u64 {
    let stored = read_record(fd).map(|r| r.token).unwrap_or(0);
    stored
        .saturating_add(1)
        .max(u64::try_from(now_since_epoch().as_micros()).unwrap_or(u64::MAX))
}

/// Write a grant's record in place in one write of fixed size, so a torn or
/// lost write never makes tokens go backwards.
pub(super) fn write_record(
    fd: impl AsFd + Copy,
    token: u64,
    label: &str,
    mode: Mode,
) -> std::io::Result<()> {
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
pub(super) fn write_token(fd: impl AsFd + Copy, label: &str) -> std::io::Result<u64> {
    let token = next_token(fd);
    write_record(fd, token, label, Mode::Exclusive)?;
    Ok(token)
}

/// A shared holder as the readers file lists it: `pid token granted_ms label`.
pub(super) struct Reader {
    pub(super) pid: u32,
    pub(super) token: u64,
    pub(super) granted_ms: u64,
    pub(super) label: String,
}

pub(super) fn read_readers(path: &Path) -> Vec<Reader> {
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
