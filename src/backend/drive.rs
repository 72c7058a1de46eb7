//! The acquire loop every engine shares, the local one included, written
//! once: patience (the give-up clock, the waiting line, leaving on a
//! signal), the retry budget and every backoff, giving up and leaving the
//! queue, the "acquired" line, and the rule that a server never reached is
//! not waited out. An engine gives its look at the name, its wait for news
//! until a deadline the driver sets, and its way out of the queue; its own
//! client sorts the server's errors into kinds.

use std::time::Duration;

use super::quit::{self, Leave};
use super::wait::{Backoff, Outage, Patience, Retry};
use super::{Acquired, Error, Request, Wait};
use crate::clock::Boot;
use crate::log;

/// The server a request talks to, as the driver needs to know it: how it
/// is shown, and whether it has answered yet. An engine's client keeps one
/// and marks it when the server replies.
#[derive(Debug, Clone)]
pub struct Remote {
    /// The server as shown to the operator (no secrets).
    pub shown: String,
    /// The server has answered at least once: later transport errors may be
    /// a restart worth waiting out, earlier ones are misconfiguration.
    pub replied: bool,
}

impl Remote {
    /// `shown`, not yet answered.
    pub fn new(shown: impl Into<String>) -> Remote {
        Remote {
            shown: shown.into(),
            replied: false,
        }
    }

    /// A failure of `doing`, saying which server it was.
    pub fn failed(&self, doing: &str, e: Error) -> Error {
        e.doing(format_args!("{doing} on {}", self.shown))
    }
}

/// What one look at the name found.
pub enum Look {
    /// Granted, or the request ends without the name (the queue is full,
    /// a newer request replaced ours, or busy as the server alone decided).
    Done(Acquired),
    /// Someone is in the way (shown, if known): the request is in the
    /// queue, or out of it when the look was told it is the last.
    Blocked(Option<String>),
    /// Something changed under the look: look again at once.
    Again,
    /// Nothing decided and nothing to wait on (a slot freed a moment
    /// late): look again after a pause, longer each time in a row.
    Later,
    /// The request ends with this error, worded as it stands.
    Over(Error),
}

/// What one wait came to.
pub enum Woke {
    /// News, or a reason of the engine's own (a place to keep, a lapse due):
    /// look again.
    Look,
    /// The deadline came with nothing new: the wait stands, and may go on.
    Due,
    /// The wait broke off and says nothing of the name (a stream that
    /// ended at once): look again after a pause, longer each time in a row.
    Broke,
}

/// One engine's request for a name: what the engine writes.
pub trait Take {
    /// One look at the name: granted, done, or blocked (then in the queue,
    /// unless `last`: the wait is over, and a blocked request leaves the
    /// queue or never joins it). A look that blocks for a moment (the
    /// local engine, on a lock another grant holds while it writes) does
    /// so no later than `until`. A transient error is retried within the
    /// budget; any other ends the request.
    fn look(&mut self, last: bool, until: Option<Boot>) -> Result<Look, Error>;

    /// Blocked, wait for news no later than `until` (None: as long as the
    /// engine's own reasons allow), keeping our place meanwhile.
    fn wait(&mut self, until: Option<Boot>) -> Result<Woke, Error>;

    /// Give up our place in the queue and any grant made meanwhile (best
    /// effort; nothing to do when there is none, as after a second call).
    fn leave(&mut self);

    /// The same from another thread, on a connection of its own, when a
    /// signal ends lockrun while it waits (`quit`): every place and grant
    /// of our owner on the name goes. None: the engine has none.
    fn way_out(&self) -> Option<Leave> {
        None
    }

    /// The server the request talks to. None: the engine has none that
    /// could be away (the local one), and its errors name their files
    /// already.
    fn remote(&self) -> Option<&Remote>;
}

/// A failure of `doing`, saying which server it was, if any.
fn failed_on(take: &impl Take, doing: &str, e: Error) -> Error {
    match take.remote() {
        Some(server) => server.failed(doing, e),
        None => e,
    }
}

