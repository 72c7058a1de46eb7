//! Integration tests: the real lockrun binary against real redis-server
//! processes and real lock files. One crate of modules, shared helpers.

mod support;

mod admit;
mod cluster;
mod conformance;
mod docs;
mod etcd;
mod faults;
mod generated;
mod groups;
mod input;
mod kernel;
mod local;
mod minhold;
mod modes;
mod mysql;
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
