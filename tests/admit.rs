//! The admission table (`admit/table.rs`, also the rule's unit test in
//! Rust) run against the Redis acquire script on a real server: each row's
//! holders and waiters written as the scripts store them, then one call of
//! the script for the request, with its concurrency group: its answer, who
//! it says is in the way, and what it did to the others, row by row.

mod table;

use redis::Value;

use crate::support::Redis;
use table::{By, C, Forced, Joined, M, P, Want};

const PRELUDE: &str = include_str!("../src/backend/redis/scripts/prelude.lua");
const ACQUIRE: &str = include_str!("../src/backend/redis/scripts/acquire.lua");
const FORCE: &str = include_str!("../src/backend/redis/scripts/force.lua");

/// The request's owner value and waiter id, and the outer lockrun's label.
const OWNER: &str = "0123456789abcdef";
const ID: &str = "req";
const OUTER: &str = "host:1";
/// The request as shown, and an earlier `--preempt` request's.
const REQUEST: &str = "host:req";
const EARLIER: &str = "host:old";
/// Long enough that nothing lapses while a row is judged.
const LIFE_MS: u64 = 600_000;

fn code(m: M) -> (&'static str, u32) {
    match m {
        M::X => ("x", 1),
        M::S => ("s", 1),
        M::N(n) => ("n", n),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        Value::BulkString(b) => String::from_utf8_lossy(b).parse().unwrap(),
        other => panic!("not a number: {other:?}"),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("not text: {other:?}"),
    }
}

fn now_ms(c: &mut redis::Connection) -> u64 {
    let t: Vec<u64> = redis::cmd("TIME").query(c).unwrap();
    t[0] * 1000 + t[1] / 1000
}

/// A waiter's id: those that asked for `--supersede` start with `s`.
fn waiter_id(j: usize, w: &P) -> String {
    if w.supersede {
        format!("sw{j}")
    } else {
        format!("w{j}")
    }
}

/// The request's waiter id.
fn request_id(r: &table::Row) -> &'static str {
    if r.group.supersede { "sreq" } else { ID }
}

/// A holder's field in the name's hash, and its token.
fn holder_field(j: usize, h: &P) -> (String, usize) {
    let token = 100 + j;
    let field = match h {
        h if h.ours => format!("h:{OWNER}"),
        h if h.window => format!("m:{token}"),
        h if h.revoked => format!("r:{token}"),
        _ => format!("h:{j:016x}"),
    };
    (field, token)
}

/// A waiter's owner value.
fn waiter_owner(j: usize) -> String {
    format!("{:016x}", 1000 + j)
}

/// Who the script says is in the way, as the table names it: a waiter
/// still queued by its id, a holder by its field (a waiter the queue
/// served holds by its owner value).
fn in_the_way(r: &table::Row, said: &str) -> Option<By> {
    if let Some(id) = said.strip_prefix("w:") {
        return (0..r.waiters.len())
            .find(|&j| waiter_id(j, &r.waiters[j]) == id)
            .map(By::Waiter);
    }
    if let Some(j) = (0..r.holders.len()).find(|&j| holder_field(j, &r.holders[j]).0 == said) {
        return Some(By::Holder(j));
    }
    (0..r.waiters.len())
        .find(|&j| said == format!("h:{}", waiter_owner(j)))
        .map(By::Waiter)
}

/// A name's keys, for row `i` of the table named `table`.
fn keys_of(table: &str, i: usize) -> [String; 7] {
    let lock = format!("lockrun:{{{table}{i}}}");
    [
        "", ":fence", ":queue", ":waiters", ":wake:", ":alive", ":preempt",
    ]
    .map(|k| format!("{lock}{k}"))
}

/// Write `holders` as the scripts store them: holder `j` has the token
/// `100 + j`; one an earlier `--preempt` request marked, its mark.
fn write_holders(c: &mut redis::Connection, keys: &[String; 7], holders: &[P], now: u64) {
    let until = now + LIFE_MS;
    for (j, h) in holders.iter().enumerate() {
        let (field, token) = holder_field(j, h);
        let label = if h.outer {
            OUTER.to_string()
        } else {
            format!("host:h{j}")
        };
        let (mode, limit) = code(h.mode);
        let slot = h.slot.map_or(-1, i64::from);
        let value = format!("{token}|{until}|{mode}|{limit}|{slot}|{now}|{label}");
        let _: () = redis::cmd("HSET")
            .arg(&keys[0])
            .arg(field)
            .arg(value)
            .query(c)
            .unwrap();
        let _: () = redis::cmd("PEXPIREAT")
            .arg(&keys[0])
            .arg(until)
            .query(c)
            .unwrap();
        if h.preempted {
            let _: () = redis::cmd("HSET")
                .arg(&keys[6])
                .arg(token)
                .arg(EARLIER)
                .query(c)
                .unwrap();
            let _: () = redis::cmd("PEXPIREAT")
                .arg(&keys[6])
                .arg(until)
                .query(c)
                .unwrap();
        }
    }
}

