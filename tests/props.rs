//! Random command lines and environments: lockrun never panics and always
//! ends with an exit code from its table (lockrun(1) "EXIT STATUS"). Random
//! histories of lockrun processes on one Redis name: no key but the token
//! counter is ever left without an expiry (lockrun-engines(7) "REDIS").

use std::time::Duration;

use proptest::prelude::*;

use crate::support::*;

/// Pieces a command line is made of: real options with odd values, names,
/// URLs (none of them reachable but the scratch directory), commands.
const PIECES: &[&str] = &[
    "-n",
    "-w",
    "--wait",
    "-t",
    "--ttl",
    "-E",
    "--kill-after",
    "-c",
    "-v",
    "-vv",
    "-q",
    "--",
    "--url",
    "--prefix",
    "--tls-ca",
    "status",
    "release",
    "--force",
    "--token",
    "--now",
    "--json",
    "--generate",
    "0",
    "1",
    "-1",
    "76",
    "255",
    "256",
    "0.5",
    "1e9",
    "10s",
    "100ms",
    "7days",
    "8days",
    "99999999999999h",
    "18446744073709551615",
    "abc",
    "",
    " ",
    "{",
    "}",
    "%",
    "a\u{202E}b",
    "name",
    "x/../y",
    "redis://127.0.0.1:1",
    "rediss://127.0.0.1:1#insecure",
    "redis://u:p@127.0.0.1:1/99999999999",
    "redis://",
    "file:///nonexistent/dir",
    "http://h",
    "redis://[::1",
    "true",
    "false",
    "exit 3",
    "/nonexistent",
    "-timeout=10s",
    "--nb",
    "-x",
];

/// lockrun's own codes, and those of the jobs the pieces can make (`-c`
/// with a piece as the script: 2 is sh's syntax error).
const CODES: &[i32] = &[0, 1, 2, 3, 64, 69, 70, 75, 76, 126, 127, 255];

fn line() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            8 => prop::sample::select(PIECES).prop_map(str::to_string),
            1 => "\\PC{0,12}",
        ],
        0..8,
    )
}

fn env() -> impl Strategy<Value = Vec<(String, String)>> {
    let keys = prop::sample::select(
        &[
            "LOCKRUN_URL",
            "LOCKRUN_TTL",
            "LOCKRUN_PREFIX",
            "LOCKRUN_TLS_CA",
            "LOCKRUN_LOCK_FD",
            "LOCKRUN_NAME",
            "LOCKRUN_OWNER",
        ][..],
    );
    let values = prop_oneof![
        prop::sample::select(PIECES).prop_map(str::to_string),
        "\\PC{0,8}"
    ];
    prop::collection::vec((keys.prop_map(str::to_string), values), 0..3)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_command_line_ends_with_a_known_code(args in line(), vars in env()) {
        let scratch = Scratch::new();
        let mut cmd = lockrun();
        // Runs that get this far use a fresh lock directory: nothing waits.
        cmd.current_dir(scratch.dir.path())
            .env("LOCKRUN_URL", scratch.file_url())
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        for (k, v) in &vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let st = wait_child(&mut child, Duration::from_secs(30));
        let mut err = String::new();
        use std::io::Read;
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        prop_assert!(!err.contains("panicked"), "{args:?} {vars:?}: {err}");
        let code = st.code();
        prop_assert!(code.is_some_and(|c| CODES.contains(&c)), "{args:?} {vars:?}: {st:?} {err}");
        if code == Some(64) {
            prop_assert_eq!(err.lines().count(), 1, "{:?} {:?}: {}", args, vars, err);
        }
    }
}

