//! lockrun: run a job while holding a named lease (Redis or a local flock).
//! `main` parses, runs, prints the error chain once and exits with its code.

mod app;
mod backend;
mod cli;
mod config;
mod exit;
mod lease;
mod log;
mod spawn;
mod supervise;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match app::run(cli) {
        Ok(app::Finish::Exit(code)) => ExitCode::from(code),
        Ok(app::Finish::Raise(sig)) => {
            let _ = std::io::stdout().flush();
            // SAFETY: restoring the default action and raising a signal on ourselves.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
            // Only reached if the signal did not end us.
            ExitCode::from(exit::JobEnd::Signaled(sig).code())
        }
        Err(f) => {
            let _ = writeln!(std::io::stderr(), "lockrun: {}", log::scrub(&f.to_string()));
            ExitCode::from(f.kind.code())
        }
    }
}

/// clap's help and version go to stdout with 0; a usage error is one line and 64.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut first = lines
        .next()
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        .to_string();
    // "the following required arguments were not provided:" names them on the next line.
    if first.ends_with(':')
        && let Some(next) = lines.next()
    {
        first = format!("{first} {next}");
    }
    let _ = writeln!(
        std::io::stderr(),
        "lockrun: {}; see lockrun --help",
        log::scrub(&first)
    );
    ExitCode::from(exit::USAGE)
}
