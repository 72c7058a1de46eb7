//! The Redis engine: a name's holders live in one hash with an expiry, its
//! waiters in a queue, both changed only by Lua scripts that serve waiters
//! in arrival order and hand a release's lease to the next in the same call.
//!
//! By layer: `address.rs` reads the URL and builds the client (TLS);
//! `link.rs` is one connection, bounded, with the table of errors worth
//! riding out; `scripts.rs` loads the Lua in `scripts/` and says what each
//! script takes and returns; `reply.rs` reads those replies into types;
//! `queue.rs` is the acquire loop (try, then block on a wake-up list). This
//! file holds the engine's row, status, `release --force`, the lease and its
//! renewal.

mod address;
mod connector;
mod link;
mod queue;
mod reply;
mod scripts;

use std::time::Duration;

use anyhow::anyhow;
use redis::Value;

use address::Node;
pub use address::{RedisUrl, parse};
use connector::Connector;
use link::{Link, describe, is_auth_error};
use scripts::{FORCE_SCRIPT, INSPECT_SCRIPT, Keys, RENEW_SCRIPT};

use super::{
    Acquired, Broken, Caps, Engine, EngineInfo, Error, Force, Held, Opening, Request, Status, Wait,
};
use crate::clock::Boot;
use crate::log;
use crate::schedule::Timing;
use crate::watchdog::{Renewal, Renewer};

/// Redis's row of the scheme table.
pub const ENGINE: EngineInfo = EngineInfo {
    name: "Redis",
    schemes: &[
        "redis",
        "rediss",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
    ],
    form: "redis://[user][:pass@]host[:port][/db], rediss://…, redis+sentinel://[user:pass@]host[:port][,host…]/MASTER[/db], redis+cluster://[user:pass@]host[:port][,host…]",
    parse,
    // Leases are asked for in milliseconds (PX / the boot clock).
    ttl_step: Duration::from_millis(1),
    ttl_min: Duration::ZERO,
    caps: Caps {
        expires: true,
        force_release: true,
        shared: true,
        limit: true,
    },
};

pub struct Redis {
    link: Link,
    prefix: String,
    /// `--replicas N`.
    replicas: u32,
}

impl Redis {
    pub fn connect(url: &RedisUrl, how: &Opening) -> Result<Redis, Error> {
        let op = how.op;
        let connector = Connector::new(url, op)?;
        if url.insecure {
            log::warn(format!(
                "{}: TLS certificate checks are off (#insecure)",
                url.display
            ));
        }
        log::info(format!("connecting to {}", url.display));
        let started = Boot::now();
        let first = connector.connect(op.max(Duration::from_millis(500)));
        // Behind sentinels that named a master, a master that does not
        // answer is a failover under way: ridden out like any outage.
        let first = match first {
            Err(e) if link::is_transient(&e) && connector.sentinel_answered() => {
                log::info(format!("{}: {}; trying again", url.display, describe(&e)));
                None
            }
            other => Some(other),
        };
        let linked = first.transpose().map_err(|e| {
            let msg = if is_auth_error(&e) {
                let user = url.user();
                format!(
                    "Redis at {} refused the credentials of user {user}: check the user and password in the URL",
                    url.display
                )
            } else {
                format!("cannot reach Redis at {}: {}", url.display, describe(&e))
            };
            Error::Refused(msg)
        })?;
        log::info(format!("connected in {:.1?}", Boot::now().since(started)));
        let (conn, node) = match linked {
            Some(l) => (Some(l.conn), l.node),
            None => (None, None),
        };
        let mut r = Redis {
            link: Link {
                // The sentinels answered when the master did not.
                replied: conn.is_none(),
                conn,
                connector,
                node,
                display: url.display.clone(),
                op,
            },
            prefix: how.prefix.clone(),
            replicas: url.replicas,
        };
        if how.check_settings {
            r.warn_on_eviction();
        }
        Ok(r)
    }

    /// An evicted lease is a broken lock: say so when the policy is readable.
    fn warn_on_eviction(&mut self) {
        let reply: Result<Vec<String>, _> = self.link.call(|c| {
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("maxmemory-policy")
                .query(c)
        });
        if let Ok(v) = reply
            && let Some(policy) = v.get(1)
            && policy != "noeviction"
        {
            log::warn(format!(
                "Redis maxmemory-policy is {policy}; lockrun needs noeviction (an evicted lease is a broken lock)"
            ));
        }
    }
}

impl Engine for Redis {
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error> {
        self.take(req, wait)
    }

