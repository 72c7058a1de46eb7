//! The Lua scripts that change a name's state, each loaded with the
//! prelude they share, and the keys they are run on. What each returns is
//! read in `reply.rs`.

use std::sync::LazyLock;

use redis::Script;

/// Shared by every script. A name's state is one hash of holders, each
/// field `h:<owner>` (or `r:<token>` once revoked, `m:<token>` once its job
/// ended with `--min-hold` still running) with the value
/// `token|expires ms|mode|limit|slot|granted ms|label`, a waiter queue (a
/// sorted set of waiter ids by arrival, details in a hash) and one wake-up
/// list per waiter; a second sorted set holds until when each waiter
/// keeps its place. Times are the server's `TIME`; expired holders and dead
/// waiters are purged by whichever script looks first. The waiters' hash
/// also holds `~gather`, until when the queue regathers after every place
/// in it lapsed at once (no grant from the queue until then), and
/// `~r:<waiter id>`, the request (`host:pid (label)`) that replaced that
/// waiter by `--supersede`, until the waiter reads it. A waiter that asked
/// for `--supersede` has an id that starts with `s` (others are hex). A
/// last hash, by token, names the request that asked each holder to stop
/// (`--preempt`); it lives as long as the longest lease it marks. The
/// holder's record is left as it was: an older lockrun reads it unchanged.
/// KEYS: lock, fence, queue, waiters, wake-up prefix, waiters' liveness,
/// preemptions.
const PRELUDE: &str = include_str!("scripts/prelude.lua");

/// ARGV: owner, label, ttl ms, mode (x s n), limit, queue ('1' wait, '0' -n),
/// waiter id, waiter lifetime ms, the `host:pid` of an outer lockrun holding
/// this name ('' when not run from inside one), '1' when a queued waiter
/// only comes to keep its place (nothing woke it), the waiter's arrival
/// number once it has one ('' before), `--max-waiters` ('' none),
/// `--supersede` ('1'), `--preempt` ('1') (the last three may be absent).
/// {1, token, slot} granted (idempotent for our owner value: a retried
/// acquire, or the confirmation of a grant handed over in the queue, gets a
/// full ttl); {0, holder, in the way} busy; {2, holder, ms until a holder
/// ends or the queue stops regathering, arrival number, in the way} queued
/// (a waiter only keeping its place hears no holder, no number and no one
/// in the way). In the way: who keeps the request waiting, as the
/// admission table names it, once the queue was served: `w:<waiter id>`
/// for the first waiter still queued ahead, else the holder's field; read
/// by the test that holds this script to the table;
/// {3, mode, limit} the holders disagree with this request; {4} the outer
/// lockrun holds it (waiting would deadlock); {5, by} replaced by a newer
/// `--supersede` request (out of the queue); {6, waiting} not queued
/// (`--max-waiters`: this many wait already).
const ACQUIRE: &str = include_str!("scripts/acquire.lua");

/// ARGV: owner, ttl ms. {1} renewed, {0} not ours, {2, by} renewed but
/// asked to stop by the `--preempt` request `by`.
const RENEW: &str = include_str!("scripts/renew.lua");

/// ARGV: owner, waiter id, min-hold ms ('0': none). Gives up a lease (or a
/// place in the queue, with any grant handed over meanwhile) and serves the
/// queue in the same call: the next holder's grant is made here, one round
/// trip for the hand-off. Within the min-hold window of its grant, the
/// lease becomes a place kept by no one until the window ends, and the
/// head of the queue is told to look again (not for a lease a `--preempt`
/// request asked to stop). 1 released, 0 not ours.
const RELEASE: &str = include_str!("scripts/release.lua");

/// Never returns an owner value. {now ms, waiters, of them superseding,
/// rows…}, each holder as nine fields: label, token, slot, mode, limit, ms
/// left, ms held, kind (0 a holder, 1 revoked, 2 kept by `--min-hold`),
/// the `--preempt` request that asked it to stop ('' none).
const INSPECT: &str = include_str!("scripts/inspect.lua");

/// ARGV: token ('' = every holder), now ('1'/'0').
/// {0} nothing held, {2, tokens…} no holder has that token, {3} already
/// revoked, {1, rows…} as INSPECT's rows for the holders broken.
/// Without `now`, a holder's owner value is replaced: its next renewal fails
/// and new grants still wait for the old expiry. With `now`, the holder goes
/// and the queue is served at once; so does a place kept by `--min-hold`
/// without it (no job runs under it).
const FORCE: &str = include_str!("scripts/force.lua");

// Each script's SHA1 is computed once, on first use.
fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}{body}"))
}
pub static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(ACQUIRE));
pub static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RENEW));
pub static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(RELEASE));
pub static INSPECT_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(INSPECT));
pub static FORCE_SCRIPT: LazyLock<Script> = LazyLock::new(|| script(FORCE));

/// Every key of one name, all under one hash tag (one Cluster slot).
#[derive(Clone, Default)]
pub struct Keys {
    pub lock: String,
    fence: String,
    queue: String,
    waiters: String,
    pub wake: String,
    alive: String,
    preempt: String,
}

impl Keys {
    pub fn new(prefix: &str, name: &str) -> Keys {
        let lock = format!("{prefix}{{{name}}}");
        Keys {
            fence: format!("{lock}:fence"),
            queue: format!("{lock}:queue"),
            waiters: format!("{lock}:waiters"),
            wake: format!("{lock}:wake:"),
            alive: format!("{lock}:alive"),
            preempt: format!("{lock}:preempt"),
            lock,
        }
    }

    pub fn on<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        let mut inv = script.prepare_invoke();
        inv.key(&self.lock)
            .key(&self.fence)
            .key(&self.queue)
            .key(&self.waiters)
            .key(&self.wake)
            .key(&self.alive)
            .key(&self.preempt);
        inv
    }
}
