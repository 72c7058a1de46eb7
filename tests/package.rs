//! The Debian package (`cargo deb`, metadata in Cargo.toml) holds the binary
//! under test, every man page, the completions, the README, the changelog
//! and the copyright, where Debian's tools look for them, and lintian finds
//! nothing wrong with it. The binary is packaged as built for the
//! tests, never built again: the release build takes minutes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::*;

/// Where each committed completion is installed.
const COMPLETIONS: [(&str, &str); 3] = [
    (
        "completions/lockrun.bash",
        "usr/share/bash-completion/completions/lockrun",
    ),
    (
        "completions/_lockrun",
        "usr/share/zsh/vendor-completions/_lockrun",
    ),
    (
        "completions/lockrun.fish",
        "usr/share/fish/vendor_completions.d/lockrun.fish",
    ),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Run a tool the test needs, or fail naming how to install it.
fn tool(cmd: &mut Command, install: &str) -> Output {
    let name = cmd.get_program().to_string_lossy().into_owned();
    cmd.output()
        .unwrap_or_else(|e| panic!("{name} not found ({e}): this test needs it ({install})"))
}

/// `cmd` ran and exited 0; its stdout.
#[track_caller]
fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Package the binary under test with `cargo deb --no-build`. cargo-deb
/// takes the release binary from `$CARGO_TARGET_DIR/release/`, so that
/// directory is a scratch one holding a link to the binary under test
/// (no build, and parallel runs never share it). With `strip`, cargo-deb
/// strips a copy of it, as `cargo deb` does for a user; without, the
/// package holds the binary under test itself. Returns the .deb and the
/// directory holding it.
fn build_deb(strip: bool) -> (PathBuf, tempfile::TempDir) {
    let version = tool(
        Command::new(env!("CARGO")).args(["deb", "--version"]),
        "cargo install cargo-deb --locked",
    );
    assert!(
        version.status.success(),
        "cargo-deb not found: this test needs it (cargo install cargo-deb --locked)\n{}",
        text(&version.stderr)
    );
    let target = tempfile::Builder::new()
        .prefix("deb-target")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let release = target.path().join("release");
    std::fs::create_dir(&release).unwrap();
    let bin = release.join("lockrun");
    if std::fs::hard_link(BIN, &bin).is_err() {
        std::fs::copy(BIN, &bin).unwrap();
    }
    let out_dir = tempfile::tempdir().unwrap();
    ok(
        tool(
            Command::new(env!("CARGO"))
                .args(["deb", "--no-build", "--no-dbgsym"])
                .arg(if strip { "--strip" } else { "--no-strip" })
                .args(["--no-separate-debug-symbols", "--fast", "--output"])
                .arg(out_dir.path())
                .arg("--manifest-path")
                .arg(root().join("Cargo.toml"))
                .env("CARGO_TARGET_DIR", target.path()),
            "cargo install cargo-deb --locked",
        ),
        "cargo deb",
    );
    let debs: Vec<PathBuf> = std::fs::read_dir(out_dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "cargo deb made {debs:?}");
    (debs[0].clone(), out_dir)
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    ok(
        tool(
            Command::new("dpkg-deb").args(args).arg(deb),
            "apt-get install -y dpkg",
        ),
        "dpkg-deb",
    )
}

/// The committed man pages, as the package installs them (gzipped, by
/// section).
fn man_pages() -> Vec<(PathBuf, String)> {
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(root().join("man")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(section @ ("1" | "7")) = name.rsplit_once('.').map(|(_, s)| s) {
            pages.push((path, format!("usr/share/man/man{section}/{name}.gz")));
        }
    }
    pages.sort();
    pages
}

/// `man -l` renders the page with every groff warning on: the rendered
/// text, failing on any warning.
fn render(page: &Path) -> String {
    let out = tool(
        Command::new("man")
            .args(["--warnings=w", "-l"])
            .arg(page)
            .env("MANWIDTH", "80")
            .env("MANPAGER", "cat")
            .env("LC_ALL", "C.UTF-8"),
        "apt-get install -y man-db",
    );
    let shown = page.display();
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "man -l {shown}: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    let rendered = text(&out.stdout);
    assert!(
        rendered.contains("NAME"),
        "man -l {shown}: no NAME\n{rendered}"
    );
    rendered
}

#[test]
fn the_debian_package_installs_the_binary_man_pages_and_completions() {
    let (deb, _out_dir) = build_deb(false);

    // The control fields.
    let fields = dpkg_deb(&["-f"], &deb);
    for want in [
        "Package: lockrun\n",
        "Section: utils\n",
        "Priority: optional\n",
        &format!("Version: {}-1\n", env!("CARGO_PKG_VERSION")),
        &format!("Description: {}\n", env!("CARGO_PKG_DESCRIPTION")),
    ] {
        assert!(fields.contains(want), "no {want:?} in\n{fields}");
    }
    assert!(fields.contains("Depends: libc6"), "{fields}");
    assert!(
        fields.contains("Maintainer: lockrun developers <lockrun@example.org>\n"),
        "{fields}"
    );

    // Exactly these files, nothing else.
    let listing = dpkg_deb(&["-c"], &deb);
    let files: BTreeSet<String> = listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .map(|l| {
            let path = l.split_whitespace().last().unwrap();
            path.trim_start_matches("./").to_string()
        })
        .collect();
    let pages = man_pages();
    let mut want: BTreeSet<String> = [
        "usr/bin/lockrun",
        "usr/share/doc/lockrun/README.md",
        "usr/share/doc/lockrun/changelog.Debian.gz",
        "usr/share/doc/lockrun/copyright",
        "usr/share/lintian/overrides/lockrun",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    want.extend(COMPLETIONS.iter().map(|(_, to)| to.to_string()));
    want.extend(pages.iter().map(|(_, to)| to.clone()));
    assert_eq!(files, want, "dpkg-deb -c:\n{listing}");
    assert!(
        listing.contains("-rwxr-xr-x 0/0") && listing.contains(" ./usr/bin/lockrun\n"),
        "{listing}"
    );

    // Installed into a scratch root.
    let scratch = tempfile::tempdir().unwrap();
    let dest = scratch.path();
    ok(
        tool(
            Command::new("dpkg").arg("-x").arg(&deb).arg(dest),
            "apt-get install -y dpkg",
        ),
        "dpkg -x",
    );

    // The binary under test, unchanged, and it runs.
    let installed = dest.join("usr/bin/lockrun");
    assert!(
        std::fs::read(&installed).unwrap() == std::fs::read(BIN).unwrap(),
        "usr/bin/lockrun is not the binary under test"
    );
    let theirs = ok(
        Command::new(&installed).arg("--version").output().unwrap(),
        "usr/bin/lockrun --version",
    );
    let ours = ok(run(lockrun().arg("--version")), "lockrun --version");
    assert_eq!(theirs, ours);

    // Every man page, gzipped, renders as the committed page does, with no
    // warning.
    for (page, to) in &pages {
        assert_eq!(render(&dest.join(to)), render(page), "{to}");
    }

    // The completions and the README, as committed.
    for (from, to) in COMPLETIONS
        .iter()
        .copied()
        .chain([("README.md", "usr/share/doc/lockrun/README.md")])
    {
        assert!(
            std::fs::read(dest.join(to)).unwrap() == std::fs::read(root().join(from)).unwrap(),
            "{to} differs from {from}"
        );
    }

    // The copyright file as written, and its notice and license text those
    // of LICENSE.
    let doc = dest.join("usr/share/doc/lockrun");
    let copyright = std::fs::read_to_string(doc.join("copyright")).unwrap();
    assert_eq!(
        copyright,
        std::fs::read_to_string(root().join("tests/debian/copyright")).unwrap()
    );
    let license = std::fs::read_to_string(root().join("LICENSE")).unwrap();
    let notice = license
        .lines()
        .find_map(|l| l.strip_prefix("Copyright (c) "))
        .expect("LICENSE has a copyright notice");
    assert!(
        copyright.contains(&format!("\nCopyright: {notice}\n")),
        "the copyright file's notice is not LICENSE's ({notice}):\n{copyright}"
    );
    let terms = license
        .split_once("Permission is hereby granted")
        .expect("LICENSE is the MIT license")
        .1;
    let indented: Vec<String> = format!("Permission is hereby granted{terms}")
        .trim_end()
        .lines()
        .map(|l| {
            if l.is_empty() {
                " .".into()
            } else {
                format!(" {l}")
            }
        })
        .collect();
    assert!(
        copyright.contains(&format!("License: Expat\n{}\n", indented.join("\n"))),
        "the copyright file's license text is not LICENSE's:\n{copyright}"
    );

    // The changelog, gzipped, as written, its latest entry this version.
    let changelog = ok(
        tool(
            Command::new("gzip")
                .arg("-dc")
                .arg(doc.join("changelog.Debian.gz")),
            "apt-get install -y gzip",
        ),
        "gzip -dc changelog.Debian.gz",
    );
    assert_eq!(
        changelog,
        std::fs::read_to_string(root().join("tests/debian/changelog")).unwrap()
    );
    let latest = format!("lockrun ({}-1) ", env!("CARGO_PKG_VERSION"));
    assert!(
        changelog.starts_with(&latest),
        "tests/debian/changelog has no entry for this version ({latest}); add one:\n{changelog}"
    );

    // lintian, Debian's own check, finds no error and no warning in the
    // package as `cargo deb` makes it, its binary stripped.
    let (stripped, _stripped_dir) = build_deb(true);
    let out = tool(
        Command::new("lintian")
            .args(["--fail-on", "error,warning", "--tag-display-limit", "0"])
            .arg(&stripped),
        "apt-get install -y lintian",
    );
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    let tags: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    assert!(
        out.status.success() && tags.is_empty(),
        "lintian {}: {}\n{said}",
        stripped.display(),
        out.status
    );
}

/// `--version` is the version, then every engine with its URL schemes;
/// `-V` is the version alone.
#[test]
fn version_names_the_engines() {
    let version = format!("lockrun {}\n", env!("CARGO_PKG_VERSION"));
    let short = ok(run(lockrun().arg("-V")), "lockrun -V");
    assert_eq!(short, version);
    let long = ok(run(lockrun().arg("--version")), "lockrun --version");
    assert!(long.starts_with(&format!("{version}engines:\n")), "{long}");
    for (engine, schemes) in [
        ("local", &["file"][..]),
        (
            "Redis",
            &[
                "redis",
                "rediss",
                "redis+sentinel",
                "rediss+sentinel",
                "redis+cluster",
                "rediss+cluster",
            ][..],
        ),
        ("etcd", &["etcd", "etcds"][..]),
        ("PostgreSQL", &["postgres", "postgresql"][..]),
    ] {
        let line = long
            .lines()
            .find(|l| l.split_whitespace().next() == Some(engine))
            .unwrap_or_else(|| panic!("no {engine} in\n{long}"));
        let listed: Vec<&str> = line
            .split_whitespace()
            .filter(|w| w.ends_with("://"))
            .collect();
        let want: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        assert_eq!(listed, want, "{long}");
    }
}

/// The MySQL client's `regex` is lockrun's shim on regex-lite
/// (src/shims/regex): the published one would bring back regex-syntax's
/// Unicode tables, which every start relocates whatever the engine. A
/// `cargo update` that leaves the patch unused (cargo only warns) is told
/// here.
#[test]
fn the_mysql_client_s_regex_is_the_shim_without_unicode_tables() {
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    let block = lock
        .split("[[package]]")
        .find(|b| b.contains("\nname = \"regex\"\n"))
        .expect("regex in Cargo.lock");
    assert!(
        !block.contains("\nsource = ") && block.contains("\"regex-lite\""),
        "regex comes from a registry, not src/shims/regex:{block}"
    );
    let common = lock
        .split("[[package]]")
        .find(|b| b.contains("\nname = \"mysql_common\"\n"))
        .expect("mysql_common in Cargo.lock");
    assert!(common.contains(" \"regex\",\n"), "{common}");
}
