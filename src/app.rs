//! The three commands, each a straight line: config → backend → supervise →
//! release → exit code. `main` only parses and prints.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::CommandFactory;

use crate::backend::Wait;
use crate::backend::{self, Acquired, Broken, Force, Holder, Mode, Owner, Request};
use crate::cli::{Cli, Generate, OperatorCommand};
use crate::clock::Boot;
use crate::config::{self, Common};
use crate::exit::{self, Class, Failure, JobEnd, ResultExt, fail};
use crate::log;
use crate::metrics;
use crate::supervise::{self, Job};
use crate::watchdog::Deadline;

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
        return generate(kind).map(|()| Ending::Exit(0));
    }
    match &cli.subcommand {
        Some(OperatorCommand::Status {
            json,
            name: Some(name),
        }) => status(&cli, name, *json),
        // ---- operators: status of every name, doctor ----
        Some(OperatorCommand::Status { json, name: None }) => status_all(&cli, *json),
        Some(OperatorCommand::Doctor {}) => doctor(&cli),
        // ---- end of status of every name, doctor ----
        Some(OperatorCommand::Release {
            force,
            token,
            now,
            name,
        }) => release(&cli, name, *force, token.as_deref(), *now),
        None => run_job(&cli),
    }
}

fn setup_logging(common: &Common) {
    log::set_level(common.verbosity);
    // The job runs as the same user: it must not read a password from our
    // memory or /proc/PID/environ, nor reopen our descriptors through
    // /proc/PID/fd, whatever the URL (README "How lockrun treats your job").
    crate::sys::set_dumpable(false);
    if let Some(p) = common.address.secret() {
        log::add_secret(p);
    }
}

// ---- metrics for cron: every run's end is written down ----
fn run_job(cli: &Cli) -> Result<Ending, Failure> {
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
// ---- end of metrics for cron ----

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
    };
    let expires = cfg.common.address.engine().expires;

    let mut engine = cfg
        .common
        .address
        .open(&opening(&cfg.common, cfg.timing.op))?;
    let lease = loop {
        match engine.acquire(&req, cfg.wait)? {
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
            Acquired::Granted(l) => break l,
            Acquired::Busy { holder } => {
                let holder = holder
                    .as_deref()
                    .unwrap_or("another process (no holder recorded)");
                match cfg.wait {
                    // Cron mails every line: a skipped run stays silent.
                    Wait::No => {
                        log::info(format!("not acquired: {} is held by {holder}", cfg.name))
                    }
                    Wait::For(d) => log::warn(format!(
                        "gave up waiting for {} after {}: held by {holder}",
                        cfg.name,
                        human(d)
                    )),
                    Wait::Forever => {}
                }
                return Ok(Ending::Exit(cfg.conflict_code));
            }
        }
    };
    drop(engine);
    report.granted(lease.token);

    let deadline = expires.then(|| {
        Arc::new(Deadline::new(
            cfg.timing.deadline_for(lease.sent_at, lease.ttl),
        ))
    });
    // A password must never reach the job, even through an inherited
    // LOCKRUN_URL that another --url overrode.
    let password_in_effect = cfg.common.address.secret().is_some();
    let secret = password_in_effect || config::inherited_url_has_password();
    let env = lease.job_env(&req, secret);
    let mut env_remove = env.remove;
    // The metrics file is this run's: a lockrun inside the job writes its own.
    env_remove.push("LOCKRUN_METRICS_FILE".into());
    if let Some(var) = cfg.common.address.secret_env() {
        env_remove.push(var.to_string());
    }
    let job = Job {
        command: cfg.command.clone(),
        env: env.set,
        env_remove,
        inherit_fd: env.inherit_fd,
        timing: cfg.timing,
        sent_at: lease.sent_at,
        secret,
    };

    let renewer = lease.renewer();
    let mut pending = backend::Pending::Here(lease);
    let releasing = format!("releasing {}", cfg.name);
    // Once the job runs (and never before: the guard is forked from a
    // process with one thread), a thread waits to release the lease.
    let outcome = supervise::supervise_job(job, deadline, renewer, || pending.start_thread());
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
    if let Some(reason) = outcome.lost {
        report.lost = true;
        log::alert(format!(
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
            "{e}; the lease expires on its own within {}",
            humantime::format_duration(cfg.timing.ttl)
        )),
    }
    Ok(match outcome.end {
        Some(JobEnd::Signaled(sig)) if sig == libc::SIGINT => Ending::Raise(sig),
        Some(end) => Ending::Exit(end.code()),
        None => Ending::Exit(exit::INTERNAL),
    })
}

