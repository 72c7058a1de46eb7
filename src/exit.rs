//! Every exit code lockrun can return, in one place, and the mapping from a
//! job's wait status to the code a shell would have seen without lockrun.

use std::fmt;

/// Lock not acquired (held elsewhere with `-n`, or `--wait` ran out); `-E` changes it.
pub const NOT_ACQUIRED: u8 = 75;
/// The lease was lost while a process of the job was alive; lockrun stopped the job.
pub const LEASE_LOST: u8 = 76;
/// Usage or configuration error (sysexits EX_USAGE).
pub const USAGE: u8 = 64;
/// Backend unreachable or refused us before the job started (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// Internal error (EX_SOFTWARE).
pub const INTERNAL: u8 = 70;
/// The command exists but could not be executed.
pub const NOT_EXECUTABLE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;

/// `status`: the lock is held.
pub const STATUS_HELD: u8 = 0;
/// `status`: the lock is free; `release`: nothing was broken.
pub const STATUS_FREE: u8 = 1;
/// `doctor`: every check passed but at least one warned.
pub const DOCTOR_WARNED: u8 = 1;

/// One exit code as the documentation gives it: the single source of the
/// summary in `--help`, the man page's EXIT STATUS and README's table (a
/// test holds README to it).
pub struct Row {
    /// The code as written (`75 (or -E)`, `128+N`).
    pub code: &'static str,
    /// A few words, for `--help`.
    pub short: &'static str,
    /// What happened.
    pub meaning: &'static str,
    /// What shows what went on (the man page; README keeps it short).
    pub check: &'static str,
    /// What an operator does about it.
    pub action: &'static str,
}

pub const TABLE: &[Row] = &[
    Row {
        code: "the job's code",
        short: "the job's own code",
        meaning: "the job ran and exited on its own",
        check: "the job's own output and logs",
        action: "nothing of lockrun's: the code is the job's own",
    },
    Row {
        code: "128+N",
        short: "128+N if it died of signal N",
        meaning: "the job died of signal N. For SIGINT lockrun releases the lock and then kills \
                  itself with SIGINT, so a calling shell loop stops as it would without lockrun \
                  (`$?` is still 130)",
        check: "`dmesg` or the system journal for the OOM killer, the CI system's log for a \
                cancelled run",
        action: "find who sent the signal (a cancelled CI run, `kill`, the OOM killer: 137)",
    },
    Row {
        code: "75 (or -E)",
        short: "75 not acquired (-E)",
        meaning: "lock not acquired: held elsewhere with `-n`, `--wait` ran out, the queue was \
                  full (`--max-waiters`), a newer request replaced this one (`--supersede`), or \
                  the server had no connection free (the line names its limit, such as \
                  `max_connections`) until the wait ran out; the job did not run",
        check: "`lockrun status NAME` names the holder and the requests waiting; `-v` prints \
                who a waiter waits for",
        action: "nothing if skipping was meant (`-n -E 0` in cron); else a longer `--wait`, \
                 find out why the holder runs so long, or raise the server's limit the line \
                 names",
    },
    Row {
        code: "76",
        short: "76 lease lost, job stopped",
        meaning: "the lease was lost, or a `--preempt` request asked for the name, while a \
                  process of the job was alive; lockrun (or its guard) stopped the job",
        check: "the line lockrun printed on stderr says which of: the lease no longer ours \
                (revoked, deleted, a failover), not renewed in time (the engine unreachable, or \
                lockrun stopped and its guard took over), preempted by another request, or refused by the engine \
                (TROUBLESHOOTING); `lockrun doctor` shows whether the engine is healthy now",
        action: "the job may have stopped half-way: let it fence on `LOCKRUN_TOKEN`, then run it \
                 again; a longer `--ttl` rides out longer outages of the engine",
    },
    Row {
        code: "64",
        short: "64 usage",
        meaning: "usage or configuration error; no job started. Most are found before anything \
                  is contacted; the engine finds two: the name held in another mode or `--limit`, \
                  and a job inside a lockrun that holds the same name",
        check: "the one line on stderr names the option, variable or mode at fault",
        action: "fix the option or `LOCKRUN_*` variable the line names",
    },
    Row {
        code: "69",
        short: "69 engine unreachable or refused",
        meaning: "the engine was unreachable or refused lockrun before the job started (connect, \
                  auth, TLS, a foreign key at the lock's name)",
        check: "`lockrun doctor` with the same URL and prefix names the failing check",
        action: "fix what the line or `lockrun doctor` names (address, credentials, CA, the \
                 user's rights), then run again: nothing ran and nothing is held",
    },
    Row {
        code: "70",
        short: "70 internal",
        meaning: "internal error, or a kernel or sandbox without the calls lockrun needs to stop \
                  a job (no job started); after the job started, only once every process of the \
                  job is gone and the lease released",
        check: "the line on stderr; `uname -r`; the sandbox's system call filter; `ulimit -n` \
                and `ulimit -u`",
        action: "read the line: Linux 5.3 or later and a sandbox that allows pidfds, or a file, \
                 thread or descriptor limit; otherwise a bug to report",
    },
    Row {
        code: "126 / 127",
        short: "126 not executable; 127 not found",
        meaning: "command found but not executable / command not found",
        check: "`command -v` of the command with the job's `PATH`",
        action: "check the command and `PATH` (cron's is `/usr/bin:/bin`)",
    },
];

