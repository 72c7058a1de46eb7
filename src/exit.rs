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
    fn failures_keep_their_class() {
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("boom"));
        let f = r.exit_as(Class::Unavailable).unwrap_err();
        assert_eq!(f.class.code(), 69);
        assert_eq!(f.to_string(), "boom");
    }
}
