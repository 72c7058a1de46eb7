//! The admission rule as a table: holders, waiters in arrival order and a
//! request, and what the rule answers: who may hold, who is in the way, and
//! for the concurrency groups what a request that must wait does to the
//! others as it joins (the join plan). Read by the rule's own unit tests
//! and by the test that runs each row against the Redis acquire script, so
//! the two copies of the rule are held to one table.

#![allow(dead_code)]

/// A mode as users ask for it: exclusive, shared (`-s`), `--limit N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum M {
    X,
    S,
    N(u32),
}

/// A holder, or a waiter in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P {
    pub mode: M,
    /// The slot it holds under `--limit` (None: it has none yet).
    pub slot: Option<u32>,
    /// Kept by `--min-hold` after its job ended: no job runs under it.
    pub window: bool,
    /// The lockrun whose job makes the request.
    pub outer: bool,
    /// The request itself, already holding (a grant whose answer was lost).
    pub ours: bool,
    /// A waiter that asked for `--supersede`.
    pub supersede: bool,
    /// A holder revoked by `release --force`.
    pub revoked: bool,
    /// A holder an earlier `--preempt` request asked to stop.
    pub preempted: bool,
}

pub fn p(mode: M) -> P {
    P {
        mode,
        slot: None,
        window: false,
        outer: false,
        ours: false,
        supersede: false,
        revoked: false,
        preempted: false,
    }
}

impl P {
    pub fn slot(self, slot: u32) -> P {
        P {
            slot: Some(slot),
            ..self
        }
    }
    pub fn window(self) -> P {
        P {
            window: true,
            ..self
        }
    }
    pub fn outer(self) -> P {
        P {
            outer: true,
            ..self
        }
    }
    pub fn ours(self) -> P {
        P { ours: true, ..self }
    }
    pub fn supersede(self) -> P {
        P {
            supersede: true,
            ..self
        }
    }
    pub fn revoked(self) -> P {
        P {
            revoked: true,
            ..self
        }
    }
    pub fn preempted(self) -> P {
        P {
            preempted: true,
            ..self
        }
    }
}

/// The request's concurrency group: `--max-waiters`, `--supersede`,
/// `--preempt`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct G {
    pub max_waiters: Option<u32>,
    pub supersede: bool,
    pub preempt: bool,
}

/// What a request that must wait does to the others as it joins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Joined {
    /// `--max-waiters`: not queued, with this many waiting (and nothing
    /// else done).
    pub full: Option<u64>,
    /// Holders, by index, asked to stop.
    pub mark: Vec<usize>,
    /// Holders (`--min-hold` windows), by index, ended at once.
    pub end: Vec<usize>,
    /// Waiters, by index, taken out of the queue.
    pub replace: Vec<usize>,
}

/// Who is in the way, by index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Holder(usize),
    /// An earlier waiter that may not hold yet.
    Waiter(usize),
    /// An earlier waiter that disagrees with those in force: it will be
    /// refused, and until then the line stops at it.
    Refused(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// May hold now, in this slot (None: no slot without `--limit`).
    Hold(Option<u32>),
    /// Holds already: this holder is the request's own grant.
    Ours(usize),
    Wait(By),
    /// Those in force hold it in this other mode.
    Disagrees(M),
    /// The outer lockrun holds it: waiting would be for ourselves.
    Nested,
}

/// One row. In a group row, `want` is what the request is answered once
/// it joined (the waiters it replaced and the windows it ended gone).
pub struct Row {
    pub what: &'static str,
    pub holders: Vec<P>,
    pub waiters: Vec<P>,
    pub mode: M,
    /// The request's place among the waiters (None: it arrives now, behind them all).
    pub place: Option<usize>,
    pub want: Want,
    /// A row whose line stops at a waiter that disagrees (`Refused`): what
    /// the request is answered once that waiter is refused, as a server
    /// that refuses it while serving the queue answers in the same step.
    pub after: Option<Want>,
    pub group: G,
    /// A group row: its join plan.
    pub joined: Option<Joined>,
}

impl Row {
    fn after(self, want: Want) -> Row {
        Row {
            after: Some(want),
            ..self
        }
    }
}

fn row(
    what: &'static str,
    holders: &[P],
    waiters: &[P],
    mode: M,
    place: Option<usize>,
    want: Want,
) -> Row {
    Row {
        what,
        holders: holders.to_vec(),
        waiters: waiters.to_vec(),
        mode,
        place,
        want,
        after: None,
        group: G::default(),
        joined: None,
    }
}

