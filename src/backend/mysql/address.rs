//! A MySQL or MariaDB address: `mysql://` or `mariadb://`, the user,
//! password, host, port and database of the URL, `ssl-mode` and `socket`
//! from its query, the password from `MYSQL_PWD` when the URL has none;
//! which part is secret; and `--prefix` as the start of the tables' names.

use std::sync::Arc;
use std::time::Duration;

use super::ENGINE;
use super::client::Client;
use super::sql::Tables;
use crate::backend::sql::address::{Env, Part, Url, Userinfo, from_env, os_user, plain_prefix};
use crate::backend::{Address, AddressOptions, Check, EngineInfo, Error, Opening};

/// The server's port when the URL names none.
const DEFAULT_PORT: u16 = 3306;

/// How the connection is protected (the `mysql` client's `--ssl-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disabled,
    /// TLS when the server offers it, plain otherwise; the certificate is
    /// not checked.
    Preferred,
    /// TLS or nothing; the certificate is checked only against a CA given
    /// (`--tls-ca`), as the `mysql` client does.
    Required,
    /// TLS, the certificate signed by a trusted CA (any name).
    VerifyCa,
    /// TLS, the certificate signed by a trusted CA and naming the host.
    VerifyIdentity,
}

/// A database's address (lockrun-engines(7) "MYSQL AND MARIADB").
pub type MyUrl = Url<MyDb>;

/// What a MySQL URL says besides the login: the database, and how to
/// reach its server.
#[derive(Clone)]
pub struct MyDb {
    pub host: String,
    pub port: u16,
    /// A Unix socket to connect through instead of TCP.
    pub socket: Option<String>,
    pub database: String,
    pub ssl_mode: SslMode,
}

impl Part for MyDb {
    type Dialect = Tables;
    const ENGINE: &'static EngineInfo = &ENGINE;
    const SECRET_ENV: &'static str = "MYSQL_PWD";

    fn tables(prefix: &str) -> Result<Tables, Error> {
        tables_of(prefix).map(|base| Tables::new(&base))
    }
    fn client(url: &MyUrl, op: Duration) -> Client {
        Client::new(Arc::new(url.clone()), op)
    }
    fn doctor(url: &MyUrl, how: &Opening) -> Vec<Check> {
        super::doctor::doctor(url, how)
    }
}

/// The start of the tables' names that `--prefix` names: the prefix less
/// one trailing `:` (so the default `lockrun:` makes `lockrun_leases`), a
/// plain lower-case identifier that needs no quoting anywhere.
pub fn tables_of(prefix: &str) -> Result<String, Error> {
    match plain_prefix(prefix) {
        Some(base) => Ok(base.to_string()),
        None => {
            let shown: String = prefix.chars().take(60).collect();
            Err(Error::Request(format!(
                "invalid --prefix {shown:?} for MySQL: it starts the names of lockrun's \
                 tables, so it must be a lower-case identifier (a-z, 0-9, _, at most 48), \
                 optionally followed by ':' (the default lockrun: makes the tables \
                 lockrun_leases, lockrun_waiters and lockrun_tokens)"
            )))
        }
    }
}

/// Parse `mysql://[user[:pass]@]host[:port][/db][?ssl-mode=…&socket=…]`.
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    let mut url = read(raw, &from_env)?;
    if url.ssl_mode == SslMode::Disabled || url.socket.is_some() {
        opts.no_tls(&url.display)?;
    } else if url.ca_file.is_none() {
        url.ca_file = opts.tls_ca.clone();
    }
    opts.no_replicas(&url.display)?;
    Ok(Arc::new(url))
}

fn read(raw: &str, env: Env) -> Result<MyUrl, Error> {
    let bad =
        |why: String| Error::Request(format!("invalid --url: {why}; expected {}", ENGINE.form));
    let parts = split(raw).map_err(bad)?;
    let display = parts.shown();
    let user = match parts.login.user {
        Some(u) => crate::backend::percent_decoded(u)
            .ok_or_else(|| bad("the user has a bad %-escape".into()))?,
        None => os_user().unwrap_or_else(|| "root".into()),
    };
    if user.is_empty() {
        return Err(bad("the user is empty".into()));
    }
    let (password, password_from_env) = match parts.login.password {
        Some(p) => (
            Some(
                crate::backend::percent_decoded(p)
                    .ok_or_else(|| bad("the password has a bad %-escape".into()))?,
            ),
            false,
        ),
        None => match env("MYSQL_PWD") {
            Some(p) => (Some(p), true),
            None => (None, false),
        },
    };
    let (host, port) = host_port(parts.hostport).map_err(bad)?;
    let database = database(parts.path).map_err(bad)?;
    let (ssl_mode, socket) = params(parts.query).map_err(bad)?;
    if host.is_empty() && socket.is_none() {
        return Err(bad("it names no host".into()));
    }
    // The socket is no secret, and says which server a message is about.
    let display = match &socket {
        Some(s) => format!("{display}?socket={}", crate::text::printable(s)),
        None => display,
    };
    Ok(Url {
        user,
        password,
        password_from_env,
        ca_file: None,
        display,
        part: MyDb {
            host: if host.is_empty() {
                "localhost".into()
            } else {
                host
            },
            port,
            socket,
            database,
            ssl_mode,
        },
    })
}

