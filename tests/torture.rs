//! Safety under faults. Workers loop lockrun around a job that writes to a
//! fenced resource (from a child process of the job, so every job has a
//! grandchild of lockrun) while a chaos thread pauses lockruns, kills them
//! with SIGKILL, restarts and pauses Redis, trickles its replies through a
//! proxy, breaks leases and makes a holder's job fork thousands of processes
//! that ignore SIGTERM; some runs get a tiny descriptor limit. A checker
//! then verifies the history against the promises of lockrun-safety(7) "GUARANTEES".
//! Three worker sets share the server: exclusive holders of one name, a
//! `--limit 3` semaphore (fenced per slot), and readers and writers (`-s`
//! and exclusive) of a third name. The checker holds each to its mode: one
//! holder at a time, at most 3 at once, never a writer beside a reader.
//!
//! LOCKRUN_TORTURE_SECS sets the duration (default 30), LOCKRUN_TORTURE_SEED
//! replays a run, LOCKRUN_TORTURE_WORKERS sets the number of workers (9: three exclusive,
//! four on the semaphore, two readers and writers; the sets repeat past nine).
//! Run a long one with
//! `LOCKRUN_TORTURE_SECS=900 cargo test --release torture -- --nocapture`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::*;

const TTL_MS: u64 = 2000;

