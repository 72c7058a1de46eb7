//! What the server granted each of our sessions when it last connected.
//! ZooKeeper negotiates a session's timeout again on every reconnect (a
//! server restarted with a smaller maxSessionTimeout, a rolling change of
//! tickTime), and the lease is what it grants now; but the client says
//! only what the first connect got (`session_timeout()`). It does log
//! every connect reply it takes, at debug level through `tracing`: a
//! collector of our own, on the thread that runs the session, reads the
//! timeout out of that line, by session.
//!
//! A client that logs the reply otherwise leaves our sessions with no
//! timeout seen: `Client::connect` then refuses to go on (a failure of
//! lockrun's own), and a renewal that finds none ends the lease.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_core::field::{Field, Visit};
use tracing_core::span::{Attributes, Id, Record};
use tracing_core::subscriber::{Interest, Subscriber};
use tracing_core::{Dispatch, Event, Level, LevelFilter, Metadata};

/// Session timeouts as granted, by session id: the last connect's; and
/// the sessions whose every later connect must be told at once.
#[derive(Clone, Default)]
pub struct Granted {
    seen: Arc<Mutex<HashMap<i64, Duration>>>,
    wakes: Arc<Mutex<HashMap<i64, OwnedFd>>>,
}

impl Granted {
    /// What the server granted `session` when it last connected.
    pub fn get(&self, session: i64) -> Option<Duration> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(&session).copied()
    }

    /// A descriptor that becomes readable each time `session` connects
    /// again from now on (its timeout was negotiated anew): a lease on it
    /// is renewed at once, so its deadline follows what was granted. A
    /// lease that counts on `lasting` and whose session already connected
    /// again with less (between the grant and now) is woken at once too.
    pub fn wake_on_connect(&self, session: i64, lasting: Duration) -> std::io::Result<OwnedFd> {
        use rustix::pipe::{PipeFlags, pipe_with};
        let (rx, tx) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let mut wakes = self.wakes.lock().unwrap_or_else(|e| e.into_inner());
        if self.get(session).is_some_and(|now| now < lasting) {
            let _ = rustix::io::write(&tx, &[1]);
        }
        wakes.insert(session, tx);
        Ok(rx)
    }

    fn note(&self, session: i64, timeout: Duration) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.insert(session, timeout);
        drop(seen);
        let mut wakes = self.wakes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = wakes.get(&session) {
            // A full pipe already says "renew"; a closed one has nobody
            // left to tell.
            if let Err(rustix::io::Errno::PIPE) = rustix::io::write(tx, &[1]) {
                wakes.remove(&session);
            }
        }
    }

    /// The collector to make the default of the thread that runs the
    /// client's sessions.
    pub fn collector(&self) -> Dispatch {
        Dispatch::new(Collector(self.clone()))
    }
}

/// The line the client logs for every connect reply: the session it
/// names and its timeout in milliseconds.
fn reply(line: &str) -> Option<(i64, u64)> {
    let fields = line.strip_prefix("received connect response: ConnectResponse {")?;
    let number = |name: &str| -> Option<&str> {
        let key = format!(" {name}: ");
        let at = fields.find(&key)? + key.len();
        let rest = &fields[at..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '-'))
            .unwrap_or(rest.len());
        Some(&rest[..end])
    };
    let session = number("session_id")?.parse().ok()?;
    let timeout = number("session_timeout")?.parse().ok()?;
    Some((session, timeout))
}

/// Only the client's debug events are of interest.
fn wanted(meta: &Metadata<'_>) -> bool {
    meta.is_event()
        && *meta.level() == Level::DEBUG
        && meta.target().starts_with("zookeeper_client")
}

struct Collector(Granted);

/// An event's message, as text.
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Collector {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if wanted(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        wanted(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::DEBUG)
    }

    fn event(&self, event: &Event<'_>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        if let Some((session, ms)) = reply(&m.0) {
            self.0.note(session, Duration::from_millis(ms));
        }
    }

    // No span is ever enabled.
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: &OwnedFd) -> bool {
        let mut buf = [0u8; 8];
        matches!(rustix::io::read(fd, &mut buf), Ok(n) if n > 0)
    }

    #[test]
    fn a_shorter_session_granted_before_the_watch_wakes_it_at_once() {
        let g = Granted::default();
        let s = Duration::from_secs;
        // Granted 30 s; the session connected again with 3 s before the
        // lease's renewals began to watch it.
        g.note(7, s(30));
        g.note(7, s(3));
        assert!(readable(&g.wake_on_connect(7, s(30)).unwrap()));
        // A session still granted what the lease counts on is not woken
        // until it connects again.
        g.note(8, s(30));
        let w = g.wake_on_connect(8, s(30)).unwrap();
        assert!(!readable(&w));
        g.note(8, s(30));
        assert!(readable(&w));
    }

    #[test]
    fn the_connect_reply_names_its_session_and_timeout() {
        let line = "received connect response: ConnectResponse { protocol_version: 0, \
                    session_timeout: 3000, session_id: 72057594037927937, readonly: false }";
        assert_eq!(reply(line), Some((72057594037927937, 3000)));
        let negative = "received connect response: ConnectResponse { protocol_version: 0, \
                        session_timeout: 12000, session_id: -5, readonly: true }";
        assert_eq!(reply(negative), Some((-5, 12000)));
        for other in [
            "got ping response after 3ms",
            "received connect response: ConnectResponse { protocol_version: 0 }",
            "received connect response: ConnectResponse { session_timeout: x, session_id: 1 }",
        ] {
            assert_eq!(reply(other), None, "{other}");
        }
    }
}
