//! The command line, as clap derive definitions; the doc comments are the help text.
//! Values stay raw strings here and are validated once, in `config`.

use std::ffi::OsString;

use clap::{Args, Parser, Subcommand};

/// `status`'s other name, for the list of every name.
pub const LIST: &str = "list";

/// `--prefix` when none is given.
pub const DEFAULT_PREFIX: &str = "lockrun:";

/// `--version`: the version, then the engines this build has, one a line
/// with its URL schemes (`-V` prints the version alone).
pub fn long_version() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let mut text = format!("{}\nengines:", env!("CARGO_PKG_VERSION"));
        for (i, engine) in crate::backend::ENGINES.iter().enumerate() {
            let schemes: Vec<String> = engine.schemes.iter().map(|s| format!("{s}://")).collect();
            let default = if i == 0 { " (the default)" } else { "" };
            text.push_str(&format!(
                "\n  {:<10}  {}{default}",
                engine.name,
                schemes.join(" ")
            ));
        }
        text
    })
}

/// `--help`'s description, with the URL schemes of every engine that has a
/// server, from the scheme table.
pub fn long_about() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let schemes: Vec<String> = crate::backend::ENGINES[1..]
            .iter()
            .flat_map(|engine| engine.schemes.iter().map(|s| format!("{s}://")))
            .collect();
        format!(
            "Run a command while holding a named lease, so that only one copy runs at a time \
             across many machines.\n\n\
             Without --url, the lock is local to this machine (flock on a file). With a \
             server's URL ({}), the lease lives there and is renewed while the job runs; the \
             job is stopped before the lease could lapse. The job gets a fencing token in \
             LOCKRUN_TOKEN that grows with every grant.\n\n\
             To run a job under a lock named like a subcommand, put `--` before the name: \
             `lockrun -- status -- ./job`.",
            schemes.join(", ")
        )
    })
}

/// Run a command while holding a named lease, so that only one copy runs at a
/// time across many machines.
#[derive(Debug, Parser)]
#[command(
    name = "lockrun",
    version,
    subcommand_negates_reqs = true,
    override_usage = "lockrun [OPTIONS] <NAME> [--] <COMMAND> [ARGS]...\n       \
lockrun [OPTIONS] <NAME> -c <SHELL_COMMAND>\n       \
lockrun status [--json] [NAME]\n       \
lockrun release --force [--token T] [--now] <NAME>\n       \
lockrun doctor [--url URL]"
)]
pub struct Cli {
    #[command(subcommand)]
    pub subcommand: Option<OperatorCommand>,

    #[command(flatten)]
    pub backend: BackendArgs,

    #[command(flatten)]
    pub run: RunArgs,

    /// `--generate KIND`: not part of this definition, which the completions
    /// and the man page are made from, but added where lockrun parses (see
    /// [`command`]).
    #[arg(skip)]
    pub generate: Option<Generate>,
}

/// The command line as lockrun's help, man page and completions show it:
/// [`Cli`] with the texts built from the tables (engines, exit codes).
/// Building them was a fifth of the work of parsing a run's command line,
/// so a run parses with [`Cli`] alone and builds these only to show them.
pub fn documented() -> clap::Command {
    use crate::exit::{self, command_help};
    use clap::CommandFactory;
    Cli::command()
        .long_version(long_version())
        .long_about(long_about())
        .after_help(exit::help_summary())
        .mut_subcommand("status", |c| {
            c.after_help(command_help(&[&exit::STATUS_CODES, &exit::LIST_CODES]))
        })
        .mut_subcommand("release", |c| {
            c.after_help(command_help(&[&exit::RELEASE_CODES]))
        })
        .mut_subcommand("doctor", |c| {
            c.after_help(command_help(&[&exit::DOCTOR_CODES]))
        })
}

