//! An etcd address: `etcd://` and `etcds://` URLs with one or more
//! endpoints, what in them is secret, and the TLS settings they imply.

use std::sync::Arc;

use super::{ENGINE, Etcd};
use crate::backend::{
    Address, AddressOptions, Check, Engine, Error, HostList, Opening, Reach, each_host, shown_hosts,
};

/// etcd's client port when a URL names none.
const DEFAULT_PORT: u16 = 2379;

/// A cluster's address (lockrun-engines(7) "ETCD").
#[derive(Debug, Clone)]
pub struct EtcdUrl {
    /// `http://host:port` (or `https://`) for each endpoint, in the order given.
    pub endpoints: Vec<String>,
    /// With `#insecure`, TLS without checking the server's certificate.
    pub reach: Reach,
}

impl std::ops::Deref for EtcdUrl {
    type Target = Reach;
    fn deref(&self) -> &Reach {
        &self.reach
    }
}

impl Address for EtcdUrl {
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

pub(super) fn read(raw: &str, opts: &AddressOptions) -> Result<EtcdUrl, Error> {
    let url = HostList::cut(raw, ENGINE.form)?;
    let tls = url.scheme == "etcds";
    let hosts = url.rest.strip_suffix('/').unwrap_or(url.rest);
    // Never a path or query, which may hold a secret (`?password=`).
    let shown_hosts = shown_hosts(hosts.split(['/', '?']).next().unwrap_or_default());
    let display = format!(
        "{}://{}{shown_hosts}{}",
        url.scheme,
        url.login.shown,
        url.fragment()
    );
    let bad = |why: String| url.refusal(&display, why);
    if hosts.contains(['/', '?', '#']) {
        return Err(bad(
            "an etcd URL has no path or query, only endpoints (and #insecure with etcds)".into(),
        ));
    }
    if url.insecure && !tls {
        return Err(bad("#insecure goes only with TLS (etcds)".into()));
    }
    url.check_login().map_err(bad)?;
    let http = if tls { "https" } else { "http" };
    let endpoints = each_host(hosts, |h| endpoint(h, http)).map_err(bad)?;
    let ca_file = opts.ca_file(tls, &display)?;
    // A grant on etcd is raft-committed: there are no replicas to wait for.
    opts.no_replicas(&display)?;
    Ok(EtcdUrl {
        endpoints,
        reach: url.reach(display, tls, ca_file),
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
