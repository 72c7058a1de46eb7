//! A PostgreSQL address: libpq's URL form (`postgres://` and
//! `postgresql://`) with the `PG*` variables filling in what the URL leaves
//! out, as libpq reads them; which part is secret; and `--prefix` as the
//! schema that holds lockrun's tables.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::ENGINE;
use super::client::Client;
use super::sql::Tables;
use crate::backend::sql::address::{Env, Part, Url, Userinfo, from_env, os_user, plain_prefix};
use crate::backend::{Address, AddressOptions, Check, EngineInfo, Error, Opening};

/// PostgreSQL's port when neither the URL nor PGPORT names one.
const DEFAULT_PORT: u16 = 5432;

/// Where Debian's libpq looks for the server's socket when no host is given.
const SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// How the connection is protected (libpq's `sslmode`, with libpq's
/// meaning: lockrun-engines(7) "POSTGRESQL").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    /// `allow` and `prefer`: TLS when the server offers it, plain
    /// otherwise; the certificate is not checked.
    Prefer,
    /// TLS or nothing; the certificate is checked only against a CA given
    /// (`sslrootcert`, `--tls-ca`), as libpq does with a root file.
    Require,
    /// TLS, the certificate signed by a trusted CA (any name).
    VerifyCa,
    /// TLS, the certificate signed by a trusted CA and naming the host.
    VerifyFull,
}

/// One server of the URL's host list: a TCP host or a socket directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub host: String,
    pub port: u16,
}

/// A database's address (lockrun-engines(7) "POSTGRESQL").
pub type PgUrl = Url<PgDb>;

/// What a PostgreSQL URL says besides the login: the database, and the
/// servers to try for it.
#[derive(Clone)]
pub struct PgDb {
    /// Tried in the order given, as libpq does.
    pub servers: Vec<Server>,
    pub dbname: String,
    pub sslmode: SslMode,
}

impl Part for PgDb {
    type Dialect = Tables;
    const ENGINE: &'static EngineInfo = &ENGINE;
    const SECRET_ENV: &'static str = "PGPASSWORD";

    fn tables(prefix: &str) -> Result<Tables, Error> {
        schema_of(prefix).map(|schema| Tables::new(&schema))
    }
    fn client(url: &PgUrl, op: Duration) -> Client {
        Client::new(Arc::new(url.clone()), op)
    }
    fn doctor(url: &PgUrl, how: &Opening) -> Vec<Check> {
        super::doctor::doctor(url, how)
    }
}

/// The schema `--prefix` names: the prefix less one trailing `:` (so the
/// default `lockrun:` is the schema `lockrun`), a plain lower-case SQL
/// identifier that needs no quoting anywhere.
pub fn schema_of(prefix: &str) -> Result<String, Error> {
    match plain_prefix(prefix).filter(|schema| !schema.starts_with("pg_")) {
        Some(schema) => Ok(schema.to_string()),
        None => {
            let shown: String = prefix.chars().take(60).collect();
            Err(Error::Request(format!(
                "invalid --prefix {shown:?} for PostgreSQL: it names the schema of lockrun's \
                 tables, so it must be a lower-case identifier (a-z, 0-9, _, at most 48, not \
                 starting with pg_), optionally followed by ':' (the default lockrun: is the \
                 schema lockrun)"
            )))
        }
    }
}

/// Parse `postgres://[user[:password]@][host][:port][,host[:port]…][/dbname][?param=value&…]`.
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    let mut url = read(raw, &from_env)?;
    if url.sslmode == SslMode::Disable {
        opts.no_tls(&url.display)?;
    } else if url.ca_file.is_none() {
        url.ca_file = opts.tls_ca.clone();
    }
    opts.no_replicas(&url.display)?;
    Ok(Arc::new(url))
}