/// The command line lockrun parses: [`Cli`] (with its texts if `documented`),
/// and the packagers' hidden `--generate KIND`, which prints a shell
/// completion script or the man page. It is added here rather than in `Cli`
/// because clap_complete offers hidden options too: the completions are made
/// from `Cli` alone.
pub fn command(documented: bool) -> clap::Command {
    use clap::CommandFactory;
    let cli = if documented {
        self::documented()
    } else {
        Cli::command()
    };
    cli.arg(
        clap::Arg::new("generate")
            .long("generate")
            .hide(true)
            .value_name("KIND")
            .exclusive(true)
            .value_parser(clap::value_parser!(Generate))
            .help("Print a shell completion script or the man page to stdout"),
    )
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Generate {
    Man,
    Bash,
    Zsh,
    Fish,
    Elvish,
    Powershell,
}

/// Where the lock lives and how lockrun talks; shared by every subcommand.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// Lock backend: redis://[user][:pass@]host[:port][/db], rediss://... (TLS),
    /// redis+sentinel://host[:port][,host...]/MASTER[/db],
    /// redis+cluster://host[:port][,host...] (rediss+sentinel://,
    /// rediss+cluster://: TLS), etcd://[user:pass@]host[:port][,host...],
    /// etcds://... (TLS), postgres://[user[:pass]@]host[:port][/dbname] (or
    /// postgresql://, PG* variables as libpq reads them),
    /// mysql://[user[:pass]@]host[:port]/dbname (or mariadb://),
    /// zk://[user:pass@]host[:port][,host...][/chroot] (or zookeeper://),
    /// zks://... (TLS), or file:///dir.
    /// Default: a per-user directory on this machine.
    #[arg(
        short = 'u',
        long,
        env = "LOCKRUN_URL",
        global = true,
        hide_env_values = true
    )]
    pub url: Option<String>,

    /// --url came from LOCKRUN_URL: a refusal names the variable.
    #[arg(skip)]
    pub url_from_env: bool,

    /// CA certificate file (PEM) to verify a TLS server (rediss://, etcds://,
    /// postgres:// with sslmode=require or verify-*, mysql:// with
    /// ssl-mode=REQUIRED or VERIFY_*, zks://) with.
    #[arg(long, env = "LOCKRUN_TLS_CA", value_name = "PATH", global = true)]
    pub tls_ca: Option<std::path::PathBuf>,

    /// --tls-ca came from LOCKRUN_TLS_CA, not the command line: then it only
    /// applies to TLS URLs and never breaks a run on another engine.
    #[arg(skip)]
    pub tls_ca_from_env: bool,

    /// A grant or renewal counts only once N replicas acknowledged it
    /// (engines with replicas: Redis, also behind Sentinel).
    #[arg(
        long,
        env = "LOCKRUN_REPLICAS",
        value_name = "N",
        default_value_t = 0,
        global = true,
        allow_negative_numbers = true
    )]
    pub replicas: u32,

    /// --replicas came from LOCKRUN_REPLICAS: an engine without replicas
    /// ignores it rather than refusing it.
    #[arg(skip)]
    pub replicas_from_env: bool,

    /// Key namespace on the server.
    #[arg(
        long,
        env = "LOCKRUN_PREFIX",
        default_value = DEFAULT_PREFIX,
        global = true
    )]
    pub prefix: String,

    /// --prefix came from LOCKRUN_PREFIX: an engine without prefixes
    /// ignores it rather than refusing it.
    #[arg(skip)]
    pub prefix_from_env: bool,

    /// Timestamped progress on stderr (-vv also shows every renewal).
    #[arg(short, long, action = clap::ArgAction::Count, global = true, conflicts_with = "quiet")]
    pub verbose: u8,

    /// Print only errors.
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

