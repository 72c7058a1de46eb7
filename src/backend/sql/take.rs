//! Taking a name on an SQL database, as the driver steps it: one short
//! transaction per look, under the name's lock: read the name's live rows,
//! judge them, then take a free slot (the grant), or take or keep a place
//! in the queue. Blocked, the driver has it wait as the dialect wakes its
//! waiters, until a deadline it sets. The give-up clock, the waiting line,
//! every pause and the retry budget are the driver's (`backend::drive`).

use std::time::Duration;

use super::look::decide;
use super::{Dialect, Sql};
use crate::backend::drive::{Look, Remote, Take, Woke, drive};
use crate::backend::plan::{Pace, far_nap, place_lasts};
use crate::backend::quit::Leave;
use crate::backend::table::Target;
use crate::backend::{Acquired, Error, Lease, Mode, Request, Wait};
use crate::clock::{Boot, jitter};

/// The earlier of `d` and what is left until `until`.
pub fn capped(until: Option<Boot>, d: Duration) -> Duration {
    until.map_or(d, |u| u.since(Boot::now()).min(d))
}

/// Our request: its place in the queue, once it has one.
#[derive(Default)]
pub struct Place {
    pub seq: Option<i64>,
    /// It joined the queue once: `--max-waiters` and `--preempt` judged
    /// it then and never again (a place that lapsed joins again as it is).
    pub joined: bool,
    /// The first holder's label, for the waiting line and a give-up.
    pub holder: Option<String>,
    /// Looks in a row that neither waited nor decided.
    stalls: u32,
}

/// What one look decided.
pub enum Outcome {
    Granted {
        slot: u32,
        token: u64,
    },
    Blocked {
        lapses_in: Option<Duration>,
        /// The row just ahead of ours, whose end wakes us.
        wake_on: Option<Target>,
        /// The places before ours.
        ahead: usize,
    },
    Busy,
    /// Not queued: `--max-waiters` requests wait already.
    QueueFull {
        waiting: u64,
    },
    /// Taken out of the queue by a newer `--supersede` request.
    Replaced {
        by: String,
    },
    Refused(Error),
    /// Look again at once.
    Again,
}

/// A blocked request's wait: just after its look, or one that saw
/// nothing move the time before.
pub enum Blocked<P> {
    Looked {
        /// When the look was sent: the server's lapse times count from it.
        sent: Boot,
        lapses_in: Option<Duration>,
        wake_on: Option<Target>,
        /// The places before ours.
        ahead: usize,
    },
    Parked(P),
}

/// One request for a name, as the driver steps it.
struct Taking<'a, D: Dialect> {
    sql: &'a mut Sql<D>,
    req: &'a Request<'a>,
    place: Place,
    /// Blocked: what the next wait waits on (after a look, or parked by a
    /// wait that saw nothing move, to go on without a look).
    blocked: Option<Blocked<D::Parked>>,
    /// When a waiter far back looks again (`plan::Pace`), and the nap
    /// its last look chose: none, near the front, it waits as the dialect
    /// wakes its waiters.
    pace: Pace,
    nap: Option<Duration>,
    /// When our place was last kept (by a look, or by a far waiter's keep).
    kept: Option<Boot>,
    /// The dialect was prepared for this request.
    prepared: bool,
    /// Lockrun's tables were created by this request (once at most).
    created: bool,
}

pub fn take<D: Dialect>(sql: &mut Sql<D>, req: &Request, wait: Wait) -> Result<Acquired, Error> {
    sql.dialect.begin(&mut sql.client, req);
    let mut taking = Taking {
        sql,
        req,
        place: Place::default(),
        blocked: None,
        pace: Pace::default(),
        nap: None,
        kept: None,
        prepared: false,
        created: false,
    };
    drive(&mut taking, req, wait)
}

