//! The rules every engine follows around the admission rule (`admit.rs`),
//! as plans: pure answers an engine carries out with its own requests. What
//! a request does to the others of its name when it joins the queue, what
//! `release --force` breaks, how long a place in the queue lasts, what a
//! waiter watches, and how a listing is read within its bound. Written once
//! here, so changing a rule is one edit; the Redis scripts keep an atomic
//! copy, held to the same table (`tests/admit/table.rs`).

use std::time::Duration;

use super::{Broken, Error, Force, Group, Holder, ListBound, Listing, Mode, Status};
use crate::clock::Boot;

/// A holder or a waiter as the join rule and `release --force` see it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// The lease's token (a holder's; a waiter's is not read).
    pub token: Option<u64>,
    /// Revoked by `release --force`: no job runs under it any more.
    pub revoked: bool,
    /// Already asked to stop by a `--preempt` request.
    pub preempted: bool,
    /// Kept by `--min-hold` after its job ended: no job runs under it.
    pub window: bool,
    /// A waiter that asked for `--supersede`.
    pub supersede: bool,
}

impl Standing {
    /// A holder as `status` shows it: what an engine that reads its
    /// holders as `Holder`s (the SQL engines, the local one) plans with.
    pub fn of(h: &Holder) -> Standing {
        Standing {
            token: h.token,
            revoked: h.revoked,
            preempted: h.preempted_by.is_some(),
            window: h.min_hold,
            supersede: false,
        }
    }
}

/// What a `--preempt` request does to one holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Ask it to stop: its next renewal says so, and it releases once its
    /// job is dead.
    Mark,
    /// A `--min-hold` window runs no job: it ends at once.
    End,
}

/// What a request that must wait does as it joins the queue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Join {
    /// `--max-waiters`: the queue is full, with this many waiting; the
    /// request leaves at once and does nothing of the rest.
    pub full: Option<u64>,
    /// `--preempt`: these holders, by index, and what becomes of each.
    pub preempt: Vec<(usize, Stop)>,
    /// `--supersede`: these waiters ahead, by index, leave the queue,
    /// each told which request replaced it.
    pub replace: Vec<usize>,
}

/// The join plan of a request of `group` that must wait behind `holders`
/// and the waiters `ahead` of it (in arrival order). `--supersede` takes
/// out every earlier waiter that asked for it too, and those do not count
/// for `--max-waiters`; a full queue refuses the request before it
/// disturbs anyone; `--preempt` marks every holder that runs a job and is
/// not marked or revoked already, and ends every window not revoked.
///
/// An engine that carries out `preempt` or `replace` and finds any of them
/// changed since it read the name looks again rather than counting: each
/// request that stays saw fewer than N ahead when it joined, so no more
/// than N ever wait.
pub fn join(group: Group, holders: &[Standing], ahead: &[Standing]) -> Join {
    let replace: Vec<usize> = if group.supersede {
        (0..ahead.len()).filter(|&i| ahead[i].supersede).collect()
    } else {
        Vec::new()
    };
    if let Some(n) = group.max_waiters {
        let waiting = (ahead.len() - replace.len()) as u64;
        if waiting >= u64::from(n) {
            return Join {
                full: Some(waiting),
                ..Join::default()
            };
        }
    }
    let preempt = if group.preempt {
        holders
            .iter()
            .enumerate()
            .filter_map(|(i, h)| match h {
                // Revoked: its place goes when its lease ends, as promised.
                h if h.revoked => None,
                h if h.window => Some((i, Stop::End)),
                // A marked one stops already: its mark stays the first.
                h if h.preempted => None,
                _ => Some((i, Stop::Mark)),
            })
            .collect()
    } else {
        Vec::new()
    };
    Join {
        full: None,
        preempt,
        replace,
    }
}

/// What `release --force` does to one holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Revoke it: its place stays until its lease would have ended (nobody
    /// else gets in early), and its job stops at its next renewal.
    Revoke,
    /// Delete it (`--now`): the name may be granted at once.
    Delete,
    /// End a `--min-hold` window: it runs no job, so it goes at once,
    /// `--now` or not.
    EndWindow,
}