/// Options of the main form: `lockrun [OPTIONS] NAME [--] COMMAND [ARGS]...`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Name of the lock.
    #[arg(required = true)]
    pub name: Option<String>,

    /// Command to run and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND",
        required_unless_present = "command",
        conflicts_with = "command"
    )]
    pub args: Vec<OsString>,

    /// Run this string with /bin/sh -c.
    #[arg(short = 'c', long = "command", value_name = "SHELL_COMMAND")]
    pub command: Option<OsString>,

    /// Lease length, e.g. 500ms, 30s, 2m, "1h 30m".
    ///
    /// A job rides out an outage of the engine of at least
    /// ttl - ttl/3 - op - grace - slack - drift (13s at 30s, 28s at 60s;
    /// lockrun-safety(7) has the terms), up to about 25s at 30s when it began
    /// right after a renewal; a longer one stops the job (76).
    #[arg(
        short,
        long,
        env = "LOCKRUN_TTL",
        default_value = "30s",
        value_name = "DUR",
        allow_hyphen_values = true
    )]
    pub ttl: String,

    /// Give up at once if the lock is held (flock's --nonblock and --nb work too).
    #[arg(short, long, conflicts_with = "wait", visible_aliases = ["nonblock", "nb"])]
    pub no_wait: bool,

    /// Give up after waiting this long for the lock (default: wait forever);
    /// DUR may be a bare number of seconds, as flock's -w takes it.
    #[arg(
        short,
        long,
        value_name = "DUR",
        visible_alias = "timeout",
        allow_hyphen_values = true
    )]
    pub wait: Option<String>,

    /// An exclusive lock, the default (as flock's -x and -e).
    #[arg(short = 'x', long, short_alias = 'e', conflicts_with_all = ["shared", "limit"])]
    pub exclusive: bool,

    /// A shared (reader) lock, as flock's -s: shared holders run together,
    /// never beside an exclusive one.
    #[arg(short = 's', long)]
    pub shared: bool,

    /// Up to N holders at once (a counting semaphore); each job gets its
    /// place 0..N-1 in LOCKRUN_SLOT. Every user of the name must agree on N.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub limit: Option<String>,

    /// Exit code when the lock was not acquired: 0 to 255 but 76 (-E 0 skips
    /// quietly, as with flock -n -E 0 in a crontab).
    #[arg(
        short = 'E',
        long,
        value_name = "N",
        default_value_t = crate::exit::NOT_ACQUIRED.to_string(),
        allow_negative_numbers = true
    )]
    pub conflict_exit_code: String,

    /// A note shown by `status` and in waiting messages beside host:pid
    /// (a pipeline id, a ticket).
    #[arg(long, env = "LOCKRUN_LABEL", value_name = "TEXT")]
    pub label: Option<String>,

    /// At the end of every run (skipped, ran, lost, failed) replace PATH,
    /// atomically, with Prometheus text for node_exporter's textfile
    /// collector: end time, acquired, wait and hold seconds, exit code,
    /// lease lost, token. A PATH that cannot be written costs one warning,
    /// never the job or its exit code.
    #[arg(long, env = "LOCKRUN_METRICS_FILE", value_name = "PATH")]
    pub metrics_file: Option<std::path::PathBuf>,
    /// Grace between SIGTERM and SIGKILL when the job must stop (default: ttl/10).
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    pub kill_after: Option<String>,

    /// Keep the lock held at least DUR after it was granted, also once the
    /// job ended, counted on the engine's clock: a crontab line on several
    /// hosts then runs once per window. A longer job releases at its end.
    #[arg(long, value_name = "DUR", allow_hyphen_values = true)]
    pub min_hold: Option<String>,

    /// Wait only while fewer than N requests of this name wait; otherwise
    /// give up at once with the conflict code (-E). --max-waiters 1
    /// coalesces: the running job plus one queued run.
    #[arg(
        long,
        env = "LOCKRUN_MAX_WAITERS",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub max_waiters: Option<String>,

    /// --max-waiters came from LOCKRUN_MAX_WAITERS: a default for every run,
    /// which a `-n` run (it never waits) ignores rather than refusing.
    #[arg(skip)]
    pub max_waiters_from_env: bool,

    /// Replace the waiting requests of this name that asked for
    /// --supersede too (newest wins); each replaced one gives up with the
    /// conflict code. Holders and other waiters are never touched.
    #[arg(long)]
    pub supersede: bool,

    /// Ask the holders of this name to stop: each stops its job at its next
    /// renewal (TERM, grace, KILL) and exits 76; then wait our turn, so the
    /// job starts only once every process of theirs is gone.
    #[arg(long)]
    pub preempt: bool,
}

