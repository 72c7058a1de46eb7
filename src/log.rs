//! Progress and warning lines on stderr, timestamped, with secrets scrubbed.
//! While a job runs, lines go through a writer thread so that a job that
//! fills stderr can never block the supervisor.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

static LEVEL: AtomicU8 = AtomicU8::new(1);
static ASYNC: AtomicBool = AtomicBool::new(false);
static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static QUEUE: OnceLock<Mutex<Option<Queue>>> = OnceLock::new();

struct Queue {
    tx: SyncSender<String>,
    done: Receiver<()>,
}

/// 0: errors only (-q); 1: warnings (default); 2: progress (-v); 3: every renewal (-vv).
pub fn set_level(level: u8) {
    LEVEL.store(level, Ordering::Relaxed);
}

pub fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

/// Never print this string (a password, the owner value).
pub fn add_secret(s: &str) {
    if !s.is_empty() {
        SECRETS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(s.to_string());
    }
}

/// Replace every registered secret in `s`, and show what a server may
/// have put in it (a label, an error's text) on one line, escaped.
pub fn scrub(s: &str) -> String {
    let secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = s.to_string();
    for secret in secrets.iter() {
        out = out.replace(secret.as_str(), "***");
    }
    crate::text::printable(&out).into_owned()
}

fn line(msg: &str) -> String {
    let now = humantime::format_rfc3339_millis(SystemTime::now());
    format!("{now} lockrun: {}\n", scrub(msg))
}

fn emit(text: String) {
    if ASYNC.load(Ordering::Relaxed) {
        let q = QUEUE.get_or_init(|| Mutex::new(spawn_writer()));
        let guard = q.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(queue) = guard.as_ref() {
            // Drop the line rather than block when the writer is stuck.
            let _ = queue.tx.try_send(text);
            return;
        }
    }
    let _ = std::io::stderr().write_all(text.as_bytes());
}

fn spawn_writer() -> Option<Queue> {
    let (tx, rx) = sync_channel::<String>(256);
    let (done_tx, done) = sync_channel::<()>(1);
    std::thread::Builder::new()
        .name("lockrun-log".into())
        .spawn(move || {
            let mut err = std::io::stderr();
            for text in rx {
                let _ = err.write_all(text.as_bytes());
            }
            let _ = done_tx.send(());
        })
        .ok()?;
    Some(Queue { tx, done })
}

/// Progress line, shown with -v.
pub fn info(msg: impl AsRef<str>) {
    if level() >= 2 {
        emit(line(msg.as_ref()));
    }
}

/// Detail line, shown with -vv.
pub fn debug(msg: impl AsRef<str>) {
    if level() >= 3 {
        emit(line(msg.as_ref()));
    }
}

/// Warning, shown unless -q.
pub fn warn(msg: impl AsRef<str>) {
    if level() >= 1 {
        emit(line(&format!("warning: {}", msg.as_ref())));
    }
}

/// A warning that shows even under -q (the job's result may be unsafe to trust).
pub fn alert(msg: impl AsRef<str>) {
    emit(line(&format!("warning: {}", msg.as_ref())));
}

/// The reason for lockrun's exit code, shown even under -q.
pub fn reason(msg: impl AsRef<str>) {
    emit(line(msg.as_ref()));
}

/// From now on, write through a background thread, started on the first line
/// (most runs print nothing and never pay for the thread).
pub fn start_async() {
    ASYNC.store(true, Ordering::Relaxed);
}

/// Back to direct writes; waits a bounded time for queued lines to drain.
pub fn stop_async() {
    ASYNC.store(false, Ordering::Relaxed);
    let Some(q) = QUEUE.get() else { return };
    let queue = q.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(Queue { tx, done }) = queue {
        drop(tx);
        let _ = done.recv_timeout(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_scrubbed() {
        add_secret("hunter2");
        assert_eq!(
            scrub("redis://u:hunter2@h failed"),
            "redis://u:***@h failed"
        );
    }
}
