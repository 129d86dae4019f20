//! The end-to-end suites, one binary: each module runs the real `etl`
//! binary (or the public crates from outside) against files, the test
//! broker (`kafka_support`) or a real PostgreSQL server
//! (`postgres_support`). Run one suite with
//! `cargo test -p etl-tests --test it <module>::`.

mod kafka_support;
mod postgres_support;

mod bad_input;
mod crash_loop;
mod fuzz_seeds;
mod kafka_broker_down;
mod kafka_broker_restart;
mod kafka_group_crash;
mod kafka_handover;
mod kafka_lake;
mod kafka_postgres_group;
mod kafka_reassign;
mod kafka_tls;
mod kafka_to_kafka;
mod layers;
mod postgres_crash;
mod postgres_example;
mod postgres_lock;
mod postgres_outage;
mod postgres_rejects;
mod postgres_secrets;
mod torn_writes;
