//! Kafka connector (work in progress).

mod classify;
mod config;
mod context;
mod error;
mod mapping;
mod offsets;
mod poll_thread;
mod sink;
mod source;

pub use classify::{ErrorClass, classify};
pub use config::{KafkaSinkConfig, KafkaSourceConfig};
pub use context::RevokeHandler;
pub use error::KafkaError;
pub use mapping::PartitionMap;
pub use offsets::GroupOffsetStore;
pub use sink::KafkaSink;
pub use source::KafkaSource;
