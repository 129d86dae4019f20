//! Kafka connector: a consumer-group source and a producer sink.
//!
//! * [`KafkaSource`] is one member of a consumer group, as a
//!   [`Source`](etl_source::Source). Rebalances become assignment events;
//!   a revocation drains and commits the revoked partitions *inside* the
//!   rebalance callback (through a [`RevokeHandler`], the checkpointer), so
//!   the next owner starts exactly at the committed offsets. Replays seek,
//!   backpressure pauses partitions, and polling never stops, so the
//!   member stays in the group however slow the pipeline is.
//! * [`GroupOffsetStore`] keeps the checkpointer's offsets in the group
//!   (synchronous commits; auto-commit is always off).
//! * [`KafkaSink`] is a producer with `acks=all` and idempotence, as a
//!   [`Sink`](etl_sink::Sink): a batch is written only when every delivery
//!   report succeeded; failures are [classified](fn@classify) retryable,
//!   the record's fault (a dead letter) or the environment's (the pipeline
//!   halts); keys and headers are carried over and each message gets
//!   the record's idempotency key as the `etl-idempotency-key` header.
//! * A broker that refuses a client's SASL login or TLS handshake is no
//!   outage: the client gives up with [`KafkaError::Refused`] (a
//!   configuration error naming the broker and the mechanism or TLS
//!   problem) instead of reconnecting forever; the source's
//!   [`next`](etl_source::Source::next) returns it as
//!   [`SourceError::Config`](etl_source::SourceError::Config), the sink's
//!   writes as a permanent error.
//! * [`PartitionMap`] maps `(topic, partition)` to
//!   [`PartitionId`](etl_record::PartitionId) by the topic's name and the
//!   partition number alone (a hash of the name above bit 16, the Kafka
//!   partition below), so the order of `topics` never matters.
//!
//! librdkafka is built from source with the crate (no system library).
//! See `docs/kafka.md` for configuration, rebalance and commit behaviour
//! and how the tests get a broker.
//!
//! # Example
//!
//! Building the clients does not contact the broker; a member joins its
//! group when started.
//!
//! ```
//! use etl_kafka::{KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
//! use etl_record::SourceId;
//!
//! let mut config = KafkaSourceConfig::new(
//!     "127.0.0.1:9092",
//!     "orders-pipeline",
//!     vec!["orders".to_owned(), "refunds".to_owned()],
//! );
//! config.session_timeout = std::time::Duration::from_secs(6);
//! let source = KafkaSource::new(SourceId::new("orders"), config)?;
//!
//! // Partition 3 of `refunds`: its id depends on the name and the number
//! // only, whatever the order of the topics.
//! let map = source.partition_map();
//! let id = map.id("refunds", 3)?;
//! assert_eq!(id.0 & 0xffff, 3);
//! assert_eq!(map.topic_partition(id)?, ("refunds", 3));
//!
//! // The group is the offset store; the checkpointer commits through it.
//! let _store = source.offset_store();
//! // ...spawn the checkpointer with it, then `source.start(handle)` and
//! // hand the source to the source driver.
//!
//! let sink = KafkaSink::new(KafkaSinkConfig::new("127.0.0.1:9092", "orders-copy"))?;
//! assert_eq!(sink.config().idempotency_header, "etl-idempotency-key");
//! # Ok::<(), etl_kafka::KafkaError>(())
//! ```

mod checkpoint;
mod classify;
mod config;
mod context;
mod error;
mod mapping;
mod native;
mod offsets;
mod outage;
mod pauses;
mod poll_thread;
mod refusal;
mod sink;
mod source;

pub use classify::{ErrorClass, classify};
pub use config::{KafkaProperties, KafkaSinkConfig, KafkaSourceConfig, is_secret_property};
pub use context::RevokeHandler;
pub use error::KafkaError;
pub use mapping::PartitionMap;
pub use offsets::GroupOffsetStore;
pub use refusal::Refusal;
pub use sink::KafkaSink;
pub use source::KafkaSource;
