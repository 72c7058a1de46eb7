//! `doctor`: read-only checks of an engine, one line each, bounded as a
//! whole (lockrun(1) "COMMANDS").

use std::io::Write;
use std::time::Duration;

use super::{Ending, op_budget, opening, setup_logging};
use crate::backend;
use crate::cli::Cli;
use crate::config;
use crate::exit::{self, Failure};
use crate::log;

/// Every check together: past this, doctor says which engine did not answer.
const DOCTOR_TIME: Duration = Duration::from_secs(30);

pub fn doctor(cli: &Cli) -> Result<Ending, Failure> {
    let common = config::common(&cli.backend)?;
    setup_logging(&common);
    // The ttl runs here would ask for (`--ttl`, `LOCKRUN_TTL`): one doctor
    // cannot read is refused by every run, and checked there.
    let ttl = config::parse_duration("--ttl", &cli.run.ttl, config::MAX_TTL)
        .unwrap_or(super::DEFAULT_TTL);
    let how = opening(&common, op_budget(), ttl);
    let address = common.address.clone();
    let shown = address.shown();
    let checks = backend::bounded(&format!("checking {shown}"), DOCTOR_TIME, move || {
        Ok(address.doctor(&how))
    })?;
    let mut out = std::io::stdout().lock();
    for c in &checks {
        let line = format!("{:<4}  {}: {}", c.verdict.word(), c.topic, c.said);
        let _ = writeln!(out, "{}", log::printable(&line));
    }
    let worst = checks.iter().map(|c| c.verdict).max();
    Ok(Ending::Exit(match worst {
        Some(backend::Verdict::Fail) => exit::UNAVAILABLE,
        Some(backend::Verdict::Warn) => exit::DOCTOR_WARNED,
        _ => 0,
    }))
}
