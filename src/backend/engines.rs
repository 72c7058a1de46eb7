//! The engines and their addresses: the scheme table (one row an engine,
//! saying what sets it apart), the address an engine parses and checks
//! before anything is contacted, and how it is opened.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{Check, Engine, Error, etcd, local, mysql, postgres, redis, zookeeper};

/// What an address may need besides its text.
#[derive(Debug, Clone, Default)]
pub struct AddressOptions {
    /// `--tls-ca`: a CA file for an engine that speaks TLS.
    pub tls_ca: Option<PathBuf>,
    /// It came from the environment, which may be meant for another engine:
    /// an engine without TLS ignores it rather than refusing it.
    pub tls_ca_from_env: bool,
    /// `--replicas N`: a grant counts once N replicas acknowledged it.
    pub replicas: u32,
    pub replicas_from_env: bool,
    /// `--prefix` came from the environment: an engine without prefixes
    /// ignores it rather than refusing it.
    pub prefix_from_env: bool,
}

impl AddressOptions {
    /// The refusal of a CA file by an address that does not use TLS (none
    /// if it came from the environment).
    pub fn no_tls(&self, shown: &str) -> Result<(), Error> {
        match &self.tls_ca {
            Some(_) if !self.tls_ca_from_env => Err(Error::Request(format!(
                "--tls-ca only applies to an address that uses TLS, not {shown}"
            ))),
            _ => Ok(()),
        }
    }

    /// The refusal of `--replicas` by an engine that has none (none if it
    /// came from the environment).
    pub fn no_replicas(&self, shown: &str) -> Result<(), Error> {
        if self.replicas > 0 && !self.replicas_from_env {
            return Err(Error::Request(format!(
                "--replicas only applies to an engine with replicas, not {shown}"
            )));
        }
        Ok(())
    }
}

/// An engine at an address: parsed and checked by the engine, not contacted.
pub trait Address: std::fmt::Debug + Send + Sync {
    fn engine(&self) -> &'static EngineInfo;
    /// The address as messages show it, any secret in it hidden.
    fn shown(&self) -> String;
    /// A secret the address carries (a password): kept out of every line
    /// lockrun prints and out of the job's environment.
    fn secret(&self) -> Option<&str> {
        None
    }
    /// The variable the secret came from, if it came from the environment:
    /// removed from the job's environment like the URL.
    fn secret_env(&self) -> Option<&'static str> {
        None
    }
    /// The engine's own rules for lock names, beyond lockrun's.
    fn check_name(&self, _name: &str) -> Result<(), Error> {
        Ok(())
    }
    /// The engine's own rules for `--prefix` (each keeps prefixes apart its
    /// own way).
    fn check_prefix(&self, prefix: &str) -> Result<(), Error>;
    /// Open the engine (contacting it, for a server).
    fn open(&self, how: &Opening) -> Result<Box<dyn Engine>, Error>;
    /// `lockrun doctor`: read-only checks of the engine and its settings,
    /// one line each (README "Operate"). They write nothing that outlives
    /// them.
    fn doctor(&self, how: &Opening) -> Vec<Check>;
}

/// How an engine is opened.
#[derive(Debug, Clone)]
pub struct Opening {
    /// `--prefix`: put before every key or name the engine stores.
    pub prefix: String,
    /// Bounds one request, connecting included.
    pub op: Duration,
    /// The ttl a run asks for (`--ttl`, `LOCKRUN_TTL`, or the default):
    /// what `doctor` checks the server's bounds against.
    pub ttl: Duration,
}

/// How an engine reads an address of its own (the whole text, scheme
/// included; empty for the default engine with no URL).
pub type Parse = fn(&str, &AddressOptions) -> Result<Arc<dyn Address>, Error>;

/// One row of the scheme table: which URL schemes name an engine, how its
/// addresses are written and parsed, and what sets it apart (what every
/// engine does alike is the seam's contract, not a flag).
pub struct EngineInfo {
    /// As messages name it.
    pub name: &'static str,
    pub schemes: &'static [&'static str],
    /// How an address is written, for messages.
    pub form: &'static str,
    pub parse: Parse,
    /// A lease ends on its own when not renewed (a flock does not: it lasts
    /// as long as its holder, with no deadline and no loss by time).
    pub expires: bool,
    /// The engine grants leases in steps of this (a ttl asked for is rounded
    /// up to it) and no shorter than `ttl_min`: refused before anything is
    /// contacted.
    pub ttl_step: Duration,
    pub ttl_min: Duration,
}

impl EngineInfo {
    /// The ttl this engine would grant for `asked`, or the one line saying
    /// why it cannot.
    pub fn grantable(&self, asked: Duration) -> Result<Duration, Error> {
        let step = self.ttl_step.as_nanos().max(1);
        let ttl = Duration::from_nanos(
            u64::try_from(asked.as_nanos().div_ceil(step) * step).unwrap_or(u64::MAX),
        );
        if ttl < self.ttl_min {
            return Err(Error::Request(format!(
                "--ttl {} is below the {} engine's smallest lease of {}",
                crate::text::duration(asked),
                self.name,
                crate::text::duration(self.ttl_min)
            )));
        }
        Ok(ttl)
    }
}

