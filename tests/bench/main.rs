//! Benchmarks: lockrun next to flock (and etcdctl when installed), measured
//! side by side and interleaved in one run so machine drift cancels out.
//!
//!     cargo bench                       # full run, writes target/lockrun-bench.json
//!     LOCKRUN_BENCH_QUICK=1 cargo bench # fewer rounds, for a smoke test
//!     LOCKRUN_BENCH_AB=OTHER cargo bench  # this lockrun (A) against OTHER (B)
//!     LOCKRUN_BENCH_ONLY=etcd,handoff cargo bench  # only these sections
//!                                   # (zookeeper: its rows beside etcd's and Redis's)
//!     LOCKRUN_BENCH_ALSO=OTHER cargo bench  # another build (say, a static
//!                                           # one) beside this one's rows
//!
//! Where a C compiler is installed, `redis_floor.c` beside this file is
//! built and measured too: the least a Redis lock wrapper pays here.
//!
//! With LOCKRUN_BENCH_AB set it runs only the A/B comparison: the same
//! measures for both builds, interleaved round by round, so a difference
//! between them is not the machine changing between two runs.
//!
//! It starts its own redis-server on a free loopback port. The job processes
//! are this very executable, re-run with a `job-*` argument, so a job's start
//! and end are stamped without a shell in between.

#[path = "../support/mod.rs"]
mod support;

mod fleet;
mod footprint;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use support::{Redis, text, wait_until};