    fn status(&mut self, name: &str) -> Result<Status, Error> {
        let keys = Keys::new(&self.prefix, name);
        let script = &*INSPECT_SCRIPT;
        let v = self
            .link
            .call(|c| keys.on(script).invoke::<Vec<Value>>(c))
            .map_err(|e| self.link.failed(&format!("reading {name}"), e))?;
        Ok(reply::status(&v))
    }

    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error> {
        let keys = Keys::new(&self.prefix, name);
        let script = &*FORCE_SCRIPT;
        let token = force.token.map(|t| t.to_string()).unwrap_or_default();
        let now = if force.now { "1" } else { "0" };
        let v = self
            .link
            .call(|c| keys.on(script).arg(&token).arg(now).invoke::<Vec<Value>>(c))
            .map_err(|e| self.link.failed(&format!("releasing {name}"), e))?;
        Ok(reply::broken(&v))
    }
}

/// A Redis lease: the connection it was granted on, kept for its release.
struct RedisHeld {
    link: Link,
    replicas: u32,
    keys: Keys,
    owner: String,
    id: String,
    name: String,
    timing: Timing,
    /// `--min-hold`: the release keeps the place until the window ends.
    min_hold: Option<Duration>,
}

impl Held for RedisHeld {
    fn renewer(&self) -> Option<Box<dyn Renewer>> {
        Some(Box::new(RedisRenewer {
            replicas: self.replicas,
            connector: self.link.connector.clone(),
            conn: None,
            node: None,
            lock: self.keys.lock.clone(),
            owner: self.owner.clone(),
            timing: self.timing,
        }))
    }

    fn release(mut self: Box<Self>) -> Result<bool, Error> {
        let started = Boot::now();
        // The lease lives where the renewals went: after a failover, on
        // the new master, not on the one it was granted on.
        if !matches!(self.link.on_master(), Ok(true)) {
            self.link.conn = None;
        }
        let mut last = None;
        // The connection sat idle while the job ran; one retry on a fresh
        // connection covers a server that dropped it.
        for _ in 0..2 {
            match queue::release(
                &mut self.link,
                &self.keys,
                &self.owner,
                &self.id,
                self.min_hold,
            ) {
                Ok(ours) => {
                    log::info(format!(
                        "released {} in {:.1?}",
                        self.name,
                        Boot::now().since(started)
                    ));
                    return Ok(ours);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(self.link.failed(
            &format!("releasing {}", self.name),
            last.expect("two attempts"),
        ))
    }

    fn give_back(mut self: Box<Self>) -> Result<bool, Error> {
        self.min_hold = None;
        self.release()
    }
}

struct RedisRenewer {
    connector: Connector,
    replicas: u32,
    conn: Option<connector::Conn>,
    /// The data node `conn` reaches, behind sentinels.
    node: Option<Node>,
    lock: String,
    owner: String,
    timing: Timing,
}

impl Renewer for RedisRenewer {
    fn fresh(&self) -> Box<dyn Renewer> {
        Box::new(RedisRenewer {
            replicas: self.replicas,
            connector: self.connector.clone(),
            conn: None,
            node: None,
            lock: self.lock.clone(),
            owner: self.owner.clone(),
            timing: self.timing,
        })
    }

    fn renew(&mut self) -> anyhow::Result<Renewal> {
        // Behind sentinels, every renewal asks where the master is: a
        // master demoted by a failover still accepts the renewal for a
        // while, and a lease kept there is kept nowhere.
        if self.conn.is_some() {
            match self
                .connector
                .still_master(self.node.as_ref(), self.timing.op)
            {
                Ok(true) => {}
                Ok(false) => self.conn = None,
                // No majority of the sentinels names a master: nothing says
                // ours still is (a partition's minority side): a failed renewal.
                Err(e) => return Err(anyhow!(describe(&e))),
            }
        }
        if self.conn.is_none() {
            let linked = self
                .connector
                .connect(self.timing.op)
                .map_err(|e| anyhow!(describe(&e)))?;
            self.conn = Some(linked.conn);
            self.node = linked.node;
        }
        let conn = self.conn.as_mut().expect("just connected");
        let r = RENEW_SCRIPT
            .key(&self.lock)
            .arg(&self.owner)
            .arg(self.timing.ttl.as_millis() as u64)
            .invoke::<i64>(conn);
        // With --replicas, a renewal counts once enough replicas have it.
        let r = match r {
            Ok(1) if self.replicas > 0 => link::wait_replicas(conn, self.replicas, self.timing.op)
                .and_then(|n| {
                    if n >= i64::from(self.replicas) {
                        Ok(1)
                    } else {
                        Err(redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "too few replicas",
                            format!(
                                "only {n} of {} replicas acknowledged the renewal",
                                self.replicas
                            ),
                        )))
                    }
                }),
            other => other,
        };
        match r {
            Ok(1) => Ok(Renewal::Renewed {
                ttl: self.timing.ttl,
            }),
            Ok(_) => Ok(Renewal::Lost),
            Err(e) => {
                // Unknown state after a timeout: start over on a new connection.
                self.conn = None;
                Err(anyhow!(describe(&e)))
            }
        }
    }
}
