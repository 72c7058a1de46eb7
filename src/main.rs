//! lockrun: run a job while holding a named lease (Redis or a local flock).
//! `main` parses, runs, prints the error chain once and exits with its code.

// lockrun starts once per job, so its start-up is part of every job's cost.
// std's runtime start-up reads /proc/self/maps to find the main thread's
// stack and installs a stack-overflow handler (about 0.1 ms here); lockrun
// uses the C entry point instead and does the one part it needs itself.
#![cfg_attr(not(test), no_main)]

mod app;
mod backend;
mod cli;
mod clock;
mod config;
mod exit;
mod log;
mod metrics;
mod schedule;
mod spawn;
mod supervise;
mod sys;
mod text;
mod watchdog;

use std::io::Write;

/// The C entry point (std's `main` is not used, see above). std still gets
/// the arguments and environment on glibc, through its own init hook.
#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // What std's start-up would have done: descriptors 0–2 open (on /dev/null
    // if they were closed, before lockrun opens anything of its own), and
    // SIGPIPE ignored so a closed stdout gives an error instead of killing
    // lockrun; whether it was ignored before is kept for the job.
    sys::open_std_fds();
    sys::one_malloc_arena();
    supervise::ignore_sigpipe();
    let code = lockrun();
    let _ = std::io::stdout().flush();
    // No C library teardown to run: lockrun registers none, and its
    // writes (the loader's finalisers) would copy pages a guard still
    // shares. Everything of lockrun's own is flushed above or by now.
    sys::exit_now(libc::c_int::from(code))
}

// Unit-test builds have the harness's entry point, not ours.
#[cfg_attr(test, allow(dead_code))]
fn lockrun() -> u8 {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(msg) = cli::foreign_spelling(&args[1..]) {
        let _ = writeln!(std::io::stderr(), "lockrun: {msg}");
        return exit::USAGE;
    }
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match app::dispatch(cli) {
        Ok(app::Ending::Exit(code)) => code,
        Ok(app::Ending::Raise(sig)) => {
            let _ = std::io::stdout().flush();
            // SAFETY: restoring the default action and raising a signal on ourselves.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
            // Only reached if the signal did not end us.
            exit::JobEnd::Signaled(sig).code()
        }
        Err(f) => {
            let _ = writeln!(
                std::io::stderr(),
                "lockrun: {}",
                log::printable(&f.to_string())
            );
            f.class.code()
        }
    }
}

/// Parse the command line, noting which settings came from the environment.
fn parse() -> Result<cli::Cli, clap::Error> {
    use clap::error::ErrorKind;
    use clap::{ArgMatches, FromArgMatches, parser::ValueSource};
    // The texts built from tables are needed only to be shown: help and
    // version are asked for again with them.
    let mut matches = match cli::command(false).try_get_matches() {
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            cli::command(true).try_get_matches()?
        }
        other => other?,
    };
    let from_env = |m: &ArgMatches, id| m.value_source(id) == Some(ValueSource::EnvVariable);
    let generate = matches.get_one::<cli::Generate>("generate").copied();
    let url = from_env(&matches, "url");
    let tls_ca = from_env(&matches, "tls_ca");
    let replicas = from_env(&matches, "replicas");
    let prefix = from_env(&matches, "prefix");
    let max_waiters = from_env(&matches, "max_waiters");
    // Taken out of the matches: `from_arg_matches` would copy them all first.
    let mut cli = cli::Cli::from_arg_matches_mut(&mut matches)?;
    cli.generate = generate;
    cli.backend.url_from_env = url;
    cli.backend.tls_ca_from_env = tls_ca;
    cli.backend.replicas_from_env = replicas;
    cli.backend.prefix_from_env = prefix;
    cli.run.max_waiters_from_env = max_waiters;
    Ok(cli)
}

/// clap's help and version go to stdout with 0; a usage error is one line and 64,
/// built from clap's error kind and context rather than its rendered text.
fn usage_error(e: clap::Error) -> u8 {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return 0;
    }
    let context = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(v)) => Some(v.join(", ")),
        _ => None,
    };
    let arg = context(ContextKind::InvalidArg);
    let line = match (e.kind(), arg) {
        (ErrorKind::MissingRequiredArgument, Some(a)) => format!("missing {a}"),
        (ErrorKind::UnknownArgument, Some(a)) => match context(ContextKind::SuggestedArg) {
            Some(s) => format!("unknown option {a} (did you mean {s}?)"),
            None => format!("unknown option {a}"),
        },
        (ErrorKind::ArgumentConflict, Some(a)) => match context(ContextKind::PriorArg) {
            Some(p) => format!("{a} cannot be used with {p}"),
            None => format!("{a} cannot be used with another option given"),
        },
        (ErrorKind::InvalidValue | ErrorKind::ValueValidation, Some(a)) => {
            match context(ContextKind::InvalidValue).filter(|v| !v.is_empty()) {
                Some(v) => format!("invalid value {v:?} for {a}"),
                None => format!("{a} needs a value"),
            }
        }
        (ErrorKind::InvalidSubcommand, _) => match context(ContextKind::InvalidSubcommand) {
            Some(s) => format!("unknown command {s}"),
            None => e.kind().to_string(),
        },
        (kind, Some(a)) => format!("{kind}: {a}"),
        (kind, None) => kind.to_string(),
    };
    let _ = writeln!(
        std::io::stderr(),
        "lockrun: {}; see lockrun --help",
        log::printable(&line)
    );
    exit::USAGE
}
