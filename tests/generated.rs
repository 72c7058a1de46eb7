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
