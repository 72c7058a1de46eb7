//! A ZooKeeper address: `zk://` (and `zookeeper://`) URLs with one or more
//! servers and an optional chroot, and the digest credentials in them;
//! `zks://` for TLS, with `#insecure` to skip the host name check.

use std::sync::Arc;

use super::{ENGINE, Zk};
use crate::backend::{
    Address, AddressOptions, Check, Engine, Error, HostList, Opening, Reach, each_host, shown_hosts,
};

/// ZooKeeper's client port when a URL names none.
const DEFAULT_PORT: u16 = 2181;

/// An ensemble's address (lockrun-engines(7) "ZOOKEEPER").
#[derive(Debug, Clone)]
pub struct ZkUrl {
    /// `host:port` of each server, in the order given.
    pub servers: Vec<String>,
    /// The chroot, `/a/b`, if any.
    pub chroot: Option<String>,
    /// `zks://` for TLS; with `#insecure`, the certificate's host name is
    /// not checked (its chain still is).
    pub reach: Reach,
}

impl std::ops::Deref for ZkUrl {
    type Target = Reach;
    fn deref(&self) -> &Reach {
        &self.reach
    }
}

impl ZkUrl {
    /// The connect string the client takes: servers, then the chroot.
    pub fn connect_string(&self) -> String {
        format!(
            "{}{}",
            self.servers.join(","),
            self.chroot.as_deref().unwrap_or("")
        )
    }
}

impl Address for ZkUrl {
    fn shown(&self) -> String {
        self.display.clone()
    }
    fn secret(&self) -> Option<&str> {
        self.password.as_deref()
    }
    fn check_prefix(&self, prefix: &str) -> Result<(), Error> {
        super::queue::root_of(prefix).map(|_| ())
    }
    fn open(&self, how: &Opening) -> Result<Box<dyn Engine>, Error> {
        Ok(Box::new(Zk::open(self, how)?))
    }
    fn doctor(&self, how: &Opening) -> Vec<Check> {
        super::doctor::doctor(self, how)
    }
}

/// One `host[:port]` (or `[v6][:port]`) of the server list, checked.
fn server(text: &str) -> Result<String, String> {
    let (host, port) = crate::backend::host_and_port(text, "server", DEFAULT_PORT)?;
    Ok(format!("{host}:{port}"))
}

/// A chroot: `/` and path components of letters, digits, `.`, `-`, `_`
/// (none `.` or `..`), with no trailing `/`.
fn chroot(path: &str) -> Result<Option<String>, String> {
    let path = path.strip_suffix('/').unwrap_or(path);
    if path.is_empty() {
        return Ok(None);
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return Err(format!(
            "chroot {path:?} is in ZooKeeper's own tree (/zookeeper: its quotas and \
             configuration), where lockrun never writes"
        ));
    }
    for part in path.trim_start_matches('/').split('/') {
        let plain = !part.is_empty()
            && part != "."
            && part != ".."
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if !plain {
            return Err(format!(
                "chroot {path:?}: each part may only hold letters, digits, '.', '-' and '_'"
            ));
        }
    }
    Ok(Some(path.to_string()))
}

/// Parse `zk://[user:pass@]h1[:2181][,h2[:2181]…][/chroot]`, or `zks://`
/// the same with TLS and an optional `#insecure`.
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    Ok(Arc::new(read(raw, opts)?))
}

fn read(raw: &str, opts: &AddressOptions) -> Result<ZkUrl, Error> {
    let url = HostList::cut(raw, ENGINE.form)?;
    let (hosts, path) = match url.rest.find('/') {
        Some(i) => (&url.rest[..i], &url.rest[i..]),
        None => (url.rest, ""),
    };
    // Never a query or fragment, which may hold a secret.
    let shown_path = path.split(['?', '#']).next().unwrap_or_default();
    let shown_hosts = shown_hosts(hosts.split(['?', '#']).next().unwrap_or_default());
    let display = format!(
        "{}://{}{shown_hosts}{shown_path}{}",
        url.scheme,
        url.login.shown,
        url.fragment()
    );
    let bad = |why: String| url.refusal(&display, why);
    let tls = url.scheme == "zks";
    if url.insecure && !tls {
        return Err(bad("#insecure is for TLS (zks://) only".into()));
    }
    if hosts.contains(['?', '#']) || path.contains(['?', '#']) {
        return Err(bad(
            "a ZooKeeper URL has no query, and no fragment but #insecure (zks:// only)".into(),
        ));
    }
    url.check_login().map_err(bad)?;
    let servers = each_host(hosts, server).map_err(bad)?;
    let chroot = chroot(path).map_err(bad)?;
    let ca_file = opts.ca_file(tls, &display)?;
    opts.no_replicas(&display)?;
    Ok(ZkUrl {
        servers,
        chroot,
        reach: url.reach(display, tls, ca_file),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(raw: &str) -> Result<ZkUrl, Error> {
        read(raw, &AddressOptions::default())
    }

    #[test]
    fn servers_and_chroot_are_read_with_the_default_port() {
        let u = url("zk://a,b:2182,10.0.0.1:1/x/y").unwrap();
        assert_eq!(u.servers, ["a:2181", "b:2182", "10.0.0.1:1"]);
        assert_eq!(u.chroot.as_deref(), Some("/x/y"));
        assert_eq!(u.connect_string(), "a:2181,b:2182,10.0.0.1:1/x/y");
        assert_eq!(url("zookeeper://h/").unwrap().chroot, None);
        assert_eq!(url("zk://[::1]:5").unwrap().servers, ["[::1]:5"]);
    }

    #[test]
    fn bad_urls_are_refused_and_never_show_the_password() {
        for bad in [
            "zk://",
            "zk://h:0",
            "zk://h:x",
            "zk://h/a//b",
            "zk://h/..",
            "zk://h/zookeeper",
            "zk://h/zookeeper/quota",
            "zk://h?x=1",
            "zk://u@h",
            "zk://:p@h",
            "zk://u:s3cret@h/a b",
            "zk://u:s3cret@h#insecure",
            "zks://u:s3cret@h#other",
            "zks://u:s3cret@h#insecure#insecure",
        ] {
            let e = url(bad).unwrap_err();
            assert!(matches!(e, Error::Request(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
        let u = url("zk://u:s3cret@h").unwrap();
        assert_eq!(u.display, "zk://u:***@h");
        assert_eq!(u.password.as_deref(), Some("s3cret"));
    }

    #[test]
    fn zks_is_tls_and_insecure_only_skips_the_name_check() {
        let u = url("zks://u:s3cret@a:2281,b:2281/x#insecure").unwrap();
        assert!(u.tls && u.insecure);
        assert_eq!(u.servers, ["a:2281", "b:2281"]);
        assert_eq!(u.chroot.as_deref(), Some("/x"));
        assert_eq!(u.display, "zks://u:***@a:2281,b:2281/x#insecure");
        let u = url("zks://h").unwrap();
        assert!(u.tls && !u.insecure && u.ca_file.is_none());
        assert!(!url("zk://h").unwrap().tls);
    }
}
