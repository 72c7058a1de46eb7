//! Turns the raw command line into a validated configuration, once, before
//! anything is contacted: every refusal here is exit 64 with one line.

use std::ffi::OsString;
use std::time::Duration;

use crate::backend::{Address, AddressOptions, EngineAt, Group, Mode, Wait};
use crate::cli::{BackendArgs, RunArgs};
use crate::exit::{Class, Failure, fail};
use crate::schedule::Timing;

#[derive(Debug, Clone)]
pub struct Common {
    /// The engine and its address, parsed by the engine.
    pub address: EngineAt,
    pub prefix: String,
    pub verbosity: u8,
}

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub common: Common,
    pub name: String,
    pub mode: Mode,
    pub timing: Timing,
    pub wait: Wait,
    pub conflict_code: u8,
    pub command: Vec<OsString>,
    /// `--label`, checked: printable, at most 100 characters.
    pub label: Option<String>,
    /// `--metrics-file`: replaced at the end of the run.
    pub metrics_file: Option<std::path::PathBuf>,
    /// `--min-hold`, checked: above zero, at most `MAX_MIN_HOLD`.
    pub min_hold: Option<Duration>,
    /// `--max-waiters`, `--supersede`, `--preempt`, checked against `-n`.
    pub group: Group,
}

fn usage(msg: impl std::fmt::Display) -> Failure {
    fail(Class::Usage, msg)
}

/// The longest lease: every engine accepts it, and no time arithmetic near it can overflow.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest `--min-hold`: a window as long as the longest lease, which
/// every engine stores and no time arithmetic near it can overflow.
pub const MAX_MIN_HOLD: Duration = MAX_TTL;
/// The longest `--wait`.
pub const MAX_WAIT: Duration = Duration::from_secs(31_557_600); // humantime's 1y

/// Parse a duration: humantime (`500ms`, `2m`, `1h 30m`) or a bare number of
/// seconds with an optional fraction (`10`, `0.5`), as flock's `-w` takes it.
/// Beyond `max` it is refused, naming the bound.
pub fn parse_duration(what: &str, s: &str, max: Duration) -> Result<Duration, Failure> {
    let t = s.trim();
    let bare = !t.is_empty()
        && t.chars().all(|c| c.is_ascii_digit() || c == '.')
        && t.chars().filter(|&c| c == '.').count() <= 1
        && t.chars().any(|c| c.is_ascii_digit());
    let parsed = if bare {
        // f64 keeps far more than the bound needs; a number too large for a
        // Duration is past every bound, and said so below.
        t.parse::<f64>()
            .map(|secs| Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
            .map_err(|_| "not a duration".to_string())
    } else if t
        .strip_prefix('-')
        .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit() || c == '.'))
    {
        Err("a duration cannot be negative".to_string())
    } else {
        // humantime's own words ("expected number at 0") name its parser's
        // state, not what the user should write.
        match humantime::parse_duration(t) {
            Ok(d) => Ok(d),
            Err(humantime::DurationError::NumberOverflow) => Ok(Duration::MAX),
            Err(humantime::DurationError::UnknownUnit { unit, .. }) => {
                Err(format!("unknown unit {unit:?}"))
            }
            Err(_) => Err("not a duration".to_string()),
        }
    };
    let d = parsed.map_err(|why| {
        usage(format!(
            "invalid {what} {s:?}: {why} (examples: 500ms, 30s, 5m, \"1h 30m\", 2d; \
             a bare number is seconds, 10 or 0.5)"
        ))
    })?;
    if d > max {
        return Err(usage(format!(
            "invalid {what} {s:?}: longer than the limit of {}",
            crate::text::duration(max)
        )));
    }
    Ok(d)
}

pub fn common(args: &BackendArgs) -> Result<Common, Failure> {
    let url = args.url.as_deref().unwrap_or_default();
    let opts = AddressOptions {
        tls_ca: args.tls_ca.clone(),
        tls_ca_from_env: args.tls_ca_from_env,
        replicas: args.replicas,
        replicas_from_env: args.replicas_from_env,
        prefix_from_env: args.prefix_from_env,
    };
    let address = crate::backend::address(url, &opts).map_err(|e| {
        let f = Failure::from(e);
        if !args.url_from_env {
            return f;
        }
        // The engines refuse an address as "invalid --url"; this one came
        // from the environment.
        match f.to_string().strip_prefix("invalid --url") {
            Some(rest) => fail(f.class, format!("invalid LOCKRUN_URL{rest}")),
            None => f,
        }
    })?;
    address.check_prefix(&args.prefix)?;
    let verbosity = if args.quiet { 0 } else { 1 + args.verbose };
    Ok(Common {
        address,
        prefix: args.prefix.clone(),
        verbosity,
    })
}

