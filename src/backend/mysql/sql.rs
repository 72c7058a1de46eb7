//! lockrun's tables in the URL's database, and every statement it sends:
//! the tables are created on first use, every time is the server's
//! `UTC_TIMESTAMP(6)`, and a name's decisions are taken one at a time
//! under a row lock on the name's counter (lockrun-engines(7) "MYSQL AND
//! MARIADB"). Every value is written as a hexadecimal literal into the
//! statement's text: one round trip for a whole transaction, no prepared
//! statement, and no quoting rule that a server setting could change.

use std::time::Duration;

use crate::backend::table::{KEPT, REPLACED, SUPERSEDE};

/// True of a label column that holds no preemption mark.
const UNMARKED: &str = "LOCATE(X'1f', label) = 0";

/// The server's clock, in UTC whatever the session's time zone.
pub const NOW: &str = "UTC_TIMESTAMP(6)";

/// A text as a literal no server setting reads otherwise.
pub fn lit(s: &str) -> String {
    let mut out = String::with_capacity(3 + 2 * s.len());
    out.push_str("X'");
    for b in s.bytes() {
        out.push_str(&format!("{b:02x}"));
    }
    out.push('\'');
    out
}

/// Now plus `ms` milliseconds, on the server's clock.
fn after_ms(ms: i64) -> String {
    format!(
        "{NOW} + INTERVAL {} MICROSECOND",
        ms.max(0).saturating_mul(1000)
    )
}

/// Milliseconds from the server's now to `col` (negative once past).
fn left_ms(col: &str) -> String {
    format!("CAST(TIMESTAMPDIFF(MICROSECOND, {NOW}, {col}) DIV 1000 AS SIGNED)")
}

/// A holder's columns, as `holder_of` reads them: never the owner value.
fn holder_columns(t: &str) -> String {
    format!(
        "{t}.slot, {t}.label, {t}.token, {t}.mode, {t}.lim, {t}.revoked, {left} AS left_ms, \
         CAST(TIMESTAMPDIFF(MICROSECOND, {t}.granted_at, {NOW}) DIV 1000 AS SIGNED) AS age_ms, \
         ({t}.owner = {kept} AND NOT {t}.revoked) AS kept",
        left = left_ms(&format!("{t}.expires_at")),
        kept = lit(KEPT),
    )
}

/// The session's own idle limit back, set aside by `Tables::begin`.
pub const UNBOUND: &str = "SET SESSION wait_timeout = @lockrun_wait_timeout";

/// The GET_LOCK name of an owner's place (`w`) or lease (`h`): a waiter
/// blocks on the one ahead of it, so a release or a grant wakes it.
pub fn wake_key(kind: char, owner_col: &str) -> String {
    format!("CONCAT('lockrun:{kind}:', SHA1({owner_col}))")
}

/// A waiters-table row's connection still holds the row's wake-up lock.
fn still_waiting(wake: bool) -> String {
    if wake {
        format!("IS_USED_LOCK({}) = conn", wake_key('w', "owner"))
    } else {
        "FALSE".into()
    }
}

/// A waiters-table row (columns prefixed `t`) whose waiter is gone: no
/// connection holds its wake-up lock. A waiter takes that lock in the
/// transaction that makes its place, before it commits, and holds it as
/// long as it waits, so no look sees a live waiter's place without it
/// but while the waiter's connection is cut (back, it takes the place
/// again: `revive`); the server frees it when the waiter's connection
/// ends (a lockrun killed with SIGKILL, a machine gone). Never the place of a
/// waiter that holds no wake-up lock (`conn` 0: the server refused it to
/// that waiter, whose place lapses by itself), nor a replaced place's
/// mark (kept for its waiter to read). None where `GET_LOCK` is refused.
fn gone(wake: bool, t: &str) -> String {
    if wake {
        format!(
            "({t}conn <> 0 AND {t}owner NOT LIKE {r} AND IS_USED_LOCK({k}) IS NULL)",
            r = lit(&format!("{REPLACED}%")),
            k = wake_key('w', &format!("{t}owner")),
        )
    } else {
        "FALSE".into()
    }
}

/// What a waiter's row records as its connection: the one that holds its
/// wake-up lock, or 0 where the server refused it that lock.
fn conn(wake: bool) -> &'static str {
    if wake { "CONNECTION_ID()" } else { "0" }
}

/// lockrun's tables (from `--prefix`) in the URL's database.
#[derive(Debug, Clone)]
pub struct Tables {
    pub base: String,
    pub leases: String,
    pub waiters: String,
    pub tokens: String,
}

