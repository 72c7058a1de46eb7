//! MySQL's part of a look: how a transaction runs (the row lock on the
//! name's counter, statements in flights), the statements each ending of a
//! look sends (`sql::Deciding`), and the wake-up locks (`GET_LOCK`) a
//! place or a grant holds for the waiters behind it.

use std::time::Duration;

use mysql::Row;

use super::client::{Client, int};
use super::sql::{self, Tables, lit, wake_key};
use crate::backend::sql::{Deciding, Join, place_lasts};
use crate::backend::table::{PREEMPTED, SUPERSEDE};
use crate::backend::{Error, Request};

/// How long a transaction of lockrun's may sit idle on the server before
/// the server ends its connection: twice the bound on one request (ttl/3
/// up to a 12 s ttl, 4 s beyond; whole seconds), far more than lockrun
/// takes between its two round trips, and no more than the ttl/3 a stopped
/// waiter may delay the others.
fn idle_in_transaction(op: Duration) -> Duration {
    op * 2
}

/// Run a transaction under the name's row lock: its start, the lock and
/// `first` in one flight, then `f` with the rows of the last of `first`;
/// `f` ends it (`commit`). None: the name had no counter row yet, which
/// is made now (look again). Any error ends the connection, and the
/// transaction with it.
pub(super) fn transaction<T>(
    c: &mut Client,
    tables: &Tables,
    name: &str,
    first: Vec<String>,
    f: impl FnOnce(&mut Client, Vec<Row>) -> Result<T, Error>,
) -> Result<Option<T>, Error> {
    let [bound, begin, lock] = tables.begin(name, idle_in_transaction(c.op));
    let mut stmts = vec![bound, begin, lock];
    stmts.extend(first);
    let mut sets = c.run(&stmts)?;
    if sets[2].is_empty() {
        c.run(&[sql::UNBOUND.into(), "ROLLBACK".into(), tables.counter(name)])?;
        return Ok(None);
    }
    let rows = sets.pop().unwrap_or_default();
    let done = f(c, rows);
    if done.is_err() {
        let code = c.last_code.take();
        c.drop_connection();
        c.last_code = code;
    }
    done.map(Some)
}

/// The transaction's last statements and its COMMIT, in one flight, then
/// `after` (wake-up locks: a failure of those costs nothing but the
/// wake-up): the rows of each of `last`.
pub(super) fn commit(
    c: &mut Client,
    last: Vec<String>,
    after: Vec<String>,
) -> Result<Vec<Vec<Row>>, Error> {
    let n = last.len();
    let mut stmts = last;
    stmts.push(sql::UNBOUND.into());
    stmts.push("COMMIT".into());
    stmts.extend(after);
    let mut f = c.flight(&stmts);
    // The callers count the sets of `last`, COMMIT and `after`.
    if f.sets.len() > n {
        f.sets.remove(n);
    }
    match f.failed {
        Some((at, e)) if at <= n + 1 => Err(e),
        Some((_, e)) => {
            if !e.is_transient() {
                c.no_wake = true;
            }
            Ok(f.sets)
        }
        None => Ok(f.sets),
    }
}

/// As `commit`, for a transaction that makes or keeps our place `po`:
/// unless this connection holds the place's wake-up lock already, it is
/// taken before COMMIT, so the place is never seen without it
/// (`sql::gone`). None: the server refused the lock; nothing was
/// committed, and waiting falls back to sleeping (look again).
fn commit_place(
    c: &mut Client,
    last: Vec<String>,
    po: &str,
    wake: bool,
) -> Result<Option<Vec<Vec<Row>>>, Error> {
    let n = last.len();
    let lock = wake && c.locked != Some('w');
    let mut stmts = last;
    if lock {
        stmts.push(format!("SELECT GET_LOCK({}, 0)", wake_key('w', &lit(po))));
    }
    stmts.push(sql::UNBOUND.into());
    stmts.push("COMMIT".into());
    let mut f = c.flight(&stmts);
    match f.failed {
        // The flight left the connection, and the transaction with it.
        Some((at, e)) if lock && at == n && !e.is_transient() => {
            c.no_wake = true;
            return Ok(None);
        }
        Some((_, e)) => return Err(e),
        None => {}
    }
    // 0: another connection of ours holds it still (one the server has
    // not yet seen cut); the next look takes it again.
    if lock
        && f.sets
            .get(n)
            .and_then(|s| s.first())
            .and_then(|r| int(r, 0))
            == Some(1)
    {
        c.locked = Some('w');
    }
    f.sets.truncate(n);
    Ok(Some(f.sets))
}

/// The wake-up lock statements that make this connection hold `kind`'s
/// lock for `col` (and give up `old`'s).
fn hold(c: &Client, kind: char, col: &str, old: Option<&str>) -> Vec<String> {
    if c.no_wake {
        return Vec::new();
    }
    let mut v = vec![format!("DO GET_LOCK({}, 0)", wake_key(kind, &lit(col)))];
    if let Some(old) = old {
        v.push(format!("DO RELEASE_LOCK({})", wake_key('w', &lit(old))));
    }
    v
}

fn place_owner(req: &Request) -> String {
    if req.group.supersede {
        format!("{SUPERSEDE}{}", req.owner.secret)
    } else {
        req.owner.secret.clone()
    }
}

/// One look's ending, on MySQL: the statements for `req`'s name, sent
/// with the COMMIT of the look's transaction.
pub(super) struct Looking<'a> {
    pub c: &'a mut Client,
    pub tables: &'a Tables,
    pub req: &'a Request<'a>,
}

