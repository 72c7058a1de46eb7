//! The lease table the SQL engines (PostgreSQL, MySQL and MariaDB) share:
//! the marks its columns carry, a name's rows read into types, and judged.
//! The live leases are the holders, the live places in the queue the
//! waiters, oldest first. Pure: what to do about it is each engine's.

use std::time::Duration;

use crate::backend::admit::{self, Place};
use crate::backend::plan::Standing;
use crate::backend::{Error, Mode, Request};

/// The owner value of a row kept by `--min-hold` after its job ended:
/// never an owner secret (those are 32 hex digits), so no renewal, release
/// or grant retry takes it for its own (lockrun(1) "Once per window").
pub const KEPT: &str = "min-hold";

/// The concurrency groups (lockrun(1) "Concurrency groups") live in the
/// columns every lockrun's tables have, so tables made by an older lockrun
/// and the grants lockrun-engines(7) lists serve them unchanged, and an
/// older lockrun beside a newer one reads every mark safely.
///
/// A place in the queue asked for by `--supersede`: its owner column holds
/// this prefix before the owner value. An older lockrun compares a
/// waiter's owner with its own value alone, so to it this is anyone's place.
pub const SUPERSEDE: &str = "supersede:";

/// A place taken out of the queue by a newer `--supersede` request: its
/// owner column becomes this prefix before what it held, its label the
/// newer request's, until the waiter reads it (woken at once) or it lapses
/// as any place does. An older lockrun counts it as a place for that long.
pub const REPLACED: &str = "replaced:";

/// A holder asked to stop by a `--preempt` request: its label continues
/// with this, then the request's label. The control character is in no
/// label (`--label` refuses them), so the two are told apart; an older
/// lockrun renews the lease as before (its job runs on to its end) and
/// shows the mark as part of the label.
pub const PREEMPTED: &str = " \u{1f}preempted by ";

/// A stored label and the request that preempted its holder, if one did.
pub fn split_label(stored: &str) -> (&str, Option<&str>) {
    match stored.split_once(PREEMPTED) {
        Some((label, by)) => (label, Some(by)),
        None => (stored, None),
    }
}

/// One live row of a name.
#[derive(Debug, Clone)]
pub struct Entry {
    pub holder: bool,
    /// A holder's slot, a waiter's place in the queue.
    pub pos: i64,
    /// The owner value, without the marks a place's owner column carries.
    pub owner: String,
    /// Without a preemption mark.
    pub label: String,
    /// A place that asked for `--supersede`.
    pub supersede: bool,
    pub token: u64,
    pub mode: Mode,
    /// Until it lapses, on the server's clock.
    pub left: Duration,
    /// Its session holds its wake-up lock, so a wait on it ends when it
    /// goes (MySQL; PostgreSQL wakes waiters by notification instead).
    pub live: bool,
    /// A holder revoked by `release --force`.
    pub revoked: bool,
    /// A holder a `--preempt` request asked to stop already.
    pub preempted: bool,
}

impl Entry {
    /// The row as the join rule sees it.
    pub fn standing(&self) -> Standing {
        Standing {
            token: Some(self.token),
            revoked: self.revoked,
            preempted: self.preempted,
            // A row kept by --min-hold is no lockrun's job any more.
            window: self.owner == KEPT,
            supersede: self.supersede,
        }
    }
}

fn ms(v: i64) -> Duration {
    Duration::from_millis(v.max(0) as u64)
}

/// The mode a stored letter and limit stand for; a letter lockrun never
/// writes means the rows are not lockrun's.
pub fn mode(code: &str, lim: i64) -> Result<Mode, Error> {
    match code {
        "x" | "s" | "n" => Ok(Mode::from_code(
            code,
            Some(lim.clamp(1, i64::from(u32::MAX)) as u32),
        )),
        other => Err(Error::Refused(format!(
            "a row of lockrun's lease table holds the mode {:?}, which lockrun never writes: \
             the table is not lockrun's; remove it or choose another --prefix",
            other.chars().take(10).collect::<String>()
        ))),
    }
}

