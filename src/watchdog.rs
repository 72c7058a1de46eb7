//! The watchdog: a thread that renews a lease as its engine says (on a
//! connection of its own, or on the one the lease lives on) and tells the
//! supervisor when it is renewed, retried or lost.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, poll};

use crate::backend::{Error, Fresh, Renewal, Renewer, Renewing};
use crate::clock::{Boot, BootTimer, backoff};
use crate::schedule::Timing;

/// The lease deadline, shared between the watchdog (writer) and the
/// supervisor, and told to a watcher (the guard) the moment it moves.
pub struct Deadline {
    at: AtomicU64,
    watcher: OnceLock<Box<dyn Fn(Boot) + Send + Sync>>,
}

impl Deadline {
    pub fn new(at: Boot) -> Deadline {
        Deadline {
            at: AtomicU64::new(at.nanos()),
            watcher: OnceLock::new(),
        }
    }
    pub fn get(&self) -> Boot {
        Boot::from_nanos(self.at.load(Ordering::SeqCst))
    }
    fn set(&self, at: Boot) {
        self.at.store(at.nanos(), Ordering::SeqCst);
        if let Some(tell) = self.watcher.get() {
            tell(at);
        }
    }
    /// From now on, `tell` hears of every new deadline, on the thread that
    /// set it, so that nothing else lockrun does can delay the news.
    pub fn watch(&self, tell: impl Fn(Boot) + Send + Sync + 'static) {
        let _ = self.watcher.set(Box::new(tell));
    }
}

impl std::fmt::Debug for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Deadline").field(&self.get()).finish()
    }
}

/// What the watchdog tells the supervisor.
#[derive(Debug)]
pub enum Event {
    Renewed {
        took: Duration,
    },
    Retrying {
        error: String,
    },
    /// Final: the supervisor must stop the job.
    Lost {
        reason: String,
    },
}

