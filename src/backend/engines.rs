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

/// What `--url` comes to: the engine its scheme names, at the address
/// that engine read.
#[derive(Clone)]
pub struct EngineAt {
    pub engine: &'static EngineInfo,
    pub address: Arc<dyn Address>,
}

impl std::fmt::Debug for EngineAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineAt")
            .field("engine", &self.engine.name)
            .field("address", &self.address)
            .finish()
    }
}

impl std::ops::Deref for EngineAt {
    type Target = dyn Address;
    fn deref(&self) -> &(dyn Address + 'static) {
        &*self.address
    }
}

/// Parse `--url` (empty: the local default) into its engine's address.
pub fn address(raw: &str, opts: &AddressOptions) -> Result<EngineAt, Error> {
    let at = |engine: &'static EngineInfo| {
        Ok(EngineAt {
            engine,
            address: (engine.parse)(raw, opts)?,
        })
    };
    if raw.is_empty() {
        return at(&ENGINES[0]);
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
    at(engine)
}
