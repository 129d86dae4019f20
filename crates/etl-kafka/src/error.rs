//! The crate's error type.

use etl_record::{IdempotencyKey, PartitionId};
use rdkafka::error::KafkaError as ClientError;

/// What went wrong in the Kafka connector, with the topic, partition or
/// setting it concerns.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// librdkafka refused a call; `action` says which.
    #[error("kafka: {action}: {source}")]
    Client {
        /// What the connector was doing, e.g. "creating the consumer".
        action: String,
        /// The client's error.
        #[source]
        source: Box<ClientError>,
    },
    /// A configuration value is missing or out of range, or librdkafka
    /// refuses it. The message never holds the value of a secret.
    #[error("kafka configuration: `{key}`: {message}")]
    Config {
        /// The setting, as named in the configuration.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A topic that is not one of the source's topics.
    #[error("kafka: topic `{topic}` is not consumed by this source")]
    UnknownTopic {
        /// The topic name.
        topic: String,
    },
    /// A Kafka partition number that does not fit the partition mapping.
    #[error(
        "kafka: partition {partition} of topic `{topic}` is outside the supported range 0..{max}"
    )]
    PartitionOutOfRange {
        /// The topic name.
        topic: String,
        /// The Kafka partition number.
        partition: i32,
        /// The first partition number that does not fit.
        max: i32,
    },
    /// A [`PartitionId`] that maps to no topic of the source.
    #[error("kafka: partition id {partition} maps to no topic of this source")]
    UnmappedPartition {
        /// The partition id.
        partition: PartitionId,
    },
    /// A partition id of the mapping by topic index that earlier versions
    /// used (stored progress written by one of them). Applied now, it
    /// could name another partition.
    #[error(
        "kafka: stored progress names partition id {partition}, of the mapping by topic index of \
         earlier versions (reordering `topics` moved it to other partitions); refusing to apply it. \
         See docs/kafka.md, \"Partition ids\", for how to move on"
    )]
    LegacyPartitionId {
        /// The partition id.
        partition: PartitionId,
    },
    /// Committing offsets to the consumer group failed.
    #[error("kafka: committing offsets {offsets} to group `{group}`: {source}")]
    Commit {
        /// The consumer group.
        group: String,
        /// The offsets, as `topic/partition@offset` items.
        offsets: String,
        /// The client's error.
        #[source]
        source: Box<ClientError>,
    },
    /// The group coordinator did not answer a commit in time (the broker
    /// is unreachable, or the coordinator is moving). The previous commit
    /// stands.
    #[error(
        "kafka: committing offsets {offsets} to group `{group}`: no answer from the group coordinator within {timeout:?}"
    )]
    CommitTimedOut {
        /// The consumer group.
        group: String,
        /// The offsets, as `topic/partition@offset` items.
        offsets: String,
        /// The commit timeout.
        timeout: std::time::Duration,
    },
    /// A record could not be produced, or its delivery report says it
    /// failed.
    #[error("kafka: producing record {key} to topic `{topic}`: {source}")]
    Produce {
        /// The destination topic.
        topic: String,
        /// The record's idempotency key.
        key: IdempotencyKey,
        /// The client's error.
        #[source]
        source: Box<ClientError>,
    },
    /// The background thread that polls the consumer has stopped.
    #[error("kafka: the consumer's poll thread has stopped")]
    PollThreadStopped,
    /// A broker refused the client's security settings: its SASL login
    /// or its TLS handshake. No retry fixes that; it is an error of the
    /// configuration. The reason is librdkafka's, without secrets.
    #[error(
        "kafka {client}: broker {broker} {refusal}: {reason}; {}. This is a configuration \
         error: the {client} does not retry it",
        refusal.settings()
    )]
    Refused {
        /// `consumer` or `producer`.
        client: &'static str,
        /// The broker's `host:port`.
        broker: String,
        /// What it refused.
        refusal: crate::Refusal,
        /// librdkafka's reason.
        reason: String,
    },
}

impl KafkaError {
    /// librdkafka refused a call. A refused setting becomes
    /// [`KafkaError::Config`] naming the property but not its value:
    /// the client's own error (its `Display` and `Debug`) carries the
    /// value, which may be a password.
    pub(crate) fn client(action: impl Into<String>, source: ClientError) -> Self {
        match source {
            ClientError::ClientConfig(_, desc, key, value) => {
                let message = if value.is_empty() {
                    desc
                } else {
                    desc.replace(value.as_str(), "***")
                };
                KafkaError::Config {
                    key: format!("properties.\"{key}\""),
                    message: format!("librdkafka refuses it: {message}"),
                }
            }
            source => KafkaError::Client {
                action: action.into(),
                source: Box::new(source),
            },
        }
    }

    /// Whether the error is the configuration's: a setting out of range,
    /// one librdkafka refuses, alone or when creating the client, or
    /// credentials or TLS settings a broker refuses.
    #[must_use]
    pub fn is_configuration(&self) -> bool {
        match self {
            KafkaError::Config { .. } | KafkaError::Refused { .. } => true,
            KafkaError::Client { source, .. } => matches!(
                **source,
                ClientError::ClientCreation(_) | ClientError::ClientConfig(..)
            ),
            _ => false,
        }
    }

    /// A copy of a [`KafkaError::Refused`] (kept once, handed to every
    /// write that meets it); `None` for any other error.
    pub(crate) fn again(&self) -> Option<Self> {
        match self {
            KafkaError::Refused {
                client,
                broker,
                refusal,
                reason,
            } => Some(KafkaError::Refused {
                client,
                broker: broker.clone(),
                refusal: refusal.clone(),
                reason: reason.clone(),
            }),
            _ => None,
        }
    }

    pub(crate) fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        KafkaError::Config {
            key: key.into(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::types::RDKafkaConfRes;

    use super::*;

    #[test]
    fn a_refused_setting_never_carries_its_value() {
        let refused = ClientError::ClientConfig(
            RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
            "Invalid value \"Zq9SecretPw\" for configuration property \"ssl.key.password\""
                .to_owned(),
            "ssl.key.password".to_owned(),
            "Zq9SecretPw".to_owned(),
        );
        assert!(
            format!("{refused:?}").contains("Zq9SecretPw"),
            "the premise"
        );
        let e = KafkaError::client("creating the consumer", refused);
        for shown in [e.to_string(), format!("{e:?}")] {
            assert!(!shown.contains("Zq9SecretPw"), "{shown}");
            assert!(shown.contains("ssl.key.password"), "{shown}");
        }
    }
}
