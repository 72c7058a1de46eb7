//! Taking a name on MySQL: one short transaction per look, under the row
//! lock on the name's counter: read the name's live rows, judge them, then
//! take a free slot (the grant), or take or keep a place in the queue.
//! Between looks a waiter blocks on the wake-up lock of what is just ahead
//! of it (a release or a grant frees it), else sleeps until what is in its
//! way lapses or its place needs keeping. The give-up clock, the waiting
//! line and the retry budget are the driver's (`backend::drive`).

use std::time::Duration;

use mysql::Row;

use super::client::{Client, Woke, int, text};
use super::shape;
use super::sql::{self, Tables, lit, wake_key};
use super::{MyHeld, Mysql};
use crate::backend::drive::{self, Look, Take, Transport, drive};
use crate::backend::table::{Cells, Rows, Target, Verdict, entries, judge};
use crate::backend::table::{KEPT, PREEMPTED, SUPERSEDE};
use crate::backend::{Acquired, Error, Lease, Mode, Request, Wait};
use crate::clock::{Boot, backoff};
use crate::log;

/// A waiter's place lasts a third of the ttl unless kept. One killed in
/// the queue lapses at the next look, its wake-up lock free (`sql::gone`);
/// where the server refused it that lock, it holds up the others by no
/// more than this.
pub fn place_ttl(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// The server's number for a table that is not there.
pub(super) fn missing(code: Option<u16>) -> bool {
    code == Some(1146)
}

#[derive(Default)]
struct Place {
    seq: Option<i64>,
    joined: bool,
    holder: Option<String>,
    /// Looks in a row that neither waited nor decided: the name's counter
    /// row made but not found, a grant not found after it was made.
    stalls: u32,
}

/// Looks in a row that may stall before the run gives up: a name's first
/// request makes its counter row once and looks again; tables that cut
/// or lose what lockrun writes stall every time.
const STALLS: u32 = 4;

enum Outcome {
    Granted {
        slot: u32,
        token: u64,
    },
    Blocked {
        lapses_in: Option<Duration>,
        wake_on: Option<Target>,
    },
    Busy,
    QueueFull {
        waiting: u64,
    },
    Replaced {
        by: String,
    },
    Refused(Error),
    Again,
}

struct Taking<'a> {
    my: &'a mut Mysql,
    req: &'a Request<'a>,
    place: Place,
    created: bool,
    engines_checked: bool,
    /// Blocked: what is in our way, as the last look found it.
    blocked: Option<Blocked>,
}

/// What a blocked look found in our way, and when it was sent.
struct Blocked {
    lapses_in: Option<Duration>,
    wake_on: Option<Target>,
    sent: Boot,
}

impl Take for Taking<'_> {
    type Transport = Client;

    fn look(&mut self, last: bool, _until: Option<Boot>) -> Result<Look, Error> {
        let doing = || format!("acquiring {}", self.req.name);
        if !self.engines_checked {
            // Once per run: the tables as they are found.
            self.my.check_engines()?;
            self.engines_checked = true;
        }
        loop {
            match self
                .my
                .step(self.req, &mut self.place, last, &mut self.blocked)
            {
                Err(_) if !self.created && missing(self.my.client.last_code) => {
                    // First use of these tables: create them, look again.
                    self.created = true;
                    let made = self.my.create().and_then(|()| self.my.check_engines());
                    if let Err(e) = made {
                        return Ok(Look::Over(self.my.client.failed(&doing(), e)));
                    }
                }
                Err(_) if self.my.client.last_code == Some(1690) => {
                    // BIGINT out of range: a token past the largest.
                    let e = self.my.tokens_used_up(self.req.name);
                    self.leave();
                    return Ok(Look::Over(self.my.client.failed(&doing(), e)));
                }
                Ok(Look::Again) if self.place.stalls >= STALLS => {
                    let e = self.my.stalled(self.place.stalls);
                    self.leave();
                    return Ok(Look::Over(self.my.client.failed(&doing(), e)));
                }
                Ok(Look::Again) if self.place.stalls > 1 => {
                    // Again without waiting: not at once.
                    std::thread::sleep(backoff(
                        self.place.stalls - 1,
                        Duration::from_millis(10),
                        Duration::from_millis(500),
                    ));
                    return Ok(Look::Again);
                }
                done => return done,
            }
        }
    }

    fn wait(&mut self, until: Option<Boot>) -> Result<drive::Woke, Error> {
        let Some(b) = self.blocked.take() else {
            return Ok(drive::Woke::Look);
        };
        self.my.wait(self.req, &self.place, b, until)?;
        Ok(drive::Woke::Look)
    }

    fn leave(&mut self) {
        if self.place.seq.take().is_some() {
            let sql = self
                .my
                .tables
                .dequeue(self.req.name, &self.req.owner.secret);
            let _ = self.my.client.query(sql);
        }
    }

    fn way_out(&self) -> Option<crate::backend::quit::Leave> {
        Some(super::leave::way_out(
            &self.my.client,
            &self.my.tables,
            self.req,
        ))
    }

    fn transport(&self) -> &Client {
        &self.my.client
    }
}

