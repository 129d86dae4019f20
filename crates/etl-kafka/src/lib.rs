//! Kafka connector (work in progress).