/// Every engine lockrun has, by URL scheme. No URL means the first (local).
pub const ENGINES: [EngineInfo; 6] = [
    local::ENGINE,
    redis::ENGINE,
    etcd::ENGINE,
    postgres::ENGINE,
    mysql::ENGINE,
    zookeeper::ENGINE,
];

/// The engine a URL scheme names.
pub fn engine_for(scheme: &str) -> Option<&'static EngineInfo> {
    ENGINES.iter().find(|e| e.schemes.contains(&scheme))
}

/// Parse `--url` (empty: the local default) into its engine's address.
pub fn address(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    if raw.is_empty() {
        return (ENGINES[0].parse)(raw, opts);
    }
    let forms: Vec<&str> = ENGINES.iter().map(|e| e.form).collect();
    let expected = format!("expected {}", forms.join(" or "));
    // Never echo the raw URL: it may hold a password.
    let scheme = raw
        .split_once("://")
        .map(|(s, _)| s.to_ascii_lowercase())
        .ok_or_else(|| Error::Request(format!("invalid --url: no scheme; {expected}")))?;
    let engine = engine_for(&scheme).ok_or_else(|| {
        let shown: String = scheme.chars().take(20).collect();
        Error::Request(format!(
            "invalid --url: unknown scheme {shown:?}; {expected}"
        ))
    })?;
    (engine.parse)(raw, opts)
}

/// `[v6-address][:port]` of a host list, checked: the address and the port
/// text, if any; None when `text` does not start with '['. `what` names the
/// part in messages ("endpoint", "host").
pub fn bracketed_host<'a>(
    text: &'a str,
    what: &str,
) -> Result<Option<(&'a str, Option<&'a str>)>, String> {
    let Some(rest) = text.strip_prefix('[') else {
        return Ok(None);
    };
    let (h, after) = rest
        .split_once(']')
        .ok_or_else(|| format!("{} {what} has no closing ']'", article(what)))?;
    if h.is_empty() || !h.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
        return Err(format!(
            "{} {what} in brackets is not an IPv6 address",
            article(what)
        ));
    }
    let port = match after {
        "" => None,
        p => Some(
            p.strip_prefix(':')
                .ok_or_else(|| format!("{} {what}: expected :port after ']'", article(what)))?,
        ),
    };
    Ok(Some((h, port)))
}

/// A host list as a message may show it: each entry that reads as
/// `host[:port]` as it is, any other as `(hidden)`. A URL whose host was
/// left out reads `user:password` as a host and a port: no part of an
/// entry that does not read is ever shown.
pub fn shown_hosts(hosts: &str) -> String {
    hosts
        .split(',')
        .map(|h| {
            if h.is_empty() || host_and_port(h, "host", 1).is_ok() {
                h
            } else {
                "(hidden)"
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// One `host[:port]` (or `[v6][:port]`) of a host list, checked: the host
/// as it goes in an address (an IPv6 one in brackets) and the port.
/// `what` names the part in messages ("endpoint", "server"). A refusal
/// never echoes the entry: with the host left out, `user:password` reads
/// as a host and a port.
pub fn host_and_port(text: &str, what: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some((h, port)) = bracketed_host(text, what)? {
        (format!("[{h}]"), port)
    } else {
        let (h, p) = match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        };
        if h.is_empty() {
            return Err(format!("{} {what} has no host", article(what)));
        }
        if !h
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(format!(
                "{} {what}'s host may only hold letters, digits, '.', '-' and '_' (not shown: \
                 it may be part of a password, if the host was left out)",
                article(what)
            ));
        }
        (h.to_string(), p)
    };
    let port = match port {
        None => default_port,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
            format!(
                "{} {what}'s port is not a number from 1 to 65535 (not shown: it may be \
                     a password, if the host was left out)",
                article(what)
            )
        })?,
    };
    Ok((host, port))
}

fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// Percent-decoding as URLs write it; None for an escape that is not one,
/// or for bytes that are not UTF-8.
pub fn percent_decoded(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The user and password before the last `@` of a URL's authority (each
/// %-decoded), and how messages show them: never the password, nor a lone
/// user name, which some clients read as a password.
pub struct Credentials {
    pub user: Option<String>,
    pub password: Option<String>,
    pub shown: String,
}

/// `[user[:pass]@]rest`: the credentials, and the rest.
pub fn credentials(authority: &str) -> (Credentials, &str) {
    let (userinfo, rest) = match authority.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(u) => match u.split_once(':') {
            Some((name, pass)) => (
                Some(percent_decoded_leniently(name)),
                Some(percent_decoded_leniently(pass)),
            ),
            None => (Some(percent_decoded_leniently(u)), None),
        },
    };
    let shown = match (&user, &password) {
        (Some(u), Some(_)) => format!("{u}:***@"),
        (Some(_), None) => "***@".to_string(),
        _ => String::new(),
    };
    let c = Credentials {
        user,
        password,
        shown,
    };
    (c, rest)
}

/// Percent-decoding of a user or password as URLs write them, forgiving:
/// a `%` that starts no escape stays as it is.
pub fn percent_decoded_leniently(s: &str) -> String {
    url::form_urlencoded::parse(format!("v={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}
