//! An etcd address: `etcd://` and `etcds://` URLs with one or more
//! endpoints, what in them is secret, and the TLS settings they imply.

use std::path::PathBuf;
use std::sync::Arc;

use super::{ENGINE, Etcd};
use crate::backend::{
    Address, AddressOptions, Check, Credentials, Engine, EngineInfo, Error, Opening, credentials,
};

/// etcd's client port when a URL names none.
const DEFAULT_PORT: u16 = 2379;

/// A cluster's address (lockrun-engines(7) "ETCD").
#[derive(Debug, Clone)]
pub struct EtcdUrl {
    /// `http://host:port` (or `https://`) for each endpoint, in the order given.
    pub endpoints: Vec<String>,
    /// The URL with any password replaced, for messages.
    pub display: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub tls: bool,
    /// `#insecure`: TLS without checking the server's certificate.
    pub insecure: bool,
    pub ca_file: Option<PathBuf>,
}

impl Address for EtcdUrl {
    fn engine(&self) -> &'static EngineInfo {
        &ENGINE
    }
    fn shown(&self) -> String {
        self.display.clone()
    }
    fn secret(&self) -> Option<&str> {
        self.password.as_deref()
    }
    fn check_prefix(&self, prefix: &str) -> Result<(), Error> {
        if super::queue::prefix_is_apart(prefix) {
            return Ok(());
        }
        let shown: String = prefix.chars().take(60).collect();
        Err(Error::Request(format!(
            "invalid --prefix {shown:?} for etcd: end it with '/' (as in jobs/locks/), or with \
             ':' and no other ':' or '/' (as the default lockrun:), so that no name under one \
             prefix is a key of a name under another"
        )))
    }
    fn open(&self, how: &Opening) -> Result<Box<dyn Engine>, Error> {
        Ok(Box::new(Etcd::open(self, how)?))
    }
    fn doctor(&self, how: &Opening) -> Vec<Check> {
        super::doctor::doctor(self, how)
    }
}

/// One `host[:port]` (or `[v6][:port]`) of the endpoint list, checked.
fn endpoint(text: &str, scheme: &str) -> Result<String, String> {
    let (host, port) = crate::backend::host_and_port(text, "endpoint", DEFAULT_PORT)?;
    Ok(format!("{scheme}://{host}:{port}"))
}

/// Parse `etcd://[user:pass@]h1[:2379][,h2[:2379]…]` or `etcds://…`.
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    Ok(Arc::new(read(raw, opts)?))
}

fn read(raw: &str, opts: &AddressOptions) -> Result<EtcdUrl, Error> {
    let expected = format!("expected {}", ENGINE.form);
    let (scheme, rest) = raw
        .split_once("://")
        .ok_or_else(|| Error::Request(format!("invalid --url: {expected}")))?;
    let tls = scheme.eq_ignore_ascii_case("etcds");
    // Never echo the raw URL: it may hold a password.
    let (
        Credentials {
            user,
            password,
            shown: shown_user,
        },
        hosts,
    ) = credentials(rest);
    // `#insecure` is the one fragment, as on Redis: only with TLS.
    let (hosts, insecure) = match hosts.strip_suffix("#insecure") {
        Some(h) => (h, true),
        None => (hosts, false),
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    let fragment = if insecure { "#insecure" } else { "" };
    // Never a path or query, which may hold a secret (`?password=`).
    let shown_hosts =
        crate::backend::shown_hosts(hosts.split(['/', '?']).next().unwrap_or_default());
    let display = format!(
        "{}://{shown_user}{shown_hosts}{fragment}",
        scheme.to_ascii_lowercase()
    );
    let bad = |why: String| {
        Error::Request(format!(
            "invalid --url {}: {why}; {expected}",
            display.chars().take(200).collect::<String>()
        ))
    };
    if hosts.contains(['/', '?', '#']) {
        return Err(bad(
            "an etcd URL has no path or query, only endpoints (and #insecure with etcds)".into(),
        ));
    }
    if insecure && !tls {
        return Err(bad("#insecure goes only with TLS (etcds)".into()));
    }
    if user.as_deref().is_some_and(str::is_empty) {
        return Err(bad("the user name is empty".into()));
    }
    if user.is_some() && password.is_none() {
        return Err(bad("a user needs a password (user:pass@)".into()));
    }
    let http = if tls { "https" } else { "http" };
    let endpoints = hosts
        .split(',')
        .map(|h| endpoint(h, http))
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad)?;
    let ca_file = if tls {
        opts.tls_ca.clone()
    } else {
        opts.no_tls(&display)?;
        None
    };
    // A grant on etcd is raft-committed: there are no replicas to wait for.
    opts.no_replicas(&display)?;
    Ok(EtcdUrl {
        endpoints,
        display,
        user,
        password,
        tls,
        insecure,
        ca_file,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(raw: &str) -> Result<EtcdUrl, Error> {
        read(raw, &AddressOptions::default())
    }

    fn endpoints(raw: &str) -> Vec<String> {
        url(raw).unwrap().endpoints
    }

    #[test]
    fn endpoints_are_read_in_order_with_the_default_port() {
        assert_eq!(
            endpoints("etcd://a,b:2380,10.0.0.1:1"),
            ["http://a:2379", "http://b:2380", "http://10.0.0.1:1"]
        );
        assert_eq!(endpoints("etcds://h/"), ["https://h:2379"]);
        assert_eq!(endpoints("etcd://[::1]:9"), ["http://[::1]:9"]);
    }

    #[test]
    fn bad_urls_are_refused_without_their_password() {
        for bad in [
            "etcd://",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h,",
            "etcd://h/x",
            "etcd://h?x=1",
            "etcd://u:s3cret@h/x",
            "etcd://u:s3cret@h:port",
            "etcd://u@h",
            "etcd://:s3cret@h",
            "etcd://[::1",
            "etcd://h h",
            "etcd://h#insecure",
            "etcds://h#other",
        ] {
            let e = url(bad).unwrap_err();
            assert!(matches!(e, Error::Request(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
        let ok = url("etcd://u:s%40cret@h").unwrap();
        assert_eq!(ok.password.as_deref(), Some("s@cret"));
        assert!(!ok.display.contains("cret"), "{}", ok.display);
    }

    #[test]
    fn insecure_is_a_fragment_of_tls_urls_alone() {
        let u = url("etcds://u:pw@h1,h2#insecure").unwrap();
        assert!(u.insecure && u.tls);
        assert_eq!(u.endpoints, ["https://h1:2379", "https://h2:2379"]);
        assert_eq!(u.display, "etcds://u:***@h1,h2#insecure");
        assert!(!url("etcds://h").unwrap().insecure);
    }

    #[test]
    fn a_ca_file_needs_tls() {
        let ca = AddressOptions {
            tls_ca: Some("/ca.pem".into()),
            tls_ca_from_env: false,
            ..AddressOptions::default()
        };
        assert!(parse("etcd://h", &ca).is_err());
        assert!(parse("etcds://h", &ca).is_ok());
    }
}