/// The job: a Perl script (Perl is part of every Debian system) that writes to
/// a fenced store a few times. The store keeps the highest token it accepted,
/// under a flock so its check and write are one step, and rejects a lower one.
const JOB: &str = r#"
use strict; use warnings;
use Fcntl qw(:flock);
use Time::HiRes qw(time sleep);
my ($dir, $writes, $name) = @ARGV;
my $t = $ENV{LOCKRUN_TOKEN};
my $w = $ENV{WORKER};
my $mode = $ENV{MODE};
my $slot = $ENV{LOCKRUN_SLOT} // '-';
# Fenced per (name, slot), as lockrun-safety(7) "GUARANTEES" says for --limit.
my $fence = "$dir/fence-$name-$slot";
sub now { sprintf("%.0f", time() * 1e6) }
sub logl {
  my ($what, $at) = @_;
  open(my $f, '>>', "$dir/events.log") or die;
  print $f "$what $t $at $w $name $mode $slot\n"; close $f;
}
open(my $p, '>', "$dir/pid-$w") or die; print $p "$$\n"; close $p;
logl("start", now());
# The writes come from a child: killing lockrun outright must kill it too.
my $child = fork() // die;
if ($child) { waitpid($child, 0); logl("end", now()); exit($? >> 8); }
open(my $g, '>', "$dir/grandchild-$w") or die; print $g "$$\n"; close $g;
# The fence's lock while this process holds it. A swarm started then must
# not keep it: a process forked with it shares the lock, and this one, its
# next write waiting for it, would never end.
my $held;
# SIGUSR1 (the chaos thread's "swarm"): thousands of processes that ignore
# SIGTERM, in groups and sessions of their own, two per group logging ticks
# until they are killed: none may tick once the next holder has started.
$SIG{USR1} = sub {
  my $n = $ENV{SWARM} // 1500;
  $SIG{TERM} = 'IGNORE';
  for my $j (1 .. 4) {
    my $p = fork() // next;
    next if $p;
    # Closing our copy leaves the lock to this job's writer (LOCK_UN
    # would take it from the writer too).
    close($held) if $held;
    if ($j % 2) { require POSIX; POSIX::setsid() } else { setpgrp(0, 0) }
    for my $k (1 .. $n / 4) {
      my $c = fork() // last;
      next if $c;
      if ($k <= 2) { while (1) { logl("tick", now()); sleep(0.01) } }
      sleep(1000) while 1;
    }
    sleep(1000) while 1;
  }
};
for (1 .. $writes) {
  if ($mode eq 's') {
    # A reader only reads: no writer may run beside it.
    logl("read", now());
    sleep(0.02 + rand(0.04));
    next;
  }
  open(my $l, '>>', "$fence.lock") or die;
  # Set before the lock is taken and cleared after it is let go: a swarm
  # starting at any point in between does not keep it.
  $held = $l;
  # A swarm's signal may come while this waits for the lock: wait on.
  until (flock($l, LOCK_EX)) { die "flock: $!" unless $!{EINTR} }
  my $last = 0;
  if (open(my $r, '<', $fence)) { $last = <$r> // 0; chomp $last; close $r; }
  $last = 0 if $last eq '';
  if ($t >= $last) {
    open(my $o, '>', $fence) or die; print $o "$t\n"; close $o;
    logl("accept", now());
  } else {
    logl("reject", now());
  }
  close $l;
  undef $held;
  sleep(0.02 + rand(0.04));
}
"#;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// xorshift64*: enough randomness for a replayable schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

#[derive(Debug, Clone)]
enum Chaos {
    /// A worker's lockrun and its job were stopped from `from` to `to` (µs).
    Pause { worker: usize, from: u64, to: u64 },
    /// The server lost the leases of a name (None: of every name) at some
    /// moment from `at` to `until`: restart, raw DEL, release --now (at once),
    /// a failover (whenever the sentinels carried it out).
    Break {
        kind: &'static str,
        name: Option<&'static str>,
        at: u64,
        until: u64,
    },
    /// Redis itself was stopped for a while; leases are not broken by it.
    RedisPause { from: u64, to: u64 },
    /// A safe revoke (release --force): must not cause any overlap.
    Revoke { at: u64 },
    /// A holder's lockrun got SIGKILL: its job must die with it, no overlap.
    Kill9 { worker: usize, at: u64 },
    /// Replies trickled in through the proxy: leases may be lost, no overlap.
    Stall { from: u64, to: u64 },
    /// A holder's job forked thousands of processes that ignore SIGTERM.
    Swarm { worker: usize, at: u64 },
}

/// The three worker sets, by worker number: the lock name and mode flags.
fn worker_set(i: usize) -> (&'static str, &'static [&'static str]) {
    match i % 9 {
        0..=2 => ("torture", &[]),
        3..=6 => ("torture-limit", &["--limit", "3"]),
        _ => ("torture-rw", &[]),
    }
}

/// How many holders of `name` may run at once, and whether two given modes
/// may run together.
fn may_share(name: &str, a_mode: &str, b_mode: &str) -> bool {
    match name {
        "torture-rw" => a_mode == "s" && b_mode == "s",
        _ => false,
    }
}

const NAMES: [&str; 3] = ["torture", "torture-limit", "torture-rw"];

#[derive(Debug, Default, Clone)]
struct Job {
    token: u64,
    worker: usize,
    name: String,
    /// `x` or `s`.
    mode: String,
    slot: String,
    start: u64,
    /// Every action of the job after its start (writes and end), in µs.
    actions: Vec<u64>,
}

struct Shared {
    dir: PathBuf,
    /// Workers reach Redis through the proxy, so replies can be made to
    /// trickle (behind Sentinel, through the sentinels: no proxy).
    url: String,
    proxy: Option<Proxy>,
    stop: AtomicBool,
    /// Per worker, the pid of its running lockrun (0 when none).
    lockrun_pid: Vec<AtomicI32>,
    violations: Mutex<Vec<String>>,
    /// The servers' own recovery that did not come in time (a replica the
    /// sentinels did not reconnect): said in the summary, not a violation
    /// of lockrun's, since the checker holds every grant to the rules.
    setup: Mutex<Vec<String>>,
    exits: Mutex<HashMap<i32, u64>>,
}

fn worker(i: usize, sh: Arc<Shared>, servers: Arc<Servers>, seed: u64) {
    let job = sh.dir.join("job.pl");
    let pidfile = sh.dir.join(format!("pid-{i}"));
    let grandfile = sh.dir.join(format!("grandchild-{i}"));
    let mut rng = Rng((seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
    while !sh.stop.load(Ordering::SeqCst) {
        let _ = std::fs::remove_file(&pidfile);
        let _ = std::fs::remove_file(&grandfile);
        // One run in ten under a descriptor limit that leaves lockrun only a
        // few descriptors: it must refuse, or stop the job in time.
        let limited = rng.below(10) == 0;
        let mut cmd = if limited {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!(
                    "ulimit -n {}; exec \"$0\" \"$@\"",
                    6 + rng.below(12)
                ))
                .arg(BIN);
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("LOCKRUN_") {
                    c.env_remove(k);
                }
            }
            c
        } else {
            lockrun()
        };
        let (name, flags) = worker_set(i);
        // Readers and writers of the third name: two runs in three read.
        let mode = if name == "torture-rw" && rng.below(3) > 0 {
            "s"
        } else {
            "x"
        };
        if mode == "s" {
            cmd.arg("-s");
        }
        // Every line lockrun has (-vv: each step and renewal) goes to the
        // worker's log; what one run wrote starts at this offset.
        let stderr_log = sh.dir.join(format!("stderr-{i}.log"));
        let offset = std::fs::metadata(&stderr_log).map_or(0, |m| m.len());
        let started = now_us();
        let mut child = cmd
            .args(flags)
            .args([
                "--url",
                &sh.url,
                "--ttl",
                &format!("{TTL_MS}ms"),
                "-vv",
                name,
                "--",
                "perl",
            ])
            .arg(&job)
            .arg(&sh.dir)
            .arg("4")
            .arg(name)
            .env("WORKER", i.to_string())
            .env("MODE", mode)
            .stdout(std::process::Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&stderr_log)
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        sh.lockrun_pid[i].store(pid, Ordering::SeqCst);
        let Some(st) = wait_within(&mut child, STUCK_AFTER) else {
            // Every wait of lockrun's is bounded by its op time or the
            // ttl: one still running is stuck. Say where, then end it.
            let what = stuck(pid, &stderr_log, offset, &sh, &servers, name);
            let _ = child.kill();
            let _ = child.wait();
            sh.lockrun_pid[i].store(0, Ordering::SeqCst);
            sh.violations.lock().unwrap().push(format!(
                "worker {i}: lockrun {pid} (-{mode} on {name}{}, started at {started}) did not \
                 finish within {STUCK_AFTER:?}\n{what}",
                if limited {
                    ", under a descriptor limit"
                } else {
                    ""
                }
            ));
            return;
        };
        sh.lockrun_pid[i].store(0, Ordering::SeqCst);
        use std::os::unix::process::ExitStatusExt;
        // -9: the chaos thread killed this lockrun outright.
        let code = st.code().unwrap_or(-st.signal().unwrap_or(0));
        *sh.exits.lock().unwrap().entry(code).or_default() += 1;
        // (d) and (e): when lockrun is gone, nothing of its job may live on
        // (after SIGKILL, its guard gets a moment to finish the job off).
        for file in [&pidfile, &grandfile] {
            if let Ok(p) = std::fs::read_to_string(file)
                && let Ok(pid) = p.trim().parse::<i32>()
                && alive(pid)
                && !wait_until(Duration::from_millis(1000), || !alive(pid))
            {
                sh.violations.lock().unwrap().push(format!(
                    "worker {i}: job process {pid} alive after lockrun exited with {code}"
                ));
            }
        }
        match code {
            0 | 76 | -9 => {}
            // Out of descriptors before (or after) the job ran.
            70 if limited => {}
            // Redis unreachable (restarting or paused) before the job started.
            69 => std::thread::sleep(Duration::from_millis(100)),
            other => sh
                .violations
                .lock()
                .unwrap()
                .push(format!("worker {i}: unexpected exit {other:?} ({st:?})")),
        }
    }
}

/// A worker, from a random one on, whose lockrun runs a job with its child:
/// (worker, lockrun's pid, the child's pid).
fn running_job(sh: &Shared, rng: &mut Rng) -> Option<(usize, i32, i32)> {
    let workers = sh.lockrun_pid.len();
    let start = rng.below(workers as u64) as usize;
    (0..workers).map(|k| (start + k) % workers).find_map(|w| {
        let lr = sh.lockrun_pid[w].load(Ordering::SeqCst);
        let g = std::fs::read_to_string(sh.dir.join(format!("grandchild-{w}"))).ok()?;
        let g = g.trim().parse::<i32>().ok()?;
        (lr > 1 && alive(lr) && alive(g)).then_some((w, lr, g))
    })
}

/// How long one lockrun may run: its job takes a fraction of a second, and
/// every wait of lockrun's is bounded by its op time, the ttl or the time
/// its place in the queue lasts, so one still running after this is stuck.
const STUCK_AFTER: Duration = Duration::from_secs(120);

/// The child's exit status, or None if it still runs after `limit`.
fn wait_within(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A file under /proc, NULs as spaces, or why it could not be read.
fn proc_text(path: impl AsRef<Path>) -> String {
    match std::fs::read(path.as_ref()) {
        Ok(b) => String::from_utf8_lossy(&b)
            .replace('\0', " ")
            .trim_end()
            .to_string(),
        Err(e) => format!("({e})"),
    }
}

/// The fields of /proc/PID/stat after the command's name: state, ppid,
/// process group, session, ...
fn stat_fields(pid: i32) -> Vec<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    s.rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// One process in a line: its state, wchan, group, session and command.
fn process_line(pid: i32) -> String {
    let f = stat_fields(pid);
    let at = |k: usize| f.get(k).map_or("?", String::as_str);
    let mut cmdline = proc_text(format!("/proc/{pid}/cmdline"));
    cmdline.truncate(160);
    format!(
        "pid {pid} ppid {} pgrp {} sid {} state {} wchan {} comm {} cmd {cmdline}",
        at(1),
        at(2),
        at(3),
        at(0),
        proc_text(format!("/proc/{pid}/wchan")),
        proc_text(format!("/proc/{pid}/comm")),
    )
}

/// Every thread of `pid`: its name, state, wchan and kernel stack.
fn threads_of(pid: i32) -> String {
    let mut out = String::new();
    let mut tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect();
    tids.sort();
    for tid in tids {
        let t = format!("/proc/{pid}/task/{tid}");
        let stat = std::fs::read_to_string(format!("{t}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        let state = state.split_whitespace().next().unwrap_or("?");
        out += &format!(
            "  thread {tid} {} state {state} wchan {}\n",
            proc_text(format!("{t}/comm")),
            proc_text(format!("{t}/wchan")),
        );
        for frame in proc_text(format!("{t}/stack")).lines() {
            out += &format!("    {frame}\n");
        }
    }
    out
}

/// Every descendant of `root`, parents before children.
fn descendants(root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some(ppid) = stat_fields(pid).get(1).and_then(|p| p.parse().ok()) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = Vec::new();
    let mut next = vec![root];
    while let Some(p) = next.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            out.push(c);
            next.push(c);
        }
    }
    out
}

/// The TCP sockets `pid` has open: local and remote address, state and
/// queues, as /proc/net/tcp says (hex).
fn sockets_of(pid: i32) -> (String, Vec<u16>) {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let l = std::fs::read_link(e.path()).ok()?;
            let l = l.to_string_lossy();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut out = String::new();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        for line in proc_text(format!("/proc/{pid}/net/{table}"))
            .lines()
            .skip(1)
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 9 && inodes.iter().any(|i| i == f[9]) {
                let port = f[1].rsplit(':').next().unwrap_or("0");
                ports.extend(u16::from_str_radix(port, 16).ok());
                out += &format!(
                    "  {table} local {} remote {} state {} queues {}\n",
                    f[1], f[2], f[3], f[4]
                );
            }
        }
    }
    (out, ports)
}

/// Userspace stacks of every thread, when gdb is there to take them.
fn backtraces(pid: i32) -> String {
    let child = Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "thread apply all bt 30"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return "(no gdb)".into();
    };
    if wait_within(&mut child, Duration::from_secs(30)).is_none() {
        let _ = child.kill();
    }
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        use std::io::Read;
        let _ = o.read_to_string(&mut out);
    }
    let _ = child.wait();
    out.lines()
        .filter(|l| l.starts_with("Thread") || l.starts_with('#'))
        .map(|l| format!("  {}\n", l.chars().take(240).collect::<String>()))
        .collect()
}

