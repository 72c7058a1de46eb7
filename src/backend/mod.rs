//! The seam every engine plugs into: a request in, a granted lease out (which
//! owns its renewal, its hand-off to the job and its release), operator views
//! beside it. Engines know names, owners, modes, slots and tokens, nothing of
//! processes; every failure is an `Error` of one kind, which decides the exit code.
//!
//! By part: `model.rs` what the seam speaks of (modes, requests, holders);
//! `engines.rs` the scheme table and addresses, `url_parts.rs` the parts
//! of an address URL several engines write alike; `lease.rs` a granted lease,
//! its renewal and release; `drive.rs` the one acquire loop, which every
//! engine's request goes through, `wait.rs` its clocks (patience, retries,
//! pauses), `quit.rs` leaving the queue on a signal; `admit.rs` who may
//! hold, `table.rs` the same read from a SQL engine's rows; `plan.rs` the
//! rules around it (joining the queue, `release --force`, a place's span,
//! what a waiter watches, the listing loop) as plans the engines carry out;
//! `sql/` the SQL engine its two dialects share; `doctor.rs` the checks
//! every engine shares; `error.rs` the one error type. This file holds the `Engine` trait and
//! the one bounded call on a thread.

pub mod admit;
mod doctor;
mod drive;
mod engines;
mod error;
pub mod etcd;
mod lease;
pub mod local;
mod model;
pub mod mysql;
pub mod plan;
pub mod postgres;
pub mod quit;
pub mod redis;
mod sql;
mod table;
mod url_parts;
pub mod wait;
pub mod zookeeper;

pub use doctor::{Check, Verdict};
pub use engines::*;
pub use error::Error;
pub use lease::{Fresh, Held, Lease, MinHold, Pending, Renewal, Renewer, Renewing};
pub use model::*;
pub use url_parts::*;

use std::time::Duration;

/// One engine at one address.
pub trait Engine: Send {
    /// Take a lease as `req` asks, waiting as `wait` says.
    fn acquire(&mut self, req: &Request, wait: Wait) -> Result<Acquired, Error>;
    /// Every holder of `name` and the number of waiters.
    fn status(&mut self, name: &str) -> Result<Status, Error>;
    /// Break `name`'s holders (lockrun(1) "COMMANDS" says what that means per engine).
    fn force_release(&mut self, name: &str, force: Force) -> Result<Broken, Error>;
    /// Every name under the prefix (sorted, each once), read within
    /// `bound`, with what the listing should say of what was passed over
    /// or cut short.
    fn names(&mut self, bound: ListBound) -> Result<plan::Names, Error>;
    /// What the listing says of one of `names`: its status; a key that is
    /// not lockrun's costs its name a note, not the whole list.
    fn listed(&mut self, name: &str) -> Result<plan::Read, Error> {
        plan::Read::of_status(name, self.status(name))
    }
    /// Every name under the prefix and its state, sorted, read within
    /// `bound` and without disturbing any lock: by default `names`, then
    /// each `listed` in turn (an engine that reads them all at once, or
    /// finds them its own way, says so here).
    fn list(&mut self, bound: ListBound) -> Result<Listing, Error> {
        let plan::Names { names, notes } = self.names(bound)?;
        let names = names.into_iter().map(|n| (n, ()));
        plan::listing(names, bound, notes, plan::NAME_BY_NAME, |name, ()| {
            self.listed(name)
        })
    }
}

