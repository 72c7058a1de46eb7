//! README and the manual say nothing the binary contradicts: every option
//! they name is one lockrun has (or one of another tool they quote, listed
//! here), every `LOCKRUN_` variable is one lockrun reads or sets, and every
//! flock option lockrun refuses is refused as they say.

use std::collections::BTreeSet;
use std::path::Path;

use crate::support::*;

/// Long options of the other programs the docs quote (etcdctl, redis-cli,
/// psql, node_exporter, cargo, dpkg…), which lockrun does not have.
const OTHERS: &[&str] = &[
    // cargo, rustfmt and the test harness
    "check",
    "nocapture",
    "path",
    "release",
    "target",
    // node_exporter
    "collector",
    // mysql(1)
    "ssl-mode",
    // rsync(1)
    "delete",
    // unshare(1), systemd-run(1)
    "pid",
    "scope",
];

/// flock's options that lockrun refuses with a line saying what to do.
const REFUSED: &[&str] = &["close", "no-fork", "unlock"];

/// The documents a user reads: README and every page under man/.
fn documents() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![(
        "README.md".to_string(),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    )];
    for entry in std::fs::read_dir(root.join("man")).unwrap() {
        let path = entry.unwrap().path();
        let name = format!("man/{}", path.file_name().unwrap().to_string_lossy());
        // roff writes a dash as `\-`.
        let body = std::fs::read_to_string(&path).unwrap().replace("\\-", "-");
        docs.push((name, body));
    }
    docs
}

/// `--word` as written in `text` (not the bare `--` separator).
fn long_options(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("--") {
        if at > 0 && text.as_bytes()[at - 1] == b'-' {
            continue;
        }
        let rest = &text[at + 2..];
        let word: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        let word = word.trim_end_matches('-');
        if word.starts_with(|c: char| c.is_ascii_lowercase()) {
            found.insert(word.to_string());
        }
    }
    found
}

/// Every long option of lockrun and its commands, from their `--help`.
fn lockrun_options() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for args in [
        &["--help"][..],
        &["status", "--help"],
        &["list", "--help"],
        &["release", "--help"],
        &["doctor", "--help"],
    ] {
        let out = run(lockrun().args(args));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        all.extend(long_options(&text(&out.stdout)));
    }
    // Hidden from `--help`, documented for packagers (tests/generated.rs runs it).
    all.insert("generate".to_string());
    all
}