fn read(raw: &str, env: Env) -> Result<PgUrl, Error> {
    let expected = format!("expected {}", ENGINE.form);
    let parts = split(raw, &expected)?;
    let r = Reading {
        display: parts.shown(),
        expected: &expected,
    };
    let mut q = Query {
        user: r.text_of("user name", parts.login.user)?,
        password: r.text_of("password", parts.login.password)?,
        dbname: r.text_of("database name", parts.path.filter(|p| !p.is_empty()))?,
        ..Query::default()
    };
    q.read(parts.query, &r)?;
    if parts.hosts.contains(['/', '#']) || parts.path.is_some_and(|p| p.contains(['/', '#'])) {
        return Err(r.bad("a database name is one path segment".into()));
    }

    // What the URL leaves out, the environment says, then libpq's defaults.
    let password_from_env = q.password.is_none() && env("PGPASSWORD").is_some();
    let password = q.password.or_else(|| env("PGPASSWORD"));
    let user = match q.user.filter(|u| !u.is_empty()).or_else(|| env("PGUSER")) {
        Some(u) => u,
        None => {
            os_user().ok_or_else(|| r.bad("no user name: give one in the URL or PGUSER".into()))?
        }
    };
    let dbname = q
        .dbname
        .filter(|d| !d.is_empty())
        .or_else(|| env("PGDATABASE"))
        .unwrap_or_else(|| user.clone());
    let sslmode = q.sslmode.or_else(|| env("PGSSLMODE"));
    let sslmode = sslmode_of(sslmode.as_deref().unwrap_or("prefer")).map_err(|e| r.bad(e))?;
    let rootcert = q
        .rootcert
        .or_else(|| env("PGSSLROOTCERT").map(PathBuf::from));
    let port = q.port.or_else(|| env("PGPORT"));
    let host = q.host.or_else(|| env("PGHOST"));
    let servers = servers(parts.hosts, host, port).map_err(|e| r.bad(e))?;
    Ok(Url {
        user,
        password,
        password_from_env,
        ca_file: rootcert,
        display: r.display,
        part: PgDb {
            servers,
            dbname,
            sslmode,
        },
    })
}

/// A URL's parts as written, before any is decoded.
struct Parts<'a> {
    scheme: String,
    login: Userinfo<'a>,
    hosts: &'a str,
    path: Option<&'a str>,
    query: Option<&'a str>,
}

fn split<'a>(raw: &'a str, expected: &str) -> Result<Parts<'a>, Error> {
    let (scheme, rest) = raw
        .split_once("://")
        .ok_or_else(|| Error::Request(format!("invalid --url: {expected}")))?;
    // An '@' after a '/', '?' or '#' is most likely a password that did not
    // percent-encode them: split there, it would reach messages and
    // `status` as a host, a port or a database name. Refused, echoing none
    // of it.
    if let Some(cut) = rest.find(['/', '?', '#'])
        && rest[cut..].contains('@')
    {
        return Err(Error::Request(format!(
            "invalid --url: an '@' after a '/', '?' or '#'; percent-encode them in a \
             user name or password (%2F, %3F, %23) and an '@' elsewhere (%40); {expected}"
        )));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (rest, None),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    Ok(Parts {
        scheme: scheme.to_ascii_lowercase(),
        login: Userinfo::split(userinfo),
        hosts,
        path,
        query,
    })
}

impl Parts<'_> {
    /// The URL for messages: never the raw URL, which may hold a password.
    fn shown(&self) -> String {
        // A host that does not read (the host left out, so that `user:pass`
        // reads as a host and a port) is never shown.
        let shown_hosts: Vec<&str> = self
            .hosts
            .split(',')
            .map(|h| {
                if h.is_empty() || server(h, 5432).is_ok() {
                    h
                } else {
                    "(hidden)"
                }
            })
            .collect();
        let mut display = format!(
            "{}://{}{}",
            self.scheme,
            self.login.shown(),
            shown_hosts.join(",")
        );
        if let Some(p) = self.path.filter(|p| !p.is_empty()) {
            display.push('/');
            display.push_str(p);
        }
        if let Some(q) = self.query {
            display.push('?');
            display.push_str(&shown_query(q));
        }
        display.chars().take(200).collect()
    }
}

