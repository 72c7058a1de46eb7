//! A granted Redis lease: it keeps the connection it was granted on for
//! its renewals and its release, and renews on any connection to the
//! master when that one is busy or gone.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;

use super::address::Node;
use super::connector::{Conn, Connector};
use super::link::{self, Link, describe};
use super::reply::Renewed;
use super::scripts::{Keys, RENEW_SCRIPT};
use super::{connector, reply, take};
use crate::backend::{Error, Held, MinHold, Renewal, Renewer, Renewing};
use crate::clock::Boot;
use crate::log;
use crate::schedule::Timing;

/// The connection a lease was granted on (with the node it reaches),
/// lent to its renewals and taken back by its release: neither needs a
/// connection a full server (`maxclients`) may not give while it lives.
pub(super) type Kept = Arc<Mutex<Option<(Conn, Option<Node>)>>>;

fn kept(k: &Kept) -> std::sync::MutexGuard<'_, Option<(Conn, Option<Node>)>> {
    k.lock().unwrap_or_else(|e| e.into_inner())
}

/// A Redis lease: the connection it was granted on, kept for its renewals
/// and its release.
pub(super) struct RedisHeld {
    pub(super) link: Link,
    pub(super) kept: Kept,
    pub(super) replicas: u32,
    pub(super) keys: Keys,
    pub(super) owner: String,
    pub(super) id: String,
    pub(super) name: String,
    pub(super) timing: Timing,
    /// `--min-hold`: the release keeps the place until the window ends.
    pub(super) min_hold: Option<Duration>,
}

impl Held for RedisHeld {
    fn renewer(&self) -> Renewing {
        // Any connection to the master can renew the key.
        let (connector, replicas, keys, owner, timing) = (
            self.link.connector.clone(),
            self.replicas,
            self.keys.clone(),
            self.owner.clone(),
            self.timing,
        );
        let lent = Arc::clone(&self.kept);
        Renewing::Anywhere(Box::new(move || {
            Box::new(RedisRenewer {
                connector: connector.clone(),
                replicas,
                kept: Arc::clone(&lent),
                conn: None,
                node: None,
                keys: keys.clone(),
                owner: owner.clone(),
                timing,
            })
        }))
    }

    fn release(mut self: Box<Self>, window: MinHold) -> Result<bool, Error> {
        self.min_hold = window.of(self.min_hold);
        let started = Boot::now();
        // The grant's connection, unless a renewal still has it.
        if let Some((conn, node)) = kept(&self.kept).take() {
            self.link.conn = Some(conn);
            self.link.node = node;
        }
        // The lease lives where the renewals went: after a failover, on
        // the new master, not on the one it was granted on.
        if !matches!(self.link.on_master(), Ok(true)) {
            self.link.conn = None;
        }
        let mut last = None;
        // The connection sat idle while the job ran; one retry on a fresh
        // connection covers a server that dropped it.
        for _ in 0..2 {
            match take::release(
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
        Err(self.link.remote.failed(
            &format!("releasing {}", self.name),
            last.expect("two attempts"),
        ))
    }
}

/// A renewal's error in lockrun's kinds: the server's refusals (an ACL
/// denial, a wrong password, a script error) are final.
fn kind(e: &redis::RedisError) -> Error {
    if let Some(full) = link::full(&describe(e)) {
        full
    } else if link::is_transient(e) {
        Error::Transient(describe(e))
    } else {
        Error::Refused(describe(e))
    }
}

struct RedisRenewer {
    connector: Connector,
    replicas: u32,
    /// The lease's connection, borrowed for each renewal when it is in.
    kept: Kept,
    conn: Option<connector::Conn>,
    /// The data node `conn` reaches, behind sentinels.
    node: Option<Node>,
    keys: Keys,
    owner: String,
    timing: Timing,
}

impl Renewer for RedisRenewer {
    fn renew(&mut self) -> Result<Renewal, Error> {
        if self.conn.is_none()
            && let Some((conn, node)) = kept(&self.kept).take()
        {
            self.conn = Some(conn);
            self.node = node;
        }
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
                Err(e) => return Err(Error::Transient(describe(&e))),
            }
        }
        if self.conn.is_none() {
            let linked = self
                .connector
                .connect(self.timing.op)
                .map_err(|e| kind(&e))?;
            self.conn = Some(linked.conn);
            self.node = linked.node;
        }
        let conn = self.conn.as_mut().expect("just connected");
        let r = self
            .keys
            .on(&RENEW_SCRIPT)
            .arg(&self.owner)
            .arg(self.timing.ttl.as_millis() as u64)
            .invoke::<Vec<Value>>(conn)
            .map(|v| reply::renewed(&v));
        // With --replicas, a renewal counts once enough replicas have it.
        // A preempted lease is given up whatever they say.
        let r = match r {
            Ok(Renewed::Yes) if self.replicas > 0 => {
                link::wait_replicas(conn, self.replicas, self.timing.op).and_then(|n| {
                    if n >= i64::from(self.replicas) {
                        Ok(Renewed::Yes)
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
                })
            }
            other => other,
        };
        if r.is_ok() {
            // Back to the lease, for the next renewal or the release.
            let mut k = kept(&self.kept);
            if k.is_none() {
                *k = self.conn.take().map(|c| (c, self.node.clone()));
            }
        }
        match r {
            Ok(Renewed::Yes) => Ok(Renewal::Renewed {
                ttl: self.timing.ttl,
            }),
            Ok(Renewed::Preempted(by)) => Ok(Renewal::Preempted { by }),
            Ok(Renewed::Lost) => Ok(Renewal::Lost),
            Err(e) => {
                // Unknown state after a timeout: start over on a new connection.
                self.conn = None;
                Err(kind(&e))
            }
        }
    }
}
