//! A Redis address: one server (`redis://`, `rediss://`) or a master found
//! through sentinels (`redis+sentinel://`, `rediss+sentinel://`), what in it
//! is secret, Redis's own rules for names, and the clients (TLS included) it
//! makes.

use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::{Client, IntoConnectionInfo};

use super::{ENGINE, Redis};
use crate::backend::{Address, AddressOptions, Check, Credentials, Engine, Error, Opening};

/// A Redis server's address (lockrun-engines(7) "REDIS").
#[derive(Debug, Clone)]
pub struct RedisUrl {
    /// The URL as given, handed to the redis crate; holds the password, never printed.
    pub url: String,
    /// The URL with any password replaced, for messages.
    pub display: String,
    pub password: Option<String>,
    pub tls: bool,
    pub insecure: bool,
    pub ca_file: Option<PathBuf>,
    pub topology: Topology,
    /// `--replicas N`: a write counts once N replicas acknowledged it.
    pub replicas: u32,
}

/// Where the server that holds the keys is.
#[derive(Debug, Clone)]
pub enum Topology {
    /// One server, at `url`.
    Server,
    /// The master that these sentinels name `master`, reached with the
    /// URL's credentials and database.
    Sentinel {
        sentinels: Vec<Node>,
        master: String,
        /// `user:pass` as written in the URL (still percent-encoded).
        userinfo: String,
        db: u32,
    },
    /// A cluster, found through any of these nodes.
    Cluster { nodes: Vec<Node>, userinfo: String },
}

/// A host and port, as a URL writes them (an IPv6 address in brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl RedisUrl {
    /// The user the credentials are for, for messages.
    pub fn user(&self) -> String {
        let userinfo = match &self.topology {
            Topology::Server => url::Url::parse(&self.url)
                .ok()
                .map(|u| u.username().to_string()),
            Topology::Sentinel { userinfo, .. } | Topology::Cluster { userinfo, .. } => {
                userinfo.split(':').next().map(str::to_string)
            }
        };
        userinfo
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "default".into())
    }

    /// A client for one server of this address: the data node at `node`
    /// (with the URL's credentials and database), or a sentinel (`auth`:
    /// with the credentials, for a sentinel that asks for them).
    pub fn client_at(&self, node: &Node, data: bool, auth: bool) -> Result<Client, Error> {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let (userinfo, db) = match &self.topology {
            Topology::Sentinel { userinfo, db, .. } => (userinfo.as_str(), *db),
            Topology::Cluster { userinfo, .. } => (userinfo.as_str(), 0),
            Topology::Server => ("", 0),
        };
        let at = if (data || auth) && !userinfo.is_empty() {
            format!("{userinfo}@")
        } else {
            String::new()
        };
        let db = if data {
            format!("/{db}")
        } else {
            String::new()
        };
        let fragment = if self.insecure { "#insecure" } else { "" };
        self.client_from(&format!("{scheme}://{at}{node}{db}{fragment}"))
    }

    /// The client of a cluster found through `nodes`; `op` bounds each
    /// request to a node, and a request follows one redirection at most
    /// (a slot moved) before it fails and is retried as lockrun retries.
    pub fn cluster(&self, nodes: &[Node], op: Duration) -> Result<ClusterClient, Error> {
        let bad_url = |e: redis::RedisError| {
            Error::Request(format!(
                "invalid --url {}: {}",
                self.display,
                crate::log::redact(&e.to_string())
            ))
        };
        let scheme = if self.tls { "rediss" } else { "redis" };
        let userinfo = match &self.topology {
            Topology::Cluster { userinfo, .. } if !userinfo.is_empty() => format!("{userinfo}@"),
            _ => String::new(),
        };
        let fragment = if self.insecure { "#insecure" } else { "" };
        let urls: Vec<String> = nodes
            .iter()
            .map(|n| format!("{scheme}://{userinfo}{n}{fragment}"))
            .collect();
        let mut builder = ClusterClient::builder(urls)
            .retries(1)
            .connection_timeout(op)
            .response_timeout(op);
        if self.tls {
            let _ = rustls::crypto::ring::default_provider().install_default();
            if let Some(path) = &self.ca_file {
                let root_cert = std::fs::read(path).map_err(|e| {
                    Error::Request(format!("cannot read --tls-ca {}: {e}", path.display()))
                })?;
                builder = builder.certs(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                });
            }
        }
        builder.build().map_err(bad_url)
    }

    /// The client for a one-server address.
    pub fn client(&self) -> Result<Client, Error> {
        self.client_from(&self.url)
    }

    fn client_from(&self, url: &str) -> Result<Client, Error> {
        let bad_url = |e: redis::RedisError| {
            Error::Request(format!(
                "invalid --url {}: {}",
                self.display,
                crate::log::redact(&e.to_string())
            ))
        };
        let info = url.into_connection_info().map_err(bad_url)?;
        // CLIENT SETINFO costs a round trip on every connect and tells the server nothing it needs.
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let info = info.set_redis_settings(settings);
        if !self.tls {
            return Client::open(info).map_err(bad_url);
        }
        // One crypto provider for rustls; a second install attempt is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let root_cert = match &self.ca_file {
            None => None,
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                Error::Request(format!("cannot read --tls-ca {}: {e}", path.display()))
            })?),
        };
        Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert,
            },
        )
        .map_err(bad_url)
    }
}

