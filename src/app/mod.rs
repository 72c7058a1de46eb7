//! The commands, each a straight line: config → backend → supervise →
//! release → exit code. `main` only parses and prints; each command's file
//! holds its line: `run` (a job under a lease), `status`, `doctor`,
//! `release`, and `manual` (the generated man page and completions).

mod doctor;
mod manual;
mod release;
mod run;
mod status;

use std::time::Duration;

use crate::backend;
use crate::cli::{Cli, OperatorCommand};
use crate::config::Common;
use crate::exit::Failure;
use crate::log;

/// What `main` should do at the end.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    Exit(u8),
    /// The job died of this signal (SIGINT): die of it too, so a calling
    /// shell stops its loop as it would without lockrun.
    Raise(i32),
}

pub fn dispatch(cli: Cli) -> Result<Ending, Failure> {
    if let Some(kind) = cli.generate {
        return manual::generate(kind).map(|()| Ending::Exit(0));
    }
    match &cli.subcommand {
        Some(OperatorCommand::Status {
            json,
            name: Some(name),
        }) => status::status(&cli, name, *json),
        Some(OperatorCommand::Status { json, name: None }) => status::status_all(&cli, *json),
        Some(OperatorCommand::Doctor {}) => doctor::doctor(&cli),
        Some(OperatorCommand::Release {
            force,
            token,
            now,
            name,
        }) => release::release(&cli, name, *force, token.as_deref(), *now),
        None => run::run_job(&cli),
    }
}

fn setup_logging(common: &Common) {
    log::set_level(common.verbosity);
    // The job runs as the same user: it must not read a password from our
    // memory or /proc/PID/environ, nor reopen our descriptors through
    // /proc/PID/fd, whatever the URL (lockrun-safety(7) "HOW LOCKRUN TREATS THE JOB").
    crate::sys::set_dumpable(false);
    if let Some(p) = common.address.secret() {
        log::add_secret(p);
        // As a URL writes it, for a client that echoes its URL.
        let mut u = url::Url::parse("x://u@h").expect("a valid URL");
        if u.set_password(Some(p)).is_ok()
            && let Some(encoded) = u.password()
            && encoded != p
        {
            log::add_secret(encoded);
        }
    }
}

fn millis(d: Option<Duration>) -> serde_json::Value {
    d.map_or(serde_json::Value::Null, |d| (d.as_millis() as u64).into())
}

fn human(d: Duration) -> String {
    // Whole milliseconds read better than nanoseconds at 3 a.m.
    crate::text::duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

/// No lease of our own: the default ttl's bound on one request will do.
fn op_budget() -> Duration {
    crate::schedule::Timing::new(DEFAULT_TTL, None)
        .map(|t| t.op)
        .unwrap_or(Duration::from_secs(2))
}

fn opening(common: &Common, op: Duration, ttl: Duration) -> backend::Opening {
    backend::Opening {
        prefix: common.prefix.clone(),
        op,
        ttl,
    }
}

/// lockrun(1)'s default `--ttl`.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

fn open_engine(common: &Common) -> Result<Box<dyn backend::Engine>, Failure> {
    Ok(common
        .address
        .open(&opening(common, op_budget(), DEFAULT_TTL))?)
}
