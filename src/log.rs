//! Progress and warning lines on stderr, timestamped, each on one line.
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

/// Never print this string (a password, the owner value): what a client
/// library or a server says is cleared of it by [`redact`].
pub fn add_secret(s: &str) {
    if !s.is_empty() {
        SECRETS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(s.to_string());
    }
}

/// What a client library or a server said (an error's text, a reply),
/// ready to print: every registered secret that stands on its own in it
/// (not inside a longer word, so that a short password leaves the words
/// around it alone) replaced, on one line, escaped. Only for such text:
/// lockrun's own words and addresses (shown without their password) go
/// through [`printable`].
pub fn redact(s: &str) -> String {
    let secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = s.to_string();
    for secret in secrets.iter() {
        out = without(&out, secret);
    }
    printable(&out)
}

/// `text` with each occurrence of `secret` that no letter or digit touches
/// replaced.
fn without(text: &str, secret: &str) -> String {
    let word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    let mut out = String::with_capacity(text.len());
    let mut rest = 0;
    for (at, _) in text.match_indices(secret) {
        let end = at + secret.len();
        if at < rest || word(text[..at].chars().next_back()) || word(text[end..].chars().next()) {
            continue;
        }
        out.push_str(&text[rest..at]);
        out.push_str("***");
        rest = end;
    }
    out.push_str(&text[rest..]);
    out
}

/// A line to print: on one line, and what a server may have put in it (a
/// label, a name) shown escaped. Nothing in it is masked: a secret never
/// gets this far.
pub fn printable(s: &str) -> String {
    crate::text::printable(s).into_owned()
}

fn line(msg: &str) -> String {
    let now = humantime::format_rfc3339_millis(SystemTime::now());
    format!("{now} lockrun: {}\n", printable(msg))
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
    fn a_secret_is_redacted_where_it_stands_alone() {
        add_secret("hunter2");
        add_secret("ok");
        assert_eq!(
            redact("redis://u:hunter2@h failed"),
            "redis://u:***@h failed"
        );
        assert_eq!(
            redact("password=ok; connection broken: ok"),
            "password=***; connection broken: ***"
        );
        assert_eq!(printable("ok tokens"), "ok tokens");
    }
}