/// What a stuck lockrun was doing: what it wrote, its threads (state,
/// wchan, kernel and user stacks), its sockets, its children (the guard,
/// the job and what the job forked) and the server's view of the name.
fn stuck(pid: i32, log: &Path, offset: u64, sh: &Shared, servers: &Servers, name: &str) -> String {
    let mut out = String::new();
    let written = std::fs::read(log).unwrap_or_default();
    let written = String::from_utf8_lossy(&written[(offset as usize).min(written.len())..]);
    // The end of it, where it stopped.
    let lines: Vec<&str> = written.lines().collect();
    let from = lines.len().saturating_sub(200);
    out += &format!(
        "its stderr ({} lines, the last {}):\n",
        lines.len(),
        lines.len() - from
    );
    for l in &lines[from..] {
        out += &format!("  {l}\n");
    }
    out += &format!("lockrun: {}\n", process_line(pid));
    out += &threads_of(pid);
    let (sockets, ports) = sockets_of(pid);
    out += &format!("its TCP sockets:\n{sockets}");
    let family = descendants(pid);
    out += &format!("its descendants ({}):\n", family.len());
    for &p in family.iter().take(12) {
        out += &format!("  {}\n", process_line(p));
    }
    if family.len() > 12 {
        let mut states: HashMap<String, usize> = HashMap::new();
        for &p in &family[12..] {
            let key = format!(
                "{} {}",
                proc_text(format!("/proc/{p}/comm")),
                stat_fields(p).first().map_or("?", String::as_str)
            );
            *states.entry(key).or_default() += 1;
        }
        out += &format!("  and more, by command and state: {states:?}\n");
    }
    for &p in family.iter().take(2) {
        out += &format!("threads of {p}:\n{}", threads_of(p));
    }
    out += &format!(
        "the server's view of {name}:\n{}",
        servers.view(&sh.url, name, &ports)
    );
    // Last: attaching takes a while, and stops it for as long.
    out += &format!("its threads in userspace:\n{}", backtraces(pid));
    out
}

/// The servers the workers use: one Redis, or a master and a replica
/// behind sentinels.
enum Servers {
    One(Mutex<Redis>),
    Sentinel(Mutex<Sentinels>),
    Etcd(Mutex<Etcd>),
    Postgres(Mutex<Postgres>),
    Mariadb(Mutex<Mariadb>),
    Zk(Mutex<Ensemble>),
}

