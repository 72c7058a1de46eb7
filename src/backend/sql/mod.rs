//! The SQL engine, written once for every SQL database: a lease is a row
//! of a table, not a session lock, so a reconnect or a proxy does not lose
//! it. One row per (name, slot) with its owner, token and expiry; every
//! time is the server's clock; waiters queue in a second table. A database
//! is a `Dialect`: its statements, how a flight of them runs, its error
//! table, and how a waiter is woken (PostgreSQL's LISTEN/NOTIFY, MySQL's
//! `GET_LOCK`). The rules of who may hold are `backend/table.rs`'s.
//!
//! By part: `take.rs` is the acquire step the driver runs, `look.rs`
//! what one look decides, carried out by the dialect inside the name's
//! transaction. This file holds the dialect seam, the engine and its
//! operators (status, the listing, `release --force`).

pub mod address;
pub mod doctor;
mod lease;
mod look;
mod take;

use std::time::Duration;

pub use crate::backend::plan::place_lasts;
pub use lease::{Ours, SqlHeld};
pub use look::{Deciding, Join};
pub use take::{Blocked, Outcome, capped};

use super::drive::Remote;
use super::plan::{self, Cut, ForcePlan, Standing};
use super::quit::Leave;
use super::table::{Cells, mode, split_label};
use super::{
    Acquired, Broken, Engine, Error, Force, Held, Holder, ListBound, Listing, Mode, Request,
    Status, Wait,
};
use crate::clock::Boot;
use crate::log;

/// A row as a dialect's driver returns it, read by column number.
pub trait SqlRow {
    fn int(&self, i: usize) -> Option<i64>;
    fn text(&self, i: usize) -> Option<String>;
    fn flag(&self, i: usize) -> Option<bool>;
}

/// What one SQL database adds to the engine: its statements (the dialect
/// value is its tables), its connection and how a batch runs on it.
pub trait Dialect: Clone + Send + 'static {
    type Client: AsRef<Remote> + Send + 'static;
    type Row: SqlRow;
    /// A wait that saw nothing move and goes on at the next step without a
    /// look (none where every wake-up is followed by a look).
    type Parked;

    /// The listing meets a lease row it cannot read (written by hand):
    /// true, that row is left out with a warning; false, the listing fails.
    const LEAVES_OUT_BAD_ROWS: bool;

    /// The last error said a table (or schema) is not there yet.
    fn missing(c: &Self::Client) -> bool;

    /// The live holders' rows of `name` (`holder_columns` order).
    fn holder_rows(&self, c: &mut Self::Client, name: &str) -> Result<Vec<Self::Row>, Error>;
    /// One row: the waiters of `name` and how many asked for `--supersede`.
    fn waiting_row(&self, c: &mut Self::Client, name: &str) -> Result<Vec<Self::Row>, Error>;
    /// Every name's rows, up to `limit` names, within `left`.
    fn list_rows(
        &self,
        c: &mut Self::Client,
        limit: u64,
        left: Duration,
    ) -> Result<Vec<Self::Row>, Error>;
    /// Before `release --force` writes.
    fn before_force(&self, _c: &mut Self::Client) -> Result<(), Error> {
        Ok(())
    }
    /// Cut `held` as `cuts` say, in one transaction under the name's lock
    /// (by `cut_each`), waking the waiters when a row went: the holders cut.
    fn force(
        &self,
        c: &mut Self::Client,
        name: &str,
        held: &[Holder],
        cuts: &[(usize, Cut)],
    ) -> Result<Vec<Holder>, Error>;

    /// Before the driver starts: the client's settings for this request.
    fn begin(&self, _c: &mut Self::Client, _req: &Request) {}
    /// At the first step, once per request: the tables as they are found.
    /// False when they are not all there yet, so were not checked: they
    /// are then made (or found made) and checked before any look, since
    /// a look at tables another request has just made could be a grant
    /// on tables that keep no one apart.
    fn prepare(&self, _c: &mut Self::Client) -> Result<bool, Error> {
        Ok(true)
    }
    /// Create lockrun's tables.
    fn create(&self, c: &mut Self::Client) -> Result<(), Error>;
    /// One look: a transaction under the name's lock that reads the name's
    /// live rows and hands them to `decide`, which ends it. None: the name
    /// was not ready for a look (look again).
    fn look(
        &self,
        c: &mut Self::Client,
        req: &Request,
        seq: Option<i64>,
        decide: impl FnOnce(&mut dyn Deciding, Vec<Cells>) -> Result<Outcome, Error>,
    ) -> Result<Option<Outcome>, Error>;
    /// A failed look whose error ends the request as another, clearer one.
    fn final_error(&self, _c: &mut Self::Client, _name: &str) -> Option<Error> {
        None
    }
    /// Looks in a row (`tries`) that neither waited nor decided: Err ends
    /// the request.
    fn stalled(&self, _c: &mut Self::Client, _tries: u32) -> Result<(), Error> {
        Ok(())
    }
    /// The granted lease's row, on a connection of its own (`SqlHeld`).
    fn held(&self, c: &mut Self::Client, req: &Request, slot: u32) -> Box<dyn Held>;
    /// A new client for the same database, not yet connected.
    fn fresh(c: &Self::Client) -> Self::Client;
    /// Close the connection (a waiter far back in the queue): the next
    /// call opens a new one.
    fn hang_up(c: &mut Self::Client);
    /// A waiter far back keeps its place `seq` for `keep_ms` more (None:
    /// it was kept lately, only see that it is still live), in one flight
    /// without the name's lock, and counts the live places before it.
    /// None: the place was not there to keep (replaced, lapsed): a look
    /// says what became of it.
    fn keep_far(
        &self,
        c: &mut Self::Client,
        req: &Request,
        seq: i64,
        keep_ms: Option<i64>,
    ) -> Result<Option<usize>, Error>;
    /// Extend our row by its ttl: the label of the row extended, or None
    /// when it is no longer ours.
    fn renew(&self, c: &mut Self::Client, ours: &Ours<Self>) -> Result<Option<String>, Error>;
    /// Release our row, keeping it `window_us` past its grant when that
    /// is later (`--min-hold`): whether it is kept, and whether it was
    /// ours. A connection that went while the job ran is tried once more.
    fn release(
        &self,
        c: &mut Self::Client,
        ours: &Ours<Self>,
        window_us: i64,
    ) -> Result<(bool, bool), Error>;
    /// Blocked: wait for news or until something is due, no later than
    /// `until`. Some: nothing moved, the next wait goes on without a look.
    fn wait(
        &self,
        c: &mut Self::Client,
        req: &Request,
        seq: Option<i64>,
        until: Option<Boot>,
        blocked: Blocked<Self::Parked>,
    ) -> Result<Option<Self::Parked>, Error>;
    /// Give up our place in the queue (best effort).
    fn dequeue(&self, c: &mut Self::Client, req: &Request);
    /// The same from another thread on a connection of its own, with any
    /// grant of ours (`quit`).
    fn way_out(&self, c: &Self::Client, req: &Request) -> Leave;
}

