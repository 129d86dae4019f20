//! The change-data-capture source against the suites' PostgreSQL server
//! (`wal_level = logical`), on 127.0.0.1.

#![allow(clippy::unwrap_used)]

mod exactly_once;
mod example;
mod pipeline;
mod process;
mod snapshot;
mod source;
mod support;
mod tls;
mod wal_level;