fn millis(d: Option<Duration>) -> serde_json::Value {
    d.map_or(serde_json::Value::Null, |d| (d.as_millis() as u64).into())
}

fn human(d: Duration) -> String {
    // Whole milliseconds read better than nanoseconds at 3 a.m.
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

// --min-hold (README "Once per window"): how status shows a window.
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
// End of --min-hold.

fn describe_holder(h: &Holder) -> String {
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
    })
}

/// No lease of our own: the default ttl's bound on one request will do.
fn op_budget() -> Duration {
    crate::schedule::Timing::new(Duration::from_secs(30), None)
        .map(|t| t.op)
        .unwrap_or(Duration::from_secs(2))
}

fn opening(common: &Common, op: Duration) -> backend::Opening {
    backend::Opening {
        prefix: common.prefix.clone(),
        op,
        check_settings: common.verbosity >= 2,
    }
}

fn open_engine(common: &Common) -> Result<Box<dyn backend::Engine>, Failure> {
    Ok(common.address.open(&opening(common, op_budget()))?)
}

fn status(cli: &Cli, name: &str, json: bool) -> Result<Ending, Failure> {
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
        "holders": st.holders.iter().map(holder_json).collect::<Vec<_>>(),
        "waiters": st.waiters,
    })
}

/// One name's status as text (`one_line`: several holders on the name's
/// line, as `status` without a name shows them), or as its JSON object.
/// Text as one line of output: a name or label found on a server or in a
/// shared directory may hold control characters (a newline would forge a
/// line of its own) or invisible ones (a right-to-left override makes two
/// names look alike); both are shown escaped.
fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let hidden = |c: char| c.is_control() || config::is_invisible(c);
    if s.chars().any(hidden) {
        let mut out = String::with_capacity(s.len() + 8);
        for c in s.chars() {
            if hidden(c) {
                out.extend(c.escape_debug());
            } else {
                out.push(c);
            }
        }
        std::borrow::Cow::Owned(out)
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// JSON as one line, with invisible characters escaped as `\uXXXX` (the
/// same string to a parser, but not to an eye reading `jq`'s raw output
/// or the line itself). They can only stand inside strings.
fn json_text(v: &serde_json::Value) -> String {
    let text = v.to_string();
    if !text.chars().any(config::is_invisible) {
        return text;
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if config::is_invisible(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

fn show_status(out: &mut dyn Write, name: &str, st: &backend::Status, json: bool, one_line: bool) {
    if json {
        let _ = writeln!(out, "{}", json_text(&status_object(name, st)));
    } else {
        let name = printable(name);
        let waiting = match st.waiters {
            Some(n) if n > 0 => format!("; {n} waiting"),
            _ => String::new(),
        };
        match st.holders.as_slice() {
            [] => {
                let _ = writeln!(out, "{name}: free{waiting}");
            }
            [h] if h.revoked && h.mode == Mode::Exclusive => {
                let _ = writeln!(
                    out,
                    "{name}: revoked by release --force, free in {} ({}){waiting}",
                    h.ttl_left.map(human).unwrap_or_else(|| "?".into()),
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

// ---- operators: status of every name, doctor (README "Operate") ----

/// How far `status` without a name goes; beyond either bound it says the
/// list is incomplete rather than keep an operator waiting.
const LIST_NAMES: usize = 100_000;
const LIST_TIME: Duration = Duration::from_secs(20);

fn status_all(cli: &Cli, json: bool) -> Result<Ending, Failure> {
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
    if json {
        let all: Vec<serde_json::Value> = listing
            .names
            .iter()
            .map(|(name, st)| status_object(name, st))
            .collect();
        let _ = writeln!(out, "{}", json_text(&serde_json::Value::Array(all)));
    } else {
        for (name, st) in &listing.names {
            show_status(&mut out, name, st, false, true);
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

/// Every check together: past this, doctor says which engine did not answer.
const DOCTOR_TIME: Duration = Duration::from_secs(30);

fn doctor(cli: &Cli) -> Result<Ending, Failure> {
    let common = config::common(&cli.backend)?;
    setup_logging(&common);
    let how = opening(&common, op_budget());
    let address = common.address.clone();
    let shown = address.shown();
    let checks = backend::bounded(&format!("checking {shown}"), DOCTOR_TIME, move || {
        Ok(address.doctor(&how))
    })?;
    let mut out = std::io::stdout().lock();
    for c in &checks {
        let line = format!("{:<4}  {}: {}", c.verdict.word(), c.topic, c.said);
        let _ = writeln!(out, "{}", log::scrub(&line));
    }
    let worst = checks.iter().map(|c| c.verdict).max();
    Ok(Ending::Exit(match worst {
        Some(backend::Verdict::Fail) => exit::UNAVAILABLE,
        Some(backend::Verdict::Warn) => exit::DOCTOR_WARNED,
        _ => 0,
    }))
}

// ---- end of status of every name, doctor ----

fn release(
    cli: &Cli,
    name: &str,
    force: bool,
    token: Option<&str>,
    now: bool,
) -> Result<Ending, Failure> {
    let common = config::common(&cli.backend)?;
    config::check_name(name, &*common.address)?;
    if !force && !common.address.engine().expires {
        // A flock lasts as long as its holder: --force only ends a window.
        return Err(fail(
            Class::Usage,
            format!(
                "refusing to break a lock without --force; on the {} engine --force ends \
                 only a --min-hold window (a running holder's lock ends with its process)",
                common.address.engine().name
            ),
        ));
    }
    if !force {
        return Err(fail(
            Class::Usage,
            "refusing to break a lock without --force: the holder's job is stopped \
             (exit 76); add --force, and --token T to act only on the lease you looked at",
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
    let mut err = std::io::stderr();
    match broken {
        Broken::NotHeld => {
            let _ = writeln!(err, "lockrun: {name} is not held; nothing to break");
            Ok(Ending::Exit(exit::STATUS_FREE))
        }
        Broken::AlreadyRevoked => {
            let _ = writeln!(
                err,
                "lockrun: {name} was already revoked; it comes free when the old lease ends"
            );
            Ok(Ending::Exit(exit::STATUS_FREE))
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
            Ok(Ending::Exit(exit::STATUS_FREE))
        }
        Broken::Leases(holders) => {
            let mut out = std::io::stdout();
            for h in holders {
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
                    continue;
                }
                let what = if now {
                    "deleted; a waiter may start now, while the old job may still be stopping"
                        .to_string()
                } else {
                    format!(
                        "revoked; its job stops at its next renewal, new grants wait {} until the old lease ends",
                        h.ttl_left
                            .map(human)
                            .unwrap_or_else(|| "until it expires".into())
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
            Ok(Ending::Exit(0))
        }
    }
}

/// The man page: clap's sections, then the subcommands, exit status and
/// environment written here (one page; there are no lockrun-status(1) pages).
fn man_page(cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd);
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    out.write_all(MAN_TAIL.as_bytes())?;
    out.write_all(crate::exit::roff().as_bytes())?;
    out.write_all(MAN_ENV.as_bytes())?;
    man.render_version_section(out)
}

const MAN_TAIL: &str = r#".SH COMMANDS
.TP
\fBlockrun status\fR [\fB\-\-json\fR] \fINAME\fR
Show whether NAME is held: every holder (host:pid and \fB\-\-label\fR, token, slot, mode, time left, held for) and the number of waiting requests; says when a holder's lockrun no longer runs on this host, and when a lease is held by \fB\-\-min\-hold\fR after its job ended (no job running, until when). Exit 0 held, 1 free, 69 unreachable.
.TP
\fBlockrun status\fR [\fB\-\-json\fR], \fBlockrun list\fR [\fB\-\-json\fR]
Every name under the prefix, one line each, sorted (\fB\-\-json\fR: an array of the objects \fBstatus \-\-json\fR \fINAME\fR prints). Read name by name (Redis: SCAN, never KEYS), not as one snapshot (PostgreSQL: one statement over its tables, a snapshot), within bounds of names and time; never disturbs a lock. Exit 0 when any is held, 1 when none, 64 on an engine that cannot list, 69 unreachable.
.TP
\fBlockrun doctor\fR [\fB\-\-url\fR \fIURL\fR]
Read-only checks of an engine, one line each: \fBok\fR, \fBwarn\fR or \fBfail\fR and what to do (Redis, each master of a cluster on its own: round trip, version, maxmemory-policy, persistence, replicas, the user's permissions, clock; local: the directory's owner, mode, link, file system; etcd: round trip, version, leader, permissions; PostgreSQL: round trip, clock, version, standby, a transaction pooler, isolation and timeouts, standbys, lockrun's tables and the role's rights on them or to create them). It writes no key, file, directory, table or schema. Exit 0 all ok, 1 a warning, 69 unreachable or a failure.
.TP
\fBlockrun release \-\-force\fR [\fB\-\-token\fR \fIT\fR] [\fB\-\-now\fR] \fINAME\fR
Break a lease (operators), on the engines that can (README \(lqBackends\(rq). By default the holder is revoked: its job is stopped at its next renewal and new grants wait until the old lease would have expired. \fB\-\-now\fR deletes at once (unsafe without fencing); \fB\-\-token\fR acts only on the holder with that token, else every holder is broken. A lease kept by \fB\-\-min\-hold\fR after its job ended runs no job: it is ended at once, on every engine, the local one included. Exit 0 broken, 1 not held, already revoked or token mismatch, 64 not supported by the engine (a running local lock), 69 unreachable.
"#;

/// The man page after EXIT STATUS.
const MAN_ENV: &str = r#".SH ENVIRONMENT
.TP
\fBLOCKRUN_URL\fR, \fBLOCKRUN_TTL\fR, \fBLOCKRUN_PREFIX\fR, \fBLOCKRUN_TLS_CA\fR, \fBLOCKRUN_LABEL\fR, \fBLOCKRUN_METRICS_FILE\fR
Defaults for \fB\-\-url\fR, \fB\-\-ttl\fR, \fB\-\-prefix\fR, \fB\-\-tls\-ca\fR, \fB\-\-label\fR and \fB\-\-metrics\-file\fR (not passed on to the job). A setting only one engine uses is ignored by the others. Give a password through LOCKRUN_URL rather than \fB\-\-url\fR: the command line is visible to every user.
.PP
The job sees, set over its inherited environment:
.TP
\fBLOCKRUN_NAME\fR
The lock's name.
.TP
\fBLOCKRUN_TOKEN\fR
The fencing token, decimal, strictly increasing with every grant of the name.
.TP
\fBLOCKRUN_OWNER\fR
host:pid of the lockrun that holds the lease.
.TP
\fBLOCKRUN_TTL_MS\fR
The lease length in milliseconds.
.TP
\fBLOCKRUN_SLOT\fR
With \fB\-\-limit\fR N: the slot held, 0 to N\-1, unique among the holders of the moment.
.TP
\fBLOCKRUN_LOCK_FD\fR
The locked descriptor it inherited (local backend only).
.PP
A LOCKRUN_URL that carries a password is removed from the job's environment.
"#;

fn generate(kind: Generate) -> Result<(), Failure> {
    use clap_complete::Shell;
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    let shell = match kind {
        Generate::Man => return man_page(cmd, &mut out).exit_as(Class::Internal),
        Generate::Bash => Shell::Bash,
        Generate::Zsh => Shell::Zsh,
        Generate::Fish => Shell::Fish,
        Generate::Elvish => Shell::Elvish,
        Generate::Powershell => Shell::PowerShell,
    };
    clap_complete::generate(shell, &mut cmd, "lockrun", &mut out);
    Ok(())
}
