//! The settings every connection of lockrun's to MySQL runs under, and
//! the server settings that decide whether its writes may run at all
//! (a binary log that takes statements, statement time limits).

use std::time::Duration;

/// The session settings of every connection: READ COMMITTED, a lock wait
/// bounded near the bound on one request, autocommit on whatever the
/// server's default (`autocommit = 0` in my.cnf or `init_connect` would
/// leave a renewal or a release uncommitted: the lease would lapse on the
/// server while the job runs, kept only by a row lock a cut connection
/// drops), and on MariaDB no `max_statement_time` (it would cut every
/// blocking wake-up wait short; lockrun bounds each call itself). The
/// `/*M! */` part is read by MariaDB alone; MySQL's `max_execution_time`
/// is lifted where it applies, in the waiting `SELECT` (`wait_hint`).
/// With `row_binlog`, the session logs rows (`ROW_BINLOG`).
pub fn session(op: Duration, row_binlog: bool) -> String {
    let secs = op.as_secs_f64().ceil().max(1.0) as u64;
    let mut s = format!(
        "SET SESSION autocommit = 1 /*M!100101 , max_statement_time = 0 */; \
         SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
         SET SESSION innodb_lock_wait_timeout = {secs}"
    );
    if row_binlog {
        s.push_str("; ");
        s.push_str(ROW_BINLOG);
    }
    s
}

/// Whether the server logs for replication, and in which format.
pub const BINLOG: &str = "SELECT @@GLOBAL.log_bin, @@SESSION.binlog_format";

/// This session logs rows: READ COMMITTED writes are refused where the
/// binary log takes statements (needs BINLOG ADMIN, or SUPER on MySQL).
pub const ROW_BINLOG: &str = "SET SESSION binlog_format = 'ROW'";

/// Why a server that logs statements is refused.
pub const STATEMENT_BINLOG: &str = "the server's binary log takes statements \
    (binlog_format = STATEMENT), and InnoDB refuses the READ COMMITTED writes lockrun \
    makes under it; set binlog_format to ROW or MIXED on the server, or grant this user \
    BINLOG ADMIN (SUPER on MySQL) so lockrun logs rows for its own sessions";

/// The optimizer hint that lets MySQL's `SELECT` that waits run `ms`
/// milliseconds whatever `max_execution_time` says (MariaDB reads it as
/// a comment).
pub fn wait_hint(ms: u64) -> String {
    format!("/*+ MAX_EXECUTION_TIME({ms}) */")
}

/// The server's numbers for a statement cut by its time limit:
/// MariaDB's `max_statement_time`, MySQL's `max_execution_time`.
pub const STATEMENT_TIME: [u16; 2] = [1969, 3024];

/// The server's numbers for a wake-up wait refused as a deadlock: the
/// waiters of one name form a chain, each waiting on the place ahead, and
/// MariaDB and MySQL call any wait-for chain deeper than 32 a deadlock
/// (MariaDB's `ER_LOCK_DEADLOCK`, MySQL's `ER_USER_LOCK_DEADLOCK`).
pub const DEADLOCK: [u16; 2] = [1213, 3058];