impl Servers {
    /// What the server says of `name`, for a stuck lockrun's report
    /// (`ports`: its connections' local ports). On PostgreSQL: the name's
    /// rows, lockrun's connections and the advisory locks; elsewhere
    /// `lockrun status --json`.
    fn view(&self, url: &str, name: &str, ports: &[u16]) -> String {
        let Servers::Postgres(pg) = self else {
            let child = lockrun()
                .args(["--url", url, "status", "--json", name])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn();
            let Ok(mut child) = child else {
                return "  (status did not start)\n".into();
            };
            if wait_within(&mut child, Duration::from_secs(20)).is_none() {
                let _ = child.kill();
            }
            return match child.wait_with_output() {
                Ok(o) => format!("  status: {} {}\n", text(&o.stdout), text(&o.stderr)),
                Err(e) => format!("  status: {e}\n"),
            };
        };
        let pg = pg.lock().unwrap();
        let mine = if ports.is_empty() {
            "false".to_string()
        } else {
            format!(
                "client_port IN ({})",
                ports
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            )
        };
        let queries = [
            (
                "leases (slot|label|token|mode|lim|revoked|left|age)",
                format!(
                    "SELECT slot, label, token, mode, lim, revoked, \
                     expires_at - clock_timestamp(), clock_timestamp() - granted_at \
                     FROM lockrun.lockrun_leases WHERE name = '{name}' ORDER BY slot"
                ),
            ),
            (
                "waiters (seq|label|mode|lim|left)",
                format!(
                    "SELECT seq, label, mode, lim, expires_at - clock_timestamp() \
                     FROM lockrun.lockrun_waiters WHERE name = '{name}' ORDER BY seq"
                ),
            ),
            (
                "lockrun's connections (this lockrun's|pid|port|state|wait event|since \
                 connect|in transaction for|in state for|query)",
                format!(
                    "SELECT {mine}, pid, client_port, state, wait_event_type || ':' || wait_event, \
                     now() - backend_start, now() - xact_start, now() - state_change, \
                     left(regexp_replace(query, '\\s+', ' ', 'g'), 160) \
                     FROM pg_stat_activity WHERE application_name = 'lockrun' \
                     ORDER BY 1 DESC, client_port"
                ),
            ),
            (
                "advisory locks (pid|granted|key)",
                "SELECT pid, granted, (classid::bigint << 32) | objid::bigint FROM pg_locks \
                 WHERE locktype = 'advisory' ORDER BY granted DESC, pid"
                    .to_string(),
            ),
        ];
        let mut out = String::new();
        for (what, sql) in queries {
            out += &format!("  {what}:\n");
            match pg.try_sql(&sql) {
                Some(rows) => {
                    for r in rows.lines() {
                        out += &format!("    {r}\n");
                    }
                }
                None => out += "    (the query failed)\n",
            }
        }
        out
    }

    /// A connection to the node that holds the leases now.
    /// Delete the lease of `name` behind lockrun's back.
    fn delete(&self, name: &str) {
        let key = format!("lockrun:{{{name}}}");
        match self {
            Servers::One(r) => {
                let _: Result<i64, _> = redis::cmd("DEL")
                    .arg(&key)
                    .query(&mut r.lock().unwrap().conn());
            }
            Servers::Sentinel(s) => {
                let conn = &mut s.lock().unwrap().master().conn();
                let _: Result<i64, _> = redis::cmd("DEL").arg(&key).query(conn);
            }
            Servers::Etcd(e) => {
                e.lock()
                    .unwrap()
                    .ctl(&["del", "--prefix", &format!("lockrun:{name}/")]);
            }
            Servers::Postgres(p) => {
                p.lock().unwrap().sql(&format!(
                    "DELETE FROM lockrun.lockrun_leases WHERE name = '{name}'"
                ));
            }
            Servers::Mariadb(m) => {
                m.lock().unwrap().sql(&format!(
                    "DELETE FROM app.lockrun_leases WHERE name = '{name}'"
                ));
            }
            Servers::Zk(z) => {
                // Every request node of the name, as `zkCli.sh delete` would.
                let z = z.lock().unwrap();
                let Some(s) = z.servers.iter().find(|s| s.running()) else {
                    return;
                };
                let parent = format!("/lockrun/{name}/");
                for (path, _) in zk_tree(s.port, None) {
                    if path.starts_with(&parent) {
                        zk_delete(s.port, None, &path);
                    }
                }
            }
        }
    }
}