/// Run `f` on a thread of its own and wait for it at most `limit`: a server
/// that trickles its replies (each read within its timeout, the whole
/// without end) must not keep lockrun from ending. On time-out the thread is
/// left behind (lockrun exits soon after) and the failure says `doing`.
pub fn bounded<T: Send + 'static>(
    doing: &str,
    limit: Duration,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("lockrun-call".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| Error::Internal(format!("{doing}: cannot start a thread: {e}")))?;
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        Err(Error::Transient(format!(
            "{doing}: no answer within {}",
            crate::text::duration(limit)
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str) -> Result<EngineAt, Error> {
        address(url, &AddressOptions::default())
    }

    #[test]
    fn urls_are_validated() {
        assert_eq!(
            spec("redis://127.0.0.1:6379/2").unwrap().engine.name,
            "Redis"
        );
        assert_eq!(spec("rediss://h#insecure").unwrap().engine.name, "Redis");
        assert_eq!(spec("file:///tmp/x").unwrap().engine.name, "local");
        assert_eq!(spec("").unwrap().engine.name, "local");
        assert_eq!(
            spec("postgresql://u@h/db").unwrap().engine.name,
            "PostgreSQL"
        );
        for bad in [
            "http://h",
            "redis://",
            "redis://h/x",
            "redis://h/4294967295",
            "redis://h/2147483648",
            "redis://h#insecure",
            "nonsense",
            "file://h/x",
        ] {
            let e = spec(bad).unwrap_err();
            assert!(matches!(e, Error::Request(_)), "{bad}: {e}");
        }
        // A CA file on an address without TLS: refused when asked for, ignored
        // when it only came from the environment.
        let ca = |from_env| AddressOptions {
            tls_ca: Some("/ca.pem".into()),
            tls_ca_from_env: from_env,
            ..AddressOptions::default()
        };
        for url in ["redis://h", "file:///tmp/x", ""] {
            assert!(address(url, &ca(false)).is_err(), "{url}");
            assert!(address(url, &ca(true)).is_ok(), "{url}");
        }
        assert!(address("rediss://h", &ca(false)).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn the_url_parser_never_panics(raw in "\\PC{0,40}", scheme in "(redis|rediss|file|http|postgres|postgresql|mysql|mariadb|)(://)?") {
            let url = format!("{scheme}{raw}");
            if let Err(e) = spec(&url) {
                proptest::prop_assert!(matches!(e, Error::Request(_)));
            }
        }

    }

    #[test]
    fn passwords_never_reach_messages() {
        let r = spec("redis://u:s3cret@h:1/0").unwrap();
        assert!(!r.shown().contains("s3cret"), "{}", r.shown());
        assert_eq!(r.secret(), Some("s3cret"));
        let e = spec("redis://u:s3cret@h:1/zz").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let p = spec("postgres://u:s3cret@h/d").unwrap();
        assert!(!p.shown().contains("s3cret"), "{}", p.shown());
        assert_eq!(p.secret(), Some("s3cret"));
        let e = spec("postgres://u:s3cret@h:0/d").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let e = spec("foo://u:s3cret@h").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn engines_add_their_own_name_rules() {
        let redis = spec("redis://h").unwrap();
        assert!(redis.check_name("a{b}").is_err());
        assert!(redis.check_prefix("p{").is_err());
        let local = spec("").unwrap();
        assert!(local.check_name("a{b}").is_ok());
    }

    #[test]
    fn a_ttl_is_rounded_up_to_the_engine_s_step_and_bounded_below() {
        let e = EngineInfo {
            ttl_step: Duration::from_secs(1),
            ttl_min: Duration::from_secs(2),
            ..local::ENGINE
        };
        assert_eq!(
            e.grantable(Duration::from_millis(2001)).unwrap(),
            Duration::from_secs(3)
        );
        assert_eq!(
            e.grantable(Duration::from_secs(2)).unwrap(),
            Duration::from_secs(2)
        );
        let refused = e.grantable(Duration::from_millis(900)).unwrap_err();
        assert!(matches!(refused, Error::Request(_)));
        assert!(
            refused.to_string().contains("smallest lease of 2s"),
            "{refused}"
        );
        assert_eq!(
            redis::ENGINE
                .grantable(Duration::from_millis(1500))
                .unwrap(),
            Duration::from_millis(1500)
        );
    }

    #[test]
    fn modes_agree_as_the_readme_says() {
        assert!(Mode::Exclusive.agrees_with(Mode::Shared));
        assert!(Mode::Shared.agrees_with(Mode::Shared));
        assert!(Mode::Limit(3).agrees_with(Mode::Limit(3)));
        assert!(!Mode::Limit(3).agrees_with(Mode::Limit(4)));
        assert!(!Mode::Limit(3).agrees_with(Mode::Exclusive));
        assert!(!Mode::Shared.agrees_with(Mode::Limit(2)));
    }

    #[test]
    fn modes_survive_their_stored_letters() {
        for m in [
            Mode::Exclusive,
            Mode::Shared,
            Mode::Limit(1),
            Mode::Limit(7),
        ] {
            assert_eq!(Mode::from_code(m.code(), Some(m.limit())), m);
        }
        assert_eq!(Mode::from_code("?", None), Mode::Exclusive);
        assert_eq!(Mode::Limit(3).name(), "limit 3");
    }

    /// An engine that only names its names and reads each one's status.
    struct Named(Vec<&'static str>);

    impl Engine for Named {
        fn acquire(&mut self, _: &Request, _: Wait) -> Result<Acquired, Error> {
            unreachable!("only listed")
        }
        fn status(&mut self, name: &str) -> Result<Status, Error> {
            match name {
                "foreign" => Err(Error::Refused("the key is not a lockrun lease".into())),
                "down" => Err(Error::Transient("gone".into())),
                _ => Ok(Status {
                    waiters: Some(1),
                    ..Status::default()
                }),
            }
        }
        fn force_release(&mut self, _: &str, _: Force) -> Result<Broken, Error> {
            unreachable!("only listed")
        }
        fn names(&mut self, _: ListBound) -> Result<plan::Names, Error> {
            Ok(plan::Names {
                names: self.0.iter().map(|n| n.to_string()).collect(),
                notes: vec!["found".into()],
            })
        }
    }

    #[test]
    fn the_default_listing_reads_name_by_name_and_notes_what_is_not_a_lease() {
        let bound = |names| ListBound {
            names,
            until: crate::clock::Boot::now().add(Duration::from_secs(60)),
        };
        let mut e = Named(vec!["b", "foreign", "a"]);
        let l = e.list(bound(10)).unwrap();
        let listed: Vec<&str> = l.names.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(listed, ["a", "b"]);
        assert_eq!(
            l.notes,
            [
                "found",
                "foreign: left out: the key is not a lockrun lease",
                plan::NAME_BY_NAME
            ]
        );
        let cut = e.list(bound(1)).unwrap();
        assert_eq!(cut.names.len(), 1);
        assert!(cut.notes.contains(&plan::cut_short(1)), "{:?}", cut.notes);
        // Any other failure fails the listing.
        assert!(Named(vec!["a", "down"]).list(bound(10)).is_err());
    }

    #[test]
    fn every_scheme_names_one_engine() {
        let mut seen = std::collections::HashSet::new();
        for e in &ENGINES {
            for s in e.schemes {
                assert!(seen.insert(*s), "{s} twice");
                assert_eq!(engine_for(s).unwrap().name, e.name);
            }
        }
        assert!(engine_for("gopher").is_none());
    }
}