/// The SQL engine at one database.
pub struct Sql<D: Dialect> {
    pub client: D::Client,
    pub dialect: D,
}

impl<D: Dialect> Sql<D> {
    pub fn new(client: D::Client, dialect: D) -> Sql<D> {
        Sql { client, dialect }
    }

    /// The live holders of `name`, oldest grant first; none while the
    /// tables do not exist yet (reading never creates them).
    fn holders(&mut self, name: &str) -> Result<Vec<Holder>, Error> {
        let rows = match self.dialect.holder_rows(&mut self.client, name) {
            Ok(rows) => rows,
            Err(_) if D::missing(&self.client) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        rows.iter().map(|r| holder_of(r, 0)).collect()
    }
}

/// A holder from the columns `holder_columns` names, from column `at` on.
/// Every column but the slot is read as possibly NULL: a table made by
/// hand may allow it, and `status` must still show what is there.
pub fn holder_of(r: &impl SqlRow, at: usize) -> Result<Holder, Error> {
    let m = mode(
        &r.text(at + 3).unwrap_or_default(),
        r.int(at + 4).unwrap_or(1),
    )?;
    let ms = |v: Option<i64>| Duration::from_millis(v.unwrap_or(0).max(0) as u64);
    let stored = r.text(at + 1).unwrap_or_default();
    let (label, preempted_by) = split_label(&stored);
    let min_hold = r.flag(at + 8).unwrap_or(false);
    Ok(Holder {
        label: Some(label.to_string()).filter(|l| !l.is_empty()),
        token: r.int(at + 2).map(|t| t.max(0) as u64),
        mode: m,
        slot: matches!(m, Mode::Limit(_))
            .then(|| r.int(at).unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32),
        ttl_left: Some(ms(r.int(at + 6))),
        held_for: Some(ms(r.int(at + 7))),
        revoked: r.flag(at + 5).unwrap_or(false),
        min_hold,
        // A window runs no job: nothing to stop (an older lockrun keeps
        // the label of a marked lease in its window).
        preempted_by: preempted_by.filter(|_| !min_hold).map(String::from),
    })
}

/// `release --force`'s plan carried out in the dialect's transaction:
/// each cut deletes its holder's row or revokes it (the row then stays
/// until it would have ended: nobody else gets in early, and its holder's
/// renewal finds it gone); `one(token, delete)` says whether the row was
/// still there. The holders cut, as shown, and whether a row went (the
/// waiters then look again now, rather than when its lockrun ends).
pub fn cut_each(
    held: &[Holder],
    cuts: &[(usize, Cut)],
    mut one: impl FnMut(i64, bool) -> Result<bool, Error>,
) -> Result<(Vec<Holder>, bool), Error> {
    let mut broken = Vec::new();
    let mut deleted = false;
    for &(i, cut) in cuts {
        let h = &held[i];
        if !one(h.token.unwrap_or(0) as i64, cut.deletes())? {
            // It changed hands since we looked: not the lease asked about.
            continue;
        }
        deleted |= cut.deletes();
        broken.push(cut.shown(h.clone()));
    }
    Ok((broken, deleted))
}

impl<D: Dialect> Engine for Sql<D> {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        take::take(self, req, wait)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let doing = format!("reading {name}");
        let holders = self
            .holders(name)
            .map_err(|e| self.client.as_ref().failed(&doing, e))?;
        let (waiters, superseding) = match self.dialect.waiting_row(&mut self.client, name) {
            Ok(rows) => rows.first().map_or((0, 0), |r| {
                let n = |i: usize| r.int(i).unwrap_or(0).max(0) as u64;
                (n(0), n(1))
            }),
            Err(_) if D::missing(&self.client) => (0, 0),
            Err(e) => return Err(self.client.as_ref().failed(&doing, e)),
        };
        Ok(Status {
            holders,
            waiters: Some(waiters),
            superseding: Some(superseding),
        })
    }