#[derive(Debug, Subcommand)]
pub enum OperatorCommand {
    /// Show whether NAME is held; without NAME (or as `list`), every name.
    ///
    /// With NAME: every holder (who, token, slot, mode, time left) and the
    /// number of waiters. Without NAME (or as `list`): every name under the
    /// prefix, one line each, sorted; read name by name, not as one
    /// snapshot, except on PostgreSQL, MySQL and MariaDB (one statement)
    /// and etcd (one read at one revision).
    #[command(visible_alias = LIST)]
    Status {
        /// Print one JSON object (without NAME: an array of them) instead of text.
        #[arg(long)]
        json: bool,
        /// Name of the lock (default: every name).
        name: Option<String>,
    },
    /// Break a lock (operators).
    ///
    /// By default the holder is revoked: its job is stopped at its next
    /// renewal and new grants wait until the old lease would have expired,
    /// so no two jobs overlap.
    Release {
        /// Required: breaking a lock someone holds is deliberate.
        #[arg(long)]
        force: bool,
        /// Break only the holder with token T (default: every holder).
        #[arg(long, value_name = "T")]
        token: Option<String>,
        /// Delete the lease at once and wake a waiter. Unsafe without fencing:
        /// the old job may still be running when the next one starts.
        #[arg(long)]
        now: bool,
        /// Name of the lock.
        name: String,
    },
    /// Check an engine before the first incident, read-only.
    ///
    /// One line per check, ok, warn or fail, with what to do. Read-only: it
    /// runs nothing but reads and dry runs and creates nothing that outlives
    /// it (no key, no lock file, no directory, no table or schema; on Redis,
    /// a user that may not run ACL DRYRUN has its permissions checked by a
    /// read-only script, which stays in the script cache as lockrun's own
    /// scripts do).
    Doctor {},
}

/// Long options, lockrun's and those of the tools it replaces, as someone
/// might spell them with one dash (consul's style: `-timeout=10s`).
const LONG_WORDS: [&str; 16] = [
    "url",
    "ttl",
    "wait",
    "timeout",
    "label",
    "prefix",
    "verbose",
    "quiet",
    "command",
    "nonblock",
    "exclusive",
    "shared",
    "name",
    "limit",
    "shell",
    "conflict-exit-code",
];

