//! lockrun's tables in one schema, and every statement it sends: the
//! tables are created on first use, every time is the server's
//! `clock_timestamp()`, and a name's decisions are taken one at a time
//! under a transaction-scoped advisory lock (lockrun-engines(7) "POSTGRESQL").

use std::time::Duration;

use crate::backend::table::{KEPT, REPLACED, SUPERSEDE};

/// True of a label column that holds no preemption mark (NULL neither).
const UNMARKED: &str = "coalesce(strpos(label, chr(31)), 0) = 0";

/// Milliseconds from `from` to `to`, whatever a hand-written row holds:
/// an infinite time cannot be subtracted (the server refuses), so each
/// side is read as seconds and the difference bounded by ±10¹² s (NULL
/// stays NULL).
fn ms_between(from: &str, to: &str) -> String {
    format!(
        "(least(greatest(extract(epoch FROM {to}) - extract(epoch FROM {from}), \
           -1000000000000), 1000000000000) * 1000)::bigint"
    )
}

/// A holder's columns, as `holder_of` reads them: never the owner
/// value, only whether the row is a kept window.
fn holder_columns() -> String {
    format!(
        "slot, label, token, mode, lim, revoked, {left} AS left_ms, {age} AS age_ms, \
         (owner = '{KEPT}' AND NOT revoked) AS kept",
        left = ms_between("clock_timestamp()", "expires_at"),
        age = ms_between("granted_at", "clock_timestamp()"),
    )
}

/// The start of every transaction of lockrun's, and the settings it runs
/// under whatever the role's or database's defaults: READ COMMITTED, each
/// statement and each lock wait bounded by `op` on the server too, and a
/// client that stops in the middle holding nothing up for long. `doctor`
/// runs its checks under the same, so that its verdict is a run's.
pub fn bounded(op: Duration) -> String {
    let ms = op.as_millis().max(1);
    format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = {ms}; \
         SET LOCAL lock_timeout = {ms}; SET LOCAL idle_in_transaction_session_timeout = {}",
        ms * 2
    )
}

/// The objects of one schema (the `--prefix`).
#[derive(Debug, Clone)]
pub struct Tables {
    pub schema: String,
    pub leases: String,
    pub waiters: String,
    pub tokens: String,
}