/// Wait until `at` on the boot clock, until `stop` becomes readable or
/// hung up, or until the renewer's `wake` (if it gave one) becomes
/// readable: then the renewal is due at once. Returns true when asked to
/// stop.
fn wait_until(
    timer: &BootTimer,
    stop: BorrowedFd<'_>,
    wake: &mut Option<BorrowedFd<'_>>,
    at: Boot,
) -> bool {
    if timer.arm(at).is_err() {
        // Without a timer we cannot wait safely; stopping early is the safe side.
        return true;
    }
    loop {
        if Boot::now() >= at {
            return false;
        }
        let mut fds = vec![
            PollFd::from_borrowed_fd(stop, PollFlags::IN),
            PollFd::from_borrowed_fd(timer.fd(), PollFlags::IN),
        ];
        if let Some(w) = *wake {
            fds.push(PollFd::from_borrowed_fd(w, PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Ok(_) => {
                if !fds[0].revents().is_empty() {
                    return true;
                }
                if fds.get(2).is_some_and(|w| !w.revents().is_empty()) {
                    drop(fds);
                    if wake.is_some_and(drain) {
                        return false;
                    }
                    // Hung up with nothing to read: nobody is left to ask.
                    *wake = None;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
    }
}

/// Read a non-blocking wake descriptor empty: one renewal answers every
/// wake that came before it. False when there was nothing to read (its
/// writer is gone).
pub fn drain(fd: BorrowedFd<'_>) -> bool {
    let mut buf = [0u8; 64];
    let mut any = false;
    while matches!(rustix::io::read(fd, &mut buf), Ok(n) if n > 0) {
        any = true;
    }
    any
}

/// The running watchdog. Stopping it never waits for it: a renewal in
/// flight may be stuck in name resolution or a trickling reply.
pub struct Watchdog {
    stop: Option<OwnedFd>,
}

impl Watchdog {
    /// Start renewing now (the first renewal is due). `deadline` is None for a
    /// lease that cannot expire (it is only checked, never extended).
    /// `renew_now`, when the renewer gave one (`Renewing::wake`), becomes
    /// readable when a renewal is due at once, before its time.
    pub fn spawn(
        renewing: Renewing,
        timing: Timing,
        deadline: Option<Arc<Deadline>>,
        events: Sender<Event>,
        wake: UnixStream,
        renew_now: Option<OwnedFd>,
    ) -> std::io::Result<Watchdog> {
        let (stop_rx, stop_tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let timer = BootTimer::new()?;
        std::thread::Builder::new()
            .name("lockrun-watchdog".into())
            .spawn(move || {
                let mut wake = wake;
                let mut send = |ev: Event| {
                    let _ = events.send(ev);
                    // Non-blocking: a full wake socket already means "look".
                    let _ = wake.write(&[1]);
                };
                renew_loop(
                    renewing,
                    &timing,
                    deadline.as_deref(),
                    &timer,
                    (stop_rx.as_fd(), renew_now.as_ref().map(|w| w.as_fd())),
                    &mut send,
                );
            })?;
        Ok(Watchdog {
            stop: Some(stop_tx),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // The thread sees the pipe close and ends after its current attempt;
        // nobody waits for that.
        self.stop.take();
    }
}

/// How one renewal attempt ended.
enum Attempt {
    Done(Result<Renewal, Error>),
    /// It did not finish within its bound; it was left to finish on its own.
    Abandoned,
}

/// What a renewal thread hands back: its answer and the renewer, with
/// whatever connection it has, for the next attempt.
type Answer = (Result<Renewal, Error>, Box<dyn Renewer>);

/// The renewers of one lease, between attempts.
struct Renewers {
    /// The renewer the next attempt uses, when the last one came back.
    idle: Option<Box<dyn Renewer>>,
    /// An attempt that overran its bound and is still out there, and when
    /// it was sent.
    out: Option<(Receiver<Answer>, Boot)>,
    /// Where a new renewer comes from, for a lease any connection can
    /// renew; None when only the lease's own connection can.
    fresh: Option<Fresh>,
}

impl Renewers {
    fn new(renewing: Renewing) -> Renewers {
        let (idle, fresh) = match renewing {
            Renewing::Anywhere(fresh) => (Some(fresh()), Some(fresh)),
            Renewing::OnItsConnection(r) => (Some(r), None),
        };
        Renewers {
            idle,
            out: None,
            fresh,
        }
    }

    /// One whole renewal attempt (name resolution, connect, handshake,
    /// script reload, call) on a thread of its own, waited for at most
    /// `limit`. A lease any connection can renew starts over on a fresh
    /// renewer after an abandoned attempt; one that lives on its connection
    /// waits on for the attempt still out, the only one that can renew it.
    /// The attempt's answer comes back with when its request was sent: for
    /// an attempt still out from before, that is when it started, not now.
    fn attempt(&mut self, limit: Duration) -> (Attempt, Boot) {
        let now = Boot::now();
        let rx = match (self.idle.take(), self.out.take(), &self.fresh) {
            (Some(renewer), _, _) => self.start(renewer).map(|rx| (rx, now)),
            (None, Some(out), None) => Ok(out),
            (None, _, Some(fresh)) => self.start(fresh()).map(|rx| (rx, now)),
            (None, None, None) => Err(Error::Internal(
                "the renewal on the lease's own connection ended without an answer".into(),
            )),
        };
        let (rx, sent_at) = match rx {
            Ok(out) => out,
            Err(e) => return (Attempt::Done(Err(e)), now),
        };
        let attempt = match rx.recv_timeout(limit) {
            Ok((r, renewer)) => {
                self.idle = Some(renewer);
                Attempt::Done(r)
            }
            Err(RecvTimeoutError::Timeout) => {
                self.out = Some((rx, sent_at));
                Attempt::Abandoned
            }
            Err(RecvTimeoutError::Disconnected) => Attempt::Done(Err(Error::Internal(
                "the renewal ended without an answer".into(),
            ))),
        };
        (attempt, sent_at)
    }

    fn start(&self, mut renewer: Box<dyn Renewer>) -> Result<Receiver<Answer>, Error> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("lockrun-renew".into())
            .spawn(move || {
                let r = renewer.renew();
                let _ = tx.send((r, renewer));
            })
            .map_err(|e| Error::Internal(format!("cannot start a thread: {e}")))?;
        Ok(rx)
    }
}

/// Why a renewal error ends the lease, when it does: anything but a
/// transient error is the engine's final answer, and retrying it until the
/// deadline would only keep the job running on a lease nobody renews.
fn final_error(e: &Error) -> Option<String> {
    match e {
        // A full server is an outage: a connection may be free by the
        // next attempt.
        Error::Transient(_) | Error::Full(_) => None,
        Error::Refused(m) => Some(format!("the server refused the renewal: {m}")),
        Error::Request(m) | Error::Internal(m) => Some(format!("the renewal failed: {m}")),
    }
}

/// Why a lease that no renewal moved in time was lost: the last attempt's
/// failure when there was one (no answer, a refused connection, the
/// server's error).
pub fn lost_in_time(last_failure: Option<&str>) -> String {
    match last_failure {
        Some(e) => format!("could not renew the lease in time (last attempt: {e})"),
        None => "could not renew the lease in time".into(),
    }
}

fn renew_loop(
    renewing: Renewing,
    timing: &Timing,
    deadline: Option<&Deadline>,
    timer: &BootTimer,
    (stop, mut wake): (BorrowedFd<'_>, Option<BorrowedFd<'_>>),
    send: &mut dyn FnMut(Event),
) {
    let mut renewers = Renewers::new(renewing);
    let mut failures: u32 = 0;
    let mut last_failure: Option<String> = None;
    loop {
        let current = deadline.map(Deadline::get);
        let now = Boot::now();
        if let Some(c) = current
            && now > timing.last_attempt(c)
        {
            send(Event::Lost {
                reason: lost_in_time(last_failure.as_deref()),
            });
            return;
        }
        let limit = match current {
            Some(c) => timing.op.min(timing.lost_at(c).since(now)),
            None => timing.op,
        };
        let (attempt, sent_at) = renewers.attempt(limit);
        let error = match attempt {
            Attempt::Done(Ok(Renewal::Renewed { ttl })) => {
                failures = 0;
                // A late success cannot undo "lost": the supervisor also checks
                // the deadline it had, and lost is final there.
                if let Some(d) = deadline {
                    d.set(timing.deadline_for(sent_at, ttl));
                }
                send(Event::Renewed {
                    took: Boot::now().since(sent_at),
                });
                if wait_until(timer, stop, &mut wake, sent_at.add(timing.renew_every)) {
                    return;
                }
                continue;
            }
            Attempt::Done(Ok(Renewal::Preempted { by })) => {
                send(Event::Lost {
                    reason: format!("preempted by {by} (--preempt)"),
                });
                return;
            }
            Attempt::Done(Ok(Renewal::Lost)) => {
                send(Event::Lost {
                    reason: "the lease is no longer ours (deleted, expired or taken over)".into(),
                });
                return;
            }
            Attempt::Done(Err(e)) => match final_error(&e) {
                Some(reason) => {
                    send(Event::Lost { reason });
                    return;
                }
                None => e.to_string(),
            },
            Attempt::Abandoned => format!(
                "no answer within {}",
                crate::text::duration(Duration::from_millis(limit.as_millis() as u64))
            ),
        };
        failures += 1;
        last_failure = Some(error.clone());
        send(Event::Retrying { error });
        let cap = (timing.renew_every / 4).max(Duration::from_millis(10));
        let mut retry_at = Boot::now().add(backoff(failures, Duration::from_millis(20), cap));
        if let Some(c) = current {
            retry_at = retry_at.min(timing.last_attempt(c));
        }
        if wait_until(timer, stop, &mut wake, retry_at) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grants a fixed ttl on every renewal.
    struct Grants(Duration);

    impl Renewer for Grants {
        fn renew(&mut self) -> Result<Renewal, Error> {
            Ok(Renewal::Renewed { ttl: self.0 })
        }
    }

    /// Answers each renewal with the next of `answers`, after `delay`.
    struct Says {
        answers: Vec<Result<Renewal, Error>>,
        delay: Duration,
        calls: Arc<AtomicU64>,
    }

    impl Renewer for Says {
        fn renew(&mut self) -> Result<Renewal, Error> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(self.delay);
            // The last answer stands for every later renewal.
            if self.answers.len() > 1 {
                self.answers.remove(0)
            } else {
                self.answers[0].clone()
            }
        }
    }

    fn watch(renewing: Renewing, timing: Timing) -> (Watchdog, std::sync::mpsc::Receiver<Event>) {
        let deadline = Arc::new(Deadline::new(Boot::now().add(timing.ttl)));
        let (tx, rx) = std::sync::mpsc::channel();
        let (_wake_rx, wake_tx) = UnixStream::pair().unwrap();
        wake_tx.set_nonblocking(true).unwrap();
        let w = Watchdog::spawn(renewing, timing, Some(deadline), tx, wake_tx, None).unwrap();
        (w, rx)
    }

    #[test]
    fn a_refused_renewal_ends_the_lease_at_once_and_says_why() {
        let timing = Timing::new(Duration::from_secs(30), None).unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let mine = Arc::clone(&calls);
        let (_w, rx) = watch(
            Renewing::Anywhere(Box::new(move || {
                Box::new(Says {
                    answers: vec![Err(Error::Refused("NOPERM no evalsha".into()))],
                    delay: Duration::ZERO,
                    calls: Arc::clone(&mine),
                })
            })),
            timing,
        );
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let Event::Lost { reason } = ev else {
            panic!("{ev:?}")
        };
        assert!(reason.contains("refused the renewal: NOPERM"), "{reason}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "retried a refusal");
    }

    #[test]
    fn a_transient_error_is_retried() {
        let timing = Timing::new(Duration::from_secs(30), None).unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let (_w, rx) = watch(
            Renewing::OnItsConnection(Box::new(Says {
                answers: vec![
                    Err(Error::Transient("connection reset".into())),
                    Ok(Renewal::Renewed { ttl: timing.ttl }),
                ],
                delay: Duration::ZERO,
                calls: Arc::clone(&calls),
            })),
            timing,
        );
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Retrying { .. }), "{ev:?}");
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Renewed { .. }), "{ev:?}");
    }

    #[test]
    fn a_lease_on_its_own_connection_waits_on_for_a_slow_renewal() {
        // op is 500 ms here; the one renewer answers after 800 ms. Another
        // renewer could not renew a session: the same attempt is waited for.
        let timing = Timing::new(Duration::from_secs(3), None).unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let (_w, rx) = watch(
            Renewing::OnItsConnection(Box::new(Says {
                answers: vec![Ok(Renewal::Renewed { ttl: timing.ttl })],
                delay: timing.op + Duration::from_millis(300),
                calls: Arc::clone(&calls),
            })),
            timing,
        );
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Retrying { .. }), "{ev:?}");
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Renewed { .. }), "{ev:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_renewal_waited_on_counts_from_when_it_was_sent() {
        // op is 500 ms; the renewal on the lease's own connection answers
        // after 800 ms, during the second attempt that waits on for it. The
        // lease runs from the first attempt's request, not the second's.
        let timing = Timing::new(Duration::from_secs(3), None).unwrap();
        let before = Boot::now();
        let deadline = Arc::new(Deadline::new(before.add(timing.ttl)));
        let (tx, rx) = std::sync::mpsc::channel();
        let (_wake_rx, wake_tx) = UnixStream::pair().unwrap();
        wake_tx.set_nonblocking(true).unwrap();
        let _w = Watchdog::spawn(
            Renewing::OnItsConnection(Box::new(Says {
                answers: vec![Ok(Renewal::Renewed { ttl: timing.ttl })],
                delay: timing.op + Duration::from_millis(300),
                calls: Arc::new(AtomicU64::new(0)),
            })),
            timing,
            Some(Arc::clone(&deadline)),
            tx,
            wake_tx,
            None,
        )
        .unwrap();
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Retrying { .. }), "{ev:?}");
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Renewed { .. }), "{ev:?}");
        let latest = timing
            .deadline_for(before, timing.ttl)
            .add(Duration::from_millis(100));
        assert!(
            deadline.get() <= latest,
            "the deadline is {:?} past the first request's",
            deadline
                .get()
                .since(timing.deadline_for(before, timing.ttl))
        );
    }

    #[test]
    fn the_deadline_counts_from_what_the_server_granted() {
        let timing = Timing::new(Duration::from_secs(3), None).unwrap();
        let start = Boot::now();
        let deadline = Arc::new(Deadline::new(start.add(timing.ttl)));
        let (tx, rx) = std::sync::mpsc::channel();
        let (_wake_rx, wake_tx) = UnixStream::pair().unwrap();
        wake_tx.set_nonblocking(true).unwrap();
        // The server grants 2 s where 3 s were asked: the deadline moves in.
        let _w = Watchdog::spawn(
            Renewing::Anywhere(Box::new(|| Box::new(Grants(Duration::from_secs(2))))),
            timing,
            Some(Arc::clone(&deadline)),
            tx,
            wake_tx,
            None,
        )
        .unwrap();
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Renewed { .. }), "{ev:?}");
        let d = deadline.get();
        assert!(d <= Boot::now().add(Duration::from_secs(2)), "{d:?}");
        assert!(
            d >= start.add(Duration::from_secs(2)).sub(timing.drift),
            "{d:?}"
        );
    }

    #[test]
    fn a_wake_renews_at_once_and_a_hung_up_one_is_let_go() {
        // ttl 30 s: renewals 10 s apart, unless the renewer's wake asks.
        let timing = Timing::new(Duration::from_secs(30), None).unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let (wake_rx, wake_tx) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )
        .unwrap();
        let deadline = Arc::new(Deadline::new(Boot::now().add(timing.ttl)));
        let (tx, rx) = std::sync::mpsc::channel();
        let (_sup_rx, sup_tx) = UnixStream::pair().unwrap();
        sup_tx.set_nonblocking(true).unwrap();
        let _w = Watchdog::spawn(
            Renewing::OnItsConnection(Box::new(Says {
                answers: vec![Ok(Renewal::Renewed { ttl: timing.ttl })],
                delay: Duration::ZERO,
                calls: Arc::clone(&calls),
            })),
            timing,
            Some(deadline),
            tx,
            sup_tx,
            Some(wake_rx),
        )
        .unwrap();
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Renewed { .. }), "{ev:?}");
        rustix::io::write(&wake_tx, &[1]).unwrap();
        let ev = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(ev, Event::Renewed { .. }), "{ev:?}");
        // The writer gone: no renewal storm, the schedule stands.
        drop(wake_tx);
        assert!(
            rx.recv_timeout(Duration::from_secs(1)).is_err(),
            "renewed on a hung-up wake"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