/// A group row: a request that arrives now, must wait, and joins so.
fn joining(
    what: &'static str,
    holders: &[P],
    waiters: &[P],
    mode: M,
    group: G,
    want: Want,
    joined: Joined,
) -> Row {
    Row {
        group,
        joined: Some(joined),
        ..row(what, holders, waiters, mode, None, want)
    }
}

fn max(n: u32) -> G {
    G {
        max_waiters: Some(n),
        ..G::default()
    }
}

const SUPERSEDE: G = G {
    max_waiters: None,
    supersede: true,
    preempt: false,
};

const PREEMPT: G = G {
    max_waiters: None,
    supersede: false,
    preempt: true,
};

fn full(n: u64) -> Joined {
    Joined {
        full: Some(n),
        ..Joined::default()
    }
}

fn replace(i: &[usize]) -> Joined {
    Joined {
        replace: i.to_vec(),
        ..Joined::default()
    }
}

fn stop(mark: &[usize], end: &[usize]) -> Joined {
    Joined {
        mark: mark.to_vec(),
        end: end.to_vec(),
        ..Joined::default()
    }
}

// One row a line: a table reads across.
#[rustfmt::skip]
pub fn rows() -> Vec<Row> {
    use By::*;
    use M::*;
    use Want::*;
    let (x, s, n2, n3) = (p(X), p(S), p(N(2)), p(N(3)));
    vec![
        // Exclusive.
        row("free name", &[], &[], X, None, Hold(None)),
        row("a writer holds alone", &[x], &[], X, None, Wait(Holder(0))),
        row("a writer waits for readers", &[s, s], &[], X, None, Wait(Holder(0))),
        row("the queue's head takes a free name", &[], &[x, x], X, Some(0), Hold(None)),
        row("the second waits for the first", &[], &[x, x], X, Some(1), Wait(Waiter(0))),
        row("a newcomer queues behind the line", &[], &[x], X, None, Wait(Waiter(0))),
        // Shared.
        row("readers hold together", &[s, s], &[], S, None, Hold(None)),
        row("a reader waits for a writer", &[x], &[], S, None, Wait(Holder(0))),
        row("a waiting writer blocks later readers", &[s], &[x], S, None, Wait(Waiter(0))),
        row("readers behind a waiting writer wait for it", &[s], &[x, s, s], S, Some(2), Wait(Waiter(0))),
        row("readers ahead that fit do not block", &[s], &[s, s], S, None, Hold(None)),
        row("a queued reader behind readers that fit", &[], &[s, s], S, Some(1), Hold(None)),
        row("a writer behind queued readers waits for them", &[], &[s], X, None, Wait(Waiter(0))),
        // --limit N.
        row("a limit takes the lowest free slot", &[n3.slot(0), n3.slot(2)], &[], N(3), None, Hold(Some(1))),
        row("a full limit waits", &[n2.slot(0), n2.slot(1)], &[], N(2), None, Wait(Holder(0))),
        row("waiters ahead take slots first", &[n3.slot(0)], &[n3], N(3), None, Hold(Some(2))),
        row("waiters ahead fill the limit", &[n2.slot(1)], &[n2, n2], N(2), Some(1), Wait(Holder(0))),
        row("a queued limit request takes a freed slot", &[n2.slot(1)], &[n2], N(2), Some(0), Hold(Some(0))),
        // Min-hold windows hold like any holder.
        row("a window keeps a writer out", &[x.window()], &[], X, None, Wait(Holder(0))),
        row("a shared window admits readers", &[s.window()], &[], S, None, Hold(None)),
        row("a window holds its slot", &[n2.slot(0).window(), n2.slot(1)], &[], N(2), None, Wait(Holder(0))),
        row("a window beside a free slot", &[n2.slot(0).window()], &[], N(2), None, Hold(Some(1))),
        // Users of a name agree on its mode and limit.
        row("exclusive against a limit", &[n2.slot(0)], &[], X, None, Disagrees(N(2))),
        row("shared against a limit", &[n2.slot(0)], &[], S, None, Disagrees(N(2))),
        row("another limit", &[n2.slot(0)], &[], N(3), None, Disagrees(N(2))),
        row("a limit against a writer", &[x], &[], N(2), None, Disagrees(X)),
        row("a limit against a window", &[s.window()], &[], N(2), None, Disagrees(S)),
        row("a limit against the waiter that will hold", &[], &[x], N(2), None, Disagrees(X)),
        row("a queued request that came to disagree", &[x], &[n2], N(2), Some(0), Disagrees(X)),
        row("the line stops at a waiter that disagrees", &[s], &[n2], S, None, Wait(Refused(0))).after(Hold(None)),
        row("a disagreeing waiter refused, the next one is in the way", &[s], &[n2, x], S, None, Wait(Refused(0))).after(Wait(Waiter(1))),
        row("a full line does not reach a disagreeing waiter", &[x], &[s, n2], S, None, Wait(Waiter(0))),
        // Nesting and our own grant.
        row("the outer lockrun holds it", &[x.outer()], &[], X, None, Nested),
        row("nested even where it could share", &[s.outer()], &[], S, None, Nested),
        row("nested before disagreeing", &[n2.slot(0).outer()], &[], X, None, Nested),
        row("a window runs no job to be inside of", &[x.window().outer()], &[], X, None, Wait(Holder(0))),
        row("our grant whose answer was lost", &[x.ours()], &[x], X, None, Ours(0)),
        row("our limit grant keeps its slot", &[n2.slot(0), n2.slot(1).ours()], &[], N(2), None, Ours(1)),
        // Concurrency groups: what a request that must wait does as it joins.
        joining("a queue with room takes one more", &[x], &[x], X, max(2), Wait(Waiter(0)), Joined::default()),
        joining("a full queue refuses the request", &[x], &[x, x], X, max(2), Wait(Waiter(0)), full(2)),
        joining("replaced waiters do not count", &[x], &[x.supersede(), x], X, G { supersede: true, ..max(2) }, Wait(Waiter(1)), replace(&[0])),
        joining("a full queue replaces no one", &[x], &[x.supersede(), x, x], X, G { supersede: true, ..max(2) }, Wait(Waiter(0)), full(2)),
        joining("supersede replaces only those that asked for it", &[x], &[x, x.supersede(), s.supersede()], X, SUPERSEDE, Wait(Waiter(0)), replace(&[1, 2])),
        joining("preempt asks every running holder to stop", &[s, s], &[], X, PREEMPT, Wait(Holder(0)), stop(&[0, 1], &[])),
        joining("preempt ends a window at once", &[x.window()], &[x], X, PREEMPT, Wait(Waiter(0)), stop(&[], &[0])),
        joining("a holder asked to stop already is not asked again", &[s.preempted(), s], &[], X, PREEMPT, Wait(Holder(0)), stop(&[1], &[])),
        joining("a revoked holder runs no job to stop", &[x.revoked()], &[], X, PREEMPT, Wait(Holder(0)), stop(&[], &[])),
        joining("a full queue preempts no one", &[x], &[x], X, G { preempt: true, ..max(1) }, Wait(Waiter(0)), full(1)),
    ]
}

