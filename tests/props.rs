//! Random command lines and environments: lockrun never panics and always
//! ends with an exit code from its table (README "Exit codes").

use std::time::Duration;

use proptest::prelude::*;

use crate::support::*;

/// Pieces a command line is made of: real options with odd values, names,
/// URLs (none of them reachable but the scratch directory), commands.
const PIECES: &[&str] = &[
    "-n",
    "-w",
    "--wait",
    "-t",
    "--ttl",
    "-E",
    "--kill-after",
    "-c",
    "-v",
    "-vv",
    "-q",
    "--",
    "--url",
    "--prefix",
    "--tls-ca",
    "status",
    "release",
    "--force",
    "--token",
    "--now",
    "--json",
    "--generate",
    "0",
    "1",
    "-1",
    "76",
    "255",
    "256",
    "0.5",
    "1e9",
    "10s",
    "100ms",
    "7days",
    "8days",
    "99999999999999h",
    "18446744073709551615",
    "abc",
    "",
    " ",
    "{",
    "}",
    "%",
    "a\u{202E}b",
    "name",
    "x/../y",
    "redis://127.0.0.1:1",
    "rediss://127.0.0.1:1#insecure",
    "redis://u:p@127.0.0.1:1/99999999999",
    "redis://",
    "file:///nonexistent/dir",
    "http://h",
    "redis://[::1",
    "true",
    "false",
    "exit 3",
    "/nonexistent",
    "-timeout=10s",
    "--nb",
    "-x",
];

/// lockrun's own codes, and those of the jobs the pieces can make (`-c`
/// with a piece as the script: 2 is sh's syntax error).
const CODES: &[i32] = &[0, 1, 2, 3, 64, 69, 70, 75, 76, 126, 127, 255];

fn line() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            8 => prop::sample::select(PIECES).prop_map(str::to_string),
            1 => "\\PC{0,12}",
        ],
        0..8,
    )
}

fn env() -> impl Strategy<Value = Vec<(String, String)>> {
    let keys = prop::sample::select(
        &[
            "LOCKRUN_URL",
            "LOCKRUN_TTL",
            "LOCKRUN_PREFIX",
            "LOCKRUN_TLS_CA",
            "LOCKRUN_LOCK_FD",
            "LOCKRUN_NAME",
            "LOCKRUN_OWNER",
        ][..],
    );
    let values = prop_oneof![
        prop::sample::select(PIECES).prop_map(str::to_string),
        "\\PC{0,8}"
    ];
    prop::collection::vec((keys.prop_map(str::to_string), values), 0..3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_command_line_ends_with_a_known_code(args in line(), vars in env()) {
        let scratch = Scratch::new();
        let mut cmd = lockrun();
        // Runs that get this far use a fresh lock directory: nothing waits.
        cmd.current_dir(scratch.dir.path())
            .env("LOCKRUN_URL", scratch.file_url())
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for (k, v) in &vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let st = wait_child(&mut child, Duration::from_secs(30));
        let mut err = String::new();
        use std::io::Read;
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        prop_assert!(!err.contains("panicked"), "{args:?} {vars:?}: {err}");
        let code = st.code();
        prop_assert!(code.is_some_and(|c| CODES.contains(&c)), "{args:?} {vars:?}: {st:?} {err}");
        if code == Some(64) {
            prop_assert_eq!(err.lines().count(), 1, "{:?} {:?}: {}", args, vars, err);
        }
    }
}
