//! Who may hold a name, given its holders and its waiters in arrival order:
//! the one rule of every engine that decides in the client. The Redis
//! scripts keep a copy in Lua (a grant there must be atomic on the server),
//! held to the same table (`tests/admit/table.rs`) on a real server.

use super::Mode;

/// A holder of the name, or a waiter in its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub mode: Mode,
    /// The slot it holds under `--limit`; None while it has none yet.
    pub slot: Option<u32>,
    /// Kept by `--min-hold` after its job ended: it holds like any holder,
    /// but no job runs under it, so no request runs inside it.
    pub window: bool,
    /// The lockrun whose job makes the request.
    pub outer: bool,
    /// The request's own grant (an answer that was lost on the way).
    pub ours: bool,
}

impl Place {
    pub fn new(mode: Mode) -> Place {
        Place {
            mode,
            slot: None,
            window: false,
            outer: false,
            ours: false,
        }
    }
}

/// Who stands in the way, by index into the holders or the waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Holder(usize),
    /// An earlier waiter that may not hold yet.
    Waiter(usize),
    /// An earlier waiter that disagrees with those in force: it is refused
    /// when it looks, and until then the line stops at it (a client that
    /// passed it could end up holding beside it, in its mode, once the
    /// holders ahead of it go).
    Refused(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// May hold now; the slot under `--limit`.
    Hold {
        slot: Option<u32>,
    },
    /// Holds already: this holder is the request's own grant.
    Ours(usize),
    Wait(By),
    /// Those in force hold the name in this other mode.
    Disagrees(Mode),
    /// The outer lockrun holds it: any wait would be for ourselves.
    Nested,
}

/// Judge a request in `mode` at `place` among `waiters` (None: it arrives
/// now, behind them all). The waiters ahead of it are let in one by one in
/// arrival order while each fits beside those let in before it, so no one
/// overtakes an earlier waiter, in any mode; then the request: it must
/// agree with everyone in force on mode and limit, and fit (a writer
/// alone, readers beside readers, N with `--limit N`).
pub fn admit(holders: &[Place], waiters: &[Place], mode: Mode, place: Option<usize>) -> Verdict {
    if let Some(i) = holders.iter().position(|h| h.ours) {
        return Verdict::Ours(i);
    }
    let ahead = &waiters[..place.unwrap_or(waiters.len()).min(waiters.len())];
    let (line, stop) = walk(holders, ahead);
    if line.iter().any(|(_, p)| p.outer && !p.window) {
        return Verdict::Nested;
    }
    if let Some((_, p)) = line.iter().find(|(_, p)| !mode.agrees_with(p.mode)) {
        return Verdict::Disagrees(p.mode);
    }
    if let Some(by) = stop {
        return Verdict::Wait(by);
    }
    match in_the_way(mode, &line) {
        Some(by) => Verdict::Wait(by),
        None => Verdict::Hold {
            slot: free_slot(mode, &line),
        },
    }
}

/// How many waiters at the front of the queue hold together with the
/// holders (an engine whose queue holds its holders too passes none).
pub fn front(holders: &[Place], waiters: &[Place]) -> usize {
    walk(holders, waiters).0.len() - holders.len()
}

type Line<'a> = Vec<(By, &'a Place)>;

/// The holders and the waiters let in after them, and the waiter the line
/// stops at.
fn walk<'a>(holders: &'a [Place], waiters: &'a [Place]) -> (Line<'a>, Option<By>) {
    let mut line: Line = holders
        .iter()
        .enumerate()
        .map(|(i, h)| (By::Holder(i), h))
        .collect();
    for (i, w) in waiters.iter().enumerate() {
        if line.iter().any(|(_, p)| !w.mode.agrees_with(p.mode)) {
            return (line, Some(By::Refused(i)));
        }
        if in_the_way(w.mode, &line).is_some() {
            return (line, Some(By::Waiter(i)));
        }
        line.push((By::Waiter(i), w));
    }
    (line, None)
}