/// One step of a random history of one name on a real Redis, played by a
/// few lockrun processes (actors) and the test itself. A step aimed at an
/// actor picks, by its number, one of those it can act on (`Kill(1)`: the
/// second of the running ones), so few steps are lost to no-ops.
#[derive(Debug, Clone)]
enum Step {
    /// An idle actor asks for the name and holds it until told to end.
    Acquire {
        who: usize,
        ttl: &'static str,
        mode: &'static [&'static str],
        wait: &'static [&'static str],
    },
    /// Time passes, in ms: renewals, places kept, leases and places lapsing.
    Pass(u64),
    /// SIGTERM to a running lockrun: forwarded to its job, then released
    /// (or, while it waits, it dies in the queue).
    End(usize),
    /// SIGKILL to a running lockrun: nothing is given back.
    Kill(usize),
    /// SIGSTOP to a running lockrun: it neither renews nor keeps its place.
    Stop(usize),
    /// SIGCONT to a stopped one.
    Cont(usize),
    /// `lockrun -n NAME true` from outside.
    Probe,
    /// `lockrun release --force [--now] NAME`.
    Force { now: bool },
}

// Two actors, a short lease that lapses within a history and a long one
// whose place in the queue outlives it: the draws most likely to make one
// lockrun's script serve a grant to another that is not there to take it.
const ACTORS: usize = 2;
const TTLS: &[&str] = &["0.3s", "20s"];
const MODES: &[&[&str]] = &[&[], &[], &[], &[], &["-s"], &["--limit", "2"]];
const WAITS: &[&[&str]] = &[&[], &[], &[], &[], &[], &["-w", "0.5"]];

fn step() -> impl Strategy<Value = Step> {
    let who = || 0..ACTORS;
    prop_oneof![
        4 => (
            who(),
            prop::sample::select(TTLS),
            prop::sample::select(MODES),
            prop::sample::select(WAITS),
        )
            .prop_map(|(who, ttl, mode, wait)| Step::Acquire { who, ttl, mode, wait }),
        3 => (50u64..400).prop_map(Step::Pass),
        1 => who().prop_map(Step::End),
        2 => who().prop_map(Step::Kill),
        3 => who().prop_map(Step::Stop),
        1 => who().prop_map(Step::Cont),
        3 => Just(Step::Probe),
        1 => any::<bool>().prop_map(|now| Step::Force { now }),
    ]
}

/// An actor's lockrun, and whether the test stopped it.
struct Actor {
    child: std::process::Child,
    stopped: bool,
}

/// One history on its own name (a lease left by an earlier case cannot
/// matter); every lockrun of it is killed when it ends.
struct History<'a> {
    redis: &'a Redis,
    conn: redis::Connection,
    name: String,
    actors: Vec<Option<Actor>>,
}