/// The exit codes in a sentence, for the end of `--help`.
pub fn help_summary() -> String {
    let codes: Vec<&str> = TABLE.iter().map(|r| r.short).collect();
    format!(
        "Exit codes: {}. `man lockrun` says what to do about each.",
        codes.join("; ")
    )
}

/// The exit codes of one operator command: the single source of its
/// `--help`, of the sentence closing its entry in lockrun(1)'s COMMANDS and
/// of its line in README (a test holds README to it).
pub struct Codes {
    /// The command as the documents write it.
    pub form: &'static str,
    /// Each code with a few words; markdown's `code` for options.
    pub codes: &'static [(u8, &'static str)],
}

pub const STATUS_CODES: Codes = Codes {
    form: "status NAME",
    codes: &[
        (STATUS_HELD, "held"),
        (STATUS_FREE, "free"),
        (USAGE, "usage"),
        (UNAVAILABLE, "unreachable"),
    ],
};

pub const LIST_CODES: Codes = Codes {
    form: "list",
    codes: &[
        (STATUS_HELD, "any name held"),
        (STATUS_FREE, "none held"),
        (USAGE, "usage"),
        (UNAVAILABLE, "unreachable"),
    ],
};

pub const RELEASE_CODES: Codes = Codes {
    form: "release --force NAME",
    codes: &[
        (0, "broken"),
        (STATUS_FREE, "not held, already revoked or token mismatch"),
        (
            USAGE,
            "usage, or on the local engine anything but a `--min-hold` window",
        ),
        (UNAVAILABLE, "unreachable"),
    ],
};

pub const DOCTOR_CODES: Codes = Codes {
    form: "doctor",
    codes: &[
        (0, "all ok"),
        (DOCTOR_WARNED, "a warning"),
        (USAGE, "usage"),
        (UNAVAILABLE, "unreachable or a check failed"),
    ],
};

/// Every operator command's codes, in the order the documents give them.
pub const COMMAND_CODES: [&Codes; 4] = [&STATUS_CODES, &LIST_CODES, &RELEASE_CODES, &DOCTOR_CODES];

impl Codes {
    /// `0 held; 1 free; …`, with markdown's backquotes.
    fn list(&self) -> String {
        let codes: Vec<String> = self
            .codes
            .iter()
            .map(|(code, meaning)| format!("{code} {meaning}"))
            .collect();
        codes.join("; ")
    }

    /// As `--help` shows it: plain text.
    pub fn plain(&self) -> String {
        self.list().replace('`', "")
    }

    /// The sentence closing the command's entry in lockrun(1), in roff.
    pub fn roff(&self) -> String {
        format!("Exit {}.\n", roff_text(&self.list()))
    }

    /// The written page's placeholder for [`Codes::roff`]: `@CODES_LIST@`.
    pub fn placeholder(&self) -> String {
        let word = self.form.split(' ').next().unwrap_or_default();
        format!("@CODES_{}@\n", word.to_ascii_uppercase())
    }
}

/// `--help`'s closing lines: the codes of each form of a command.
pub fn command_help(codes: &[&Codes]) -> String {
    let lines: Vec<String> = codes
        .iter()
        .map(|c| format!("Exit codes of {}: {}.", c.form, c.plain()))
        .collect();
    lines.join("\n")
}

/// README's lines for the operator commands.
#[cfg(test)]
pub fn commands_markdown() -> String {
    let mut out = String::new();
    for c in COMMAND_CODES {
        out.push_str(&format!("- `lockrun {}`: {}\n", c.form, c.list()));
    }
    out
}

/// The table as README shows it.
#[cfg(test)]
pub fn markdown() -> String {
    let mut out = String::from("| code | meaning | what to do |\n|---|---|---|\n");
    for r in TABLE {
        out.push_str(&format!("| {} | {} | {} |\n", r.code, r.meaning, r.action));
    }
    out
}

/// The man page's EXIT STATUS section, in roff: for each code what
/// happened, what to look at and what to do.
pub fn roff() -> String {
    let mut out = String::from(".SH EXIT STATUS\n");
    for r in TABLE {
        out.push_str(&format!(
            ".TP\n\\fB{}\\fR\n{}.\n.br\n\\fICheck:\\fR {}.\n.br\n\\fIDo:\\fR {}.\n",
            roff_text(r.code),
            roff_text(&upper_first(r.meaning)),
            roff_text(r.check),
            roff_text(r.action)
        ));
    }
    out
}