impl<D: Dialect> Take for Taking<'_, D> {
    fn look(&mut self, last: bool, _until: Option<Boot>) -> Result<Look, Error> {
        let doing = || format!("acquiring {}", self.req.name);
        self.blocked = None;
        if !self.prepared {
            // Once per request: the tables as they are found, and made
            // and checked first when they are not all there.
            if !self.sql.dialect.prepare(&mut self.sql.client)? {
                self.created = true;
                if let Err(e) = self.sql.dialect.create(&mut self.sql.client) {
                    return Ok(Look::Over(self.sql.client.as_ref().failed(&doing(), e)));
                }
            }
            self.prepared = true;
        }
        loop {
            let looked = self.look_once(last);
            let sql = &mut *self.sql;
            match looked {
                Err(_) if !self.created && D::missing(&sql.client) => {
                    // First use of these tables: create them, look again.
                    self.created = true;
                    if let Err(e) = sql.dialect.create(&mut sql.client) {
                        return Ok(Look::Over(sql.client.as_ref().failed(&doing(), e)));
                    }
                }
                Err(e) => {
                    let Some(e) = sql.dialect.final_error(&mut sql.client, self.req.name) else {
                        return Err(e);
                    };
                    self.leave();
                    return Ok(Look::Over(self.sql.client.as_ref().failed(&doing(), e)));
                }
                Ok(Look::Again) if self.place.stalls > 1 => {
                    let tries = self.place.stalls;
                    if let Err(e) = sql.dialect.stalled(&mut sql.client, tries) {
                        self.leave();
                        return Ok(Look::Over(self.sql.client.as_ref().failed(&doing(), e)));
                    }
                    return Ok(Look::Again);
                }
                done => return done,
            }
        }
    }

    /// Wait as the dialect wakes its waiters; look again unless nothing
    /// moved, when the wait stands and the next goes on without a look.
    fn wait(&mut self, until: Option<Boot>) -> Result<Woke, Error> {
        let Some(blocked) = self.blocked.take() else {
            return Ok(Woke::Look);
        };
        let sql = &mut *self.sql;
        if let Some(nap) = self.nap.take() {
            // Far back: no connection held while the queue moves up to us.
            D::hang_up(&mut sql.client);
            let woke = Boot::now().add(nap - jitter(nap / 5));
            std::thread::sleep(capped(until, woke.since(Boot::now())));
            if Boot::now() < woke {
                // Up early (the waiting line, the end of the wait): the
                // rest of the nap stands.
                self.nap = Some(woke.since(Boot::now()));
                self.blocked = Some(blocked);
                return Ok(Woke::Due);
            }
            // Keep our place and see how far the queue came, without a
            // look; near the front, or our place gone, a look.
            let (Some(seq), ttl) = (self.place.seq, self.req.timing.ttl) else {
                return Ok(Woke::Look);
            };
            let sent = Boot::now();
            // Kept lately enough that it outlasts the next nap, however
            // long, and a fifth of its time to spare: only count (a waiter
            // the queue nears looks often).
            let lasts = place_lasts(ttl);
            let next = self.pace.longest(far_nap(ttl));
            let due = self
                .kept
                .is_none_or(|k| sent.since(k) + next + lasts / 5 > lasts);
            let keep_ms = i64::try_from(lasts.as_millis()).unwrap_or(i64::MAX);
            let kept = sql
                .dialect
                .keep_far(&mut sql.client, self.req, seq, due.then_some(keep_ms));
            let Ok(Some(ahead)) = kept else {
                // A failure (a full server among them) is the look's to meet.
                return Ok(Woke::Look);
            };
            if due {
                self.kept = Some(sent);
            }
            self.nap = self.pace.far(ahead, far_nap(ttl), sent);
            if self.nap.is_none() {
                return Ok(Woke::Look);
            }
            self.blocked = Some(blocked);
            return Ok(Woke::Due);
        }
        let parked = sql
            .dialect
            .wait(&mut sql.client, self.req, self.place.seq, until, blocked)?;
        Ok(match parked {
            Some(p) => {
                self.blocked = Some(Blocked::Parked(p));
                Woke::Due
            }
            None => Woke::Look,
        })
    }

    fn leave(&mut self) {
        if self.place.seq.take().is_some() {
            self.sql.dialect.dequeue(&mut self.sql.client, self.req);
        }
    }

    fn way_out(&self) -> Option<Leave> {
        Some(self.sql.dialect.way_out(&self.sql.client, self.req))
    }

    fn remote(&self) -> Option<&Remote> {
        Some(self.sql.client.as_ref())
    }
}

impl<D: Dialect> Taking<'_, D> {
    /// One look at the name and what it leads to.
    fn look_once(&mut self, last: bool) -> Result<Look, Error> {
        let (req, place) = (self.req, &mut self.place);
        let sent = Boot::now();
        let seq = place.seq;
        let sql = &mut *self.sql;
        let outcome = sql.dialect.look(&mut sql.client, req, seq, |tx, rows| {
            decide(tx, rows, req, place, last)
        })?;
        // A look that neither waited nor decided stalled.
        match outcome {
            None | Some(Outcome::Again) => place.stalls += 1,
            Some(_) => place.stalls = 0,
        }
        Ok(match outcome.unwrap_or(Outcome::Again) {
            Outcome::Granted { slot, token } => {
                // The row's slot, whatever the mode (readers have one each);
                // the job sees it only with --limit.
                let held = sql.dialect.held(&mut sql.client, req, slot);
                Look::Done(Acquired::Granted(Lease::new(
                    token,
                    matches!(req.mode, Mode::Limit(_)).then_some(slot),
                    sent,
                    req.timing.ttl,
                    held,
                )))
            }
            Outcome::Busy => Look::Done(Acquired::Busy {
                holder: place.holder.clone(),
            }),
            Outcome::QueueFull { waiting } => Look::Done(Acquired::QueueFull { waiting }),
            Outcome::Replaced { by } => Look::Done(Acquired::Replaced { by }),
            Outcome::Refused(e) => return Err(e),
            Outcome::Again => Look::Again,
            Outcome::Blocked {
                lapses_in,
                wake_on,
                ahead,
            } => {
                self.kept = Some(sent);
                self.nap = self.pace.far(ahead, far_nap(req.timing.ttl), sent);
                self.blocked = Some(Blocked::Looked {
                    sent,
                    lapses_in,
                    wake_on,
                    ahead,
                });
                Look::Blocked(place.holder.clone())
            }
        })
    }
}