impl Mysql {
    pub(super) fn take(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        // A blocking wait lasts at most the time to keep our place.
        self.client.wait = place_ttl(req.timing.ttl) / 3 + Duration::from_secs(1);
        let mut taking = Taking {
            my: self,
            req,
            place: Place::default(),
            created: false,
            engines_checked: false,
            blocked: None,
        };
        drive(&mut taking, req, wait)
    }

    /// Create lockrun's tables (lockrun-engines(7) "MYSQL AND MARIADB").
    pub(super) fn create(&mut self) -> Result<(), Error> {
        log::info(format!(
            "creating lockrun's tables {}_leases, {}_waiters and {}_tokens",
            self.tables.base, self.tables.base, self.tables.base
        ));
        let f = self.client.flight(&self.tables.create());
        let Some((at, e)) = f.failed else {
            return Ok(());
        };
        let code = self.client.last_code;
        let database = crate::text::printable(&self.client.url().database).into_owned();
        match e {
            Error::Refused(m) if matches!(code, Some(1142 | 1044)) => Err(Error::Refused(format!(
                "cannot create lockrun's tables in database {database}: {m}; create them once \
                 as a user that may (lockrun-engines(7) \"MYSQL AND MARIADB\")"
            ))),
            Error::Refused(m) => {
                let table = ["tokens", "leases", "waiters"]
                    .get(at)
                    .map_or(String::new(), |t| format!("{}_{t}", self.tables.base));
                // A server that makes new tables in another engine refuses
                // InnoDB (1290), or makes one whose keys are too long (1071).
                if let Some(engine) = self.enforced_engine() {
                    return Err(Error::Refused(format!(
                        "cannot create lockrun's table {database}.{table}: the server makes \
                         every new table in {engine} (enforce_storage_engine), and lockrun \
                         needs InnoDB, whose transactions and row locks keep two holders \
                         apart: set enforce_storage_engine to InnoDB, or to nothing"
                    )));
                }
                if self.innodb_read_only() {
                    return Err(Error::Refused(format!(
                        "cannot create lockrun's table {database}.{table}: the server's InnoDB \
                         is read-only (innodb_read_only = ON); point lockrun at a server that \
                         may write"
                    )));
                }
                let keys = if matches!(code, Some(1071 | 1709)) {
                    "; lockrun's keys on names need InnoDB's DYNAMIC rows (keys up to 3072 \
                     bytes): allow ROW_FORMAT=DYNAMIC on the server (innodb_default_row_format, \
                     innodb_file_per_table)"
                } else {
                    ""
                };
                Err(Error::Refused(format!(
                    "cannot create lockrun's table {database}.{table} in InnoDB: {m}{keys}"
                )))
            }
            e => Err(e),
        }
    }

