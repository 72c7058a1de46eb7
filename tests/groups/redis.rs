//! `--supersede` and `--preempt` beyond what every engine shares (those
//! tests are in `conformance.rs`): where Redis keeps the marks, how soon a
//! replaced waiter hears, and what an older lockrun reads beside them.

use std::time::{Duration, Instant};

use redis::Value;

use crate::support::*;

const PRELUDE: &str = include_str!("../../src/backend/redis/scripts/prelude.lua");

/// An older lockrun's inspect and renew scripts, as it sends them (with the
/// prelude, whose record grammar it shares): given six keys, knowing
/// nothing of the marks.
const OLD_INSPECT: &str = "
local all = redis.call('HGETALL', KEYS[1])
local out = {now_ms(), 0}
for i = 1, #all, 2 do
  local r = parse(all[i + 1])
  local kind = string.sub(all[i], 1, 2)
  if not r or (kind ~= 'h:' and kind ~= 'r:' and kind ~= 'm:') then
    return redis.error_reply('LOCKRUN the key exists but is not a lockrun lease')
  end
  if r.exp > now_ms() then
    for _, v in ipairs({r.label, r.token, r.slot, r.mode, r.limit, r.exp - now_ms(),
        now_ms() - r.granted, kind_code(all[i])}) do
      out[#out + 1] = v
    end
  end
end
out[2] = redis.call('ZCOUNT', KEYS[6], '(' .. fmt(now_ms()), '+inf')
return out
";
const OLD_RENEW: &str = "
local field = 'h:' .. ARGV[1]
local v = redis.pcall('HGET', KEYS[1], field)
if type(v) ~= 'string' then return 0 end
local r = parse(v)
if not r or r.exp <= now_ms() then return 0 end
r.exp = now_ms() + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], field, encode(r))
return 1
";

fn old_script<T: redis::FromRedisValue>(redis: &Redis, body: &str, name: &str, args: &[&str]) -> T {
    let lock = format!("lockrun:{{{name}}}");
    let script = redis::Script::new(&format!("{PRELUDE}{body}"));
    let mut call = script.prepare_invoke();
    for k in ["", ":fence", ":queue", ":waiters", ":wake:", ":alive"] {
        call.key(format!("{lock}{k}"));
    }
    for a in args {
        call.arg(*a);
    }
    call.invoke(&mut redis.conn()).unwrap()
}