/// A URL being read: how it is shown, and what a refusal of it says.
struct Reading<'a> {
    display: String,
    expected: &'a str,
}

impl Reading<'_> {
    fn bad(&self, why: String) -> Error {
        Error::Request(format!(
            "invalid --url {}: {why}; {}",
            self.display, self.expected
        ))
    }

    /// `s` %-decoded, or refused as `what` with a bad %-escape.
    fn text(&self, what: &str, s: &str) -> Result<String, Error> {
        crate::backend::percent_decoded(s)
            .ok_or_else(|| self.bad(format!("the {what} has a bad %-escape")))
    }

    fn text_of(&self, what: &str, s: Option<&str>) -> Result<Option<String>, Error> {
        s.map(|s| self.text(what, s)).transpose()
    }
}

/// What the URL says, its query parameters over its other parts.
#[derive(Default)]
struct Query {
    host: Option<String>,
    port: Option<String>,
    user: Option<String>,
    password: Option<String>,
    dbname: Option<String>,
    sslmode: Option<String>,
    rootcert: Option<PathBuf>,
}

impl Query {
    fn read(&mut self, query: Option<&str>, r: &Reading) -> Result<(), Error> {
        for kv in query.unwrap_or("").split('&').filter(|kv| !kv.is_empty()) {
            // libpq decodes the key as well as the value: %70assword is password.
            let (k, v) = match kv.split_once('=') {
                Some((k, v)) => (crate::backend::percent_decoded(k), v),
                None => (crate::backend::percent_decoded(kv), ""),
            };
            let k = k.ok_or_else(|| r.bad("a parameter's name has a bad %-escape".into()))?;
            let k: &str = &k;
            if !kv.contains('=') {
                let k: String = k.chars().take(40).collect();
                return Err(r.bad(format!("the parameter {k:?} has no value")));
            }
            let v = r.text(k, v)?;
            match k {
                "host" => self.host = Some(v),
                "port" => self.port = Some(v),
                "user" => self.user = Some(v),
                "password" => self.password = Some(v),
                "dbname" => self.dbname = Some(v),
                "sslmode" => self.sslmode = Some(v),
                "sslrootcert" => self.rootcert = Some(PathBuf::from(v)),
                // Bounded by lockrun's own request budget instead.
                "connect_timeout" | "application_name" => {}
                other => {
                    return Err(r.bad(format!(
                        "unknown parameter {other:?} (lockrun reads host, port, user, password, \
                         dbname, sslmode, sslrootcert)"
                    )));
                }
            }
        }
        Ok(())
    }
}

fn sslmode_of(mode: &str) -> Result<SslMode, String> {
    Ok(match mode {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            let other: String = other.chars().take(20).collect();
            return Err(format!(
                "sslmode {other:?} is none of disable, allow, prefer, require, verify-ca, verify-full"
            ));
        }
    })
}

/// The servers to try: the URL's host list, else `host` (the parameter or
/// PGHOST), each on `port` unless it names its own; none at all is the
/// default socket directory.
fn servers(hosts: &str, host: Option<String>, port: Option<String>) -> Result<Vec<Server>, String> {
    let default_port = match port.as_deref() {
        None => DEFAULT_PORT,
        Some(p) => self::port(p)?,
    };
    let host_list: Vec<String> = match host {
        Some(h) if hosts.is_empty() => h.split(',').map(String::from).collect(),
        _ => hosts.split(',').map(String::from).collect(),
    };
    let mut servers = Vec::new();
    for h in host_list {
        servers.push(server(&h, default_port)?);
    }
    if servers.len() == 1 && servers[0].host.is_empty() {
        servers[0].host = default_socket_dir(servers[0].port);
    }
    if servers.iter().any(|s| s.host.is_empty()) {
        return Err("an empty host in the host list".into());
    }
    Ok(servers)
}