fn chaos(sh: Arc<Shared>, servers: Arc<Servers>, seed: u64, until: Instant) -> Vec<Chaos> {
    let mut rng = Rng(seed | 1);
    let mut log = Vec::new();
    let workers = sh.lockrun_pid.len();
    let mut last_failover: Option<Instant> = None;
    while Instant::now() + Duration::from_secs(4) < until {
        std::thread::sleep(rng.ms(700, 2000));
        match rng.below(8) {
            0 => {
                // Pause a lockrun together with its job for longer than the
                // ttl: the one whose job runs now (the holder, most likely).
                let start = rng.below(workers as u64) as usize;
                let holder = (0..workers).map(|k| (start + k) % workers).find_map(|w| {
                    let lr = sh.lockrun_pid[w].load(Ordering::SeqCst);
                    let job = std::fs::read_to_string(sh.dir.join(format!("pid-{w}"))).ok()?;
                    let job = job.trim().parse::<i32>().ok()?;
                    (lr > 1 && job > 1 && alive(lr) && alive(job)).then_some((w, lr, job))
                });
                let Some((w, lr, job)) = holder else { continue };
                let from = now_us();
                signal(lr, libc::SIGSTOP);
                // The job's process group id is its pid.
                signal_group(job, libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(TTL_MS) + rng.ms(300, 1500));
                // lockrun first, as a resumed container would: it must notice
                // the lost lease before the job gets far.
                signal(lr, libc::SIGCONT);
                signal_group(job, libc::SIGCONT);
                log.push(Chaos::Pause {
                    worker: w,
                    from,
                    to: now_us(),
                });
            }
            // Sentinel fails a master over once per failover timeout at most.
            1 | 2
                if matches!(&*servers, Servers::Sentinel(_))
                    && last_failover
                        .is_some_and(|t: Instant| t.elapsed() < Duration::from_secs(12)) =>
            {
                continue;
            }
            1 => match &*servers {
                Servers::Zk(z) => {
                    // The leader killed outright and started again: the
                    // ensemble elects another and every session survives
                    // (Zab-committed, durable), so it admits no late action.
                    let mut z = z.lock().unwrap();
                    let Some(i) = z.leader() else { continue };
                    let from = now_us();
                    z.servers[i].kill();
                    std::thread::sleep(rng.ms(200, 900));
                    z.servers[i].restart();
                    log.push(Chaos::RedisPause { from, to: now_us() });
                }
                Servers::Mariadb(m) => {
                    // The rows are durable (InnoDB's log): a crash and a
                    // start keep every lease, and admit no late action.
                    let from = now_us();
                    m.lock().unwrap().restart();
                    log.push(Chaos::RedisPause { from, to: now_us() });
                }
                Servers::Postgres(pg) => {
                    // The rows are durable: a restart (as a crash: no
                    // checkpoint) keeps every lease, and admits no late action.
                    let from = now_us();
                    pg.lock().unwrap().restart();
                    log.push(Chaos::RedisPause { from, to: now_us() });
                }
                Servers::Etcd(etcd) => {
                    // etcd is durable: a restart keeps every lease (and
                    // lengthens them), so it admits no late action.
                    let from = now_us();
                    etcd.lock().unwrap().restart();
                    log.push(Chaos::RedisPause { from, to: now_us() });
                }
                Servers::One(redis) => {
                    let at = now_us();
                    redis.lock().unwrap().restart();
                    log.push(Chaos::Break {
                        kind: "restart",
                        name: None,
                        at,
                        until: at,
                    });
                }
                Servers::Sentinel(set) => {
                    // The master killed outright; it comes back empty, as a
                    // replica once the sentinels have promoted the other.
                    let mut set = set.lock().unwrap();
                    let before = set.master_port();
                    let at = now_us();
                    last_failover = Some(Instant::now());
                    let i = set.nodes.iter().position(|n| n.port == before).unwrap();
                    set.nodes[i].kill();
                    log.push(Chaos::Break {
                        kind: "master kill",
                        name: None,
                        at,
                        until: at,
                    });
                    let Some(now) = set.new_master(before) else {
                        // No replica the sentinels would promote: the node
                        // comes back as the master, empty.
                        log.push(Chaos::Break {
                            kind: "master restart",
                            name: None,
                            at: now_us(),
                            until: now_us(),
                        });
                        set.nodes[i].restart();
                        continue;
                    };
                    // It comes back empty, and a master until it follows the
                    // new one: a sentinel that has not heard of the failover
                    // yet may still name it. A restart without persistence
                    // breaks leases (lockrun-safety(7) "GUARANTEES") until the
                    // node is a replica again.
                    let at = now_us();
                    let rejoined = set.rejoin(i, now);
                    log.push(Chaos::Break {
                        kind: "master restart",
                        name: None,
                        at,
                        until: now_us(),
                    });
                    if !rejoined {
                        sh.setup.lock().unwrap().push(
                            "the killed master did not rejoin as a replica within 60 s".into(),
                        );
                    }
                }
            },
            2 => match &*servers {
                Servers::Zk(z) => {
                    // A server stopped for a while (the leader, at times):
                    // its clients move to another, or their jobs stop.
                    let z = z.lock().unwrap();
                    let i = rng.below(z.servers.len() as u64) as usize;
                    let from = now_us();
                    z.servers[i].pause();
                    std::thread::sleep(rng.ms(200, 2500));
                    z.servers[i].resume();
                    log.push(Chaos::RedisPause { from, to: now_us() });
                }
                Servers::Mariadb(m) => {
                    let m = m.lock().unwrap();
                    let from = now_us();
                    if rng.below(2) == 0 {
                        // The server stopped: every connection stalls.
                        m.pause();
                        std::thread::sleep(rng.ms(200, 900));
                        m.resume();
                    } else {
                        // Every connection of lockrun's killed by the server:
                        // the leases are rows, and outlive them.
                        let ids = m.sql(
                            "SELECT id FROM information_schema.processlist \
                             WHERE db = 'app' AND id <> CONNECTION_ID()",
                        );
                        for id in ids.lines().filter(|l| !l.is_empty()) {
                            m.try_kill(id);
                        }
                    }
                    log.push(Chaos::RedisPause { from, to: now_us() });
                }
                Servers::Postgres(pg) => {
                    let p = pg.lock().unwrap();
                    if rng.below(2) == 0 {
                        // Every process of the server stopped: each open
                        // connection stalls.
                        let from = now_us();
                        p.pause_all();
                        std::thread::sleep(rng.ms(200, 900));
                        p.resume_all();
                        log.push(Chaos::RedisPause { from, to: now_us() });
                    } else {
                        // Every connection of lockrun's cut by the server: the
                        // leases are rows, and outlive them.
                        let from = now_us();
                        p.sql(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                             WHERE application_name = 'lockrun'",
                        );
                        log.push(Chaos::RedisPause { from, to: now_us() });
                    }
                }
                Servers::Etcd(etcd) => {
                    let e = etcd.lock().unwrap();
                    if rng.below(2) == 0 {
                        let from = now_us();
                        e.pause();
                        std::thread::sleep(rng.ms(200, 900));
                        e.resume();
                        log.push(Chaos::RedisPause { from, to: now_us() });
                    } else {
                        // `etcdctl lease revoke` of any lease alive (a holder's
                        // or a waiter's): the server ends it.
                        let leases = e.leases();
                        if leases.is_empty() {
                            continue;
                        }
                        let lease = &leases[rng.below(leases.len() as u64) as usize];
                        let at = now_us();
                        let _ = Command::new("etcdctl")
                            .args(["--endpoints", &format!("127.0.0.1:{}", e.port)])
                            .args(["lease", "revoke", lease])
                            .env("ETCDCTL_API", "3")
                            .output();
                        log.push(Chaos::Break {
                            kind: "lease revoke",
                            name: None,
                            at,
                            until: at,
                        });
                    }
                }
                Servers::One(redis) => {
                    let r = redis.lock().unwrap();
                    let from = now_us();
                    r.pause();
                    std::thread::sleep(rng.ms(200, 900));
                    r.resume();
                    log.push(Chaos::RedisPause { from, to: now_us() });
                }
                Servers::Sentinel(set) => {
                    let set = set.lock().unwrap();
                    let at = now_us();
                    last_failover = Some(Instant::now());
                    let failed_over = set.try_failover();
                    // Replication is asynchronous: a lease granted just before
                    // the promotion may not have reached the new master, and
                    // until a majority of sentinels names the new master a
                    // grant or renewal still goes to the old one. When the
                    // promotion comes is the sentinels' choice (under load,
                    // seconds after it was asked for), so the break spans from
                    // the ask until a majority names the new master. (A
                    // refused failover is logged too: it may have begun.)
                    let named = failed_over && set.named_by_majority(set.master_port());
                    log.push(Chaos::Break {
                        kind: "failover",
                        name: None,
                        at,
                        until: now_us(),
                    });
                    if failed_over && !(named && set.synced()) {
                        sh.setup
                            .lock()
                            .unwrap()
                            .push("the old master did not become a replica within 60 s".into());
                    }
                }
            },
            3 => {
                let at = now_us();
                let name = NAMES[rng.below(3) as usize];
                if rng.below(2) == 0 {
                    servers.delete(name);
                    log.push(Chaos::Break {
                        kind: "DEL",
                        name: Some(name),
                        at,
                        until: at,
                    });
                } else {
                    run(lockrun().args(["--url", &sh.url, "release", "--force", "--now", name]));
                    log.push(Chaos::Break {
                        kind: "release --now",
                        name: Some(name),
                        at,
                        until: at,
                    });
                }
            }
            4 => {
                // SIGKILL a lockrun whose job (and its child) runs.
                let Some((w, lr, _)) = running_job(&sh, &mut rng) else {
                    continue;
                };
                log.push(Chaos::Kill9 {
                    worker: w,
                    at: now_us(),
                });
                signal(lr, libc::SIGKILL);
            }
            6 => {
                // A holder's job (its writing child) swarms.
                let Some((w, _, g)) = running_job(&sh, &mut rng) else {
                    continue;
                };
                log.push(Chaos::Swarm {
                    worker: w,
                    at: now_us(),
                });
                signal(g, libc::SIGUSR1);
            }
            5 => {
                let Some(proxy) = &sh.proxy else { continue };
                let from = now_us();
                proxy.set_trickle(true);
                std::thread::sleep(rng.ms(500, 3000));
                proxy.set_trickle(false);
                log.push(Chaos::Stall { from, to: now_us() });
            }
            _ => {
                let at = now_us();
                let name = NAMES[rng.below(3) as usize];
                let out = run(lockrun().args(["--url", &sh.url, "release", "--force", name]));
                if out.status.code() == Some(0) {
                    log.push(Chaos::Revoke { at });
                }
            }
        }
    }
    log
}

