//! MySQL and MariaDB as a dialect of the SQL engine (`backend::sql`): its
//! statements are `Tables`', its batches flights of text statements
//! (`client.rs`), its tables InnoDB's, and its waiters woken by the
//! `GET_LOCK` of the place just ahead (a release or a grant frees it),
//! or asleep until what is in their way lapses where `GET_LOCK` is refused.

use std::time::Duration;

use mysql::Row;

use super::client::{Client, Woke, int, text};
use super::create;
use super::sql::{Tables, lit, wake_key};
use super::take::{Looking, commit, transaction};
use crate::backend::plan::Cut;
use crate::backend::quit::Leave;
use crate::backend::sql::{
    self, Blocked, Deciding, Dialect, Ours, Outcome, SqlHeld, SqlRow, capped, place_lasts,
};
use crate::backend::table::{Cells, Target};

/// How long a waiter sleeps behind places whose waiters hold no
/// connection, before it looks again (`wait`).
const FAR_AHEAD: Duration = Duration::from_millis(200);
use crate::backend::{Error, Held, Holder, Request};
use crate::clock::{Boot, backoff};

impl SqlRow for Row {
    fn int(&self, i: usize) -> Option<i64> {
        int(self, i)
    }
    fn text(&self, i: usize) -> Option<String> {
        text(self, i)
    }
    fn flag(&self, i: usize) -> Option<bool> {
        int(self, i).map(|v| v != 0)
    }
}

/// The server's number for a table that is not there.
pub(super) fn missing(code: Option<u16>) -> bool {
    code == Some(1146)
}

/// Looks in a row that may stall before the run gives up: a name's first
/// request makes its counter row once and looks again; tables that cut
/// or lose what lockrun writes stall every time.
const STALLS: u32 = 4;

/// A wait on the row just ahead that timed out with nothing moved: the
/// next one keeps our place first, on condition that row is still there.
pub struct Parked {
    target: Target,
    /// When the holder waited on lapses (a holder may lapse with its
    /// session alive: its lockrun stopped).
    lapse_at: Option<Boot>,
    keep: (String, String),
}

impl Dialect for Tables {
    type Client = Client;
    type Row = Row;
    type Parked = Parked;

    const LEAVES_OUT_BAD_ROWS: bool = true;

    fn missing(c: &Client) -> bool {
        missing(c.last_code)
    }

    fn holder_rows(&self, c: &mut Client, name: &str) -> Result<Vec<Row>, Error> {
        c.query(self.holders(name))
    }

    fn waiting_row(&self, c: &mut Client, name: &str) -> Result<Vec<Row>, Error> {
        c.query(self.waiting(name))
    }

    fn list_rows(&self, c: &mut Client, limit: u64, left: Duration) -> Result<Vec<Row>, Error> {
        let op = c.op;
        // A large table may take longer than one request's budget; the
        // listing's own bound is the limit.
        c.op = op.max(left);
        c.drop_connection();
        let got = c.query(self.list(limit));
        c.op = op;
        got
    }

    /// Writes follow: the same refusals as a run's, and rows logged where
    /// the binary log takes statements.
    fn before_force(&self, c: &mut Client) -> Result<(), Error> {
        create::check_engines(c, self).map(|_| ())
    }

    fn force(
        &self,
        c: &mut Client,
        name: &str,
        held: &[Holder],
        cuts: &[(usize, Cut)],
    ) -> Result<Vec<Holder>, Error> {
        let broken = transaction(c, self, name, vec!["SELECT 1".into()], |c, _| {
            let (broken, deleted) = sql::cut_each(held, cuts, |token, now| {
                let token = token as u64;
                let stmts = if now {
                    self.delete(name, token)
                } else {
                    self.revoke(name, token)
                };
                let sets = c.run(&stmts)?;
                Ok(sets[1].first().and_then(|r| int(r, 0)).unwrap_or(0) != 0)
            })?;
            let wake: Vec<String> = deleted
                .then(|| self.waiting_conns(name, !c.no_wake))
                .into_iter()
                .collect();
            let sets = commit(c, wake, Vec::new())?;
            if deleted {
                let conns: Vec<i64> = sets[0].iter().filter_map(|r| int(r, 0)).collect();
                c.poke(&conns);
            }
            Ok(broken)
        })?;
        Ok(broken.unwrap_or_default())
    }