/// A URL's parts as written, before any is decoded.
struct Parts<'a> {
    scheme: String,
    login: Userinfo<'a>,
    hostport: &'a str,
    path: Option<&'a str>,
    query: Option<&'a str>,
}

fn split(raw: &str) -> Result<Parts<'_>, String> {
    let (scheme, rest) = raw.split_once("://").ok_or("no scheme")?;
    // The user and password run to the last '@', before the path and the
    // query are split off: a password may hold '/', '?' or '@' unencoded.
    // An '@' in a socket's path is not that one. Never echo the raw URL,
    // nor any part of what precedes that '@'.
    let (userinfo, rest) = match user_end(rest) {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    if rest.contains('#') {
        return Err(
            "it has a fragment (#…), which no MySQL URL has (write a '#' in a \
                    database or socket name as %23)"
                .into(),
        );
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (hostport, path) = match rest.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (rest, None),
    };
    Ok(Parts {
        scheme: scheme.to_ascii_lowercase(),
        login: Userinfo::split(userinfo),
        hostport,
        path,
        query,
    })
}

impl Parts<'_> {
    /// The URL for messages, its password replaced (the socket is added
    /// once read).
    fn shown(&self) -> String {
        // A port that is not a number may be a password whose host was left
        // out (`user:pass` read as a host and a port): that host is never shown.
        let port_reads = |p: &str| p.parse::<u16>().is_ok_and(|p| p > 0);
        let hostport = self.hostport;
        let readable = match hostport.strip_prefix('[').and_then(|r| r.split_once(']')) {
            Some((_, after)) => after.is_empty() || after.strip_prefix(':').is_some_and(port_reads),
            None => match hostport.rsplit_once(':') {
                Some((h, p)) => !h.contains(':') && port_reads(p),
                None => true,
            },
        };
        let shown_hostport = if readable { hostport } else { "(hidden)" };
        let mut display = format!("{}://{}{shown_hostport}", self.scheme, self.login.shown());
        if let Some(p) = self.path.filter(|p| !p.is_empty()) {
            display.push('/');
            display.push_str(p);
        }
        crate::text::printable(&display).into_owned()
    }
}

/// The host (empty: none given) and port of `host[:port]` or `[v6][:port]`.
fn host_port(hostport: &str) -> Result<(String, u16), String> {
    let (host, port) = match crate::backend::bracketed_host(hostport, "host")? {
        Some((h, p)) => (h.to_string(), p),
        None => match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        },
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or(
            "the port is not a port number (not shown: it may be a password, if the host \
             was left out)",
        )?,
    };
    let host = crate::backend::percent_decoded(&host).ok_or("the host has a bad %-escape")?;
    if host
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || "/@?#".contains(c))
    {
        return Err("the host is not a host name or address".into());
    }
    Ok((host, port))
}

/// The database the path names, where lockrun keeps its tables.
fn database(path: Option<&str>) -> Result<String, String> {
    let database = match path {
        Some(p) if !p.is_empty() => {
            crate::backend::percent_decoded(p).ok_or("the database has a bad %-escape")?
        }
        _ => return Err("it names no database (…/dbname), where lockrun keeps its tables".into()),
    };
    // At most 64 characters, not bytes; any other rule is the server's to
    // apply (the name is sent as it is, never written into a statement).
    if database.chars().count() > 64 || database.contains('\0') {
        return Err("the database name is not one MySQL allows".into());
    }
    Ok(database)
}

/// `ssl-mode` and `socket` from the query, the only parameters there are.
fn params(query: Option<&str>) -> Result<(SslMode, Option<String>), String> {
    let mut ssl_mode = SslMode::Preferred;
    let mut socket = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = crate::backend::percent_decoded(v).ok_or("a parameter has a bad %-escape")?;
        match k.to_ascii_lowercase().replace('_', "-").as_str() {
            "ssl-mode" | "sslmode" => ssl_mode = ssl_mode_of(&v)?,
            "socket" => {
                if !v.starts_with('/') {
                    return Err("socket must be an absolute path".into());
                }
                socket = Some(v);
            }
            other => {
                let shown: String = other.chars().take(30).collect();
                return Err(format!(
                    "unknown parameter {:?} (lockrun knows ssl-mode and socket)",
                    crate::text::printable(&shown)
                ));
            }
        }
    }
    Ok((ssl_mode, socket))
}