struct History {
    jobs: Vec<Job>,
    /// Per fenced resource (name, slot), the writes it accepted, in order.
    accepted: HashMap<(String, String), Vec<(u64, u64)>>,
    rejected: usize,
    /// A (name, token) that started twice: one token granted twice.
    twice: Vec<String>,
}

fn read_history(dir: &Path) -> History {
    let text = std::fs::read_to_string(dir.join("events.log")).unwrap_or_default();
    let mut jobs: HashMap<(String, u64), Job> = HashMap::new();
    let mut accepted: HashMap<(String, String), Vec<(u64, u64)>> = HashMap::new();
    let mut rejected = 0;
    let mut twice = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 7 {
            continue;
        }
        let (token, at, w): (u64, u64, usize) = (
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        );
        let (name, mode, slot) = (f[4].to_string(), f[5].to_string(), f[6].to_string());
        let job = jobs.entry((name.clone(), token)).or_insert_with(|| Job {
            token,
            worker: w,
            name: name.clone(),
            mode,
            slot: slot.clone(),
            ..Job::default()
        });
        match f[0] {
            "start" => {
                if job.start != 0 || job.worker != w {
                    twice.push(format!("{name} token {token}"));
                }
                job.start = at;
            }
            "accept" => {
                job.actions.push(at);
                accepted.entry((name, slot)).or_default().push((token, at));
            }
            "reject" => {
                job.actions.push(at);
                rejected += 1;
            }
            "end" | "read" | "tick" => job.actions.push(at),
            _ => {}
        }
    }
    let mut jobs: Vec<Job> = jobs.into_values().collect();
    jobs.sort_by_key(|j| (j.name.clone(), j.token));
    History {
        jobs,
        accepted,
        rejected,
        twice,
    }
}

/// The bound of lockrun-safety(7) "GUARANTEES" for a lease broken on the server:
/// ttl/3 + op + grace, plus a margin for scheduling on a loaded machine.
fn break_bound_us() -> u64 {
    (TTL_MS / 3 + TTL_MS / 6 + TTL_MS / 10 + 1000) * 1000
}

/// Why an action of job `a` at `x`, after job `b` (newer token) started, is
/// admitted; None if it is not.
fn admitted(a: &Job, b: &Job, x: u64, chaos: &[Chaos]) -> Option<&'static str> {
    let grace_margin = (TTL_MS / 10 + 1000) * 1000;
    for c in chaos {
        match *c {
            Chaos::Pause { worker, from, to }
                if worker == a.worker && from <= x && x <= to + grace_margin =>
            {
                return Some("holder paused");
            }
            Chaos::Break {
                at, until, name, ..
            } if name.is_none_or(|n| n == a.name)
                && at <= b.start
                && x <= until + break_bound_us() =>
            {
                return Some("lease broken on the server");
            }
            _ => {}
        }
    }
    None
}

/// The most holders `torture-limit` admits.
const LIMIT: usize = 3;

fn check(h: &History, chaos: &[Chaos]) -> (Vec<String>, usize) {
    let mut bad = Vec::new();
    let mut overlaps = 0;
    for t in &h.twice {
        bad.push(format!("(d) {t} was granted twice"));
    }
    for name in NAMES {
        let jobs: Vec<&Job> = h.jobs.iter().filter(|j| j.name == name).collect();
        // (a) one holder at a time: tokens strictly increase in grant order,
        // a newer token never starts before an older one, unless the older
        // one's holder was paused.
        if name == "torture" {
            for pair in jobs.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                if a.start > 0
                    && b.start > 0
                    && b.start < a.start
                    && admitted(a, b, a.start, chaos).is_none()
                {
                    bad.push(format!(
                        "(a) token {} started before the older token {}",
                        b.token, a.token
                    ));
                }
            }
        }
        for (i, b) in jobs.iter().enumerate() {
            if b.start == 0 {
                continue;
            }
            // Older jobs still acting once b started, each with its first
            // late action.
            let busy: Vec<(&Job, u64)> = jobs[..i]
                .iter()
                .filter_map(|a| {
                    let x = a.actions.iter().copied().filter(|&x| x > b.start).min()?;
                    Some((*a, x))
                })
                .collect();
            let unadmitted: Vec<&(&Job, u64)> = busy
                .iter()
                .filter(|(a, x)| admitted(a, b, *x, chaos).is_none())
                .collect();
            overlaps += busy.len() - unadmitted.len();
            if name == "torture-limit" {
                // (b) at most LIMIT at once, and one holder per slot.
                if unadmitted.len() >= LIMIT {
                    bad.push(format!(
                        "(b) {} holders of {name} at once when token {} started",
                        unadmitted.len() + 1,
                        b.token
                    ));
                }
                for (a, x) in &unadmitted {
                    if a.slot == b.slot {
                        bad.push(format!(
                            "(b) slot {} of {name}: job {} acted {} µs after job {} started there",
                            b.slot,
                            a.token,
                            x - b.start,
                            b.token
                        ));
                    }
                }
            } else {
                // (b) one writer alone; readers only beside readers.
                for (a, x) in unadmitted {
                    if !may_share(name, &a.mode, &b.mode) {
                        bad.push(format!(
                            "(b) {name}: job {} ({}, worker {}) acted {} µs after job {} ({}) started, \
                             with no pause or broken lease to admit it",
                            a.token,
                            a.mode,
                            a.worker,
                            x - b.start,
                            b.token,
                            b.mode
                        ));
                    }
                }
            }
        }
    }
    // (c) no resource accepted a token lower than one it had accepted.
    for ((name, slot), writes) in &h.accepted {
        for pair in writes.windows(2) {
            if pair[1].0 < pair[0].0 {
                bad.push(format!(
                    "(c) {name} slot {slot} accepted token {} after token {}",
                    pair[1].0, pair[0].0
                ));
            }
        }
    }
    (bad, overlaps)
}