/// What the script answered for the row `i`: as the table speaks, or
/// `Err(waiting)` for a full queue (`--max-waiters`).
fn run_row(c: &mut redis::Connection, i: usize, r: &table::Row) -> Result<Want, u64> {
    let keys = keys_of("row", i);
    let now = now_ms(c);
    let until = now + LIFE_MS;
    write_holders(c, &keys, &r.holders, now);
    for (j, w) in r.waiters.iter().enumerate() {
        let mine = r.place == Some(j);
        let (id, owner) = if mine {
            (request_id(r).to_string(), OWNER.to_string())
        } else {
            (waiter_id(j, w), waiter_owner(j))
        };
        let (mode, limit) = code(w.mode);
        let value = format!("30000|{mode}|{limit}|{owner}|host:w{j}");
        let _: () = redis::cmd("ZADD")
            .arg(&keys[2])
            .arg(1000 + j)
            .arg(&id)
            .query(c)
            .unwrap();
        let _: () = redis::cmd("HSET")
            .arg(&keys[3])
            .arg(&id)
            .arg(value)
            .query(c)
            .unwrap();
        let _: () = redis::cmd("ZADD")
            .arg(&keys[5])
            .arg(until)
            .arg(&id)
            .query(c)
            .unwrap();
    }
    for k in [&keys[2], &keys[3], &keys[5]] {
        let _: () = redis::cmd("PEXPIREAT")
            .arg(k)
            .arg(until + LIFE_MS)
            .query(c)
            .unwrap();
    }
    let (mode, limit) = code(r.mode);
    let script = redis::Script::new(&format!("{PRELUDE}{ACQUIRE}"));
    let mut call = script.prepare_invoke();
    for k in &keys {
        call.key(k);
    }
    let flag = |on: bool| if on { "1" } else { "0" };
    let reply: Vec<Value> = call
        .arg(OWNER)
        .arg(REQUEST)
        .arg(30000)
        .arg(mode)
        .arg(limit)
        .arg("1")
        .arg(request_id(r))
        .arg(10000)
        .arg(OUTER)
        .arg("0")
        .arg(r.place.map(|p| (1000 + p).to_string()).unwrap_or_default())
        .arg(
            r.group
                .max_waiters
                .map(|n| n.to_string())
                .unwrap_or_default(),
        )
        .arg(flag(r.group.supersede))
        .arg(flag(r.group.preempt))
        .invoke(c)
        .unwrap();
    let waits = |at: usize| {
        let said = reply.get(at).map(text).unwrap_or_default();
        // Who is in the way, or a sign the table has no such one.
        Want::Wait(in_the_way(r, &said).unwrap_or(By::Holder(usize::MAX)))
    };
    Ok(match int(&reply[0]) {
        1 => match r.holders.iter().position(|h: &P| h.ours) {
            Some(j) => {
                assert_eq!(int(&reply[1]), 100 + j as i64, "{}: our own token", r.what);
                Want::Ours(j)
            }
            None => Want::Hold(u32::try_from(int(&reply[2])).ok()),
        },
        0 => waits(2),
        2 => waits(4),
        3 => Want::Disagrees(match text(&reply[1]).as_str() {
            "x" => M::X,
            "s" => M::S,
            _ => M::N(int(&reply[2]) as u32),
        }),
        4 => Want::Nested,
        6 => return Err(int(&reply[1]) as u64),
        other => panic!("{}: answer {other}", r.what),
    })
}

/// What the script did to the others of row `i` as the request joined:
/// the holders it asked to stop, the windows it ended, the waiters it
/// replaced.
fn joined(c: &mut redis::Connection, i: usize, r: &table::Row) -> Joined {
    let lock = format!("lockrun:{{row{i}}}");
    let mut did = Joined::default();
    for (j, h) in r.holders.iter().enumerate() {
        let (field, token) = holder_field(j, h);
        let mark: Option<String> = redis::cmd("HGET")
            .arg(format!("{lock}:preempt"))
            .arg(token)
            .query(c)
            .unwrap();
        if mark.as_deref() == Some(REQUEST) {
            did.mark.push(j);
        }
        let there: bool = redis::cmd("HEXISTS")
            .arg(&lock)
            .arg(field)
            .query(c)
            .unwrap();
        if h.window && !there {
            did.end.push(j);
        }
    }
    for (j, w) in r.waiters.iter().enumerate() {
        let woken: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{lock}:wake:{}", waiter_id(j, w)))
            .arg(0)
            .arg(-1)
            .query(c)
            .unwrap();
        if woken.contains(&"replaced".to_string()) {
            did.replace.push(j);
        }
    }
    did
}