fn upper_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

/// Markdown's `code` as bold, and the characters roff reads otherwise
/// escaped.
fn roff_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    let mut bold = false;
    for c in s.chars() {
        match c {
            '`' => {
                out.push_str(if bold { "\\fR" } else { "\\fB" });
                bold = !bold;
            }
            '\\' => out.push_str("\\e"),
            '-' => out.push_str("\\-"),
            '\'' => out.push_str("\\(aq"),
            c => out.push(c),
        }
    }
    out
}

/// The class of a failure, which decides the exit code of lockrun.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Usage,
    Unavailable,
    Internal,
    NotExecutable,
    NotFound,
}

impl Class {
    pub fn code(self) -> u8 {
        match self {
            Class::Usage => USAGE,
            Class::Unavailable => UNAVAILABLE,
            Class::Internal => INTERNAL,
            Class::NotExecutable => NOT_EXECUTABLE,
            Class::NotFound => NOT_FOUND,
        }
    }
}

/// An error with the exit code it should end lockrun with.
#[derive(Debug)]
pub struct Failure {
    pub class: Class,
    pub error: anyhow::Error,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

/// Attach an exit class to any fallible step: `step().exit_as(Class::Unavailable)?`.
pub trait ResultExt<T> {
    fn exit_as(self, class: Class) -> Result<T, Failure>;
}

impl<T, E: Into<anyhow::Error>> ResultExt<T> for Result<T, E> {
    fn exit_as(self, class: Class) -> Result<T, Failure> {
        self.map_err(|e| Failure {
            class,
            error: e.into(),
        })
    }
}

/// Build a failure from a message.
pub fn fail(class: Class, msg: impl fmt::Display) -> Failure {
    Failure {
        class,
        error: anyhow::anyhow!("{msg}"),
    }
}

/// How the job's main process ended, as a shell reports it in `$?`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd {
    Exited(i32),
    Signaled(i32),
}

impl JobEnd {
    /// The code a shell would report: the exit code, or 128 + signal number.
    pub fn code(self) -> u8 {
        match self {
            // A process can only report the low 8 bits of its status.
            JobEnd::Exited(code) => (code & 0xff) as u8,
            JobEnd::Signaled(sig) => (128 + (sig & 0x7f)) as u8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_pass_through() {
        assert_eq!(JobEnd::Exited(0).code(), 0);
        assert_eq!(JobEnd::Exited(3).code(), 3);
        assert_eq!(JobEnd::Exited(255).code(), 255);
    }

    #[test]
    fn signals_map_to_128_plus_n() {
        assert_eq!(JobEnd::Signaled(2).code(), 130);
        assert_eq!(JobEnd::Signaled(9).code(), 137);
        assert_eq!(JobEnd::Signaled(15).code(), 143);
    }

    #[test]
    fn failure_classes_map_to_sysexits() {
        assert_eq!(Class::Usage.code(), 64);
        assert_eq!(Class::Unavailable.code(), 69);
        assert_eq!(Class::Internal.code(), 70);
        assert_eq!(Class::NotExecutable.code(), 126);
        assert_eq!(Class::NotFound.code(), 127);
        assert_eq!(NOT_ACQUIRED, 75);
        assert_eq!(LEASE_LOST, 76);
    }

    #[test]
    fn readme_shows_the_exit_code_table() {
        let readme = include_str!("../README.md");
        assert!(
            readme.contains(&markdown()),
            "README's exit code table differs from exit::TABLE; it should read:\n{}",
            markdown()
        );
    }

    #[test]
    fn readme_gives_each_commands_codes() {
        let readme = include_str!("../README.md");
        assert!(
            readme.contains(&commands_markdown()),
            "README's exit codes of the commands differ from exit::COMMAND_CODES; they \
             should read:\n{}",
            commands_markdown()
        );
    }

    #[test]
    fn every_code_is_in_the_table() {
        for code in [NOT_ACQUIRED, LEASE_LOST, USAGE, UNAVAILABLE, INTERNAL] {
            assert!(
                TABLE.iter().any(|r| r.code.starts_with(&code.to_string())),
                "{code}"
            );
        }
        assert!(
            TABLE
                .iter()
                .any(|r| r.code.contains(&NOT_FOUND.to_string()))
        );
        assert!(
            TABLE
                .iter()
                .any(|r| r.code.contains(&NOT_EXECUTABLE.to_string()))
        );
    }

    #[test]
    fn failures_keep_their_class() {
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("boom"));
        let f = r.exit_as(Class::Unavailable).unwrap_err();
        assert_eq!(f.class.code(), 69);
        assert_eq!(f.to_string(), "boom");
    }
}
