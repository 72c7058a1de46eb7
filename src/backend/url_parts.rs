//! The parts of an address URL several engines write alike: host lists,
//! credentials, `#insecure`, %-escapes, and how a refusal of one reads.

use std::path::PathBuf;

use super::{AddressOptions, Error};

/// How an address with a list of hosts is reached, besides its hosts:
/// what etcd's and ZooKeeper's keep alike.
#[derive(Debug, Clone)]
pub struct Reach {
    /// The URL with any password replaced, for messages.
    pub display: String,
    pub user: Option<String>,
    pub password: Option<String>,
    /// Every host is reached over TLS.
    pub tls: bool,
    /// `#insecure`: TLS with less checking of the server's certificate (as
    /// the engine says).
    pub insecure: bool,
    /// The CA file (`--tls-ca`); None: the system's roots.
    pub ca_file: Option<PathBuf>,
}

/// A URL with a list of hosts (etcd's, ZooKeeper's) cut into its parts,
/// none checked yet: `scheme://[user[:pass]@]rest[#insecure]`.
pub struct HostList<'a> {
    /// Lowercase.
    pub scheme: String,
    pub login: Credentials,
    /// What follows the credentials, without `#insecure`: the hosts, and
    /// whatever the engine allows after them.
    pub rest: &'a str,
    pub insecure: bool,
    /// `expected FORM`: how every refusal of the URL ends.
    pub expected: String,
}

impl<'a> HostList<'a> {
    /// `raw` cut into its parts; only a URL with no `://` is refused here.
    /// `form` is how the engine's addresses are written.
    pub fn cut(raw: &'a str, form: &str) -> Result<HostList<'a>, Error> {
        let expected = format!("expected {form}");
        let (scheme, rest) = raw
            .split_once("://")
            .ok_or_else(|| Error::Request(format!("invalid --url: {expected}")))?;
        // Never echo the raw URL: it may hold a password.
        let (login, rest) = credentials(rest);
        // `#insecure` is the one fragment, as on Redis: only with TLS.
        let (rest, insecure) = match rest.strip_suffix("#insecure") {
            Some(r) => (r, true),
            None => (rest, false),
        };
        Ok(HostList {
            scheme: scheme.to_ascii_lowercase(),
            login,
            rest,
            insecure,
            expected,
        })
    }

    /// What the address keeps of the URL once its hosts are read.
    pub fn reach(self, display: String, tls: bool, ca_file: Option<PathBuf>) -> Reach {
        Reach {
            display,
            user: self.login.user,
            password: self.login.password,
            tls,
            insecure: self.insecure,
            ca_file,
        }
    }

    /// The fragment as the URL shows it.
    pub fn fragment(&self) -> &'static str {
        if self.insecure { "#insecure" } else { "" }
    }

    /// The refusal of the URL, shown as `display`, for `why`.
    pub fn refusal(&self, display: &str, why: String) -> Error {
        Error::Request(format!(
            "invalid --url {}: {why}; {}",
            display.chars().take(200).collect::<String>(),
            self.expected
        ))
    }

    /// A user has a name and a password, or the server would ask for
    /// what lockrun cannot give.
    pub fn check_login(&self) -> Result<(), String> {
        if self.login.user.as_deref().is_some_and(str::is_empty) {
            return Err("the user name is empty".into());
        }
        if self.login.user.is_some() && self.login.password.is_none() {
            return Err("a user needs a password (user:pass@)".into());
        }
        Ok(())
    }
}

/// Each entry of a comma-separated host list, as `entry` reads it.
pub fn each_host<T>(
    hosts: &str,
    entry: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    hosts.split(',').map(entry).collect()
}

impl AddressOptions {
    /// The CA file an address uses: `--tls-ca` with TLS; without TLS none,
    /// and `--tls-ca` refused (`no_tls`).
    pub fn ca_file(&self, tls: bool, shown: &str) -> Result<Option<PathBuf>, Error> {
        if !tls {
            self.no_tls(shown)?;
            return Ok(None);
        }
        Ok(self.tls_ca.clone())
    }
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
