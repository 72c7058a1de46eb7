//! `lockrun doctor` on an SQL database, as every dialect runs it: the
//! prefix read, the server reached (one question, timed), five round trips
//! that read its clock, then the dialect's own checks (version, role,
//! settings, lockrun's tables and the rights on them). Only reads.

use std::time::Duration;

use crate::backend::doctor::{clock_check, round_trip_check, shown};
use crate::backend::{Check, Error};
use crate::clock::Boot;

/// One dialect's doctor at one database.
pub trait Doctor {
    /// The answer to the first question: who and where.
    type About;

    /// Ask who and where. Err: why the server was not reached, as said;
    /// None: it answered with no row.
    fn about(&mut self) -> Result<Option<Self::About>, String>;
    /// The "reachable" line: the server answered `about` within `took`.
    fn reached(&self, about: &Self::About, took: &str) -> String;
    /// Five round trips that read the server's clock: the slowest, and
    /// the server's clock minus ours.
    fn round_trips(&mut self) -> Result<(Duration, f64), Error>;
    /// The dialect's checks after those.
    fn rest(&mut self, about: Self::About) -> Vec<Check>;
}

/// Every check, in order; `doctor` is the dialect's at the prefix's
/// place, unless the prefix is refused. `op` bounds one request.
pub fn examine<D: Doctor>(doctor: Result<D, Error>, op: Duration) -> Vec<Check> {
    let mut d = match doctor {
        Ok(d) => d,
        Err(e) => return vec![Check::fail("prefix", e.to_string())],
    };
    let started = Boot::now();
    let about = match d.about() {
        Ok(Some(about)) => about,
        Ok(None) => return vec![Check::fail("reachable", "the server answered with no row")],
        Err(what) => return vec![Check::fail("reachable", what)],
    };
    let took = shown(Boot::now().since(started));
    let mut out = vec![Check::ok("reachable", d.reached(&about, &took))];
    match d.round_trips() {
        Ok((worst, offset)) => {
            out.push(round_trip_check(worst, op));
            out.push(clock(offset));
        }
        Err(e) => {
            out.push(Check::fail("round trip", e.to_string()));
            return out;
        }
    }
    out.extend(d.rest(about));
    out
}

/// Leases, windows and tokens count on the server's clock alone.
fn clock(offset: f64) -> Check {
    clock_check(
        offset,
        "leases, --min-hold windows and tokens count on the server's clock alone",
        "leases, --min-hold windows and tokens count on the server's clock alone; a clock that \
         far off is likely not kept by NTP, and a step of the server's clock shortens or \
         lengthens every lease by the step: keep NTP on",
    )
}
