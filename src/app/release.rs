//! `release --force`: an operator breaks a lease (lockrun(1) "COMMANDS").

use std::io::Write;

use super::status::describe_holder;
use super::{Ending, human, op_budget, open_engine, setup_logging};
use crate::backend::{self, Broken, Force, Holder};
use crate::cli::Cli;
use crate::config;
use crate::exit::{self, Class, Failure, fail};

pub fn release(
    cli: &Cli,
    name: &str,
    force: bool,
    token: Option<&str>,
    now: bool,
) -> Result<Ending, Failure> {
    let common = config::common(&cli.backend)?;
    config::check_name(name, &*common.address)?;
    if !force && !common.address.engine.expires {
        // A flock lasts as long as its holder: --force only ends a window.
        return Err(fail(
            Class::Usage,
            format!(
                "refusing to break a lock without --force; on the {} engine --force ends \
                 only a --min-hold window (a running holder's lock ends with its process)",
                common.address.engine.name
            ),
        ));
    }
    if !force {
        return Err(fail(
            Class::Usage,
            format_args!(
                "refusing to break a lock without --force: the holder's job is stopped \
                 (exit {}); add --force, and --token T to act only on the lease you looked at",
                crate::exit::LEASE_LOST
            ),
        ));
    }
    let token = token
        .map(|t| {
            t.trim().parse::<u64>().map_err(|_| {
                fail(
                    Class::Usage,
                    format!("invalid --token {t:?}: expected a number"),
                )
            })
        })
        .transpose()?;
    setup_logging(&common);
    let mut engine = open_engine(&common)?;
    let asked = name.to_string();
    let broken = backend::bounded(&format!("breaking {name}"), op_budget(), move || {
        engine.force_release(&asked, Force { token, now })
    })?;
    Ok(said(name, token, now, broken))
}

/// What the operator reads of `broken`, and how release ends.
fn said(name: &str, token: Option<u64>, now: bool, broken: Broken) -> Ending {
    let mut err = std::io::stderr();
    match broken {
        Broken::NotHeld => {
            let _ = writeln!(err, "lockrun: {name} is not held; nothing to break");
            Ending::Exit(exit::STATUS_FREE)
        }
        Broken::AlreadyRevoked => {
            let _ = writeln!(
                err,
                "lockrun: {name} was already revoked; it comes free when the old lease ends"
            );
            Ending::Exit(exit::STATUS_FREE)
        }
        Broken::TokenMismatch(current) => {
            let current = if current.is_empty() {
                "unknown".to_string()
            } else {
                current
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                err,
                "lockrun: {name} not broken: no holder has token {}; the tokens in force: {current}",
                token.unwrap_or_default()
            );
            Ending::Exit(exit::STATUS_FREE)
        }
        Broken::Leases(holders) => {
            for h in holders {
                say_broken(name, now, &h);
            }
            Ending::Exit(0)
        }
    }
}

/// One broken lease (or ended window), as `release --force` prints it.
fn say_broken(name: &str, now: bool, h: &Holder) {
    let mut out = std::io::stdout();
    if h.min_hold {
        let mut of = vec![format!(
            "granted to {}",
            h.label.as_deref().unwrap_or("unknown")
        )];
        of.extend(h.token.map(|t| format!("token {t}")));
        let _ = writeln!(
            out,
            "{name}: ended the min-hold window ({}); no job ran under it, \
                 the name is free now",
            of.join(", ")
        );
        return;
    }
    let what = if now {
        "deleted; a waiter may start now, while the old job may still be stopping".to_string()
    } else {
        format!(
            "revoked; its job stops at its next renewal, new grants wait {}until the old lease ends",
            // A ZooKeeper session does not say how long it has left.
            h.ttl_left
                .map(|l| format!("{} ", human(l)))
                .unwrap_or_default()
        )
    };
    let _ = writeln!(
        out,
        "{name}: broke the lease {}: {what}",
        describe_holder(&Holder {
            ttl_left: None,
            revoked: false,
            ..h.clone()
        })
    );
}