impl History<'_> {
    /// No key of the name but its token counter is without an expiry, for
    /// `span` (checked at least once).
    fn check(&mut self, after: &Step, span: Duration) -> Result<(), TestCaseError> {
        let pattern = format!("lockrun:{{{}}}*", self.name);
        let start = std::time::Instant::now();
        loop {
            let bad = self.redis.keys_without_expiry(&mut self.conn, &pattern);
            prop_assert!(bad.is_empty(), "after {after:?}: no expiry on {bad:?}");
            if start.elapsed() >= span {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The `n`th (wrapping) of the actors for which `fits(running, stopped)`.
    fn pick(&mut self, n: usize, fits: impl Fn(bool, bool) -> bool) -> Option<usize> {
        for slot in &mut self.actors {
            if slot
                .as_mut()
                .is_some_and(|a| a.child.try_wait().unwrap().is_some())
            {
                *slot = None;
            }
        }
        let eligible: Vec<usize> = (0..self.actors.len())
            .filter(|&i| match &self.actors[i] {
                Some(a) => fits(true, a.stopped),
                None => fits(false, false),
            })
            .collect();
        (!eligible.is_empty()).then(|| eligible[n % eligible.len()])
    }

    fn pid(&self, i: usize) -> i32 {
        self.actors[i].as_ref().unwrap().child.id() as i32
    }

    /// Holders and waiters of the name, as the server has them.
    fn seen(&mut self) -> usize {
        let lock = format!("lockrun:{{{}}}", self.name);
        let holders: usize = redis::cmd("HLEN").arg(&lock).query(&mut self.conn).unwrap();
        let queued: usize = redis::cmd("ZCARD")
            .arg(format!("{lock}:queue"))
            .query(&mut self.conn)
            .unwrap();
        holders + queued
    }

    fn gone(&mut self, i: usize) -> bool {
        let a = self.actors[i].as_mut().unwrap();
        a.child.try_wait().unwrap().is_some()
    }

    fn play(&mut self, step: &Step) {
        let url = self.redis.url();
        match *step {
            Step::Acquire {
                who,
                ttl,
                mode,
                wait,
            } => {
                let Some(i) = self.pick(who, |running, _| !running) else {
                    return;
                };
                let before = self.seen();
                let child = on(&url)
                    .args(["-q", "--ttl", ttl])
                    .args(mode)
                    .args(wait)
                    .args([&self.name, "--", "sleep", "60"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn();
                self.actors[i] = Some(Actor {
                    child,
                    stopped: false,
                });
                // Let it reach the server (granted, queued, or gone) before
                // the next step, so the steps happen in the order drawn.
                wait_until(Duration::from_secs(5), || {
                    self.seen() != before || self.gone(i)
                });
            }
            // The check that follows lets the time pass.
            Step::Pass(_) => {}
            Step::End(n) => {
                if let Some(i) = self.pick(n, |running, _| running) {
                    signal(self.pid(i), libc::SIGTERM);
                    if !self.actors[i].as_ref().unwrap().stopped {
                        wait_until(Duration::from_secs(10), || self.gone(i));
                    }
                }
            }
            Step::Kill(n) => {
                if let Some(i) = self.pick(n, |running, _| running) {
                    let mut a = self.actors[i].take().unwrap();
                    let _ = a.child.kill();
                    let _ = a.child.wait();
                }
            }
            Step::Stop(n) => {
                if let Some(i) = self.pick(n, |running, stopped| running && !stopped) {
                    signal(self.pid(i), libc::SIGSTOP);
                    self.actors[i].as_mut().unwrap().stopped = true;
                }
            }
            Step::Cont(n) => {
                if let Some(i) = self.pick(n, |running, stopped| running && stopped) {
                    signal(self.pid(i), libc::SIGCONT);
                    self.actors[i].as_mut().unwrap().stopped = false;
                }
            }
            Step::Probe => {
                let _ = on(&url).args(["-q", "-n", &self.name, "true"]).output();
            }
            Step::Force { now } => {
                let mut force = on(&url).args(["release", "--force"]);
                if now {
                    force = force.arg("--now");
                }
                let _ = force.arg(&self.name).output();
            }
        }
    }
}

impl Drop for History<'_> {
    fn drop(&mut self) {
        for mut a in self.actors.drain(..).flatten() {
            signal(a.child.id() as i32, libc::SIGCONT);
            let _ = a.child.kill();
            let _ = a.child.wait();
        }
    }
}

/// Random histories of acquire, renewal (time passing), release, kill -9,
/// SIGSTOP and SIGCONT of real lockrun processes, with `-n` and
/// `release --force` from outside: after every step no key of the name but
/// its token counter is without an expiry (lockrun-engines(7) "REDIS"). Bounded: a few
/// dozen short histories, well under a minute.
#[test]
fn every_key_but_the_token_counter_expires_whatever_happens() {
    use proptest::test_runner::{Config, TestRunner};
    let redis = Redis::start();
    let mut runner = TestRunner::new(Config {
        cases: 40,
        max_shrink_iters: 24,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0);
    let result = runner.run(&prop::collection::vec(step(), 6..20), |steps| {
        case.set(case.get() + 1);
        let mut h = History {
            redis: &redis,
            conn: redis.conn(),
            name: format!("p{}", case.get()),
            actors: (0..ACTORS).map(|_| None).collect(),
        };
        for s in &steps {
            h.play(s);
            let span = match s {
                Step::Pass(ms) => Duration::from_millis(*ms),
                _ => Duration::from_millis(20),
            };
            h.check(s, span)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
