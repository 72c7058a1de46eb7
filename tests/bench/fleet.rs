//! The fleet section: many waiters on one name, as a rolling operation
//! over a fleet makes them, on every engine there is a server for.
//!
//! For each engine: a holder, then N waiters started 10 ms apart (jobs
//! of 0.1 s, `-w 20m`); once they are all queued (or their arrivals are
//! over), the server's requests per waiter per second while they are
//! blocked; then the holder ends and the queue drains. Reported: the
//! time per hand-off (the drain over N, less the job) beside a single
//! waiter's, the peak of the server's client connections while the
//! queue lived, how long `status NAME` took with the whole queue
//! waiting, and how the waiters ended (exit codes).
//!
//!     LOCKRUN_BENCH_ONLY=fleet LOCKRUN_BENCH_FLEET=500 cargo bench
//!     LOCKRUN_BENCH_FLEET_ENGINES=redis,postgres  # only these engines

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Bench, bin, support};

/// What the section needs to read from one engine's server.
struct Server<'a> {
    name: &'static str,
    url: String,
    /// The server's count of requests served so far.
    requests: Box<dyn Fn() -> Option<u64> + Sync + 'a>,
    /// Client connections open now (None: the server does not say).
    connections: Box<dyn Fn() -> Option<u64> + Sync + 'a>,
}

/// One engine's figures.
struct Figures {
    queued: u64,
    per_waiter_per_s: Option<f64>,
    handoff_ms: f64,
    single_ms: f64,
    peak_connections: Option<u64>,
    /// `status NAME` with the whole queue waiting, median of 5, ms.
    status_ms: f64,
    exits: std::collections::BTreeMap<i32, usize>,
}

const JOB_MS: u64 = 100;

fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn mntr(port: u16, key: &str) -> Option<u64> {
    let out = support::four_letters(port, "mntr")?;
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
}

