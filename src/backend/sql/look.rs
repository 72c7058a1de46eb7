//! What one look at a name decides, inside the name's transaction: the
//! rows judged by the rules the SQL dialects share (`backend/table.rs`),
//! then one ending the dialect carries out in a single flight with the
//! COMMIT (`Deciding`).

use super::take::{Outcome, Place};
use crate::backend::plan::{self, Standing, Stop};
use crate::backend::table::{Cells, Entry, Rows, Verdict, entries, judge};
use crate::backend::{Error, Group, Request};
use crate::log;

/// How a look's transaction ends, each in one flight with its COMMIT: the
/// dialect's statements for the request it looks for.
pub trait Deciding {
    /// A newer `--supersede` request took our place: its mark of ours goes.
    fn unmark(&mut self) -> Result<(), Error>;
    /// Nothing more, or (`leave`) our place goes.
    fn end(&mut self, leave: bool) -> Result<(), Error>;
    /// Renew the row we hold already (`leave`: our place goes too); None:
    /// it was not there to renew.
    fn renew(&mut self, slot: u32, leave: bool) -> Result<Option<u64>, Error>;
    /// Grant `slot`, replacing the superseding places first when
    /// `replacing`; `others_wait`: other places are in the queue. The token,
    /// or None when the grant did not take.
    fn grant(
        &mut self,
        slot: u32,
        replacing: bool,
        others_wait: bool,
    ) -> Result<Option<u64>, Error>;
    /// `--preempt` found `--min-hold` windows: they end now.
    fn end_windows(&mut self) -> Result<(), Error>;
    /// Join the queue or keep our place. None: nothing was committed (look
    /// again); else the place taken, when a new one was.
    fn join(&mut self, join: Join) -> Result<Option<Option<i64>>, Error>;
}

/// A blocked request's part in the queue, as the look decided.
pub struct Join {
    /// Our place, when we have one: it is kept.
    pub seq: Option<i64>,
    /// The superseding places that ask for it go.
    pub replacing: bool,
    /// Every holder of this moment is asked to stop.
    pub preempting: bool,
    /// Far back in the queue (`plan::NEAR`): the waiter hangs up after
    /// this look, so its place is kept by its expiry alone.
    pub far: bool,
}

/// One look at the name, inside its transaction: `rows` are its live rows.
pub fn decide(
    tx: &mut dyn Deciding,
    rows: Vec<Cells>,
    req: &Request,
    place: &mut Place,
    last: bool,
) -> Result<Outcome, Error> {
    let owner = &req.owner.secret;
    let Rows {
        holders,
        mut waiters,
        replaced,
    } = entries(rows)?;
    if let Some(mark) = replaced.iter().find(|m| &m.owner == owner) {
        // A newer --supersede request took our place. Its mark goes, and
        // an older lockrun that counted it as a place looks again.
        tx.unmark()?;
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
            tx.end(false)?;
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
    // The join rule reads every waiter ahead, the replaced among them.
    let ahead: Vec<Standing> = waiters
        .iter()
        .filter(|w| &w.owner != owner)
        .map(Entry::standing)
        .collect();
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
    let others_wait = waiters.iter().any(|w| &w.owner != owner);
    // The places before ours (all of them, joining now).
    let before_us = waiters
        .iter()
        .filter(|w| &w.owner != owner && place.seq.is_none_or(|s| w.pos < s))
        .count();
    let looked = Looked {
        holders: &holders,
        ahead: &ahead,
        before_us,
        replacing,
        others_wait,
    };
    carry(tx, verdict, &looked, req, place, last)
}

/// What the look saw, once judged.
struct Looked<'a> {
    holders: &'a [Entry],
    /// The waiters other than us, before any was replaced.
    ahead: &'a [Standing],
    /// The places before ours in the queue.
    before_us: usize,
    replacing: bool,
    others_wait: bool,
}

/// The verdict carried out.
fn carry(
    tx: &mut dyn Deciding,
    verdict: Verdict,
    looked: &Looked,
    req: &Request,
    place: &mut Place,
    last: bool,
) -> Result<Outcome, Error> {
    match verdict {
        Verdict::Ours { slot } => {
            let leave = place.seq.take().is_some();
            Ok(match tx.renew(slot, leave)? {
                Some(token) => Outcome::Granted { slot, token },
                None => Outcome::Again,
            })
        }
        Verdict::Granted { slot } => {
            // Granted only once the places it replaces are out of the way;
            // the next in line may hold beside us (readers, a limit), and
            // a replaced waiter learns it.
            let granted = tx.grant(slot, looked.replacing, looked.others_wait)?;
            // The grant took our place in the queue with it.
            place.seq = None;
            Ok(match granted {
                Some(token) => Outcome::Granted { slot, token },
                None => Outcome::Again,
            })
        }
        Verdict::Nested => {
            tx.end(place.seq.take().is_some())?;
            Ok(Outcome::Refused(crate::backend::nested(req.name)))
        }
        Verdict::Disagrees(in_force) => {
            tx.end(place.seq.take().is_some())?;
            Ok(Outcome::Refused(req.mode.disagreement(req.name, in_force)))
        }
        Verdict::Blocked {
            holder,
            lapses_in,
            wake_on,
        } => {
            place.holder = holder.or(place.holder.take());
            if last {
                tx.end(place.seq.take().is_some())?;
                return Ok(Outcome::Busy);
            }
            if let Some(refused) = joining(tx, looked, req, place)? {
                return Ok(refused);
            }
            Ok(Outcome::Blocked {
                lapses_in,
                wake_on,
                ahead: looked.before_us,
            })
        }
    }
}

/// A blocked request takes or keeps its place, carrying out the join
/// plan (`plan::join`): joining for the first time is the one step that
/// judges `--max-waiters` and `--preempt`, under the name's lock; one that
/// joins again after its place lapsed still replaces. Some: it did not
/// join, and why.
fn joining(
    tx: &mut dyn Deciding,
    looked: &Looked,
    req: &Request,
    place: &mut Place,
) -> Result<Option<Outcome>, Error> {
    let first = place.seq.is_none() && !place.joined;
    let group = match place.seq {
        // Keeping our place: nothing to judge.
        Some(_) => Group::default(),
        None if first => req.group,
        None => Group {
            max_waiters: None,
            preempt: false,
            ..req.group
        },
    };
    let holders: Vec<Standing> = looked.holders.iter().map(Entry::standing).collect();
    let plan = plan::join(group, &holders, looked.ahead);
    if let Some(waiting) = plan.full {
        // Not queued, nothing replaced: no trace.
        tx.end(false)?;
        return Ok(Some(Outcome::QueueFull { waiting }));
    }
    if plan.preempt.iter().any(|&(_, stop)| stop == Stop::End) {
        // --min-hold windows run no job: they end at once, and the name is
        // looked at again.
        tx.end_windows()?;
        return Ok(Some(Outcome::Again));
    }
    // The statements are set-based: the plan says whether each runs.
    let join = Join {
        seq: place.seq,
        replacing: !plan.replace.is_empty(),
        preempting: plan.preempt.iter().any(|&(_, stop)| stop == Stop::Mark),
        far: plan::is_far(looked.before_us, plan::far_nap(req.timing.ttl)),
    };
    let Some(taken) = tx.join(join)? else {
        return Ok(Some(Outcome::Again));
    };
    if place.seq.is_none() {
        place.seq = taken;
    }
    place.joined |= place.seq.is_some();
    Ok(None)
}