impl Tables {
    pub fn new(base: &str) -> Tables {
        Tables {
            base: base.to_string(),
            leases: format!("`{base}_leases`"),
            waiters: format!("`{base}_waiters`"),
            tokens: format!("`{base}_tokens`"),
        }
    }

    /// Create what is missing; `IF NOT EXISTS`, so lockruns that create
    /// at once all succeed. Text columns are bytes (names compare and sort
    /// byte by byte, whatever the database's collation). DYNAMIC rows,
    /// whatever `innodb_default_row_format` says: the keys on names are
    /// longer than the 767 bytes COMPACT and REDUNDANT rows allow.
    pub fn create(&self) -> Vec<String> {
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} ( \
                   name VARBINARY(1024) NOT NULL, token BIGINT NOT NULL, \
                   PRIMARY KEY (name)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
                self.tokens
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} ( \
                   name VARBINARY(1024) NOT NULL, slot INT NOT NULL, \
                   owner VARBINARY(128) NOT NULL, label VARBINARY(2048) NOT NULL, \
                   token BIGINT NOT NULL, mode VARBINARY(8) NOT NULL, lim INT NOT NULL, \
                   expires_at DATETIME(6) NOT NULL, granted_at DATETIME(6) NOT NULL, \
                   revoked BOOLEAN NOT NULL DEFAULT FALSE, \
                   PRIMARY KEY (name, slot)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
                self.leases
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} ( \
                   seq BIGINT NOT NULL AUTO_INCREMENT, name VARBINARY(1024) NOT NULL, \
                   owner VARBINARY(128) NOT NULL, label VARBINARY(2048) NOT NULL, \
                   mode VARBINARY(8) NOT NULL, lim INT NOT NULL, \
                   expires_at DATETIME(6) NOT NULL, conn BIGINT NOT NULL DEFAULT 0, \
                   PRIMARY KEY (seq), KEY (name, seq)) ENGINE=InnoDB ROW_FORMAT=DYNAMIC",
                self.waiters
            ),
        ]
    }

    /// lockrun's tables that exist, with their engine (see
    /// `not_innodb`): how many there are says whether they were all made.
    pub fn engines(&self) -> String {
        let names = ["leases", "waiters", "tokens"]
            .map(|t| lit(&format!("{}_{t}", self.base)))
            .join(", ");
        format!(
            "SELECT TABLE_NAME, COALESCE(ENGINE, TABLE_TYPE) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ({names})"
        )
    }

    /// The name's counter row, made on first use (its own statement,
    /// committed at once: two first users both succeed).
    pub fn counter(&self, name: &str) -> String {
        format!(
            "INSERT IGNORE INTO {} (name, token) VALUES ({}, 0)",
            self.tokens,
            lit(name)
        )
    }

    /// Start a name's decision: a transaction holding the row lock on the
    /// name's counter until it ends. No row: the counter is not made yet.
    /// While it is open, the server ends the connection once it has been
    /// idle for `idle` (whole seconds, at least 1): a lockrun stopped
    /// between the transaction's two round trips (SIGSTOP, a debugger, a
    /// frozen container) holds the row lock that long, not for the
    /// server's `wait_timeout` (8 hours by default). `UNBOUND` sets the
    /// session's own value back before the transaction ends.
    pub fn begin(&self, name: &str, idle: Duration) -> [String; 3] {
        let secs = idle.as_secs_f64().ceil().max(1.0) as u64;
        [
            format!(
                "SET @lockrun_wait_timeout = @@SESSION.wait_timeout, SESSION wait_timeout = {secs}"
            ),
            "START TRANSACTION".into(),
            format!(
                "SELECT token FROM {} WHERE name = {} FOR UPDATE",
                self.tokens,
                lit(name)
            ),
        ]
    }

    /// The name's live places whose waiters are gone (`gone`), other than
    /// `owner`'s own, lapse now, under the name's row lock, before the
    /// look; `conn` -1 marks them (`revive`). A grant deletes them with
    /// every lapsed place.
    pub fn purge(&self, name: &str, owner: &str, wake: bool) -> String {
        format!(
            "UPDATE {} SET expires_at = {NOW}, conn = -1 \
             WHERE name = {} AND owner NOT IN ({}, {}) AND expires_at > {NOW} AND {}",
            self.waiters,
            lit(name),
            lit(owner),
            lit(&format!("{SUPERSEDE}{owner}")),
            gone(wake, ""),
        )
    }

    /// Our place `seq` back, when a `purge` took it while we lived (our
    /// connection was cut, and with it our wake-up lock): kept again at
    /// its arrival number. Not a place that lapsed by itself.
    pub fn revive(&self, seq: i64, owner: &str, keep_ms: i64, wake: bool) -> String {
        format!(
            "UPDATE {} SET expires_at = {}, conn = {} \
             WHERE seq = {seq} AND owner IN ({}, {}) AND conn = -1",
            self.waiters,
            after_ms(keep_ms),
            conn(wake),
            lit(owner),
            lit(&format!("{SUPERSEDE}{owner}"))
        )
    }

    /// Every live row of a name: holders (kind `h`, pos = slot) and
    /// waiters (kind `w`, pos = place), and whether the session of each
    /// still holds its wake-up lock.
    pub fn look(&self, name: &str, wake: bool) -> String {
        let n = lit(name);
        let live = |kind| {
            if wake {
                format!("IS_USED_LOCK({}) IS NOT NULL", wake_key(kind, "owner"))
            } else {
                "FALSE".into()
            }
        };
        format!(
            "SELECT 'h' AS kind, slot AS pos, owner, label, token, mode, lim, {left} AS left_ms, \
               {hl} AS live, revoked \
             FROM {l} WHERE name = {n} AND expires_at > {NOW} \
             UNION ALL \
             SELECT 'w', seq, owner, label, 0, mode, lim, {left}, {wl}, FALSE \
             FROM {w} WHERE name = {n} AND expires_at > {NOW}",
            l = self.leases,
            w = self.waiters,
            left = left_ms("expires_at"),
            hl = live('h'),
            wl = live('w'),
        )
    }

    /// A grant's token, in the counter: one more than before, at least
    /// the server's clock in µs (a lost counter never hands out less than
    /// before), and above every token the name's rows hold.
    pub fn advance(&self, name: &str) -> String {
        let n = lit(name);
        format!(
            "UPDATE {t} SET token = GREATEST(token + 1, \
               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {NOW}), \
               (SELECT COALESCE(MAX(l.token), 0) + 1 FROM {l} l WHERE l.name = {n})) \
             WHERE name = {n}",
            t = self.tokens,
            l = self.leases,
        )
    }

    /// The grant, after `advance` in the same transaction: a free slot (or
    /// one whose lease has lapsed) becomes ours with the counter's token;
    /// our place in the queue and lapsed places go.
    #[allow(clippy::too_many_arguments)]
    pub fn grant(
        &self,
        name: &str,
        slot: u32,
        owner: &str,
        label: &str,
        mode: &str,
        lim: u32,
        ttl_ms: i64,
    ) -> [String; 3] {
        let n = lit(name);
        [
            format!(
                "DELETE FROM {w} WHERE name = {n} AND (owner IN ({o}, {so}) \
                   OR expires_at <= {NOW})",
                w = self.waiters,
                o = lit(owner),
                so = lit(&format!("{SUPERSEDE}{owner}")),
            ),
            format!(
                "INSERT INTO {l} (name, slot, owner, label, token, mode, lim, expires_at, \
                   granted_at, revoked) \
                 SELECT {n}, {slot}, {o}, {lb}, t.token, {m}, {lim}, {exp}, {NOW}, FALSE \
                 FROM {t} t WHERE t.name = {n} \
                 ON DUPLICATE KEY UPDATE owner = VALUES(owner), label = VALUES(label), \
                   token = VALUES(token), mode = VALUES(mode), lim = VALUES(lim), \
                   expires_at = VALUES(expires_at), granted_at = VALUES(granted_at), \
                   revoked = FALSE",
                l = self.leases,
                t = self.tokens,
                o = lit(owner),
                lb = lit(label),
                m = lit(mode),
                exp = after_ms(ttl_ms),
            ),
            format!(
                "SELECT token FROM {} WHERE name = {n} AND slot = {slot} AND owner = {}",
                self.leases,
                lit(owner)
            ),
        ]
    }

    /// Our lease, kept for a full ttl from now while it is still ours;
    /// then how many rows that was, and the label (a preemption mark).
    pub fn renew(&self, name: &str, slot: u32, owner: &str, ttl_ms: i64) -> [String; 2] {
        let (n, o) = (lit(name), lit(owner));
        [
            format!(
                "UPDATE {l} SET expires_at = {exp} \
                 WHERE name = {n} AND slot = {slot} AND owner = {o} AND NOT revoked \
                   AND expires_at > {NOW}",
                l = self.leases,
                exp = after_ms(ttl_ms),
            ),
            format!(
                "SELECT ROW_COUNT(), (SELECT label FROM {l} WHERE name = {n} AND slot = {slot} \
                   AND owner = {o}), (SELECT token FROM {l} WHERE name = {n} AND slot = {slot} \
                   AND owner = {o})",
                l = self.leases,
            ),
        ]
    }

    /// Queue up; then the place's number. `wake`: we take our place's
    /// wake-up lock (`sql::conn`).
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        name: &str,
        place_owner: &str,
        label: &str,
        mode: &str,
        lim: u32,
        keep_ms: i64,
        wake: bool,
    ) -> [String; 2] {
        [
            format!(
                "INSERT INTO {} (name, owner, label, mode, lim, expires_at, conn) \
                 VALUES ({}, {}, {}, {}, {lim}, {}, {})",
                self.waiters,
                lit(name),
                lit(place_owner),
                lit(label),
                lit(mode),
                after_ms(keep_ms),
                conn(wake),
            ),
            "SELECT LAST_INSERT_ID()".into(),
        ]
    }

    /// Keep our place (not once replaced). `wake`: as for `enqueue`.
    pub fn keep_place(&self, seq: i64, owner: &str, keep_ms: i64, wake: bool) -> String {
        format!(
            "UPDATE {} SET expires_at = {}, conn = {} \
             WHERE seq = {seq} AND owner IN ({}, {}) \
               AND expires_at > {NOW}",
            self.waiters,
            after_ms(keep_ms),
            conn(wake),
            lit(owner),
            lit(&format!("{SUPERSEDE}{owner}"))
        )
    }

    /// Keep a place far back in the queue, without the name's lock (no
    /// connection holds its wake-up lock: `conn` 0), and count the live
    /// places before it; the first count is 0 when it was not there to
    /// keep, the third whether the session commits by itself (on a bare
    /// connection, `Client::run_bare`, the server's default: a COMMIT
    /// follows when it does not).
    pub fn keep_far(&self, name: &str, seq: i64, owner: &str, keep_ms: i64) -> [String; 2] {
        [
            self.keep_place(seq, owner, keep_ms, false),
            format!(
                "SELECT ROW_COUNT(), (SELECT COUNT(*) FROM {} \
                   WHERE name = {} AND seq < {seq} AND expires_at > {NOW}), @@autocommit",
                self.waiters,
                lit(name)
            ),
        ]
    }

    /// As `keep_far` for a place kept lately: whether it is still live,
    /// and the live places before it, in one statement.
    pub fn count_far(&self, name: &str, seq: i64, owner: &str) -> String {
        format!(
            "SELECT (SELECT COUNT(*) FROM {0} WHERE seq = {seq} AND owner IN ({1}, {2}) \
               AND expires_at > {NOW}), \
             (SELECT COUNT(*) FROM {0} WHERE name = {3} AND seq < {seq} AND expires_at > {NOW})",
            self.waiters,
            lit(owner),
            lit(&format!("{SUPERSEDE}{owner}")),
            lit(name)
        )
    }

    /// The row a waiter blocks on is still there and unexpired.
    pub fn still(&self, name: &str, kind: char, owner: &str, pos: i64) -> String {
        match kind {
            'h' => format!(
                "EXISTS(SELECT 1 FROM {} WHERE name = {} AND slot = {pos} AND owner = {} \
                   AND expires_at > {NOW})",
                self.leases,
                lit(name),
                lit(owner)
            ),
            _ => format!(
                "EXISTS(SELECT 1 FROM {} WHERE seq = {pos} AND owner = {} AND expires_at > {NOW})",
                self.waiters,
                lit(owner)
            ),
        }
    }

    /// Leave the queue: our place, or the mark of its replacement.
    pub fn dequeue(&self, name: &str, owner: &str) -> String {
        format!(
            "DELETE FROM {} WHERE name = {} AND owner IN ({}, {}, {}, {})",
            self.waiters,
            lit(name),
            lit(owner),
            lit(&format!("{SUPERSEDE}{owner}")),
            lit(&format!("{REPLACED}{owner}")),
            lit(&format!("{REPLACED}{SUPERSEDE}{owner}")),
        )
    }

    /// The connections that wait in the places `replace` will mark, to
    /// wake them (see `waiting_conns`).
    pub fn to_replace(&self, name: &str, wake: bool) -> String {
        format!(
            "SELECT conn FROM {} WHERE name = {} AND owner LIKE {} AND expires_at > {NOW} \
               AND {}",
            self.waiters,
            lit(name),
            lit(&format!("{SUPERSEDE}%")),
            still_waiting(wake),
        )
    }

    /// The connections that wait in the name's live places, to wake them
    /// with `KILL QUERY`: only a connection that still holds its place's
    /// wake-up lock is its waiter's (a connection id recorded before a
    /// server restart may now be anyone's). None where `GET_LOCK` is
    /// refused: no waiter blocks then.
    pub fn waiting_conns(&self, name: &str, wake: bool) -> String {
        format!(
            "SELECT conn FROM {} WHERE name = {} AND expires_at > {NOW} AND {}",
            self.waiters,
            lit(name),
            still_waiting(wake),
        )
    }

    /// `--supersede` joining the queue: every live place that asked for it
    /// too is marked replaced by `by` (our label), and kept at least
    /// `keep_ms` more so its waiter reads the mark.
    pub fn replace(&self, name: &str, by: &str, keep_ms: i64) -> String {
        format!(
            "UPDATE {} SET owner = CONCAT({}, owner), label = {}, \
               expires_at = GREATEST(expires_at, {}) \
             WHERE name = {} AND owner LIKE {} AND expires_at > {NOW}",
            self.waiters,
            lit(REPLACED),
            lit(by),
            after_ms(keep_ms),
            lit(name),
            lit(&format!("{SUPERSEDE}%")),
        )
    }

    /// `--preempt` finding the name held: every live holder that runs a
    /// job and is not marked yet is marked with `mark`; its owner stays.
    pub fn preempt(&self, name: &str, mark: &str, owner: &str) -> String {
        format!(
            "UPDATE {} SET label = CONCAT(label, {}) \
             WHERE name = {} AND expires_at > {NOW} AND NOT revoked \
               AND owner NOT IN ({}, {}) AND {UNMARKED}",
            self.leases,
            lit(mark),
            lit(name),
            lit(KEPT),
            lit(owner)
        )
    }

    /// `--preempt` finding `--min-hold` windows, which run no job: they
    /// end at once.
    pub fn end_windows(&self, name: &str) -> String {
        format!(
            "DELETE FROM {} WHERE name = {} AND owner = {} AND NOT revoked \
               AND expires_at > {NOW}",
            self.leases,
            lit(name),
            lit(KEPT)
        )
    }

    /// Give our lease back: with a `--min-hold` window still open on the
    /// server's clock, the row stays, owned by no one (`KEPT`), until the
    /// grant plus the window; else it goes. The first statement keeps it
    /// or not; the second deletes what is still ours, so exactly one acts.
    /// Then how many rows each touched.
    pub fn release(&self, name: &str, slot: u32, owner: &str, window_us: i64) -> [String; 4] {
        let (n, o) = (lit(name), lit(owner));
        let until = format!("granted_at + INTERVAL {window_us} MICROSECOND");
        [
            format!(
                "UPDATE {l} SET owner = {kept}, expires_at = {until} \
                 WHERE name = {n} AND slot = {slot} AND owner = {o} AND expires_at > {NOW} \
                   AND {until} > {NOW} AND {UNMARKED}",
                l = self.leases,
                kept = lit(KEPT),
            ),
            "SELECT ROW_COUNT()".into(),
            format!(
                "DELETE FROM {} WHERE name = {n} AND slot = {slot} AND owner = {o}",
                self.leases
            ),
            "SELECT ROW_COUNT()".into(),
        ]
    }

    /// The holders for `status` and `release --force`.
    pub fn holders(&self, name: &str) -> String {
        format!(
            "SELECT {} FROM {} h WHERE h.name = {} AND h.expires_at > {NOW} ORDER BY h.token",
            holder_columns("h"),
            self.leases,
            lit(name)
        )
    }

    /// How many wait, and how many of them asked for `--supersede` (the
    /// live places, not the marks of replaced ones nor those of waiters
    /// that are gone), of the name `col`.
    fn counts(&self, col: &str) -> String {
        format!(
            "(SELECT COUNT(*) FROM {w} w WHERE w.name = {col} AND w.expires_at > {NOW} \
               AND w.owner NOT LIKE {r} AND NOT {g}), \
             (SELECT COUNT(*) FROM {w} w WHERE w.name = {col} AND w.expires_at > {NOW} \
               AND w.owner LIKE {s} AND NOT {g})",
            w = self.waiters,
            r = lit(&format!("{REPLACED}%")),
            s = lit(&format!("{SUPERSEDE}%")),
            g = gone(true, "w."),
        )
    }

    /// How many wait, and how many asked for `--supersede`.
    pub fn waiting(&self, name: &str) -> String {
        format!("SELECT {}", self.counts(&lit(name)))
    }

    /// Every name the tables have a trace of, in byte order, at most
    /// `limit`, each with its live holders (one row each, or one row of
    /// NULLs for a free name) and its waiters: one statement, so one
    /// snapshot.
    pub fn list(&self, limit: u64) -> String {
        format!(
            "SELECT n.name, {c}, {counts} \
             FROM (SELECT name FROM (SELECT name FROM {l} UNION SELECT name FROM {w}) a \
               ORDER BY name LIMIT {limit}) n \
             LEFT JOIN {l} h ON h.name = n.name AND h.expires_at > {NOW} \
             ORDER BY n.name, h.token",
            c = holder_columns("h"),
            counts = self.counts("n.name"),
            l = self.leases,
            w = self.waiters
        )
    }

    /// Revoke a holder: no one owns it any more, and it stays until it
    /// would have ended; then how many rows that was.
    pub fn revoke(&self, name: &str, token: u64) -> [String; 2] {
        [
            format!(
                "UPDATE {} SET owner = X'', revoked = TRUE \
                 WHERE name = {} AND token = {token} AND NOT revoked AND expires_at > {NOW}",
                self.leases,
                lit(name)
            ),
            "SELECT ROW_COUNT()".into(),
        ]
    }

    /// Delete a holder outright; then how many rows that was.
    pub fn delete(&self, name: &str, token: u64) -> [String; 2] {
        [
            format!(
                "DELETE FROM {} WHERE name = {} AND token = {token} AND expires_at > {NOW}",
                self.leases,
                lit(name)
            ),
            "SELECT ROW_COUNT()".into(),
        ]
    }
}

