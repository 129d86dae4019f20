//! The integration tests of `etl-postgres`, one binary: each module is a
//! suite against a real PostgreSQL server (`support`), which every module
//! shares.

mod support;

mod exactly_once;
mod outage;
mod secrets;
mod sink;
mod tls;
