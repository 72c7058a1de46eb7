//! `zks://`: the ZooKeeper engine over TLS against a server from Debian's
//! jar serving TLS on a second port (one server shared by this file). The
//! certificate is checked against `--tls-ca` (or LOCKRUN_TLS_CA); a wrong
//! CA, or TLS to the plain port, is refused with 69 before any job.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::*;

/// The shared TLS server's ports and the directory of its certificates.
fn server() -> &'static (ZkTls, PathBuf) {
    static SERVER: OnceLock<(ZkTls, PathBuf)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        make_certs(&dir);
        (start_zookeeper_tls(&dir), dir)
    })
}

fn cert(name: &str) -> String {
    server().1.join(name).display().to_string()
}

fn tls_url() -> String {
    format!("zks://127.0.0.1:{}", server().0.tls_port)
}

#[test]
fn a_job_runs_over_tls_with_the_ca_given() {
    let url = tls_url();
    let out = run(on(&url).args([
        "--tls-ca",
        &cert("ca.crt"),
        "tls-ok",
        "--",
        "sh",
        "-c",
        "echo $LOCKRUN_TOKEN",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let token = text(&out.stdout);
    assert!(
        token.trim().parse::<i64>().is_ok_and(|t| t > 0),
        "{token:?}"
    );
    on(&url)
        .env("LOCKRUN_TLS_CA", cert("ca.crt"))
        .args(["status", "tls-ok"])
        .code(1);
}

#[test]
fn a_wrong_ca_is_refused_before_any_job() {
    let scratch = Scratch::new();
    let marker = scratch.path("ran");
    for url in [tls_url(), format!("{}#insecure", tls_url())] {
        let t = Instant::now();
        let out = run(on(&url).args([
            "--tls-ca",
            &cert("other.crt"),
            "tls-wrong",
            "touch",
            &marker.display().to_string(),
        ]));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{url}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{url}: {err}");
        assert!(!marker.exists(), "a job ran over an unchecked connection");
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    }
}

/// `#insecure` skips the host name check only: with the right CA a job
/// runs (the chain is still checked: see the wrong CA above).
#[test]
fn insecure_skips_only_the_host_name_check() {
    let url = format!("{}#insecure", tls_url());
    on(&url)
        .args(["--tls-ca", &cert("ca.crt"), "tls-insecure", "true"])
        .code(0);
}

#[test]
fn tls_to_the_plain_port_fails_in_bounded_time() {
    let url = format!("zks://127.0.0.1:{}", server().0.port);
    let t = Instant::now();
    let out = run(on(&url).args(["--tls-ca", &cert("ca.crt"), "tls-plain", "true"]));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
}

#[test]
fn tls_options_without_tls_are_refused() {
    let plain = format!("zk://127.0.0.1:{}", server().0.port);
    on(&plain)
        .args(["--tls-ca", &cert("ca.crt"), "tls-none", "true"])
        .code(64)
        .says(&["--tls-ca"]);
    on(&format!("{plain}#insecure"))
        .args(["tls-none", "true"])
        .code(64)
        .says(&["#insecure"]);
    // From the environment it applies only where TLS is used.
    on(&plain)
        .env("LOCKRUN_TLS_CA", cert("ca.crt"))
        .args(["tls-none", "true"])
        .code(0);
}