/// The inherited LOCKRUN_URL carries a password, or may (whichever URL is in
/// effect, it must not reach the job, nor be readable from our /proc
/// entries). One lockrun cannot read cannot be told apart from one with a
/// secret: it is kept from the job too (a lockrun inside the job could not
/// use it anyway).
pub fn inherited_url_has_password() -> bool {
    std::env::var_os("LOCKRUN_URL").is_some_and(|u| {
        let Some(u) = u.to_str() else {
            return true;
        };
        if u.is_empty() {
            return false;
        }
        let opts = AddressOptions {
            tls_ca_from_env: true,
            replicas_from_env: true,
            ..AddressOptions::default()
        };
        crate::backend::address(u, &opts).map_or(true, |a| a.secret().is_some())
    })
}

/// The longest lock name, in bytes of UTF-8, on every engine (lockrun(1)
/// "Input"): it becomes part of a key or a file name and one line of
/// `status`.
pub const MAX_NAME: usize = 1024;

/// A lock name must be printable, bounded, and meet its engine's rules.
pub fn check_name(name: &str, address: &dyn Address) -> Result<(), Failure> {
    // First, and without the name: a line must not carry a huge name.
    if name.len() > MAX_NAME {
        return Err(usage(format!(
            "invalid lock name: it is {} bytes long; a name has at most {MAX_NAME} bytes (1 KiB)",
            name.len()
        )));
    }
    if name.is_empty() {
        return Err(usage(
            "the lock name is empty; give a name such as nightly-report",
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(usage(format!(
            "invalid lock name {name:?}: control characters are not allowed"
        )));
    }
    if let Some(c) = name.chars().find(|&c| crate::text::is_invisible(c)) {
        return Err(usage(format!(
            "invalid lock name {name:?}: invisible or direction-changing character U+{:04X} \
             is not allowed (two names must not look alike)",
            c as u32
        )));
    }
    address.check_name(name)?;
    Ok(())
}

/// The most holders `--limit` allows: each is a slot of its own on every
/// engine (a file, an entry every script walks).
pub const MAX_LIMIT: u32 = 1000;

/// The mode asked for (every engine offers every mode).
fn mode(run: &RunArgs) -> Result<Mode, Failure> {
    let limit = run
        .limit
        .as_deref()
        .map(|s| match s.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(usage(format!(
                "invalid --limit {s:?}: expected a number of holders from 1 to {MAX_LIMIT}"
            ))),
        })
        .transpose()?;
    let mode = match (run.shared, limit) {
        (true, Some(_)) => {
            return Err(usage(
                "-s/--shared and --limit exclude each other: shared holders have no limit",
            ));
        }
        (true, None) => Mode::Shared,
        (false, Some(n)) => Mode::Limit(n),
        (false, None) => Mode::Exclusive,
    };
    Ok(mode)
}

pub fn run_config(backend: &BackendArgs, run: &RunArgs) -> Result<RunConfig, Failure> {
    let common = common(backend)?;
    let name = run.name.clone().unwrap_or_default();
    check_name(&name, &*common.address)?;

    let ttl = parse_duration("--ttl", &run.ttl, MAX_TTL)?;
    // What the engine would grant: the schedule is built on that.
    let ttl = common.address.engine.grantable(ttl)?;
    let kill_after = run
        .kill_after
        .as_deref()
        .map(|s| parse_duration("--kill-after", s, MAX_TTL))
        .transpose()?;
    let timing = Timing::new(ttl, kill_after).map_err(usage)?;
    let wait = wait(run)?;
    let conflict_code = conflict_code(&run.conflict_exit_code)?;
    let command = command(run)?;
    let label = label(run.label.as_deref())?;
    let mode = mode(run)?;
    let min_hold = run.min_hold.as_deref().map(parse_min_hold).transpose()?;
    let group = group(run, wait)?;
    let metrics_file = metrics_file(run)?;
    Ok(RunConfig {
        common,
        name,
        mode,
        timing,
        wait,
        conflict_code,
        command,
        label,
        metrics_file,
        min_hold,
        group,
    })
}

fn wait(run: &RunArgs) -> Result<Wait, Failure> {
    Ok(match (run.no_wait, run.wait.as_deref()) {
        (true, Some(_)) => return Err(usage("-n/--no-wait and -w/--wait exclude each other")),
        (true, None) => Wait::No,
        (false, Some(s)) => Wait::For(parse_duration("--wait", s, MAX_WAIT)?),
        (false, None) => Wait::Forever,
    })
}

/// `-E`: any exit code but the one that says the lease was lost.
fn conflict_code(given: &str) -> Result<u8, Failure> {
    let lost = crate::exit::LEASE_LOST;
    match given.trim().parse::<u8>() {
        Ok(n) if n == lost => Err(usage(format!(
            "-E {lost} is not allowed: {lost} means the lease was lost; pick another code from 0 to 255",
        ))),
        Err(_) => Err(usage(format!(
            "invalid -E {given:?}: expected an exit code from 0 to 255 (not {lost})",
        ))),
        Ok(n) => Ok(n),
    }
}

fn command(run: &RunArgs) -> Result<Vec<std::ffi::OsString>, Failure> {
    let command = match &run.command {
        Some(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
        None => {
            // `lockrun -- NAME -- cmd`: clap keeps the second `--` as an argument.
            let mut args = run.args.clone();
            if args.first().is_some_and(|a| a == "--") {
                args.remove(0);
            }
            args
        }
    };
    if command.is_empty() || command[0].is_empty() {
        return Err(usage(
            "no command given; usage: lockrun NAME -- COMMAND [ARGS]...",
        ));
    }
    Ok(command)
}

fn label(given: Option<&str>) -> Result<Option<String>, Failure> {
    match given.map(str::trim) {
        None | Some("") => Ok(None),
        Some(l) if l.chars().count() > 100 => {
            Err(usage("invalid --label: longer than 100 characters"))
        }
        Some(l)
            if l.chars()
                .any(|c| c.is_control() || crate::text::is_invisible(c)) =>
        {
            Err(usage(format!(
                "invalid --label {l:?}: control and invisible characters are not allowed"
            )))
        }
        Some(l) => Ok(Some(l.to_string())),
    }
}

fn metrics_file(run: &RunArgs) -> Result<Option<std::path::PathBuf>, Failure> {
    let metrics_file = run
        .metrics_file
        .clone()
        .filter(|p| !p.as_os_str().is_empty());
    if let Some(p) = &metrics_file
        && p.file_name().is_none()
    {
        return Err(usage(format!(
            "invalid --metrics-file {:?}: expected the path of a file, such as \
             /var/lib/node_exporter/textfile/report.prom",
            p.display().to_string()
        )));
    }
    Ok(metrics_file)
}

/// The most `--max-waiters` allows: far beyond any queue, and a count every
/// engine keeps exactly.
const MAX_WAITERS: u32 = 1_000_000;

/// `--max-waiters`, `--supersede` and `--preempt` speak of waiting: with
/// `-n`, which never waits, each is a mistake said at once.
fn group(run: &RunArgs, wait: Wait) -> Result<Group, Failure> {
    let max_waiters = run
        .max_waiters
        .as_deref()
        .filter(|_| !(wait == Wait::No && run.max_waiters_from_env))
        .map(|s| match s.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_WAITERS).contains(&n) => Ok(n),
            _ => Err(usage(format!(
                "invalid --max-waiters {s:?}: expected a number of waiting requests from 1 to \
                 {MAX_WAITERS} (to never wait, use -n)"
            ))),
        })
        .transpose()?;
    if wait == Wait::No {
        let asked = [
            (max_waiters.is_some(), "--max-waiters"),
            (run.supersede, "--supersede"),
            (run.preempt, "--preempt"),
        ];
        if let Some((_, flag)) = asked.iter().find(|(on, _)| *on) {
            return Err(usage(format!(
                "-n/--no-wait and {flag} exclude each other: {flag} is about waiting, and -n \
                 never waits"
            )));
        }
    }
    Ok(Group {
        max_waiters,
        supersede: run.supersede,
        preempt: run.preempt,
    })
}