/// A name's live rows, read.
#[derive(Debug, Default)]
pub struct Rows {
    /// By token.
    pub holders: Vec<Entry>,
    /// By arrival.
    pub waiters: Vec<Entry>,
    /// Places a newer `--supersede` request replaced, each with its label.
    pub replaced: Vec<Entry>,
}

/// One row as an engine's driver read it: its kind (`h` for a holder),
/// slot or place, owner and label columns, token, mode letter and limit,
/// milliseconds until it lapses, and (MySQL) whether its session is alive.
/// A table made by hand may allow NULLs: they are read as empty.
#[derive(Debug, Default)]
pub struct Cells {
    pub kind: Option<String>,
    pub pos: Option<i64>,
    pub owner: Option<String>,
    pub label: Option<String>,
    pub token: Option<i64>,
    pub code: Option<String>,
    pub lim: Option<i64>,
    pub left_ms: Option<i64>,
    pub live: bool,
    /// A holder's row revoked by `release --force`.
    pub revoked: bool,
}

/// A name's rows, read.
pub fn entries(rows: impl IntoIterator<Item = Cells>) -> Result<Rows, Error> {
    let mut out = Rows::default();
    for r in rows {
        let holder = r.kind.as_deref() == Some("h");
        let owner = r.owner.unwrap_or_default();
        let label = r.label.unwrap_or_default();
        let (owner, replaced) = match owner.strip_prefix(REPLACED) {
            Some(o) if !holder => (o.to_string(), true),
            _ => (owner, false),
        };
        let (owner, supersede) = match owner.strip_prefix(SUPERSEDE) {
            Some(o) if !holder => (o.to_string(), true),
            _ => (owner, false),
        };
        let e = Entry {
            holder,
            pos: r.pos.unwrap_or(0),
            owner,
            label: split_label(&label).0.to_string(),
            preempted: split_label(&label).1.is_some(),
            revoked: r.revoked,
            supersede,
            token: r.token.unwrap_or(0).max(0) as u64,
            mode: mode(&r.code.unwrap_or_default(), r.lim.unwrap_or(1))?,
            left: ms(r.left_ms.unwrap_or(0)),
            live: r.live,
        };
        if e.holder {
            out.holders.push(e);
        } else if replaced {
            out.replaced.push(e);
        } else {
            out.waiters.push(e);
        }
    }
    out.holders.sort_by_key(|e| e.token);
    out.waiters.sort_by_key(|e| e.pos);
    Ok(out)
}

/// The row a waiter blocks on: its wake-up lock's kind and owner column,
/// its slot or place, and until it lapses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: char,
    pub owner: String,
    pub pos: i64,
    pub left: Duration,
}

/// What a request may do.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Take this slot.
    Granted { slot: u32 },
    /// We hold it already (a grant whose reply was lost).
    Ours { slot: u32 },
    /// Wait; the first holder's label, and when the soonest of what stands
    /// in our way lapses by itself.
    Blocked {
        holder: Option<String>,
        lapses_in: Option<Duration>,
        /// What to block on: the nearest live place ahead of ours, else
        /// a live holder.
        wake_on: Option<Target>,
    },
    /// The holders hold the name in this other mode.
    Disagrees(Mode),
    /// The outer lockrun holds it.
    Nested,
}

