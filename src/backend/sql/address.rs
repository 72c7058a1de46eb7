//! What the addresses of SQL databases share: how lockrun's side of one
//! is named (`--prefix` as a plain identifier), the user and password
//! part of a URL and how it is shown, what the environment and the login
//! name supply, and the address as the scheme table holds it.

use std::path::PathBuf;
use std::time::Duration;

use super::{Dialect, Sql};
use crate::backend::{Address, Check, Engine, EngineInfo, Error, Opening};
use crate::log;

/// An SQL database's address: the login every dialect's URL holds, and
/// the dialect's own part (`P`: where the database is, how to reach it).
#[derive(Clone)]
pub struct Url<P> {
    pub user: String,
    pub password: Option<String>,
    /// The password came from `P::SECRET_ENV`: it is kept from the job too.
    pub password_from_env: bool,
    /// The CA the server's certificate is checked against (else the
    /// system's roots, when a mode checks it).
    pub ca_file: Option<PathBuf>,
    /// The URL with any password replaced, for messages.
    pub display: String,
    pub part: P,
}

impl<P> std::ops::Deref for Url<P> {
    type Target = P;
    fn deref(&self) -> &P {
        &self.part
    }
}

impl<P> std::fmt::Debug for Url<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password, also not in a debug print.
        f.debug_struct("Url")
            .field("display", &self.display)
            .finish()
    }
}

/// What a dialect's URL adds, and what the engine asks of its address.
pub trait Part: Clone + Send + Sync + Sized + 'static {
    type Dialect: Dialect;
    const ENGINE: &'static EngineInfo;
    /// The variable a password from the environment is read from.
    const SECRET_ENV: &'static str;

    /// The dialect's statements for lockrun's tables where `prefix` says.
    fn tables(prefix: &str) -> Result<Self::Dialect, Error>;
    /// A client for the database, each request bounded by `op`.
    fn client(url: &Url<Self>, op: Duration) -> <Self::Dialect as Dialect>::Client;
    fn doctor(url: &Url<Self>, how: &Opening) -> Vec<Check>;
}

impl<P: Part> Address for Url<P> {
    fn shown(&self) -> String {
        self.display.clone()
    }
    fn secret(&self) -> Option<&str> {
        self.password.as_deref()
    }
    fn secret_env(&self) -> Option<&'static str> {
        self.password_from_env.then_some(P::SECRET_ENV)
    }
    fn check_prefix(&self, prefix: &str) -> Result<(), Error> {
        P::tables(prefix).map(|_| ())
    }
    fn open(&self, how: &Opening) -> Result<Box<dyn Engine>, Error> {
        let tables = P::tables(&how.prefix)?;
        log::info(format!("using {} at {}", P::ENGINE.name, self.display));
        Ok(Box::new(Sql::new(P::client(self, how.op), tables)))
    }
    fn doctor(&self, how: &Opening) -> Vec<Check> {
        P::doctor(self, how)
    }
}

/// `--prefix` less one trailing `:` (so the default `lockrun:` is
/// `lockrun`), when that is a plain lower-case identifier of at most 48
/// characters, which needs no quoting anywhere.
pub fn plain_prefix(prefix: &str) -> Option<&str> {
    let name = prefix.strip_suffix(':').unwrap_or(prefix);
    let plain = !name.is_empty()
        && name.len() <= 48
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    plain.then_some(name)
}

/// What the process environment says, for the parsers (a function, so
/// tests can give their own).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A variable of the environment, unless empty.
pub fn from_env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// The login name of the user lockrun runs as (the database clients'
/// default user).
pub fn os_user() -> Option<String> {
    let uid = rustix::process::getuid().as_raw().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 2 && f[2] == uid).then(|| f[0].to_string())
    })
}

/// The user and password of a URL's `user[:password]` part, as written.
pub struct Userinfo<'a> {
    pub user: Option<&'a str>,
    pub password: Option<&'a str>,
}

impl<'a> Userinfo<'a> {
    pub fn split(userinfo: Option<&'a str>) -> Userinfo<'a> {
        let (user, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((name, pass)) => (Some(name), Some(pass)),
                None => (Some(u), None),
            },
        };
        Userinfo { user, password }
    }

    /// As messages show it: the password replaced.
    pub fn shown(&self) -> String {
        match (self.user, self.password) {
            (Some(u), Some(_)) => format!("{u}:***@"),
            (Some(u), None) => format!("{u}@"),
            _ => String::new(),
        }
    }
}
