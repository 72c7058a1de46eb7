//! PostgreSQL as a dialect of the SQL engine (`backend::sql`): its
//! statements are `Tables`', its batches flights of the extended protocol
//! (`client.rs`), its tables created in a schema of their own, and its
//! waiters woken by `LISTEN`/`NOTIFY` on the name's channel.

use std::convert::Infallible;
use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::{ToSql, Type};

use super::client::{Call, Client};
use super::sql::Tables;
use super::take::{Looking, commit, transaction};
use crate::backend::plan::{Cut, woken};
use crate::backend::quit::Leave;
use crate::backend::sql::{
    self, Blocked, Deciding, Dialect, Ours, Outcome, SqlHeld, SqlRow, capped, place_lasts,
};
use crate::backend::table::Cells;
use crate::backend::{Error, Held, Holder, Request};
use crate::clock::Boot;
use crate::log;

impl SqlRow for Row {
    fn int(&self, i: usize) -> Option<i64> {
        match self.try_get::<_, Option<i64>>(i) {
            Ok(v) => v,
            Err(_) => self
                .try_get::<_, Option<i32>>(i)
                .ok()
                .flatten()
                .map(i64::from),
        }
    }
    fn text(&self, i: usize) -> Option<String> {
        self.try_get::<_, Option<String>>(i).ok().flatten()
    }
    fn flag(&self, i: usize) -> Option<bool> {
        self.try_get::<_, Option<bool>>(i).ok().flatten()
    }
}

/// SQLSTATEs of a table or schema that is not there yet.
pub(super) fn missing(code: Option<&str>) -> bool {
    matches!(code, Some("42P01" | "3F000"))
}

impl Dialect for Tables {
    type Client = Client;
    type Row = Row;
    /// Every notification is followed by a look.
    type Parked = Infallible;

    const LEAVES_OUT_BAD_ROWS: bool = false;

    fn missing(c: &Client) -> bool {
        missing(c.last_code.as_deref())
    }

    fn holder_rows(&self, c: &mut Client, name: &str) -> Result<Vec<Row>, Error> {
        c.query(&self.holders(), &[(&name, Type::TEXT)])
    }

    fn waiting_row(&self, c: &mut Client, name: &str) -> Result<Vec<Row>, Error> {
        c.query(&self.waiting(), &[(&name, Type::TEXT)])
    }

