//! The consumer group as the checkpointer's offset store.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etl_record::{Offset, PartitionId};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};

use crate::KafkaError;
use crate::context::GroupContext;

/// How long loading offsets may wait for the group coordinator.
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Offsets committed to the source's consumer group.
///
/// [`load`](GroupOffsetStore::load) reads the group's committed offsets of
/// every partition of the source's topics (a partition with none is left
/// out, so it starts where `auto.offset.reset` says);
/// [`commit`](GroupOffsetStore::commit) commits synchronously, so `Ok`
/// means the group coordinator stored the offsets. It shares the source's
/// consumer: Kafka only accepts commits from a member of the group.
#[derive(Clone)]
pub struct GroupOffsetStore {
    consumer: Arc<BaseConsumer<GroupContext>>,
}

impl fmt::Debug for GroupOffsetStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupOffsetStore")
            .field("group", &self.consumer.context().group)
            .finish_non_exhaustive()
    }
}

impl GroupOffsetStore {
    pub(crate) fn new(consumer: Arc<BaseConsumer<GroupContext>>) -> Self {
        GroupOffsetStore { consumer }
    }

    /// The group's committed offsets of every partition of the topics.
    pub fn load(&self) -> Result<BTreeMap<PartitionId, Offset>, KafkaError> {
        let map = &self.consumer.context().map;
        let mut tpl = TopicPartitionList::new();
        for topic in map.topics() {
            let metadata = self
                .consumer
                .fetch_metadata(Some(topic), LOAD_TIMEOUT)
                .map_err(|e| KafkaError::client(format!("reading partitions of `{topic}`"), e))?;
            for t in metadata.topics() {
                for p in t.partitions() {
                    tpl.add_partition(t.name(), p.id());
                }
            }
        }
        if tpl.count() == 0 {
            return Ok(BTreeMap::new());
        }
        let committed = self
            .consumer
            .committed_offsets(tpl, LOAD_TIMEOUT)
            .map_err(|e| KafkaError::client("reading the group's committed offsets", e))?;
        let mut offsets = BTreeMap::new();
        for e in committed.elements() {
            if let (KafkaOffset::Offset(o), Ok(id)) = (e.offset(), map.id(e.topic(), e.partition()))
            {
                offsets.insert(id, Offset(o));
            }
        }
        Ok(offsets)
    }

    /// Commit `offsets` (each the position after the last delivered
    /// record) to the group, waiting for the coordinator's answer.
    pub fn commit(&self, offsets: &BTreeMap<PartitionId, Offset>) -> Result<(), KafkaError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let map = &self.consumer.context().map;
        let mut tpl = TopicPartitionList::new();
        let mut shown = Vec::with_capacity(offsets.len());
        for (id, offset) in offsets {
            let (topic, p) = map.topic_partition(*id)?;
            tpl.add_partition_offset(topic, p, KafkaOffset::Offset(offset.0))
                .map_err(|e| KafkaError::client("building the commit", e))?;
            shown.push(format!("{topic}/{p}@{offset}"));
        }
        self.consumer
            .commit(&tpl, CommitMode::Sync)
            .map_err(|source| KafkaError::Commit {
                group: self.consumer.context().group.clone(),
                offsets: shown.join(","),
                source: Box::new(source),
            })
    }
}
