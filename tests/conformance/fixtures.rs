//! The engines the conformance suite runs on, each with what a test must
//! do behind lockrun's back: take a lease away, see what is stored, make a
//! user, start a server of the test's own.

use std::time::Duration;

use crate::support::*;

/// An engine under test: where it lives and the few things a test must do
/// behind lockrun's back.
pub trait Fixture {
    fn url(&self) -> String;
    /// `release --force` can break a holder here.
    fn breaks(&self) -> bool;
    /// Make the lease of `name` no longer the holder's, as an operator or a
    /// fault would.
    fn take_away(&self, name: &str);
    /// Nothing at all is stored (no lock, no counter, no queue).
    fn untouched(&self) -> bool;
    /// An address of this engine where nothing can be reached.
    fn unreachable(&self) -> String;
    /// What is stored that will never go on its own, once every lockrun of
    /// the test has ended (empty: nothing).
    fn endless(&self) -> Vec<String>;
    /// A name used once and free now is still listed by `status`, as
    /// free: the engine keeps a trace of it (a lock file, a token counter).
    fn keeps_free_names(&self) -> bool {
        false
    }
    /// A lease lapses when nobody renews it (a flock does not).
    fn lapses(&self) -> bool {
        true
    }
    /// The ttl a queue test asks for: short, but no shorter than the
    /// engine's smallest lease or session, and long where a place is given
    /// up at once (so that this is told from a place that lapses).
    fn queue_ttl(&self) -> Duration {
        Duration::from_secs(3)
    }
    /// How long the place of a waiter killed with SIGKILL can outlive it,
    /// the waiter having asked for `ttl`: a third of it where the place is
    /// kept by renewal; nothing where it is a lock or connection that dies
    /// with the process.
    fn dead_place(&self, ttl: Duration) -> Duration {
        ttl / 3
    }
    /// A URL of this engine that logs in with the password `pw` (a user
    /// made for it); none where the engine has no passwords.
    fn with_password(&self, _pw: &str) -> Option<String> {
        None
    }
    /// URLs of this engine, each with the password `pw-s3cret`, that
    /// lockrun must refuse as they are written, contacting nothing.
    fn bad_urls(&self) -> Vec<String>;
    /// A URL of a user with only the rights lockrun-engines(7) tells
    /// operators to give; none where the engine has no users.
    fn documented_user(&self) -> Option<String> {
        None
    }
    /// A server of this engine for one test alone, to restart or stop;
    /// none where there is no server, or where a restart is a failover
    /// (Sentinel, Cluster) or loses leases by design (Redis without
    /// persistence): those are tested in the engine's file.
    fn own_server(&self) -> Option<Box<dyn Server>> {
        None
    }
}

pub struct LocalEngine {
    scratch: Scratch,
    url: String,
}

impl LocalEngine {
    pub fn new() -> LocalEngine {
        let scratch = Scratch::new();
        let url = scratch.file_url();
        LocalEngine { scratch, url }
    }
}

impl Fixture for LocalEngine {
    fn url(&self) -> String {
        self.url.clone()
    }
    fn lapses(&self) -> bool {
        false
    }
    fn breaks(&self) -> bool {
        false
    }
    fn take_away(&self, name: &str) {
        // A lock file replaced under a holder: the one it locked is gone.
        let f = self.scratch.path(&format!("locks/{name}.lock"));
        std::fs::remove_file(&f).unwrap();
        std::fs::write(&f, "").unwrap();
    }
    fn untouched(&self) -> bool {
        std::fs::read_dir(self.scratch.path("locks"))
            .unwrap()
            .next()
            .is_none()
    }
    fn unreachable(&self) -> String {
        "file:///proc/lockrun-nowhere/locks".into()
    }
    fn queue_ttl(&self) -> Duration {
        // Long, so that a place given up at once is told from one that
        // lapses.
        Duration::from_secs(30)
    }
    fn dead_place(&self, _ttl: Duration) -> Duration {
        // A place is a flock, and it dies with its process.
        Duration::ZERO
    }
    fn keeps_free_names(&self) -> bool {
        true
    }
    fn bad_urls(&self) -> Vec<String> {
        vec![
            "file://u:pw-s3cret@h/locks".into(),
            "file://u:pw-s3cret@h:99999/locks".into(),
        ]
    }
    fn endless(&self) -> Vec<String> {
        // Lock files stay by design; one still locked once every lockrun
        // is gone would be a leftover.
        let dir = std::fs::read_dir(self.scratch.path("locks"));
        dir.into_iter()
            .flatten()
            .flatten()
            .filter(|e| still_locked(&e.path()))
            .map(|e| e.path().display().to_string())
            .collect()
    }
}