    /// The server's InnoDB creates and writes nothing (`innodb_read_only`).
    fn innodb_read_only(&mut self) -> bool {
        let rows = self
            .client
            .flight_keeping(&["SELECT @@GLOBAL.innodb_read_only".into()], &[1193])
            .sets;
        rows.first()
            .and_then(|s| s.first())
            .and_then(|r| int(r, 0))
            .is_some_and(|v| v != 0)
    }

    /// The engine `enforce_storage_engine` makes every new table in, when
    /// it is set and is not InnoDB (MariaDB; MySQL has no such setting).
    fn enforced_engine(&mut self) -> Option<String> {
        let rows = self
            .client
            .flight_keeping(&["SELECT @@GLOBAL.enforce_storage_engine".into()], &[1193])
            .sets;
        let engine = rows.first()?.first().and_then(|r| text(r, 0))?;
        (!engine.is_empty() && !engine.eq_ignore_ascii_case("InnoDB"))
            .then(|| crate::text::printable(&engine).into_owned())
    }

    /// Refuse tables that are not InnoDB (`Tables::engines`); tables not
    /// there yet are no answer. Before that, a server that logs statements
    /// (`binlog_format = STATEMENT`), under which InnoDB refuses every
    /// READ COMMITTED write: lockrun's sessions log rows instead where the
    /// user may set that, else it is refused before any table is made.
    pub(super) fn check_engines(&mut self) -> Result<(), Error> {
        // A server without these variables has no such log.
        let f = self
            .client
            .flight_keeping(&[self.tables.engines(), sql::BINLOG.into()], &[1193]);
        match f.failed {
            Some((0, e)) => return Err(e),
            Some((_, e)) if e.is_transient() => return Err(e),
            _ => {}
        }
        let sets = f.sets;
        if !self.client.row_binlog
            && let Some(r) = sets.get(1).and_then(|s| s.first())
            && int(r, 0).unwrap_or(0) != 0
            && text(r, 1).is_some_and(|f| f.eq_ignore_ascii_case("STATEMENT"))
        {
            match self.client.run(&[sql::ROW_BINLOG.into()]) {
                Ok(_) => self.client.row_binlog = true,
                Err(Error::Transient(m)) => return Err(Error::Transient(m)),
                Err(_) => return Err(Error::Refused(sql::STATEMENT_BINLOG.into())),
            }
        }
        let Some(r) = sets[0].first() else {
            return Ok(());
        };
        let table = text(r, 0).unwrap_or_default();
        let engine = text(r, 1).unwrap_or_default();
        Err(Error::Refused(format!(
            "lockrun's table {}.{} is in the {} engine, which has no transactions or row \
             locks to keep two holders apart: make it InnoDB (ALTER TABLE … ENGINE=InnoDB \
             while nothing runs; check enforce_storage_engine)",
            crate::text::printable(&self.client.url().database),
            crate::text::printable(&table),
            crate::text::printable(&engine),
        )))
    }

    fn step(
        &mut self,
        req: &Request,
        place: &mut Place,
        last: bool,
        blocked: &mut Option<Blocked>,
    ) -> Result<Look, Error> {
        let sent = Boot::now();
        let tables = self.tables.clone();
        let wake = !self.client.no_wake;
        // The places of waiters that are gone lapse first, and ours comes
        // back if that was done to it while we lived (`Tables::purge`);
        // not a --supersede place, which a newer one may have replaced
        // meanwhile (one that did not find it live).
        let mut first = vec![tables.purge(req.name, &req.owner.secret, wake)];
        if let Some(seq) = place.seq.filter(|_| !req.group.supersede) {
            let keep_ms = place_ttl(req.timing.ttl).as_millis() as i64;
            first.push(tables.revive(seq, &req.owner.secret, keep_ms, wake));
        }
        first.push(tables.look(req.name, wake));
        let outcome = transaction(&mut self.client, &tables, req.name, first, |c, rows| {
            look(c, rows, &tables, req, place, last)
        })?;
        let Some(outcome) = outcome else {
            // The counter row was made: look again.
            place.stalls += 1;
            return Ok(Look::Again);
        };
        if matches!(outcome, Outcome::Again) {
            place.stalls += 1;
        } else {
            place.stalls = 0;
        }
        match outcome {
            Outcome::Granted { slot, token } => {
                let fresh = self.client.fresh();
                let client = std::mem::replace(&mut self.client, fresh);
                let held = MyHeld::new(client, &self.tables, req, slot);
                Ok(Look::Done(Acquired::Granted(Lease::new(
                    token,
                    matches!(req.mode, Mode::Limit(_)).then_some(slot),
                    sent,
                    req.timing.ttl,
                    Box::new(held),
                ))))
            }
            // The wait is over: out of the queue already.
            Outcome::Busy => Ok(Look::Blocked(place.holder.clone())),
            Outcome::QueueFull { waiting } => Ok(Look::Done(Acquired::QueueFull { waiting })),
            Outcome::Replaced { by } => Ok(Look::Done(Acquired::Replaced { by })),
            Outcome::Refused(e) => Err(e),
            Outcome::Again => Ok(Look::Again),
            Outcome::Blocked { lapses_in, wake_on } => {
                *blocked = Some(Blocked {
                    lapses_in,
                    wake_on,
                    sent,
                });
                Ok(Look::Blocked(place.holder.clone()))
            }
        }
    }

