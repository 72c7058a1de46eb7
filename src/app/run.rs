//! A job under a lease: acquire, supervise, release, and the metrics file
//! written at the end of every run (lockrun(1) "Metrics").

use std::sync::Arc;
use std::time::Duration;

use super::{Ending, human, opening, setup_logging};
use crate::backend::{self, Acquired, Lease, Owner, Request, Wait};
use crate::cli::Cli;
use crate::clock::Boot;
use crate::config;
use crate::exit::{self, Class, Failure, JobEnd, fail};
use crate::log;
use crate::metrics;
use crate::supervise::{self, Job};
use crate::watchdog::Deadline;

pub fn run_job(cli: &Cli) -> Result<Ending, Failure> {
    let cfg = config::run_config(&cli.backend, &cli.run)?;
    let mut report = metrics::Run::start();
    let ended = run_configured(&cfg, &mut report);
    if let Some(path) = &cfg.metrics_file {
        let code = match &ended {
            Ok(Ending::Exit(code)) => *code,
            Ok(Ending::Raise(sig)) => JobEnd::Signaled(*sig).code(),
            Err(f) => f.class.code(),
        };
        report.write(path, &cfg.name, cfg.label.as_deref(), code);
    }
    ended
}

fn run_configured(cfg: &config::RunConfig, report: &mut metrics::Run) -> Result<Ending, Failure> {
    setup_logging(&cfg.common);
    // Before anything is taken: a job that lockrun could not stop never runs.
    crate::sys::check_pidfds().map_err(|m| fail(Class::Internal, m))?;
    let owner = Owner::new(cfg.label.as_deref())?;
    log::add_secret(&owner.secret);
    let req = Request {
        name: &cfg.name,
        owner: &owner,
        timing: cfg.timing,
        mode: cfg.mode,
        outer: backend::outer_holder(&cfg.name),
        inherited_fd: backend::inherited_lock_fd(),
        quiet: cfg.common.verbosity == 0,
        min_hold: cfg.min_hold,
        group: cfg.group,
    };
    let lease = match acquire(cfg, &req)? {
        Ok(lease) => lease,
        Err(not_acquired) => return Ok(not_acquired),
    };
    report.granted(lease.token);
    supervise_and_release(cfg, &req, lease, report)
}

/// The lease on `req`'s name, or how lockrun ends without it.
fn acquire(cfg: &config::RunConfig, req: &Request) -> Result<Result<Lease, Ending>, Failure> {
    let expires = cfg.common.address.engine.expires;
    let mut engine =
        cfg.common
            .address
            .open(&opening(&cfg.common, cfg.timing.op, cfg.timing.ttl))?;
    loop {
        match engine.acquire(req, cfg.wait)? {
            // A grant whose lease is already (nearly) over, because lockrun was
            // paused right after it, must not start the job: ask again.
            Acquired::Granted(l)
                if expires
                    && Boot::now()
                        >= cfg
                            .timing
                            .lost_at(cfg.timing.deadline_for(l.sent_at, l.ttl)) =>
            {
                log::warn(format!(
                    "the lease on {} ran out before the job could start (was lockrun paused?); acquiring again",
                    cfg.name
                ));
                let _ = l.give_back();
            }
            Acquired::Granted(l) => return Ok(Ok(l)),
            other => {
                not_acquired(cfg, other);
                return Ok(Err(Ending::Exit(cfg.conflict_code)));
            }
        }
    }
}

/// Say why the name was not ours, as loud as the case deserves.
fn not_acquired(cfg: &config::RunConfig, answer: Acquired) {
    match answer {
        Acquired::Granted(_) => {}
        Acquired::Busy { holder } => {
            let holder = holder
                .as_deref()
                .unwrap_or("another process (no holder recorded)");
            match cfg.wait {
                // Cron mails every line: a skipped run stays silent.
                Wait::No => log::info(format!("not acquired: {} is held by {holder}", cfg.name)),
                Wait::For(d) => log::warn(format!(
                    "gave up waiting for {} after {}: held by {holder}",
                    cfg.name,
                    human(d)
                )),
                Wait::Forever => {}
            }
        }
        // An outage, not a busy name: said even with -n.
        Acquired::Unreachable { why } => match cfg.wait {
            Wait::For(d) => log::warn(format!(
                "gave up waiting for {} after {}: {why}",
                cfg.name,
                human(d)
            )),
            _ => log::warn(format!("not acquired: {why}")),
        },
        // Coalesced, as a skip with -n is: silent but under -v.
        Acquired::QueueFull { waiting } => log::info(format!(
            "not acquired: {waiting} already waiting for {} (--max-waiters {})",
            cfg.name,
            cfg.group.max_waiters.unwrap_or_default()
        )),
        Acquired::Replaced { by } => log::warn(format!(
            "gave up waiting for {}: replaced by the newer request of {} (--supersede)",
            cfg.name,
            crate::text::printable(&by)
        )),
    }
}

