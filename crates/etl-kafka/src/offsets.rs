//! The consumer group as the checkpointer's offset store.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etl_record::{Offset, PartitionOffsets};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};

use crate::KafkaError;
use crate::context::GroupContext;

/// How long loading offsets may wait for the group coordinator.
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

/// What a commit still waiting for the coordinator will answer.
type PendingCommit = Receiver<Result<(), rdkafka::error::KafkaError>>;

/// Offsets committed to the source's consumer group.
///
/// [`load`](GroupOffsetStore::load) reads the group's committed offsets of
/// every partition of the source's topics. A partition with none starts
/// where [`auto_offset_reset`](crate::KafkaSourceConfig::auto_offset_reset)
/// says: with `latest` (`largest`, `end`) load answers the partition's high
/// watermark, read from the broker, since the pipeline seeks every assigned
/// partition to what the store answers (offset 0 when it answers nothing);
/// with `earliest` the partition is left out and starts at 0 (librdkafka
/// resets an offset the log no longer holds to its start);
/// [`commit`](GroupOffsetStore::commit) waits for the coordinator, so `Ok`
/// means the group stored the offsets, but never longer than
/// [`commit_timeout`](crate::KafkaSourceConfig::commit_timeout):
/// with the broker unreachable a commit fails with
/// [`KafkaError::CommitTimedOut`] instead of blocking a revocation or a
/// graceful stop until the broker comes back. It shares the source's
/// consumer: Kafka only accepts commits from a member of the group.
#[derive(Clone)]
pub struct GroupOffsetStore {
    consumer: Arc<BaseConsumer<GroupContext>>,
    timeout: Duration,
    /// Whether a partition without a committed offset starts at its high
    /// watermark (`auto.offset.reset` latest).
    latest: bool,
    /// Where a partition without a committed offset starts by time
    /// (`start_timestamp_ms`), before `latest` is considered.
    start_timestamp_ms: Option<i64>,
    /// A commit that outlived its deadline, still waiting for the
    /// coordinator. The next commit waits for it first (within its own
    /// deadline), so at most one commit waits at a time.
    pending: Arc<Mutex<Option<PendingCommit>>>,
}

impl fmt::Debug for GroupOffsetStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupOffsetStore")
            .field("group", &self.consumer.context().group)
            .finish_non_exhaustive()
    }
}

impl GroupOffsetStore {
    pub(crate) fn new(
        consumer: Arc<BaseConsumer<GroupContext>>,
        timeout: Duration,
        auto_offset_reset: &str,
    ) -> Self {
        GroupOffsetStore {
            consumer,
            timeout,
            latest: matches!(auto_offset_reset, "latest" | "largest" | "end"),
            start_timestamp_ms: None,
            pending: Arc::new(Mutex::new(None)),
        }
    }

    /// Start partitions without a committed offset at their first message
    /// at or after `timestamp_ms`, if given.
    pub(crate) fn start_at_time(mut self, timestamp_ms: Option<i64>) -> Self {
        self.start_timestamp_ms = timestamp_ms;
        self
    }

    /// The high watermark of `topic`/`partition`, from the broker.
    fn high_watermark(&self, topic: &str, partition: i32, why: &str) -> Result<i64, KafkaError> {
        self.consumer
            .fetch_watermarks(topic, partition, LOAD_TIMEOUT)
            .map(|(_low, high)| high)
            .map_err(|err| {
                KafkaError::client(
                    format!("reading the high watermark of `{topic}`/{partition} ({why})"),
                    err,
                )
            })
    }