/// Judge a request whose place in the queue is `seq` (None: not queued,
/// so behind every waiter) by the admission rule: the holders are the live
/// leases, the waiters ahead of us the places before ours.
pub fn judge(holders: &[Entry], waiters: &[Entry], seq: Option<i64>, req: &Request) -> Verdict {
    let me = &req.owner.secret;
    let place = |e: &Entry| Place {
        mode: e.mode,
        slot: matches!(e.mode, Mode::Limit(_)).then_some(e.pos.max(0) as u32),
        // A row kept by --min-hold is no lockrun's job any more.
        window: e.owner == KEPT,
        outer: req.is_own_outer_holder(Some(&e.label)),
        ours: &e.owner == me,
    };
    let ahead: Vec<&Entry> = waiters
        .iter()
        .filter(|w| &w.owner != me && seq.is_none_or(|s| w.pos < s))
        .collect();
    let held: Vec<Place> = holders.iter().map(place).collect();
    let queued: Vec<Place> = ahead.iter().map(|w| place(w)).collect();
    match admit::admit(&held, &queued, req.mode, None) {
        admit::Verdict::Ours(i) => Verdict::Ours {
            slot: holders[i].pos.max(0) as u32,
        },
        admit::Verdict::Nested => Verdict::Nested,
        admit::Verdict::Disagrees(mode) => Verdict::Disagrees(mode),
        admit::Verdict::Hold { slot } => Verdict::Granted {
            // A row's slot is its key, whatever the mode (readers have one
            // each): without --limit, the lowest no holder has.
            slot: slot.unwrap_or_else(|| {
                (0..)
                    .find(|s| !holders.iter().any(|h| h.pos == i64::from(*s)))
                    .unwrap_or(0)
            }),
        },
        admit::Verdict::Wait(_) => Verdict::Blocked {
            holder: holders
                .first()
                .map(|h| h.label.clone())
                .or_else(|| ahead.first().map(|w| w.label.clone())),
            // What lapses soonest of what stands in our way.
            lapses_in: holders
                .iter()
                .chain(ahead.iter().copied())
                .map(|e| e.left)
                .min(),
            wake_on: ahead
                .iter()
                .rev()
                .copied()
                .chain(holders.iter())
                .find(|e| e.live)
                .map(|e| Target {
                    kind: if e.holder { 'h' } else { 'w' },
                    owner: if e.supersede {
                        format!("{SUPERSEDE}{}", e.owner)
                    } else {
                        e.owner.clone()
                    },
                    pos: e.pos,
                    left: e.left,
                }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Owner;
    use crate::schedule::Timing;

    use Mode::{Exclusive as X, Limit, Shared as S};

    fn entry(holder: bool, pos: i64, mode: Mode) -> Entry {
        Entry {
            holder,
            pos,
            owner: format!("o{holder}{pos}"),
            label: format!("h:{pos}"),
            supersede: false,
            token: pos as u64 + 10,
            mode,
            left: Duration::from_millis(1000 + pos as u64),
            live: true,
            revoked: false,
            preempted: false,
        }
    }

    fn verdict(
        holders: &[Mode],
        waiters: &[Mode],
        seq: Option<i64>,
        mode: Mode,
        outer: Option<&str>,
    ) -> Verdict {
        let owner = Owner::new(None).unwrap();
        let req = Request {
            name: "n",
            owner: &owner,
            timing: Timing::new(Duration::from_secs(3), None).unwrap(),
            mode,
            outer: outer.map(String::from),
            inherited_fd: None,
            quiet: true,
            min_hold: None,
            group: Default::default(),
        };
        let h: Vec<Entry> = holders
            .iter()
            .enumerate()
            .map(|(i, m)| entry(true, i as i64, *m))
            .collect();
        let w: Vec<Entry> = waiters
            .iter()
            .enumerate()
            .map(|(i, m)| entry(false, i as i64 + 1, *m))
            .collect();
        judge(&h, &w, seq, &req)
    }

    fn blocked(v: Verdict) -> bool {
        matches!(v, Verdict::Blocked { .. })
    }

    #[test]
    fn a_writer_holds_alone_and_readers_together() {
        assert_eq!(
            verdict(&[], &[], None, X, None),
            Verdict::Granted { slot: 0 }
        );
        assert!(blocked(verdict(&[X], &[], None, X, None)));
        assert!(blocked(verdict(&[S], &[], None, X, None)));
        assert!(blocked(verdict(&[X], &[], None, S, None)));
        assert_eq!(
            verdict(&[S, S], &[], None, S, None),
            Verdict::Granted { slot: 2 }
        );
    }

    #[test]
    fn no_one_overtakes_a_waiter_that_came_first() {
        // A reader that comes after a waiting writer waits for it.
        assert!(blocked(verdict(&[S], &[X], None, S, None)));
        // The first in the queue goes when there is room; the second not yet.
        assert_eq!(
            verdict(&[], &[X, X], Some(1), X, None),
            Verdict::Granted { slot: 0 }
        );
        assert!(blocked(verdict(&[], &[X, X], Some(2), X, None)));
        // Earlier readers that could hold are counted as holding, not waited for.
        assert_eq!(
            verdict(&[S], &[S], None, S, None),
            Verdict::Granted { slot: 1 }
        );
        // A request that disagrees with them is refused at once.
        assert_eq!(
            verdict(&[], &[X], None, Limit(2), None),
            Verdict::Disagrees(X)
        );
        // What lapses soonest of what is in the way wakes the waiter.
        match verdict(&[X], &[X], None, X, None) {
            Verdict::Blocked {
                lapses_in, holder, ..
            } => {
                assert_eq!(lapses_in, Some(Duration::from_millis(1000)));
                assert_eq!(holder.as_deref(), Some("h:0"));
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_preemption_mark_is_told_from_any_label() {
        let marked = format!("h:1 (a preempted by b){PREEMPTED}h:2 (c)");
        assert_eq!(
            split_label(&marked),
            ("h:1 (a preempted by b)", Some("h:2 (c)"))
        );
        assert_eq!(split_label("h:1 (x)"), ("h:1 (x)", None));
        // An older lockrun takes the first word of a label for its host:pid.
        assert_eq!(marked.split(' ').next(), Some("h:1"));
    }

    #[test]
    fn a_waiter_blocks_on_the_nearest_live_row_in_its_way() {
        let owner = Owner::new(None).unwrap();
        let req = Request {
            name: "n",
            owner: &owner,
            timing: Timing::new(Duration::from_secs(3), None).unwrap(),
            mode: X,
            outer: None,
            inherited_fd: None,
            quiet: true,
            min_hold: None,
            group: Default::default(),
        };
        let holders = [entry(true, 0, X)];
        let mut waiters = [entry(false, 1, X), entry(false, 2, X), entry(false, 3, X)];
        waiters[1].live = false;
        waiters[1].supersede = true;
        let on = |h: &[Entry], w: &[Entry]| match judge(h, w, Some(3), &req) {
            Verdict::Blocked { wake_on, .. } => wake_on.map(|t| (t.kind, t.pos)),
            v => panic!("{v:?}"),
        };
        // The place just ahead went quiet: the one before it, then the holder.
        assert_eq!(on(&holders, &waiters), Some(('w', 1)));
        waiters[0].live = false;
        assert_eq!(on(&holders, &waiters), Some(('h', 0)));
        let mut gone = holders.clone();
        gone[0].live = false;
        assert_eq!(on(&gone, &waiters), None);
        // A superseding place is named as its owner column holds it.
        waiters[1].live = true;
        match judge(&holders, &waiters, Some(3), &req) {
            Verdict::Blocked {
                wake_on: Some(t), ..
            } => {
                assert_eq!(t.owner, format!("{SUPERSEDE}{}", waiters[1].owner));
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_limit_fills_its_free_slots_and_no_more() {
        let l = Limit(3);
        assert_eq!(
            verdict(&[l, l], &[], None, l, None),
            Verdict::Granted { slot: 2 }
        );
        assert!(blocked(verdict(&[l, l, l], &[], None, l, None)));
    }

    #[test]
    fn requests_that_disagree_or_nest_are_refused() {
        assert_eq!(
            verdict(&[Limit(2)], &[], None, X, None),
            Verdict::Disagrees(Limit(2))
        );
        assert_eq!(
            verdict(&[Limit(2)], &[], None, Limit(3), None),
            Verdict::Disagrees(Limit(2))
        );
        assert_eq!(verdict(&[S], &[], None, S, Some("h:0")), Verdict::Nested);
        assert!(mode("q", 1).is_err());
    }
}
