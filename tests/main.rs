//! Integration tests: the real lockrun binary against real servers (each
//! started by the test, see `support/`) and real lock files. One crate of
//! modules, one module per concern:
//!
//! - `conformance`: what every engine promises, run on each engine;
//! - `groups`, `minhold`, `modes`: the options that shape who holds
//!   (`--max-waiters`/`--supersede`/`--preempt`, `--min-hold`, `-s` and
//!   `--limit`), with what each engine keeps for them;
//! - `operators`: `status`, `release`, `doctor`, metrics, logging levels;
//! - `secrets`, `input`, `network`, `refused`: passwords, bad input, the
//!   network at fault, a renewal refused;
//! - `supervision`, `terminal`, `kernel`: the job under lockrun, its
//!   signals, its terminal, kernels without pidfds;
//! - `switching`, `docs`, `generated`, `package`: users coming from
//!   flock, and what is shipped beside the binary;
//! - one file per engine (`local`, `redis`, `sentinel`, `cluster`, `etcd`,
//!   `postgres`, `mysql`, `zookeeper`) for what is that engine's alone,
//!   its attacks beside it;
//! - `fleet`: more lockruns on one name than the server has connections;
//! - `admit`, `props`, `torture`: the admission table against the Redis
//!   script, random inputs, and safety under faults.

mod support;

mod admit;
mod cluster;
mod conformance;
mod docs;
mod etcd;
mod fleet;
mod generated;
mod groups;
mod input;
mod kernel;
mod local;
mod minhold;
mod modes;
mod mysql;
mod network;
mod operators;
mod package;
mod postgres;
mod props;
mod redis;
mod refused;
mod secrets;
mod sentinel;
mod supervision;
mod switching;
mod terminal;
mod torture;
mod zookeeper;