fn ssl_mode_of(v: &str) -> Result<SslMode, String> {
    Ok(match v.to_ascii_uppercase().replace('-', "_").as_str() {
        "DISABLED" => SslMode::Disabled,
        "PREFERRED" => SslMode::Preferred,
        "REQUIRED" => SslMode::Required,
        "VERIFY_CA" => SslMode::VerifyCa,
        "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
        other => {
            return Err(format!(
                "ssl-mode {:?} is none of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, \
                 VERIFY_IDENTITY",
                crate::text::printable(other)
            ));
        }
    })
}

/// Where the user and password end: the last '@' that is not in the
/// value of a `socket` parameter; failing that, the last '@'.
fn user_end(rest: &str) -> Option<usize> {
    let last = rest.rfind('@')?;
    let in_socket = |at: usize| {
        let before = &rest[..at];
        let param = before.rsplit(['?', '&']).next().unwrap_or("");
        before.contains('?') && param.to_ascii_lowercase().starts_with("socket=")
    };
    Some(
        rest.match_indices('@')
            .map(|(i, _)| i)
            .rev()
            .find(|&i| !in_socket(i))
            .unwrap_or(last),
    )
}

#[cfg(test)]
pub(super) fn tests_url() -> MyUrl {
    read("mysql://u:pw@h/db", &|_| None).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_none(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn urls_are_read_as_the_mysql_client_reads_them() {
        let u = read(
            "mysql://app:s3cret@db.example:3307/ci?ssl-mode=REQUIRED",
            &env_none,
        )
        .unwrap();
        assert_eq!((u.host.as_str(), u.port), ("db.example", 3307));
        assert_eq!((u.user.as_str(), u.database.as_str()), ("app", "ci"));
        assert_eq!(u.password.as_deref(), Some("s3cret"));
        assert_eq!(u.ssl_mode, SslMode::Required);
        assert!(!u.display.contains("s3cret"), "{}", u.display);
        let m = read(
            "mariadb://u@[::1]/d?socket=/run/mysqld/mysqld.sock",
            &env_none,
        )
        .unwrap();
        assert_eq!((m.host.as_str(), m.port), ("::1", 3306));
        assert_eq!(m.socket.as_deref(), Some("/run/mysqld/mysqld.sock"));
        let pwd = |k: &str| (k == "MYSQL_PWD").then(|| "envpw".to_string());
        let e = read("mysql://u@h/d", &pwd).unwrap();
        assert_eq!(e.password.as_deref(), Some("envpw"));
        assert!(e.password_from_env);
        let s = read("mysql://u:a/b?c@d@h:3307/db?ssl-mode=DISABLED", &env_none).unwrap();
        assert_eq!(s.password.as_deref(), Some("a/b?c@d"));
        assert_eq!(
            (s.host.as_str(), s.port, s.database.as_str()),
            ("h", 3307, "db")
        );
        assert_eq!(s.ssl_mode, SslMode::Disabled);
        assert!(!s.display.contains("a/b"), "{}", s.display);
        let at = read(
            "mysql://u:p@ss@localhost/d?socket=/run/a@b/s.sock",
            &env_none,
        )
        .unwrap();
        assert_eq!(at.socket.as_deref(), Some("/run/a@b/s.sock"));
        assert_eq!(
            (at.user.as_str(), at.password.as_deref()),
            ("u", Some("p@ss"))
        );
        assert!(
            at.display.ends_with("?socket=/run/a@b/s.sock"),
            "{}",
            at.display
        );
        let q = read("mysql://u@h/a%60b", &env_none).unwrap();
        assert_eq!(q.database, "a`b");
        let long = "б".repeat(64);
        assert_eq!(
            read(&format!("mysql://u@h/{long}"), &env_none)
                .unwrap()
                .database,
            long
        );
        for bad in [
            "mysql://u:s3cret@h",
            "mysql://u:s3cret@h:0/d",
            "mysql://u:s3cret@h:99999/d",
            "mysql://u:s3cret@h/d?ssl-mode=SOMETIMES",
            "mysql://u:s3cret@h/d?colour=blue",
            "mysql://u:s3cret@h/d?socket=relative",
            "mysql://u:s3cret@/d",
            "mysql://u:s3cret@h/d%zz",
            &format!("mysql://u:s3cret@h/{}", "d".repeat(65)),
            "mysql://u:s3cret@h/d#frag",
            "mysql://u:s3c#ret@h/d#frag",
            "mysql://u:s3c?ret@h",
            "mysql://u:s3c/ret@h:1x/d",
        ] {
            let e = read(bad, &env_none).unwrap_err();
            assert!(matches!(e, Error::Request(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("s3c"), "{e}");
        }
    }

    #[test]
    fn a_prefix_names_plain_tables() {
        assert_eq!(tables_of("lockrun:").unwrap(), "lockrun");
        assert_eq!(tables_of("ci_locks").unwrap(), "ci_locks");
        for bad in ["", "Upper", "a-b", "a;b", "1x", &"x".repeat(49)] {
            assert!(tables_of(bad).is_err(), "{bad}");
        }
    }
}
