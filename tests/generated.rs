//! The committed completions and man page match what the binary generates.
//! Set LOCKRUN_REGENERATE=1 to rewrite them.

use std::path::Path;

use crate::support::*;

const FILES: [(&str, &str); 6] = [
    ("man", "man/lockrun.1"),
    ("bash", "completions/lockrun.bash"),
    ("zsh", "completions/_lockrun"),
    ("fish", "completions/lockrun.fish"),
    ("elvish", "completions/lockrun.elv"),
    ("powershell", "completions/_lockrun.ps1"),
];

#[test]
fn completions_and_man_page_are_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rewrite = std::env::var_os("LOCKRUN_REGENERATE").is_some();
    let mut stale = Vec::new();
    for (kind, file) in FILES {
        let out = run(lockrun().args(["--generate", kind]));
        assert_eq!(out.status.code(), Some(0), "{kind}: {}", text(&out.stderr));
        assert!(!out.stdout.is_empty(), "{kind}: empty output");
        let path = root.join(file);
        if rewrite {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &out.stdout).unwrap();
        } else if std::fs::read(&path).ok().as_deref() != Some(&out.stdout[..]) {
            stale.push(file);
        }
    }
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run `LOCKRUN_REGENERATE=1 cargo test generated` and commit"
    );
}

/// The manual's pages under `man/`.
fn pages() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("man");
    let mut pages: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "1" || x == "7"))
        .collect();
    pages.sort();
    pages
}

/// Every page renders without a single groff warning, carries this build's
/// version, and has the sections a reader looks for; `apropos lockrun`
/// finds each by its NAME line.
#[test]
fn every_page_is_clean_groff() {
    let pages = pages();
    let names: Vec<String> = pages
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in ["lockrun.1", "lockrun-engines.7", "lockrun-safety.7"] {
        assert!(names.iter().any(|n| n == want), "man/{want} is missing");
    }
    for page in &pages {
        let shown = page.display();
        let out = std::process::Command::new("groff")
            .args(["-t", "-ww", "-z", "-man", "-Tutf8"])
            .arg(page)
            .output()
            .unwrap_or_else(|_| {
                panic!("groff not found: this test needs it (apt-get install -y groff-base)")
            });
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{shown}: {}",
            text(&out.stderr)
        );
        let src = std::fs::read_to_string(page).unwrap();
        let th = src.lines().find(|l| l.starts_with(".TH ")).expect(".TH");
        assert!(
            th.contains(&format!("\"lockrun {}\"", env!("CARGO_PKG_VERSION"))),
            "{shown}: {th} does not name this version"
        );
        for section in [".SH NAME", ".SH DESCRIPTION", ".SH SEE ALSO"] {
            assert!(src.contains(section), "{shown}: no {section}");
        }
        let name = src
            .lines()
            .skip_while(|l| *l != ".SH NAME")
            .nth(1)
            .unwrap_or("");
        assert!(
            name.starts_with("lockrun") && name.contains(" \\- "),
            "{shown}: NAME line {name:?} is not `lockrun… \\- what`"
        );
        // Every page this one refers to is shipped.
        for (at, _) in src.match_indices("lockrun\\-") {
            let rest = &src[at + "lockrun\\-".len()..];
            let Some(end) = rest.find(|c: char| !c.is_ascii_lowercase()) else {
                continue;
            };
            let (word, after) = rest.split_at(end);
            let section = after
                .strip_prefix("\\fR(")
                .or_else(|| after.strip_prefix(" ("))
                .or_else(|| after.strip_prefix('('));
            if let Some(sec) = section.and_then(|s| s.chars().next()) {
                let file = format!("lockrun-{word}.{sec}");
                assert!(
                    names.contains(&file),
                    "{shown} refers to {file}, which is not shipped"
                );
            }
        }
    }
    let main = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("man/lockrun.1"))
        .unwrap();
    for section in [
        ".SH SYNOPSIS",
        ".SH OPTIONS",
        ".SH COMMANDS",
        ".SH EXIT STATUS",
        ".SH TROUBLESHOOTING",
        ".SH ENVIRONMENT",
        ".SH FILES",
        ".SH EXAMPLES",
    ] {
        assert!(main.contains(section), "lockrun.1: no {section}");
    }
}

/// What the committed bash completion offers for `lockrun WORDS…` (the
/// last word is the one being completed), run in a real bash.
fn bash_offers(words: &[&str]) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("completions/lockrun.bash");
    let out = std::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c"])
        .arg(
            r#"source "$0" || exit 9
            COMP_WORDS=(lockrun "$@")
            COMP_CWORD=$#
            COMP_LINE="${COMP_WORDS[*]}"
            COMP_POINT=${#COMP_LINE}
            _lockrun lockrun "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
            printf '%s\n' "${COMPREPLY[@]}""#,
        )
        .arg(&script)
        .args(words)
        .output()
        .expect("bash");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{words:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout).lines().map(str::to_string).collect()
}

/// The bash completion offers what lockrun takes and shows in --help: not
/// the packagers' hidden --generate, and after `help` every command,
/// `list` too.
#[test]
fn bash_completion_offers_the_commands_and_visible_options() {
    let help = text(&run(lockrun().arg("--help")).stdout);
    let options = bash_offers(&["--"]);
    for want in ["--ttl", "--wait", "--url", "--min-hold", "--nb", "--help"] {
        assert!(options.iter().any(|o| o == want), "{want}: {options:?}");
    }
    for option in &options {
        assert!(
            help.contains(option.as_str()),
            "`lockrun --<TAB>` offers {option}, which --help does not show"
        );
    }
    let first = bash_offers(&[""]);
    let commands: Vec<String> = first.into_iter().filter(|w| !w.starts_with('-')).collect();
    assert_eq!(
        commands,
        ["status", "list", "release", "doctor", "help"],
        "`lockrun <TAB>`"
    );
    assert_eq!(bash_offers(&["help", ""]), commands, "`lockrun help <TAB>`");
    assert_eq!(
        bash_offers(&["help", "l"]),
        ["list"],
        "`lockrun help l<TAB>`"
    );
    // What follows `help list` is completed as after `help status`.
    assert_eq!(
        bash_offers(&["help", "list", ""]),
        bash_offers(&["help", "status", ""])
    );
    // No shell is offered the hidden flag.
    for (kind, file) in FILES.iter().skip(1) {
        let body =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        assert!(
            !body.contains("generate"),
            "{kind}: {file} offers --generate"
        );
    }
}