/// The lockrun under test: this build's, or LOCKRUN_BENCH_BIN (say, a static build).
fn bin() -> String {
    std::env::var("LOCKRUN_BENCH_BIN").unwrap_or_else(|_| support::BIN.to_string())
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Job mode: `job-stamp FILE` writes the time and exits; `job-hold GO FILE`
/// waits for GO to exist, then stamps FILE and exits; `job-sleep MS` sleeps.
fn job_mode(args: &[String]) -> bool {
    match args.first().map(String::as_str) {
        Some("job-stamp") => {
            std::fs::write(&args[1], now_ns().to_string()).unwrap();
            true
        }
        Some("job-hold") => {
            while !Path::new(&args[1]).exists() {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::fs::write(&args[2], now_ns().to_string()).unwrap();
            true
        }
        Some("job-stamp-sleep") => {
            std::fs::write(&args[1], now_ns().to_string()).unwrap();
            std::thread::sleep(Duration::from_millis(args[2].parse().unwrap()));
            true
        }
        Some("job-sleep") => {
            std::thread::sleep(Duration::from_millis(args[1].parse().unwrap()));
            true
        }
        Some("job-status") => {
            footprint::job_status(&args[1..]);
            true
        }
        Some("job-forks") => {
            println!(
                "{}",
                fork_cost(args[1].parse().unwrap(), args[2].parse().unwrap())
            );
            true
        }
        _ => false,
    }
}

/// The cost of one more process, as lockrun's guard is: the median ms of
/// `rounds` forks of a process that has `rss_kib` of memory in use, each
/// child exiting at once and reaped (what the guard costs beyond the work it
/// does, which is a few system calls).
fn fork_cost(rss_kib: usize, rounds: usize) -> f64 {
    let mut memory = vec![0u8; rss_kib * 1024];
    for page in memory.chunks_mut(4096) {
        page[0] = 1;
    }
    let samples = (0..rounds)
        .map(|i| {
            let t = Instant::now();
            // SAFETY: the child only calls _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: _exit ends the child at once.
                unsafe { libc::_exit(0) };
            }
            assert!(pid > 0, "fork failed");
            // The parent goes on writing, as lockrun does: its pages are
            // copied on write while the child lives.
            let at = (i * 4096) % memory.len();
            memory[at] += 1;
            let mut status = 0;
            // SAFETY: waitpid writes the status into our local.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            ms(t.elapsed())
        })
        .collect();
    std::hint::black_box(&memory);
    stats(samples).median
}

struct Stats {
    median: f64,
    p90: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    Stats {
        median: at(0.5),
        p90: at(0.9),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Wall time of one run of a command, in ms.
fn time_once(argv: &[String]) -> f64 {
    let t = Instant::now();
    let st = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    let d = ms(t.elapsed());
    assert!(st.success(), "{argv:?} failed: {st:?}");
    d
}

/// Each command timed once per round, all of them in every round, after
/// one untimed run each (to warm caches and the script cache).
fn time_interleaved(variants: &[Vec<String>], rounds: usize) -> Vec<Stats> {
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for argv in variants {
        time_once(argv);
    }
    for _ in 0..rounds {
        for (i, argv) in variants.iter().enumerate() {
            samples[i].push(time_once(argv));
        }
    }
    samples.into_iter().map(stats).collect()
}

/// Acquisitions per second when `w` workers each run `argv` `k` times.
fn contend(argv: &[String], w: usize, k: usize) -> f64 {
    let t = Instant::now();
    let threads: Vec<_> = (0..w)
        .map(|_| {
            let argv = argv.to_vec();
            std::thread::spawn(move || {
                for _ in 0..k {
                    time_once(&argv);
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    (w * k) as f64 / t.elapsed().as_secs_f64()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

struct Bench {
    exe: String,
    redis: Redis,
    dir: tempfile::TempDir,
    quick: bool,
    stats_conn: redis::Connection,
    etcd: Option<EtcdServer>,
    /// The built `redis_floor.c`, when a C compiler is installed.
    floor: Option<String>,
    /// LOCKRUN_BENCH_ALSO: another lockrun build measured beside this one.
    also: Option<String>,
    postgres: Option<support::Postgres>,
    mariadb: Option<support::Mariadb>,
    results: serde_json::Map<String, Value>,
}

/// An etcd of our own, when etcd and etcdctl are installed.
struct EtcdServer {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_etcd(dir: &Path) -> Option<EtcdServer> {
    Command::new("etcdctl").arg("version").output().ok()?;
    let (client, peer) = (support::free_port(), support::free_port());
    let endpoint = format!("http://127.0.0.1:{client}");
    let child = Command::new("etcd")
        .args(["--data-dir", &dir.join("etcd").display().to_string()])
        .args([
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let e = EtcdServer { child, endpoint };
    let ok = wait_until(Duration::from_secs(10), || {
        Command::new("etcdctl")
            .args(["--endpoints", &e.endpoint, "endpoint", "health"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    ok.then_some(e)
}

impl Bench {
    /// `LOCKRUN -q --url URL NAME -- JOB`, for any build of lockrun.
    fn lockrun_on(&self, lockrun: &str, url: &str, name: &str, job: &[String]) -> Vec<String> {
        let mut v = s(&[lockrun, "-q", "--url", url, name, "--"]);
        v.extend_from_slice(job);
        v
    }
    fn local_url(&self) -> String {
        format!("file://{}", self.dir.path().join("locks").display())
    }
    fn lockrun_redis(&self, name: &str, job: &[String]) -> Vec<String> {
        self.lockrun_on(&bin(), &self.redis.url(), name, job)
    }
    fn lockrun_local(&self, name: &str, job: &[String]) -> Vec<String> {
        self.lockrun_on(&bin(), &self.local_url(), name, job)
    }
    fn flock(&self, name: &str, job: &[String]) -> Vec<String> {
        let mut v = s(&["flock", &self.dir.path().join(name).display().to_string()]);
        v.extend_from_slice(job);
        v
    }
    fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }

    fn record(&mut self, key: &str, v: Value) {
        self.results.insert(key.to_string(), v);
    }

    fn uncontended_rounds(&self) -> usize {
        if self.quick { 30 } else { 200 }
    }

    /// Uncontended `TOOL NAME true`, interleaved.
    fn uncontended(&mut self) {
        let rounds = self.uncontended_rounds();
        let t = s(&["/bin/true"]);
        let mut variants: Vec<(&str, Vec<String>)> = vec![
            ("true", t.clone()),
            ("flock", self.flock("u", &t)),
            ("lockrun-redis", self.lockrun_redis("u", &t)),
            ("lockrun-local", self.lockrun_local("u", &t)),
        ];
        if let Some(f) = &self.floor {
            let mut v = s(&[f, &self.redis.port.to_string(), "floor-u"]);
            v.extend(t.clone());
            variants.push(("c-redis-floor", v));
        }
        if let Some(other) = &self.also {
            let (redis, local) = (self.redis.url(), self.local_url());
            variants.push(("also-redis", self.lockrun_on(other, &redis, "au", &t)));
            variants.push(("also-local", self.lockrun_on(other, &local, "au", &t)));
        }
        if let Some(e) = &self.etcd {
            let mut v = s(&["etcdctl", "--endpoints", &e.endpoint, "lock", "u"]);
            v.extend(t.clone());
            variants.push(("etcdctl", v));
        }
        let argvs: Vec<Vec<String>> = variants.iter().map(|(_, a)| a.clone()).collect();
        let all = time_interleaved(&argvs, rounds);
        println!("\nUncontended `TOOL NAME true`, {rounds} interleaved rounds (ms)");
        println!("{:<16} {:>8} {:>8}", "tool", "median", "p90");
        let mut out = serde_json::Map::new();
        let mut medians = std::collections::HashMap::new();
        for ((name, _), st) in variants.iter().zip(&all) {
            println!("{name:<16} {:>8.3} {:>8.3}", st.median, st.p90);
            medians.insert(*name, st.median);
            out.insert(
                name.to_string(),
                json!({"median_ms": st.median, "p90_ms": st.p90}),
            );
        }
        for (tool, target) in [
            ("lockrun-redis", 1.3),
            ("lockrun-local", 1.1),
            ("c-redis-floor", 1.3),
            ("also-redis", 1.3),
            ("also-local", 1.1),
        ] {
            let Some(m) = medians.get(tool) else { continue };
            let r = m / medians["flock"];
            println!("{tool}/flock: {r:.2}x (target ≤ {target:.2}x)");
            out.insert(format!("{tool}_over_flock"), json!(r));
        }
        self.record("uncontended", Value::Object(out));
    }

    /// (workers, acquisitions each, repetitions) of the contention run.
    fn contention_size(&self) -> (usize, usize, usize) {
        if self.quick { (4, 10, 1) } else { (8, 25, 3) }
    }

    /// W workers × K acquisitions of one name around a short section.
    fn contention(&mut self) {
        let (w, k, reps) = self.contention_size();
        let section = vec![self.exe.clone(), "job-sleep".into(), "5".into()];
        let mut out = serde_json::Map::new();
        let mut rates = std::collections::HashMap::new();
        for rep in 0..reps {
            for tool in ["flock", "lockrun-redis", "lockrun-local"] {
                let argv = match tool {
                    "flock" => self.flock("c", &section),
                    "lockrun-redis" => self.lockrun_redis("c", &section),
                    _ => self.lockrun_local("c", &section),
                };
                let rate = contend(&argv, w, k);
                rates.entry(tool).or_insert_with(Vec::new).push(rate);
                let _ = rep;
            }
        }
        println!(
            "\nContention: {w} workers × {k} acquisitions around a 5 ms section (acquisitions/s, median of {reps})"
        );
        let mut med = std::collections::HashMap::new();
        for tool in ["flock", "lockrun-redis", "lockrun-local"] {
            let st = stats(rates[tool].clone());
            println!("{tool:<16} {:>8.1}", st.median);
            med.insert(tool, st.median);
            out.insert(tool.to_string(), json!({"per_second": st.median}));
        }
        for tool in ["lockrun-redis", "lockrun-local"] {
            let r = med[tool] / med["flock"];
            println!("{tool}/flock: {r:.2}x (target ≥ 0.90x)");
            out.insert(format!("{tool}_over_flock"), json!(r));
        }
        self.record("contention", Value::Object(out));
    }

    /// A lock tool's command line with extra options before the name.
    fn argv_with(&self, tool: &str, opts: &[&str], name: &str, job: &[String]) -> Vec<String> {
        let mut v = match tool {
            "flock" => {
                let mut v = s(&["flock"]);
                v.extend(s(opts));
                v.push(self.dir.path().join(name).display().to_string());
                v
            }
            _ => {
                let url = if tool.ends_with("-redis") {
                    self.redis.url()
                } else {
                    self.local_url()
                };
                let build = match (tool.starts_with("also-"), &self.also) {
                    (true, Some(other)) => other.clone(),
                    _ => bin(),
                };
                let mut v = s(&[&build, "-q", "--url", &url]);
                v.extend(s(opts));
                v.push(name.to_string());
                v.push("--".to_string());
                v
            }
        };
        v.extend_from_slice(job);
        v
    }

    /// Waiters queued one after another behind holds longer than the ttl:
    /// how many are served in arrival order, and how long the longest wait
    /// is against (number ahead × hold).
    fn fairness(&mut self) {
        let (waiters, hold_ms) = if self.quick { (10, 1100) } else { (50, 1100) };
        println!(
            "\nFairness: {waiters} waiters arriving 20 ms apart, each holding {hold_ms} ms (ttl 1 s)"
        );
        println!(
            "{:<16} {:>10} {:>22}",
            "tool", "in order", "longest wait / ahead×hold"
        );
        let mut out = serde_json::Map::new();
        for tool in ["flock", "lockrun-redis", "lockrun-local"] {
            let opts: &[&str] = if tool == "flock" {
                &[]
            } else {
                &["--ttl", "1s"]
            };
            let name = format!("fair-{tool}");
            let job = |i: usize| {
                vec![
                    self.exe.clone(),
                    "job-stamp-sleep".into(),
                    self.path(&format!("fair{i}")).display().to_string(),
                    hold_ms.to_string(),
                ]
            };
            for i in 0..=waiters {
                let _ = std::fs::remove_file(self.path(&format!("fair{i}")));
            }
            let mut kids = Vec::new();
            let mut spawned = Vec::new();
            for i in 0..=waiters {
                let a = self.argv_with(tool, opts, &name, &job(i));
                spawned.push(now_ns());
                kids.push(
                    Command::new(&a[0])
                        .args(&a[1..])
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap(),
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            for mut k in kids {
                assert!(k.wait().unwrap().success(), "{tool} failed");
            }
            let starts: Vec<u128> = (0..=waiters)
                .map(|i| {
                    std::fs::read_to_string(self.path(&format!("fair{i}")))
                        .unwrap()
                        .trim()
                        .parse()
                        .unwrap()
                })
                .collect();
            let mut order: Vec<usize> = (0..=waiters).collect();
            order.sort_by_key(|&i| starts[i]);
            let in_order = order.iter().enumerate().filter(|(k, i)| k == *i).count();
            // Waiter i has i jobs ahead of it (the first holder included).
            let worst = (1..=waiters)
                .map(|i| {
                    let waited = (starts[i] - spawned[i]) as f64 / 1e6;
                    waited / (i as f64 * hold_ms as f64)
                })
                .fold(0.0, f64::max);
            let pct = 100.0 * in_order as f64 / (waiters + 1) as f64;
            println!("{tool:<16} {pct:>9.0}% {worst:>22.3}");
            out.insert(
                tool.to_string(),
                json!({"in_order_pct": pct, "longest_wait_over_ahead_times_hold": worst}),
            );
        }
        self.record("fairness", Value::Object(out));
    }

    /// Jobs per second when M jobs of 100 ms ask at once: `--limit N` for
    /// N = 1, 4, 16, and shared holders next to `flock -s`.
    fn throughput(&mut self) {
        let jobs = if self.quick { 16 } else { 32 };
        let sleep = s(&[&self.exe, "job-sleep", "100"]);
        println!("\nThroughput: {jobs} jobs of 100 ms asking at once (jobs/s; ideal in brackets)");
        let mut out = serde_json::Map::new();
        let mut run = |label: String, argvs: Vec<Vec<String>>, ideal: f64| {
            let t = Instant::now();
            let kids: Vec<_> = argvs
                .iter()
                .map(|a| {
                    Command::new(&a[0])
                        .args(&a[1..])
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect();
            for mut k in kids {
                assert!(k.wait().unwrap().success(), "{label} failed");
            }
            let rate = jobs as f64 / t.elapsed().as_secs_f64();
            println!("{label:<34} {rate:>7.1} ({ideal:.0})");
            out.insert(label, json!({"jobs_per_s": rate, "ideal": ideal}));
        };
        for tool in ["lockrun-redis", "lockrun-local"] {
            for n in [1usize, 4, 16] {
                let ns = n.to_string();
                let argvs = (0..jobs)
                    .map(|_| self.argv_with(tool, &["--limit", &ns], &format!("tp{n}"), &sleep))
                    .collect();
                let ideal = jobs as f64 / ((jobs as f64 / n as f64).ceil() * 0.1);
                run(format!("{tool} --limit {n}"), argvs, ideal);
            }
        }
        let ideal = jobs as f64 / 0.1;
        for tool in ["flock", "lockrun-redis", "lockrun-local"] {
            let argvs = (0..jobs)
                .map(|_| self.argv_with(tool, &["-s"], "tps", &sleep))
                .collect();
            run(format!("{tool} -s"), argvs, ideal);
        }
        self.record("throughput", Value::Object(out));
    }

    /// One hand-off: holder's job ends → waiter's job starts, in ms.
    /// `argv` is the lock tool's command line (one name) around a job.
    fn handoff_once(&self, argv: impl Fn(&[String]) -> Vec<String>, waiters: usize) -> f64 {
        let go = self.path("go");
        let end = self.path("end");
        let _ = std::fs::remove_file(&go);
        let _ = std::fs::remove_file(&end);
        let hold_job = vec![
            self.exe.clone(),
            "job-hold".into(),
            go.display().to_string(),
            end.display().to_string(),
        ];
        let ha = argv(&hold_job);
        let mut holder = Command::new(&ha[0])
            .args(&ha[1..])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // The holder holds once its job runs: wait for its lease.
        std::thread::sleep(Duration::from_millis(30));
        let mut kids = Vec::new();
        let starts: Vec<PathBuf> = (0..waiters)
            .map(|i| self.path(&format!("start{i}")))
            .collect();
        for st in &starts {
            let _ = std::fs::remove_file(st);
            let wa = argv(&[
                self.exe.clone(),
                "job-stamp".into(),
                st.display().to_string(),
            ]);
            kids.push(
                Command::new(&wa[0])
                    .args(&wa[1..])
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        // Let every waiter block before the holder ends.
        std::thread::sleep(Duration::from_millis(if waiters > 10 { 1500 } else { 150 }));
        std::fs::write(&go, "").unwrap();
        holder.wait().unwrap();
        let first_start = loop {
            let first = starts
                .iter()
                .filter_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u128>().ok())
                .min();
            if let Some(f) = first {
                break f;
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        for mut k in kids {
            k.wait().unwrap();
        }
        let end_ns: u128 = std::fs::read_to_string(&end)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        (first_start as f64 - end_ns as f64) / 1e6
    }

    fn handoff_rounds(&self) -> usize {
        if self.quick { 10 } else { 40 }
    }

    fn handoff(&mut self) {
        let rounds = self.handoff_rounds();
        let mut tools = vec!["flock", "lockrun-redis", "lockrun-local"];
        if self.also.is_some() {
            tools.extend(["also-redis", "also-local"]);
        }
        let mut samples: std::collections::HashMap<&str, Vec<f64>> = Default::default();
        for _ in 0..rounds {
            for &tool in &tools {
                let v = self.handoff_once(|j| self.argv_with(tool, &[], "h", j), 1);
                samples.entry(tool).or_default().push(v);
            }
        }
        println!(
            "\nHand-off: holder's job ends → waiter's job starts, {rounds} interleaved rounds (ms)"
        );
        println!("{:<16} {:>8} {:>8}", "tool", "median", "p90");
        let mut out = serde_json::Map::new();
        let mut med = std::collections::HashMap::new();
        for &tool in &tools {
            let st = stats(samples[tool].clone());
            println!("{tool:<16} {:>8.3} {:>8.3}", st.median, st.p90);
            med.insert(tool, st.median);
            out.insert(
                tool.to_string(),
                json!({"median_ms": st.median, "p90_ms": st.p90}),
            );
        }
        for &tool in &tools[1..] {
            println!(
                "{tool}/flock: {:.2}x (target ≤ 1.20x)",
                med[tool] / med["flock"]
            );
            out.insert(
                format!("{tool}_over_flock"),
                json!(med[tool] / med["flock"]),
            );
        }
        self.record("handoff", Value::Object(out));
    }

    /// lockrun on etcd next to `etcdctl lock` on the same etcd, interleaved:
    /// uncontended runs, hand-offs and contention (target: lockrun's times
    /// at most a third of etcdctl's).
    fn etcd(&mut self) {
        let Some(e) = &self.etcd else { return };
        let endpoint = e.endpoint.clone();
        let url = format!("etcd://{}", endpoint.trim_start_matches("http://"));
        let lockrun = |name: &str, job: &[String]| self.lockrun_on(&bin(), &url, name, job);
        let etcdctl = |name: &str, job: &[String]| {
            let mut v = s(&["etcdctl", "--endpoints", &endpoint, "lock", name]);
            v.extend_from_slice(job);
            v
        };
        let rounds = self.handoff_rounds();
        let t = s(&["/bin/true"]);
        let unc = time_interleaved(&[lockrun("eu", &t), etcdctl("eu", &t)], rounds);
        let (mut hand_lockrun, mut hand_etcdctl) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            hand_lockrun.push(self.handoff_once(|j| lockrun("eh", j), 1));
            hand_etcdctl.push(self.handoff_once(|j| etcdctl("eh", j), 1));
        }
        let (w, k, _) = self.contention_size();
        let section = vec![self.exe.clone(), "job-sleep".into(), "5".into()];
        let cont = [
            contend(&lockrun("ec", &section), w, k),
            contend(&etcdctl("ec", &section), w, k),
        ];
        let hand = [stats(hand_lockrun), stats(hand_etcdctl)];
        println!("\netcd: lockrun next to etcdctl lock, {rounds} interleaved rounds");
        println!(
            "{:<14} {:>18} {:>18} {:>14}",
            "tool", "uncontended ms", "hand-off ms", "contention/s"
        );
        let mut out = serde_json::Map::new();
        for (i, tool) in ["lockrun-etcd", "etcdctl"].iter().enumerate() {
            println!(
                "{tool:<14} {:>8.3} ({:>7.3}) {:>8.3} ({:>7.3}) {:>14.1}",
                unc[i].median, unc[i].p90, hand[i].median, hand[i].p90, cont[i]
            );
            out.insert(
                tool.to_string(),
                json!({
                    "uncontended_median_ms": unc[i].median, "uncontended_p90_ms": unc[i].p90,
                    "handoff_median_ms": hand[i].median, "handoff_p90_ms": hand[i].p90,
                    "contention_per_second": cont[i],
                }),
            );
        }
        let (u, h) = (
            unc[0].median / unc[1].median,
            hand[0].median / hand[1].median,
        );
        println!("lockrun-etcd/etcdctl: uncontended {u:.2}x, hand-off {h:.2}x (target ≤ 0.33x)");
        out.insert("uncontended_over_etcdctl".into(), json!(u));
        out.insert("handoff_over_etcdctl".into(), json!(h));
        self.record("etcd", Value::Object(out));
    }

    /// lockrun on PostgreSQL next to lockrun on Redis, interleaved:
    /// uncontended runs, hand-offs and contention (a lease row and its
    /// transaction against one script call).
    fn postgres(&mut self) {
        let Some(pg) = &self.postgres else { return };
        let pg_url = pg.url();
        let redis_url = self.redis.url();
        let on = |url: &str, name: &str, job: &[String]| self.lockrun_on(&bin(), url, name, job);
        let rounds = self.handoff_rounds();
        let t = s(&["/bin/true"]);
        let unc = time_interleaved(&[on(&pg_url, "pu", &t), on(&redis_url, "pu", &t)], rounds);
        let (mut hand_pg, mut hand_redis) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            hand_pg.push(self.handoff_once(|j| on(&pg_url, "ph", j), 1));
            hand_redis.push(self.handoff_once(|j| on(&redis_url, "ph", j), 1));
        }
        let (w, k, _) = self.contention_size();
        let section = vec![self.exe.clone(), "job-sleep".into(), "5".into()];
        let cont = [
            contend(&on(&pg_url, "pc", &section), w, k),
            contend(&on(&redis_url, "pc", &section), w, k),
        ];
        let hand = [stats(hand_pg), stats(hand_redis)];
        println!(
            "\nPostgreSQL: lockrun on PostgreSQL next to lockrun on Redis, {rounds} interleaved rounds"
        );
        println!(
            "{:<16} {:>18} {:>18} {:>14}",
            "engine", "uncontended ms", "hand-off ms", "contention/s"
        );
        let mut out = serde_json::Map::new();
        for (i, engine) in ["lockrun-postgres", "lockrun-redis"].iter().enumerate() {
            println!(
                "{engine:<16} {:>8.3} ({:>7.3}) {:>8.3} ({:>7.3}) {:>14.1}",
                unc[i].median, unc[i].p90, hand[i].median, hand[i].p90, cont[i]
            );
            out.insert(
                engine.to_string(),
                json!({
                    "uncontended_median_ms": unc[i].median, "uncontended_p90_ms": unc[i].p90,
                    "handoff_median_ms": hand[i].median, "handoff_p90_ms": hand[i].p90,
                    "contention_per_second": cont[i],
                }),
            );
        }
        let (u, h) = (
            unc[0].median / unc[1].median,
            hand[0].median / hand[1].median,
        );
        println!("lockrun-postgres/lockrun-redis: uncontended {u:.2}x, hand-off {h:.2}x");
        out.insert("uncontended_over_redis".into(), json!(u));
        out.insert("handoff_over_redis".into(), json!(h));
        self.record("postgres", Value::Object(out));
    }

    /// lockrun on MariaDB next to lockrun on PostgreSQL and on Redis,
    /// interleaved: uncontended runs, hand-offs and contention (target: within
    /// 1.2x of PostgreSQL on every row).
    fn mariadb(&mut self) {
        let Some(my) = &self.mariadb else { return };
        let urls = [
            Some(my.url()),
            self.postgres.as_ref().map(|p| p.url()),
            Some(self.redis.url()),
        ];
        let names = ["lockrun-mariadb", "lockrun-postgres", "lockrun-redis"];
        let (urls, names): (Vec<String>, Vec<&str>) = urls
            .into_iter()
            .zip(names)
            .filter_map(|(u, n)| u.map(|u| (u, n)))
            .unzip();
        let on = |url: &str, name: &str, job: &[String]| self.lockrun_on(&bin(), url, name, job);
        let rounds = self.handoff_rounds();
        let t = s(&["/bin/true"]);
        let runs: Vec<_> = urls.iter().map(|u| on(u, "mu", &t)).collect();
        let unc = time_interleaved(&runs, rounds);
        let mut hand: Vec<Vec<f64>> = vec![Vec::new(); urls.len()];
        for _ in 0..rounds {
            for (i, u) in urls.iter().enumerate() {
                hand[i].push(self.handoff_once(|j| on(u, "mh", j), 1));
            }
        }
        let (w, k, _) = self.contention_size();
        let section = vec![self.exe.clone(), "job-sleep".into(), "5".into()];
        let cont: Vec<f64> = urls
            .iter()
            .map(|u| contend(&on(u, "mc", &section), w, k))
            .collect();
        let hand: Vec<_> = hand.into_iter().map(stats).collect();
        println!(
            "\nMariaDB: lockrun on MariaDB next to PostgreSQL and Redis, {rounds} interleaved rounds"
        );
        println!(
            "{:<16} {:>18} {:>18} {:>14}",
            "engine", "uncontended ms", "hand-off ms", "contention/s"
        );
        let mut out = serde_json::Map::new();
        for (i, engine) in names.iter().enumerate() {
            println!(
                "{engine:<16} {:>8.3} ({:>7.3}) {:>8.3} ({:>7.3}) {:>14.1}",
                unc[i].median, unc[i].p90, hand[i].median, hand[i].p90, cont[i]
            );
            out.insert(
                engine.to_string(),
                json!({
                    "uncontended_median_ms": unc[i].median, "uncontended_p90_ms": unc[i].p90,
                    "handoff_median_ms": hand[i].median, "handoff_p90_ms": hand[i].p90,
                    "contention_per_second": cont[i],
                }),
            );
        }
        if names.get(1) == Some(&"lockrun-postgres") {
            let (u, h, c) = (
                unc[0].median / unc[1].median,
                hand[0].median / hand[1].median,
                cont[1] / cont[0],
            );
            println!(
                "lockrun-mariadb/lockrun-postgres: uncontended {u:.2}x, hand-off {h:.2}x, \
                 time per contended acquisition {c:.2}x (target ≤ 1.2x each)"
            );
            out.insert("uncontended_over_postgres".into(), json!(u));
            out.insert("handoff_over_postgres".into(), json!(h));
            out.insert("contention_slowdown_over_postgres".into(), json!(c));
        }
        self.record("mariadb", Value::Object(out));
    }

    /// lockrun on ZooKeeper next to lockrun on etcd (when installed) and on
    /// Redis, interleaved: uncontended runs, hand-offs and contention
    /// (ZooKeeper ships no lock command to compare with). Target: the
    /// uncontended run within 1.5x of etcd's.
    fn zookeeper(&mut self) {
        if !Path::new("/usr/share/java/zookeeper.jar").exists() {
            println!("\n(ZooKeeper not installed: its rows are not measured)");
            return;
        }
        let zk = support::Zookeeper::start();
        let mut engines = vec![("lockrun-zookeeper", zk.url())];
        if let Some(e) = &self.etcd {
            let url = format!("etcd://{}", e.endpoint.trim_start_matches("http://"));
            engines.push(("lockrun-etcd", url));
        }
        engines.push(("lockrun-redis", self.redis.url()));
        let on = |url: &str, name: &str, job: &[String]| self.lockrun_on(&bin(), url, name, job);
        let rounds = self.handoff_rounds();
        let t = s(&["/bin/true"]);
        let variants: Vec<Vec<String>> = engines.iter().map(|(_, u)| on(u, "zu", &t)).collect();
        let unc = time_interleaved(&variants, rounds);
        let mut hand: Vec<Vec<f64>> = vec![Vec::new(); engines.len()];
        for _ in 0..rounds {
            for (i, (_, u)) in engines.iter().enumerate() {
                hand[i].push(self.handoff_once(|j| on(u, "zh", j), 1));
            }
        }
        let hand: Vec<Stats> = hand.into_iter().map(stats).collect();
        let (w, k, _) = self.contention_size();
        let section = vec![self.exe.clone(), "job-sleep".into(), "5".into()];
        let cont: Vec<f64> = engines
            .iter()
            .map(|(_, u)| contend(&on(u, "zc", &section), w, k))
            .collect();
        println!(
            "\nZooKeeper: lockrun on ZooKeeper next to etcd and Redis, {rounds} interleaved rounds"
        );
        println!(
            "{:<18} {:>18} {:>18} {:>14}",
            "engine", "uncontended ms", "hand-off ms", "contention/s"
        );
        let mut out = serde_json::Map::new();
        for (i, (engine, _)) in engines.iter().enumerate() {
            println!(
                "{engine:<18} {:>8.3} ({:>7.3}) {:>8.3} ({:>7.3}) {:>14.1}",
                unc[i].median, unc[i].p90, hand[i].median, hand[i].p90, cont[i]
            );
            out.insert(
                engine.to_string(),
                json!({
                    "uncontended_median_ms": unc[i].median, "uncontended_p90_ms": unc[i].p90,
                    "handoff_median_ms": hand[i].median, "handoff_p90_ms": hand[i].p90,
                    "contention_per_second": cont[i],
                }),
            );
        }
        if engines[1].0 == "lockrun-etcd" {
            let (u, h) = (
                unc[0].median / unc[1].median,
                hand[0].median / hand[1].median,
            );
            println!(
                "lockrun-zookeeper/lockrun-etcd: uncontended {u:.2}x (target ≤ 1.50x), hand-off {h:.2}x"
            );
            out.insert("uncontended_over_etcd".into(), json!(u));
            out.insert("handoff_over_etcd".into(), json!(h));
        }
        self.record("zookeeper", Value::Object(out));
    }

    /// This lockrun (A) against `other` (B): uncontended runs, hand-offs and
    /// contention on both engines, the two builds taking turns within every
    /// round, with the rounds and sizes of the usual measures.
    fn ab(&mut self, other: &str) {
        let builds = [bin(), other.to_string()];
        let engines = [("local", self.local_url()), ("redis", self.redis.url())];
        // Each build has names of its own, so neither meets the other's
        // leftovers (an older build may keep its state differently).
        let name = |what: &str, b: usize| format!("ab{what}-{}", ["a", "b"][b]);
        // (measure, A, B), in the order printed.
        let mut rows: Vec<(String, f64, f64)> = Vec::new();

        let rounds = self.uncontended_rounds();
        let t = s(&["/bin/true"]);
        let variants: Vec<Vec<String>> = engines
            .iter()
            .flat_map(|(_, url)| {
                (0..2).map(|b| self.lockrun_on(&builds[b], url, &name("u", b), &t))
            })
            .collect();
        let all = time_interleaved(&variants, rounds);
        for (e, (engine, _)) in engines.iter().enumerate() {
            let (a, b) = (&all[2 * e], &all[2 * e + 1]);
            rows.push((
                format!("uncontended_{engine}_median_ms"),
                a.median,
                b.median,
            ));
            rows.push((format!("uncontended_{engine}_p90_ms"), a.p90, b.p90));
        }

        let hand_rounds = self.handoff_rounds();
        let mut samples = vec![Vec::new(); 4];
        for _ in 0..hand_rounds {
            for (e, (_, url)) in engines.iter().enumerate() {
                for (b, lockrun) in builds.iter().enumerate() {
                    let n = name("h", b);
                    let v = self.handoff_once(|j| self.lockrun_on(lockrun, url, &n, j), 1);
                    samples[2 * e + b].push(v);
                }
            }
        }
        let hand: Vec<Stats> = samples.into_iter().map(stats).collect();
        for (e, (engine, _)) in engines.iter().enumerate() {
            let (a, b) = (&hand[2 * e], &hand[2 * e + 1]);
            rows.push((format!("handoff_{engine}_median_ms"), a.median, b.median));
            rows.push((format!("handoff_{engine}_p90_ms"), a.p90, b.p90));
        }

        let (w, k, reps) = self.contention_size();
        let section = vec![self.exe.clone(), "job-sleep".into(), "5".into()];
        let mut rates = vec![Vec::new(); 4];
        for _ in 0..reps {
            for (e, (_, url)) in engines.iter().enumerate() {
                for (b, lockrun) in builds.iter().enumerate() {
                    let argv = self.lockrun_on(lockrun, url, &name("c", b), &section);
                    rates[2 * e + b].push(contend(&argv, w, k));
                }
            }
        }
        let rate: Vec<f64> = rates.into_iter().map(|r| stats(r).median).collect();
        for (e, (engine, _)) in engines.iter().enumerate() {
            rows.push((
                format!("contention_{engine}_per_second"),
                rate[2 * e],
                rate[2 * e + 1],
            ));
        }

        println!("\nA/B, the two builds taking turns within every round");
        println!("A = {}", builds[0]);
        println!("B = {}", builds[1]);
        println!(
            "uncontended: {rounds} rounds; hand-off: {hand_rounds} rounds; \
             contention: {w} workers × {k} around 5 ms, median of {reps}"
        );
        println!("(B/A above 1: B is slower in ms, faster per second)");
        println!("{:<32} {:>9} {:>9} {:>7}", "measure", "A", "B", "B/A");
        let mut out = serde_json::Map::new();
        out.insert("a".into(), json!(builds[0]));
        out.insert("b".into(), json!(builds[1]));
        for (measure, a, b) in rows {
            println!("{measure:<32} {a:>9.3} {b:>9.3} {:>6.2}x", b / a);
            out.insert(measure, json!({"a": a, "b": b, "b_over_a": b / a}));
        }
        self.record("ab", Value::Object(out));
    }

    /// Commands the server has run so far. One connection, kept open, so
    /// the only extra command counted between two readings is one INFO.
    fn total_commands(&mut self) -> u64 {
        self.commands().0
    }

    /// (all commands, commands sent by clients) run so far. INFO counts the
    /// commands that scripts run too; the client-sent ones are EVALSHA,
    /// SCRIPT, BLPOP and INFO itself. One connection, kept open, so the only
    /// extra command between two readings is one INFO.
    fn commands(&mut self) -> (u64, u64) {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.stats_conn)
            .unwrap();
        let mut all = 0;
        let mut sent = 0;
        for line in info.lines() {
            let Some(calls) = line
                .split("calls=")
                .nth(1)
                .and_then(|c| c.split(',').next()?.parse::<u64>().ok())
            else {
                continue;
            };
            all += calls;
            if [
                "cmdstat_evalsha:",
                "cmdstat_script",
                "cmdstat_blpop:",
                "cmdstat_info:",
            ]
            .iter()
            .any(|p| line.starts_with(p))
            {
                sent += calls;
            }
        }
        (all, sent)
    }

    /// Redis commands per second per waiter while N waiters block on a held
    /// lock at the default ttl, and the hand-off with 100 waiters.
    fn waiting_load(&mut self) {
        let window = Duration::from_secs(if self.quick { 5 } else { 20 });
        let mut out = serde_json::Map::new();
        println!(
            "\nWaiting load at the default ttl (30 s), over {window:?}; the holder's own renewals (0 waiters) are subtracted"
        );
        let mut baseline = (0.0, 0.0);
        for n in [0usize, 1, 10, 100] {
            let go = self.path("wgo");
            let _ = std::fs::remove_file(&go);
            let holder_job = vec![
                self.exe.clone(),
                "job-hold".into(),
                go.display().to_string(),
                self.path("wend").display().to_string(),
            ];
            let ha = self.lockrun_redis("w", &holder_job);
            let mut holder = Command::new(&ha[0]).args(&ha[1..]).spawn().unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let wa = self.lockrun_redis("w", &s(&["/bin/true"]));
            let mut kids: Vec<_> = (0..n)
                .map(|_| Command::new(&wa[0]).args(&wa[1..]).spawn().unwrap())
                .collect();
            std::thread::sleep(Duration::from_secs(2));
            let before = self.commands();
            std::thread::sleep(window);
            let after = self.commands();
            // One INFO between the readings.
            let all = (after.0 - before.0 - 1) as f64 / window.as_secs_f64();
            let sent = (after.1 - before.1 - 1) as f64 / window.as_secs_f64();
            if n == 0 {
                baseline = (all, sent);
                println!("holder alone: {all:.3} commands/s ({sent:.3} sent by lockrun)");
            } else {
                let per_all = (all - baseline.0) / n as f64;
                let per_sent = (sent - baseline.1) / n as f64;
                println!(
                    "{n:>4} waiters: {per_all:.3} commands/s per waiter, {per_sent:.3} sent by lockrun (target < 1, flat)"
                );
                out.insert(
                    format!("waiters_{n}"),
                    json!({"per_waiter_per_second": per_all, "sent_per_waiter_per_second": per_sent}),
                );
            }
            std::fs::write(&go, "").unwrap();
            holder.wait().unwrap();
            for k in kids.iter_mut() {
                k.wait().unwrap();
            }
        }
        let rounds = if self.quick { 3 } else { 7 };
        let one: Vec<f64> = (0..rounds)
            .map(|_| self.handoff_once(|j| self.lockrun_redis("hw", j), 1))
            .collect();
        let hundred: Vec<f64> = (0..rounds)
            .map(|_| self.handoff_once(|j| self.lockrun_redis("hw", j), 100))
            .collect();
        let (a, b) = (stats(one).median, stats(hundred).median);
        println!(
            "hand-off with 1 waiter {a:.3} ms, with 100 waiters {b:.3} ms: {:.2}x (target ≤ 2x)",
            b / a
        );
        out.insert("handoff_1_ms".into(), json!(a));
        out.insert("handoff_100_ms".into(), json!(b));
        self.record("waiting", Value::Object(out));
    }

    /// Redis commands per minute while one lease is held at the default ttl.
    fn holding_cost(&mut self) {
        let window = Duration::from_secs(if self.quick { 11 } else { 60 });
        let go = self.path("hgo");
        let _ = std::fs::remove_file(&go);
        let job = vec![
            self.exe.clone(),
            "job-hold".into(),
            go.display().to_string(),
            self.path("hend").display().to_string(),
        ];
        let ha = self.lockrun_redis("hold", &job);
        let mut holder = Command::new(&ha[0]).args(&ha[1..]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let before = self.total_commands();
        std::thread::sleep(window);
        let used = self.total_commands() - before - 1;
        std::fs::write(&go, "").unwrap();
        holder.wait().unwrap();
        let per_min = used as f64 * 60.0 / window.as_secs_f64();
        println!(
            "\nHolding one lease at the default ttl: {used} commands in {window:?} = {per_min:.1} per minute"
        );
        self.record("holding", json!({"commands_per_minute": per_min}));
    }
}

/// `redis_floor.c` built into `dir`, if a C compiler is installed.
fn build_floor(dir: &Path) -> Option<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bench/redis_floor.c");
    let out = dir.join("redis_floor");
    let built = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    if !built {
        println!("(no C compiler: the Redis floor is not measured)");
    }
    built.then(|| out.display().to_string())
}

/// One part of the benchmark, run by name.
type Section = fn(&mut Bench);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if job_mode(&args) {
        return;
    }
    if Command::new("flock").arg("--version").output().is_err() {
        panic!(
            "flock not found: the benchmark compares against it (apt-get install -y util-linux)"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("locks")).unwrap();
    let quick = std::env::var_os("LOCKRUN_BENCH_QUICK").is_some_and(|v| !v.is_empty());
    let ab = std::env::var("LOCKRUN_BENCH_AB")
        .ok()
        .filter(|v| !v.is_empty());
    if let Some(other) = &ab {
        assert!(
            Path::new(other).is_file(),
            "LOCKRUN_BENCH_AB={other}: no such file (it names the other lockrun binary)"
        );
    }
    // The A/B comparison has no etcdctl in it: no etcd to wait for.
    let etcd = if ab.is_none() {
        start_etcd(dir.path())
    } else {
        None
    };
    // PostgreSQL when its server programs and the postgres user are there.
    let postgres = (ab.is_none() && support::postgres_installed()).then(support::Postgres::start);
    // MariaDB when its programs are there.
    let mariadb = (ab.is_none() && support::mariadb_installed()).then(support::Mariadb::start);
    let redis = Redis::start();
    let stats_conn = redis.conn();
    let floor = build_floor(dir.path());
    let also = std::env::var("LOCKRUN_BENCH_ALSO")
        .ok()
        .filter(|v| !v.is_empty());
    if let Some(other) = &also {
        assert!(
            Path::new(other).is_file(),
            "LOCKRUN_BENCH_ALSO={other}: no such file (it names another lockrun binary)"
        );
    }
    let mut b = Bench {
        exe: std::env::current_exe().unwrap().display().to_string(),
        stats_conn,
        redis,
        dir,
        quick,
        etcd,
        floor,
        also,
        postgres,
        mariadb,
        results: serde_json::Map::new(),
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    println!(
        "lockrun benchmark on {cpu} ({cores} cores){}",
        if quick { ", quick mode" } else { "" }
    );
    if b.etcd.is_none() && ab.is_none() {
        println!("(etcd/etcdctl not installed: etcdctl lock is not measured)");
    }
    b.record(
        "machine",
        json!({"cpu": cpu, "cores": cores, "quick": quick}),
    );
    if let Some(other) = ab {
        b.ab(&other);
    } else {
        let only = std::env::var("LOCKRUN_BENCH_ONLY").unwrap_or_default();
        let sections: [(&str, Section); 13] = [
            ("uncontended", Bench::uncontended),
            ("contention", Bench::contention),
            ("handoff", Bench::handoff),
            ("waiting_load", Bench::waiting_load),
            ("holding_cost", Bench::holding_cost),
            ("footprint", Bench::footprint),
            ("fairness", Bench::fairness),
            ("throughput", Bench::throughput),
            ("etcd", Bench::etcd),
            ("postgres", Bench::postgres),
            ("mariadb", Bench::mariadb),
            ("zookeeper", Bench::zookeeper),
            ("fleet", Bench::fleet),
        ];
        let chosen: Vec<&str> = only.split(',').filter(|s| !s.is_empty()).collect();
        for c in &chosen {
            assert!(
                sections.iter().any(|(n, _)| n == c),
                "LOCKRUN_BENCH_ONLY: no section {c:?} (there are {:?})",
                sections.map(|(n, _)| n)
            );
        }
        for (name, run) in sections {
            if chosen.is_empty() || chosen.contains(&name) {
                run(&mut b);
            }
        }
    }
    let out = std::env::var("LOCKRUN_BENCH_OUT").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("target/lockrun-bench.json")
            .display()
            .to_string()
    });
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&Value::Object(b.results)).unwrap(),
    )
    .unwrap();
    println!("\nResults written to {out}");
}