fn describe(c: &Chaos) -> String {
    match c {
        Chaos::Pause { worker, from, to } => {
            format!("{from}..{to} lockrun of worker {worker} paused")
        }
        Chaos::Break {
            kind,
            name,
            at,
            until,
        } => {
            let when = if until > at {
                format!("{at}..{until}")
            } else {
                at.to_string()
            };
            format!(
                "{when} lease broken: {kind} {}",
                name.unwrap_or("(every name)")
            )
        }
        Chaos::RedisPause { from, to } => format!("{from}..{to} Redis paused"),
        Chaos::Revoke { at } => format!("{at} release --force (revoke)"),
        Chaos::Kill9 { worker, at } => format!("{at} lockrun of worker {worker} killed (SIGKILL)"),
        Chaos::Stall { from, to } => format!("{from}..{to} replies trickled"),
        Chaos::Swarm { worker, at } => {
            format!("{at} the job of worker {worker} forked thousands of processes")
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn torture_with_a_fenced_resource() {
    let _alone = heavy();
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let url = proxy.url();
    let secs = env_u64("LOCKRUN_TORTURE_SECS", 30);
    torture(Servers::One(Mutex::new(redis)), url, Some(proxy), secs);
}

/// The same on etcd: the chaos thread restarts etcd (durable: leases
/// survive), stops it for a while and revokes leases with etcdctl
/// (LOCKRUN_TORTURE_ETCD_SECS, default 20).
#[test]
fn torture_on_etcd() {
    let _alone = heavy();
    let etcd = Etcd::start();
    let url = etcd.url();
    let secs = env_u64("LOCKRUN_TORTURE_ETCD_SECS", 20);
    torture(Servers::Etcd(Mutex::new(etcd)), url, None, secs);
}

/// The same on PostgreSQL: the chaos thread restarts the server (durable:
/// leases survive), stops every process of it for a while and cuts every
/// connection of lockrun's (LOCKRUN_TORTURE_POSTGRES_SECS, default 20).
#[test]
fn torture_on_postgres() {
    let _alone = heavy();
    let pg = Postgres::start();
    let url = pg.url();
    let secs = env_u64("LOCKRUN_TORTURE_POSTGRES_SECS", 20);
    torture(Servers::Postgres(Mutex::new(pg)), url, None, secs);
}

/// The same on MariaDB: the chaos thread restarts the server (durable:
/// leases survive), stops it for a while and kills every connection of
/// lockrun's (LOCKRUN_TORTURE_MARIADB_SECS, default 20).
#[test]
fn torture_on_mariadb() {
    let _alone = heavy();
    let m = Mariadb::start();
    let url = m.url();
    let secs = env_u64("LOCKRUN_TORTURE_MARIADB_SECS", 20);
    torture(Servers::Mariadb(Mutex::new(m)), url, None, secs);
}

/// The same on a three-server ZooKeeper ensemble: the chaos thread kills
/// the leader outright and starts it again, and stops a server for a while
/// (LOCKRUN_TORTURE_ZK_SECS, default 15).
#[test]
fn torture_on_zookeeper() {
    let _alone = heavy();
    let ens = Ensemble::start();
    let url = ens.url();
    let secs = env_u64("LOCKRUN_TORTURE_ZK_SECS", 15);
    torture(Servers::Zk(Mutex::new(ens)), url, None, secs);
}

/// The same behind Sentinel, where the chaos thread also fails the master
/// over and kills it outright (LOCKRUN_TORTURE_SENTINEL_SECS, default 20).
#[test]
fn torture_behind_sentinel() {
    let _alone = heavy();
    let set = Sentinels::start();
    let url = set.url();
    let secs = env_u64("LOCKRUN_TORTURE_SENTINEL_SECS", 20);
    torture(Servers::Sentinel(Mutex::new(set)), url, None, secs);
}

fn torture(servers: Servers, url: String, proxy: Option<Proxy>, secs: u64) {
    if Command::new("perl").arg("-v").output().is_err() {
        panic!("perl not found: the torture test's job needs it (apt-get install -y perl)");
    }
    let workers = env_u64("LOCKRUN_TORTURE_WORKERS", 9) as usize;
    let seed = env_u64("LOCKRUN_TORTURE_SEED", now_us());
    println!(
        "torture: seed {seed}, {workers} workers, {secs} s (replay with LOCKRUN_TORTURE_SEED={seed})"
    );
    let scratch = Scratch::new();
    std::fs::write(scratch.path("job.pl"), JOB).unwrap();
    let servers = Arc::new(servers);
    let sh = Arc::new(Shared {
        dir: scratch.dir.path().to_path_buf(),
        url,
        proxy,
        stop: AtomicBool::new(false),
        lockrun_pid: (0..workers).map(|_| AtomicI32::new(0)).collect(),
        violations: Mutex::new(Vec::new()),
        setup: Mutex::new(Vec::new()),
        exits: Mutex::new(HashMap::new()),
    });
    let until = Instant::now() + Duration::from_secs(secs);
    let handles: Vec<_> = (0..workers)
        .map(|i| {
            let sh = Arc::clone(&sh);
            let servers = Arc::clone(&servers);
            std::thread::spawn(move || worker(i, sh, servers, seed))
        })
        .collect();
    let chaos_log = {
        let (sh, servers) = (Arc::clone(&sh), Arc::clone(&servers));
        std::thread::spawn(move || chaos(sh, servers, seed, until))
    };
    let chaos_log = chaos_log.join().unwrap();
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
    sh.stop.store(true, Ordering::SeqCst);
    for h in handles {
        h.join().unwrap();
    }

    let history = read_history(scratch.dir.path());
    let (mut bad, overlaps) = check(&history, &chaos_log);
    bad.extend(sh.violations.lock().unwrap().iter().cloned());
    let exits = sh.exits.lock().unwrap().clone();
    let count = |f: fn(&Chaos) -> bool| chaos_log.iter().filter(|c| f(c)).count();
    let summary = format!(
        "seed {seed}: {} grants, {} writes accepted, {} stale writes rejected, {} lost leases (exit 76), \
         {} unreachable (69), {} out of descriptors (70); chaos: {} lockrun pauses, {} lockrun SIGKILLs, {} stalls, \
         {} Redis restarts, {} server pauses or durable restarts, {} failovers, {} master kills, {} lease revokes on the server, {} raw deletes or release --now, {} revokes, {} swarms; {} admitted late actions",
        history.jobs.len(),
        history.accepted.values().map(Vec::len).sum::<usize>(),
        history.rejected,
        exits.get(&76).copied().unwrap_or(0),
        exits.get(&69).copied().unwrap_or(0),
        exits.get(&70).copied().unwrap_or(0),
        count(|c| matches!(c, Chaos::Pause { .. })),
        count(|c| matches!(c, Chaos::Kill9 { .. })),
        count(|c| matches!(c, Chaos::Stall { .. })),
        count(|c| matches!(
            c,
            Chaos::Break {
                kind: "restart",
                ..
            }
        )),
        count(|c| matches!(c, Chaos::RedisPause { .. })),
        count(|c| matches!(
            c,
            Chaos::Break {
                kind: "failover",
                ..
            }
        )),
        count(|c| matches!(
            c,
            Chaos::Break {
                kind: "master kill",
                ..
            }
        )),
        count(|c| matches!(
            c,
            Chaos::Break {
                kind: "lease revoke",
                ..
            }
        )),
        count(|c| {
            matches!(c, Chaos::Break { kind, .. }
                if !matches!(*kind, "restart" | "failover" | "master kill" | "master restart" | "lease revoke"))
        }),
        count(|c| matches!(c, Chaos::Revoke { .. })),
        count(|c| matches!(c, Chaos::Swarm { .. })),
        overlaps,
    );
    println!("torture: {summary}");
    for trouble in sh.setup.lock().unwrap().iter() {
        println!("torture: servers: {trouble}");
    }
    let timeline: Vec<String> = chaos_log.iter().map(describe).collect();
    for line in &timeline {
        println!("torture: chaos: {line}");
    }
    assert!(
        bad.is_empty(),
        "safety violations ({summary}):\n{}\nchaos:\n{}",
        bad.join("\n"),
        timeline.join("\n")
    );
    assert!(
        history.jobs.len() >= 10,
        "too few grants to mean anything: {summary}"
    );
}

/// Whether `pid` holds a flock on the file with inode `inode` (/proc/locks).
fn holds_flock(pid: i32, inode: u64) -> bool {
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().filter(|l| !l.contains("->")).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 5
            && f[1] == "FLOCK"
            && f[4] == pid.to_string()
            && f[5].rsplit(':').next() == Some(&inode.to_string())
    })
}

/// The chaos thread's swarm may start while the job's writer holds the
/// fence's lock. Its processes must not keep that lock: the writer's next
/// write would wait for them, and they for the job's end, so the job and
/// its lockrun would never end. Caught in the act: the writer is stopped
/// until it holds the lock, then told to swarm.
#[test]
fn a_swarm_started_inside_a_fenced_write_leaves_the_fence_to_the_writer() {
    use std::os::unix::fs::MetadataExt;
    let scratch = Scratch::new();
    std::fs::write(scratch.path("job.pl"), JOB).unwrap();
    // The fence of name f, with no slot.
    let lock = scratch.path("fence-f--.lock");
    std::fs::write(&lock, "").unwrap();
    let inode = std::fs::metadata(&lock).unwrap().ino();
    let mut child = lockrun()
        .args(["--url", &scratch.file_url(), "f", "--", "perl"])
        .arg(scratch.path("job.pl"))
        .arg(scratch.dir.path())
        .args(["40", "f"])
        .env("WORKER", "0")
        .env("MODE", "x")
        .env("SWARM", "40")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let writer = scratch.pid_in("grandchild-0");
    let mut caught = false;
    let start = Instant::now();
    while !caught && start.elapsed() < Duration::from_secs(20) && alive(writer) {
        signal(writer, libc::SIGSTOP);
        caught = holds_flock(writer, inode);
        if caught {
            signal(writer, libc::SIGUSR1);
        }
        signal(writer, libc::SIGCONT);
        std::thread::sleep(Duration::from_micros(500));
    }
    assert!(caught, "the writer was never seen holding the fence's lock");
    let Some(st) = wait_within(&mut child, Duration::from_secs(30)) else {
        let wchan = proc_text(format!("/proc/{writer}/wchan"));
        let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
        let on_fence: Vec<&str> = locks
            .lines()
            .filter(|l| l.contains(&format!(":{inode} ")))
            .collect();
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "lockrun did not finish within 30 s: the writer {writer} waits in {wchan}; \
             the fence's locks: {on_fence:?}"
        );
    };
    assert_eq!(st.code(), Some(0), "{st:?}");
    let events = scratch.read("events.log");
    let accepted = events.lines().filter(|l| l.starts_with("accept")).count();
    assert_eq!(accepted, 40, "{accepted} writes accepted of 40");
}