/// Take `req`'s name by `take`'s looks and waits until granted, busy or failed.
pub fn drive(take: &mut impl Take, req: &Request, wait: Wait) -> Result<Acquired, Error> {
    let mut patience = Patience::new(req, wait);
    if wait != Wait::No
        && let Some(leave) = take.way_out()
    {
        patience.leave_on_signal(leave, req.timing.op);
    }
    // A server that keeps failing is given up on after a ttl (or five
    // seconds, for a short one), or sooner when the wait runs out.
    let mut retry = Retry::new(req.timing.ttl.max(Duration::from_secs(5)));
    // Looks that came to nothing, and waits that broke off, in a row.
    let (mut later, mut broke) = (Backoff::default(), Backoff::default());
    // A full server, ridden out apart from the retry budget.
    let mut outage = Outage::default();
    loop {
        // A signal is taking us out of the queue: no call may put us back.
        quit::stay_if_leaving();
        let looked = take.look(patience.over(), patience.until());
        if looked.is_ok() {
            retry.succeeded();
            outage.over(take.remote().map_or("", |r| r.shown.as_str()));
        }
        if !matches!(looked, Ok(Look::Later)) {
            later.reset();
        }
        let holder = match looked {
            Ok(Look::Done(acquired)) => return Ok(said(acquired, req, &patience)),
            Ok(Look::Again) => continue,
            Ok(Look::Later) => {
                std::thread::sleep(later.pause());
                continue;
            }
            Ok(Look::Over(e)) => {
                take.leave();
                return Err(e);
            }
            Ok(Look::Blocked(holder)) => holder,
            Err(e) if e.is_full() => match full(take, req, &patience, &mut outage, e) {
                Ok(pause) => {
                    std::thread::sleep(pause);
                    continue;
                }
                Err(unreachable) => return Ok(unreachable),
            },
            Err(e) => {
                let pause = failed(take, req, &patience, &mut retry, e)?;
                std::thread::sleep(pause);
                continue;
            }
        };
        match wait_out(take, req, &mut patience, holder)? {
            Waited::Busy(acquired) => return Ok(acquired),
            Waited::Look => broke.reset(),
            Waited::Broke => std::thread::sleep(broke.pause()),
        }
    }
}

/// The request ends with `acquired`: a grant says so.
fn said(acquired: Acquired, req: &Request, patience: &Patience) -> Acquired {
    if let Acquired::Granted(l) = &acquired {
        log::info(format!(
            "acquired {} with token {} after {:.1?}",
            req.name,
            l.token,
            Boot::now().since(patience.started())
        ));
    }
    acquired
}

/// A look found the server full (`e`, naming its limit): the pause before
/// the next, or, once the wait is over, the request's end as a busy name
/// ends (never 69: the server is up, and lets us in once a connection is
/// free). Said once per outage.
fn full(
    take: &mut impl Take,
    req: &Request,
    patience: &Patience,
    outage: &mut Outage,
    e: Error,
) -> Result<Duration, Acquired> {
    let server = take.remote().map_or(String::new(), |r| r.shown.clone());
    ride_full(&server, req, patience, outage, e).inspect_err(|_| take.leave())
}

/// The pause before asking a full server (`e`) again, or the request's end
/// once its wait is over.
fn ride_full(
    server: &str,
    req: &Request,
    patience: &Patience,
    outage: &mut Outage,
    e: Error,
) -> Result<Duration, Acquired> {
    if patience.over_when_full(req.timing.op) {
        return Err(Acquired::Unreachable {
            why: format!("no connection to {server} was free: {e}"),
        });
    }
    let until = patience.until_full(req.timing.op);
    // Under -n (over from the start) the request's end alone says it.
    Ok(outage.full(until, !patience.over(), || {
        format!("waiting for a connection to {server}: {e}")
    }))
}

/// What an engine must have before its first look (a ZooKeeper session is
/// the request's own), had as the driver would have it: a full server is
/// ridden out within the request's wait. Ok(Err): the request ends as a
/// wait that ran out; Ok(Ok): connected, with what is left of the wait.
pub fn connect_first<T>(
    req: &Request,
    wait: Wait,
    server: &str,
    mut connect: impl FnMut() -> Result<T, Error>,
) -> Result<Result<(T, Wait), Acquired>, Error> {
    let patience = Patience::new(req, wait);
    let mut outage = Outage::default();
    loop {
        match connect() {
            Ok(t) => {
                outage.over(server);
                let left = match wait {
                    Wait::For(d) => {
                        Wait::For(d.saturating_sub(Boot::now().since(patience.started())))
                    }
                    w => w,
                };
                return Ok(Ok((t, left)));
            }
            Err(e) if e.is_full() => match ride_full(server, req, &patience, &mut outage, e) {
                Ok(pause) => std::thread::sleep(pause),
                Err(unreachable) => return Ok(Err(unreachable)),
            },
            Err(e) => return Err(e),
        }
    }
}