/// What the job is given: its command, its environment without secrets,
/// and the schedule its supervisor keeps.
fn job_for(cfg: &config::RunConfig, req: &Request, lease: &Lease, expires: bool) -> Job {
    // A password must never reach the job, even through an inherited
    // LOCKRUN_URL that another --url overrode.
    let password_in_effect = cfg.common.address.secret().is_some();
    let secret = password_in_effect || config::inherited_url_has_password();
    let env = lease.job_env(req, secret);
    let mut env_remove = env.remove;
    // The metrics file is this run's: a lockrun inside the job writes its own.
    env_remove.push("LOCKRUN_METRICS_FILE".into());
    if let Some(var) = cfg.common.address.secret_env() {
        env_remove.push(var.to_string());
    }
    Job {
        command: cfg.command.clone(),
        env: env.set,
        env_remove,
        inherit_fd: env.inherit_fd,
        // A flock has no deadline to renew before; its holder looks every
        // second whether a --preempt request asked it to stop.
        timing: if expires {
            cfg.timing
        } else {
            cfg.timing.looking_every(Duration::from_secs(1))
        },
        sent_at: lease.sent_at,
        secret,
    }
}

/// Run the job under `lease`, then let the lease go once nothing of the
/// job is left, and end as the job (or the lease) did.
fn supervise_and_release(
    cfg: &config::RunConfig,
    req: &Request,
    lease: Lease,
    report: &mut metrics::Run,
) -> Result<Ending, Failure> {
    let expires = cfg.common.address.engine.expires;
    let deadline = expires.then(|| {
        Arc::new(Deadline::new(
            cfg.timing.deadline_for(lease.sent_at, lease.ttl),
        ))
    });
    let job = job_for(cfg, req, &lease, expires);
    let renewer = lease.renewer();
    let if_unreleased = lease.if_unreleased();
    let mut pending = backend::Pending::Here(lease);
    let releasing = format!("releasing {}", cfg.name);
    // Once the job runs (and never before: the guard is forked from a
    // process with one thread), a thread waits to release the lease.
    // Once the supervisor catches the signals, a signal no longer leaves
    // the queue: the lease is the job's now.
    let outcome = supervise::supervise_job(job, deadline, renewer, backend::quit::disarm, || {
        pending.start_thread()
    });
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            // The job never started, or its supervision failed: give the
            // lease back.
            let _ = pending.release(&releasing, cfg.timing.op);
            return Err(e);
        }
    };

    // Nothing of the job is left: only now may the lease go, within one
    // request's budget whatever the server does.
    let released = pending.release(&releasing, cfg.timing.op);
    ending(cfg, outcome, released, &if_unreleased, report)
}

/// How lockrun ends once the job is over and the release was asked for.
fn ending(
    cfg: &config::RunConfig,
    outcome: supervise::Outcome,
    released: Result<bool, backend::Error>,
    if_unreleased: &str,
    report: &mut metrics::Run,
) -> Result<Ending, Failure> {
    if !outcome.started {
        log::reason(format!(
            "lease on {} lost before the job could start: {}; the job was not started",
            cfg.name,
            outcome.lost.as_deref().unwrap_or("its time was up")
        ));
        return Ok(Ending::Exit(exit::LEASE_LOST));
    }
    if let Some(reason) = outcome.lost {
        report.lost = true;
        log::reason(format!(
            "lease on {} lost: {reason}; the job was stopped",
            cfg.name
        ));
        return Ok(Ending::Exit(exit::LEASE_LOST));
    }
    if let Some(reason) = outcome.failed {
        return Err(fail(
            Class::Internal,
            format!("{reason}; the job was stopped and the lease released"),
        ));
    }
    match released {
        Ok(true) => {}
        Ok(false) => log::alert(format!(
            "the job finished, but the lease on {} was no longer ours at release",
            cfg.name
        )),
        Err(e) => log::alert(format!(
            "{e}; the release got no answer, so whether it was done is unknown; if it was \
             not, {if_unreleased}"
        )),
    }
    Ok(match outcome.end {
        Some(JobEnd::Signaled(sig)) if sig == libc::SIGINT => Ending::Raise(sig),
        Some(end) => Ending::Exit(end.code()),
        None => Ending::Exit(exit::INTERNAL),
    })
}
