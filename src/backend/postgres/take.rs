//! Taking a name on PostgreSQL: one short transaction per look, under the
//! name's advisory lock: read the name's live rows, judge them, then take
//! a free slot (the grant), or take or keep a place in the queue. Between
//! looks a waiter sleeps until a notification, the lapse of what stands in
//! its way, or the time to keep its place. The give-up clock, the waiting
//! line and the retry budget are the driver's (`backend::drive`).

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::client::{Call, Client, Params};
use super::sql::Tables;
use super::{PgHeld, Postgres};
use crate::backend::drive::{Look, Take, Transport, Woke, drive};
use crate::backend::quit::Leave;
use crate::backend::table::{Cells, Rows, Verdict, entries, judge};
use crate::backend::table::{KEPT, PREEMPTED, SUPERSEDE};
use crate::backend::{Acquired, Error, Lease, Mode, Request, Wait};
use crate::clock::Boot;
use crate::log;

/// A waiter's place lasts a third of the ttl unless kept, so one killed
/// in the queue holds up the others by no more than that.
pub fn place_ttl(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// Our request: its place in the queue, once it has one.
#[derive(Default)]
struct Place {
    seq: Option<i64>,
    /// It joined the queue once: `--max-waiters` and `--preempt` judged
    /// it then and never again (a place that lapsed joins again as it is).
    joined: bool,
    /// The first holder's label, for the waiting line and a give-up.
    holder: Option<String>,
}

/// What one look decided.
enum Outcome {
    Granted {
        slot: u32,
        token: u64,
    },
    Blocked {
        lapses_in: Option<Duration>,
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

/// SQLSTATEs of a table or schema that is not there yet.
pub(super) fn missing(code: Option<&str>) -> bool {
    matches!(code, Some("42P01" | "3F000"))
}

/// One request for a name on PostgreSQL, as the driver steps it.
struct Taking<'a> {
    pg: &'a mut Postgres,
    req: &'a Request<'a>,
    place: Place,
    /// Lockrun's tables were created by this request (once at most).
    created: bool,
    /// Blocked: when what is in our way lapses, if it does (the server's
    /// clock said).
    lapses_in: Option<Duration>,
}

impl Take for Taking<'_> {
    type Transport = Client;

    fn look(&mut self, last: bool, _until: Option<Boot>) -> Result<Look, Error> {
        loop {
            match self
                .pg
                .step(self.req, &mut self.place, last, &mut self.lapses_in)
            {
                Err(_) if !self.created && missing(self.pg.client.last_code.as_deref()) => {
                    // First use of this schema: create the tables, look again.
                    self.created = true;
                    if let Err(e) = self.pg.create() {
                        let doing = format!("acquiring {}", self.req.name);
                        return Ok(Look::Over(self.pg.client.failed(&doing, e)));
                    }
                }
                done => return done,
            }
        }
    }

    /// Sleep until a notification, the lapse of what stands in our way,
    /// or the time to keep our place.
    fn wait(&mut self, until: Option<Boot>) -> Result<Woke, Error> {
        let keep = place_ttl(self.req.timing.ttl) / 3;
        let until_lapse = self
            .lapses_in
            .map_or(keep, |d| d + Duration::from_millis(5));
        let nap = keep.min(until_lapse);
        let nap = until.map_or(nap, |u| nap.min(u.since(Boot::now())));
        self.pg.client.wait_note(nap)?;
        Ok(Woke::Look)
    }

    fn leave(&mut self) {
        self.pg.leave(self.req, &mut self.place);
    }

    fn way_out(&self) -> Option<Leave> {
        Some(super::leave::way_out(
            &self.pg.client,
            &self.pg.tables,
            self.req,
        ))
    }

    fn transport(&self) -> &Client {
        &self.pg.client
    }
}

impl Postgres {
    pub(super) fn take(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        let mut taking = Taking {
            pg: self,
            req,
            place: Place::default(),
            created: false,
            lapses_in: None,
        };
        drive(&mut taking, req, wait)
    }

    /// Create lockrun's tables in the schema (lockrun-engines(7) "POSTGRESQL").
    fn create(&mut self) -> Result<(), Error> {
        log::info(format!(
            "creating lockrun's tables in schema {}",
            self.tables.schema
        ));
        match self.client.batch(&self.tables.create()) {
            Ok(_) => Ok(()),
            Err(e) => {
                // A failed transaction leaves the connection unusable.
                self.client.drop_connection();
                Err(match e {
                    Error::Refused(m) if self.client.last_code.as_deref() == Some("42501") => {
                        // The server's words, without the hint about grants
                        // to use the tables: here they do not exist yet.
                        let why = m.split("; ").next().unwrap_or(&m);
                        Error::Refused(format!(
                            "cannot create lockrun's tables in schema {}: {why}; create them \
                             once as a role that may (lockrun-engines(7) \"POSTGRESQL\")",
                            self.tables.schema
                        ))
                    }
                    e => e,
                })
            }
        }
    }

    /// Give up our place in the queue, if we have one (best effort: it
    /// lapses on its own within a third of the ttl).
    fn leave(&mut self, req: &Request, place: &mut Place) {
        if place.seq.take().is_some() {
            let _ = self.client.query(
                &self.tables.dequeue(),
                &[(&req.name, Type::TEXT), (&req.owner.secret, Type::TEXT)],
            );
        }
    }

    fn step(
        &mut self,
        req: &Request,
        place: &mut Place,
        last: bool,
        lapses: &mut Option<Duration>,
    ) -> Result<Look, Error> {
        let channel = self.tables.channel(req.name);
        // Notifications from before this look are answered by it.
        self.client.drain();
        let sent = Boot::now();
        let tables = self.tables.clone();
        let look_sql = tables.look();
        let outcome = transaction(
            &mut self.client,
            &tables,
            req.name,
            (&look_sql, &[(&req.name, Type::TEXT)]),
            |c, rows| look(c, rows, &tables, req, place, last, &channel),
        )?;
        match outcome {
            Outcome::Granted { slot, token } => {
                let client = self.hand_over();
                // The row's slot, whatever the mode (readers have one each);
                // the job sees it only with --limit.
                let held = PgHeld::new(client, &self.tables, req, slot, &channel);
                Ok(Look::Done(Acquired::Granted(Lease::new(
                    token,
                    matches!(req.mode, Mode::Limit(_)).then_some(slot),
                    sent,
                    req.timing.ttl,
                    Box::new(held),
                ))))
            }
            // The wait is over: out of the queue already.
            Outcome::Busy => Ok(Look::Blocked(place.holder.clone())),
            Outcome::QueueFull { waiting } => Ok(Look::Done(Acquired::QueueFull { waiting })),
            Outcome::Replaced { by } => Ok(Look::Done(Acquired::Replaced { by })),
            Outcome::Refused(e) => Err(e),
            Outcome::Again => Ok(Look::Again),
            Outcome::Blocked { lapses_in } => {
                if !self.client.listens(&channel) {
                    // Listening from now on: look once more, so that a
                    // release between the look and the LISTEN is not missed.
                    self.client.listen(&channel)?;
                    return Ok(Look::Again);
                }
                // Keep our place in time; wake a little after what is in
                // our way lapses (the server's clock said when).
                *lapses = lapses_in;
                Ok(Look::Blocked(place.holder.clone()))
            }
        }
    }

    /// The client for a granted lease: this connection unless it listens
    /// (notifications for others would pile up on it while the job runs).
    fn hand_over(&mut self) -> Client {
        if self.client.listens_any() {
            self.client.drop_connection();
        }
        let fresh = self.client.fresh();
        std::mem::replace(&mut self.client, fresh)
    }
}

/// Run a transaction under the name's advisory lock: its start, the lock
/// and `first` (a statement with its parameters) in one flight, then `f`
/// with the rows of `first`. `f` ends it with its last statements and the
/// COMMIT in one flight (`commit`). Any error ends the connection (a
/// failed transaction cannot be used further).
pub(super) fn transaction<T>(
    c: &mut Client,
    tables: &Tables,
    name: &str,
    first: (&str, &Params),
    f: impl FnOnce(&mut Client, Vec<Row>) -> Result<T, Error>,
) -> Result<T, Error> {
    let begin = tables.begin(name, c.op);
    let done = c
        .pipeline(&[Call::Batch(&begin), Call::Query(first.0, first.1)])
        .and_then(|mut rows| f(c, rows.remove(1)));
    if done.is_err() {
        let code = c.last_code.take();
        c.drop_connection();
        c.last_code = code;
    }
    done
}

/// The transaction's last statements and its COMMIT, in one flight: the
/// rows of each statement.
pub(super) fn commit(c: &mut Client, last: &[Call]) -> Result<Vec<Vec<Row>>, Error> {
    let mut calls: Vec<Call> = last.iter().map(Call::clone).collect();
    calls.push(Call::Batch("COMMIT"));
    c.pipeline(&calls)
}

/// One look at the name, inside its transaction: `rows` are its live rows.
fn look(
    c: &mut Client,
    rows: Vec<Row>,
    tables: &Tables,
    req: &Request,
    place: &mut Place,
    last: bool,
    channel: &str,
) -> Result<Outcome, Error> {
    let name = &req.name;
    let owner = &req.owner.secret;
    let Rows {
        holders,
        mut waiters,
        replaced,
    } = entries(rows.iter().map(|r| Cells {
        kind: r.get(0),
        pos: r.get(1),
        owner: r.get(2),
        label: r.get(3),
        token: r.get(4),
        code: r.get(5),
        lim: r.get::<_, Option<i32>>(6).map(i64::from),
        left_ms: r.get(7),
        live: false,
    }))?;
    let dequeue_sql = tables.dequeue();
    let who: [(&(dyn ToSql + Sync), Type); 2] = [(name, Type::TEXT), (owner, Type::TEXT)];
    let wake: [(&(dyn ToSql + Sync), Type); 1] = [(&channel, Type::TEXT)];
    if let Some(mark) = replaced.iter().find(|m| &m.owner == owner) {
        // A newer --supersede request took our place. Its mark goes, and
        // an older lockrun that counted it as a place looks again.
        commit(
            c,
            &[
                Call::Query(&dequeue_sql, &who),
                Call::Query(tables.notify(), &wake),
            ],
        )?;
        place.seq = None;
        return Ok(Outcome::Replaced {
            by: mark.label.clone(),
        });
    }
    let mine = waiters.iter().find(|w| &w.owner == owner).map(|w| w.pos);
    if let (Some(old), None) = (place.seq, mine) {
        // Our place lapsed (lockrun or the server paused past it). A
        // --supersede request that a newer one follows would have been
        // replaced by it, had it been there: it yields rather than
        // queueing again and replacing the newer one.
        if req.group.supersede
            && let Some(newer) = waiters.iter().find(|w| w.supersede && w.pos > old)
        {
            commit(c, &[])?;
            place.seq = None;
            return Ok(Outcome::Replaced {
                by: newer.label.clone(),
            });
        }
        log::info(format!(
            "our place in {}'s queue lapsed; queueing again",
            req.name
        ));
    }
    place.seq = mine;
    let ttl_ms = req.timing.ttl.as_millis() as i64;
    let keep_ms = place_ttl(req.timing.ttl).as_millis() as i64;
    let mut verdict = judge(&holders, &waiters, place.seq, req);
    // A --supersede request that must wait, joining the queue, replaces
    // every earlier place that asked for it too: it is judged without them.
    let replacing = req.group.supersede
        && place.seq.is_none()
        && matches!(verdict, Verdict::Blocked { .. })
        && waiters.iter().any(|w| w.supersede);
    if replacing {
        waiters.retain(|w| !w.supersede);
        verdict = judge(&holders, &waiters, place.seq, req);
    }
    let replace_sql = tables.replace();
    let replace_params: [(&(dyn ToSql + Sync), Type); 3] = [
        (name, Type::TEXT),
        (&req.owner.shown, Type::TEXT),
        (&keep_ms, Type::INT8),
    ];
    let replace = || Call::Query(&replace_sql, &replace_params);
    let others_wait = waiters.iter().any(|w| &w.owner != owner);
    // Leaving the queue, if we are in it, as part of the end.
    let leave = |place: &mut Place| place.seq.take().map(|_| Call::Query(&dequeue_sql, &who));
    match verdict {
        Verdict::Ours { slot } => {
            let slot_i = slot as i32;
            let renew = tables.renew();
            let params: [(&(dyn ToSql + Sync), Type); 4] = [
                (name, Type::TEXT),
                (&slot_i, Type::INT4),
                (owner, Type::TEXT),
                (&ttl_ms, Type::INT8),
            ];
            let mut last = vec![Call::Query(&renew, &params)];
            last.extend(leave(place));
            let rows = commit(c, &last)?;
            Ok(match rows[0].first() {
                Some(r) => Outcome::Granted {
                    slot,
                    token: r.get::<_, i64>(0) as u64,
                },
                None => Outcome::Again,
            })
        }
        Verdict::Granted { slot } => {
            let slot_i = slot as i32;
            let mode = req.mode.code();
            let lim = req.mode.limit() as i32;
            let grant = tables.grant();
            let params: [(&(dyn ToSql + Sync), Type); 7] = [
                (name, Type::TEXT),
                (&slot_i, Type::INT4),
                (owner, Type::TEXT),
                (&req.owner.shown, Type::TEXT),
                (&mode, Type::TEXT),
                (&lim, Type::INT4),
                (&ttl_ms, Type::INT8),
            ];
            let token_lock = tables.token_lock();
            // Granted only once the places it replaces are out of the way.
            let mut last: Vec<Call> = replacing.then(replace).into_iter().collect();
            last.push(Call::Batch(&token_lock));
            let granted = last.len();
            last.push(Call::Query(&grant, &params));
            if others_wait || replacing {
                // The next in line may hold beside us (readers, a limit),
                // and a replaced waiter learns it: each looks again now
                // rather than at its next nap's end.
                last.push(Call::Query(tables.notify(), &wake));
            }
            let rows = commit(c, &last)?;
            // The grant took our place in the queue with it.
            place.seq = None;
            let Some(r) = rows[granted].first() else {
                return Ok(Outcome::Again);
            };
            Ok(Outcome::Granted {
                slot,
                token: r.get::<_, i64>(0).max(0) as u64,
            })
        }
        Verdict::Nested => {
            let last: Vec<Call> = leave(place).into_iter().collect();
            commit(c, &last)?;
            Ok(Outcome::Refused(crate::backend::nested(req.name)))
        }
        Verdict::Disagrees(in_force) => {
            let last: Vec<Call> = leave(place).into_iter().collect();
            commit(c, &last)?;
            Ok(Outcome::Refused(req.mode.disagreement(req.name, in_force)))
        }
        Verdict::Blocked {
            holder, lapses_in, ..
        } => {
            place.holder = holder.or(place.holder.take());
            if last {
                let last: Vec<Call> = leave(place).into_iter().collect();
                commit(c, &last)?;
                return Ok(Outcome::Busy);
            }
            // Joining for the first time: the one step that judges
            // --max-waiters and --preempt, under the name's lock.
            let first = place.seq.is_none() && !place.joined;
            if first && let Some(n) = req.group.max_waiters {
                // The places left once ours replaced theirs; none of ours.
                let waiting = waiters.iter().filter(|w| &w.owner != owner).count() as u64;
                if waiting >= u64::from(n) {
                    // Not queued, nothing replaced: no trace.
                    commit(c, &[])?;
                    return Ok(Outcome::QueueFull { waiting });
                }
            }
            let preempting = first && req.group.preempt && !holders.is_empty();
            if preempting && holders.iter().any(|h| h.owner == KEPT) {
                // --min-hold windows run no job: they end at once, and
                // the name is looked at again.
                let end = tables.end_windows();
                let just_name: [(&(dyn ToSql + Sync), Type); 1] = [(name, Type::TEXT)];
                commit(
                    c,
                    &[
                        Call::Query(&end, &just_name),
                        Call::Query(tables.notify(), &wake),
                    ],
                )?;
                return Ok(Outcome::Again);
            }
            let mode = req.mode.code();
            let lim = req.mode.limit() as i32;
            let (keep, enqueue) = (tables.keep_place(), tables.enqueue());
            let seq = place.seq.unwrap_or(0);
            let keep_params: [(&(dyn ToSql + Sync), Type); 4] = [
                (name, Type::TEXT),
                (&seq, Type::INT8),
                (owner, Type::TEXT),
                (&keep_ms, Type::INT8),
            ];
            let place_owner = if req.group.supersede {
                format!("{SUPERSEDE}{owner}")
            } else {
                owner.clone()
            };
            let enqueue_params: [(&(dyn ToSql + Sync), Type); 6] = [
                (name, Type::TEXT),
                (&place_owner, Type::TEXT),
                (&req.owner.shown, Type::TEXT),
                (&mode, Type::TEXT),
                (&lim, Type::INT4),
                (&keep_ms, Type::INT8),
            ];
            let mark = format!("{PREEMPTED}{}", req.owner.shown);
            let preempt = tables.preempt();
            let preempt_params: [(&(dyn ToSql + Sync), Type); 3] =
                [(name, Type::TEXT), (&mark, Type::TEXT), (owner, Type::TEXT)];
            let mut last: Vec<Call> = replacing.then(replace).into_iter().collect();
            if preempting {
                // Every holder of this moment is asked to stop; its owner
                // stays, to release once its job is dead.
                last.push(Call::Query(&preempt, &preempt_params));
            }
            let queued = last.len();
            last.push(match place.seq {
                Some(_) => Call::Query(&keep, &keep_params),
                None => Call::Query(&enqueue, &enqueue_params),
            });
            if replacing {
                // The replaced waiters learn it now.
                last.push(Call::Query(tables.notify(), &wake));
            }
            let rows = commit(c, &last)?;
            if place.seq.is_none() {
                place.seq = rows[queued].first().map(|r| r.get::<_, i64>(0));
            }
            place.joined |= place.seq.is_some();
            Ok(Outcome::Blocked { lapses_in })
        }
    }
}
