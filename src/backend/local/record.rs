//! The record at the start of each lock file (token, grant time, inode,
//! mode, holder's label) and the readers file of a shared lock: the only
//! text formats the local engine writes.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::fs::fstat;

use crate::backend::Mode;
use crate::clock::Boot;

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
    /// A `--min-hold` window: until it ends, the place is held by no one.
    pub(super) window: Option<Window>,
}

/// A `--min-hold` window (lockrun(1) "Once per window"): until when on
/// the boot clock of the boot that wrote it and on the wall clock, and how
/// long it was. A flock ends with its holder, so the window lives here, and
/// every request that gets the lock honours it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Window {
    until_boot_ms: u64,
    boot: String,
    until_wall_ms: u64,
    hold_ms: u64,
}

/// This boot's id, short: which boot a boot-clock time belongs to.
pub(super) fn boot_id() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap_or_default()
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(16)
            .collect()
    })
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Window {
    /// The window of a grant made at `granted` (boot clock) and
    /// `granted_wall`, `hold` long; rounded up to whole milliseconds.
    pub(super) fn new(granted: Boot, granted_wall: Duration, hold: Duration) -> Window {
        let up = |d: Duration| ms(d + Duration::from_nanos(999_999));
        Window {
            until_boot_ms: up(granted.0 + hold),
            boot: boot_id().to_string(),
            until_wall_ms: up(granted_wall + hold),
            hold_ms: up(hold),
        }
    }

    /// What is left of the window, if anything. On the boot that wrote it,
    /// the boot clock says (wall clocks that step change nothing); written
    /// under another boot (before a reboot, which resets the boot clock, or
    /// by another host sharing the directory), the wall clock does. Never
    /// more than the window's length from now: a wall clock far ahead
    /// cannot stretch it past that.
    pub(super) fn left(&self) -> Option<Duration> {
        let now = Boot::now();
        let wall = self.until_wall_ms.saturating_sub(ms(now_since_epoch()));
        let left_ms = if !self.boot.is_empty() && self.boot == boot_id() {
            self.until_boot_ms.saturating_sub(ms(now.0))
        } else {
            wall
        };
        (left_ms > 0).then(|| Duration::from_millis(left_ms.min(self.hold_ms)))
    }

    fn encode(&self) -> String {
        format!(
            "hold={},{},{},{}",
            self.until_boot_ms, self.boot, self.until_wall_ms, self.hold_ms
        )
    }

    fn decode(v: &str) -> Option<Window> {
        let mut f = v.split(',');
        let w = Window {
            until_boot_ms: f.next()?.parse().ok()?,
            boot: f.next()?.to_string(),
            until_wall_ms: f.next()?.parse().ok()?,
            hold_ms: f.next()?.parse().ok()?,
        };
        (w.boot.len() <= 16 && w.boot.chars().all(|c| c.is_ascii_hexdigit())).then_some(w)
    }

    /// The one of two windows that ends later.
    pub(super) fn later(a: Option<Window>, b: Option<Window>) -> Option<Window> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if a.left() >= b.left() { a } else { b }),
            (a, b) => a.or(b),
        }
    }
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
    let mut window = None;
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
        } else if let Some(v) = field.strip_prefix("hold=") {
            // One that does not read holds nothing: the lock is there to take.
            window = Window::decode(v);
        }
    }
    Some(Record {
        token: token?,
        granted_ms: granted_ms.unwrap_or(0),
        label: label.unwrap_or_default(),
        ino,
        mode,
        window,
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
    window: Option<&Window>,
) -> std::io::Result<()> {
    let granted_ms = ms(now_since_epoch());
    write_fields(fd, token, granted_ms, label, mode, window)
}

/// Write a record as it was but without its `--min-hold` window (ended by
/// `release --force`).
pub(super) fn end_window(fd: impl AsFd + Copy, r: &Record) -> std::io::Result<()> {
    write_fields(fd, r.token, r.granted_ms, &r.label, r.mode, None)
}

fn write_fields(
    fd: impl AsFd + Copy,
    token: u64,
    granted_ms: u64,
    label: &str,
    mode: Mode,
    window: Option<&Window>,
) -> std::io::Result<()> {
    let label: String = label
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(150)
        .collect();
    let ino = fstat(fd).map(|st| st.st_ino).unwrap_or(0);
    // The label goes last: it is cut to fit.
    let hold = window
        .map(|w| format!("{} ", w.encode()))
        .unwrap_or_default();
    let mut text = format!(
        "token={token} granted_ms={granted_ms} ino={ino} mode={} {hold}label={label}",
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
    write_record(fd, token, label, Mode::Exclusive, None)?;
    Ok(token)
}

/// Where a preemption mark starts in a lock file: right after the record,
/// which an older lockrun reads (and writes) alone.
const MARK_AT: u64 = RECORD as u64;

/// Size of a preemption mark, written in one `pwrite`.
const MARK: usize = 256;

/// A `--preempt` request's mark on a lock file (lockrun-engines(7)
/// "LOCAL"): who asked, and which holders it meant: those that held the
/// file when it was written. On the boot that wrote it, the boot clock
/// tells them (a holder that got its lock before `at_ns`); under another
/// boot, the token (a holder whose token is at most `upto`, the highest
/// token recorded then). Tokens only grow and a later lock is got later,
/// so a mark never applies to a later holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Preempt {
    pub(super) upto: u64,
    boot: String,
    at_ns: u64,
    wall_ms: u64,
    pub(super) by: String,
}

impl Preempt {
    /// A mark made now for holders whose tokens are at most `upto`.
    pub(super) fn now(upto: u64, by: &str) -> Preempt {
        Preempt {
            upto,
            boot: boot_id().to_string(),
            at_ns: u64::try_from(Boot::now().0.as_nanos()).unwrap_or(u64::MAX),
            wall_ms: ms(now_since_epoch()),
            by: by
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .take(150)
                .collect(),
        }
    }

    /// Whether the mark stops the holder with `token`, granted at `got_at`
    /// (on the boot clock, after it got its lock).
    pub(super) fn stops(&self, token: u64, got_at: Boot) -> bool {
        if !self.boot.is_empty() && self.boot == boot_id() {
            got_at.0.as_nanos() < u128::from(self.at_ns)
        } else {
            token <= self.upto
        }
    }

    /// Whether `status` shows a holder with `token`, granted at `granted_ms`
    /// on the wall clock, as preempted (a display only).
    pub(super) fn shown_on(&self, token: u64, granted_ms: u64) -> bool {
        token <= self.upto || (granted_ms > 0 && granted_ms <= self.wall_ms)
    }
}

/// Write a preemption mark after the record of a lock file.
pub(super) fn write_preempt(fd: impl AsFd, p: &Preempt) -> std::io::Result<()> {
    let mut text = format!(
        "preempt upto={} boot={} at_ns={} wall_ms={} by={}",
        p.upto, p.boot, p.at_ns, p.wall_ms, p.by
    );
    let mut cut = text.len().min(MARK - 1);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    let mut buf = [b' '; MARK];
    buf[..text.len()].copy_from_slice(text.as_bytes());
    buf[MARK - 1] = b'\n';
    let n = rustix::io::pwrite(fd, &buf, MARK_AT)?;
    if n != MARK {
        return Err(std::io::Error::other("short write of a preemption mark"));
    }
    Ok(())
}

/// The preemption mark of a lock file, if it has a whole one.
pub(super) fn read_preempt(fd: impl AsFd) -> Option<Preempt> {
    let mut buf = [0u8; MARK];
    let n = rustix::io::pread(fd, &mut buf, MARK_AT).ok()?;
    if n != MARK || buf[MARK - 1] != b'\n' {
        return None;
    }
    let text = std::str::from_utf8(&buf).ok()?.strip_prefix("preempt ")?;
    let (fields, by) = text.split_once(" by=")?;
    let (mut upto, mut boot, mut at_ns, mut wall_ms) = (None, None, None, None);
    for field in fields.split(' ') {
        if let Some(v) = field.strip_prefix("upto=") {
            upto = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("boot=") {
            boot = Some(v.to_string());
        } else if let Some(v) = field.strip_prefix("at_ns=") {
            at_ns = v.parse().ok();
        } else if let Some(v) = field.strip_prefix("wall_ms=") {
            wall_ms = v.parse().ok();
        }
    }
    Some(Preempt {
        upto: upto?,
        boot: boot?,
        at_ns: at_ns?,
        wall_ms: wall_ms?,
        by: by.trim_end().to_string(),
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> (tempfile::TempDir, std::fs::File) {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.path().join("r"))
            .unwrap();
        (dir, f)
    }

    #[test]
    fn a_window_survives_its_record_and_ends_on_time() {
        let (_dir, f) = scratch();
        let hold = Duration::from_secs(60);
        let w = Window::new(Boot::now(), now_since_epoch(), hold);
        write_record(&f, 7, "h:1 (a note)", Mode::Shared, Some(&w)).unwrap();
        let r = read_record(&f).unwrap();
        assert_eq!(r.window.as_ref(), Some(&w));
        assert_eq!(
            (r.token, r.label.as_str(), r.mode),
            (7, "h:1 (a note)", Mode::Shared)
        );
        let left = r.window.unwrap().left().unwrap();
        assert!(left > Duration::from_secs(59) && left <= hold, "{left:?}");
        end_window(&f, &read_record(&f).unwrap()).unwrap();
        let r = read_record(&f).unwrap();
        assert!(r.window.is_none() && r.token == 7);
        // One that began long enough ago is over.
        let past = Window::new(
            Boot::now().sub(Duration::from_secs(61)),
            now_since_epoch() - Duration::from_secs(61),
            hold,
        );
        assert_eq!(past.left(), None);
    }

    #[test]
    fn a_preemption_mark_stops_only_the_holders_of_its_moment() {
        let (_dir, f) = scratch();
        write_record(&f, 7, "h:1 (old)", Mode::Exclusive, None).unwrap();
        let before = Boot::now();
        std::thread::sleep(Duration::from_millis(2));
        let mark = Preempt::now(7, "h:2 (new)");
        write_preempt(&f, &mark).unwrap();
        // The record beside it reads (and is rewritten) as before.
        assert_eq!(read_record(&f).unwrap().label, "h:1 (old)");
        write_record(&f, 8, "h:3 (later)", Mode::Exclusive, None).unwrap();
        let read = read_preempt(&f).unwrap();
        assert_eq!(read, mark);
        assert_eq!(read.by, "h:2 (new)");
        assert!(read.stops(7, before), "the holder of its moment");
        std::thread::sleep(Duration::from_millis(2));
        assert!(!read.stops(8, Boot::now()), "a later holder");
        // Under another boot, the token decides.
        let mut other = read.clone();
        other.boot = "0".repeat(16);
        assert!(other.stops(7, Boot::now()) && !other.stops(8, before));
        // A file with no mark, or half of one, has none.
        let (_dir, g) = scratch();
        write_record(&g, 1, "h:1", Mode::Exclusive, None).unwrap();
        assert_eq!(read_preempt(&g), None);
        rustix::io::pwrite(&g, b"preempt upto=1 boot=", MARK_AT).unwrap();
        assert_eq!(read_preempt(&g), None);
    }

    #[test]
    fn under_another_boot_the_wall_clock_keeps_a_window() {
        let hold = Duration::from_secs(3600);
        let mut w = Window::new(Boot::now(), now_since_epoch(), hold);
        // Written before a reboot, or by another host sharing the directory:
        // its wall time holds, however long this host has been up.
        w.boot = "0".repeat(16);
        let left = w.left().expect("the window holds");
        assert!(left > Duration::from_secs(3590) && left <= hold, "{left:?}");
        // Never longer than the window itself, whatever the wall time says.
        w.until_wall_ms = ms(now_since_epoch()) + 10 * 3_600_000;
        assert_eq!(w.left(), Some(hold));
        // A wall time already past ends it, whatever the boot clock says.
        w.until_wall_ms = 1;
        assert_eq!(w.left(), None);
        assert!(Window::decode("1,zz,3,4").is_none());
        assert!(Window::decode("1,ab,3").is_none());
    }
}