/// The first of `engines`' rows whose table is not in InnoDB: a table
/// without transactions or row locks (MyISAM, Aria, MEMORY: made by
/// `enforce_storage_engine`, an engine substituted, an operator's ALTER)
/// takes no decision one at a time.
pub fn not_innodb(rows: &[mysql::Row]) -> Option<&mysql::Row> {
    rows.iter()
        .find(|r| !super::client::text(r, 1).is_some_and(|e| e.eq_ignore_ascii_case("InnoDB")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_hexadecimal_literals() {
        assert_eq!(lit(""), "X''");
        assert_eq!(lit("a'b"), "X'612762'");
        let t = Tables::new("lockrun");
        assert!(t.look("x';DROP", true).contains("X'78273b44524f50'"));
        assert_eq!(t.leases, "`lockrun_leases`");
    }

    /// A place is judged gone only when its waiter took a wake-up lock
    /// (its row names a connection) that no connection holds now; never a
    /// replaced place's mark, never our own place, never where `GET_LOCK`
    /// is refused.
    #[test]
    fn only_a_place_whose_waiter_took_its_wake_up_lock_is_judged_gone() {
        let t = Tables::new("lockrun");
        assert!(t.enqueue("n", "o", "l", "x", 1, 10, true)[0].contains("CONNECTION_ID()"));
        assert!(!t.enqueue("n", "o", "l", "x", 1, 10, false)[0].contains("CONNECTION_ID()"));
        assert!(
            t.keep_place(1, "o", 10, true)
                .contains("conn = CONNECTION_ID()")
        );
        assert!(t.keep_place(1, "o", 10, false).contains("conn = 0"));
        let purge = t.purge("n", "o", true);
        for part in [
            "conn <> 0".to_string(),
            format!("owner NOT LIKE {}", lit("replaced:%")),
            format!("owner NOT IN ({}, {})", lit("o"), lit("supersede:o")),
            "IS_USED_LOCK(CONCAT('lockrun:w:', SHA1(owner))) IS NULL".to_string(),
        ] {
            assert!(purge.contains(&part), "{purge} lacks {part}");
        }
        assert!(t.purge("n", "o", false).ends_with("AND FALSE"));
        assert!(t.revive(7, "o", 10, true).contains("seq = 7"));
        assert!(t.revive(7, "o", 10, true).ends_with("AND conn = -1"));
        assert!(t.waiting("n").contains("IS_USED_LOCK"));
    }
}
