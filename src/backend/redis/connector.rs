//! Where a connection goes: one server, the master that the sentinels name
//! at the moment of connecting, or a cluster, which routes each command to
//! the node of its key (lockrun-engines(7) "REDIS SENTINEL and REDIS CLUSTER"). Every step is bounded
//! by the time given, all steps together included.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Client, Cmd, Connection, ConnectionLike, ErrorKind, RedisError, RedisResult, Value};

use super::address::{Node, RedisUrl, Topology};
use super::link::{describe, is_auth_error};
use crate::log;

#[derive(Clone)]
pub enum Connector {
    Server(Box<Client>),
    Sentinel(Arc<Sentinels>),
    Cluster(Arc<ClusterClient>),
}

/// A connection to one server, or to a cluster.
pub enum Conn {
    One(Connection),
    Cluster(Box<ClusterConnection>),
}

impl Conn {
    pub fn set_read_timeout(&self, d: Option<Duration>) -> RedisResult<()> {
        match self {
            Conn::One(c) => c.set_read_timeout(d),
            Conn::Cluster(c) => c.set_read_timeout(d),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        match self {
            Conn::One(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Conn::One(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    // The cluster routes a command by its key: it must see the command,
    // not only its bytes.
    fn req_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Conn::One(c) => c.req_command(cmd),
            Conn::Cluster(c) => c.req_command(cmd),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::One(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }

    fn supports_pipelining(&self) -> bool {
        match self {
            Conn::One(c) => c.supports_pipelining(),
            Conn::Cluster(c) => c.supports_pipelining(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Conn::One(c) => c.check_connection(),
            Conn::Cluster(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Conn::One(c) => c.is_open(),
            Conn::Cluster(c) => c.is_open(),
        }
    }
}

/// The sentinels of one master, and how to reach the data nodes they name.
pub struct Sentinels {
    url: RedisUrl,
    nodes: Vec<Node>,
    master: String,
    /// One client per sentinel, without and with the URL's credentials
    /// (sent only to a sentinel that asks for them).
    plain: Vec<Client>,
    authed: Vec<Client>,
    /// A sentinel has named the master: the address is right, and a master
    /// that does not answer is a failover under way, not a mistake.
    answered: AtomicBool,
}

/// A connection and the data node it reaches (None: the one server, or a
/// cluster).
pub struct Linked {
    pub conn: Conn,
    pub node: Option<Node>,
}

fn refused(what: &'static str, detail: String) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, what, detail))
}

/// A failure worth retrying, as a lost connection is.
fn passing(what: &'static str, detail: String) -> RedisError {
    RedisError::from((ErrorKind::Io, what, detail))
}

impl Connector {
    pub fn new(url: &RedisUrl, op: Duration) -> Result<Connector, crate::backend::Error> {
        match &url.topology {
            Topology::Server => Ok(Connector::Server(Box::new(url.client()?))),
            Topology::Sentinel {
                sentinels, master, ..
            } => {
                let mut plain = Vec::new();
                let mut authed = Vec::new();
                for node in sentinels {
                    plain.push(url.client_at(node, false, false)?);
                    authed.push(url.client_at(node, false, true)?);
                }
                Ok(Connector::Sentinel(Arc::new(Sentinels {
                    url: url.clone(),
                    nodes: sentinels.clone(),
                    master: master.clone(),
                    plain,
                    authed,
                    answered: AtomicBool::new(false),
                })))
            }
            Topology::Cluster { nodes, .. } => {
                Ok(Connector::Cluster(Arc::new(url.cluster(nodes, op)?)))
            }
        }
    }

    /// A connection to the server that holds the keys now.
    pub fn connect(&self, timeout: Duration) -> RedisResult<Linked> {
        match self {
            Connector::Server(client) => Ok(Linked {
                conn: Conn::One(connect(client, timeout)?),
                node: None,
            }),
            Connector::Sentinel(s) => s.connect_master(timeout),
            Connector::Cluster(client) => {
                let conn = client.get_connection()?;
                conn.set_read_timeout(Some(timeout))?;
                conn.set_write_timeout(Some(timeout))?;
                Ok(Linked {
                    conn: Conn::Cluster(Box::new(conn)),
                    node: None,
                })
            }
        }
    }

    /// Whether a sentinel has ever named the master: then the address is
    /// right, and a master that does not answer is an outage to ride out.
    pub fn sentinel_answered(&self) -> bool {
        matches!(self, Connector::Sentinel(s) if s.answered.load(Ordering::Relaxed))
    }

    /// Whether a connection made to `node` still reaches the master: a
    /// demoted master goes on accepting writes for a while after a
    /// failover, and a lease kept there is kept nowhere. An error when no
    /// majority of the sentinels names a master: then nothing says the one
    /// we have is still it (it may be on the minority side of a partition).
    pub fn still_master(&self, node: Option<&Node>, timeout: Duration) -> RedisResult<bool> {
        match (self, node) {
            (Connector::Sentinel(s), Some(node)) => match s.locate(timeout)? {
                Some(now) if now == *node => Ok(true),
                Some(now) => {
                    log::info(format!(
                        "the sentinels name {now} as master of {} now, not {node}",
                        s.master
                    ));
                    Ok(false)
                }
                None => Err(refused(
                    "unknown master",
                    format!("the sentinels no longer know a master named {:?}", s.master),
                )),
            },
            _ => Ok(true),
        }
    }
}

/// Connect within `timeout`, with reads and writes bounded by it too.
pub fn connect(client: &Client, timeout: Duration) -> RedisResult<Connection> {
    let conn = client.get_connection_with_timeout(timeout)?;
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    Ok(conn)
}

fn left(deadline: Instant) -> Option<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    (!d.is_zero()).then_some(d)
}

/// Ask the sentinel behind `plain` (or, if it asks for them, with the
/// URL's credentials: `authed`) where the master named `master` is.
/// Ok(None): it knows no master of that name.
fn ask(
    plain: &Client,
    authed: &Client,
    master: &str,
    timeout: Duration,
) -> RedisResult<Option<Node>> {
    let query = |client: &Client| -> RedisResult<Option<(String, u16)>> {
        let mut conn = connect(client, timeout)?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query(&mut conn)
    };
    let answer = match query(plain) {
        Err(e) if is_auth_error(&e) => query(authed),
        other => other,
    }?;
    Ok(answer.map(|(host, port)| Node {
        host: if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        },
        port,
    }))
}

impl Sentinels {
    /// The master a majority of the sentinels in the URL name, asking them
    /// all at once (a sentinel that hangs costs no one else's time).
    /// Ok(None): a majority knows no master of that name. A sentinel cut off
    /// from the others may still name the old master; it is outvoted, and
    /// with no majority either way there is no answer.
    fn locate(&self, timeout: Duration) -> RedisResult<Option<Node>> {
        let n = self.nodes.len();
        let rx = self.ask_all(timeout)?;
        let deadline = Instant::now() + timeout;
        let mut votes = Votes::new(n / 2 + 1);
        let mut silent = true;
        while let Some(t) = left(deadline) {
            let (i, answer) = match rx.recv_timeout(t) {
                Ok(a) => a,
                Err(e) => {
                    // Disconnected: every sentinel has had its say in time.
                    silent = e == std::sync::mpsc::RecvTimeoutError::Timeout;
                    break;
                }
            };
            if matches!(answer, Ok(Some(_))) {
                self.answered.store(true, Ordering::Relaxed);
            }
            if let Some(decided) = votes.count(&self.nodes[i], answer) {
                return Ok(decided);
            }
        }
        Err(votes.undecided(n, &self.master, silent.then_some(timeout)))
    }

    /// Ask every sentinel for the master at once, each from a thread of its
    /// own; the answers come on the receiver, by sentinel index.
    fn ask_all(&self, timeout: Duration) -> RedisResult<Receiver<(usize, Asked)>> {
        let (tx, rx) = std::sync::mpsc::channel();
        for i in 0..self.nodes.len() {
            let (plain, authed) = (self.plain[i].clone(), self.authed[i].clone());
            let (master, tx) = (self.master.clone(), tx.clone());
            let spawned = std::thread::Builder::new()
                .name("lockrun-sentinel".into())
                .spawn(move || {
                    let _ = tx.send((i, ask(&plain, &authed, &master, timeout)));
                });
            if let Err(e) = spawned {
                return Err(passing(
                    "no thread",
                    format!("cannot start a thread to ask a sentinel: {e}"),
                ));
            }
        }
        Ok(rx)
    }

    /// Resolve the master and connect to it, checking that it says it is
    /// one.
    fn connect_master(&self, timeout: Duration) -> RedisResult<Linked> {
        let deadline = Instant::now() + timeout;
        let node = self.locate(timeout)?.ok_or_else(|| {
            refused(
                "unknown master",
                format!(
                    "no sentinel knows a master named {:?}; check the name in the URL",
                    self.master
                ),
            )
        })?;
        let t =
            left(deadline).ok_or_else(|| passing("timed out", "resolving the master".into()))?;
        let client = self
            .url
            .client_at(&node, true, true)
            .map_err(|e| refused("bad address", e.to_string()))?;
        let unreachable = |e: RedisError| {
            passing(
                "master unreachable",
                format!("the master the sentinels name, {node}: {}", describe(&e)),
            )
        };
        let mut conn = match connect(&client, t) {
            Err(e) if !is_auth_error(&e) => return Err(unreachable(e)),
            other => other?,
        };
        let role: Vec<Value> = redis::cmd("ROLE").query(&mut conn).map_err(unreachable)?;
        match role.first() {
            Some(Value::BulkString(r)) if r == b"master" => {
                log::info(format!("master of {} is {node}", self.master));
                Ok(Linked {
                    conn: Conn::One(conn),
                    node: Some(node),
                })
            }
            _ => Err(passing(
                "not a master",
                format!(
                    "{node}, named master of {} by the sentinels, is not one yet (a failover is under way)",
                    self.master
                ),
            )),
        }
    }
}

/// One sentinel's answer: the master it names, or None when it knows no
/// such master.
type Asked = RedisResult<Option<Node>>;

/// The sentinels' answers so far, until a majority agrees.
struct Votes {
    majority: usize,
    named: Vec<(Node, usize)>,
    unknown: usize,
    last: Option<String>,
}

impl Votes {
    fn new(majority: usize) -> Votes {
        Votes {
            majority,
            named: Vec::new(),
            unknown: 0,
            last: None,
        }
    }

    /// Count sentinel `who`'s answer; Some once a majority has decided.
    fn count(&mut self, who: &Node, answer: Asked) -> Option<Option<Node>> {
        match answer {
            Ok(Some(node)) => {
                let votes = match self.named.iter_mut().find(|(m, _)| *m == node) {
                    Some((_, v)) => {
                        *v += 1;
                        *v
                    }
                    None => {
                        self.named.push((node.clone(), 1));
                        1
                    }
                };
                (votes >= self.majority).then_some(Some(node))
            }
            Ok(None) => {
                self.unknown += 1;
                (self.unknown >= self.majority).then_some(None)
            }
            Err(e) => {
                log::info(format!("sentinel {who}: {}", describe(&e)));
                self.last = Some(format!("{who}: {}", describe(&e)));
                None
            }
        }
    }

    /// Why no majority decided among `n` sentinels of `master`; `silent`:
    /// some did not answer within that time.
    fn undecided(self, n: usize, master: &str, silent: Option<Duration>) -> RedisError {
        let majority = self.majority;
        let answered = self.unknown + self.named.iter().map(|(_, v)| v).sum::<usize>();
        let failed = self
            .last
            .map(|e| format!("; last error: sentinel {e}"))
            .unwrap_or_default();
        if answered < majority {
            return passing(
                "no majority",
                format!(
                    "only {answered} of the {n} sentinels answered{}: a majority ({majority}) \
                     must name the master of {master}{failed}",
                    silent
                        .map(|t| format!(" within {}", crate::text::duration(t)))
                        .unwrap_or_default(),
                ),
            );
        }
        let mut heard: Vec<String> = self
            .named
            .iter()
            .map(|(m, v)| format!("{v} name {m}"))
            .collect();
        if self.unknown > 0 {
            heard.push(format!("{} know no such master", self.unknown));
        }
        passing(
            "no majority",
            format!(
                "no majority of the {n} sentinels names one master of {master} ({}){failed}",
                heard.join(", ")
            ),
        )
    }
}
