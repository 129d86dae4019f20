//! The Kafka source: one member of a consumer group.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etl_record::{Offset, PartitionId, SourceId};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};
use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::RevokeHandler;
use crate::context::{Event, GroupContext};
use crate::poll_thread::{Command, PollThread};
use crate::{GroupOffsetStore, KafkaError, KafkaSourceConfig, PartitionMap};

/// How long [`Source::next`] waits for input before reporting idleness.
const IDLE_AFTER: Duration = Duration::from_millis(100);

/// A consumer-group member as a [`Source`].
///
/// Built in three steps, because the checkpointer needs the group as its
/// offset store and the group needs the checkpointer for revocations:
///
/// 1. [`KafkaSource::new`] creates the consumer (not yet subscribed);
/// 2. [`KafkaSource::offset_store`] is handed to the checkpointer;
/// 3. [`KafkaSource::start`] gives the source the checkpointer, subscribes
///    and starts polling on a dedicated thread.
///
/// Then the source driver runs it like any other source. Rebalances become
/// [`SourceEvent::Assigned`] and [`SourceEvent::Revoked`]; a revocation is
/// drained and committed by the checkpointer *inside* the rebalance
/// callback, so the partitions' next owner starts at the committed offset.
/// [`seek`](Source::seek) repositions a partition (replays),
/// [`pause`](Source::pause) and [`resume`](Source::resume) stop and restart
/// fetching single partitions, and the poll thread pauses every partition
/// by itself while more than
/// [`max_buffered_records`](KafkaSourceConfig::max_buffered_records) wait
/// for the pipeline, so the member keeps polling and stays in the group.
/// (It first waits up to 100 ms for the pipeline to take half of them: a
/// pause drops what librdkafka prefetched for the partitions.)
///
/// Dropping the source leaves the group: the poll thread closes the
/// consumer, which revokes (drains and commits) every partition first.
/// Dropped inside a Tokio runtime, the runtime's shutdown waits for that;
/// [`close`](KafkaSource::close) does the same and waits for it itself.
pub struct KafkaSource {
    consumer: Arc<BaseConsumer<GroupContext>>,
    events: UnboundedReceiver<Event>,
    commands: Option<Sender<Command>>,
    thread: Option<JoinHandle<()>>,
    config: KafkaSourceConfig,
    source: SourceId,
    seeks: BTreeMap<PartitionId, u64>,
    assigned: BTreeSet<PartitionId>,
}