/// FNV-1a, 64 bits: the same on every host, so every lockrun of a name
/// takes the same advisory lock and listens on the same channel.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Tables {
    pub fn new(schema: &str) -> Tables {
        Tables {
            schema: schema.to_string(),
            leases: format!("{schema}.lockrun_leases"),
            waiters: format!("{schema}.lockrun_waiters"),
            tokens: format!("{schema}.lockrun_tokens"),
        }
    }

    /// Create what is missing. Two lockruns creating at once would trip
    /// over each other's catalog rows: the creation is serialized too.
    pub fn create(&self) -> String {
        let (s, l, w, t) = (&self.schema, &self.leases, &self.waiters, &self.tokens);
        let key = fnv(&format!("{s} tables")) as i64;
        format!(
            "BEGIN; SELECT pg_advisory_xact_lock({key}); \
             CREATE SCHEMA IF NOT EXISTS {s}; \
             CREATE SEQUENCE IF NOT EXISTS {t} AS bigint CACHE 1; \
             CREATE TABLE IF NOT EXISTS {l} ( \
               name text NOT NULL, slot integer NOT NULL, owner text NOT NULL, \
               label text NOT NULL, token bigint NOT NULL, mode text NOT NULL, \
               lim integer NOT NULL, expires_at timestamptz NOT NULL, \
               granted_at timestamptz NOT NULL, revoked boolean NOT NULL DEFAULT false, \
               PRIMARY KEY (name, slot)); \
             CREATE TABLE IF NOT EXISTS {w} ( \
               name text NOT NULL, seq bigint GENERATED ALWAYS AS IDENTITY, \
               owner text NOT NULL, label text NOT NULL, mode text NOT NULL, \
               lim integer NOT NULL, expires_at timestamptz NOT NULL, \
               PRIMARY KEY (name, seq)); \
             COMMIT"
        )
    }

    /// Start a name's decision: a transaction bounded on the server too
    /// (a client that stops in the middle must not hold the name's lock),
    /// holding the name's advisory lock until it ends. READ COMMITTED
    /// whatever the server's default: every statement after the lock then
    /// sees every decision taken before it (under REPEATABLE READ the
    /// snapshot would date from before the lock was granted).
    pub fn begin(&self, name: &str, op: Duration) -> String {
        let key = fnv(&format!("{}/{name}", self.schema)) as i64;
        format!("{}; SELECT pg_advisory_xact_lock({key})", bounded(op))
    }

    /// The channel a name's waiters listen on (an identifier of at most 63
    /// bytes, whatever the name).
    pub fn channel(&self, name: &str) -> String {
        format!("lockrun_{:016x}", fnv(&format!("{}/{name}", self.schema)))
    }

    /// Every live row of a name: holders (kind `h`, pos = slot) and
    /// waiters (kind `w`, pos = place in the queue). $1 name.
    pub fn look(&self) -> String {
        format!(
            "SELECT 'h'::text AS kind, slot::bigint AS pos, owner, label, token, mode, lim, \
               {left} AS left_ms, revoked \
             FROM {l} WHERE name = $1 AND expires_at > clock_timestamp() \
             UNION ALL \
             SELECT 'w'::text, seq, owner, label, 0::bigint, mode, lim, {left}, false \
             FROM {w} WHERE name = $1 AND expires_at > clock_timestamp()",
            l = self.leases,
            w = self.waiters,
            left = ms_between("clock_timestamp()", "expires_at"),
        )
    }

    /// Taken just before a grant, until its transaction ends: moving the
    /// token sequence up is one grant at a time across every name, so no
    /// `setval` lands after, and below, a value handed out since.
    pub fn token_lock(&self) -> String {
        let key = fnv(&format!("{} tokens", self.schema)) as i64;
        format!("SELECT pg_advisory_xact_lock({key})")
    }

    /// A grant's token: the sequence's next value, but at least the
    /// server's clock in µs, so a lost sequence (a dropped schema, an
    /// older dump restored) never hands out less than before, and above
    /// every token the name's rows hold. The sequence is moved up to the
    /// clock (when the role may), so a lockrun that only takes `nextval`
    /// follows on; never to a row's token, which may have been written by
    /// hand: one absurd row must not use up the sequence of every name.
    /// $1 name.
    fn token(&self) -> String {
        format!(
            "(SELECT greatest(CASE WHEN v.floor > v.n \
                   AND has_sequence_privilege('{t}', 'UPDATE') \
                 THEN setval('{t}', v.floor) ELSE v.floor END, \
                 least(v.top, 9223372036854775806) + 1) \
               FROM (SELECT n, greatest(n, clock) AS floor, top \
                 FROM (SELECT nextval('{t}') AS n, \
                   floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS clock, \
                   coalesce((SELECT max(token) FROM {l} WHERE name = $1), 0) AS top) s) v)",
            t = self.tokens,
            l = self.leases
        )
    }

    /// The grant: a free slot (or one whose lease has lapsed, or whose
    /// expiry is missing) becomes ours with the next token; our place in
    /// the queue and lapsed places go. After `token_lock`.
    /// $1 name, $2 slot, $3 owner, $4 label, $5 mode, $6 limit, $7 ttl ms.
    pub fn grant(&self) -> String {
        format!(
            "WITH gone AS (DELETE FROM {w} WHERE name = $1 \
               AND (owner IN ($3, '{SUPERSEDE}' || $3) OR NOT expires_at > clock_timestamp() \
                 OR expires_at IS NULL) \
               RETURNING 1) \
             INSERT INTO {l} AS l (name, slot, owner, label, token, mode, lim, expires_at, granted_at) \
             VALUES ($1, $2, $3, $4, {token}, $5, $6, \
               clock_timestamp() + $7 * interval '1 millisecond', clock_timestamp()) \
             ON CONFLICT (name, slot) DO UPDATE SET owner = excluded.owner, \
               label = excluded.label, token = excluded.token, mode = excluded.mode, \
               lim = excluded.lim, expires_at = excluded.expires_at, \
               granted_at = excluded.granted_at, revoked = false \
             WHERE l.expires_at <= clock_timestamp() OR l.expires_at IS NULL \
             RETURNING token",
            l = self.leases,
            w = self.waiters,
            token = self.token()
        )
    }

    /// Our lease, kept for a full ttl from now while it is still ours:
    /// the renewal, and a retried grant whose reply was lost. Its label
    /// comes back: it says whether a `--preempt` request marked it.
    /// $1 name, $2 slot, $3 owner, $4 ttl ms.
    pub fn renew(&self) -> String {
        format!(
            "UPDATE {} SET expires_at = clock_timestamp() + $4 * interval '1 millisecond' \
             WHERE name = $1 AND slot = $2 AND owner = $3 AND NOT revoked \
               AND expires_at > clock_timestamp() \
             RETURNING token, label",
            self.leases
        )
    }

    /// Queue up. $1 name, $2 owner (with `SUPERSEDE` before it for a
    /// `--supersede` request), $3 label, $4 mode, $5 limit, $6 ms.
    pub fn enqueue(&self) -> String {
        format!(
            "INSERT INTO {} (name, owner, label, mode, lim, expires_at) \
             VALUES ($1, $2, $3, $4, $5, clock_timestamp() + $6 * interval '1 millisecond') \
             RETURNING seq",
            self.waiters
        )
    }

    /// Keep our place (not once replaced). $1 name, $2 seq, $3 owner, $4 ms.
    pub fn keep_place(&self) -> String {
        format!(
            "UPDATE {} SET expires_at = clock_timestamp() + $4 * interval '1 millisecond' \
             WHERE name = $1 AND seq = $2 AND owner IN ($3, '{SUPERSEDE}' || $3) \
               AND expires_at > clock_timestamp() \
             RETURNING seq",
            self.waiters
        )
    }

    /// Keep a place far back in the queue, without the name's lock, and
    /// count the live places before it: no row when it was not there to
    /// keep. $1 name, $2 seq, $3 owner, $4 ms.
    pub fn keep_far(&self) -> String {
        format!(
            "WITH kept AS ({}) \
             SELECT count(w.seq) FROM kept LEFT JOIN {} w \
               ON w.name = $1 AND w.seq < kept.seq AND w.expires_at > clock_timestamp() \
             GROUP BY kept.seq",
            self.keep_place(),
            self.waiters
        )
    }

    /// As `keep_far` for a place kept lately: only see that it is still
    /// live, and count. $1 name, $2 seq, $3 owner.
    pub fn count_far(&self) -> String {
        format!(
            "SELECT count(w.seq) FROM {0} ours LEFT JOIN {0} w \
               ON w.name = $1 AND w.seq < ours.seq AND w.expires_at > clock_timestamp() \
             WHERE ours.name = $1 AND ours.seq = $2 AND ours.owner IN ($3, '{SUPERSEDE}' || $3) \
               AND ours.expires_at > clock_timestamp() \
             GROUP BY ours.seq",
            self.waiters
        )
    }

    /// Leave the queue: our place, or the mark of its replacement.
    /// $1 name, $2 owner.
    pub fn dequeue(&self) -> String {
        format!(
            "DELETE FROM {} WHERE name = $1 AND owner IN ($2, '{SUPERSEDE}' || $2, \
               '{REPLACED}' || $2, '{REPLACED}{SUPERSEDE}' || $2)",
            self.waiters
        )
    }

    /// Give up every grant of ours on the name, with no `--min-hold`
    /// window: no job ran under it (a signal ends the waiter that got it).
    /// $1 name, $2 owner.
    pub fn forsake(&self) -> String {
        format!("DELETE FROM {} WHERE name = $1 AND owner = $2", self.leases)
    }

    /// `--supersede` joining the queue: every live place that asked for it
    /// too is marked replaced by $2 (our label), and kept at least $3 ms
    /// more so its waiter, woken, reads the mark. $1 name.
    pub fn replace(&self) -> String {
        format!(
            "UPDATE {} SET owner = '{REPLACED}' || owner, label = $2, \
               expires_at = greatest(expires_at, clock_timestamp() + $3 * interval '1 millisecond') \
             WHERE name = $1 AND owner LIKE '{SUPERSEDE}%' AND expires_at > clock_timestamp() \
             RETURNING seq",
            self.waiters
        )
    }

    /// `--preempt` finding the name held: every live holder that runs a
    /// job (not revoked, not a `--min-hold` window, not ours) and is not
    /// marked yet is marked with $2 (`PREEMPTED` and our label); its owner
    /// stays. $1 name, $3 owner.
    pub fn preempt(&self) -> String {
        format!(
            "UPDATE {} SET label = label || $2 \
             WHERE name = $1 AND expires_at > clock_timestamp() AND NOT revoked \
               AND owner NOT IN ('{KEPT}', $3) AND {UNMARKED} \
             RETURNING slot",
            self.leases
        )
    }

    /// `--preempt` finding `--min-hold` windows, which run no job: they
    /// end at once, as `release --force` ends them. $1 name.
    pub fn end_windows(&self) -> String {
        format!(
            "DELETE FROM {} WHERE name = $1 AND owner = '{KEPT}' AND NOT revoked \
               AND expires_at > clock_timestamp() \
             RETURNING slot",
            self.leases
        )
    }

    /// Give our lease back and wake the name's waiters. With a
    /// `--min-hold` window still open on the server's clock, the row stays,
    /// owned by no one (`KEPT`), until the grant plus the window; else it
    /// goes (at once when a `--preempt` request marked it). One instant decides both sides, so exactly one of them acts.
    /// $1 name, $2 slot, $3 owner, $4 channel, $5 window in µs (0: none).
    pub fn release(&self) -> String {
        format!(
            "WITH now AS (SELECT clock_timestamp() AS t), \
             kept AS (UPDATE {l} AS l SET owner = '{KEPT}', \
                 expires_at = l.granted_at + $5 * interval '1 microsecond' \
               FROM now WHERE l.name = $1 AND l.slot = $2 AND l.owner = $3 \
                 AND l.expires_at > now.t AND l.granted_at + $5 * interval '1 microsecond' > now.t \
                 AND {UNMARKED} \
               RETURNING 1), \
             gone AS (DELETE FROM {l} AS l USING now \
               WHERE l.name = $1 AND l.slot = $2 AND l.owner = $3 \
                 AND NOT (l.expires_at > now.t \
                   AND l.granted_at + $5 * interval '1 microsecond' > now.t AND {UNMARKED}) \
               RETURNING 1) \
             SELECT (SELECT count(*) FROM kept) + (SELECT count(*) FROM gone) AS n, \
               (SELECT count(*) FROM kept) AS kept, pg_notify($4, {head})::text AS woken",
            l = self.leases,
            head = self.head("$1"),
        )
    }

    /// Wake the name's waiters. $1 channel.
    pub fn notify(&self) -> &'static str {
        "SELECT pg_notify($1, '')::text"
    }

    /// Wake the waiters at the front of the name's queue: the payload is
    /// the place of its head, and a waiter further back than it would wake
    /// for sleeps on (`plan::woken`). $1 channel, $2 name.
    pub fn notify_front(&self) -> String {
        format!("SELECT pg_notify($1, {})::text", self.head("$2"))
    }

    /// The place of the head of the queue of the name in `name` (a
    /// parameter), as text; '' when no one waits.
    fn head(&self, name: &str) -> String {
        format!(
            "coalesce((SELECT min(seq) FROM {} WHERE name = {name} \
               AND expires_at > clock_timestamp() AND owner NOT LIKE '{REPLACED}%')::text, '')",
            self.waiters
        )
    }

    /// The holders for `status` and `release --force`. $1 name.
    pub fn holders(&self) -> String {
        format!(
            "SELECT {} FROM {} WHERE name = $1 AND expires_at > clock_timestamp() \
             ORDER BY token",
            holder_columns(),
            self.leases
        )
    }

    /// Every name the tables have a trace of, in byte order (as every
    /// engine sorts), at most $1 of them, each with its live holders (one
    /// row each, or one row of NULLs for a free name) and its number of
    /// live places in the queue (and of those, the `--supersede` ones):
    /// one statement, so one snapshot.
    pub fn list(&self) -> String {
        format!(
            "WITH n AS (SELECT name FROM (SELECT name FROM {l} UNION SELECT name FROM {w}) a \
               ORDER BY name COLLATE \"C\" LIMIT $1) \
             SELECT n.name, {c}, w.waiting, w.superseding \
             FROM n CROSS JOIN LATERAL ({counts} w.name = n.name) w \
             LEFT JOIN {l} AS h ON h.name = n.name AND h.expires_at > clock_timestamp() \
             ORDER BY n.name COLLATE \"C\", token",
            c = holder_columns(),
            counts = self.counts(),
            l = self.leases,
            w = self.waiters
        )
    }

    /// How many wait, and how many of them asked for `--supersede`: the
    /// live places, not the marks of replaced ones. The condition on the
    /// name comes last.
    fn counts(&self) -> String {
        format!(
            "SELECT count(*) FILTER (WHERE coalesce(owner, '') NOT LIKE '{REPLACED}%') \
               AS waiting, \
               count(*) FILTER (WHERE owner LIKE '{SUPERSEDE}%') AS superseding \
             FROM {} w WHERE w.expires_at > clock_timestamp() AND",
            self.waiters
        )
    }

    /// How many wait, and how many of them asked for `--supersede`. $1 name.
    pub fn waiting(&self) -> String {
        format!("{} w.name = $1", self.counts())
    }

    /// Revoke a holder: no one owns it any more, and it stays until it
    /// would have ended. $1 name, $2 token.
    pub fn revoke(&self) -> String {
        format!(
            "UPDATE {} SET owner = '', revoked = true \
             WHERE name = $1 AND token = $2 AND NOT revoked AND expires_at > clock_timestamp() \
             RETURNING token",
            self.leases
        )
    }

    /// Delete a holder outright. $1 name, $2 token.
    pub fn delete(&self) -> String {
        format!(
            "DELETE FROM {} WHERE name = $1 AND token = $2 AND expires_at > clock_timestamp() \
             RETURNING token",
            self.leases
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_their_own_lock_and_channel() {
        let t = Tables::new("lockrun");
        assert_ne!(t.channel("a"), t.channel("b"));
        assert_eq!(t.channel("a"), Tables::new("lockrun").channel("a"));
        assert_ne!(t.channel("a"), Tables::new("other").channel("a"));
        assert!(t.channel(&"x".repeat(1024)).len() <= 63);
        let begin = t.begin("a", Duration::from_secs(2));
        assert!(begin.contains("= 2000;"), "{begin}");
        assert!(
            begin.starts_with("BEGIN ISOLATION LEVEL READ COMMITTED;"),
            "{begin}"
        );
    }
}