/// A look failed with `e`: the pause before the next, or the request's end.
fn failed(
    take: &mut impl Take,
    req: &Request,
    patience: &Patience,
    retry: &mut Retry,
    e: Error,
) -> Result<Duration, Error> {
    let doing = || format!("acquiring {}", req.name);
    // Final, or a server that never answered: misconfiguration, not an
    // outage to wait out.
    if !e.is_transient() || !take.remote().is_none_or(|s| s.replied) {
        take.leave();
        return Err(match e {
            Error::Request(_) => e,
            e => failed_on(take, &doing(), e),
        });
    }
    match retry.failed(patience) {
        Some(pause) => {
            log::info(format!("acquire failed: {e}; retrying"));
            Ok(pause)
        }
        None => {
            take.leave();
            Err(failed_on(take, &doing(), e))
        }
    }
}

/// How a blocked request's wait ended.
enum Waited {
    /// Gave up: out of the queue, busy.
    Busy(Acquired),
    Look,
    /// Look again after a pause.
    Broke,
}

/// Wait while blocked by `holder`: say so after a second, give up when
/// the wait runs out, and look again when the engine's wait says to.
fn wait_out(
    take: &mut impl Take,
    req: &Request,
    patience: &mut Patience,
    holder: Option<String>,
) -> Result<Waited, Error> {
    loop {
        if patience.over() {
            // Out of the queue; a grant handed over meanwhile goes to the next.
            take.leave();
            return Ok(Waited::Busy(Acquired::Busy { holder }));
        }
        patience.tick(holder.as_deref());
        quit::stay_if_leaving();
        match take.wait(patience.until()) {
            Ok(Woke::Due) => {}
            Ok(Woke::Look) => return Ok(Waited::Look),
            Ok(Woke::Broke) => return Ok(Waited::Broke),
            Err(e) if !e.is_transient() => {
                // The wait itself was refused (an ACL without it): final,
                // never a retry loop.
                take.leave();
                let doing = format!("waiting for {}", req.name);
                return Err(failed_on(take, &doing, e));
            }
            Err(e) => {
                log::info(format!("waiting failed: {e}; retrying"));
                return Ok(Waited::Broke);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Mode, Owner};
    use crate::schedule::Timing;
    use std::collections::VecDeque;

    /// An engine that answers as it is told, and counts what it is asked.
    #[derive(Default)]
    struct Fake {
        looks: VecDeque<Result<Look, Error>>,
        waits: VecDeque<Result<Woke, Error>>,
        lasts: Vec<bool>,
        waited: u32,
        left: u32,
        remote: Option<Remote>,
    }

    impl Fake {
        /// Its server, "fake", has answered.
        fn new() -> Fake {
            let server = Remote {
                replied: true,
                ..Remote::new("fake")
            };
            Fake {
                remote: Some(server),
                ..Fake::default()
            }
        }
    }

    impl Take for Fake {
        fn look(&mut self, last: bool, _until: Option<Boot>) -> Result<Look, Error> {
            self.lasts.push(last);
            self.looks.pop_front().unwrap_or(Ok(Look::Blocked(None)))
        }
        fn wait(&mut self, until: Option<Boot>) -> Result<Woke, Error> {
            self.waited += 1;
            if let Some(answer) = self.waits.pop_front() {
                return answer;
            }
            // Nothing comes: the deadline does.
            std::thread::sleep(until.expect("a bounded wait").since(Boot::now()));
            Ok(Woke::Due)
        }
        fn leave(&mut self) {
            self.left += 1;
        }
        fn remote(&self) -> Option<&Remote> {
            self.remote.as_ref()
        }
    }

    fn run(fake: &mut Fake, wait: Wait) -> Result<Acquired, Error> {
        let owner = Owner::new(None).unwrap();
        let req = Request {
            name: "n",
            owner: &owner,
            timing: Timing::new(Duration::from_secs(3), None).unwrap(),
            mode: Mode::Exclusive,
            outer: None,
            inherited_fd: None,
            quiet: true,
            min_hold: None,
            group: Default::default(),
        };
        drive(fake, &req, wait)
    }

    fn error(fake: &mut Fake) -> Error {
        match run(fake, Wait::Forever) {
            Err(e) => e,
            Ok(_) => panic!("acquired"),
        }
    }

    #[test]
    fn a_request_ended_by_an_error_leaves_the_queue() {
        let mut fake = Fake::new();
        fake.looks
            .push_back(Ok(Look::Over(Error::Internal("unreadable".into()))));
        let e = error(&mut fake);
        assert_eq!(
            e,
            Error::Internal("unreadable".into()),
            "worded as it stands"
        );
        assert_eq!(fake.left, 1);
        let mut fake = Fake::new();
        fake.looks.push_back(Err(Error::Refused("denied".into())));
        let e = error(&mut fake);
        assert_eq!(e, Error::Refused("acquiring n on fake: denied".into()));
        assert_eq!(fake.left, 1);
        // No server (the local engine): its errors name their files already.
        let mut fake = Fake::default();
        fake.looks.push_back(Err(Error::Refused("denied".into())));
        assert_eq!(error(&mut fake), Error::Refused("denied".into()));
    }

    #[test]
    fn no_wait_never_waits_and_says_who_holds() {
        let mut fake = Fake::new();
        fake.looks.push_back(Ok(Look::Blocked(Some("h".into()))));
        let Ok(got) = run(&mut fake, Wait::No) else {
            panic!("failed")
        };
        assert!(matches!(got, Acquired::Busy { holder: Some(h) } if h == "h"));
        assert_eq!((fake.lasts, fake.waited), (vec![true], 0));
    }

    #[test]
    fn a_wait_that_runs_out_leaves_the_queue_at_its_deadline() {
        let mut fake = Fake::new();
        fake.looks.push_back(Ok(Look::Blocked(Some("h".into()))));
        let start = Boot::now();
        let Ok(got) = run(&mut fake, Wait::For(Duration::from_millis(100))) else {
            panic!("failed")
        };
        assert!(matches!(got, Acquired::Busy { holder: Some(h) } if h == "h"));
        assert!(Boot::now().since(start) >= Duration::from_millis(100));
        // One look, one wait to the deadline, no look after it.
        assert_eq!((fake.lasts, fake.waited, fake.left), (vec![false], 1, 1));
    }

    #[test]
    fn a_refused_wait_ends_the_request_and_a_broken_one_looks_again() {
        let mut fake = Fake::new();
        fake.waits.push_back(Ok(Woke::Broke));
        fake.waits.push_back(Err(Error::Transient("cut".into())));
        fake.waits.push_back(Err(Error::Refused("no BLPOP".into())));
        let e = error(&mut fake);
        assert_eq!(e, Error::Refused("waiting for n on fake: no BLPOP".into()));
        assert_eq!((fake.lasts.len(), fake.waited, fake.left), (3, 3, 1));
    }

    #[test]
    fn a_full_server_is_waited_out_and_ends_the_wait_as_busy_never_as_a_failure() {
        let full = || Err(Error::Full("too many clients (max_connections)".into()));
        // Full three times in a row, the retry budget untouched: then the
        // look goes through.
        let mut fake = Fake::default();
        fake.looks.extend((0..3).map(|_| full()));
        fake.looks
            .push_back(Ok(Look::Done(Acquired::QueueFull { waiting: 0 })));
        let Ok(got) = run(&mut fake, Wait::Forever) else {
            panic!("failed")
        };
        assert!(matches!(got, Acquired::QueueFull { .. }));
        // Full until the wait runs out: the end of a wait, naming the limit.
        let mut fake = Fake::default();
        fake.looks.extend((0..100).map(|_| full()));
        let start = Boot::now();
        let Ok(got) = run(&mut fake, Wait::For(Duration::from_millis(700))) else {
            panic!("failed")
        };
        let Acquired::Unreachable { why } = got else {
            panic!("not unreachable")
        };
        assert!(why.contains("max_connections"), "{why}");
        let took = Boot::now().since(start);
        assert!(took >= Duration::from_millis(700), "{took:?}");
        assert!(took < Duration::from_millis(1500), "{took:?}");
    }
}
