//! The HTTP sink against servers on loopback: the fault-injecting server
//! of `etl-test-support` and real receivers.

// Test helpers may unwrap: a panic there is a failed test.
#![allow(clippy::unwrap_used)]

mod answers;
mod bulk;
mod clickhouse;
mod faults;
mod http2;
mod limits;
mod pipeline;
mod secrets;
mod support;
mod tls;
mod victoria;