/// The parameters whose values may be shown: lockrun's own, none secret.
const SHOWN_KEYS: [&str; 8] = [
    "host",
    "port",
    "user",
    "dbname",
    "sslmode",
    "sslrootcert",
    "connect_timeout",
    "application_name",
];

/// The query for messages: a value is shown only for a parameter known
/// not to be secret, its name read as libpq reads it (%-decoded, so
/// `%70assword` is `password`). Any other value is `***`: the password,
/// what libpq keeps secret besides (sslpassword, oauth_client_secret, the
/// scram keys), and any parameter lockrun does not read, which may be a
/// secret of a newer libpq. A name that does not decode is `***` too.
fn shown_query(q: &str) -> String {
    q.split('&')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            match crate::backend::percent_decoded(k) {
                Some(name) if SHOWN_KEYS.contains(&name.as_str()) => kv.to_string(),
                Some(_) if !kv.contains('=') => kv.to_string(),
                Some(_) if v.is_empty() => kv.to_string(),
                Some(_) => format!("{k}=***"),
                None => "***".to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn port(p: &str) -> Result<u16, String> {
    p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
        "a port is not a number from 1 to 65535 (not shown: it may be a password, if the \
             host was left out)"
            .to_string()
    })
}

/// One `host[:port]`, `[v6][:port]` or socket directory of the host list
/// (an empty host: the default, decided later).
fn server(text: &str, default_port: u16) -> Result<Server, String> {
    let text = crate::backend::percent_decoded(text).ok_or("a host has a bad %-escape")?;
    if text.starts_with('/') {
        return Ok(Server {
            host: text,
            port: default_port,
        });
    }
    let (host, p) = if let Some((h, p)) = crate::backend::bracketed_host(&text, "host")? {
        (h.to_string(), p.map(str::to_string))
    } else {
        match text.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p.to_string())),
            None => (text.clone(), None),
        }
    };
    if !host
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
    {
        return Err(
            "a host may only hold letters, digits, '.', '-' and '_' (not shown: it may be part \
             of a password, if the host was left out)"
                .to_string(),
        );
    }
    let port = match p {
        None => default_port,
        Some(p) => port(&p)?,
    };
    Ok(Server { host, port })
}

/// libpq's default with no host at all: the server's socket where Debian
/// puts it, else TCP on localhost.
fn default_socket_dir(port: u16) -> String {
    SOCKET_DIRS
        .iter()
        .find(|d| std::path::Path::new(&format!("{d}/.s.PGSQL.{port}")).exists())
        .map_or_else(|| "localhost".to_string(), |d| d.to_string())
}

