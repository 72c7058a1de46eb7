//! The scripts' replies, read by position once, here, into types: what each
//! position means is written beside each script in `scripts.rs`.

use std::time::Duration;

use redis::Value;

use crate::backend::{Broken, Error, Holder, Mode, Status};

/// An integer in a script's reply array (Lua numbers come back as integers,
/// stored hash fields as strings).
fn int_at(v: &[Value], i: usize) -> Option<i64> {
    match v.get(i) {
        Some(Value::Int(n)) => Some(*n),
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// A string in a script's reply array.
fn text_at(v: &[Value], i: usize) -> Option<String> {
    match v.get(i) {
        Some(Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

fn mode_from(code: Option<&str>, limit: Option<i64>) -> Mode {
    let limit = limit.map(|n| n.clamp(1, i64::from(u32::MAX)) as u32);
    Mode::from_code(code.unwrap_or("x"), limit)
}

/// What the acquire script answered.
#[derive(Debug)]
pub enum Acquire {
    Granted {
        token: u64,
        /// With `--limit`: the place held.
        slot: Option<u32>,
    },
    /// Held, and this request does not queue (`-n`).
    Busy { holder: Option<String> },
    /// In the queue. A waiter only keeping its place hears no holder and no
    /// arrival number.
    Queued {
        holder: Option<String>,
        /// When the soonest holder's lease runs out on its own.
        holder_ends_in: Option<Duration>,
        arrival: Option<i64>,
    },
    /// The holders in force hold the name in this other mode.
    Disagrees(Mode),
    /// The outer lockrun holds the name.
    Nested,
    /// Out of the queue: a newer `--supersede` request, shown so, replaced us.
    Replaced { by: String },
    /// Not queued (`--max-waiters`): this many requests wait already.
    QueueFull { waiting: u64 },
}

impl Acquire {
    pub fn read(v: &[Value], asked: Mode) -> Result<Acquire, Error> {
        let holder = || text_at(v, 1).filter(|l| !l.is_empty());
        Ok(match int_at(v, 0) {
            Some(1) => Acquire::Granted {
                token: int_at(v, 1)
                    .ok_or_else(|| Error::Internal("acquire script returned no token".into()))?
                    as u64,
                slot: int_at(v, 2)
                    .filter(|s| *s >= 0 && matches!(asked, Mode::Limit(_)))
                    .map(|s| s as u32),
            },
            Some(0) => Acquire::Busy { holder: holder() },
            Some(2) => Acquire::Queued {
                holder: holder(),
                holder_ends_in: int_at(v, 2)
                    .filter(|ms| *ms >= 0)
                    .map(|ms| Duration::from_millis(ms as u64)),
                arrival: int_at(v, 3),
            },
            Some(3) => Acquire::Disagrees(mode_from(text_at(v, 1).as_deref(), int_at(v, 2))),
            Some(4) => Acquire::Nested,
            Some(5) => Acquire::Replaced {
                by: text_at(v, 1).unwrap_or_default(),
            },
            Some(6) => Acquire::QueueFull {
                waiting: int_at(v, 1).unwrap_or(0).max(0) as u64,
            },
            _ => return Err(Error::Internal("acquire script: unexpected reply".into())),
        })
    }
}

/// The fields of one holder in the inspect and force scripts' replies.
const ROW: usize = 9;

/// Holders from a reply's rows, starting at `at`.
fn holders_from(v: &[Value], at: usize) -> Vec<Holder> {
    let mut out = Vec::new();
    let mut i = at;
    while i + ROW <= v.len() {
        let mode = mode_from(text_at(v, i + 3).as_deref(), int_at(v, i + 4));
        out.push(Holder {
            label: text_at(v, i).filter(|s| !s.is_empty()),
            token: int_at(v, i + 1).map(|t| t as u64),
            slot: int_at(v, i + 2)
                .filter(|s| *s >= 0 && matches!(mode, Mode::Limit(_)))
                .map(|s| s as u32),
            mode,
            ttl_left: int_at(v, i + 5).map(|ms| Duration::from_millis(ms.max(0) as u64)),
            held_for: int_at(v, i + 6).map(|ms| Duration::from_millis(ms.max(0) as u64)),
            revoked: int_at(v, i + 7) == Some(1),
            min_hold: int_at(v, i + 7) == Some(2),
            preempted_by: text_at(v, i + 8).filter(|s| !s.is_empty()),
        });
        i += ROW;
    }
    out
}

/// The inspect script's reply: {now ms, waiters, superseding, rows…}.
pub fn status(v: &[Value]) -> Status {
    Status {
        holders: holders_from(v, 3),
        waiters: int_at(v, 1).map(|n| n.max(0) as u64),
        superseding: int_at(v, 2).map(|n| n.max(0) as u64),
    }
}

/// What the renew script answered.
#[derive(Debug, PartialEq)]
pub enum Renewed {
    Yes,
    /// The lease is no longer ours.
    Lost,
    /// Renewed, but a `--preempt` request, shown so, asked it to stop.
    Preempted(String),
}

/// The renew script's reply: {1}, {0} or {2, by}.
pub fn renewed(v: &[Value]) -> Renewed {
    match int_at(v, 0) {
        Some(1) => Renewed::Yes,
        Some(2) => Renewed::Preempted(text_at(v, 1).unwrap_or_default()),
        _ => Renewed::Lost,
    }
}

/// The force script's reply.
pub fn broken(v: &[Value]) -> Broken {
    match int_at(v, 0) {
        Some(0) => Broken::NotHeld,
        Some(2) => Broken::TokenMismatch(
            (1..v.len())
                .filter_map(|i| int_at(v, i).map(|t| t as u64))
                .collect(),
        ),
        Some(3) => Broken::AlreadyRevoked,
        _ => Broken::Leases(holders_from(v, 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn acquire_replies_read_as_the_script_writes_them() {
        let granted = [Value::Int(1), Value::Int(7), Value::Int(2)];
        assert!(matches!(
            Acquire::read(&granted, Mode::Limit(3)).unwrap(),
            Acquire::Granted {
                token: 7,
                slot: Some(2)
            }
        ));
        // A slot means nothing outside --limit.
        assert!(matches!(
            Acquire::read(&granted, Mode::Exclusive).unwrap(),
            Acquire::Granted {
                token: 7,
                slot: None
            }
        ));
        let queued = [Value::Int(2), bulk("h:1"), Value::Int(1500), Value::Int(9)];
        match Acquire::read(&queued, Mode::Exclusive).unwrap() {
            Acquire::Queued {
                holder,
                holder_ends_in,
                arrival,
            } => {
                assert_eq!(holder.as_deref(), Some("h:1"));
                assert_eq!(holder_ends_in, Some(Duration::from_millis(1500)));
                assert_eq!(arrival, Some(9));
            }
            other => panic!("{other:?}"),
        }
        let keeping = [Value::Int(2), bulk(""), Value::Int(-1)];
        assert!(matches!(
            Acquire::read(&keeping, Mode::Exclusive).unwrap(),
            Acquire::Queued {
                holder: None,
                holder_ends_in: None,
                arrival: None
            }
        ));
        let disagrees = [Value::Int(3), bulk("n"), bulk("4")];
        assert!(matches!(
            Acquire::read(&disagrees, Mode::Exclusive).unwrap(),
            Acquire::Disagrees(Mode::Limit(4))
        ));
        let replaced = [Value::Int(5), bulk("h:2 (new)")];
        assert!(matches!(
            Acquire::read(&replaced, Mode::Exclusive).unwrap(),
            Acquire::Replaced { by } if by == "h:2 (new)"
        ));
        let full = [Value::Int(6), Value::Int(3)];
        assert!(matches!(
            Acquire::read(&full, Mode::Exclusive).unwrap(),
            Acquire::QueueFull { waiting: 3 }
        ));
        assert!(Acquire::read(&[Value::Int(9)], Mode::Exclusive).is_err());
    }

    #[test]
    fn status_rows_carry_the_preemption() {
        let row = |by: &str| {
            vec![
                bulk("h:1 (old)"),
                Value::Int(7),
                Value::Int(-1),
                bulk("x"),
                Value::Int(1),
                Value::Int(900),
                Value::Int(100),
                Value::Int(0),
                bulk(by),
            ]
        };
        let mut v = vec![Value::Int(1), Value::Int(3), Value::Int(1)];
        v.extend(row("h:2 (new)"));
        v.extend(row(""));
        let st = status(&v);
        assert_eq!((st.waiters, st.superseding), (Some(3), Some(1)));
        assert_eq!(st.holders.len(), 2);
        assert_eq!(st.holders[0].preempted_by.as_deref(), Some("h:2 (new)"));
        assert_eq!(st.holders[1].preempted_by, None);
        assert_eq!(renewed(&[Value::Int(1)]), Renewed::Yes);
        assert_eq!(renewed(&[Value::Int(0)]), Renewed::Lost);
        assert_eq!(
            renewed(&[Value::Int(2), bulk("h:2 (new)")]),
            Renewed::Preempted("h:2 (new)".into())
        );
    }
}
