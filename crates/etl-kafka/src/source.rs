//! The Kafka source: one member of a consumer group.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etl_record::{Offset, PartitionId, PartitionOffsets, SourceId};
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
        let context = GroupContext::new(
            map,
            config.group_id.clone(),
            tx,
            config.max_revoke_deadline(),
            crate::refusal::Security::new("consumer", &config.brokers, &config.properties),
        );
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
    /// coordinator up to `commit_timeout`.
    #[must_use]
    pub fn offset_store(&self) -> GroupOffsetStore {
        GroupOffsetStore::new(
            Arc::clone(&self.consumer),
            self.config.commit_timeout,
            &self.config.auto_offset_reset,
        )
        .start_at_time(self.config.start_timestamp_ms)
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
            attached_at: Instant::now(),
            fetch: None,
            read: (0, 0),
            pauses: crate::pauses::Pauses::default(),
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
        // Nothing takes events any more: the revocations of the leave must
        // not wait for it (dropping a queued revocation releases it).
        self.events.close();
        while self.events.try_recv().is_ok() {}
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
                Event::Revoked(ids, handover) => {
                    for id in &ids {
                        self.assigned.remove(id);
                    }
                    // Whatever the driver took before is opened by now:
                    // the rebalance callback may drain and commit.
                    drop(handover);
                    return Ok(SourceEvent::Revoked(ids));
                }
                Event::Fatal(reason) => return Err(SourceError::custom(reason)),
                // The settings are wrong, not the network: a configuration
                // error, not a reason to keep retrying.
                Event::Refused(refused) => return Err(SourceError::Config(refused.to_string())),
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

    /// The partition's high watermark from the consumer's last fetch
    /// response (no request to the broker).
    fn high_watermark(&self, partition: PartitionId) -> Option<Offset> {
        let (topic, p) = self.partition_map().topic_partition(partition).ok()?;
        crate::native::cached_high_watermark(&self.consumer, topic, p).map(Offset)
    }

    /// Offsets reach the group through [`GroupOffsetStore`], on the
    /// checkpointer's thread; nothing is left to do here.
    async fn commit(&mut self, _offsets: &PartitionOffsets) -> Result<(), SourceError> {
        Ok(())
    }

    /// A revoked partition goes to another member of the group.
    fn hands_over_revoked(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, Ordering};

    use bytes::Bytes;
    use etl_record::{Position, Record};
    use rdkafka::TopicPartitionList;
    use rdkafka::consumer::{ConsumerContext, Rebalance};

    use super::*;

    /// Records, per call, whether the pipeline still held a batch of the
    /// revoked partitions when the revocation was drained and committed.
    #[derive(Default)]
    struct Recorder {
        holding: AtomicBool,
        calls: Mutex<Vec<bool>>,
    }

    impl RevokeHandler for Arc<Recorder> {
        fn revoke_blocking(
            &self,
            _partitions: Vec<PartitionId>,
        ) -> Result<PartitionOffsets, Box<dyn std::error::Error + Send + Sync>> {
            let holding = self.holding.load(Ordering::SeqCst);
            self.calls.lock().expect("lock").push(holding);
            Ok(BTreeMap::new())
        }
    }

    /// The source driver took a batch of a partition (it waits for
    /// in-flight credit before opening it, while a sink is slow) when the
    /// group revoked the partition. Draining and committing at once would
    /// end the partition's epoch with the batch still unknown to the
    /// checkpointer: opened afterwards under the ended epoch, it is
    /// written past the commit, and the next owner reads it again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_revocation_drains_only_after_the_batch_taken_before_it() {
        let config = KafkaSourceConfig::new("127.0.0.1:1", "g", vec!["t".to_owned()]);
        let mut source = KafkaSource::new(SourceId::new("k"), config).expect("source");
        // Started by hand: no broker, no poll thread; the test plays the
        // poll thread's part and calls the rebalance callback itself.
        let (commands, _commands) = std::sync::mpsc::channel();
        source.commands = Some(commands);
        let recorder = Arc::new(Recorder::default());
        assert!(
            source
                .consumer
                .context()
                .set_revoke(Arc::new(Arc::clone(&recorder)))
        );
        let partition = source.partition_map().id("t", 0).expect("mapped");
        let context = source.consumer.context();
        context.send(Event::Assigned(vec![partition]));
        let record = Record::new(
            Position::new(SourceId::new("k"), partition, Offset(0)),
            Bytes::from_static(b"{}"),
        );
        context.send(Event::Records {
            partition,
            seek: 0,
            revocations: 0,
            records: vec![record],
        });
        assert!(matches!(
            source.next().await.expect("assigned"),
            SourceEvent::Assigned(_)
        ));
        let SourceEvent::Batch(batch) = source.next().await.expect("batch") else {
            panic!("expected the batch");
        };
        recorder.holding.store(true, Ordering::SeqCst);

        let consumer = Arc::clone(&source.consumer);
        let callback = std::thread::spawn(move || {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition("t", 0);
            consumer
                .context()
                .pre_rebalance(&consumer, &Rebalance::Revoke(&tpl));
        });
        // Room for a callback that does not wait to drain.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The driver opens the batch (the checkpointer knows of it from
        // now on) and asks for the next event.
        recorder.holding.store(false, Ordering::SeqCst);
        drop(batch);
        assert!(matches!(
            source.next().await.expect("revoked"),
            SourceEvent::Revoked(_)
        ));
        tokio::task::spawn_blocking(move || callback.join())
            .await
            .expect("join")
            .expect("callback");
        assert_eq!(
            *recorder.calls.lock().expect("lock"),
            vec![false],
            "drained and committed once, after the pipeline took the revocation"
        );
    }

    /// Commits nothing: the test reads one member's partitions only.
    struct NoCommit;

    impl RevokeHandler for NoCommit {
        fn revoke_blocking(
            &self,
            _partitions: Vec<PartitionId>,
        ) -> Result<PartitionOffsets, Box<dyn std::error::Error + Send + Sync>> {
            Ok(BTreeMap::new())
        }
    }

    /// librdkafka clears a partition's forwarding when it stops the
    /// partition's fetch (a revocation), and the stop is served on its own
    /// thread, later: served after the next assignment of the partition
    /// attached it to the poll thread's queue again, it leaves the
    /// partition's messages in a queue nobody reads (the queue stays
    /// marked as the application's, so librdkafka does not forward it to
    /// the consumer queue either). The partition is assigned, not paused,
    /// and never read. The poll thread must attach it again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_partition_whose_queue_lost_its_forwarding_is_still_read() {
        use etl_test_support::kafka::{TestBroker, unique};
        use rdkafka::producer::{FutureProducer, FutureRecord};

        let broker = TestBroker::start();
        let topic = unique("detached");
        broker.create_topic(&topic, 1).await;
        let mut config =
            KafkaSourceConfig::new(broker.addr(), unique("detached-group"), vec![topic.clone()]);
        config.session_timeout = Duration::from_secs(6);
        config.heartbeat_interval = Duration::from_secs(1);
        let mut source = KafkaSource::new(SourceId::new("k"), config).expect("source");
        source.start(NoCommit).expect("start");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            assert!(tokio::time::Instant::now() < deadline, "never assigned");
            if let SourceEvent::Assigned(_) = source.next().await.expect("event") {
                break;
            }
        }
        // Assigned and attached; now the late stop clears the forwarding.
        assert!(crate::native::FetchQueue::detach(
            &source.consumer,
            &topic,
            0
        ));

        const RECORDS: usize = 10;
        let producer: FutureProducer = broker.config().create().expect("producer");
        for i in 0..RECORDS {
            producer
                .send(
                    FutureRecord::<(), _>::to(&topic)
                        .payload(&format!("{{\"n\":{i}}}"))
                        .partition(0),
                    Duration::from_secs(10),
                )
                .await
                .expect("delivery");
        }
        let mut read = 0;
        while read < RECORDS {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{read} of {RECORDS} records read: the partition's queue is read by nobody"
            );
            if let SourceEvent::Batch(batch) = source.next().await.expect("event") {
                read += batch.records.len();
            }
        }
        assert_eq!(read, RECORDS);
        source.close().await;
    }
}
