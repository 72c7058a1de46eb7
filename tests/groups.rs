//! The concurrency groups: `--max-waiters`, `--supersede` and `--preempt`.
//! What every engine promises of them is in the conformance suite; here
//! are the attacks on them, run on every engine (`attacks.rs`), and what
//! each engine does beyond that: where it keeps the marks, how soon a
//! replaced waiter hears, and what tables or scripts of an older lockrun
//! read beside them (one file per engine).

mod attacks;
mod etcd;
mod local;
mod mysql;
mod postgres;
mod redis;
mod zookeeper;