/// `--min-hold DUR`: a window of at least a millisecond, the step every
/// engine can keep (etcd rounds it up to whole seconds).
fn parse_min_hold(s: &str) -> Result<Duration, Failure> {
    let d = parse_duration("--min-hold", s, MAX_MIN_HOLD)?;
    if d < Duration::from_millis(1) {
        return Err(usage(format!(
            "invalid --min-hold {s:?}: a window must last at least 1ms; leave --min-hold out \
             to release when the job ends"
        )));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> Result<EngineAt, Failure> {
        Ok(crate::backend::address(url, &AddressOptions::default())?)
    }

    proptest::proptest! {
        #[test]
        fn durations_never_panic(s in "\\PC{0,30}|[0-9.]{1,25}[a-z ]{0,6}") {
            let _ = parse_duration("--ttl", &s, MAX_TTL);
        }
    }

    #[test]
    fn names_are_checked() {
        let local = spec("").unwrap();
        let local = &*local;
        assert!(check_name("", local).is_err());
        assert!(check_name("a\nb", local).is_err());
        assert!(check_name("a{b}", local).is_ok());
        assert!(check_name("../../x", local).is_ok());
        for sneaky in ["a\u{202E}b", "a\u{200B}", "x\u{2028}y", "\u{FEFF}z"] {
            assert!(check_name(sneaky, local).is_err(), "{sneaky:?}");
        }
        assert!(check_name("café-Ünïcode", local).is_ok());
        assert!(check_name(&"x".repeat(MAX_NAME), local).is_ok());
        assert!(check_name(&"x".repeat(MAX_NAME + 1), local).is_err());
        // Bytes, not characters: 513 two-byte characters are too many.
        assert!(check_name(&"é".repeat(513), local).is_err());
    }

    #[test]
    fn durations_name_the_option() {
        let e = parse_duration("--ttl", "ten seconds", MAX_TTL).unwrap_err();
        assert!(e.to_string().contains("--ttl"));
        assert_eq!(
            parse_duration("--ttl", "1h 30m", MAX_TTL).unwrap(),
            Duration::from_secs(5400)
        );
    }

    #[test]
    fn bare_seconds_and_fractions_are_durations() {
        let d = |s| parse_duration("-w", s, MAX_WAIT).unwrap();
        assert_eq!(d("10"), Duration::from_secs(10));
        assert_eq!(d("0.5"), Duration::from_millis(500));
        assert_eq!(d(" 2 "), Duration::from_secs(2));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in [".", "1.2.3", "-1", "1e3", ""] {
            assert!(parse_duration("-w", bad, MAX_WAIT).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_past_the_bounds_name_them() {
        for (s, max) in [
            ("99999999999999h", MAX_TTL),
            ("600y", MAX_TTL),
            ("18446744073709551615s", MAX_TTL),
            ("18446744073709551615", MAX_WAIT),
            ("100000000000000000s", MAX_TTL),
            ("8days", MAX_TTL),
        ] {
            let e = parse_duration("--ttl", s, max).unwrap_err();
            assert_eq!(e.class, Class::Usage, "{s}");
            let bound = format!("limit of {}", crate::text::duration(max));
            assert!(e.to_string().contains(&bound), "{s}: {e}");
        }
        assert!(parse_duration("--ttl", "7days", MAX_TTL).is_ok());
    }

    #[test]
    fn min_hold_is_a_bounded_window_above_zero() {
        assert_eq!(parse_min_hold("4m").unwrap(), Duration::from_secs(240));
        assert_eq!(parse_min_hold("0.5").unwrap(), Duration::from_millis(500));
        for bad in ["0", "0s", "0.0001", "-1s", "-3", "soon", "", "8days", "1e9"] {
            let e = parse_min_hold(bad).unwrap_err();
            assert_eq!(e.class, Class::Usage, "{bad}");
            assert!(e.to_string().contains("--min-hold"), "{bad}: {e}");
            assert!(!e.to_string().contains('\n'), "{bad}: {e}");
        }
    }
}
