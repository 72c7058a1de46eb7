//! The admission table (`admit/table.rs`, also the rule's unit test in
//! Rust) run against the Redis acquire script on a real server: each row's
//! holders and waiters written as the scripts store them, then one call of
//! the script for the request.

mod table;

use redis::Value;

use crate::support::Redis;
use table::{By, M, P, Want};

const PRELUDE: &str = include_str!("../src/backend/redis/scripts/prelude.lua");
const ACQUIRE: &str = include_str!("../src/backend/redis/scripts/acquire.lua");

/// The request's owner value and waiter id, and the outer lockrun's label.
const OWNER: &str = "0123456789abcdef";
const ID: &str = "req";
const OUTER: &str = "host:1";
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

/// What the script answered for the row `i`, read as the table speaks.
fn run_row(c: &mut redis::Connection, i: usize, r: &table::Row) -> Want {
    let lock = format!("lockrun:{{row{i}}}");
    let keys =
        ["", ":fence", ":queue", ":waiters", ":wake:", ":alive"].map(|k| format!("{lock}{k}"));
    let now = now_ms(c);
    let until = now + LIFE_MS;
    for (j, h) in r.holders.iter().enumerate() {
        let token = 100 + j;
        let field = match (h.ours, h.window) {
            (true, _) => format!("h:{OWNER}"),
            (false, true) => format!("m:{token}"),
            (false, false) => format!("h:{j:016x}"),
        };
        let label = if h.outer {
            OUTER.to_string()
        } else {
            format!("host:h{j}")
        };
        let (mode, limit) = code(h.mode);
        let slot = h.slot.map_or(-1, i64::from);
        let value = format!("{token}|{until}|{mode}|{limit}|{slot}|{now}|{label}");
        redis::cmd("HSET")
            .arg(&keys[0])
            .arg(field)
            .arg(value)
            .exec(c)
            .unwrap();
        redis::cmd("PEXPIREAT")
            .arg(&keys[0])
            .arg(until)
            .exec(c)
            .unwrap();
    }
    for (j, w) in r.waiters.iter().enumerate() {
        let mine = r.place == Some(j);
        let (id, owner) = if mine {
            (ID.to_string(), OWNER.to_string())
        } else {
            (format!("w{j}"), format!("{:016x}", 1000 + j))
        };
        let (mode, limit) = code(w.mode);
        let value = format!("30000|{mode}|{limit}|{owner}|host:w{j}");
        redis::cmd("ZADD")
            .arg(&keys[2])
            .arg(1000 + j)
            .arg(&id)
            .exec(c)
            .unwrap();
        redis::cmd("HSET")
            .arg(&keys[3])
            .arg(&id)
            .arg(value)
            .exec(c)
            .unwrap();
        redis::cmd("ZADD")
            .arg(&keys[5])
            .arg(until)
            .arg(&id)
            .exec(c)
            .unwrap();
    }
    for k in [&keys[2], &keys[3], &keys[5]] {
        redis::cmd("PEXPIREAT")
            .arg(k)
            .arg(until + LIFE_MS)
            .exec(c)
            .unwrap();
    }
    let (mode, limit) = code(r.mode);
    let script = redis::Script::new(&format!("{PRELUDE}{ACQUIRE}"));
    let mut call = script.prepare_invoke();
    for k in &keys {
        call.key(k);
    }
    let reply: Vec<Value> = call
        .arg(OWNER)
        .arg("host:req")
        .arg(30000)
        .arg(mode)
        .arg(limit)
        .arg("1")
        .arg(ID)
        .arg(10000)
        .arg(OUTER)
        .arg("0")
        .arg(r.place.map(|p| (1000 + p).to_string()).unwrap_or_default())
        .invoke(c)
        .unwrap();
    match int(&reply[0]) {
        1 => match r.holders.iter().position(|h: &P| h.ours) {
            Some(j) => {
                assert_eq!(int(&reply[1]), 100 + j as i64, "{}: our own token", r.what);
                Want::Ours(j)
            }
            None => Want::Hold(u32::try_from(int(&reply[2])).ok()),
        },
        // Busy or queued: which one is in the way the script does not say.
        0 | 2 => match r.want {
            Want::Wait(by) => Want::Wait(by),
            _ => Want::Wait(By::Holder(usize::MAX)),
        },
        3 => Want::Disagrees(match text(&reply[1]).as_str() {
            "x" => M::X,
            "s" => M::S,
            _ => M::N(int(&reply[2]) as u32),
        }),
        4 => Want::Nested,
        other => panic!("{}: answer {other}", r.what),
    }
}

#[test]
fn the_redis_script_answers_every_row_of_the_admission_table() {
    let server = Redis::start();
    let mut c = server.conn();
    let mut wrong = Vec::new();
    for (i, r) in table::rows().iter().enumerate() {
        let got = run_row(&mut c, i, r);
        if let Want::Wait(By::Refused(j)) = r.want {
            // The script refuses a waiter that disagrees with the holders as
            // the queue is served, in the same call, and the line moves on:
            // what it answers the request is for the queue without it.
            let woken: Vec<String> = redis::cmd("LRANGE")
                .arg(format!("lockrun:{{row{i}}}:wake:w{j}"))
                .arg(0)
                .arg(-1)
                .query(&mut c)
                .unwrap();
            if !woken.contains(&"refused".to_string()) {
                wrong.push(format!("{}: waiter {j} not refused: {woken:?}", r.what));
            }
            continue;
        }
        if got != r.want {
            wrong.push(format!(
                "{}: the script answers {got:?}, the table {:?}",
                r.what, r.want
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