    /// The names of the listing, which reads them with their state.
    fn names(&mut self, bound: ListBound) -> Result<plan::Names, Error> {
        let Listing { names, notes, .. } = self.list(bound)?;
        let names = names.into_iter().map(|(name, _)| name).collect();
        Ok(plan::Names { names, notes })
    }

    /// One statement reads every name with its holders and waiters: a
    /// snapshot, bounded in names by `bound` and in time by what is left
    /// of it. Missing tables are an empty list, never created.
    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let doing = "listing names";
        let limit = bound.names.saturating_add(1) as u64;
        let left = bound.until.since(Boot::now());
        let rows = match self.dialect.list_rows(&mut self.client, limit, left) {
            Ok(rows) => rows,
            Err(_) if D::missing(&self.client) => Vec::new(),
            Err(e) => return Err(self.client.as_ref().failed(doing, e)),
        };
        let mut names = listed::<D>(&rows)?;
        let mut notes = Vec::new();
        if names.len() > bound.names {
            names.truncate(bound.names);
            notes.push(plan::cut_short(bound.names));
        }
        Ok(Listing {
            names,
            notes,
            ..Listing::default()
        })
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let doing = format!("releasing {name}");
        self.dialect
            .before_force(&mut self.client)
            .map_err(|e| self.client.as_ref().failed(&doing, e))?;
        let held = self
            .holders(name)
            .map_err(|e| self.client.as_ref().failed(&doing, e))?;
        let standing: Vec<Standing> = held.iter().map(Standing::of).collect();
        let cuts = match plan::force(&standing, force) {
            ForcePlan::Done(done) => return Ok(done),
            ForcePlan::Cut(cuts) => cuts,
        };
        let broken = self
            .dialect
            .force(&mut self.client, name, &held, &cuts)
            .map_err(|e| self.client.as_ref().failed(&doing, e))?;
        Ok(plan::forced(broken))
    }
}

/// The listing's rows, one per holder (or one per name without any), in
/// name order: the names with their holders and waiters.
fn listed<D: Dialect>(rows: &[D::Row]) -> Result<Vec<(String, Status)>, Error> {
    let mut names: Vec<(String, Status)> = Vec::new();
    for r in rows {
        let name = r.text(0).unwrap_or_default();
        if names.last().is_none_or(|(n, _)| *n != name) {
            let n = |i: usize| r.int(i).unwrap_or(0).max(0) as u64;
            names.push((
                name,
                Status {
                    holders: Vec::new(),
                    waiters: Some(n(10)),
                    superseding: Some(n(11)),
                },
            ));
        }
        // The slot is never NULL in a holder's row (a primary key column).
        if r.int(1).is_none() {
            continue;
        }
        let (name, status) = names.last_mut().expect("pushed above");
        match holder_of(r, 1) {
            Ok(h) => status.holders.push(h),
            // A row written by hand: said, and the others listed.
            Err(e) if D::LEAVES_OUT_BAD_ROWS => log::warn(format!(
                "{}: a lease row left out: {e}",
                crate::text::printable(name)
            )),
            Err(e) => return Err(e),
        }
    }
    Ok(names)
}