    fn list_rows(&self, c: &mut Client, limit: u64, left: Duration) -> Result<Vec<Row>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let op = c.op;
        // A large table may take longer than one request's budget; the
        // listing's own bound is the limit.
        c.op = op.max(left);
        let got = c.query(&self.list(), &[(&limit, Type::INT8)]);
        c.op = op;
        got
    }

    fn force(
        &self,
        c: &mut Client,
        name: &str,
        held: &[Holder],
        cuts: &[(usize, Cut)],
    ) -> Result<Vec<Holder>, Error> {
        let channel = self.channel(name);
        transaction(c, self, name, ("SELECT 1", &[]), |c, _| {
            let (broken, deleted) = sql::cut_each(held, cuts, |token, now| {
                let stmt = if now { self.delete() } else { self.revoke() };
                let params: [(&(dyn ToSql + Sync), Type); 2] =
                    [(&name, Type::TEXT), (&token, Type::INT8)];
                Ok(!c.query(&stmt, &params)?.is_empty())
            })?;
            let wake: [(&(dyn ToSql + Sync), Type); 1] = [(&channel, Type::TEXT)];
            let last: Vec<Call> = deleted
                .then_some(Call::Query(self.notify(), &wake))
                .into_iter()
                .collect();
            commit(c, &last)?;
            Ok(broken)
        })
    }

    /// Create lockrun's tables in the schema (lockrun-engines(7) "POSTGRESQL").
    fn create(&self, c: &mut Client) -> Result<(), Error> {
        log::info(format!(
            "creating lockrun's tables in schema {}",
            self.schema
        ));
        let Err(e) = c.batch(&self.create()) else {
            return Ok(());
        };
        // A failed transaction leaves the connection unusable.
        c.drop_connection();
        Err(match e {
            Error::Refused(m) if c.last_code.as_deref() == Some("42501") => {
                // The server's words, without the hint about grants to use
                // the tables: here they do not exist yet.
                let why = m.split("; ").next().unwrap_or(&m);
                Error::Refused(format!(
                    "cannot create lockrun's tables in schema {}: {why}; create them \
                     once as a role that may (lockrun-engines(7) \"POSTGRESQL\")",
                    self.schema
                ))
            }
            e => e,
        })
    }

    fn look(
        &self,
        c: &mut Client,
        req: &Request,
        _seq: Option<i64>,
        decide: impl FnOnce(&mut dyn Deciding, Vec<Cells>) -> Result<Outcome, Error>,
    ) -> Result<Option<Outcome>, Error> {
        let channel = self.channel(req.name);
        // Notifications from before this look are answered by it.
        c.drain();
        let look = self.look();
        let first: (&str, &[(&(dyn ToSql + Sync), Type)]) = (&look, &[(&req.name, Type::TEXT)]);
        transaction(c, self, req.name, first, |c, rows| {
            let cells = rows.iter().map(|r| Cells {
                kind: r.get(0),
                pos: r.get(1),
                owner: r.get(2),
                label: r.get(3),
                token: r.get(4),
                code: r.get(5),
                lim: r.get::<_, Option<i32>>(6).map(i64::from),
                left_ms: r.get(7),
                live: false,
                revoked: r.get::<_, Option<bool>>(8).unwrap_or(false),
            });
            let mut looking = Looking {
                c,
                tables: self,
                req,
                channel: &channel,
            };
            decide(&mut looking, cells.collect())
        })
        .map(Some)
    }

    /// The lease keeps this connection, listening no more, for its
    /// renewals and its release, and a spare opened beside the job (best
    /// effort): on a
    /// server whose connections the waiters have all taken, the holder
    /// needs no new one.
    fn held(&self, c: &mut Client, req: &Request, slot: u32) -> Box<dyn Held> {
        c.unlisten();
        let fresh = c.fresh();
        let client = std::mem::replace(c, fresh);
        let spare = |mut spare: Client| spare.batch("SELECT 1").is_ok().then_some(spare);
        Box::new(SqlHeld::new(client, self, req, slot, spare))
    }

    fn fresh(c: &Client) -> Client {
        c.fresh()
    }

    fn hang_up(c: &mut Client) {
        c.drop_connection();
    }

    fn keep_far(
        &self,
        c: &mut Client,
        req: &Request,
        seq: i64,
        keep_ms: Option<i64>,
    ) -> Result<Option<usize>, Error> {
        let mut params: Vec<(&(dyn ToSql + Sync), Type)> = vec![
            (&req.name, Type::TEXT),
            (&seq, Type::INT8),
            (&req.owner.secret, Type::TEXT),
        ];
        let stmt = match &keep_ms {
            Some(ms) => {
                params.push((ms, Type::INT8));
                self.keep_far()
            }
            None => self.count_far(),
        };
        let rows = c.query(&stmt, &params)?;
        Ok(rows
            .first()
            .map(|r| usize::try_from(r.get::<_, i64>(0)).unwrap_or(0)))
    }

    /// One statement: no row back means lost.
    fn renew(&self, c: &mut Client, o: &Ours<Tables>) -> Result<Option<String>, Error> {
        let slot = o.slot as i32;
        let rows = c.query(
            &self.renew(),
            &[
                (&o.name, Type::TEXT),
                (&slot, Type::INT4),
                (&o.owner, Type::TEXT),
                (&o.ttl_ms, Type::INT8),
            ],
        )?;
        Ok(rows
            .first()
            .map(|row| row.get::<_, Option<String>>(1).unwrap_or_default()))
    }

    fn release(
        &self,
        c: &mut Client,
        o: &Ours<Tables>,
        window: i64,
    ) -> Result<(bool, bool), Error> {
        let (slot, channel) = (o.slot as i32, self.channel(&o.name));
        let params: [(&(dyn ToSql + Sync), Type); 5] = [
            (&o.name, Type::TEXT),
            (&slot, Type::INT4),
            (&o.owner, Type::TEXT),
            (&channel, Type::TEXT),
            (&window, Type::INT8),
        ];
        let sql = self.release();
        let rows = match c.query(&sql, &params) {
            Err(e) if e.is_transient() => c.query(&sql, &params),
            done => done,
        }?;
        let count = |i: usize| rows.first().map_or(0, |row| row.get::<_, i64>(i));
        Ok((count(1) > 0, count(0) > 0))
    }

    fn wait(
        &self,
        c: &mut Client,
        req: &Request,
        seq: Option<i64>,
        until: Option<Boot>,
        blocked: Blocked<Infallible>,
    ) -> Result<Option<Infallible>, Error> {
        let lapses_in = match blocked {
            Blocked::Looked { lapses_in, .. } => lapses_in,
            Blocked::Parked(never) => match never {},
        };
        let channel = self.channel(req.name);
        if !c.listens(&channel) {
            // Listening from now on: look once more, so that a release
            // between the look and the LISTEN is not missed.
            c.listen(&channel)?;
            return Ok(None);
        }
        // Keep our place in time; wake a little after what is in our way
        // lapses (the server's clock said when).
        let keep = place_lasts(req.timing.ttl) / 3;
        let until_lapse = lapses_in.map_or(keep, |d| d + Duration::from_millis(5));
        let end = Boot::now().add(capped(until, keep.min(until_lapse)));
        // A notification that names a head of the queue too far ahead of
        // our place to let us in is slept through.
        let near = |payload: &str| match (payload.parse::<i64>(), seq) {
            (Ok(head), Some(seq)) => seq - head < woken(req.mode),
            _ => true,
        };
        loop {
            match c.wait_note(end.since(Boot::now()))? {
                Some(payload) if !near(&payload) => continue,
                _ => return Ok(None),
            }
        }
    }

    /// Best effort: a place lapses on its own within a third of the ttl.
    fn dequeue(&self, c: &mut Client, req: &Request) {
        let _ = c.query(
            &self.dequeue(),
            &[(&req.name, Type::TEXT), (&req.owner.secret, Type::TEXT)],
        );
    }

    fn way_out(&self, c: &Client, req: &Request) -> Leave {
        super::leave::way_out(c, self, req)
    }
}
