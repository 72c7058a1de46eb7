//! PostgreSQL's part of a look: how a transaction runs (the name's
//! advisory lock, statements in flights), the statements each ending of a
//! look sends (`sql::Deciding`), and how a waiter sleeps: until a
//! notification, the lapse of what stands in its way, or the time to keep
//! its place, whichever the driver's patience allows first.

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::client::{Call, Client, Params};
use super::sql::Tables;
use crate::backend::Error;
use crate::backend::Request;
use crate::backend::sql::{Deciding, Join, place_lasts};
use crate::backend::table::{PREEMPTED, SUPERSEDE};

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

/// One look's ending, on PostgreSQL: the statements for `req`'s name,
/// sent with the COMMIT of the look's transaction.
pub(super) struct Looking<'a> {
    pub c: &'a mut Client,
    pub tables: &'a Tables,
    pub req: &'a Request<'a>,
    pub channel: &'a str,
}

impl Looking<'_> {
    fn ms(d: Duration) -> i64 {
        d.as_millis() as i64
    }

    /// The end of the transaction: `last`, then, when `wake`, a
    /// notification for the name's waiters, and the COMMIT.
    fn commit(&mut self, last: Vec<Call>, wake: bool) -> Result<Vec<Vec<Row>>, Error> {
        self.commit_waking(last, wake.then_some(Wake::All))
    }

    fn commit_waking(
        &mut self,
        last: Vec<Call>,
        wake: Option<Wake>,
    ) -> Result<Vec<Vec<Row>>, Error> {
        let (channel, name) = (&self.channel, &self.req.name);
        let wake_params: [(&(dyn ToSql + Sync), Type); 1] = [(channel, Type::TEXT)];
        let front_params: [(&(dyn ToSql + Sync), Type); 2] =
            [(channel, Type::TEXT), (name, Type::TEXT)];
        let front = self.tables.notify_front();
        let mut calls: Vec<Call> = last;
        match wake {
            Some(Wake::All) => calls.push(Call::Query(self.tables.notify(), &wake_params)),
            Some(Wake::Front) => calls.push(Call::Query(&front, &front_params)),
            None => {}
        }
        commit(self.c, &calls)
    }
}

/// Whom a transaction's notification wakes.
enum Wake {
    /// Every waiter of the name: each must see what changed (a mark, a
    /// place replaced, a window ended).
    All,
    /// The front of the queue, the only waiters a grant or a release
    /// can let in.
    Front,
}

