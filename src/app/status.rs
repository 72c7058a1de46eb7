//! `status` of one name or of every name (lockrun(1) "COMMANDS"): text for an
//! operator, JSON for a script; whatever a server holds is shown escaped.

use std::io::Write;
use std::time::Duration;

use super::{Ending, human, millis, op_budget, open_engine, setup_logging};
use crate::backend::{self, Holder, Mode};
use crate::cli::Cli;
use crate::clock::Boot;
use crate::config;
use crate::exit::{self, Failure};
use crate::text::printable;

/// When a lease `left` from now ends, as UTC wall time rounded up to the second.
fn until(left: Duration) -> String {
    let at = std::time::SystemTime::now() + left + Duration::from_millis(999);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A lease kept by `--min-hold` after its job ended: held, with no job.
fn describe_window(h: &Holder) -> String {
    let mut parts = vec![match h.ttl_left {
        Some(l) => format!("held by min-hold until {} ({} left)", until(l), human(l)),
        None => "held by min-hold".to_string(),
    }];
    parts.push("no job running".into());
    if let Some(l) = &h.label {
        parts.push(format!("granted to {}", printable(l)));
    }
    if let Some(t) = h.token {
        parts.push(format!("token {t}"));
    }
    if let Some(f) = h.held_for {
        parts.push(format!("granted {} ago", human(f)));
    }
    parts.join(", ")
}

pub(super) fn describe_holder(h: &Holder) -> String {
    if h.min_hold {
        return describe_window(h);
    }
    let mut parts = vec![format!(
        "held by {}",
        printable(h.label.as_deref().unwrap_or("unknown"))
    )];
    if let Some(t) = h.token {
        parts.push(format!("token {t}"));
    }
    if let Some(l) = h.ttl_left {
        parts.push(format!("{} left", human(l)));
    }
    if let Some(f) = h.held_for {
        parts.push(format!("for {}", human(f)));
    }
    if h.revoked {
        parts.push("revoked by release --force".into());
    }
    if let Some(by) = &h.preempted_by {
        parts.push(format!(
            "preempted by {} (its job stops at its next renewal)",
            printable(by)
        ));
    }
    if let Some(pid) = h.label.as_deref().and_then(backend::gone_holder) {
        // A lockrun killed outright leaves a server's lease until it expires.
        parts.push(format!(
            "but its lockrun (pid {pid}) no longer runs on this host"
        ));
    }
    parts.join(", ")
}

fn holder_json(h: &Holder) -> serde_json::Value {
    serde_json::json!({
        "label": h.label,
        "token": h.token,
        "slot": h.slot,
        "mode": Mode::name(h.mode),
        "ttl_left_ms": millis(h.ttl_left),
        "held_for_ms": millis(h.held_for),
        "revoked": h.revoked,
        // A min-hold window has no holder that should run.
        "holder_gone": !h.min_hold && h.label.as_deref().and_then(backend::gone_holder).is_some(),
        "min_hold": h.min_hold,
        "held_until": h.min_hold.then(|| h.ttl_left.map(until)).flatten(),
        "preempted_by": h.preempted_by,
    })
}

pub fn status(cli: &Cli, name: &str, json: bool) -> Result<Ending, Failure> {
    let common = config::common(&cli.backend)?;
    config::check_name(name, &*common.address)?;
    setup_logging(&common);
    let mut engine = open_engine(&common)?;
    let asked = name.to_string();
    let st = backend::bounded(&format!("reading {name}"), op_budget(), move || {
        engine.status(&asked)
    })?;
    let mut out = std::io::stdout().lock();
    show_status(&mut out, name, &st, json, false);
    Ok(Ending::Exit(if st.holders.is_empty() {
        exit::STATUS_FREE
    } else {
        exit::STATUS_HELD
    }))
}

/// What `status --json NAME` prints for one name.
fn status_object(name: &str, st: &backend::Status) -> serde_json::Value {
    let first = st.holders.first();
    // The first holder's fields stay at the top level, as before there
    // were several holders; `holders` lists them all.
    serde_json::json!({
        "name": name,
        "held": first.is_some(),
        "mode": first.map(|h| Mode::name(h.mode)),
        "holder": first.and_then(|h| h.label.clone()),
        "token": first.and_then(|h| h.token),
        "ttl_left_ms": millis(first.and_then(|h| h.ttl_left)),
        "held_for_ms": millis(first.and_then(|h| h.held_for)),
        "revoked": !st.holders.is_empty() && st.holders.iter().all(|h| h.revoked),
        "holder_gone": first
            .filter(|h| !h.min_hold)
            .and_then(|h| h.label.as_deref())
            .and_then(backend::gone_holder)
            .is_some(),
        "min_hold": first.is_some_and(|h| h.min_hold),
        "held_until": first.filter(|h| h.min_hold).and_then(|h| h.ttl_left).map(until),
        "preempted_by": first.and_then(|h| h.preempted_by.clone()),
        "holders": st.holders.iter().map(holder_json).collect::<Vec<_>>(),
        "waiters": st.waiters,
        "superseding": st.superseding,
    })
}

/// JSON as one line, with invisible characters escaped as `\uXXXX` (the
/// same string to a parser, but not to an eye reading `jq`'s raw output
/// or the line itself). They can only stand inside strings.
fn json_text(v: &serde_json::Value) -> String {
    let text = v.to_string();
    if !text.chars().any(crate::text::is_invisible) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if crate::text::is_invisible(c) {
            // JSON escapes UTF-16 units: a pair for a character past U+FFFF.
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One name's status as text (`one_line`: several holders on the name's
/// line, as `status` without a name shows them), or as its JSON object.
fn show_status(out: &mut dyn Write, name: &str, st: &backend::Status, json: bool, one_line: bool) {
    if json {
        let _ = writeln!(out, "{}", json_text(&status_object(name, st)));
    } else {
        let name = printable(name);
        let waiting = match (st.waiters, st.superseding) {
            (Some(n), Some(s)) if n > 0 && s > 0 => {
                format!("; {n} waiting ({s} with --supersede)")
            }
            (Some(n), _) if n > 0 => format!("; {n} waiting"),
            _ => String::new(),
        };
        match st.holders.as_slice() {
            [] => {
                let _ = writeln!(out, "{name}: free{waiting}");
            }
            [h] if h.revoked && h.mode == Mode::Exclusive => {
                let _ = writeln!(
                    out,
                    "{name}: revoked by release --force, free {} ({}){waiting}",
                    // A ZooKeeper session does not say how long it has left.
                    h.ttl_left
                        .map(|l| format!("in {}", human(l)))
                        .unwrap_or_else(|| "when its lease ends".into()),
                    describe_holder(&Holder {
                        revoked: false,
                        ..h.clone()
                    })
                );
            }
            [h] if h.mode == Mode::Exclusive => {
                let _ = writeln!(out, "{name}: {}{waiting}", describe_holder(h));
            }
            hs => {
                let each: Vec<String> = hs
                    .iter()
                    .map(|h| {
                        let slot = h.slot.map(|s| format!("slot {s}: ")).unwrap_or_default();
                        format!("{slot}{}", describe_holder(h))
                    })
                    .collect();
                let head = format!(
                    "{name}: {} holder{} ({}){waiting}",
                    hs.len(),
                    if hs.len() == 1 { "" } else { "s" },
                    Mode::name(hs[0].mode)
                );
                if one_line {
                    let _ = writeln!(out, "{head}: {}", each.join("; "));
                } else {
                    let _ = writeln!(out, "{head}");
                    for line in each {
                        let _ = writeln!(out, "  {line}");
                    }
                }
            }
        }
    }
}

/// How far `status` without a name goes; beyond either bound it says the
/// list is incomplete rather than keep an operator waiting.
const LIST_NAMES: usize = 100_000;
const LIST_TIME: Duration = Duration::from_secs(20);

pub fn status_all(cli: &Cli, json: bool) -> Result<Ending, Failure> {
    let common = config::common(&cli.backend)?;
    setup_logging(&common);
    let mut engine = open_engine(&common)?;
    let bound = backend::ListBound {
        names: LIST_NAMES,
        until: Boot::now().add(LIST_TIME),
    };
    // The engine stops itself at the bound; this only catches a server
    // that stops answering in the middle.
    let listing = backend::bounded("listing every name", LIST_TIME + op_budget(), move || {
        engine.list(bound)
    })?;
    let mut out = std::io::stdout().lock();
    // Names read and names that could not be, in one sorted list.
    let mut rows: Vec<(&str, Result<&backend::Status, &str>)> = listing
        .names
        .iter()
        .map(|(n, st)| (n.as_str(), Ok(st)))
        .chain(
            listing
                .unreadable
                .iter()
                .map(|(n, why)| (n.as_str(), Err(why.as_str()))),
        )
        .collect();
    rows.sort_by(|a, b| a.0.cmp(b.0));
    if json {
        let all: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, row)| match row {
                Ok(st) => status_object(name, st),
                Err(why) => serde_json::json!({
                    "name": name,
                    "held": null,
                    "unreadable": why,
                }),
            })
            .collect();
        let _ = writeln!(out, "{}", json_text(&serde_json::Value::Array(all)));
    } else {
        for (name, row) in &rows {
            match row {
                Ok(st) => show_status(&mut out, name, st, false, true),
                Err(why) => {
                    let _ = writeln!(
                        out,
                        "{}: cannot be read by this identity: {}",
                        printable(name),
                        printable(why)
                    );
                }
            }
        }
    }
    let _ = out.flush();
    if common.verbosity >= 1 {
        let mut err = std::io::stderr();
        for note in &listing.notes {
            let _ = writeln!(err, "lockrun: {}", printable(note));
        }
    }
    let any_held = listing.names.iter().any(|(_, st)| !st.holders.is_empty());
    Ok(Ending::Exit(if any_held {
        exit::STATUS_HELD
    } else {
        exit::STATUS_FREE
    }))
}