    /// A blocking wait lasts at most the time to keep our place.
    fn begin(&self, c: &mut Client, req: &Request) {
        c.wait = place_lasts(req.timing.ttl) / 3 + Duration::from_secs(1);
    }

    /// The tables as they are found.
    fn prepare(&self, c: &mut Client) -> Result<bool, Error> {
        create::check_engines(c, self)
    }

    fn create(&self, c: &mut Client) -> Result<(), Error> {
        create::create(c, self).and_then(|()| create::check_engines(c, self).map(|_| ()))
    }

    fn look(
        &self,
        c: &mut Client,
        req: &Request,
        seq: Option<i64>,
        decide: impl FnOnce(&mut dyn Deciding, Vec<Cells>) -> Result<Outcome, Error>,
    ) -> Result<Option<Outcome>, Error> {
        let wake = !c.no_wake;
        // The places of waiters that are gone lapse first, and ours comes
        // back if that was done to it while we lived (`Tables::purge`);
        // not a --supersede place, which a newer one may have replaced
        // meanwhile (one that did not find it live).
        let mut first = vec![self.purge(req.name, &req.owner.secret, wake)];
        if let Some(seq) = seq.filter(|_| !req.group.supersede) {
            let keep_ms = place_lasts(req.timing.ttl).as_millis() as i64;
            first.push(self.revive(seq, &req.owner.secret, keep_ms, wake));
        }
        first.push(self.look(req.name, wake));
        transaction(c, self, req.name, first, |c, rows| {
            let cells = rows.iter().map(|r| Cells {
                kind: text(r, 0),
                pos: int(r, 1),
                owner: text(r, 2),
                label: text(r, 3),
                token: int(r, 4),
                code: text(r, 5),
                lim: int(r, 6),
                left_ms: int(r, 7),
                live: int(r, 8).unwrap_or(0) != 0,
                revoked: int(r, 9).unwrap_or(0) != 0,
            });
            let mut looking = Looking {
                c,
                tables: self,
                req,
            };
            decide(&mut looking, cells.collect())
        })
    }

    /// BIGINT out of range: a token past the largest.
    fn final_error(&self, c: &mut Client, name: &str) -> Option<Error> {
        (c.last_code == Some(1690)).then(|| create::tokens_used_up(c, self, name))
    }

    fn stalled(&self, c: &mut Client, tries: u32) -> Result<(), Error> {
        if tries >= STALLS {
            return Err(create::stalled(c, self, tries));
        }
        // Again without waiting: not at once.
        std::thread::sleep(backoff(
            tries - 1,
            Duration::from_millis(10),
            Duration::from_millis(500),
        ));
        Ok(())
    }

    /// The lease's connection holds its wake-up lock for the waiters, and
    /// serves its renewals and release with a spare opened beside the job
    /// (best effort: without it the renewals use the lease's connection).
    fn held(&self, c: &mut Client, req: &Request, slot: u32) -> Box<dyn Held> {
        let fresh = c.fresh();
        let mut client = std::mem::replace(c, fresh);
        client.wait = Duration::ZERO;
        let spare = |mut spare: Client| spare.run(&["DO 0".into()]).is_ok().then_some(spare);
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
        let owner = &req.owner.secret;
        let sets = match keep_ms {
            Some(ms) => c.run_bare(&self.keep_far(req.name, seq, owner, ms))?,
            None => c.run_bare(&[self.count_far(req.name, seq, owner)])?,
        };
        let counts = sets.last().and_then(|rows| rows.first());
        let count = |i: usize| counts.and_then(|r| int(r, i)).unwrap_or(0);
        if keep_ms.is_some() && count(2) == 0 {
            // A server whose sessions do not commit by themselves.
            c.run_bare(&["COMMIT".to_string()])?;
        }
        Ok((count(0) > 0).then(|| usize::try_from(count(1)).unwrap_or(0)))
    }

