//! `--metrics-file`: at the end of every run, a Prometheus text file for
//! node_exporter's textfile collector, replaced in one rename so that the
//! collector never reads half of one (lockrun(1) "Metrics").

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::clock::Boot;
use crate::log;

/// What one run did, noted as it goes.
#[derive(Debug)]
pub struct Run {
    started: Boot,
    /// When the lease was granted, and its token.
    granted: Option<(Boot, u64)>,
    /// The lease was lost while the job ran.
    pub lost: bool,
}

impl Run {
    pub fn start() -> Run {
        Run {
            started: Boot::now(),
            granted: None,
            lost: false,
        }
    }

    pub fn granted(&mut self, token: u64) {
        self.granted = Some((Boot::now(), token));
    }

    /// The file's text for a run of `name` that ended now with `code`;
    /// `earlier`: the file as the run before left it.
    fn text(&self, name: &str, label: Option<&str>, code: u8, earlier: &str) -> String {
        let now = Boot::now();
        let end = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        let wait = self.granted.map_or(now, |(at, _)| at).since(self.started);
        let hold = self.granted.map_or(Duration::ZERO, |(at, _)| now.since(at));
        let labels = match label {
            Some(l) => format!("name=\"{}\",label=\"{}\"", escape(name), escape(l)),
            None => format!("name=\"{}\"", escape(name)),
        };
        let mut out = String::new();
        let mut gauge = |metric: &str, help: &str, value: String| {
            out.push_str(&format!(
                "# HELP lockrun_last_run_{metric} {help}\n\
                 # TYPE lockrun_last_run_{metric} gauge\n\
                 lockrun_last_run_{metric}{{{labels}}} {value}\n"
            ));
        };
        gauge(
            "end_time_seconds",
            "When the last run ended, in seconds since the Unix epoch.",
            format!("{:.3}", end.as_secs_f64()),
        );
        gauge(
            "acquired",
            "1 if the last run got the lock, 0 if it did not (held, or an error before).",
            u8::from(self.granted.is_some()).to_string(),
        );
        gauge(
            "wait_seconds",
            "How long the last run waited for the lock (until it got it or gave up).",
            format!("{:.6}", wait.as_secs_f64()),
        );
        gauge(
            "hold_seconds",
            "How long the last run held the lock (0 if it did not get it).",
            format!("{:.6}", hold.as_secs_f64()),
        );
        gauge(
            "exit_code",
            "The exit code lockrun ended with: the job's own when it ran to its end.",
            code.to_string(),
        );
        gauge(
            "lease_lost",
            "1 if the lease was lost during the last run and the job was stopped.",
            u8::from(self.lost).to_string(),
        );
        // A run that was skipped keeps the time of the last one that got
        // the lock: "has not run for a day" is one comparison, also when
        // several hosts share the name and most of their runs are skips.
        let acquired_at = if self.granted.is_some() {
            Some(format!("{:.3}", end.as_secs_f64()))
        } else {
            carried(earlier, name)
        };
        if let Some(at) = acquired_at {
            gauge(
                "acquired_time_seconds",
                "When the last run that got the lock ended (kept across runs that did not).",
                at,
            );
        }
        if let Some((_, token)) = self.granted {
            gauge(
                "token",
                "The fencing token of the last run's grant.",
                token.to_string(),
            );
        }
        out
    }

    /// Replace `path` with this run's metrics. A failure is one warning:
    /// the metrics never change the job or the exit code.
    pub fn write(&self, path: &Path, name: &str, label: Option<&str>, code: u8) {
        let earlier = read_small(path).unwrap_or_default();
        if let Err(e) = replace(path, &self.text(name, label, code, &earlier)) {
            log::alert(format!(
                "cannot write the metrics file {}: {e}",
                path.display()
            ));
        }
    }
}

/// The file a run before left, if it is one of ours in size: a regular
/// file, not followed through a link, opened without blocking (a FIFO
/// planted at the path would otherwise hold lockrun up for ever).
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(64 << 10).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The last acquired time an earlier file recorded for `name`.
fn carried(earlier: &str, name: &str) -> Option<String> {
    let start = format!(
        "lockrun_last_run_acquired_time_seconds{{name=\"{}\"",
        escape(name)
    );
    earlier.lines().find_map(|l| {
        let rest = l.strip_prefix(&start)?;
        // The value follows the last `} `: a label may hold one itself.
        let (_, value) = rest.rsplit_once("} ")?;
        let v = value.trim();
        v.parse::<f64>()
            .is_ok_and(f64::is_finite)
            .then(|| v.to_string())
    })
}

/// Label values are quoted; backslash, quote and newline are escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Write `text` beside `path` under a name the collector skips (it reads
/// only `*.prom`), then rename it over `path`: a reader sees the old file
/// or the new one, never a part.
fn replace(path: &Path, text: &str) -> std::io::Result<()> {
    let file = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not the path of a file"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = dir.join(tmp_name);
    // A new file of our own, never one found there (planted, in a shared
    // directory); one left by a run that died with our pid goes first.
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
    };
    let file = match create() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp)?;
            create()
        }
        other => other,
    }?;
    let written = (|| {
        let mut f = file;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
    }

    #[test]
    fn a_skipped_run_has_no_token_and_no_hold() {
        let run = Run::start();
        let t = run.text("report", None, 75, "");
        assert!(
            t.contains("lockrun_last_run_acquired{name=\"report\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("lockrun_last_run_exit_code{name=\"report\"} 75\n"),
            "{t}"
        );
        assert!(t.contains("lockrun_last_run_hold_seconds{name=\"report\"} 0.000000\n"));
        assert!(!t.contains("token"), "{t}");
    }

    #[test]
    fn a_run_that_held_says_so_with_its_label() {
        let mut run = Run::start();
        run.granted(42);
        let t = run.text("report", Some("ci 7"), 0, "");
        assert!(
            t.contains("lockrun_last_run_token{name=\"report\",label=\"ci 7\"} 42\n"),
            "{t}"
        );
        assert!(t.contains("lockrun_last_run_acquired{name=\"report\",label=\"ci 7\"} 1\n"));
    }

    #[test]
    fn a_skip_keeps_the_time_of_the_last_run_that_held() {
        let mut held = Run::start();
        held.granted(7);
        let first = held.text("report", Some("a"), 0, "");
        let at = carried(&first, "report").expect("written");
        let skipped = Run::start().text("report", Some("b"), 75, &first);
        assert!(
            skipped.contains(&format!(
                "lockrun_last_run_acquired_time_seconds{{name=\"report\",label=\"b\"}} {at}\n"
            )),
            "{skipped}"
        );
        // Another name's file, or none, carries nothing.
        assert!(carried(&first, "other").is_none());
        assert!(
            !Run::start()
                .text("report", None, 75, "")
                .contains("acquired_time")
        );
    }

    #[test]
    fn a_label_holding_a_brace_keeps_the_carried_time() {
        let mut held = Run::start();
        held.granted(7);
        let first = held.text("report", Some("x} 1"), 0, "");
        assert!(carried(&first, "report").is_some(), "{first}");
    }

    #[test]
    fn a_fifo_at_the_path_is_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("m.prom");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Returns at once with nothing (it would block for ever on a FIFO).
        assert_eq!(read_small(&fifo), None);
        let link = dir.path().join("l.prom");
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        assert_eq!(read_small(&link), None);
    }

    #[test]
    fn the_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.prom");
        replace(&path, "a 1\n").unwrap();
        replace(&path, "b 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b 2\n");
        // Nothing else is left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(replace(&dir.path().join("no/such/dir.prom"), "x").is_err());
    }
}
