//! The doctor's checks every engine makes the same way, written once: the
//! round trip against the bound on one request, the server's clock against
//! ours, and how a duration is shown.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::clock::Boot;

/// How a `lockrun doctor` check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One line of `lockrun doctor`: what was checked, how it came out, and
/// (unless ok) what to do. Never carries a secret.
#[derive(Debug, Clone)]
pub struct Check {
    pub verdict: Verdict,
    pub topic: &'static str,
    pub said: String,
}

impl Check {
    pub fn new(verdict: Verdict, topic: &'static str, said: impl Into<String>) -> Check {
        Check {
            verdict,
            topic,
            said: said.into(),
        }
    }
    pub fn ok(topic: &'static str, said: impl Into<String>) -> Check {
        Check::new(Verdict::Ok, topic, said)
    }
    pub fn warn(topic: &'static str, said: impl Into<String>) -> Check {
        Check::new(Verdict::Warn, topic, said)
    }
    pub fn fail(topic: &'static str, said: impl Into<String>) -> Check {
        Check::new(Verdict::Fail, topic, said)
    }
}

/// How many round trips a server is timed by.
const SAMPLES: usize = 5;

/// A duration as the doctor shows it: to the microsecond.
pub fn shown(d: Duration) -> String {
    crate::text::duration(Duration::from_micros(d.as_micros() as u64)).to_string()
}

/// What the timed round trips found.
pub struct Timed {
    /// How many were answered.
    pub answered: u32,
    /// The slowest (what a renewal must live with).
    pub worst: Option<Duration>,
    /// The server's clock minus this host's, in seconds, from the fastest
    /// (its reading sits closest to the middle of its round trip).
    pub offset: Option<f64>,
}

/// Time up to five round trips of `read`, which asks the server for its
/// clock (seconds since the epoch). The first failure ends them; it comes
/// back beside what the ones before it found.
pub fn time_round_trips<E>(mut read: impl FnMut() -> Result<f64, E>) -> (Timed, Option<E>) {
    let mut t = Timed {
        answered: 0,
        worst: None,
        offset: None,
    };
    let mut best: Option<Duration> = None;
    for _ in 0..SAMPLES {
        let before = wall();
        let sent = Boot::now();
        let server = match read() {
            Ok(s) => s,
            Err(e) => return (t, Some(e)),
        };
        let rtt = Boot::now().since(sent);
        t.answered += 1;
        t.worst = Some(t.worst.map_or(rtt, |w| w.max(rtt)));
        if best.is_none_or(|b| rtt < b) {
            best = Some(rtt);
            t.offset = Some(server - (before + rtt.as_secs_f64() / 2.0));
        }
    }
    (t, None)
}

/// This host's wall clock, in seconds since the epoch.
fn wall() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The verdict on a round trip measured against the bound on one request
/// (the op budget): ok well within it, a warning when it eats a good part
/// of it, a failure past it.
pub fn round_trip_check(rtt: Duration, op: Duration) -> Check {
    let said = format!(
        "{} (the bound on one request with the default ttl of 30s is {})",
        shown(rtt),
        shown(op)
    );
    if rtt > op {
        Check::fail(
            "round trip",
            format!("{said}: every renewal would time out; bring lockrun closer to the server"),
        )
    } else if rtt > op / 4 {
        Check::warn(
            "round trip",
            format!("{said}: little room for a slow moment; use a longer --ttl or a closer server"),
        )
    } else {
        Check::ok("round trip", said)
    }
}

/// The verdict on the server's clock minus ours (`offset`, in seconds): a
/// second or more apart warns, as no clock kept by NTP is. `note` says,
/// when they agree, what the engine counts on the server's clock for;
/// `advice`, when they do not, what that risks and what to do.
pub fn clock_check(offset: f64, note: &str, advice: &str) -> Check {
    // Any offset, however absurd (a server's clock decades off, or not a
    // number), is shown rather than overflowing a Duration.
    let size = if offset.is_finite() {
        shown(Duration::from_secs_f64(offset.abs().min(1e9)))
    } else {
        "an unknown time".into()
    };
    let side = if offset >= 0.0 { "ahead of" } else { "behind" };
    let said = format!("the server's clock is {size} {side} this host's");
    if offset.abs() < 1.0 {
        Check::ok("clock", format!("{said} ({note})"))
    } else {
        Check::warn("clock", format!("{said}: {advice}"))
    }
}

/// What a server's connection limit for lockrun's user (`limit`, as
/// `what` says it) means for a fleet on one name, on the SQL engines: a
/// queue holds the connections of the waiters nearest its front
/// (`plan::NEAR`) and two per holder however long it is, plus the few of
/// the waiters further back keeping their places at that moment.
pub fn fleet_check(limit: i64, what: &str) -> Check {
    let near = crate::backend::plan::NEAR as i64;
    // The near waiters, one holder's two, and as many again for the
    // waiters keeping their places and the server's other clients.
    let room = 2 * (near + 2);
    if limit >= room {
        Check::ok(
            "connections",
            format!(
                "{what}: a queue on one name holds at most {near} waiters' connections \
                 and 2 per holder, however many wait, so a fleet of any size fits"
            ),
        )
    } else {
        Check::warn(
            "connections",
            format!(
                "{what}: a queue on one name holds up to {near} waiters' connections and \
                 2 per holder, with the server's other clients beside them; with fewer \
                 than {room}, a long queue's waiters find the server full and wait for a \
                 connection, and among those the order is who gets one first; raise it"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Verdict;

    #[test]
    fn clocks_a_second_apart_warn_and_any_offset_is_shown() {
        assert_eq!(clock_check(0.004, "n", "a").verdict, Verdict::Ok);
        assert_eq!(clock_check(-2.5, "n", "a").verdict, Verdict::Warn);
        let far = clock_check(1e300, "n", "a");
        assert_eq!(far.verdict, Verdict::Warn);
        assert!(far.said.contains("ahead of"), "{}", far.said);
        assert_eq!(clock_check(f64::NAN, "n", "a").verdict, Verdict::Warn);
    }

    #[test]
    fn round_trips_stop_at_the_first_failure() {
        let mut n = 0;
        let (t, e) = time_round_trips(|| {
            n += 1;
            if n == 3 { Err("no") } else { Ok(wall()) }
        });
        assert_eq!((t.answered, e), (2, Some("no")));
        assert!(t.worst.is_some() && t.offset.unwrap().abs() < 1.0);
        let (t, e) = time_round_trips(|| Ok::<_, ()>(wall() + 5.0));
        assert_eq!((t.answered, e), (5, None));
        assert!(t.offset.unwrap() > 4.0);
    }
}
