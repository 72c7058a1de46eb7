//! The man page and the shell completions, generated from the command
//! line's definition (`--generate`), committed under `man/` and
//! `completions/`.

use std::io::Write;

use clap::CommandFactory;

use crate::cli::{Cli, Generate};
use crate::exit::{Class, Failure, ResultExt};

/// The man page: clap's sections, then the subcommands, exit status and
/// environment written here (one page; there are no lockrun-status(1) pages).
fn man_page(cmd: clap::Command, out: &mut dyn Write) -> std::io::Result<()> {
    // VERSION is the version alone: the engines `--version` lists after it
    // are the build's, not the page's.
    let man = clap_mangen::Man::new(cmd.long_version(None));
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    out.write_all(MAN_TAIL.as_bytes())?;
    out.write_all(crate::exit::roff().as_bytes())?;
    out.write_all(MAN_ENV.as_bytes())?;
    man.render_version_section(out)
}

const MAN_TAIL: &str = r#".SH COMMANDS
.TP
\fBlockrun status\fR [\fB\-\-json\fR] \fINAME\fR
Show whether NAME is held: every holder (host:pid and \fB\-\-label\fR, token, slot, mode, time left, held for) and the number of waiting requests; says when a holder's lockrun no longer runs on this host, and when a lease is held by \fB\-\-min\-hold\fR after its job ended (no job running, until when). Exit 0 held, 1 free, 69 unreachable.
.TP
\fBlockrun status\fR [\fB\-\-json\fR], \fBlockrun list\fR [\fB\-\-json\fR]
Every name under the prefix, one line each, sorted (\fB\-\-json\fR: an array of the objects \fBstatus \-\-json\fR \fINAME\fR prints). Read name by name (Redis: SCAN, never KEYS), not as one snapshot (PostgreSQL: one statement over its tables, a snapshot), within bounds of names and time; never disturbs a lock. Exit 0 when any is held, 1 when none, 64 on an engine that cannot list, 69 unreachable.
.TP
\fBlockrun doctor\fR [\fB\-\-url\fR \fIURL\fR]
Read-only checks of an engine, one line each: \fBok\fR, \fBwarn\fR or \fBfail\fR and what to do (Redis, each master of a cluster on its own: round trip, version, maxmemory-policy, persistence, replicas, the user's permissions, clock; local: the directory's owner, mode, link, file system; etcd: round trip, version, leader, permissions; PostgreSQL: round trip, clock, version, standby, a transaction pooler, isolation and timeouts, standbys, lockrun's tables and the role's rights on them or to create them). It writes no key, file, directory, table or schema. Exit 0 all ok, 1 a warning, 69 unreachable or a failure.
.TP
\fBlockrun release \-\-force\fR [\fB\-\-token\fR \fIT\fR] [\fB\-\-now\fR] \fINAME\fR
Break a lease (operators), on the engines that can (README \(lqBackends\(rq). By default the holder is revoked: its job is stopped at its next renewal and new grants wait until the old lease would have expired. \fB\-\-now\fR deletes at once (unsafe without fencing); \fB\-\-token\fR acts only on the holder with that token, else every holder is broken. A lease kept by \fB\-\-min\-hold\fR after its job ended runs no job: it is ended at once, on every engine, the local one included. Exit 0 broken, 1 not held, already revoked or token mismatch, 64 not supported by the engine (a running local lock), 69 unreachable.
"#;

/// The man page after EXIT STATUS.
const MAN_ENV: &str = r#".SH ENVIRONMENT
.TP
\fBLOCKRUN_URL\fR, \fBLOCKRUN_TTL\fR, \fBLOCKRUN_PREFIX\fR, \fBLOCKRUN_TLS_CA\fR, \fBLOCKRUN_LABEL\fR, \fBLOCKRUN_METRICS_FILE\fR
Defaults for \fB\-\-url\fR, \fB\-\-ttl\fR, \fB\-\-prefix\fR, \fB\-\-tls\-ca\fR, \fB\-\-label\fR and \fB\-\-metrics\-file\fR (not passed on to the job). A setting only one engine uses is ignored by the others. Give a password through LOCKRUN_URL rather than \fB\-\-url\fR: the command line is visible to every user.
.PP
The job sees, set over its inherited environment:
.TP
\fBLOCKRUN_NAME\fR
The lock's name.
.TP
\fBLOCKRUN_TOKEN\fR
The fencing token, decimal, strictly increasing with every grant of the name.
.TP
\fBLOCKRUN_OWNER\fR
host:pid of the lockrun that holds the lease.
.TP
\fBLOCKRUN_TTL_MS\fR
The lease length in milliseconds.
.TP
\fBLOCKRUN_SLOT\fR
With \fB\-\-limit\fR N: the slot held, 0 to N\-1, unique among the holders of the moment.
.TP
\fBLOCKRUN_LOCK_FD\fR
The locked descriptor it inherited (local backend only).
.PP
A LOCKRUN_URL that carries a password is removed from the job's environment.
"#;

pub fn generate(kind: Generate) -> Result<(), Failure> {
    use clap_complete::Shell;
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    let shell = match kind {
        Generate::Man => return man_page(cmd, &mut out).exit_as(Class::Internal),
        Generate::Bash => Shell::Bash,
        Generate::Zsh => Shell::Zsh,
        Generate::Fish => Shell::Fish,
        Generate::Elvish => Shell::Elvish,
        Generate::Powershell => Shell::PowerShell,
    };
    clap_complete::generate(shell, &mut cmd, "lockrun", &mut out);
    Ok(())
}