impl Looking<'_> {
    fn keep_ms(&self) -> i64 {
        place_lasts(self.req.timing.ttl).as_millis() as i64
    }

    /// The places a `--supersede` request replaces, read first, then marked.
    fn replace(&self) -> [String; 2] {
        let name = self.req.name;
        [
            self.tables.to_replace(name, !self.c.no_wake),
            self.tables
                .replace(name, &self.req.owner.shown, self.keep_ms()),
        ]
    }

    /// The wake-up lock statements a grant holds from its COMMIT on: the
    /// lease's, and no longer our place's.
    fn hold_grant(&self) -> Vec<String> {
        let was_waiting = self.c.locked == Some('w');
        let po = place_owner(self.req);
        hold(
            self.c,
            'h',
            &self.req.owner.secret,
            was_waiting.then_some(po.as_str()),
        )
    }
}

/// The connections that wait on the places replaced, from the rows of the
/// flight that replaced them: they learn it at once.
fn replaced_conns(replacing: bool, rows: &[Vec<Row>]) -> Vec<i64> {
    if replacing {
        rows[0].iter().filter_map(|r| int(r, 0)).collect()
    } else {
        Vec::new()
    }
}

impl Deciding for Looking<'_> {
    fn unmark(&mut self) -> Result<(), Error> {
        let dequeue = self.tables.dequeue(self.req.name, &self.req.owner.secret);
        commit(self.c, vec![dequeue], Vec::new()).map(|_| ())
    }

    fn end(&mut self, leave: bool) -> Result<(), Error> {
        let dequeue = leave.then(|| self.tables.dequeue(self.req.name, &self.req.owner.secret));
        commit(self.c, dequeue.into_iter().collect(), Vec::new()).map(|_| ())
    }

    fn renew(&mut self, slot: u32, leave: bool) -> Result<Option<u64>, Error> {
        let (name, owner) = (self.req.name, &self.req.owner.secret);
        let ttl_ms = self.req.timing.ttl.as_millis() as i64;
        let [renew, read] = self.tables.renew(name, slot, owner, ttl_ms);
        let mut last = vec![renew, read];
        last.extend(leave.then(|| self.tables.dequeue(name, owner)));
        let after = self.hold_grant();
        let rows = commit(self.c, last, after.clone())?;
        if !after.is_empty() && rows.len() > 3 {
            self.c.locked = Some('h');
        }
        let row = rows[1].first();
        Ok(match row.and_then(|r| int(r, 2)) {
            Some(token) if row.and_then(|r| int(r, 0)).unwrap_or(0) > 0 => {
                Some(token.max(0) as u64)
            }
            _ => None,
        })
    }

    fn grant(&mut self, slot: u32, replacing: bool, _: bool) -> Result<Option<u64>, Error> {
        let req = self.req;
        let mut last: Vec<String> = replacing
            .then(|| self.replace())
            .into_iter()
            .flatten()
            .collect();
        last.push(self.tables.advance(req.name));
        let [gone, insert, read] = self.tables.grant(
            req.name,
            slot,
            &req.owner.secret,
            &req.owner.shown,
            req.mode.code(),
            req.mode.limit(),
            req.timing.ttl.as_millis() as i64,
        );
        last.push(gone);
        last.push(insert);
        let granted = last.len();
        last.push(read);
        let after = self.hold_grant();
        let n = last.len();
        let rows = commit(self.c, last, after.clone())?;
        if !after.is_empty() && rows.len() > n + 1 {
            self.c.locked = Some('h');
        }
        self.c.poke(&replaced_conns(replacing, &rows));
        let token = rows[granted].first().and_then(|r| int(r, 0));
        Ok(token.map(|t| t.max(0) as u64))
    }

    fn end_windows(&mut self) -> Result<(), Error> {
        let end = self.tables.end_windows(self.req.name);
        commit(self.c, vec![end], Vec::new()).map(|_| ())
    }

    fn join(&mut self, join: Join) -> Result<Option<Option<i64>>, Error> {
        let req = self.req;
        let (name, owner) = (req.name, &req.owner.secret);
        let po = place_owner(req);
        let keep_ms = self.keep_ms();
        let mut last: Vec<String> = join
            .replacing
            .then(|| self.replace())
            .into_iter()
            .flatten()
            .collect();
        if join.preempting {
            let mark = format!("{PREEMPTED}{}", req.owner.shown);
            last.push(self.tables.preempt(name, &mark, owner));
        }
        let queued = last.len();
        // A place far back is kept by its expiry alone: no connection
        // holds its wake-up lock while its waiter sleeps without one.
        let wake = !self.c.no_wake && !join.far;
        match join.seq {
            Some(seq) => last.push(self.tables.keep_place(seq, owner, keep_ms, wake)),
            None => {
                let [ins, id] = self.tables.enqueue(
                    name,
                    &po,
                    &req.owner.shown,
                    req.mode.code(),
                    req.mode.limit(),
                    keep_ms,
                    wake,
                );
                last.push(ins);
                last.push(id);
            }
        }
        let Some(rows) = commit_place(self.c, last, &po, wake)? else {
            return Ok(None);
        };
        self.c.poke(&replaced_conns(join.replacing, &rows));
        Ok(Some(
            join.seq
                .is_none()
                .then(|| rows[queued + 1].first().and_then(|r| int(r, 0)))
                .flatten(),
        ))
    }
}