/// Each row: the script's answer and who it says is in the way; for a row
/// whose line stops at a disagreeing waiter, that the waiter is refused and
/// the answer once it is; for a group row, what the request did to the
/// others (the join plan) and its answer once it joined.
#[test]
fn the_redis_script_answers_every_row_of_the_admission_table() {
    let server = Redis::start();
    let mut c = server.conn();
    let mut wrong = Vec::new();
    for (i, r) in table::rows().iter().enumerate() {
        let got = run_row(&mut c, i, r);
        let mut want = Ok(r.want);
        if let Want::Wait(By::Refused(j)) = r.want {
            // The script refuses a waiter that disagrees with the holders as
            // the queue is served, in the same call, and the line moves on:
            // what it answers the request is for the queue without it.
            let woken: Vec<String> = redis::cmd("LRANGE")
                .arg(format!(
                    "lockrun:{{row{i}}}:wake:{}",
                    waiter_id(j, &r.waiters[j])
                ))
                .arg(0)
                .arg(-1)
                .query(&mut c)
                .unwrap();
            if !woken.contains(&"refused".to_string()) {
                wrong.push(format!("{}: waiter {j} not refused: {woken:?}", r.what));
            }
            want = Ok(r
                .after
                .expect("a row that refuses a waiter says what follows"));
        }
        if let Some(j) = &r.joined {
            if let Some(n) = j.full {
                want = Err(n);
            }
            let did = joined(&mut c, i, r);
            let plan = Joined {
                full: None,
                ..j.clone()
            };
            if did != plan {
                wrong.push(format!(
                    "{}: the script did {did:?}, the table {plan:?}",
                    r.what
                ));
            }
        }
        if got != want {
            wrong.push(format!(
                "{}: the script answers {got:?}, the table {want:?}",
                r.what
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// What the force script answered for force row `i`, and what became of
/// each holder it cut: revoked (its field now `r:<token>`), or gone.
fn run_force_row(c: &mut redis::Connection, i: usize, r: &table::ForceRow) -> Forced {
    let keys = keys_of("force", i);
    let now = now_ms(c);
    write_holders(c, &keys, &r.holders, now);
    let script = redis::Script::new(&format!("{PRELUDE}{FORCE}"));
    let mut call = script.prepare_invoke();
    for k in &keys {
        call.key(k);
    }
    let reply: Vec<Value> = call
        .arg(r.token.map(|t| t.to_string()).unwrap_or_default())
        .arg(if r.now { "1" } else { "0" })
        .invoke(c)
        .unwrap();
    match int(&reply[0]) {
        0 => return Forced::NotHeld,
        2 => return Forced::Mismatch,
        3 => return Forced::AlreadyRevoked,
        1 => {}
        other => panic!("{}: answer {other}", r.what),
    }
    // Nine fields a holder broken; its token second.
    let tokens: Vec<i64> = reply[1..].chunks(9).map(|row| int(&row[1])).collect();
    let mut cut = Vec::new();
    for (j, h) in r.holders.iter().enumerate() {
        let token = 100 + j;
        if !tokens.contains(&(token as i64)) {
            continue;
        }
        let revoked: bool = redis::cmd("HEXISTS")
            .arg(&keys[0])
            .arg(format!("r:{token}"))
            .query(c)
            .unwrap();
        let how = match h {
            h if h.window && !revoked => C::EndWindow,
            _ if revoked => C::Revoke,
            _ => C::Delete,
        };
        cut.push((j, how));
    }
    Forced::Cut(cut)
}

/// Each row of `release --force` against the force script: its answer,
/// and what became of each holder.
#[test]
fn the_redis_force_script_answers_every_force_row_of_the_table() {
    let server = Redis::start();
    let mut c = server.conn();
    let mut wrong = Vec::new();
    for (i, r) in table::force_rows().iter().enumerate() {
        let got = run_force_row(&mut c, i, r);
        if got != r.want {
            wrong.push(format!(
                "{}: the script answers {got:?}, the table {:?}",
                r.what, r.want
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