    /// No row changed means lost.
    fn renew(&self, c: &mut Client, o: &Ours<Tables>) -> Result<Option<String>, Error> {
        let sets = c.run(&self.renew(&o.name, o.slot, &o.owner, o.ttl_ms))?;
        let row = sets[1].first().filter(|row| int(row, 0).unwrap_or(0) != 0);
        Ok(row.map(|row| text(row, 1).unwrap_or_default()))
    }

    fn release(
        &self,
        c: &mut Client,
        o: &Ours<Tables>,
        window: i64,
    ) -> Result<(bool, bool), Error> {
        let mut stmts: Vec<String> = self.release(&o.name, o.slot, &o.owner, window).into();
        let wake = c.locked.is_some();
        if wake {
            // The waiter blocked on this lease wakes now.
            stmts.push(format!(
                "DO RELEASE_LOCK({})",
                wake_key('h', &lit(&o.owner))
            ));
        }
        let sets = match c.run(&stmts) {
            Err(e) if e.is_transient() => {
                if wake {
                    stmts.pop();
                }
                c.run(&stmts)
            }
            done => done,
        }?;
        let count = |i: usize| sets[i].first().and_then(|row| int(row, 0)).unwrap_or(0);
        let (kept, gone) = (count(1), count(3));
        Ok((kept > 0, kept + gone > 0))
    }

    fn wait(
        &self,
        c: &mut Client,
        req: &Request,
        seq: Option<i64>,
        until: Option<Boot>,
        blocked: Blocked<Parked>,
    ) -> Result<Option<Parked>, Error> {
        let keep = place_lasts(req.timing.ttl) / 3;
        let (target, lapse_at, keep_sql) = match blocked {
            Blocked::Parked(p) => (p.target, p.lapse_at, Some(p.keep)),
            Blocked::Looked {
                sent,
                lapses_in,
                wake_on,
                ahead,
            } => {
                let at = |d: Duration| sent.add(d + Duration::from_millis(5));
                let usable = !c.no_wake && c.connected();
                let Some(target) = wake_on.filter(|_| usable) else {
                    // Sleep until what is in our way lapses, or our place
                    // needs keeping; behind places whose waiters sleep
                    // without a connection (far back a moment ago, so
                    // no lock to block on), only a moment: one of them
                    // may be granted and gone before we would wake.
                    let nap = if usable && ahead > 0 { FAR_AHEAD } else { keep };
                    let until_lapse = lapses_in.map_or(keep, |d| at(d).since(Boot::now()));
                    std::thread::sleep(capped(until, nap.min(until_lapse)));
                    return Ok(None);
                };
                // Block on the row just ahead; a live place ahead keeps
                // itself (its lockrun's death ends its lock), a holder may
                // lapse with its session alive (its lockrun stopped).
                let lapse_at = (target.kind == 'h').then(|| at(target.left));
                (target, lapse_at, None)
            }
        };
        let until_lapse = lapse_at.map_or(keep, |t| t.since(Boot::now()));
        let nap = capped(until, keep.min(until_lapse));
        let woke = c.wait_for(target.kind, &target.owner, nap, keep_sql)?;
        let due = lapse_at.is_some_and(|t| Boot::now() >= t)
            || until.is_some_and(|u| u.since(Boot::now()) < Duration::from_millis(5));
        // Nothing moved ahead of us: keep our place and wait again without
        // a look, unless something is due (a lapse, the waiting line, the
        // end of the wait).
        let (Woke::TimedOut, false, Some(seq)) = (woke, due, seq) else {
            return Ok(None);
        };
        let keep_ms = place_lasts(req.timing.ttl).as_millis() as i64;
        // Keep our place, on condition that the row we block on is still there.
        let keep = (
            self.keep_place(seq, &req.owner.secret, keep_ms, !c.no_wake),
            self.still(req.name, target.kind, &target.owner, target.pos),
        );
        Ok(Some(Parked {
            target,
            lapse_at,
            keep,
        }))
    }

    fn dequeue(&self, c: &mut Client, req: &Request) {
        let _ = c.query(self.dequeue(req.name, &req.owner.secret));
    }

    fn way_out(&self, c: &Client, req: &Request) -> Leave {
        super::leave::way_out(c, self, req)
    }
}