impl Bench {
    pub fn fleet(&mut self) {
        let n: usize = std::env::var("LOCKRUN_BENCH_FLEET")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(if self.quick { 40 } else { 500 });
        let only = std::env::var("LOCKRUN_BENCH_FLEET_ENGINES").unwrap_or_default();
        let chosen = |e: &str| only.is_empty() || only.split(',').any(|o| o == e);
        let zk = (chosen("zookeeper")
            && std::path::Path::new("/usr/share/java/zookeeper.jar").exists())
        .then(support::Zookeeper::start);
        // As a fleet of hosts meets it (one connection per address): no
        // limit per address, beside the default server whose 60 per address
        // the benchmark's one host passes.
        let zk_fleet = zk.as_ref().map(|_| {
            let mut z = support::Zookeeper::start();
            z.server.restart_with("maxClientCnxns", "0");
            z
        });
        let mut servers = Vec::new();
        if chosen("local") {
            let dir = self.path("fleet-locks");
            std::fs::create_dir_all(&dir).unwrap();
            servers.push(Server {
                name: "local",
                url: format!("file://{}", dir.display()),
                requests: Box::new(|| None),
                connections: Box::new(|| None),
            });
        }
        if chosen("redis") {
            let url = self.redis.url();
            let info = move |section: &'static str, key: &'static str| {
                let url = url.clone();
                move || {
                    let mut c = redis::Client::open(url.as_str())
                        .ok()?
                        .get_connection()
                        .ok()?;
                    let text: String = redis::cmd("INFO").arg(section).query(&mut c).ok()?;
                    text.lines()
                        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
                }
            };
            servers.push(Server {
                name: "redis",
                url: self.redis.url(),
                // The requests lockrun's clients send, not the commands
                // its scripts run inside Redis (which INFO counts too).
                requests: Box::new({
                    let url = self.redis.url();
                    move || {
                        let mut c = redis::Client::open(url.as_str())
                            .ok()?
                            .get_connection()
                            .ok()?;
                        let text: String =
                            redis::cmd("INFO").arg("commandstats").query(&mut c).ok()?;
                        let sent = [
                            "evalsha", "eval", "blpop", "ping", "hello", "auth", "select",
                        ];
                        Some(
                            text.lines()
                                .filter_map(|l| {
                                    let (cmd, rest) =
                                        l.strip_prefix("cmdstat_")?.split_once(':')?;
                                    sent.contains(&cmd).then_some(())?;
                                    rest.strip_prefix("calls=")?
                                        .split(',')
                                        .next()?
                                        .parse::<u64>()
                                        .ok()
                                })
                                .sum(),
                        )
                    }
                }),
                // Less the one asking.
                connections: Box::new({
                    let c = info("clients", "connected_clients");
                    move || c().map(|v: u64| v.saturating_sub(1))
                }),
            });
        }
        if let Some(e) = self.etcd.as_ref().filter(|_| chosen("etcd")) {
            let metrics = format!("{}/metrics", e.endpoint);
            servers.push(Server {
                name: "etcd",
                url: format!("etcd://{}", e.endpoint.trim_start_matches("http://")),
                requests: Box::new(move || {
                    let out = Command::new("curl").args(["-s", &metrics]).output().ok()?;
                    let text = String::from_utf8_lossy(&out.stdout).to_string();
                    Some(metric_sum(&text, "grpc_server_msg_received_total"))
                }),
                connections: Box::new(|| None),
            });
        }
        if let Some(pg) = self.postgres.as_ref().filter(|_| chosen("postgres")) {
            servers.push(Server {
                name: "postgres",
                url: pg.url(),
                requests: Box::new(move || {
                    pg.try_sql("SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database")?
                        .trim()
                        .parse()
                        .ok()
                }),
                connections: Box::new(move || {
                    pg.try_sql(
                        "SELECT count(*) - 1 FROM pg_stat_activity WHERE backend_type = 'client backend'",
                    )?
                    .trim()
                    .parse()
                    .ok()
                }),
            });
        }
        if let Some(my) = self.mariadb.as_ref().filter(|_| chosen("mariadb")) {
            let status = |key: &'static str| {
                move || {
                    my.try_sql(&format!("SHOW GLOBAL STATUS LIKE '{key}'"))?
                        .split_whitespace()
                        .nth(1)?
                        .parse()
                        .ok()
                }
            };
            let threads = status("Threads_connected");
            servers.push(Server {
                name: "mariadb",
                url: my.url(),
                requests: Box::new(status("Questions")),
                connections: Box::new(move || threads().map(|v: u64| v.saturating_sub(1))),
            });
        }
        for (z, name) in zk
            .iter()
            .map(|z| (z, "zookeeper"))
            .chain(zk_fleet.iter().map(|z| (z, "zk-nolimit")))
        {
            let port = z.server.port;
            servers.push(Server {
                name,
                url: z.url(),
                requests: Box::new(move || mntr(port, "zk_packets_received")),
                connections: Box::new(move || {
                    mntr(port, "zk_num_alive_connections").map(|v| v.saturating_sub(1))
                }),
            });
        }
        println!("\nfleet: {n} waiters on one name, jobs of {JOB_MS} ms");
        println!(
            "{:<10} {:>7} {:>14} {:>12} {:>12} {:>8} {:>10}  exits",
            "engine",
            "queued",
            "req/waiter/s",
            "hand-off ms",
            "1 waiter ms",
            "peak cx",
            "status ms"
        );
        let mut out = serde_json::Map::new();
        for server in &servers {
            let single = (0..3)
                .map(|i| self.drain(server, &format!("fleet1-{i}"), 1).handoff_ms)
                .fold(f64::MAX, f64::min);
            let mut f = self.drain(server, "fleet", n);
            f.single_ms = single;
            let exits: Vec<String> = f.exits.iter().map(|(c, k)| format!("{k}×{c}")).collect();
            println!(
                "{:<10} {:>7} {:>14} {:>12.1} {:>12.1} {:>8} {:>10.1}  {}",
                server.name,
                f.queued,
                f.per_waiter_per_s.map_or("-".into(), |r| format!("{r:.2}")),
                f.handoff_ms,
                f.single_ms,
                f.peak_connections.map_or("-".into(), |c| c.to_string()),
                f.status_ms,
                exits.join(" ")
            );
            out.insert(
                server.name.into(),
                json!({
                    "waiters": n,
                    "queued": f.queued,
                    "requests_per_waiter_per_s": f.per_waiter_per_s,
                    "handoff_ms": f.handoff_ms,
                    "single_waiter_handoff_ms": f.single_ms,
                    "peak_connections": f.peak_connections,
                    "status_ms": f.status_ms,
                    "exits": f.exits.iter().map(|(c, k)| (c.to_string(), json!(k))).collect::<serde_json::Map<_, _>>(),
                }),
            );
        }
        drop(servers);
        self.record("fleet", serde_json::Value::Object(out));
    }

    /// A holder, `n` waiters behind it, the figures while they wait, and
    /// the drain once the holder ends.
    fn drain(&self, server: &Server, name: &str, n: usize) -> Figures {
        let go = self.path(&format!("{name}-go"));
        let _ = std::fs::remove_file(&go);
        let lockrun = |job: &[&str]| {
            let mut c = Command::new(bin());
            c.args(["-q", "-w", "20m", "--url", &server.url, name, "--"])
                .arg(&self.exe)
                .args(job)
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            c
        };
        let stamp = self.path(&format!("{name}-held"));
        let _ = std::fs::remove_file(&stamp);
        let mut holder = lockrun(&[
            "job-hold",
            &go.display().to_string(),
            &stamp.display().to_string(),
        ])
        .spawn()
        .unwrap();
        // The holder holds once its status says so.
        support::wait_until(Duration::from_secs(30), || {
            held(&server.url, name).is_some_and(|(h, _)| h)
        });
        // The peak of the server's connections, sampled while the queue lives.
        let stop = AtomicBool::new(false);
        let peak = AtomicU64::new(0);
        let known = AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(c) = (server.connections)() {
                        known.store(true, Ordering::Relaxed);
                        peak.fetch_max(c, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
            let f = self.queue_and_drain(server, name, n, &go, &mut holder, &lockrun);
            stop.store(true, Ordering::Relaxed);
            f
        })
        .with_peak(known.into_inner().then(|| peak.into_inner()))
    }

    fn queue_and_drain(
        &self,
        server: &Server,
        name: &str,
        n: usize,
        go: &std::path::Path,
        holder: &mut Child,
        lockrun: &dyn Fn(&[&str]) -> Command,
    ) -> Figures {
        let mut waiters: Vec<Child> = Vec::with_capacity(n);
        for _ in 0..n {
            waiters.push(
                lockrun(&["job-sleep", &JOB_MS.to_string()])
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // Wait until every waiter is queued, or the count stops growing.
        let mut queued = 0;
        let mut last_growth = Instant::now();
        while last_growth.elapsed() < Duration::from_secs(10) {
            let now = held(&server.url, name).map_or(0, |(_, w)| w);
            if now > queued {
                queued = now;
                last_growth = Instant::now();
            }
            if queued >= n as u64 {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let mut took: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                held(&server.url, name);
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        took.sort_by(f64::total_cmp);
        let status_ms = took[2];
        let per_waiter_per_s = (n > 1).then(|| {
            let before = (server.requests)()?;
            let t = Instant::now();
            // Longer than a place is kept for at the default ttl (every
            // 8 to 10 s on Redis), so that every waiter's keeping is in it.
            std::thread::sleep(Duration::from_secs(12));
            let after = (server.requests)()?;
            Some((after - before) as f64 / t.elapsed().as_secs_f64() / n as f64)
        });
        let released = Instant::now();
        std::fs::write(go, "").unwrap();
        let mut exits = std::collections::BTreeMap::new();
        let _ = holder.wait();
        for (i, w) in waiters.into_iter().enumerate() {
            let out = w.wait_with_output().unwrap();
            let code = out.status.code().unwrap_or(-1);
            if code != 0 {
                // What a waiter that did not run said, to find why.
                eprintln!(
                    "{} waiter {i} exited {code}: {}",
                    server.name,
                    String::from_utf8_lossy(&out.stderr).trim_end()
                );
            }
            *exits.entry(code).or_insert(0) += 1;
        }
        let drained = released.elapsed().as_secs_f64() * 1000.0;
        let ran = exits.get(&0).copied().unwrap_or(0).max(1);
        Figures {
            queued,
            per_waiter_per_s: per_waiter_per_s.flatten(),
            handoff_ms: drained / ran as f64 - JOB_MS as f64,
            single_ms: 0.0,
            peak_connections: None,
            status_ms,
            exits,
        }
    }
}

impl Figures {
    fn with_peak(mut self, peak: Option<u64>) -> Figures {
        self.peak_connections = peak;
        self
    }
}

/// `status --json NAME`: whether it is held and how many wait.
fn held(url: &str, name: &str) -> Option<(bool, u64)> {
    let out = Command::new(bin())
        .args(["--url", url, "status", "--json", name])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((v["held"] == true, v["waiters"].as_u64().unwrap_or(0)))
}