    /// The group's committed offsets of every partition of the topics; a
    /// partition without one at its high watermark when
    /// `auto_offset_reset` is `latest`.
    ///
    /// # Errors
    ///
    /// [`KafkaError::Client`] when the broker does not answer the
    /// metadata, committed-offset or watermark request in time.
    pub fn load(&self) -> Result<PartitionOffsets, KafkaError> {
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
        // The coordinator answered.
        self.consumer.context().outage.recovered();
        let mut offsets = BTreeMap::new();
        let mut by_time = TopicPartitionList::new();
        for e in committed.elements() {
            let Ok(id) = map.id(e.topic(), e.partition()) else {
                continue;
            };
            if let KafkaOffset::Offset(o) = e.offset() {
                offsets.insert(id, Offset(o));
            } else if let Some(at) = self.start_timestamp_ms {
                by_time
                    .add_partition_offset(e.topic(), e.partition(), KafkaOffset::Offset(at))
                    .map_err(|err| KafkaError::client("asking offsets for a time", err))?;
            } else if self.latest {
                let high =
                    self.high_watermark(e.topic(), e.partition(), "auto_offset_reset = latest")?;
                offsets.insert(id, Offset(high));
            }
        }
        if by_time.count() > 0 {
            let found = self
                .consumer
                .offsets_for_times(by_time, LOAD_TIMEOUT)
                .map_err(|e| KafkaError::client("reading offsets for start_timestamp_ms", e))?;
            for e in found.elements() {
                let Ok(id) = map.id(e.topic(), e.partition()) else {
                    continue;
                };
                e.error().map_err(|err| {
                    KafkaError::client(
                        format!(
                            "reading the offset of `{}`/{} for start_timestamp_ms",
                            e.topic(),
                            e.partition()
                        ),
                        err,
                    )
                })?;
                let start = match e.offset() {
                    KafkaOffset::Offset(o) if o >= 0 => o,
                    // Every message is older: start after the last one.
                    _ => self.high_watermark(e.topic(), e.partition(), "start_timestamp_ms")?,
                };
                offsets.insert(id, Offset(start));
            }
        }
        Ok(offsets)
    }

    /// Commit `offsets` (each the position after the last delivered
    /// record) to the group, waiting for the coordinator's answer up to
    /// the commit timeout.
    ///
    /// # Errors
    ///
    /// [`KafkaError::Commit`] when the coordinator refused the commit,
    /// [`KafkaError::CommitTimedOut`] when it did not answer in time (the
    /// offsets may still be stored later; the previous commit stands
    /// until then, so nothing is skipped, at worst replayed).
    pub fn commit(&self, offsets: &PartitionOffsets) -> Result<(), KafkaError> {
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
        let group = &self.consumer.context().group;
        let timed_out = || KafkaError::CommitTimedOut {
            group: group.clone(),
            offsets: shown.join(","),
            timeout: self.timeout,
        };
        let deadline = std::time::Instant::now() + self.timeout;
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        // librdkafka's synchronous commit has no timeout of its own (it
        // waits for a coordinator however long that takes), so it runs on
        // a thread of its own and is waited for with a deadline.
        if let Some(earlier) = pending.take() {
            match earlier.recv_timeout(self.timeout) {
                Err(RecvTimeoutError::Timeout) => {
                    *pending = Some(earlier);
                    return Err(timed_out());
                }
                Ok(_) | Err(RecvTimeoutError::Disconnected) => {}
            }
        }
        let (tx, rx) = sync_channel(1);
        let consumer = Arc::clone(&self.consumer);
        std::thread::Builder::new()
            .name("kafka-commit".to_owned())
            .spawn(move || {
                let _ = tx.send(consumer.commit(&tpl, CommitMode::Sync));
            })
            .map_err(|e| {
                KafkaError::client(
                    format!("starting the commit thread: {e}"),
                    rdkafka::error::KafkaError::Canceled,
                )
            })?;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(())) => {
                // The coordinator answered.
                self.consumer.context().outage.recovered();
                Ok(())
            }
            Ok(Err(source)) => Err(KafkaError::Commit {
                group: group.clone(),
                offsets: shown.join(","),
                source: Box::new(source),
            }),
            Err(RecvTimeoutError::Timeout) => {
                *pending = Some(rx);
                Err(timed_out())
            }
            Err(RecvTimeoutError::Disconnected) => Err(KafkaError::client(
                "committing offsets: the commit thread stopped without an answer",
                rdkafka::error::KafkaError::Canceled,
            )),
        }
    }
}