impl Cut {
    /// Whether the holder's place goes now (rather than when its lease ends).
    pub fn deletes(self) -> bool {
        self != Cut::Revoke
    }

    /// The holder as `release --force` reports it once cut.
    pub fn shown(self, mut h: Holder) -> Holder {
        if self.deletes() {
            h.ttl_left = None;
        } else {
            h.revoked = true;
        }
        h
    }
}

/// The force plan: the answer at once, or what to cut.
#[derive(Debug, Clone)]
pub enum ForcePlan {
    /// Nothing to do: not held, or `--token` matched no holder.
    Done(Broken),
    /// These holders, by index, each cut so. Empty: every one matched was
    /// revoked already.
    Cut(Vec<(usize, Cut)>),
}

/// The force plan of `release --force` over a name's `held` (its windows
/// among them): `--token` picks one holder, else all; one revoked already
/// is left be unless `--now` deletes it.
pub fn force(held: &[Standing], force: Force) -> ForcePlan {
    if held.is_empty() {
        return ForcePlan::Done(Broken::NotHeld);
    }
    let matched: Vec<usize> = (0..held.len())
        .filter(|&i| force.token.is_none_or(|t| Some(t) == held[i].token))
        .collect();
    if matched.is_empty() {
        return ForcePlan::Done(Broken::TokenMismatch(
            held.iter().filter_map(|h| h.token).collect(),
        ));
    }
    ForcePlan::Cut(
        matched
            .into_iter()
            .filter(|&i| force.now || !held[i].revoked)
            .map(|i| {
                let cut = match held[i] {
                    h if h.window => Cut::EndWindow,
                    _ if force.now => Cut::Delete,
                    _ => Cut::Revoke,
                };
                (i, cut)
            })
            .collect(),
    )
}

/// What `release --force` did, from the holders it cut (shown by
/// `Cut::shown`): none means each was revoked already, or changed hands
/// while it was cut (not the lease asked about).
pub fn forced(cut: Vec<Holder>) -> Broken {
    if cut.is_empty() {
        Broken::AlreadyRevoked
    } else {
        Broken::Leases(cut)
    }
}

