//! A renewal the server refuses (an ACL or a grant withdrawn while the job
//! runs) ends the lease at once: the job is stopped at the next renewal,
//! exit 76, with one line naming the refusal — not retried until the
//! deadline as if the network had failed.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// ttl 15 s: a renewal every 5 s, 2 s for one attempt, 1.5 s of grace. A
/// refusal retried like a network failure would stop the job only some
/// 12.5 s after the last renewal; the next renewal comes within 5 s.
const TTL: &str = "15s";
const PROMPTLY: Duration = Duration::from_secs(10);

/// A holder on `url` whose job sleeps for a minute; returns once the job runs.
fn holder(url: &str, scratch: &Scratch) -> (Child, i32) {
    let child = lockrun()
        .env("LOCKRUN_URL", url)
        .args(["--ttl", TTL, "refused", "-c"])
        .arg(format!(
            "echo $$ > {}; exec sleep 60",
            scratch.path("pid").display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lockrun");
    (child, scratch.pid_in("pid"))
}

/// Once the server started refusing (at `refused`): stopped at the next
/// renewal, 76, and one line on stderr that says what the server said.
#[track_caller]
fn stopped_at_once(mut child: Child, job: i32, refused: Instant, says: &str) {
    let code = wait_child(&mut child, Duration::from_secs(30)).code();
    let took = refused.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(code, Some(76), "{err}");
    assert!(!alive(job), "the job outlived its lease");
    assert_eq!(err.lines().count(), 1, "expected one line: {err}");
    assert!(err.contains("refused the renewal"), "{err}");
    assert!(err.contains(says), "{err}");
    assert!(took < PROMPTLY, "stopped {took:?} after the refusal: {err}");
}

#[test]
fn redis_an_acl_that_loses_evalsha_stops_the_job_at_the_next_renewal() {
    let redis = Redis::start();
    let _: () = redis.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "reset",
        "on",
        ">locker-pw",
        "~*",
        "&*",
        "+@all",
    ]);
    let url = format!("redis://locker:locker-pw@127.0.0.1:{}", redis.port);
    let scratch = Scratch::new();
    let (child, job) = holder(&url, &scratch);
    let _: () = redis.cmd(&["ACL", "SETUSER", "locker", "-evalsha"]);
    stopped_at_once(child, job, Instant::now(), "NOPERM");
}

#[test]
fn postgres_rights_revoked_from_the_role_stop_the_job_at_the_next_renewal() {
    let pg = Postgres::start();
    // The owner creates the tables; the role gets the grants lockrun-engines(7) lists.
    on(&pg.url()).args(["x", "true"]).succeeds();
    pg.sql(&format!(
        "CREATE ROLE ci LOGIN PASSWORD 'ci-pw'; {}",
        crate::docs::documented_postgres_grants("ci")
    ));
    let scratch = Scratch::new();
    let (child, job) = holder(&pg.url_as("ci", "ci-pw"), &scratch);
    pg.sql("REVOKE ALL ON lockrun.lockrun_leases, lockrun.lockrun_waiters FROM ci");
    stopped_at_once(child, job, Instant::now(), "permission denied");
}

#[test]
fn etcd_a_permission_removed_from_the_role_stops_the_job_at_the_next_renewal() {
    let etcd = Etcd::start();
    let url = etcd.with_locker("s3cretpw");
    let scratch = Scratch::new();
    let (child, job) = holder(&url, &scratch);
    etcd.ctl(&[
        "--user",
        "root:rootpw",
        "role",
        "revoke-permission",
        "locking",
        "--prefix=true",
        "lockrun:",
    ]);
    stopped_at_once(child, job, Instant::now(), "permission denied");
}