impl Deciding for Looking<'_> {
    fn unmark(&mut self) -> Result<(), Error> {
        let (name, owner) = (&self.req.name, &self.req.owner.secret);
        let dequeue = self.tables.dequeue();
        let who: [(&(dyn ToSql + Sync), Type); 2] = [(name, Type::TEXT), (owner, Type::TEXT)];
        self.commit(vec![Call::Query(&dequeue, &who)], true)
            .map(|_| ())
    }

    fn end(&mut self, leave: bool) -> Result<(), Error> {
        let (name, owner) = (&self.req.name, &self.req.owner.secret);
        let dequeue = self.tables.dequeue();
        let who: [(&(dyn ToSql + Sync), Type); 2] = [(name, Type::TEXT), (owner, Type::TEXT)];
        let last = leave.then_some(Call::Query(&dequeue, &who));
        self.commit(last.into_iter().collect(), false).map(|_| ())
    }

    fn renew(&mut self, slot: u32, leave: bool) -> Result<Option<u64>, Error> {
        let (name, owner) = (&self.req.name, &self.req.owner.secret);
        let (slot_i, ttl_ms) = (slot as i32, Self::ms(self.req.timing.ttl));
        let (renew, dequeue) = (self.tables.renew(), self.tables.dequeue());
        let params: [(&(dyn ToSql + Sync), Type); 4] = [
            (name, Type::TEXT),
            (&slot_i, Type::INT4),
            (owner, Type::TEXT),
            (&ttl_ms, Type::INT8),
        ];
        let who: [(&(dyn ToSql + Sync), Type); 2] = [(name, Type::TEXT), (owner, Type::TEXT)];
        let mut last = vec![Call::Query(&renew, &params)];
        last.extend(leave.then_some(Call::Query(&dequeue, &who)));
        let rows = self.commit(last, false)?;
        Ok(rows[0].first().map(|r| r.get::<_, i64>(0) as u64))
    }

    fn grant(
        &mut self,
        slot: u32,
        replacing: bool,
        others_wait: bool,
    ) -> Result<Option<u64>, Error> {
        let req = self.req;
        let (name, owner) = (&req.name, &req.owner.secret);
        let (slot_i, ttl_ms) = (slot as i32, Self::ms(req.timing.ttl));
        let keep_ms = Self::ms(place_lasts(req.timing.ttl));
        let (mode, lim) = (req.mode.code(), req.mode.limit() as i32);
        let (grant, token_lock, replace) = (
            self.tables.grant(),
            self.tables.token_lock(),
            self.tables.replace(),
        );
        let params: [(&(dyn ToSql + Sync), Type); 7] = [
            (name, Type::TEXT),
            (&slot_i, Type::INT4),
            (owner, Type::TEXT),
            (&req.owner.shown, Type::TEXT),
            (&mode, Type::TEXT),
            (&lim, Type::INT4),
            (&ttl_ms, Type::INT8),
        ];
        let replace_params: [(&(dyn ToSql + Sync), Type); 3] = [
            (name, Type::TEXT),
            (&req.owner.shown, Type::TEXT),
            (&keep_ms, Type::INT8),
        ];
        let mut last: Vec<Call> = replacing
            .then_some(Call::Query(&replace, &replace_params))
            .into_iter()
            .collect();
        last.push(Call::Batch(&token_lock));
        let granted = last.len();
        last.push(Call::Query(&grant, &params));
        // The next in line may hold beside us, and a replaced waiter
        // learns it: each looks again now rather than at its nap's end.
        let wake = if replacing {
            Some(Wake::All)
        } else {
            others_wait.then_some(Wake::Front)
        };
        let rows = self.commit_waking(last, wake)?;
        Ok(rows[granted]
            .first()
            .map(|r| r.get::<_, i64>(0).max(0) as u64))
    }

    fn end_windows(&mut self) -> Result<(), Error> {
        let end = self.tables.end_windows();
        let just_name: [(&(dyn ToSql + Sync), Type); 1] = [(&self.req.name, Type::TEXT)];
        self.commit(vec![Call::Query(&end, &just_name)], true)
            .map(|_| ())
    }

    fn join(&mut self, join: Join) -> Result<Option<Option<i64>>, Error> {
        let req = self.req;
        let (name, owner) = (&req.name, &req.owner.secret);
        let keep_ms = Self::ms(place_lasts(req.timing.ttl));

        let (mode, lim) = (req.mode.code(), req.mode.limit() as i32);
        let t = self.tables;
        let (keep, enqueue, preempt, replace) =
            (t.keep_place(), t.enqueue(), t.preempt(), t.replace());
        let seq = join.seq.unwrap_or(0);
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
        let preempt_params: [(&(dyn ToSql + Sync), Type); 3] =
            [(name, Type::TEXT), (&mark, Type::TEXT), (owner, Type::TEXT)];
        let replace_params: [(&(dyn ToSql + Sync), Type); 3] = [
            (name, Type::TEXT),
            (&req.owner.shown, Type::TEXT),
            (&keep_ms, Type::INT8),
        ];
        let mut last: Vec<Call> = join
            .replacing
            .then_some(Call::Query(&replace, &replace_params))
            .into_iter()
            .collect();
        if join.preempting {
            // Every holder of this moment is asked to stop; its owner
            // stays, to release once its job is dead.
            last.push(Call::Query(&preempt, &preempt_params));
        }
        let queued = last.len();
        last.push(match join.seq {
            Some(_) => Call::Query(&keep, &keep_params),
            None => Call::Query(&enqueue, &enqueue_params),
        });
        // The replaced waiters learn it now.
        let rows = self.commit(last, join.replacing)?;
        Ok(Some(rows[queued].first().map(|r| r.get::<_, i64>(0))))
    }
}