/// How long a place in the queue lasts without being kept: a third of
/// the ttl, so a waiter that died stops holding up the queue well before a
/// lease would have ended, and a live one keeps it with a few requests per
/// ttl. Never under 100 ms: a waiter needs a request's time to keep it.
pub fn place_lasts(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// The longest nap of a waiter far back in the queue (`NEAR`), which
/// keeps its place when it wakes: two fifths of the time a place lasts.
pub fn far_nap(ttl: Duration) -> Duration {
    place_lasts(ttl) * 2 / 5
}

/// How far behind the head of the queue a waiter in `mode` still wakes
/// when a grant or a release wakes the front of the queue, in places: the
/// holders a release can let in and as many again, at least 4 and at
/// most 16, so a hand-off wakes a few waiters, not the whole queue (a
/// queue of 500 would look 500 times for every hand-off). A waiter
/// further back looks when its place needs keeping, and is woken once it
/// is near the front.
pub fn woken(mode: Mode) -> i64 {
    let holders = match mode {
        Mode::Exclusive => 1,
        Mode::Limit(n) => i64::from(n),
        Mode::Shared => 16,
    };
    (2 * holders + 2).clamp(4, 16)
}

/// How many places may be ahead of a waiter while it waits on a
/// connection of its own (the SQL engines): at least the places a hand-off
/// wakes (`woken`), and enough that the waiters further back, who hang up
/// and look again at their own pace (`Pace`), are near again before the
/// queue reaches them. A queue holds this many connections (and its
/// holders'), however long it is.
pub const NEAR: usize = 16;

/// The least time a place takes, as a rule (a job and its hand-off): a
/// waiter far back is never asleep for longer than the queue would take to
/// bring it near at this pace, whatever pace it saw before. A queue that
/// stood still (a long job) can start moving at any moment, and a queue
/// that paused (for a waiter ahead still asleep) seems slower than it is.
const LEAST_PLACE: Duration = Duration::from_millis(100);
/// The shortest nap: a far waiter never looks more often than this.
const LEAST_NAP: Duration = Duration::from_millis(200);
/// The shortest keep (`far_nap`) that lets a waiter hang up: below it (a
/// ttl under 7.5 s) a new connection, its look and a nap would take too
/// much of the time a place lasts, so every waiter waits on a connection.
const LEAST_FAR_KEEP: Duration = Duration::from_secs(1);

/// When a waiter far back in the queue (`NEAR` places or more ahead of
/// it) looks again: by the pace the queue moved at between its last two
/// looks, in time to be near before the front of the queue reaches it;
/// never later than a queue moving a place every `LEAST_PLACE` would need
/// to bring it within a quarter of the near places, nor than its place
/// needs keeping. A queue that did not move since its last look (a long
/// job) is looked at half as often each time, up to the same bound.
#[derive(Debug, Default)]
pub struct Pace {
    /// The last look that found us far back: when, and the places ahead.
    last: Option<(Boot, usize)>,
    nap: Duration,
}

/// Whether a waiter with `ahead` places before it hangs up and keeps its
/// place at its own pace, given the longest nap its ttl allows (`keep`,
/// `far_nap`): far back enough, and a place that outlasts a nap and a
/// new connection.
pub fn is_far(ahead: usize, keep: Duration) -> bool {
    ahead >= NEAR && keep >= LEAST_FAR_KEEP
}

impl Pace {
    /// A look at `now` found `ahead` places ahead of us: None, near
    /// enough to wait on a connection; else how long to sleep without one
    /// (`keep`: when our place needs keeping).
    pub fn far(&mut self, ahead: usize, keep: Duration, now: Boot) -> Option<Duration> {
        let near = NEAR;
        if !is_far(ahead, keep) {
            self.last = None;
            return None;
        }
        let soonest = soonest(ahead);
        let nap = match self.last {
            Some((then, was)) if was > ahead => {
                let per_place = now.since(then) / (was - ahead) as u32;
                // Near again by the time half the near places have gone,
                // with a margin for a queue that speeds up.
                per_place * (ahead - near / 2) as u32 * 7 / 10
            }
            Some(_) => self.nap * 2,
            None => soonest,
        };
        self.nap = nap.min(soonest).clamp(LEAST_NAP, keep);
        self.last = Some((now, ahead));
        Some(self.nap)
    }

    /// The longest the next nap can be: the places ahead only ever go
    /// down, and with them how long a waiter may sleep.
    pub fn longest(&self, keep: Duration) -> Duration {
        match self.last {
            Some((_, ahead)) => soonest(ahead).clamp(LEAST_NAP, keep),
            None => keep,
        }
    }
}

/// How long a waiter `ahead` places back may sleep: the queue, a place
/// every `LEAST_PLACE`, brings it within a quarter of the near places.
fn soonest(ahead: usize) -> Duration {
    LEAST_PLACE * ahead.saturating_sub(NEAR / 4) as u32
}

/// The places ahead of a waiter in `mode` (by index into `ahead`, in
/// arrival order) whose going could let it in: the nearest one that
/// blocks it (no herd: never the whole queue), and under `--limit N` also
/// the N just ahead (any of those going moves it up to a free place; one
/// further ahead going moves them up with it), so no turn is missed.
pub fn watch(ahead: &[Mode], mode: Mode) -> Vec<usize> {
    let blocks = |m: Mode| match mode {
        Mode::Exclusive => true,
        Mode::Shared => m != Mode::Shared,
        Mode::Limit(_) => m != mode,
    };
    let mut watch: Vec<usize> = Vec::new();
    if let Some(i) = (0..ahead.len()).rev().find(|&i| blocks(ahead[i])) {
        watch.push(i);
    }
    if let Mode::Limit(n) = mode {
        for i in (0..ahead.len()).rev().take(n as usize) {
            if !watch.contains(&i) {
                watch.push(i);
            }
        }
    }
    watch
}

/// What reading one name for a listing found.
pub enum Read {
    Listed(Status),
    /// Nothing held or waiting: not listed.
    Empty,
    /// Left out, with the note that says why (a file or key that is not
    /// lockrun's costs its name a note, not the whole list).
    LeftOut(String),
    /// This identity may not read it, with why.
    Unreadable(String),
}

impl Read {
    /// What `status` of `name` comes to in a listing: a key that is not
    /// lockrun's costs its name a note, not the whole list; any other
    /// failure fails the list.
    pub fn of_status(name: &str, status: Result<Status, Error>) -> Result<Read, Error> {
        match status {
            Ok(st) => Ok(Read::Listed(st)),
            Err(Error::Refused(m)) if m.contains("not a lockrun lease") => {
                Ok(Read::LeftOut(format!("{name}: left out: {m}")))
            }
            Err(e) => Err(e),
        }
    }
}

/// The names under a prefix, as an engine found them for a listing, and
/// its notes on them (keys passed over, a bound that cut the search short).
#[derive(Debug, Default)]
pub struct Names {
    pub names: Vec<String>,
    pub notes: Vec<String>,
}

/// How a listing read name by name was read.
pub const NAME_BY_NAME: &str =
    "read name by name, not as one snapshot: a lock may change while the list is read";

/// The note of a listing cut short by its bound.
pub fn cut_short(read: usize) -> String {
    format!("stopped after {read} names: the list is incomplete")
}

/// A listing read name by name within `bound`: `read` each of `names`
/// (each with where the engine finds it)
/// until the bound's names or time run out (names listed or unreadable
/// count; the rest do not), then sorted, with `notes` (what the engine said
/// before), and `how` last: how the list was read.
pub fn listing<T>(
    names: impl IntoIterator<Item = (String, T)>,
    bound: ListBound,
    mut notes: Vec<String>,
    how: &str,
    mut read: impl FnMut(&str, T) -> Result<Read, Error>,
) -> Result<Listing, Error> {
    let mut listed = Vec::new();
    let mut unreadable = Vec::new();
    for (name, at) in names {
        let count = listed.len() + unreadable.len();
        if count >= bound.names || bound.passed() {
            notes.push(cut_short(count));
            break;
        }
        match read(&name, at)? {
            Read::Listed(st) => listed.push((name, st)),
            Read::Empty => {}
            Read::LeftOut(note) => notes.push(note),
            Read::Unreadable(why) => unreadable.push((name, why)),
        }
    }
    listed.sort_by(|a, b| a.0.cmp(&b.0));
    notes.push(how.to_string());
    Ok(Listing {
        names: listed,
        notes,
        unreadable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Mode::{Exclusive as X, Limit, Shared as S};

    fn held(token: u64) -> Standing {
        Standing {
            token: Some(token),
            ..Standing::default()
        }
    }

    #[test]
    fn force_plans_follow_the_token_the_revocations_and_now() {
        let no = Force {
            token: None,
            now: false,
        };
        assert!(matches!(force(&[], no), ForcePlan::Done(Broken::NotHeld)));
        let mut hs = [held(5), held(7)];
        let one = Force {
            token: Some(9),
            now: false,
        };
        match force(&hs, one) {
            ForcePlan::Done(Broken::TokenMismatch(t)) => assert_eq!(t, vec![5, 7]),
            p => panic!("{p:?}"),
        }
        hs[0].revoked = true;
        hs[1].window = true;
        let cuts = |p| match p {
            ForcePlan::Cut(c) => c,
            p => panic!("{p:?}"),
        };
        assert_eq!(cuts(force(&hs, no)), vec![(1, Cut::EndWindow)]);
        let now = Force {
            token: None,
            now: true,
        };
        assert_eq!(
            cuts(force(&hs, now)),
            vec![(0, Cut::Delete), (1, Cut::EndWindow)]
        );
        let first = Force {
            token: Some(5),
            now: false,
        };
        assert_eq!(cuts(force(&hs, first)), vec![]);
        assert!(matches!(forced(Vec::new()), Broken::AlreadyRevoked));
    }

    #[test]
    fn a_waiter_watches_the_nearest_that_blocks_it_and_a_limit_its_n() {
        assert_eq!(watch(&[], X), Vec::<usize>::new());
        assert_eq!(watch(&[S, S, S], X), vec![2]);
        assert_eq!(watch(&[X, S, S], S), vec![0]);
        assert_eq!(watch(&[S, S], S), Vec::<usize>::new());
        let l = Limit(2);
        assert_eq!(watch(&[l, l, l], l), vec![2, 1]);
    }

    #[test]
    fn a_full_queue_refuses_before_anyone_is_disturbed() {
        let group = Group {
            max_waiters: Some(2),
            supersede: true,
            preempt: true,
        };
        let sup = Standing {
            supersede: true,
            ..Standing::default()
        };
        let plain = Standing::default();
        let window = Standing {
            window: true,
            ..Standing::default()
        };
        let marked = Standing {
            preempted: true,
            ..Standing::default()
        };
        // The replaced waiter does not count: one waits, under two.
        let j = join(group, &[plain, window, marked], &[sup, plain]);
        assert_eq!(j.full, None);
        assert_eq!(j.replace, vec![0]);
        assert_eq!(j.preempt, vec![(0, Stop::Mark), (1, Stop::End)]);
        let full = join(group, &[plain], &[plain, sup, plain]);
        assert_eq!(
            full,
            Join {
                full: Some(2),
                ..Join::default()
            }
        );
        assert_eq!(join(Group::default(), &[plain], &[sup]), Join::default());
    }

    #[test]
    fn a_place_lasts_a_third_of_the_ttl() {
        assert_eq!(place_lasts(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(
            place_lasts(Duration::from_millis(30)),
            Duration::from_millis(100)
        );
    }

    #[test]
    fn a_waiter_far_back_looks_at_the_pace_the_queue_moves() {
        let keep = Duration::from_secs(3);
        let ms = Duration::from_millis;
        let t0 = Boot::from_nanos(1_000_000_000_000);
        // Near: waits on its connection.
        assert_eq!(Pace::default().far(NEAR - 1, keep, t0), None);
        // Far, the queue's pace not yet seen: near (within 4 places) in
        // time if a place took 100 ms, at most the keep.
        assert_eq!(Pace::default().far(NEAR, keep, t0), Some(ms(1200)));
        assert_eq!(Pace::default().far(20, keep, t0), Some(ms(1600)));
        let mut pace = Pace::default();
        assert_eq!(pace.far(100, keep, t0), Some(keep));
        // 30 places in 3 s, 100 ms a place; 70 ahead, half the near places
        // (8) left: 62 places, 6.2 s, 70 % of it past the keep.
        let t1 = t0.add(keep);
        assert_eq!(pace.far(70, keep, t1), Some(keep));
        // As fast again: 32 places, 70 % of 3.2 s.
        let t2 = t1.add(keep);
        assert_eq!(pace.far(40, keep, t2), Some(ms(2240)));
        // Nothing moved (a long job): twice the nap, up to the keep.
        let t3 = t2.add(ms(2240));
        assert_eq!(pace.far(40, keep, t3), Some(keep));
        // Near the front, a slow queue (or one that paused): never asleep
        // longer than 100 ms a place would bring it within 4 places.
        let t4 = t3.add(Duration::from_secs(60));
        assert_eq!(pace.far(30, keep, t4), Some(ms(2600)));
        let t5 = t4.add(ms(2600));
        assert_eq!(pace.far(20, keep, t5), Some(ms(1600)));
        assert_eq!(pace.far(20, keep, t5.add(ms(1600))), Some(ms(1600)));
        // Just outside the near places, a fast queue: never under the
        // least nap.
        let mut fast = Pace::default();
        fast.far(30, keep, t0);
        assert_eq!(fast.far(17, keep, t0.add(ms(10))), Some(LEAST_NAP));
        // A short ttl's keep leaves no room to hang up: near, however far.
        assert_eq!(Pace::default().far(50, ms(999), t0), None);
    }
}