/// One line for an option spelling from flock or consul that lockrun does not
/// take, saying what lockrun does instead; None when the line looks like ours.
/// Only the options before the lock name are looked at: the rest is the job's.
pub fn foreign_spelling(args: &[OsString]) -> Option<String> {
    let mut positionals = 0;
    for a in args {
        let Some(a) = a.to_str() else { break };
        if a == "--" || !a.starts_with('-') {
            positionals += 1;
            break;
        }
        let said = match a {
            "-o" | "--close" => Some(
                "lockrun has no -o/--close: the job never holds lockrun's descriptors (on the \
                 local backend it inherits the lock itself, as LOCKRUN_LOCK_FD)",
            ),
            "-F" | "--no-fork" => Some(
                "lockrun has no -F/--no-fork: it always runs the job as its child, to renew \
                 the lease and stop the job in time",
            ),
            "--unlock" => Some(
                "lockrun has no --unlock: the lock ends when the job ends (operators break a \
                 lease on a server with `lockrun release --force NAME`)",
            ),
            _ => None,
        };
        if let Some(s) = said {
            return Some(s.to_string());
        }
        let word = a[1..].split('=').next().unwrap_or("");
        if !a.starts_with("--") && word.len() > 2 && LONG_WORDS.contains(&word) {
            let hint = match word {
                "name" => " (consul's -name is lockrun's --label)".to_string(),
                _ => format!(": use -{a}"),
            };
            return Some(format!(
                "{a}: lockrun spells long options with two dashes{hint}"
            ));
        }
    }
    // flock's descriptor form, `flock 9` inside `( … ) 9>file`.
    let rest: Vec<&str> = args
        .iter()
        .filter_map(|a| a.to_str())
        .filter(|a| !a.starts_with('-'))
        .collect();
    if positionals == 1
        && rest.len() == 1
        && rest[0].chars().all(|c| c.is_ascii_digit())
        && !args.iter().any(|a| a == "-c" || a == "--command")
    {
        return Some(format!(
            "lockrun has no descriptor form (flock {n}): run the command under the lock instead, \
             lockrun NAME -- COMMAND",
            n = rest[0]
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
        command(false).debug_assert();
        command(true).debug_assert();
    }

    /// `--version` names every engine of the scheme table, each with all
    /// its schemes, one line each.
    #[test]
    fn long_version_names_every_engine() {
        let text = long_version();
        assert!(text.starts_with(concat!(env!("CARGO_PKG_VERSION"), "\nengines:\n")));
        let lines: Vec<&str> = text.lines().skip(2).collect();
        assert_eq!(lines.len(), crate::backend::ENGINES.len(), "{text}");
        for (engine, line) in crate::backend::ENGINES.iter().zip(lines) {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words[0], engine.name, "{text}");
            let schemes: Vec<String> = engine.schemes.iter().map(|s| format!("{s}://")).collect();
            assert_eq!(words[1..=schemes.len()], schemes, "{text}");
        }
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(args).unwrap()
    }

    #[test]
    fn generate_is_parsed_but_not_in_the_definition() {
        let m = command(false).try_get_matches_from(["lockrun", "--generate", "bash"]);
        let kind = m.unwrap().get_one::<Generate>("generate").copied();
        assert!(matches!(kind, Some(Generate::Bash)));
        assert!(
            Cli::command()
                .get_arguments()
                .all(|a| a.get_id() != "generate")
        );
        assert!(
            command(false)
                .try_get_matches_from(["lockrun", "--generate", "bash", "x", "true"])
                .is_err()
        );
    }

    #[test]
    fn main_form_takes_a_command_after_the_name() {
        let cli = parse(&["lockrun", "job", "--", "echo", "-n", "hi"]);
        assert_eq!(cli.run.name.as_deref(), Some("job"));
        assert_eq!(cli.run.args, ["echo", "-n", "hi"]);
        let cli = parse(&["lockrun", "-n", "job", "sh", "-c", "x"]);
        assert!(cli.run.no_wait);
        assert_eq!(cli.run.args, ["sh", "-c", "x"]);
    }

    #[test]
    fn a_lock_can_be_named_like_a_subcommand() {
        let cli = parse(&["lockrun", "--", "status", "--", "true"]);
        assert!(cli.subcommand.is_none());
        assert_eq!(cli.run.name.as_deref(), Some("status"));
        assert_eq!(cli.run.args, ["--", "true"]);
    }

    #[test]
    fn subcommands_parse() {
        let cli = parse(&["lockrun", "status", "--json", "job"]);
        assert!(matches!(
            cli.subcommand,
            Some(OperatorCommand::Status { json: true, .. })
        ));
        let cli = parse(&[
            "lockrun",
            "--url",
            "file:///tmp/locks",
            "release",
            "--force",
            "job",
        ]);
        assert!(matches!(
            cli.subcommand,
            Some(OperatorCommand::Release { force: true, .. })
        ));
    }

    #[test]
    fn foreign_spellings_get_one_line() {
        let said = |args: &[&str]| {
            let v: Vec<OsString> = args.iter().map(OsString::from).collect();
            foreign_spelling(&v)
        };
        assert!(
            said(&["-timeout=10s", "x", "true"])
                .unwrap()
                .contains("--timeout")
        );
        assert!(
            said(&["-name=ci", "x", "true"])
                .unwrap()
                .contains("--label")
        );
        assert!(said(&["-o", "x", "true"]).is_some());
        assert!(said(&["-F", "x", "true"]).is_some());
        assert!(said(&["-n", "9"]).unwrap().contains("descriptor"));
        // Ours, and the job's own options, pass.
        assert!(said(&["-nv", "x", "true"]).is_none());
        assert!(said(&["-vv", "x", "--", "ls", "-timeout=3"]).is_none());
        assert!(said(&["--timeout", "3", "x", "true"]).is_none());
        assert!(said(&["-w", "10", "x", "-c", "true"]).is_none());
    }

    #[test]
    fn no_wait_conflicts_with_wait() {
        assert!(Cli::try_parse_from(["lockrun", "-n", "-w", "1s", "x", "true"]).is_err());
    }
}
