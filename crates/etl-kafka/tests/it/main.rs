//! The integration tests of `etl-kafka`, one binary: each module is a
//! suite against the test broker (`support`), which every module shares.

mod support;

mod broker;
mod commit_deadline;
mod consumer_options;
mod group_source;
mod handover;
mod kafka_to_kafka;
mod sink;
mod stalled_partition;