    /// Block on the wake-up lock of what is just ahead, else sleep until
    /// what is in our way lapses or our place needs keeping; by `until`
    /// at the latest.
    fn wait(
        &mut self,
        req: &Request,
        place: &Place,
        b: Blocked,
        until: Option<Boot>,
    ) -> Result<(), Error> {
        let cap = |d: Duration| until.map_or(d, |u| d.min(u.since(Boot::now())));
        let keep = place_ttl(req.timing.ttl) / 3;
        let at = |d: Duration| b.sent.add(d + Duration::from_millis(5));
        let usable = !self.client.no_wake && self.client.connected();
        let Some(target) = b.wake_on.filter(|_| usable) else {
            // Sleep until what is in our way lapses, or our place
            // needs keeping.
            let until_lapse = b.lapses_in.map_or(keep, |d| at(d).since(Boot::now()));
            std::thread::sleep(cap(keep.min(until_lapse)));
            return Ok(());
        };
        // Block on the row just ahead; a live place ahead keeps
        // itself (its lockrun's death ends its lock), a holder may
        // lapse with its session alive (its lockrun stopped).
        let lapse_at = (target.kind == 'h').then(|| at(target.left));
        let mut keep_sql = None;
        loop {
            let until_lapse = lapse_at.map_or(keep, |t| t.since(Boot::now()));
            let nap = cap(keep.min(until_lapse));
            let woke = self
                .client
                .wait_for(target.kind, &target.owner, nap, keep_sql.take())?;
            let due = lapse_at.is_some_and(|t| Boot::now() >= t)
                || until.is_some_and(|u| u.since(Boot::now()) < Duration::from_millis(5));
            // Nothing moved ahead of us: keep our place and wait
            // again without a look, unless something is due (a
            // lapse, the waiting line, the end of the wait).
            if woke != Woke::TimedOut || due {
                return Ok(());
            }
            let Some(seq) = place.seq else {
                return Ok(());
            };
            let keep_ms = place_ttl(req.timing.ttl).as_millis() as i64;
            keep_sql = Some(self.keep_sql(req, seq, keep_ms, &target));
        }
    }

    /// Why a name's looks keep stalling: how lockrun's tables differ from
    /// what it needs, read from the server, or else what did not happen.
    fn stalled(&mut self, tries: u32) -> Error {
        let database = self.client.url().database.clone();
        let f = self.client.flight(&shape::describe(&self.tables));
        let diffs = shape::differences(&self.tables.base, &f.sets);
        if !diffs.is_empty() {
            return Error::Refused(shape::said(&database, &diffs));
        }
        Error::Refused(format!(
            "after {tries} tries, the name's rows in database {}'s {}_tokens and {}_leases \
             are still not as lockrun wrote them (something changes or removes them); \
             run lockrun doctor",
            crate::text::printable(&database),
            self.tables.base,
            self.tables.base,
        ))
    }