/// What `release --force` does to one holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum C {
    /// Revoked: its place stays until its lease would have ended.
    Revoke,
    /// Deleted (`--now`).
    Delete,
    /// A `--min-hold` window ended (at once, `--now` or not).
    EndWindow,
}

/// What `release --force` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forced {
    NotHeld,
    /// `--token` matched no holder.
    Mismatch,
    /// Every holder it matched was revoked already.
    AlreadyRevoked,
    /// These holders, by index, cut so.
    Cut(Vec<(usize, C)>),
}

/// One row of `release --force`: the holders (holder `j` has the token
/// `100 + j`), `--token`, `--now`, and what it does.
pub struct ForceRow {
    pub what: &'static str,
    pub holders: Vec<P>,
    pub token: Option<u64>,
    pub now: bool,
    pub want: Forced,
}

fn force(
    what: &'static str,
    holders: &[P],
    token: Option<u64>,
    now: bool,
    want: Forced,
) -> ForceRow {
    ForceRow {
        what,
        holders: holders.to_vec(),
        token,
        now,
        want,
    }
}

#[rustfmt::skip]
pub fn force_rows() -> Vec<ForceRow> {
    use C::*;
    use Forced::*;
    use M::*;
    let (x, s) = (p(X), p(S));
    vec![
        force("nothing held", &[], None, false, NotHeld),
        force("every holder revoked", &[s, s], None, false, Cut(vec![(0, Revoke), (1, Revoke)])),
        force("--now deletes", &[x], None, true, Cut(vec![(0, Delete)])),
        force("--token picks one holder", &[s, s], Some(101), false, Cut(vec![(1, Revoke)])),
        force("--token that no holder has", &[x], Some(999), false, Mismatch),
        force("revoked already", &[x.revoked()], None, false, AlreadyRevoked),
        force("revoked already, deleted with --now", &[x.revoked()], None, true, Cut(vec![(0, Delete)])),
        force("a window ends at once", &[x.window()], None, false, Cut(vec![(0, EndWindow)])),
        force("a window ends at once with --now too", &[x.window()], None, true, Cut(vec![(0, EndWindow)])),
        force("the revoked one left be, the others cut", &[s.revoked(), s, s.window()], None, false, Cut(vec![(1, Revoke), (2, EndWindow)])),
    ]
}