/// A user made on each of `nodes` that may do everything, with password
/// `pw`: its name.
fn acl_user_for(nodes: &[&Redis], pw: &str) -> String {
    let user = format!("u{}", hex(pw));
    for n in nodes {
        n.cmd::<String>(&[
            "ACL",
            "SETUSER",
            &user,
            "on",
            &format!(">{pw}"),
            "~*",
            "&*",
            "+@all",
        ]);
    }
    user
}

/// The user lockrun-engines(7) tells operators to make, with exactly its
/// rules and the `more` its topology adds, on each of `nodes`: `url`
/// logged in as it.
fn documented_acl_user(nodes: &[&Redis], url: &str, more: &str) -> String {
    let rules = crate::docs::documented_redis_acl();
    for n in nodes {
        let mut args = vec!["ACL", "SETUSER", "locker", "reset", "on", ">locker-pw"];
        args.extend(rules.split_whitespace());
        args.extend(more.split_whitespace());
        n.cmd::<String>(&args);
    }
    with_userinfo(url, "locker", "locker-pw")
}

/// `url` with `user:pw@` before its hosts.
fn with_userinfo(url: &str, user: &str, pw: &str) -> String {
    url.replacen("://", &format!("://{user}:{pw}@"), 1)
}

/// A user name per password, the same each time.
fn hex(pw: &str) -> String {
    pw.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Someone holds a flock on `path`: an exclusive one is refused to us.
fn still_locked(path: &std::path::Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    // SAFETY: flock on a descriptor this function owns; nothing is passed
    // but the descriptor and flags.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 }
}

pub struct RedisEngine {
    redis: Redis,
}

impl RedisEngine {
    pub fn new() -> RedisEngine {
        RedisEngine {
            redis: Redis::start(),
        }
    }
}

impl Fixture for RedisEngine {
    fn url(&self) -> String {
        self.redis.url()
    }
    fn breaks(&self) -> bool {
        true
    }
    fn take_away(&self, name: &str) {
        let _: () = self.redis.cmd(&["DEL", &format!("lockrun:{{{name}}}")]);
    }
    fn untouched(&self) -> bool {
        self.redis.keys().is_empty()
    }
    fn unreachable(&self) -> String {
        format!("redis://127.0.0.1:{}", free_port())
    }
    fn with_password(&self, pw: &str) -> Option<String> {
        let user = acl_user_for(&[&self.redis], pw);
        Some(with_userinfo(&self.redis.url(), &user, pw))
    }
    fn documented_user(&self) -> Option<String> {
        Some(documented_acl_user(&[&self.redis], &self.redis.url(), ""))
    }
    fn keeps_free_names(&self) -> bool {
        true
    }
    fn bad_urls(&self) -> Vec<String> {
        vec![
            "redis://u:pw-s3cret@h:99999".into(),
            "redis://u:pw-s3cret@h/notadb".into(),
            "rediss://u:pw-s3cret@h#secure".into(),
        ]
    }
    fn endless(&self) -> Vec<String> {
        self.redis.keys_without_expiry(&mut self.redis.conn(), "*")
    }
}

/// A master and a replica behind three sentinels.
pub struct SentinelEngine {
    set: Sentinels,
}

impl SentinelEngine {
    pub fn new() -> SentinelEngine {
        SentinelEngine {
            set: Sentinels::start(),
        }
    }
}

impl Fixture for SentinelEngine {
    fn url(&self) -> String {
        self.set.url()
    }
    fn breaks(&self) -> bool {
        true
    }
    fn take_away(&self, name: &str) {
        let _: () = self
            .set
            .master()
            .cmd(&["DEL", &format!("lockrun:{{{name}}}")]);
    }
    fn untouched(&self) -> bool {
        self.set.nodes.iter().all(|n| n.keys().is_empty())
    }
    fn unreachable(&self) -> String {
        format!("redis+sentinel://127.0.0.1:{}/{MASTER}", free_port())
    }
    fn with_password(&self, pw: &str) -> Option<String> {
        let nodes: Vec<&Redis> = self.set.nodes.iter().collect();
        let user = acl_user_for(&nodes, pw);
        Some(with_userinfo(&self.set.url(), &user, pw))
    }
    fn documented_user(&self) -> Option<String> {
        let nodes: Vec<&Redis> = self.set.nodes.iter().collect();
        // lockrun-engines(7) "REDIS SENTINEL": as Redis, plus +role.
        Some(documented_acl_user(&nodes, &self.set.url(), "+role"))
    }
    fn keeps_free_names(&self) -> bool {
        true
    }
    fn bad_urls(&self) -> Vec<String> {
        vec![
            format!("redis+sentinel://u:pw-s3cret@h:99999/{MASTER}"),
            "redis+sentinel://u:pw-s3cret@h".into(),
            format!("redis+sentinel://u:pw-s3cret@h/{MASTER}/notadb"),
        ]
    }
    fn endless(&self) -> Vec<String> {
        let master = self.set.master();
        master.keys_without_expiry(&mut master.conn(), "*")
    }
}

/// Three masters of a Redis Cluster.
pub struct ClusterEngine {
    cluster: Cluster,
}

impl ClusterEngine {
    pub fn new() -> ClusterEngine {
        ClusterEngine {
            cluster: Cluster::start(),
        }
    }
}

impl Fixture for ClusterEngine {
    fn url(&self) -> String {
        self.cluster.url()
    }
    fn breaks(&self) -> bool {
        true
    }
    fn take_away(&self, name: &str) {
        let key = format!("lockrun:{{{name}}}");
        let _: () = self.cluster.node_of(&key).cmd(&["DEL", &key]);
    }
    fn untouched(&self) -> bool {
        self.cluster.keys().is_empty()
    }
    fn unreachable(&self) -> String {
        format!("redis+cluster://127.0.0.1:{}", free_port())
    }
    fn with_password(&self, pw: &str) -> Option<String> {
        let nodes: Vec<&Redis> = self.cluster.nodes.iter().collect();
        let user = acl_user_for(&nodes, pw);
        Some(with_userinfo(&self.cluster.url(), &user, pw))
    }
    fn documented_user(&self) -> Option<String> {
        let nodes: Vec<&Redis> = self.cluster.nodes.iter().collect();
        // lockrun-engines(7) "REDIS CLUSTER": as Redis, plus these, on
        // every node.
        let more = "+ping +cluster|slots +asking +cluster|nodes";
        Some(documented_acl_user(&nodes, &self.cluster.url(), more))
    }
    fn keeps_free_names(&self) -> bool {
        true
    }
    fn bad_urls(&self) -> Vec<String> {
        vec![
            "redis+cluster://u:pw-s3cret@h:99999".into(),
            "redis+cluster://u:pw-s3cret@h,".into(),
        ]
    }
    fn endless(&self) -> Vec<String> {
        let nodes = self.cluster.nodes.iter();
        nodes
            .flat_map(|n| n.keys_without_expiry(&mut n.conn(), "*"))
            .collect()
    }
}

/// An etcd server of our own.
pub struct EtcdEngine {
    etcd: Etcd,
    /// Authentication is on: a user was made.
    auth: std::cell::Cell<bool>,
}

impl EtcdEngine {
    pub fn new() -> EtcdEngine {
        EtcdEngine {
            etcd: Etcd::start(),
            auth: Default::default(),
        }
    }
}

impl Fixture for EtcdEngine {
    fn url(&self) -> String {
        self.etcd.url()
    }
    fn breaks(&self) -> bool {
        true
    }
    fn take_away(&self, name: &str) {
        self.etcd
            .ctl(&["del", "--prefix", &format!("lockrun:{name}/")]);
    }
    fn untouched(&self) -> bool {
        self.etcd.keys().is_empty() && self.etcd.leases().is_empty()
    }
    fn unreachable(&self) -> String {
        format!("etcd://127.0.0.1:{}", free_port())
    }
    fn queue_ttl(&self) -> Duration {
        // A waiter's place is a lease of a third of the ttl, and etcd's
        // smallest lease is 2 s.
        Duration::from_secs(6)
    }
    fn with_password(&self, pw: &str) -> Option<String> {
        // The first user turns authentication on; the next ones are added
        // by root, with the same role.
        if !self.auth.replace(true) {
            return Some(self.etcd.with_locker(pw));
        }
        let user = format!("locker-{}", hex(pw));
        let root = ["--user", "root:rootpw"];
        self.etcd
            .ctl(&[&root[..], &["user", "add", &format!("{user}:{pw}")]].concat());
        self.etcd
            .ctl(&[&root[..], &["user", "grant-role", &user, "locking"]].concat());
        Some(with_userinfo(&self.etcd.url(), &user, pw))
    }
    fn own_server(&self) -> Option<Box<dyn Server>> {
        Some(Box::new(Etcd::start()))
    }
    fn documented_user(&self) -> Option<String> {
        // Every user made here has the role the page gives.
        self.with_password("locker-pw")
    }
    fn bad_urls(&self) -> Vec<String> {
        let port = self.etcd.port;
        vec![
            format!("etcd://127.0.0.1:{port}/path"),
            format!("etcd://u:pw-s3cret@127.0.0.1:{port}/x"),
            "etcd://u:pw-s3cret@h:port".into(),
            "etcd://u:pw-s3cret@h:99999".into(),
            "etcd://".into(),
            format!("etcd://127.0.0.1:{port},"),
        ]
    }
    fn endless(&self) -> Vec<String> {
        // Every key is bound to a lease; with every lockrun gone they go.
        let mut left = Vec::new();
        wait_until(Duration::from_secs(40), || {
            left = self.etcd.keys();
            left.is_empty()
        });
        left
    }
}

/// A PostgreSQL server of our own.
pub struct PostgresEngine {
    pg: Postgres,
}

impl PostgresEngine {
    pub fn new() -> PostgresEngine {
        PostgresEngine {
            pg: Postgres::start(),
        }
    }
}

impl Fixture for PostgresEngine {
    fn url(&self) -> String {
        self.pg.url()
    }
    fn breaks(&self) -> bool {
        true
    }
    fn take_away(&self, name: &str) {
        self.pg.sql(&format!(
            "DELETE FROM lockrun.lockrun_leases WHERE name = '{name}'"
        ));
    }
    fn untouched(&self) -> bool {
        !self.pg.has_schema() && self.pg.rows() == 0
    }
    fn unreachable(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", free_port())
    }
    fn with_password(&self, pw: &str) -> Option<String> {
        let user = format!("u{}", hex(pw));
        self.pg.sql(&format!(
            "CREATE ROLE {user} LOGIN SUPERUSER PASSWORD '{pw}'"
        ));
        Some(self.pg.url_as(&user, pw))
    }
    fn own_server(&self) -> Option<Box<dyn Server>> {
        Some(Box::new(Postgres::start()))
    }
    fn documented_user(&self) -> Option<String> {
        // The owner creates the tables; the job's role only uses them.
        on(&self.pg.url()).args(["x", "true"]).succeeds();
        self.pg.sql(&format!(
            "CREATE ROLE ci LOGIN PASSWORD 'ci-pw'; {}",
            crate::docs::documented_postgres_grants("ci")
        ));
        Some(self.pg.url_as("ci", "ci-pw"))
    }
    fn bad_urls(&self) -> Vec<String> {
        vec![
            "postgres://u:pw-s3cret@h:99999/d".into(),
            "postgres://u:pw-s3cret@h/d?nope=1".into(),
            "postgresql://u:pw-s3cret@h/d/e".into(),
            "postgres://u:pw-s3cret@h/d?sslmode=sometimes".into(),
        ]
    }
    fn endless(&self) -> Vec<String> {
        // Rows that are live, or that the next request cleans, are fine: run
        // one request to clean, then any waiter row, or lease row still
        // running, is one nobody would end.
        let _ = on(&self.pg.url())
            .args(["-n", "cleanup-probe", "true"])
            .output();
        let q = self.pg.sql(
            "SELECT 'waiter '||name||' '||owner FROM lockrun.lockrun_waiters \
             UNION ALL SELECT 'lease '||name||' '||owner||' '||label FROM lockrun.lockrun_leases \
             WHERE expires_at > clock_timestamp()",
        );
        q.lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }
}

/// A chroot of its own on the ZooKeeper server the run shares.
pub struct ZookeeperEngine {
    port: u16,
    chroot: String,
    /// Every server's client port (one, or the ensemble's three).
    hosts: Vec<u16>,
}

impl ZookeeperEngine {
    pub fn new() -> ZookeeperEngine {
        let (port, chroot) = zk_chroot();
        ZookeeperEngine {
            port,
            chroot,
            hosts: vec![port],
        }
    }

    /// A chroot of its own on the three-server ensemble the run shares.
    pub fn ensemble() -> ZookeeperEngine {
        let hosts = shared_ensemble();
        let (port, chroot) = zk_chroot_on(hosts[0]);
        ZookeeperEngine {
            port,
            chroot,
            hosts,
        }
    }

    fn tree(&self) -> Vec<(String, i64)> {
        zk_tree(self.port, Some(&self.chroot))
    }
}

impl Fixture for ZookeeperEngine {
    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("zk://{}{}", hosts.join(","), self.chroot)
    }
    fn breaks(&self) -> bool {
        true
    }
    fn take_away(&self, name: &str) {
        // Every request node of the name, as an operator's delete would.
        let parent = format!("/lockrun/{name}");
        for (path, _) in self.tree() {
            if path.starts_with(&format!("{parent}/")) {
                zk_delete(self.port, Some(&self.chroot), &path);
            }
        }
    }
    fn untouched(&self) -> bool {
        self.tree().is_empty()
    }
    fn unreachable(&self) -> String {
        format!("zk://127.0.0.1:{}", free_port())
    }
    fn queue_ttl(&self) -> Duration {
        Duration::from_secs(6)
    }
    fn dead_place(&self, ttl: Duration) -> Duration {
        // A waiter's node lives as long as its session, and a session
        // lasts the ttl: the node would become a holder's, whose session
        // is its lease (lockrun-engines(7) "ZOOKEEPER").
        ttl
    }
    fn with_password(&self, pw: &str) -> Option<String> {
        // Nodes a digest makes are that digest's: each password gets a
        // chroot of its own on the same server.
        let (port, chroot) = zk_chroot_on(self.hosts[0]);
        Some(format!("zk://locker:{pw}@127.0.0.1:{port}{chroot}"))
    }
    fn own_server(&self) -> Option<Box<dyn Server>> {
        // One member of an ensemble restarted is a failover, tested in
        // the engine's file.
        let alone = self.hosts.len() == 1;
        alone.then(|| Box::new(Zookeeper::start()) as Box<dyn Server>)
    }
    fn bad_urls(&self) -> Vec<String> {
        vec![
            "zk://u:pw-s3cret@h:99999/x".into(),
            "zk://u:pw-s3cret@h:port/x".into(),
            "zks://u:pw-s3cret@h#secure".into(),
        ]
    }
    fn endless(&self) -> Vec<String> {
        // Request nodes are ephemeral and the parents containers: with
        // every lockrun gone, only a persistent node would stay.
        let mut left = Vec::new();
        wait_until(Duration::from_secs(40), || {
            left = self
                .tree()
                .into_iter()
                .filter(|(_, owner)| *owner == 0)
                .map(|(p, _)| p)
                .collect();
            left.is_empty()
        });
        left
    }
}

