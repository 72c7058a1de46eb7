//! lockrun(1) and the shell completions, generated from the command line's
//! definition and the written page beside this file (`--generate`),
//! committed under `man/` and `completions/`.

use std::io::Write;

use crate::cli::Generate;
use crate::exit::{Class, Failure, ResultExt};

/// lockrun(1): the written page, with the synopsis and options rendered
/// from the command line's definition (as clap shows them in `--help`) and
/// the exit status and each command's exit codes from their tables, so
/// none can drift from the binary.
fn man_page(cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(cmd);
    let mut synopsis = Vec::new();
    man.render_synopsis_section(&mut synopsis)?;
    let mut options = Vec::new();
    man.render_options_section(&mut options)?;
    let mut page = PAGE
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"))
        .replace("@SYNOPSIS@\n", &String::from_utf8_lossy(&synopsis))
        .replace("@OPTIONS@\n", &String::from_utf8_lossy(&options))
        .replace("@EXIT_STATUS@\n", &crate::exit::roff());
    for codes in crate::exit::COMMAND_CODES {
        page = page.replace(&codes.placeholder(), &codes.roff());
    }
    out.write_all(page.as_bytes())
}

/// Everything of lockrun(1) that is written rather than generated.
const PAGE: &str = include_str!("lockrun.1.in");

/// What the completions are made from: the command line, with `list`
/// offered after `help` too (`lockrun help list` works, but clap's own
/// `help` command lists names only, not aliases).
fn completed() -> clap::Command {
    let mut cmd = crate::cli::documented();
    cmd.build();
    // mut_subcommands, not mut_subcommand: the commands keep their order.
    cmd.mut_subcommands(|help| match help.get_name() {
        "help" => help.mut_subcommands(|status| match status.get_name() {
            "status" => status.visible_alias(crate::cli::LIST),
            _ => status,
        }),
        _ => help,
    })
}

pub fn generate(kind: Generate) -> Result<(), Failure> {
    use clap_complete::Shell;
    let mut cmd = completed();
    let mut out = std::io::stdout().lock();
    let shell = match kind {
        Generate::Man => {
            return man_page(crate::cli::documented(), &mut out).exit_as(Class::Internal);
        }
        Generate::Bash => Shell::Bash,
        Generate::Zsh => Shell::Zsh,
        Generate::Fish => Shell::Fish,
        Generate::Elvish => Shell::Elvish,
        Generate::Powershell => Shell::PowerShell,
    };
    clap_complete::generate(shell, &mut cmd, "lockrun", &mut out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every placeholder of the written page is filled in.
    #[test]
    fn no_placeholder_is_left() {
        let mut page = Vec::new();
        man_page(crate::cli::documented(), &mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        let left: Vec<&str> = page
            .lines()
            .filter(|l| l.len() > 2 && l.starts_with('@') && l.ends_with('@'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert!(!page.contains("@VERSION@"));
    }
}
