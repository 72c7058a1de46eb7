//! A Redis address: `redis://` and `rediss://` URLs, what in them is
//! secret, Redis's own rules for names, and the client (TLS included) they
//! make.

use std::path::PathBuf;
use std::sync::Arc;

use redis::{Client, IntoConnectionInfo};

use super::{ENGINE, Redis};
use crate::backend::{Address, AddressOptions, Engine, EngineInfo, Error, Opening};
use crate::log;

/// A Redis server's address (README "Redis").
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
}

impl Address for RedisUrl {
    fn engine(&self) -> &'static EngineInfo {
        &ENGINE
    }
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
}

/// Parse `redis://[user][:pass@]host[:port][/db]` or `rediss://…`.
pub fn parse(raw: &str, opts: &AddressOptions) -> Result<Arc<dyn Address>, Error> {
    let usage = Error::Request;
    let expected = format!("expected {}", ENGINE.form);
    // Never echo the raw URL: it may hold a password.
    let url = url::Url::parse(raw).map_err(|e| usage(format!("invalid --url: {e}; {expected}")))?;
    let mut shown = url.clone();
    if url.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
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
    let insecure = match url.fragment() {
        None => false,
        Some("insecure") if tls => true,
        Some(_) => {
            return Err(usage(format!(
                "invalid --url {display}: the only fragment accepted is #insecure, on rediss://"
            )));
        }
    };
    if url.query().is_some() {
        return Err(usage(format!(
            "invalid --url {display}: query parameters are not supported; {expected}"
        )));
    }
    let ca_file = if tls {
        opts.tls_ca.clone()
    } else {
        opts.no_tls(&display)?;
        None
    };
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
    }))
}

pub fn client_for(spec: &RedisUrl) -> Result<Client, Error> {
    let bad_url =
        |e: redis::RedisError| Error::Request(format!("invalid --url {}: {e}", spec.display));
    let info = spec.url.as_str().into_connection_info().map_err(bad_url)?;
    // CLIENT SETINFO costs a round trip on every connect and tells the server nothing it needs.
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let info = info.set_redis_settings(settings);
    if !spec.tls {
        return Client::open(info).map_err(bad_url);
    }
    // One crypto provider for rustls; a second install attempt is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if spec.insecure {
        log::warn(format!(
            "{}: TLS certificate checks are off (#insecure)",
            spec.display
        ));
    }
    let root_cert = match &spec.ca_file {
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
