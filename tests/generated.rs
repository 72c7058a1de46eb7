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

/// The man page renders without a single groff warning, and has the
/// sections a man page reader looks for.
#[test]
fn the_man_page_is_clean_groff() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("groff")
        .args(["-ww", "-z", "-man"])
        .arg(root.join("man/lockrun.1"))
        .output()
        .unwrap_or_else(|_| {
            panic!("groff not found: this test needs it (apt-get install -y groff-base)")
        });
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        text(&out.stderr)
    );
    let page = std::fs::read_to_string(root.join("man/lockrun.1")).unwrap();
    for section in [".SH EXIT STATUS", ".SH ENVIRONMENT", ".SH COMMANDS"] {
        assert!(page.contains(section), "no {section}");
    }
    assert!(
        !page.contains("lockrun-status(1)"),
        "refers to a page that is not shipped"
    );
}