impl fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSource")
            .field("source", &self.source)
            .field("group", &self.config.group_id)
            .field("topics", &self.config.topics)
            .field("assigned", &self.assigned)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Create the consumer for `config`; records are named after `source`
    /// (their idempotency keys start with it). Nothing is consumed before
    /// [`start`](KafkaSource::start).
    pub fn new(source: SourceId, config: KafkaSourceConfig) -> Result<Self, KafkaError> {
        let map = PartitionMap::new(config.topics.clone())?;
        let client_config = config.client_config()?;
        let (tx, events) = unbounded_channel();
        let context = GroupContext::new(map, config.group_id.clone(), tx);
        let consumer: BaseConsumer<GroupContext> = client_config
            .create_with_context(context)
            .map_err(|e| KafkaError::client("creating the consumer", e))?;
        Ok(KafkaSource {
            consumer: Arc::new(consumer),
            events,
            commands: None,
            thread: None,
            config,
            source,
            seeks: BTreeMap::new(),
            assigned: BTreeSet::new(),
        })
    }

    /// The consumer group as an offset store, for the checkpointer: it
    /// loads the group's committed offsets and commits, waiting for the
    /// coordinator up to `commit_timeout_ms`.
    #[must_use]
    pub fn offset_store(&self) -> GroupOffsetStore {
        GroupOffsetStore::new(
            Arc::clone(&self.consumer),
            Duration::from_millis(u64::from(self.config.commit_timeout_ms)),
        )
    }

    /// The partition mapping of this source's topics.
    #[must_use]
    pub fn partition_map(&self) -> &PartitionMap {
        &self.consumer.context().map
    }

    /// Subscribe and start polling. `revoke` ends partitions' epochs when
    /// the group takes them away (pass the checkpointer's handle).
    pub fn start(&mut self, revoke: impl RevokeHandler) -> Result<(), KafkaError> {
        self.start_with(Arc::new(revoke))
    }

    fn start_with(&mut self, revoke: Arc<dyn RevokeHandler>) -> Result<(), KafkaError> {
        if self.thread.is_some() || !self.consumer.context().set_revoke(revoke) {
            return Err(KafkaError::config("start", "the source is already started"));
        }
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        self.consumer
            .subscribe(&topics)
            .map_err(|e| KafkaError::client(format!("subscribing to {topics:?}"), e))?;
        let (commands, rx) = std::sync::mpsc::channel();
        let poll = PollThread {
            consumer: Arc::clone(&self.consumer),
            commands: rx,
            source: self.source.clone(),
            max_batch_records: self.config.max_batch_records,
            max_buffered: self.config.max_buffered_records,
            seeks: BTreeMap::new(),
            behind_since: None,
            reported_at: Instant::now(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("kafka-poll-{}", self.config.group_id))
            .spawn(move || poll.run())
            .map_err(|e| {
                KafkaError::config("start", format!("cannot spawn the poll thread: {e}"))
            })?;
        self.commands = Some(commands);
        self.thread = Some(thread);
        Ok(())
    }

    /// Leave the group and wait until the consumer is closed: every
    /// assigned partition is revoked (drained and committed through the
    /// checkpointer) before this returns.
    pub async fn close(mut self) {
        self.commands = None;
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    fn command(&self, command: Command) -> Result<(), SourceError> {
        self.commands
            .as_ref()
            .ok_or_else(|| SourceError::Config("the Kafka source is not started".to_owned()))?
            .send(command)
            .map_err(|_| SourceError::custom(KafkaError::PollThreadStopped))
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        // Closing the command channel stops the poll thread, which leaves
        // the group cleanly on its own; dropping must not block. Inside a
        // Tokio runtime, a blocking task waits for the thread, so the
        // runtime's shutdown (the end of a process) waits until the
        // partitions are committed and handed over.
        self.commands = None;
        if let Some(thread) = self.thread.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            drop(runtime.spawn_blocking(move || thread.join()));
        }
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if self.commands.is_none() {
            return Err(SourceError::Config(
                "the Kafka source is not started".to_owned(),
            ));
        }
        loop {
            let event = match tokio::time::timeout(IDLE_AFTER, self.events.recv()).await {
                Err(_elapsed) => return Ok(SourceEvent::Idle),
                Ok(None) => return Err(SourceError::custom(KafkaError::PollThreadStopped)),
                Ok(Some(event)) => event,
            };
            match event {
                Event::Records {
                    partition,
                    seek,
                    revocations,
                    records,
                } => {
                    self.consumer
                        .context()
                        .buffered
                        .fetch_sub(records.len(), std::sync::atomic::Ordering::AcqRel);
                    let current = self.seeks.get(&partition).copied().unwrap_or(0);
                    // Read before the latest seek, or of a partition no
                    // longer ours: the records come again where they
                    // belong.
                    if seek != current
                        || !self.assigned.contains(&partition)
                        || revocations != self.consumer.context().revocations(partition)
                    {
                        continue;
                    }
                    return Ok(SourceEvent::Batch(PollBatch::from_records(
                        partition, records,
                    )));
                }
                Event::Assigned(ids) => {
                    self.assigned.extend(ids.iter().copied());
                    return Ok(SourceEvent::Assigned(ids));
                }
                Event::Revoked(ids) => {
                    for id in &ids {
                        self.assigned.remove(id);
                    }
                    return Ok(SourceEvent::Revoked(ids));
                }
                Event::Fatal(reason) => return Err(SourceError::custom(reason)),
            }
        }
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        let seek = self.seeks.entry(partition).or_insert(0);
        *seek += 1;
        let seek = *seek;
        self.command(Command::Seek {
            partition,
            offset,
            seek,
        })
    }

    async fn pause(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        self.command(Command::Pause(partitions.to_vec()))
    }

    async fn resume(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        self.command(Command::Resume(partitions.to_vec()))
    }

    /// Offsets reach the group through [`GroupOffsetStore`], on the
    /// checkpointer's thread; nothing is left to do here.
    async fn commit(
        &mut self,
        _offsets: &BTreeMap<PartitionId, Offset>,
    ) -> Result<(), SourceError> {
        Ok(())
    }
}