impl Address for RedisUrl {
    fn shown(&self) -> String {
        self.display.clone()
    }
    fn secret(&self) -> Option<&str> {
        self.password.as_deref()
    }
    fn check_name(&self, name: &str) -> Result<(), Error> {
        if name.contains(['{', '}']) {
            return Err(Error::Request(format!(
                "invalid lock name {name:?}: '{{' and '}}' are not allowed on Redis (the name is the key's hash tag)"
            )));
        }
        Ok(())
    }
    fn check_prefix(&self, prefix: &str) -> Result<(), Error> {
        if prefix.contains(['{', '}']) {
            return Err(Error::Request(format!(
                "invalid --prefix {prefix:?}: it may not contain '{{' or '}}' (the lock name is the hash tag)"
            )));
        }
        Ok(())
    }
    fn open(&self, how: &Opening) -> Result<Box<dyn Engine>, Error> {
        Ok(Box::new(Redis::connect(self, how)?))
    }
    fn doctor(&self, how: &Opening) -> Vec<Check> {
        super::doctor::doctor(self, how)
    }
}

/// Parse `redis://[user][:pass@]host[:port][/db]`, `rediss://…`, or their
/// `+sentinel` forms.
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    let scheme = raw
        .split_once("://")
        .map_or(String::new(), |(s, _)| s.to_ascii_lowercase());
    if scheme.ends_with("+sentinel") || scheme.ends_with("+cluster") {
        return Ok(Arc::new(parse_multi(raw, opts)?));
    }
    let usage = Error::Request;
    let expected = format!("expected {}", ENGINE.form);
    // The user and password run to the last '@', as in the multi-host
    // forms: a password holding '/', '?', '#' or '@' unencoded would
    // otherwise end early, the URL parser taking the rest of it for the
    // path (and echoing it). Those characters are encoded here.
    let raw = &userinfo_encoded(raw);
    // Never echo the raw URL: it may hold a password.
    let url = url::Url::parse(raw).map_err(|e| usage(format!("invalid --url: {e}; {expected}")))?;
    // Shown without its query (a `?password=` is a secret to some clients)
    // and without a lone user name (some clients read it as the password).
    let mut shown = url.clone();
    if url.password().is_some() {
        let _ = shown.set_password(Some("***"));
    } else if !url.username().is_empty() {
        let _ = shown.set_username("***");
    }
    shown.set_query(None);
    let display = shown.to_string();
    if url.host_str().is_none_or(str::is_empty) {
        return Err(usage(format!(
            "invalid --url {display}: missing host; {expected}"
        )));
    }
    let db = url.path().trim_matches('/');
    // Redis numbers its databases with a C int.
    if !db.is_empty()
        && db
            .parse::<u32>()
            .ok()
            .filter(|d| *d <= i32::MAX as u32)
            .is_none()
    {
        return Err(usage(format!(
            "invalid --url {display}: database {db:?} is not a number from 0 to {}; {expected}",
            i32::MAX
        )));
    }
    let tls = url.scheme() == "rediss";
    if url.query().is_some() {
        return Err(usage(format!(
            "invalid --url {display}: query parameters are not supported; {expected}"
        )));
    }
    let (insecure, ca_file) = tls_options(tls, url.fragment(), &display, opts)?;
    let password = url.password().map(|p| {
        url::form_urlencoded::parse(format!("p={p}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    });
    Ok(Arc::new(RedisUrl {
        url: raw.to_string(),
        display,
        password,
        tls,
        insecure,
        ca_file,
        topology: Topology::Server,
        replicas: opts.replicas,
    }))
}

/// `#insecure` (only with TLS) and the CA file (refused without TLS).
fn tls_options(
    tls: bool,
    fragment: Option<&str>,
    display: &str,
    opts: &AddressOptions,
) -> Result<(bool, Option<PathBuf>), Error> {
    let insecure = match fragment {
        None => false,
        Some("insecure") if tls => true,
        Some(_) => {
            return Err(Error::Request(format!(
                "invalid --url {display}: the only fragment accepted is #insecure, with TLS (rediss)"
            )));
        }
    };
    Ok((insecure, opts.ca_file(tls, display)?))
}

/// `raw` with '/', '?', '#' and '@' percent-encoded in its user and
/// password (everything before the last '@' after the scheme).
fn userinfo_encoded(raw: &str) -> String {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return raw.to_string();
    };
    let Some((userinfo, hosts)) = rest.rsplit_once('@') else {
        return raw.to_string();
    };
    let mut info = String::new();
    for c in userinfo.chars() {
        match c {
            '/' => info.push_str("%2F"),
            '?' => info.push_str("%3F"),
            '#' => info.push_str("%23"),
            '@' => info.push_str("%40"),
            c => info.push(c),
        }
    }
    format!("{scheme}://{info}@{hosts}")
}

/// `redis+sentinel://[user[:pass]@]h1[:p1][,h2[:p2]…]/MASTER[/db]` and
/// `redis+cluster://[user[:pass]@]h1[:p1][,h2[:p2]…]`, also with `rediss`
/// (TLS to every node). `url::Url` cannot read a list of hosts, so this
/// reads it by hand.
fn parse_multi(raw: &str, opts: &AddressOptions) -> Result<RedisUrl, Error> {
    let (scheme, rest) = raw.split_once("://").expect("the caller found a scheme");
    let scheme = scheme.to_ascii_lowercase();
    let tls = scheme.starts_with("rediss+");
    let sentinel = scheme.ends_with("+sentinel");
    let expected = if sentinel {
        "expected redis+sentinel://[user:pass@]host[:port][,host[:port]…]/MASTER[/db]"
    } else {
        "expected redis+cluster://[user:pass@]host[:port][,host[:port]…]"
    };
    // The credentials first, up to the last `@`: a password may hold a
    // `/` or `#` that was not percent-encoded, and none of it may end up
    // in the hosts or the path, which messages show.
    let (login, rest) = crate::backend::credentials(rest);
    let (rest, fragment) = match rest.split_once('#') {
        Some((r, f)) => (r, Some(f)),
        None => (rest, None),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let NodeLogin {
        password,
        userinfo,
        shown_user,
    } = node_login(login);
    let shown_hosts = crate::backend::shown_hosts(hosts.split('?').next().unwrap_or_default());
    let shown_path = match path.split('?').next().unwrap_or_default() {
        "" => String::new(),
        p => format!("/{p}"),
    };
    let display = format!("{scheme}://{shown_user}{shown_hosts}{shown_path}");
    let usage = |why: &str| Error::Request(format!("invalid --url {display}: {why}; {expected}"));
    if path.contains('?') || hosts.contains('?') {
        return Err(usage("query parameters are not supported"));
    }
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        let default_port = if sentinel { 26379 } else { 6379 };
        nodes.push(node(host, default_port).ok_or_else(|| {
            usage(
                "an address is not host[:port] (not shown: it may be a password, if the host \
                 was left out)",
            )
        })?);
    }
    let (insecure, ca_file) = tls_options(tls, fragment, &display, opts)?;
    let userinfo = userinfo.to_string();
    let topology = if sentinel {
        let (master, db) = master_and_db(path).map_err(|why| usage(&why))?;
        Topology::Sentinel {
            sentinels: nodes,
            master,
            userinfo,
            db,
        }
    } else {
        cluster(nodes, userinfo, path, opts).map_err(|why| match why {
            Some(why) => usage(why),
            None => Error::Request(format!(
                "--replicas is not supported on a cluster ({display})"
            )),
        })?
    };
    Ok(RedisUrl {
        url: String::new(),
        display,
        password,
        tls,
        insecure,
        ca_file,
        replicas: if sentinel { opts.replicas } else { 0 },
        topology,
    })
}

/// A cluster's topology; Err(Some): the URL's usage is wrong (why),
/// Err(None): `--replicas` was asked for.
fn cluster(
    nodes: Vec<Node>,
    userinfo: String,
    path: &str,
    opts: &AddressOptions,
) -> Result<Topology, Option<&'static str>> {
    // A cluster has one database, 0.
    if !path.is_empty() {
        return Err(Some("a cluster has no database to choose"));
    }
    // Refused also when it came from the environment: it was meant for
    // Redis, and a cluster would silently not wait for replicas.
    if opts.replicas > 0 {
        return Err(None);
    }
    Ok(Topology::Cluster { nodes, userinfo })
}

/// A multi-host URL's credentials as its nodes get them: the password,
/// the userinfo every node's URL carries (percent-encoded), and what
/// messages show of it.
struct NodeLogin {
    password: Option<String>,
    userinfo: String,
    shown_user: String,
}

fn node_login(login: Credentials) -> NodeLogin {
    let Credentials {
        user,
        password,
        shown,
    } = login;
    let user = user.unwrap_or_default();
    let encoded = {
        let mut u = url::Url::parse("redis://h").expect("a valid URL");
        let _ = u.set_username(&user);
        let _ = u.set_password(password.as_deref());
        match u.password() {
            Some(p) => format!("{}:{p}", u.username()),
            None => u.username().to_string(),
        }
    };
    // `@host` names no user: nothing to hide, nothing shown.
    let shown_user = if user.is_empty() && password.is_none() {
        String::new()
    } else {
        shown
    };
    NodeLogin {
        password,
        userinfo: encoded,
        shown_user,
    }
}

/// A sentinel URL's path: `MASTER[/db]`.
fn master_and_db(path: &str) -> Result<(String, u32), String> {
    let mut parts = path.split('/');
    let master = crate::backend::percent_decoded_leniently(parts.next().unwrap_or(""));
    if master.is_empty() {
        return Err("no master name".into());
    }
    let db = match parts.next() {
        None | Some("") => 0,
        Some(d) => d
            .parse::<u32>()
            .ok()
            .filter(|d| *d <= i32::MAX as u32)
            .ok_or_else(|| format!("database {d:?} is not a number from 0 to {}", i32::MAX))?,
    };
    if parts.next().is_some_and(|p| !p.is_empty()) {
        return Err("too many parts in the path".into());
    }
    Ok((master, db))
}

/// `host[:port]`, `[v6]:port`; None when it is not one.
fn node(text: &str, default_port: u16) -> Option<Node> {
    let (host, port) = if let Some(v6) = text.strip_prefix('[') {
        let (addr, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        (format!("[{addr}]"), port)
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (text.to_string(), default_port),
        }
    };
    let plain =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']');
    (port > 0 && !host.is_empty() && host.chars().all(plain)).then_some(Node { host, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(raw: &str) -> Result<Arc<dyn Address>, Error> {
        parse(raw, &AddressOptions::default())
    }

    #[test]
    fn sentinel_urls_name_their_sentinels_master_and_database() {
        let a = sentinel("redis+sentinel://u:p%40ss@h1,h2:26380,[::1]:7/mymaster/3").unwrap();
        assert_eq!(a.secret(), Some("p@ss"));
        assert!(
            !a.shown().contains("p@ss") && !a.shown().contains("p%40ss"),
            "{}",
            a.shown()
        );
        assert_eq!(
            a.shown(),
            "redis+sentinel://u:***@h1,h2:26380,[::1]:7/mymaster/3"
        );
        assert!(
            a.check_name("a{b}").is_err(),
            "Redis's own name rules apply"
        );
        for bad in [
            "redis+sentinel://h1",
            "redis+sentinel://h1/",
            "redis+sentinel://h1:0/m",
            "redis+sentinel://h1:99999/m",
            "redis+sentinel://h1,/m",
            "redis+sentinel://h 1/m",
            "redis+sentinel://h1/m/x",
            "redis+sentinel://h1/m/0/1",
            "redis+sentinel://h1/m?x=1",
            "redis+sentinel://h1/m#insecure",
            "redis+sentinel://u:s3cret@h1:x/m",
        ] {
            let e = sentinel(bad).unwrap_err();
            assert!(matches!(e, Error::Request(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
        assert!(sentinel("rediss+sentinel://h1/m#insecure").is_ok());
    }

    #[test]
    fn a_server_url_s_password_runs_to_the_last_at() {
        for (raw, pw) in [
            ("redis://u:a@b/SECRET@127.0.0.1:6379", "a@b/SECRET"),
            ("redis://u:p?q#r@h/2", "p?q#r"),
            ("redis://:pa%40ss@h", "pa@ss"),
        ] {
            let a = parse(raw, &AddressOptions::default()).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert_eq!(a.secret(), Some(pw), "{raw}");
            assert!(!a.shown().contains("SECRET"), "{}", a.shown());
        }
        let e = parse("redis://u:a@b/SECRET@h:x", &AddressOptions::default()).unwrap_err();
        assert!(!e.to_string().contains("SECRET"), "{e}");
    }

    #[test]
    fn a_password_with_slashes_or_hashes_stays_a_password() {
        for (raw, shown) in [
            (
                "redis+sentinel://u:pa/ss@h1/m",
                "redis+sentinel://u:***@h1/m",
            ),
            (
                "redis+sentinel://u:2024/x@h1/m",
                "redis+sentinel://u:***@h1/m",
            ),
            ("redis+cluster://u:p#w@h1,h2", "redis+cluster://u:***@h1,h2"),
        ] {
            let a = sentinel(raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert_eq!(a.shown(), shown);
            assert!(a.secret().is_some_and(|p| p.contains(['/', '#'])), "{raw}");
        }
        let r = parse_multi("redis+sentinel://u:pa/ss@h1/m", &AddressOptions::default()).unwrap();
        let node = Node {
            host: "127.0.0.1".into(),
            port: 1,
        };
        let data = r.client_at(&node, true, true).unwrap();
        assert_eq!(
            data.get_connection_info().redis_settings().password(),
            Some("pa/ss")
        );
        let e = sentinel("redis+sentinel://u:s3/cr3t@h 1/m").unwrap_err();
        assert!(!e.to_string().contains("cr3t"), "{e}");
    }

    #[test]
    fn a_data_node_gets_the_url_s_credentials_and_database() {
        let r = parse_multi("redis+sentinel://u:pw@s1/m/2", &AddressOptions::default()).unwrap();
        let node = Node {
            host: "127.0.0.1".into(),
            port: 6390,
        };
        let data = r.client_at(&node, true, true).unwrap();
        let info = data.get_connection_info();
        assert_eq!(info.redis_settings().db(), 2);
        assert_eq!(info.redis_settings().password(), Some("pw"));
        // A sentinel is asked without them first.
        let plain = r.client_at(&node, false, false).unwrap();
        assert_eq!(
            plain.get_connection_info().redis_settings().password(),
            None
        );
        assert_eq!(r.user(), "u");
    }
}