/// Who keeps a request in `mode`, which agrees with everyone in `line`,
/// from holding beside them.
fn in_the_way(mode: Mode, line: &Line) -> Option<By> {
    let first = line.first().map(|(by, _)| *by);
    match mode {
        Mode::Exclusive => first,
        Mode::Shared => line
            .iter()
            .find(|(_, p)| p.mode != Mode::Shared)
            .map(|(by, _)| *by),
        Mode::Limit(n) => first.filter(|_| line.len() >= n as usize),
    }
}

/// Under `--limit`, the lowest slot left once each in `line` without one
/// has taken the lowest free slot in its turn (as a server that grants them
/// in order does).
fn free_slot(mode: Mode, line: &Line) -> Option<u32> {
    let Mode::Limit(_) = mode else {
        return None;
    };
    let mut taken: Vec<u32> = line.iter().filter_map(|(_, p)| p.slot).collect();
    let lowest = |taken: &[u32]| (0..).find(|s| !taken.contains(s)).unwrap_or(0);
    for _ in line.iter().filter(|(_, p)| p.slot.is_none()) {
        taken.push(lowest(&taken));
    }
    Some(lowest(&taken))
}

#[cfg(test)]
#[path = "../../tests/admit/table.rs"]
mod table;

#[cfg(test)]
mod tests {
    use super::table::{self, M, P, Want};
    use super::*;
    use crate::backend::Group;
    use crate::backend::plan::{self, Standing};

    fn mode(m: M) -> Mode {
        match m {
            M::X => Mode::Exclusive,
            M::S => Mode::Shared,
            M::N(n) => Mode::Limit(n),
        }
    }

    fn place(p: &P) -> Place {
        Place {
            mode: mode(p.mode),
            slot: p.slot,
            window: p.window,
            outer: p.outer,
            ours: p.ours,
        }
    }

    fn standing(p: &P) -> Standing {
        Standing {
            token: None,
            revoked: p.revoked,
            preempted: p.preempted,
            window: p.window,
            supersede: p.supersede,
        }
    }

    fn want(w: Want) -> Verdict {
        match w {
            Want::Hold(slot) => Verdict::Hold { slot },
            Want::Ours(i) => Verdict::Ours(i),
            Want::Wait(table::By::Holder(i)) => Verdict::Wait(By::Holder(i)),
            Want::Wait(table::By::Waiter(i)) => Verdict::Wait(By::Waiter(i)),
            Want::Wait(table::By::Refused(i)) => Verdict::Wait(By::Refused(i)),
            Want::Disagrees(m) => Verdict::Disagrees(mode(m)),
            Want::Nested => Verdict::Nested,
        }
    }

    /// The rule's answer for the row without the holders and waiters
    /// `gone` leaves out, its indices those of the whole row.
    fn judged(r: &table::Row, gone: (&[usize], &[usize])) -> Verdict {
        let kept = |all: &[P], out: &[usize]| -> Vec<usize> {
            (0..all.len()).filter(|i| !out.contains(i)).collect()
        };
        let (hs, ws) = (kept(&r.holders, gone.0), kept(&r.waiters, gone.1));
        let holders: Vec<Place> = hs.iter().map(|&i| place(&r.holders[i])).collect();
        let waiters: Vec<Place> = ws.iter().map(|&i| place(&r.waiters[i])).collect();
        let at = r
            .place
            .map(|p| ws.iter().position(|&i| i == p).unwrap_or(p));
        match admit(&holders, &waiters, mode(r.mode), at) {
            Verdict::Ours(i) => Verdict::Ours(hs[i]),
            Verdict::Wait(By::Holder(i)) => Verdict::Wait(By::Holder(hs[i])),
            Verdict::Wait(By::Waiter(i)) => Verdict::Wait(By::Waiter(ws[i])),
            Verdict::Wait(By::Refused(i)) => Verdict::Wait(By::Refused(ws[i])),
            v => v,
        }
    }