    /// A name whose counter (or a lease row's token) is at BIGINT's
    /// largest: no greater token can be given, and lockrun gives none
    /// lower. Clearing the row is the operator's choice, said with what
    /// it costs.
    fn tokens_used_up(&self, name: &str) -> Error {
        let database = crate::text::printable(&self.client.url().database).into_owned();
        let t = &self.tables;
        Error::Refused(format!(
            "the name's token counter is at its maximum ({}, BIGINT's largest; set by hand or \
             imported), so no greater token can be given: to clear it, while nothing holds \
             the name, DELETE FROM {database}.{tokens} WHERE name = {n}, and its rows from \
             {leases}; its tokens then start again from the server's clock in microseconds, \
             below those given before",
            i64::MAX,
            tokens = t.tokens,
            leases = t.leases,
            n = lit(name),
        ))
    }

    /// Keep our place, on condition that the row we block on is still there.
    fn keep_sql(&self, req: &Request, seq: i64, keep_ms: i64, t: &Target) -> (String, String) {
        (
            self.tables
                .keep_place(seq, &req.owner.secret, keep_ms, !self.client.no_wake),
            self.tables.still(req.name, t.kind, &t.owner, t.pos),
        )
    }
}

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
) -> Result<Option<Vec<Vec<Row>>>, Error> {
    let n = last.len();
    let lock = !c.no_wake && c.locked != Some('w');
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

/// One look at the name, inside its transaction: `rows` are its live rows.
fn look(
    c: &mut Client,
    rows: Vec<Row>,
    tables: &Tables,
    req: &Request,
    place: &mut Place,
    last: bool,
) -> Result<Outcome, Error> {
    let name = req.name;
    let owner = &req.owner.secret;
    let Rows {
        holders,
        mut waiters,
        replaced,
    } = entries(rows.iter().map(|r| Cells {
        kind: text(r, 0),
        pos: int(r, 1),
        owner: text(r, 2),
        label: text(r, 3),
        token: int(r, 4),
        code: text(r, 5),
        lim: int(r, 6),
        left_ms: int(r, 7),
        live: int(r, 8).unwrap_or(0) != 0,
    }))?;
    if let Some(mark) = replaced.iter().find(|m| &m.owner == owner) {
        // A newer --supersede request took our place. Its mark goes.
        commit(c, vec![tables.dequeue(name, owner)], Vec::new())?;
        place.seq = None;
        return Ok(Outcome::Replaced {
            by: mark.label.clone(),
        });
    }
    let mine = waiters.iter().find(|w| &w.owner == owner).map(|w| w.pos);
    if let (Some(old), None) = (place.seq, mine) {
        if req.group.supersede
            && let Some(newer) = waiters.iter().find(|w| w.supersede && w.pos > old)
        {
            commit(c, Vec::new(), Vec::new())?;
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
    let ttl_ms = req.timing.ttl.as_millis() as i64;
    let keep_ms = place_ttl(req.timing.ttl).as_millis() as i64;
    let mut verdict = judge(&holders, &waiters, place.seq, req);
    let replacing = req.group.supersede
        && place.seq.is_none()
        && matches!(verdict, Verdict::Blocked { .. })
        && waiters.iter().any(|w| w.supersede);
    if replacing {
        waiters.retain(|w| !w.supersede);
        verdict = judge(&holders, &waiters, place.seq, req);
    }
    // The places it replaces, read first, then marked.
    let replace = || {
        [
            tables.to_replace(name, !c.no_wake),
            tables.replace(name, &req.owner.shown, keep_ms),
        ]
    };
    // Their waiters learn it at once.
    let conns = |rows: &[Vec<Row>]| -> Vec<i64> {
        if replacing {
            rows[0].iter().filter_map(|r| int(r, 0)).collect()
        } else {
            Vec::new()
        }
    };
    let leave = |place: &mut Place| place.seq.take().map(|_| tables.dequeue(name, owner));
    let was_waiting = c.locked == Some('w');
    match verdict {
        Verdict::Ours { slot } => {
            let [renew, read] = tables.renew(name, slot, owner, ttl_ms);
            let mut last = vec![renew, read];
            last.extend(leave(place));
            let po = place_owner(req);
            let after = hold(c, 'h', owner, was_waiting.then_some(po.as_str()));
            let rows = commit(c, last, after.clone())?;
            if !after.is_empty() && rows.len() > 3 {
                c.locked = Some('h');
            }
            let row = rows[1].first();
            Ok(match row.and_then(|r| int(r, 2)) {
                Some(token) if row.and_then(|r| int(r, 0)).unwrap_or(0) > 0 => Outcome::Granted {
                    slot,
                    token: token.max(0) as u64,
                },
                _ => Outcome::Again,
            })
        }
        Verdict::Granted { slot } => {
            let mut last: Vec<String> = replacing.then(replace).into_iter().flatten().collect();
            last.push(tables.advance(name));
            let [gone, insert, read] = tables.grant(
                name,
                slot,
                owner,
                &req.owner.shown,
                req.mode.code(),
                req.mode.limit(),
                ttl_ms,
            );
            last.push(gone);
            last.push(insert);
            let granted = last.len();
            last.push(read);
            let po = place_owner(req);
            let after = hold(c, 'h', owner, was_waiting.then_some(po.as_str()));
            let n = last.len();
            let rows = commit(c, last, after.clone())?;
            if !after.is_empty() && rows.len() > n + 1 {
                c.locked = Some('h');
            }
            c.poke(&conns(&rows));
            place.seq = None;
            let Some(token) = rows[granted].first().and_then(|r| int(r, 0)) else {
                return Ok(Outcome::Again);
            };
            Ok(Outcome::Granted {
                slot,
                token: token.max(0) as u64,
            })
        }
        Verdict::Nested => {
            commit(c, leave(place).into_iter().collect(), Vec::new())?;
            Ok(Outcome::Refused(crate::backend::nested(req.name)))
        }
        Verdict::Disagrees(in_force) => {
            commit(c, leave(place).into_iter().collect(), Vec::new())?;
            Ok(Outcome::Refused(req.mode.disagreement(req.name, in_force)))
        }
        Verdict::Blocked {
            holder,
            lapses_in,
            wake_on,
        } => {
            place.holder = holder.or(place.holder.take());
            if last {
                commit(c, leave(place).into_iter().collect(), Vec::new())?;
                return Ok(Outcome::Busy);
            }
            let first = place.seq.is_none() && !place.joined;
            if first && let Some(n) = req.group.max_waiters {
                let waiting = waiters.iter().filter(|w| &w.owner != owner).count() as u64;
                if waiting >= u64::from(n) {
                    commit(c, Vec::new(), Vec::new())?;
                    return Ok(Outcome::QueueFull { waiting });
                }
            }
            let preempting = first && req.group.preempt && !holders.is_empty();
            if preempting && holders.iter().any(|h| h.owner == KEPT) {
                commit(c, vec![tables.end_windows(name)], Vec::new())?;
                return Ok(Outcome::Again);
            }
            let po = place_owner(req);
            let mut last: Vec<String> = replacing.then(replace).into_iter().flatten().collect();
            if preempting {
                let mark = format!("{PREEMPTED}{}", req.owner.shown);
                last.push(tables.preempt(name, &mark, owner));
            }
            let queued = last.len();
            let wake = !c.no_wake;
            match place.seq {
                Some(seq) => last.push(tables.keep_place(seq, owner, keep_ms, wake)),
                None => {
                    let [ins, id] = tables.enqueue(
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
            let Some(rows) = commit_place(c, last, &po)? else {
                return Ok(Outcome::Again);
            };
            c.poke(&conns(&rows));
            if place.seq.is_none() {
                place.seq = rows[queued + 1].first().and_then(|r| int(r, 0));
            }
            place.joined |= place.seq.is_some();
            Ok(Outcome::Blocked { lapses_in, wake_on })
        }
    }
}
