//! How Kafka's `(topic, partition)` pairs map to [`PartitionId`]s.
//!
//! The id of Kafka partition `p` of topic `t` depends on nothing but the
//! topic's name and `p`: `PartitionId(2^31 | code(t) << 16 | p)`, where
//! `code(t)` is a 15-bit FNV-1a hash of the name. So the order of the
//! `topics` list, and topics added to it or removed from it, never change
//! the id of a partition: progress stored under an id (an exactly-once
//! sink's progress table, the idempotency keys `source/id/offset` of the
//! records) stays with its partition from one run to the next. Topics of
//! one source whose names hash to the same code are refused when the
//! source is built; up to 65,536 partitions per topic fit.
//!
//! Earlier versions used the topic's index in the list instead (`t << 20
//! | p`), which moved stored progress to another partition when the list
//! was reordered. Their ids have the top bit clear, so they are told apart
//! from the current ones: [`PartitionMap::check_stored`] refuses stored
//! progress in that form rather than apply it to the wrong partitions.
//!
//! The consumer group's committed offsets are stored under the topic's
//! name and Kafka partition number, never under the id.

use std::sync::Arc;

use etl_record::PartitionId;

use crate::KafkaError;

/// Bits of a [`PartitionId`] that hold the Kafka partition number.
const PARTITION_BITS: u32 = 16;
/// Kafka partition numbers from this one on do not fit.
pub(crate) const MAX_PARTITIONS: i32 = 1 << PARTITION_BITS;
/// Set in every id of this mapping, and clear in every id of the earlier
/// mapping by topic index (which never had 2048 topics).
const MARK: u32 = 1 << 31;
/// Bits of the topic's code.
const CODE_MASK: u32 = (1 << 15) - 1;

/// The 15-bit code of a topic name: FNV-1a (32 bits), folded. Fixed by
/// this function alone (no hasher of the standard library, whose output
/// may change between releases): ids are stored.
fn topic_code(topic: &str) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in topic.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (hash ^ (hash >> 15) ^ (hash >> 30)) & CODE_MASK
}

/// The topics of one source and the partition mapping over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionMap {
    topics: Vec<String>,
    /// The code of each topic, in the same order.
    codes: Vec<u32>,
    /// Each topic's name as records carry it, in the same order.
    names: Vec<Arc<str>>,
}

