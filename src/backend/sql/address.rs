//! What the addresses of SQL databases share: how lockrun's side of one
//! is named (`--prefix` as a plain identifier), the user and password
//! part of a URL and how it is shown, what the environment and the login
//! name supply, and the address as the scheme table holds it.

use std::sync::Arc;
use std::time::Duration;

use super::{Dialect, Sql};
use crate::backend::{Address, Check, Engine, EngineInfo, Error, Opening};
use crate::log;

/// An SQL database's URL as its dialect reads it.
pub trait SqlUrl: Clone + std::fmt::Debug + Send + Sync + 'static {
    type Dialect: Dialect;
    const ENGINE: &'static EngineInfo;
    /// The variable a password from the environment is read from.
    const SECRET_ENV: &'static str;

    /// The URL with any password replaced, for messages.
    fn display(&self) -> &str;
    fn password(&self) -> Option<&str>;
    /// The password came from `SECRET_ENV`: it is kept from the job too.
    fn password_from_env(&self) -> bool;
    /// The dialect's statements for lockrun's tables where `prefix` says.
    fn tables(prefix: &str) -> Result<Self::Dialect, Error>;
    /// A client for this database, each request bounded by `op`.
    fn client(&self, op: Duration) -> <Self::Dialect as Dialect>::Client;
    fn doctor(&self, how: &Opening) -> Vec<Check>;
}

/// An SQL database's address, as the scheme table holds it.
#[derive(Debug)]
pub struct SqlAddress<U>(pub U);

impl<U: SqlUrl> SqlAddress<U> {
    pub fn of(url: U) -> Arc<dyn Address> {
        Arc::new(SqlAddress(url))
    }
}

impl<U: SqlUrl> Address for SqlAddress<U> {
    fn engine(&self) -> &'static EngineInfo {
        U::ENGINE
    }
    fn shown(&self) -> String {
        self.0.display().to_string()
    }
    fn secret(&self) -> Option<&str> {
        self.0.password()
    }
    fn secret_env(&self) -> Option<&'static str> {
        self.0.password_from_env().then_some(U::SECRET_ENV)
    }
    fn check_prefix(&self, prefix: &str) -> Result<(), Error> {
        U::tables(prefix).map(|_| ())
    }
    fn open(&self, how: &Opening) -> Result<Box<dyn Engine>, Error> {
        let tables = U::tables(&how.prefix)?;
        log::info(format!("using {} at {}", U::ENGINE.name, self.0.display()));
        Ok(Box::new(Sql::new(self.0.client(how.op), tables)))
    }
    fn doctor(&self, how: &Opening) -> Vec<Check> {
        self.0.doctor(how)
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