/// MariaDB: one server for the whole run, a database of its own per test.
pub struct MariadbEngine {
    my: MyDb,
}

impl MariadbEngine {
    pub fn new() -> MariadbEngine {
        MariadbEngine { my: MyDb::new() }
    }
}

impl Fixture for MariadbEngine {
    fn url(&self) -> String {
        self.my.server.url_in(&self.my.db)
    }
    fn breaks(&self) -> bool {
        true
    }
    fn take_away(&self, name: &str) {
        self.my.sql(&format!(
            "DELETE FROM {}.lockrun_leases WHERE name = '{name}'",
            self.my.db
        ));
    }
    fn untouched(&self) -> bool {
        !self.my.server.has_tables(&self.my.db)
    }
    fn unreachable(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/app", free_port())
    }
    fn queue_ttl(&self) -> Duration {
        Duration::from_secs(30)
    }
    fn dead_place(&self, _ttl: Duration) -> Duration {
        // A place is known by a wake-up lock of the waiter's connection,
        // and it ends with the process.
        Duration::ZERO
    }
    fn with_password(&self, pw: &str) -> Option<String> {
        let db = &self.my.db;
        let user = format!("{db}_u{}", hex(pw));
        self.my.sql(&format!(
            "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED BY '{pw}'; \
             GRANT ALL ON `{db}`.* TO '{user}'@'127.0.0.1'"
        ));
        Some(self.my.server.url_as(&user, pw, db))
    }
    fn own_server(&self) -> Option<Box<dyn Server>> {
        Some(Box::new(Mariadb::start()))
    }
    fn documented_user(&self) -> Option<String> {
        // It may create the tables itself.
        let db = &self.my.db;
        let user = format!("ci_{db}");
        self.my.sql(&format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY 'ci-pw'; {}",
            crate::docs::documented_mysql_grants(&user, db)
        ));
        Some(self.my.server.url_as(&user, "ci-pw", db))
    }
    fn bad_urls(&self) -> Vec<String> {
        vec![
            "mysql://u:pw-s3cret@h:99999/d".into(),
            "mysql://u:pw-s3cret@h/d?nope=1".into(),
            "mariadb://u:pw-s3cret@h".into(),
            "mysql://u:pw-s3cret@h/d?ssl-mode=sometimes".into(),
        ]
    }
    fn endless(&self) -> Vec<String> {
        // As on PostgreSQL: one request cleans what has lapsed; a waiter
        // row, or a lease row still running, is one nobody would end.
        let _ = on(&self.url())
            .args(["-n", "cleanup-probe", "true"])
            .output();
        let db = &self.my.db;
        let q = self.my.sql(&format!(
            "SELECT CONCAT('waiter ', name, ' ', owner) FROM {db}.lockrun_waiters \
             UNION ALL SELECT CONCAT('lease ', name, ' ', owner, ' ', label) \
             FROM {db}.lockrun_leases WHERE expires_at > UTC_TIMESTAMP(6)"
        ));
        q.lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }
}
