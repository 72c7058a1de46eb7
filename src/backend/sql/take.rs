//! Taking a name on an SQL database, as the driver steps it: one short
//! transaction per look, under the name's lock: read the name's live rows,
//! judge them, then take a free slot (the grant), or take or keep a place
//! in the queue. Blocked, a step waits as the dialect wakes its waiters,
//! until a deadline the driver's patience sets. The give-up clock, the
//! waiting line and the retry budget are the driver's (`backend::drive`).

use std::time::Duration;

use super::look::decide;
use super::{Dialect, Sql};
use crate::backend::drive::{Step, Take, Transport, drive};
use crate::backend::quit::Leave;
use crate::backend::table::Target;
use crate::backend::wait::{Patience, Retry};
use crate::backend::{Acquired, Error, Lease, Mode, Request, Wait};
use crate::clock::Boot;

/// A waiter's place lasts a third of the ttl unless kept, so one killed
/// in the queue holds up the others by no more than that.
pub fn place_ttl(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
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
/// nothing move at the step before.
pub enum Blocked<P> {
    Looked {
        /// When the look was sent: the server's lapse times count from it.
        sent: Boot,
        lapses_in: Option<Duration>,
        wake_on: Option<Target>,
    },
    Parked(P),
}

/// One request for a name, as the driver steps it.
struct Taking<'a, D: Dialect> {
    sql: &'a mut Sql<D>,
    req: &'a Request<'a>,
    place: Place,
    /// The wait goes on at the next step, without a look.
    parked: Option<D::Parked>,
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
        parked: None,
        prepared: false,
        created: false,
    };
    drive(&mut taking, req, wait)
}

impl<D: Dialect> Take for Taking<'_, D> {
    type Transport = D::Client;

    fn step(&mut self, patience: &mut Patience, _: &mut Retry) -> Result<Step, Error> {
        let doing = || format!("acquiring {}", self.req.name);
        if !self.prepared {
            // Once per request: the tables as they are found, and made
            // and checked first when they are not all there.
            if !self.sql.dialect.prepare(&mut self.sql.client)? {
                self.created = true;
                if let Err(e) = self.sql.dialect.create(&mut self.sql.client) {
                    return Ok(Step::Over(self.sql.client.failed(&doing(), e)));
                }
            }
            self.prepared = true;
        }
        if let Some(parked) = self.parked.take() {
            return self.wait(patience, Blocked::Parked(parked));
        }
        loop {
            let looked = self.look(patience);
            let sql = &mut *self.sql;
            match looked {
                Err(_) if !self.created && D::missing(&sql.client) => {
                    // First use of these tables: create them, look again.
                    self.created = true;
                    if let Err(e) = sql.dialect.create(&mut sql.client) {
                        return Ok(Step::Over(sql.client.failed(&doing(), e)));
                    }
                }
                Err(e) => {
                    let Some(e) = sql.dialect.final_error(&mut sql.client, self.req.name) else {
                        return Err(e);
                    };
                    self.leave();
                    return Ok(Step::Over(self.sql.client.failed(&doing(), e)));
                }
                Ok(Step::Again) if self.place.stalls > 1 => {
                    let tries = self.place.stalls;
                    if let Err(e) = sql.dialect.stalled(&mut sql.client, tries) {
                        self.leave();
                        return Ok(Step::Over(self.sql.client.failed(&doing(), e)));
                    }
                    return Ok(Step::Again);
                }
                done => return done,
            }
        }
    }

    fn leave(&mut self) {
        if self.place.seq.take().is_some() {
            self.sql.dialect.dequeue(&mut self.sql.client, self.req);
        }
    }

    fn way_out(&self) -> Option<Leave> {
        Some(self.sql.dialect.way_out(&self.sql.client, self.req))
    }

    fn transport(&self) -> &D::Client {
        &self.sql.client
    }
}

impl<D: Dialect> Taking<'_, D> {
    /// One look at the name and what it leads to.
    fn look(&mut self, patience: &mut Patience) -> Result<Step, Error> {
        let (req, place) = (self.req, &mut self.place);
        let sent = Boot::now();
        let seq = place.seq;
        let sql = &mut *self.sql;
        let outcome = sql.dialect.look(&mut sql.client, req, seq, |tx, rows| {
            decide(tx, rows, req, place, patience)
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
                Step::Done(Acquired::Granted(Lease::new(
                    token,
                    matches!(req.mode, Mode::Limit(_)).then_some(slot),
                    sent,
                    req.timing.ttl,
                    held,
                )))
            }
            Outcome::Busy => Step::Done(Acquired::Busy {
                holder: place.holder.clone(),
            }),
            Outcome::QueueFull { waiting } => Step::Done(Acquired::QueueFull { waiting }),
            Outcome::Replaced { by } => Step::Done(Acquired::Replaced { by }),
            Outcome::Refused(e) => return Err(e),
            Outcome::Again => Step::Again,
            Outcome::Blocked { lapses_in, wake_on } => {
                patience.tick(place.holder.as_deref());
                let blocked = Blocked::Looked {
                    sent,
                    lapses_in,
                    wake_on,
                };
                return self.wait(patience, blocked);
            }
        })
    }

    /// Wait as the dialect wakes its waiters; look again at the next step
    /// unless nothing moved.
    fn wait(&mut self, patience: &Patience, blocked: Blocked<D::Parked>) -> Result<Step, Error> {
        let sql = &mut *self.sql;
        self.parked =
            sql.dialect
                .wait(&mut sql.client, self.req, self.place.seq, patience, blocked)?;
        Ok(Step::Again)
    }
}