#[test]
fn failover_to_a_lagging_replica_keeps_tokens_growing() {
    let mut primary = Redis::start();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let on = |r: &Redis| {
        let mut c = lockrun();
        c.args([
            "--url",
            &r.url(),
            "f",
            "--",
            "sh",
            "-c",
            "echo $LOCKRUN_TOKEN",
        ]);
        c
    };
    let token = |r: &Redis| -> u64 {
        let out = run(&mut on(r));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout).trim().parse().unwrap()
    };
    let mut issued = vec![token(&primary)];
    // Wait until the replica has the counter: replication works.
    let synced = wait_until(Duration::from_secs(20), || {
        replica.cmd::<Option<u64>>(&["GET", "lockrun:{f}:fence"]) == Some(issued[0])
    });
    assert!(synced, "the replica never caught up");

    // Make it lag: stop it, cut its link, and issue more grants.
    replica.pause();
    let killed: i64 = primary.cmd(&["CLIENT", "KILL", "TYPE", "replica"]);
    assert!(killed >= 1, "no replica link to cut");
    for _ in 0..5 {
        issued.push(token(&primary));
    }
    primary.kill();
    replica.resume();
    let lagging: Option<u64> = replica.cmd(&["GET", "lockrun:{f}:fence"]);
    assert!(
        lagging.unwrap_or(0) < *issued.last().unwrap(),
        "the replica must really lag: it has {lagging:?}, the primary issued {issued:?}"
    );
    let _: () = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    let after = token(&replica);
    let highest = *issued.iter().max().unwrap();
    assert!(
        after > highest,
        "token {after} after failover must exceed every earlier one ({highest})"
    );
}