/// An address for unit tests elsewhere in the engine.
#[cfg(test)]
pub fn tests_url() -> PgUrl {
    read("postgres://u@h/d", &|_| None).expect("a valid URL")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(raw: &str, vars: &[(&str, &str)]) -> Result<PgUrl, Error> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        read(raw, &move |k| {
            vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn the_url_is_read_as_libpq_reads_it() {
        let u = with(
            "postgres://ci:s%40cret@db.example:6543/app?sslmode=disable",
            &[],
        )
        .unwrap();
        assert_eq!(
            u.servers,
            [Server {
                host: "db.example".into(),
                port: 6543
            }]
        );
        assert_eq!((u.user.as_str(), u.dbname.as_str()), ("ci", "app"));
        assert_eq!(u.password.as_deref(), Some("s@cret"));
        assert_eq!(u.sslmode, SslMode::Disable);
        assert!(!u.display.contains("cret"), "{}", u.display);
        let u = with("postgresql://a,b:2,[::1]:3/d?user=x", &[("PGPORT", "7")]).unwrap();
        let ports: Vec<u16> = u.servers.iter().map(|s| s.port).collect();
        assert_eq!(ports, [7, 2, 3]);
        assert_eq!(u.user, "x");
        let u = with("postgres:///d?host=%2Frun%2Fpg", &[("PGUSER", "u")]).unwrap();
        assert_eq!(u.servers[0].host, "/run/pg");
    }

    #[test]
    fn the_environment_fills_in_what_the_url_leaves_out() {
        let env = [
            ("PGHOST", "pg.internal"),
            ("PGPORT", "5433"),
            ("PGUSER", "deploy"),
            ("PGPASSWORD", "hunter2"),
            ("PGDATABASE", "prod"),
            ("PGSSLMODE", "disable"),
        ];
        let u = with("postgres://", &env).unwrap();
        assert_eq!(u.servers[0].host, "pg.internal");
        assert_eq!(u.servers[0].port, 5433);
        assert_eq!((u.user.as_str(), u.dbname.as_str()), ("deploy", "prod"));
        assert!(u.password_from_env);
        assert_eq!(u.secret_env(), Some("PGPASSWORD"));
        // The URL wins over the environment.
        let u = with("postgres://me:pw@h/db", &env).unwrap();
        assert_eq!((u.user.as_str(), u.dbname.as_str()), ("me", "db"));
        assert!(!u.password_from_env);
        assert_eq!(u.servers[0].port, 5433);
        // No database: the user's name, as libpq does.
        assert_eq!(with("postgres://me@h", &[]).unwrap().dbname, "me");
    }

    #[test]
    fn bad_urls_are_refused_without_their_password() {
        for bad in [
            "postgres://u:s3cret@h:0/d",
            "postgres://u:s3cret@h:99999/d",
            "postgres://u:s3cret@h/d/e",
            "postgres://u:s3cret@h/d?nope=1",
            "postgres://u:s3cret@h/d?sslmode=maybe",
            "postgres://u:s3cret@h/d?password",
            "postgres://u:s3cret@h/%zz",
            "postgres://u:s3cret@h h/d",
            "postgres://u:s3cret@[::1/d",
            "postgres://u:s3cret@a,,b/d",
            "postgres://u@h/d?password=s3cret&x=1",
            "postgres://u@h/d?sslpassword=s3cret",
            "postgres://u@h/d?%73slpassword=s3cret",
            "postgres://u@h/d?oauth_client_secret=s3cret",
            "postgres://u@h/d?%zz=s3cret",
            "postgres://u@h/d?%70assword=s3cret&sslmode=maybe",
            // A password that does not percent-encode '/', '?' or '#'.
            "postgres://u:s3cret/x@h/d",
            "postgres://u:x/s3cret@h/d",
            "postgres://u:s3cret?x@h/d",
            "postgres://u:x?s3cret@h:5432/d",
            "postgres://u:s3cret#x@h/d",
            "postgresql://u:a/b?s3cret@h/d",
        ] {
            let e = with(bad, &[]).unwrap_err();
            assert!(matches!(e, Error::Request(_)), "{bad}: {e}");
            assert!(!e.to_string().contains("s3cret"), "{e}");
        }
        // libpq decodes a parameter's name: this is the password.
        let u = with("postgres://u@h/d?%70assword=s3cret&sslmode=disable", &[]).unwrap();
        assert_eq!(u.password.as_deref(), Some("s3cret"));
        assert!(!u.display.contains("s3cret"), "{}", u.display);
        assert!(u.display.contains("sslmode=disable"), "{}", u.display);
        let u = with(
            "postgres://h/d?sslrootcert=/ca.pem",
            &[("PGSSLMODE", "verify-full")],
        )
        .unwrap();
        assert_eq!(u.sslmode, SslMode::VerifyFull);
        assert_eq!(u.ca_file.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert_eq!(
            with("postgres://h/d", &[]).unwrap().sslmode,
            SslMode::Prefer
        );
    }

    #[test]
    fn the_prefix_names_a_plain_schema() {
        assert_eq!(schema_of("lockrun:").unwrap(), "lockrun");
        assert_eq!(schema_of("ci_locks").unwrap(), "ci_locks");
        for bad in [
            "",
            ":",
            "Lockrun:",
            "a-b:",
            "1x",
            "pg_catalog",
            "a:b:",
            "x;drop",
        ] {
            assert!(schema_of(bad).is_err(), "{bad}");
        }
    }
}