impl PartitionMap {
    /// A mapping over `topics`. Fails on an empty list, an empty or
    /// duplicate topic, or two topics whose names hash to the same code
    /// (their partitions would share ids).
    pub fn new(topics: Vec<String>) -> Result<Self, KafkaError> {
        if topics.is_empty() {
            return Err(KafkaError::config(
                "topics",
                "at least one topic is required",
            ));
        }
        let mut codes: Vec<u32> = Vec::with_capacity(topics.len());
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
            let code = topic_code(topic);
            if let Some(other) = codes
                .iter()
                .position(|c| *c == code)
                .and_then(|j| topics.get(j))
            {
                return Err(KafkaError::config(
                    "topics",
                    format!(
                        "topics `{other}` and `{topic}` map to the same partition ids (their names \
                         hash to the same code {code}); read them with two sources"
                    ),
                ));
            }
            codes.push(code);
        }
        let names = topics.iter().map(|t| Arc::from(t.as_str())).collect();
        Ok(PartitionMap {
            topics,
            codes,
            names,
        })
    }

    /// The topics, in the order they were listed (which does not matter
    /// to the mapping).
    #[must_use]
    pub fn topics(&self) -> &[String] {
        &self.topics
    }

    /// The name of the topic `id` belongs to, shared (records carry it as
    /// their [`topic`](etl_record::Record::topic)).
    #[must_use]
    pub fn shared_topic(&self, id: PartitionId) -> Option<Arc<str>> {
        let code = (id.0 >> PARTITION_BITS) & CODE_MASK;
        self.codes
            .iter()
            .position(|c| *c == code)
            .and_then(|i| self.names.get(i))
            .filter(|_| id.0 & MARK != 0)
            .cloned()
    }

    /// The id of Kafka partition `partition` of `topic`.
    pub fn id(&self, topic: &str, partition: i32) -> Result<PartitionId, KafkaError> {
        let code = self
            .topics
            .iter()
            .position(|t| t == topic)
            .and_then(|i| self.codes.get(i).copied())
            .ok_or_else(|| KafkaError::UnknownTopic {
                topic: topic.to_owned(),
            })?;
        if !(0..MAX_PARTITIONS).contains(&partition) {
            return Err(KafkaError::PartitionOutOfRange {
                topic: topic.to_owned(),
                partition,
                max: MAX_PARTITIONS,
            });
        }
        Ok(PartitionId(
            MARK | (code << PARTITION_BITS) | partition.unsigned_abs(),
        ))
    }

    /// The topic and Kafka partition number of `id`.
    pub fn topic_partition(&self, id: PartitionId) -> Result<(&str, i32), KafkaError> {
        if id.0 & MARK == 0 {
            return Err(KafkaError::LegacyPartitionId { partition: id });
        }
        let code = (id.0 >> PARTITION_BITS) & CODE_MASK;
        let topic = self
            .codes
            .iter()
            .position(|c| *c == code)
            .and_then(|i| self.topics.get(i))
            .map(String::as_str)
            .ok_or(KafkaError::UnmappedPartition { partition: id })?;
        let partition = i32::try_from(id.0 & (MAX_PARTITIONS.unsigned_abs() - 1))
            .map_err(|_| KafkaError::UnmappedPartition { partition: id })?;
        Ok((topic, partition))
    }

    /// Check progress stored under partition ids (an exactly-once sink's)
    /// before it is applied: ids of the earlier mapping by topic index
    /// are refused, since they may name other partitions now. Ids of
    /// topics this source no longer reads are fine (they are not used).
    ///
    /// # Errors
    ///
    /// [`KafkaError::LegacyPartitionId`] naming the first such id.
    pub fn check_stored(
        &self,
        ids: impl IntoIterator<Item = PartitionId>,
    ) -> Result<(), KafkaError> {
        match ids.into_iter().find(|id| id.0 & MARK == 0) {
            Some(partition) => Err(KafkaError::LegacyPartitionId { partition }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(topics: &[&str]) -> PartitionMap {
        PartitionMap::new(topics.iter().map(|t| (*t).to_owned()).collect()).expect("valid topics")
    }

    #[test]
    fn reordering_or_adding_topics_keeps_every_partitions_id() {
        let before = map(&["orders", "refunds"]);
        let after = map(&["audit", "refunds", "orders"]);
        for topic in ["orders", "refunds"] {
            for p in [0, 3, MAX_PARTITIONS - 1] {
                assert_eq!(
                    before.id(topic, p).expect("mapped"),
                    after.id(topic, p).expect("mapped"),
                    "{topic}/{p}"
                );
            }
        }
    }

    #[test]
    fn ids_are_fixed_by_name_and_partition() {
        // Stored ids must not change between releases: pin one.
        let m = map(&["orders"]);
        let id = m.id("orders", 7).expect("mapped");
        assert_eq!(id.0 & MARK, MARK);
        assert_eq!(id.0 & 0xffff, 7);
        assert_eq!((id.0 >> 16) & CODE_MASK, topic_code("orders"));
        assert_eq!(topic_code("orders"), 29_265);
    }

    #[test]
    fn ids_map_back_to_their_topic_and_partition() {
        let m = map(&["a", "b", "c"]);
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
        let other = map(&["b"]).id("b", 0).expect("mapped");
        assert!(matches!(
            m.topic_partition(other),
            Err(KafkaError::UnmappedPartition { .. })
        ));
    }

    #[test]
    fn ids_of_the_mapping_by_topic_index_are_refused() {
        let m = map(&["a", "b"]);
        // Partition 3 of the second topic, as earlier versions stored it.
        let legacy = PartitionId((1 << 20) | 3);
        assert!(matches!(
            m.topic_partition(legacy),
            Err(KafkaError::LegacyPartitionId { .. })
        ));
        assert!(matches!(
            m.check_stored([m.id("a", 0).expect("mapped"), PartitionId(0)]),
            Err(KafkaError::LegacyPartitionId {
                partition: PartitionId(0)
            })
        ));
        let unread = map(&["gone"]).id("gone", 1).expect("mapped");
        m.check_stored([m.id("b", 2).expect("mapped"), unread])
            .expect("current ids, read or not, pass");
    }

    #[test]
    fn bad_topic_lists_are_rejected() {
        assert!(PartitionMap::new(vec![]).is_err());
        assert!(PartitionMap::new(vec!["a".into(), "a".into()]).is_err());
        assert!(PartitionMap::new(vec![String::new()]).is_err());
    }

    #[test]
    fn topics_whose_codes_collide_are_rejected() {
        // Find two names with one code (a birthday search: quick).
        let mut seen = std::collections::HashMap::new();
        let (a, b) = (0..)
            .find_map(|i| {
                let name = format!("t{i}");
                seen.insert(topic_code(&name), name.clone())
                    .map(|earlier| (earlier, name))
            })
            .expect("a collision");
        let e = PartitionMap::new(vec![a.clone(), b.clone()])
            .expect_err("colliding topics")
            .to_string();
        assert!(e.contains(&a) && e.contains(&b), "{e}");
    }
}
