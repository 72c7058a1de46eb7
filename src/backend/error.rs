//! The one error every engine returns, named by what went wrong rather than
//! by exit code; `From<Error> for Failure` below is the only place an
//! engine's failure becomes an exit class (lockrun(1) "EXIT STATUS").

use std::fmt;

use crate::exit::{Class, Failure, fail};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The request cannot be served as asked, whatever the server does: a
    /// bad address or name, a mode that disagrees with the holders, a
    /// nested request. Nothing was started (64).
    Request(String),
    /// Worth trying again: a lost connection, a timeout, a server that is
    /// loading or failing over. Each engine's own table says which of its
    /// errors these are; once retrying is over it ends lockrun like
    /// `Refused` (69).
    Transient(String),
    /// The server is full: every connection it allows (to all, to this
    /// user, or from this address) is taken, and its text names the
    /// limit. An outage, not a refusal: a holder's renewal retries it on
    /// schedule, a waiter rides it out without spending its retry budget,
    /// and a wait that ends meanwhile ends as a busy name does (75).
    Full(String),
    /// The engine answered for good: credentials refused, an ACL denial, a
    /// key or file that is not ours, a directory lockrun may not use (69).
    Refused(String),
    /// The engine answered something lockrun does not understand, or the
    /// system failed under us (70).
    Internal(String),
}

impl Error {
    /// Whether trying the same request again may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Transient(_) | Error::Full(_))
    }

    /// Whether the server refused a connection for want of a free one.
    pub fn is_full(&self) -> bool {
        matches!(self, Error::Full(_))
    }

    /// The same error with what was being done in front of its text.
    pub fn doing(self, what: impl fmt::Display) -> Error {
        let with = |m: String| format!("{what}: {m}");
        match self {
            Error::Request(m) => Error::Request(with(m)),
            Error::Transient(m) => Error::Transient(with(m)),
            Error::Full(m) => Error::Full(with(m)),
            Error::Refused(m) => Error::Refused(with(m)),
            Error::Internal(m) => Error::Internal(with(m)),
        }
    }

    fn text(&self) -> &str {
        match self {
            Error::Request(m)
            | Error::Transient(m)
            | Error::Full(m)
            | Error::Refused(m)
            | Error::Internal(m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

impl std::error::Error for Error {}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let class = match e {
            Error::Request(_) => Class::Usage,
            Error::Transient(_) | Error::Full(_) | Error::Refused(_) => Class::Unavailable,
            Error::Internal(_) => Class::Internal,
        };
        fail(class, e.text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_ends_lockrun_with_its_documented_code() {
        for (e, code) in [
            (Error::Request("r".into()), crate::exit::USAGE),
            (Error::Transient("t".into()), crate::exit::UNAVAILABLE),
            (Error::Full("m".into()), crate::exit::UNAVAILABLE),
            (Error::Refused("f".into()), crate::exit::UNAVAILABLE),
            (Error::Internal("i".into()), crate::exit::INTERNAL),
        ] {
            let f = Failure::from(e.doing("acquiring x"));
            assert_eq!(f.class.code(), code);
            assert!(f.to_string().starts_with("acquiring x: "), "{f}");
        }
    }
}