#[test]
fn every_option_the_docs_name_exists() {
    let ours = lockrun_options();
    let mut unknown = Vec::new();
    for (doc, body) in documents() {
        for opt in long_options(&body) {
            let known = ours.contains(&opt)
                || OTHERS.contains(&opt.as_str())
                || REFUSED.contains(&opt.as_str());
            if !known {
                unknown.push(format!("{doc}: --{opt}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "options lockrun does not have (add another tool's to OTHERS):\n{}",
        unknown.join("\n")
    );
}

#[test]
fn the_flock_options_the_docs_call_refused_are() {
    for opt in REFUSED {
        let out = run(lockrun().args([&format!("--{opt}"), "name", "true"]));
        assert_eq!(out.status.code(), Some(64), "--{opt}");
        assert_eq!(
            text(&out.stderr).lines().count(),
            1,
            "--{opt}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn every_variable_the_docs_name_exists() {
    // The variables the source reads or sets, and those of the tests and
    // the benchmark that README tells developers about.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut known = BTreeSet::new();
    let mut dirs = vec![root.join("src"), root.join("tests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") && !path.ends_with("docs.rs") {
                known.extend(variables(&std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut unknown = Vec::new();
    for (doc, body) in documents() {
        for var in variables(&body) {
            if !known.contains(&var) {
                unknown.push(format!("{doc}: {var}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "variables lockrun never reads or sets:\n{}",
        unknown.join("\n")
    );
}

/// `LOCKRUN_WORD` as written (not the `LOCKRUN_*` family).
fn variables(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("LOCKRUN_") {
        let word: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let word = word.trim_end_matches('_');
        if word.len() > "LOCKRUN".len() {
            found.insert(word.to_string());
        }
    }
    found
}

/// A page as the words it shows: roff's dashes, quotes and font changes
/// resolved, lines joined (a request line keeps its words).
fn page_words(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let src = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = src
        .lines()
        .map(|l| match l.strip_prefix('.') {
            Some(request) => request.split_once(' ').map_or("", |(_, words)| words),
            None => l,
        })
        .collect();
    let mut text = lines.join(" ");
    for (roff, shown) in [
        ("\\-", "-"),
        ("\\(aq", "'"),
        ("\\fB", ""),
        ("\\fI", ""),
        ("\\fR", ""),
        ("\"", ""),
    ] {
        text = text.replace(roff, shown);
    }
    text
}

/// What `lockrun ARGS --help` prints.
fn help(args: &[&str]) -> String {
    let out = run(lockrun().args(args).arg("--help"));
    assert_eq!(out.status.code(), Some(0), "{args:?}");
    text(&out.stdout)
}

/// Every URL scheme `--version` lists (each engine's line after its name).
fn schemes() -> Vec<String> {
    let out = run(lockrun().arg("--version"));
    let schemes: Vec<String> = text(&out.stdout)
        .lines()
        .skip(2)
        .flat_map(|l| l.split_whitespace().skip(1).map(str::to_string))
        .filter(|w| w.ends_with("://"))
        .collect();
    assert!(schemes.len() > 10, "{schemes:?}");
    schemes
}

/// `--help`'s description and its --url, and the pages, name every scheme
/// lockrun takes.
#[test]
fn help_and_pages_name_every_url_scheme() {
    let top = help(&[]);
    let (description, rest) = top.split_once("Usage:").unwrap();
    let url = rest
        .split_once("--url <URL>")
        .unwrap()
        .1
        .split("\n  -")
        .next()
        .unwrap();
    let engines = page_words("man/lockrun-engines.7");
    for scheme in schemes() {
        if scheme != "file://" {
            assert!(
                description.contains(&scheme),
                "--help's description lacks {scheme}:\n{description}"
            );
        }
        assert!(url.contains(&scheme), "--url's help lacks {scheme}:\n{url}");
        assert!(
            engines.contains(&scheme),
            "lockrun-engines(7) lacks {scheme}"
        );
    }
}

/// The engines `status --help` says list in one snapshot are those
/// lockrun(1) says do, each for the same reason.
#[test]
fn status_help_and_the_page_agree_on_snapshots() {
    // "A, B and C (why) and D (why; more)": the engines, and each group's why.
    let engines = |list: &str| -> (BTreeSet<String>, Vec<String>) {
        let (mut names, mut whys, mut rest) = (String::new(), Vec::new(), list);
        while let Some((before, after)) = rest.split_once(" (") {
            names.push_str(before);
            names.push_str(", ");
            let (why, after) = after.split_once(')').unwrap_or((after, ""));
            whys.push(why.split(';').next().unwrap().to_string());
            rest = after;
        }
        names.push_str(rest);
        let names = names
            .replace(" and ", ", ")
            .split(", ")
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect();
        (names, whys)
    };
    let help = help(&["status"])
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let said = help
        .split_once("not as one snapshot, except on ")
        .and_then(|(_, rest)| rest.split_once(")."))
        .map(|(list, _)| format!("{list})"))
        .unwrap_or_else(|| {
            panic!("status --help no longer says which engines list in one snapshot:\n{help}")
        });
    let page = page_words("man/lockrun.1");
    let written = page
        .split_once("The list is one snapshot on ")
        .and_then(|(_, rest)| rest.split_once(")."))
        .map(|(list, _)| format!("{list})"))
        .unwrap_or_else(|| panic!("lockrun(1) no longer says which engines list in one snapshot"));
    let (said, written) = (engines(&said), engines(&written));
    assert!(
        said.0.contains("etcd") && said.0.contains("PostgreSQL"),
        "{said:?}"
    );
    assert_eq!(
        said, written,
        "status --help and lockrun(1) name different engines as listing in one snapshot"
    );
}

/// Each command's `--help` gives the exit codes lockrun(1) gives it.
#[test]
fn each_commands_help_gives_the_pages_exit_codes() {
    let page = page_words("man/lockrun.1");
    for (args, forms) in [
        (&["status"][..], &["status NAME", "list"][..]),
        (&["list"], &["status NAME", "list"]),
        (&["release"], &["release --force NAME"]),
        (&["doctor"], &["doctor"]),
    ] {
        let help = help(args).split_whitespace().collect::<Vec<_>>().join(" ");
        for form in forms {
            let lead = format!("Exit codes of {form}: ");
            let codes = help
                .split_once(&lead)
                .and_then(|(_, rest)| rest.split_once(". "))
                .or_else(|| {
                    help.split_once(&lead)
                        .map(|(_, rest)| (rest.trim_end_matches('.'), ""))
                })
                .unwrap_or_else(|| panic!("{args:?} --help gives no {lead:?}:\n{help}"))
                .0;
            assert!(codes.contains("; 69 "), "{args:?}: {codes}");
            assert!(
                page.contains(&format!("Exit {codes}.")),
                "lockrun(1) does not give {form}'s codes as --help does: {codes}"
            );
        }
    }
}

/// lockrun-engines(7) as plain text: roff's dashes and quotes resolved.
fn engines_page() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("man/lockrun-engines.7");
    std::fs::read_to_string(path)
        .unwrap()
        .replace("\\-", "-")
        .replace("\\(aq", "'")
}

/// The rules of the Redis user lockrun-engines(7) tells operators to make
/// (its `ACL SETUSER locker on '>PASSWORD' resetchannels …` line, from the
/// first rule on), so the ACL tests run exactly what the page says.
pub fn documented_redis_acl() -> String {
    let page = engines_page();
    let line = page
        .lines()
        .find(|l| l.contains("ACL SETUSER locker on"))
        .expect("lockrun-engines(7) gives the Redis ACL");
    let rules = line
        .split_once("resetchannels ")
        .expect("the ACL line resets channels")
        .1;
    rules.replace('\'', "")
}

/// The GRANT statements lockrun-engines(7) gives for a MySQL user that
/// may only lock, for `user` in `db`, so the tests grant exactly what the
/// page says.
pub fn documented_mysql_grants(user: &str, db: &str) -> String {
    let page = engines_page();
    let grants: Vec<String> = page
        .lines()
        .filter(|l| l.starts_with("GRANT ") && l.ends_with(" TO 'ci'@'%';"))
        .map(|l| {
            l.replace(" TO 'ci'@'%';", &format!(" TO '{user}'@'%'"))
                .replace(" ON ci.", &format!(" ON {db}."))
        })
        .collect();
    assert!(
        !grants.is_empty(),
        "lockrun-engines(7) gives the MySQL grants: {grants:?}"
    );
    grants.join("; ")
}

/// The GRANT statements lockrun-engines(7) gives for a role that may only
/// lock, for `role`, so the tests grant exactly what the page says.
pub fn documented_postgres_grants(role: &str) -> String {
    let page = engines_page();
    let grants: Vec<String> = page
        .lines()
        .filter(|l| l.starts_with("GRANT ") && l.ends_with(" TO ci;"))
        .map(|l| l.replace(" TO ci;", &format!(" TO {role}")))
        .collect();
    assert!(
        grants.len() >= 3,
        "lockrun-engines(7) gives the PostgreSQL grants: {grants:?}"
    );
    grants.join("; ")
}

/// A page of the manual as `man` shows it: rendered by groff, as plain text.
fn rendered(page: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("man").join(page);
    let out = std::process::Command::new("groff")
        .args(["-t", "-man", "-Tutf8", "-P-cbou"])
        .arg(&path)
        .output()
        .unwrap_or_else(|_| {
            panic!("groff not found: this test needs it (apt-get install -y groff-base)")
        });
    assert!(out.status.success(), "{page}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// A rendered section (a heading at the margin) or subsection (indented
/// three): its heading and its lines.
struct Part {
    heading: String,
    subsections: Vec<Part>,
    lines: Vec<String>,
}

impl Part {
    fn subsection(&self, heading: &str) -> &Part {
        self.subsections
            .iter()
            .find(|s| s.heading == heading)
            .unwrap_or_else(|| panic!("{}: no subsection {heading}", self.heading))
    }

    /// Its text, on one line, with the subsections' after its own.
    fn flat(&self) -> String {
        let mut all: Vec<&str> = self.lines.iter().map(|l| l.trim()).collect();
        for sub in &self.subsections {
            all.extend(sub.lines.iter().map(|l| l.trim()));
        }
        all.join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The tags of its tagged paragraphs (`.TP`), in order: a paragraph
    /// whose first line starts at the margin of the text and whose other
    /// lines are indented further.
    fn items(&self) -> Vec<String> {
        let mut items = Vec::new();
        for block in self.lines.split(|l| l.trim().is_empty()) {
            let Some((first, rest)) = block.split_first() else {
                continue;
            };
            let indent = |l: &str| l.len() - l.trim_start().len();
            if rest.is_empty() || !rest.iter().all(|l| indent(l) > indent(first)) {
                continue;
            }
            let tag = first.trim_start();
            items.push(tag.split("  ").next().unwrap_or(tag).to_string());
        }
        items
    }
}

/// A rendered page cut into its sections and their subsections (the page's
/// running header and footer left out).
fn parts(page: &str) -> Vec<Part> {
    let rendered = rendered(page);
    let title = rendered.lines().next().unwrap_or("").to_string();
    let running = title.split_whitespace().next().unwrap_or("").to_string();
    let mut parts: Vec<Part> = Vec::new();
    for line in rendered.lines() {
        if line == title || line.ends_with(running.as_str()) {
            continue;
        }
        let new = |heading: &str| Part {
            heading: heading.trim().to_string(),
            subsections: Vec::new(),
            lines: Vec::new(),
        };
        if !line.is_empty() && !line.starts_with(' ') {
            parts.push(new(line));
        } else if line.starts_with("   ") && !line.starts_with("    ") {
            if let Some(section) = parts.last_mut() {
                section.subsections.push(new(line));
            }
        } else if let Some(section) = parts.last_mut() {
            match section.subsections.last_mut() {
                Some(sub) => sub.lines.push(line.to_string()),
                None => section.lines.push(line.to_string()),
            }
        }
    }
    parts
}

/// lockrun-engines(7) as a reader sees it: every engine's section with the
/// same subsections in the same order, "In short" and CONCURRENCY GROUPS
/// with one item for each engine, and what each engine's operators and
/// tested versions say standing under that engine.
#[test]
fn the_engines_page_renders_one_part_per_engine() {
    const ACL: &[&str] = &[
        "URL",
        "Set-up",
        "ACL",
        "How it holds",
        "Tokens",
        "Failover",
        "Operators",
        "Tested versions",
    ];
    const GRANTS: &[&str] = &[
        "URL",
        "Set-up",
        "Grants",
        "How it holds",
        "Tokens",
        "Failover",
        "Operators",
        "Tested versions",
    ];
    // Section, its subsections, the server its tested versions name, and
    // whether its operators say what `release --force` does to a
    // --min-hold window (Sentinel and Cluster do as Redis does).
    let engines: &[(&str, &[&str], &str, bool)] = &[
        (
            "LOCAL",
            &[
                "URL",
                "Set-up",
                "How it holds",
                "Tokens",
                "Failover",
                "Operators",
                "Tested versions",
            ],
            "Linux",
            true,
        ),
        ("REDIS", ACL, "redis-server", true),
        ("REDIS SENTINEL", ACL, "redis-server", false),
        ("REDIS CLUSTER", ACL, "redis-server", false),
        ("ETCD", GRANTS, "etcd-server", true),
        ("POSTGRESQL", GRANTS, "PostgreSQL", true),
        ("MYSQL AND MARIADB", GRANTS, "mariadb-server", true),
        ("ZOOKEEPER", ACL, "zookeeper", true),
    ];
    let parts = parts("lockrun-engines.7");
    let headings: Vec<&str> = parts.iter().map(|p| p.heading.as_str()).collect();
    let section = |name: &str| {
        parts
            .iter()
            .find(|p| p.heading == name)
            .unwrap_or_else(|| panic!("no section {name} in {headings:?}"))
    };
    let order: Vec<&str> = headings
        .iter()
        .copied()
        .filter(|h| engines.iter().any(|e| e.0 == *h))
        .collect();
    let want: Vec<&str> = engines.iter().map(|e| e.0).collect();
    assert_eq!(order, want, "the engines' sections");

    for (name, subsections, server, min_hold) in engines {
        let part = section(name);
        let got: Vec<&str> = part
            .subsections
            .iter()
            .map(|s| s.heading.as_str())
            .collect();
        assert_eq!(&got, subsections, "{name}: its subsections, in order");
        let tested = part.subsection("Tested versions").flat();
        assert!(
            tested.contains(server),
            "{name}: its tested versions do not name {server}: {tested:?}"
        );
        let operators = part.subsection("Operators").flat();
        let windows = operators.matches("--min-hold window").count();
        assert_eq!(
            windows,
            usize::from(*min_hold),
            "{name}: what release --force does to a --min-hold window: {operators:?}"
        );
    }

    let items = section("DESCRIPTION").items();
    assert_eq!(
        items,
        [
            "local",
            "Redis",
            "Redis Sentinel",
            "Redis Cluster",
            "etcd",
            "PostgreSQL",
            "MySQL",
            "ZooKeeper"
        ],
        "\"In short\": one item per engine"
    );
    let items = section("CONCURRENCY GROUPS").items();
    assert_eq!(
        items,
        ["local", "Redis", "etcd", "PostgreSQL", "MySQL", "ZooKeeper"],
        "CONCURRENCY GROUPS: one item per engine"
    );
    let errors = section("ERRORS");
    for sub in &errors.subsections {
        if sub.heading != "local" {
            assert_eq!(
                sub.items(),
                ["Transient", "Final"],
                "ERRORS: {}",
                sub.heading
            );
        }
    }
}
