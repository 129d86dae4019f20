//! How Kafka's `(topic, partition)` pairs map to [`PartitionId`]s.
//!
//! A source reads one or more topics, listed in its configuration. The
//! topic at index `t` of that list and its Kafka partition `p` map to
//! `PartitionId((t << 20) | p)`. With a single topic (index 0) the id is
//! just the Kafka partition number, which is what logs and metrics show.
//! Up to 4096 topics of up to 1,048,576 partitions each fit.
//!
//! The mapping only has to be stable within one process: committed
//! offsets live in the consumer group under the topic's name and Kafka
//! partition number, never under the id, so reordering the topic list
//! between runs is harmless.

use etl_record::PartitionId;

use crate::KafkaError;

/// Bits of a [`PartitionId`] that hold the Kafka partition number.
const PARTITION_BITS: u32 = 20;
/// Kafka partition numbers from this one on do not fit.
pub(crate) const MAX_PARTITIONS: i32 = 1 << PARTITION_BITS;
/// Topics from this index on do not fit.
const MAX_TOPICS: usize = 1 << (32 - PARTITION_BITS);

/// The topics of one source and the partition mapping over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionMap {
    topics: Vec<String>,
}

impl PartitionMap {
    /// A mapping over `topics`, in order. Fails on an empty list, a
    /// duplicate topic or more than 4096 topics.
    pub fn new(topics: Vec<String>) -> Result<Self, KafkaError> {
        if topics.is_empty() {
            return Err(KafkaError::config(
                "topics",
                "at least one topic is required",
            ));
        }
        if topics.len() > MAX_TOPICS {
            return Err(KafkaError::config(
                "topics",
                format!(
                    "at most {MAX_TOPICS} topics per source, got {}",
                    topics.len()
                ),
            ));
        }
        for (i, topic) in topics.iter().enumerate() {
            if topic.is_empty() {
                return Err(KafkaError::config("topics", "a topic name is empty"));
            }
            if topics[..i].contains(topic) {
                return Err(KafkaError::config(
                    "topics",
                    format!("topic `{topic}` is listed twice"),
                ));
            }
        }
        Ok(PartitionMap { topics })
    }

    /// The topics, in mapping order.
    #[must_use]
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// The id of Kafka partition `partition` of `topic`.
    pub fn id(&self, topic: &str, partition: i32) -> Result<PartitionId, KafkaError> {
        let index = self.topics.iter().position(|t| t == topic).ok_or_else(|| {
            KafkaError::UnknownTopic {
                topic: topic.to_owned(),
            }
        })?;
        if !(0..MAX_PARTITIONS).contains(&partition) {
            return Err(KafkaError::PartitionOutOfRange {
                topic: topic.to_owned(),
                partition,
                max: MAX_PARTITIONS,
            });
        }
        // Both fit by the checks above: index < 4096, partition < 2^20.
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        let partition = partition.unsigned_abs();
        Ok(PartitionId((index << PARTITION_BITS) | partition))
    }

    /// The topic and Kafka partition number of `id`.
    pub fn topic_partition(&self, id: PartitionId) -> Result<(&str, i32), KafkaError> {
        let index = (id.0 >> PARTITION_BITS) as usize;
        let topic = self
            .topics
            .get(index)
            .ok_or(KafkaError::UnmappedPartition { partition: id })?;
        let partition = i32::try_from(id.0 & (MAX_PARTITIONS.unsigned_abs() - 1))
            .map_err(|_| KafkaError::UnmappedPartition { partition: id })?;
        Ok((topic, partition))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(topics: &[&str]) -> PartitionMap {
        PartitionMap::new(topics.iter().map(|t| (*t).to_owned()).collect()).expect("valid topics")
    }

    #[test]
    fn single_topic_ids_are_partition_numbers() {
        let m = map(&["orders"]);
        assert_eq!(m.id("orders", 0).expect("mapped"), PartitionId(0));
        assert_eq!(m.id("orders", 7).expect("mapped"), PartitionId(7));
        assert_eq!(
            m.topic_partition(PartitionId(7)).expect("mapped"),
            ("orders", 7)
        );
    }

    #[test]
    fn topic_index_is_encoded_above_the_partition() {
        let m = map(&["a", "b", "c"]);
        let id = m.id("c", 5).expect("mapped");
        assert_eq!(id, PartitionId((2 << 20) | 5));
        assert_eq!(m.topic_partition(id).expect("mapped"), ("c", 5));
        for topic in ["a", "b", "c"] {
            for p in [0, 1, MAX_PARTITIONS - 1] {
                let id = m.id(topic, p).expect("mapped");
                assert_eq!(m.topic_partition(id).expect("mapped"), (topic, p));
            }
        }
    }

    #[test]
    fn out_of_range_and_unknown_are_errors() {
        let m = map(&["a"]);
        assert!(matches!(m.id("b", 0), Err(KafkaError::UnknownTopic { .. })));
        assert!(matches!(
            m.id("a", -1),
            Err(KafkaError::PartitionOutOfRange { partition: -1, .. })
        ));
        assert!(matches!(
            m.id("a", MAX_PARTITIONS),
            Err(KafkaError::PartitionOutOfRange { .. })
        ));
        assert!(matches!(
            m.topic_partition(PartitionId(1 << 20)),
            Err(KafkaError::UnmappedPartition { .. })
        ));
    }

    #[test]
    fn bad_topic_lists_are_rejected() {
        assert!(PartitionMap::new(vec![]).is_err());
        assert!(PartitionMap::new(vec!["a".into(), "a".into()]).is_err());
        assert!(PartitionMap::new(vec![String::new()]).is_err());
    }
}