    fn joined(j: plan::Join) -> table::Joined {
        let stops = |s: plan::Stop| -> Vec<usize> {
            j.preempt
                .iter()
                .filter(|(_, how)| *how == s)
                .map(|(i, _)| *i)
                .collect()
        };
        table::Joined {
            full: j.full,
            mark: stops(plan::Stop::Mark),
            end: stops(plan::Stop::End),
            replace: j.replace.clone(),
        }
    }

    /// Each row: the rule's answer; for a row whose line stops at a
    /// disagreeing waiter, the answer once it is refused; for a group row,
    /// the join plan, and the answer once the request joined.
    #[test]
    fn every_row_of_the_table() {
        let mut wrong = Vec::new();
        for r in table::rows() {
            let check = |wrong: &mut Vec<String>, what: &str, got: Verdict, w: Want| {
                if got != want(w) {
                    wrong.push(format!("{}{what}: got {got:?}, want {w:?}", r.what));
                }
            };
            let Some(j) = &r.joined else {
                check(&mut wrong, "", judged(&r, (&[], &[])), r.want);
                if let (Want::Wait(table::By::Refused(i)), Some(after)) = (r.want, r.after) {
                    check(
                        &mut wrong,
                        " (once refused)",
                        judged(&r, (&[], &[i])),
                        after,
                    );
                }
                continue;
            };
            let group = Group {
                max_waiters: r.group.max_waiters,
                supersede: r.group.supersede,
                preempt: r.group.preempt,
            };
            let holders: Vec<Standing> = r.holders.iter().map(standing).collect();
            let ahead: Vec<Standing> = r.waiters.iter().map(standing).collect();
            let plan = joined(plan::join(group, &holders, &ahead));
            if plan != *j {
                wrong.push(format!("{}: plans {plan:?}, want {j:?}", r.what));
            }
            if j.full.is_none() {
                check(
                    &mut wrong,
                    " (joined)",
                    judged(&r, (&j.end, &j.replace)),
                    r.want,
                );
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// Each row of `release --force` against its plan.
    #[test]
    fn every_force_row_of_the_table() {
        use table::{C, Forced};
        let mut wrong = Vec::new();
        for r in table::force_rows() {
            let held: Vec<Standing> = (r.holders.iter().enumerate())
                .map(|(j, p)| Standing {
                    token: Some(100 + j as u64),
                    ..standing(p)
                })
                .collect();
            let force = crate::backend::Force {
                token: r.token,
                now: r.now,
            };
            let got = match plan::force(&held, force) {
                plan::ForcePlan::Done(crate::backend::Broken::NotHeld) => Forced::NotHeld,
                plan::ForcePlan::Done(_) => Forced::Mismatch,
                plan::ForcePlan::Cut(cuts) if cuts.is_empty() => Forced::AlreadyRevoked,
                plan::ForcePlan::Cut(cuts) => Forced::Cut(
                    cuts.into_iter()
                        .map(|(i, cut)| {
                            let c = match cut {
                                plan::Cut::Revoke => C::Revoke,
                                plan::Cut::Delete => C::Delete,
                                plan::Cut::EndWindow => C::EndWindow,
                            };
                            (i, c)
                        })
                        .collect(),
                ),
            };
            if got != r.want {
                wrong.push(format!("{}: got {got:?}, want {:?}", r.what, r.want));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn the_front_of_a_queue_is_who_holds_together() {
        use Mode::{Exclusive as X, Limit, Shared as S};
        let q = |modes: &[Mode]| modes.iter().map(|m| Place::new(*m)).collect::<Vec<_>>();
        assert_eq!(front(&[], &q(&[])), 0);
        assert_eq!(front(&[], &q(&[X, X])), 1);
        assert_eq!(front(&[], &q(&[S, S, X, S])), 2);
        assert_eq!(front(&[], &q(&[Limit(2), Limit(2), Limit(2)])), 2);
        assert_eq!(front(&[], &q(&[Limit(2), Limit(3)])), 1);
        assert_eq!(front(&q(&[S]), &q(&[S, Limit(2), S])), 1);
    }
}