/// A replaced waiter hears at once, not at its next look (a third of a
/// minute here): its wake-up list is pushed to, and the word waits for it
/// in the waiters' hash. Nothing of it stays behind without an expiry.
#[test]
fn a_replaced_waiter_hears_at_once() {
    let redis = Redis::start();
    let url = redis.url();
    let scratch = Scratch::new();
    let mut holder = hold(Some(&url), "sup", "60s", &scratch);
    scratch.pid_in("pid");
    let old = on(&url)
        .args([
            "--ttl",
            "60s",
            "--supersede",
            "--label",
            "first",
            "sup",
            "true",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn();
    wait_queued(&url, "sup", 1);
    // Let it block on its wake-up list.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let new = on(&url)
        .args([
            "--ttl",
            "60s",
            "--supersede",
            "--label",
            "second",
            "sup",
            "true",
        ])
        .spawn();
    let (code, err) = exited(old, Duration::from_secs(30));
    assert_eq!(code, Some(75), "{err}");
    assert!(
        err.contains("replaced") && err.contains("(second)"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "heard after {:?}",
        started.elapsed()
    );
    let st = status_json(&url, "sup");
    assert_eq!(
        (st["waiters"].as_u64(), st["superseding"].as_u64()),
        (Some(1), Some(1)),
        "{st}"
    );
    // Its word was read once and removed; every key expires.
    let waiters: Vec<String> = redis.cmd(&["HKEYS", "lockrun:{sup}:waiters"]);
    assert!(!waiters.iter().any(|f| f.starts_with("~r:")), "{waiters:?}");
    let bad = redis.keys_without_expiry(&mut redis.conn(), "lockrun:*");
    assert!(bad.is_empty(), "no expiry on {bad:?}");
    signal(holder.id() as i32, libc::SIGTERM);
    wait_child(&mut holder, Duration::from_secs(20));
    let mut new = new;
    assert_eq!(
        wait_child(&mut new, Duration::from_secs(30)).code(),
        Some(0)
    );
}

/// A preemption is kept beside the lease, not in it: the holder's record
/// is unchanged, so an older lockrun's status reads it as before and its
/// renewal renews (it ignores the mark). The mark lives as long as the
/// lease it marks and goes with its release.
#[test]
fn a_preemption_mark_lives_beside_the_lease() {
    let redis = Redis::start();
    let url = redis.url();
    let scratch = Scratch::new();
    // Renewed every 10 s: the mark is read at leisure before then.
    let holder = on(&url)
        .args(["--ttl", "30s", "--label", "old", "pre", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stderr(std::process::Stdio::piped())
        .spawn();
    scratch.pid_in("pid");
    let fields: Vec<String> = redis.cmd(&["HGETALL", "lockrun:{pre}"]);
    let (field, record) = (fields[0].clone(), fields[1].clone());
    let new = on(&url)
        .args(["--preempt", "--label", "new", "pre", "true"])
        .spawn();
    wait_queued(&url, "pre", 1);
    let st = status_json(&url, "pre");
    let shown = st.to_string();
    assert!(
        shown.contains("(new)") && shown.contains("preempted_by"),
        "{st}"
    );
    // The record is as before: same field, same value.
    let now: Vec<String> = redis.cmd(&["HGETALL", "lockrun:{pre}"]);
    assert_eq!(
        now,
        vec![field.clone(), record],
        "the holder's record changed"
    );
    let pttl: i64 = redis.cmd(&["PTTL", "lockrun:{pre}:preempt"]);
    let lease: i64 = redis.cmd(&["PTTL", "lockrun:{pre}"]);
    assert!(
        pttl > 0 && pttl >= lease - 50,
        "mark {pttl} ms, lease {lease} ms"
    );
    // An older lockrun: its status shows the holder with its own label.
    let old: Vec<Value> = old_script(&redis, OLD_INSPECT, "pre", &[]);
    assert_eq!(old.len(), 2 + 8, "{old:?}");
    match &old[2] {
        Value::BulkString(b) => assert!(String::from_utf8_lossy(b).ends_with(" (old)"), "{old:?}"),
        other => panic!("{other:?}"),
    }
    // Its renewal of a marked lease renews, as it always did.
    let owner = field.strip_prefix("h:").unwrap();
    let renewed: i64 = old_script(&redis, OLD_RENEW, "pre", &[owner, "30000"]);
    assert_eq!(renewed, 1);
    // This lockrun stops its job at its next renewal (76), releases, and
    // the mark goes with the lease.
    let (code, err) = exited(holder, Duration::from_secs(40));
    assert_eq!(code, Some(76), "{err}");
    assert!(
        err.contains("preempted by") && err.contains("(new)"),
        "{err}"
    );
    let mut new = new;
    assert_eq!(
        wait_child(&mut new, Duration::from_secs(30)).code(),
        Some(0)
    );
    let left: Vec<String> = redis.keys();
    assert!(
        !left.iter().any(|k| k.ends_with(":preempt")),
        "the mark stayed: {left:?}"
    );
}

/// `--preempt` ends a `--min-hold` window at once (no job runs in it), and a
/// preempted holder keeps no window: the preempting request runs as soon as
/// the old job is dead.
#[test]
fn preempt_ends_min_hold_windows_and_keeps_none() {
    let redis = Redis::start();
    let url = redis.url();
    on(&url).args(["--min-hold", "60s", "win", "true"]).code(0);
    on(&url).args(["-n", "win", "true"]).code(75);
    let started = Instant::now();
    on(&url)
        .args(["--preempt", "-w", "10s", "win", "true"])
        .code(0);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let scratch = Scratch::new();
    let holder = on(&url)
        .args(["--ttl", "3s", "--min-hold", "60s", "kept", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stderr(std::process::Stdio::piped())
        .spawn();
    scratch.pid_in("pid");
    on(&url)
        .args(["--preempt", "-w", "20s", "kept", "true"])
        .code(0);
    let (code, err) = exited(holder, Duration::from_secs(20));
    assert_eq!(code, Some(76), "{err}");
    assert_eq!(status_json(&url, "kept")["held"], false);
}

/// Every group word works with exactly the commands lockrun-engines(7)
/// grants lockrun's Redis user.
#[test]
fn the_group_words_need_only_the_documented_acl() {
    let redis = Redis::start();
    let rules = crate::docs::documented_redis_acl();
    let mut args = vec!["ACL", "SETUSER", "locker", "reset", "on", ">grp-pw"];
    args.extend(rules.split_whitespace());
    let _: () = redis.cmd(&args);
    let url = format!("redis://locker:grp-pw@127.0.0.1:{}", redis.port);
    let scratch = Scratch::new();
    let holder = on(&url)
        .args(["--ttl", "3s", "--label", "old", "acl", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stderr(std::process::Stdio::piped())
        .spawn();
    scratch.pid_in("pid");
    let first = on(&url)
        .args(["--supersede", "--max-waiters", "1", "acl", "true"])
        .stderr(std::process::Stdio::piped())
        .spawn();
    wait_queued(&url, "acl", 1);
    on(&url)
        .args(["--max-waiters", "1", "acl", "true"])
        .code(75);
    let second = on(&url)
        .args([
            "--supersede",
            "--max-waiters",
            "1",
            "--preempt",
            "acl",
            "true",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn();
    let (code, err) = exited(first, Duration::from_secs(20));
    assert_eq!(code, Some(75), "{err}");
    assert!(err.contains("replaced"), "{err}");
    let (code, err) = exited(holder, Duration::from_secs(20));
    assert_eq!(code, Some(76), "{err}");
    assert!(err.contains("preempted by"), "{err}");
    let (code, err) = exited(second, Duration::from_secs(20));
    assert_eq!(code, Some(0), "{err}");
    let st = status_json(&url, "acl");
    assert_eq!(
        (st["held"].as_bool(), st["waiters"].as_u64()),
        (Some(false), Some(0)),
        "{st}"
    );
}

const ACQUIRE: &str = include_str!("../../src/backend/redis/scripts/acquire.lua");

/// One call of the acquire script on `name`, as lockrun makes it, for a
/// waiter `id` (an `s` first for `--supersede`) shown as `label`.
struct Call<'a> {
    id: &'a str,
    label: &'a str,
    place: Option<i64>,
    keep_only: bool,
    max_waiters: Option<u32>,
    preempt: bool,
}

impl Call<'_> {
    fn new(id: &str) -> Call<'_> {
        Call {
            id,
            label: id,
            place: None,
            keep_only: false,
            max_waiters: None,
            preempt: false,
        }
    }

    fn run(&self, c: &mut redis::Connection, name: &str) -> Vec<Value> {
        let lock = format!("lockrun:{{{name}}}");
        let script = redis::Script::new(&format!("{PRELUDE}{ACQUIRE}"));
        let mut call = script.prepare_invoke();
        for k in [
            "", ":fence", ":queue", ":waiters", ":wake:", ":alive", ":preempt",
        ] {
            call.key(format!("{lock}{k}"));
        }
        // The owner value: hex, one per waiter.
        let owner: String = self.id.bytes().map(|b| format!("{b:02x}")).collect();
        call.arg(owner)
            .arg(self.label)
            .arg(30000)
            .arg("x")
            .arg(1)
            .arg("1")
            .arg(self.id)
            .arg(10000)
            .arg("")
            .arg(if self.keep_only { "1" } else { "0" })
            .arg(self.place.map(|p| p.to_string()).unwrap_or_default())
            .arg(self.max_waiters.map(|n| n.to_string()).unwrap_or_default())
            .arg(if self.id.starts_with('s') { "1" } else { "0" })
            .arg(if self.preempt { "1" } else { "0" })
            .invoke(c)
            .unwrap()
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
        other => panic!("not text: {other:?}"),
    }
}

/// The name held by someone else for a minute.
fn held(c: &mut redis::Connection, name: &str) {
    held_as(c, name, "h:ffff");
}

/// The name held for a minute under `field` (`m:…`: a `--min-hold` window).
fn held_as(c: &mut redis::Connection, name: &str, field: &str) {
    let t: Vec<u64> = redis::cmd("TIME").query(c).unwrap();
    let now = t[0] * 1000 + t[1] / 1000;
    let lock = format!("lockrun:{{{name}}}");
    let value = format!("100|{}|x|1|-1|{now}|host:1 (holder)", now + 60_000);
    redis::cmd("HSET")
        .arg(&lock)
        .arg(field)
        .arg(value)
        .exec(c)
        .unwrap();
    redis::cmd("PEXPIREAT")
        .arg(&lock)
        .arg(now + 60_000)
        .exec(c)
        .unwrap();
}

/// A replaced waiter hears it on its next call, whichever way that call
/// comes (woken, or only keeping its place), once; and when the word was
/// lost, coming back at its arrival number behind a newer `--supersede`
/// waiter still ends it.
#[test]
fn a_replaced_waiter_hears_on_its_next_call_even_without_its_wake_up() {
    let redis = Redis::start();
    let mut c = redis.conn();
    held(&mut c, "r");
    let a = Call::new("sa").run(&mut c, "r");
    assert_eq!(int(&a[0]), 2, "{a:?}");
    let b = Call::new("sb").run(&mut c, "r");
    assert_eq!(int(&b[0]), 2, "{b:?}");
    let wake: Vec<String> = redis.cmd(&["LRANGE", "lockrun:{r}:wake:sa", "0", "-1"]);
    assert_eq!(wake, ["replaced"]);
    let again = Call {
        keep_only: true,
        place: Some(int(&a[3])),
        ..Call::new("sa")
    };
    let r = again.run(&mut c, "r");
    assert_eq!((int(&r[0]), text(&r[1])), (5, "sb".to_string()), "{r:?}");
    let queue: Vec<String> = redis.cmd(&["ZRANGE", "lockrun:{r}:queue", "0", "-1"]);
    assert_eq!(queue, ["sb"]);
    let left: Vec<String> = redis.cmd(&["HKEYS", "lockrun:{r}:waiters"]);
    assert!(!left.iter().any(|f| f.starts_with("~r:")), "{left:?}");

    // The word lost (an older lockrun's script shortened the hash's life):
    // back at its arrival number, it is still the older one.
    let c1 = Call::new("sc").run(&mut c, "r");
    let _: i64 = redis.cmd(&["HDEL", "lockrun:{r}:waiters", "~r:sb"]);
    let back = Call {
        place: Some(int(&b[3])),
        ..Call::new("sb")
    };
    let r = back.run(&mut c, "r");
    assert_eq!(
        (int(&r[0]), text(&r[1])),
        (5, "sc".to_string()),
        "{r:?} after {c1:?}"
    );
    let queue: Vec<String> = redis.cmd(&["ZRANGE", "lockrun:{r}:queue", "0", "-1"]);
    assert_eq!(queue, ["sc"]);
    let bad = redis.keys_without_expiry(&mut c, "lockrun:*");
    assert!(bad.is_empty(), "no expiry on {bad:?}");
}

/// `--max-waiters` counts after `--supersede`, and a request it refuses
/// changes nothing: the waiters it would have replaced stay.
#[test]
fn max_waiters_counts_after_supersede_and_a_refusal_leaves_no_trace() {
    let redis = Redis::start();
    let mut c = redis.conn();
    held(&mut c, "m");
    assert_eq!(int(&Call::new("plain").run(&mut c, "m")[0]), 2);
    assert_eq!(int(&Call::new("sold").run(&mut c, "m")[0]), 2);
    // Two wait; one of them would be replaced: one counts.
    let r = Call {
        max_waiters: Some(1),
        ..Call::new("snew")
    }
    .run(&mut c, "m");
    assert_eq!((int(&r[0]), int(&r[1])), (6, 1), "{r:?}");
    let queue: Vec<String> = redis.cmd(&["ZRANGE", "lockrun:{m}:queue", "0", "-1"]);
    assert_eq!(queue, ["plain", "sold"], "the refusal changed the queue");
    let r = Call {
        max_waiters: Some(2),
        ..Call::new("snew")
    }
    .run(&mut c, "m");
    assert_eq!(int(&r[0]), 2, "{r:?}");
    let queue: Vec<String> = redis.cmd(&["ZRANGE", "lockrun:{m}:queue", "0", "-1"]);
    assert_eq!(queue, ["plain", "snew"]);
    // A plain request is never refused while the name can be granted.
    let _: i64 = redis.cmd(&[
        "DEL",
        "lockrun:{m}",
        "lockrun:{m}:queue",
        "lockrun:{m}:alive",
    ]);
    let r = Call {
        max_waiters: Some(1),
        ..Call::new("free")
    }
    .run(&mut c, "m");
    assert_eq!(int(&r[0]), 1, "{r:?}");
}

/// `--preempt` marks the holders it finds, not a waiter that came before it
/// and is served as the window it ends goes.
#[test]
fn preempt_marks_the_holders_it_finds_and_no_one_served_after() {
    let redis = Redis::start();
    let mut c = redis.conn();
    held_as(&mut c, "p", "m:100");
    assert_eq!(int(&Call::new("first").run(&mut c, "p")[0]), 2);
    let r = Call {
        preempt: true,
        ..Call::new("pre")
    }
    .run(&mut c, "p");
    assert_eq!(int(&r[0]), 2, "{r:?}");
    let fields: Vec<String> = redis.cmd(&["HKEYS", "lockrun:{p}"]);
    assert_eq!(fields.len(), 1, "{fields:?}");
    assert!(fields[0].starts_with("h:"), "the window stayed: {fields:?}");
    let marks: Vec<String> = redis.cmd(&["HGETALL", "lockrun:{p}:preempt"]);
    assert!(marks.is_empty(), "the waiter served was marked: {marks:?}");

    held(&mut c, "q");
    let r = Call {
        preempt: true,
        ..Call::new("pre")
    }
    .run(&mut c, "q");
    assert_eq!(int(&r[0]), 2, "{r:?}");
    let marks: Vec<String> = redis.cmd(&["HGETALL", "lockrun:{q}:preempt"]);
    assert_eq!(marks, ["100", "pre"]);
    let (mark, lease): (i64, i64) = (
        redis.cmd(&["PTTL", "lockrun:{q}:preempt"]),
        redis.cmd(&["PTTL", "lockrun:{q}"]),
    );
    assert!(
        mark > 0 && mark >= lease - 50,
        "mark {mark} ms, lease {lease} ms"
    );
}
