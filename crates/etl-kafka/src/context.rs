//! The consumer context: rebalance callbacks become assignment events, and
//! a revocation drains and commits before the callback returns.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use etl_record::{PartitionId, PartitionOffsets, Record};
use rdkafka::TopicPartitionList;
use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use tokio::sync::mpsc::UnboundedSender;

use crate::PartitionMap;
use crate::native::FetchQueue;

/// What the poll thread tells the source, in the order it happened.
#[derive(Debug)]
pub(crate) enum Event {
    /// Partitions newly assigned to this member.
    Assigned(Vec<PartitionId>),
    /// Partitions taken away. The rebalance callback drains and commits
    /// them once the source has taken this event (see [`Handover`]).
    Revoked(Vec<PartitionId>, Handover),
    /// Consecutive records of one partition, read after its `seek`-th
    /// seek and its `revocations`-th revocation.
    Records {
        partition: PartitionId,
        seek: u64,
        revocations: u64,
        records: Vec<Record>,
    },
    /// The consumer hit an error it cannot recover from.
    Fatal(String),
    /// A broker refused the consumer's security settings, and the
    /// consumer gave up on them (see [`crate::refusal`]).
    Refused(crate::KafkaError),
}

/// Ends partitions' epochs when the group takes them away: waits until
/// their in-flight batches resolve (up to a deadline below the group's
/// `session.timeout.ms`), commits their watermarks and returns what was
/// committed. Runs on the poll thread, inside the rebalance callback, so
/// the group waits for it.
///
/// The checkpointer's handle implements it (`revoke_blocking`); tests may
/// substitute their own.
pub trait RevokeHandler: Send + Sync + 'static {
    /// End `partitions`' epochs, drain and commit them.
    ///
    /// # Errors
    ///
    /// Whatever stopped the commit; the partitions' next owner then
    /// replays from the previous commit.
    fn revoke_blocking(
        &self,
        partitions: Vec<PartitionId>,
    ) -> Result<PartitionOffsets, Box<dyn std::error::Error + Send + Sync>>;
}

/// Travels with a revocation to the source and is dropped when the source
/// takes it (or when the source is gone and the event with it).
///
/// The source driver asks for the next event only once it has opened (or
/// dropped) the batch it took before: until then, a batch of a revoked
/// partition may still be on its way into the pipeline, unknown to the
/// checkpointer. Were the revocation drained and committed meanwhile, the
/// batch would be opened under an epoch that had already ended and
/// written after the commit, and the next owner would read it again. So
/// the rebalance callback waits for this token before it drains.
#[derive(Debug)]
pub(crate) struct Handover {
    /// Never sent on: its drop disconnects the callback's receiver.
    _wake: Sender<()>,
}

impl Handover {
    /// A token, and what its drop wakes.
    fn new() -> (Self, std::sync::mpsc::Receiver<()>) {
        let (wake, taken) = channel();
        (Handover { _wake: wake }, taken)
    }
}

/// Records of one partition gathered on the poll thread before they are
/// sent as one event.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) partition: PartitionId,
    pub(crate) seek: u64,
    pub(crate) revocations: u64,
    pub(crate) records: Vec<Record>,
}

/// Records of partitions the pipeline paused, read before librdkafka's
/// pause took effect, or instead of it (see [`crate::pauses`]): kept, in
/// the order read, until the pipeline resumes the partition, and dropped
/// when it is sought or revoked.
#[derive(Debug, Default)]
pub(crate) struct Held {
    chunks: BTreeMap<PartitionId, Vec<Chunk>>,
    records: usize,
}

impl Held {
    fn push(&mut self, chunk: Chunk) {
        self.records += chunk.records.len();
        self.chunks.entry(chunk.partition).or_default().push(chunk);
    }

    fn take(&mut self, partition: PartitionId) -> Vec<Chunk> {
        let chunks = self.chunks.remove(&partition).unwrap_or_default();
        self.records -= chunks.iter().map(|c| c.records.len()).sum::<usize>();
        chunks
    }
}

/// State shared by the poll thread, its callbacks and the source.
pub(crate) struct GroupContext {
    pub(crate) map: PartitionMap,
    pub(crate) group: String,
    events: UnboundedSender<Event>,
    /// How long a revocation waits for the source to take it (see
    /// [`Handover`]) before it drains and commits all the same.
    handover_wait: Duration,
    revoke: OnceLock<Arc<dyn RevokeHandler>>,
    /// Records sent to the source and not yet taken by it.
    pub(crate) buffered: AtomicUsize,
    /// Records read but not yet sent (touched only by the poll thread and
    /// the callbacks it runs; the lock is never contended).
    pub(crate) chunk: Mutex<Option<Chunk>>,
    /// Whether the poll thread has paused every partition for
    /// backpressure; new assignments join them.
    pub(crate) backpressure: AtomicBool,
    /// Partitions the pipeline asked to pause (its in-flight limit). A
    /// new assignment of a partition clears its entry: the pipeline's
    /// state of a partition ends with its revocation.
    pub(crate) paused: Mutex<BTreeSet<PartitionId>>,
    /// Records of paused partitions, held back from the source (touched
    /// only by the poll thread and the callbacks it runs).
    held: Mutex<Held>,
    /// The queue every assigned partition's fetch queue is forwarded to,
    /// while the poll thread runs (it sets and takes it: the queue holds
    /// the consumer, which holds this context).
    pub(crate) fetch: Mutex<Option<Arc<FetchQueue>>>,
    /// How often each partition was revoked. Records carry the count they
    /// were read under; the source drops those read before the latest
    /// revocation, even if they were already on their way when it
    /// happened (they belong to the next owner now).
    revocations: Mutex<BTreeMap<PartitionId, u64>>,
    /// Whether the brokers answer, reported without flooding the log.
    pub(crate) outage: crate::outage::Outage,
}

impl fmt::Debug for GroupContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupContext")
            .field("group", &self.group)
            .field("topics", &self.map.topics())
            .field("buffered", &self.buffered)
            .finish_non_exhaustive()
    }
}

impl GroupContext {
    pub(crate) fn new(
        map: PartitionMap,
        group: String,
        events: UnboundedSender<Event>,
        handover_wait: Duration,
        security: crate::refusal::Security,
    ) -> Self {
        GroupContext {
            map,
            group,
            events,
            handover_wait,
            revoke: OnceLock::new(),
            buffered: AtomicUsize::new(0),
            chunk: Mutex::new(None),
            backpressure: AtomicBool::new(false),
            paused: Mutex::new(BTreeSet::new()),
            held: Mutex::new(Held::default()),
            fetch: Mutex::new(None),
            revocations: Mutex::new(BTreeMap::new()),
            outage: crate::outage::Outage::new(security),
        }
    }

    /// Install the checkpointer hook; only the first call counts.
    pub(crate) fn set_revoke(&self, revoke: Arc<dyn RevokeHandler>) -> bool {
        self.revoke.set(revoke).is_ok()
    }

    pub(crate) fn send(&self, event: Event) {
        if let Event::Records { records, .. } = &event {
            self.buffered.fetch_add(records.len(), Ordering::AcqRel);
        }
        // The source may be gone already (shutdown); nothing to tell then.
        let _ = self.events.send(event);
    }

    /// Send the gathered chunk (or hold it, see [`send_or_hold`](Self::send_or_hold)),
    /// unless it belongs to `drop_partitions`.
    pub(crate) fn flush_chunk(&self, drop_partitions: &[PartitionId]) {
        let chunk = self
            .chunk
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(c) = chunk
            && !drop_partitions.contains(&c.partition)
        {
            self.send_or_hold(c);
        }
    }

    /// Send records to the source, or hold them back while the pipeline
    /// has their partition paused.
    pub(crate) fn send_or_hold(&self, chunk: Chunk) {
        if chunk.records.is_empty() {
            return;
        }
        if self.paused().contains(&chunk.partition) {
            self.held().push(chunk);
            return;
        }
        self.send(Event::Records {
            partition: chunk.partition,
            seek: chunk.seek,
            revocations: chunk.revocations,
            records: chunk.records,
        });
    }

    /// Send what was held back of `partitions`, in the order read.
    pub(crate) fn release(&self, partitions: &[PartitionId]) {
        for partition in partitions {
            let chunks = self.held().take(*partition);
            for c in chunks {
                self.send(Event::Records {
                    partition: c.partition,
                    seek: c.seek,
                    revocations: c.revocations,
                    records: c.records,
                });
            }
        }
    }

    /// Drop what was held back of `partitions` (sought elsewhere, revoked,
    /// or assigned anew).
    pub(crate) fn drop_held(&self, partitions: &[PartitionId]) {
        let mut held = self.held();
        for partition in partitions {
            drop(held.take(*partition));
        }
    }

    /// How many records are held back.
    pub(crate) fn held_records(&self) -> usize {
        self.held().records
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The partitions the pipeline asked to pause.
    pub(crate) fn paused(&self) -> MutexGuard<'_, BTreeSet<PartitionId>> {
        self.paused.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How often `partition` was revoked so far.
    pub(crate) fn revocations(&self, partition: PartitionId) -> u64 {
        self.revocations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&partition)
            .copied()
            .unwrap_or(0)
    }

    fn ids(&self, tpl: &TopicPartitionList) -> Vec<PartitionId> {
        tpl.elements()
            .iter()
            .filter_map(|e| match self.map.id(e.topic(), e.partition()) {
                Ok(id) => Some(id),
                Err(err) => {
                    tracing::error!(%err, "partition outside the mapping ignored");
                    None
                }
            })
            .collect()
    }
}

impl ClientContext for GroupContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.outage.client_log(level, fac, log_message);
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        if let Some(refused) = self.outage.client_error(&error, reason) {
            // The source ends the run with it: an error of the
            // configuration, said once.
            self.send(Event::Refused(refused));
        }
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let ids = self.ids(tpl);
        if ids.is_empty() {
            return;
        }
        // Stop handing out the partitions first; once the source has taken
        // the revocation (so nothing of the partitions read before it can
        // still enter the pipeline), let the checkpointer drain and commit
        // them while the group waits for this callback: the next owner
        // starts exactly at what is committed here.
        self.flush_chunk(&ids);
        self.drop_held(&ids);
        {
            let mut revocations = self
                .revocations
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            for id in &ids {
                *revocations.entry(*id).or_insert(0) += 1;
            }
        }
        let (handover, taken) = Handover::new();
        self.send(Event::Revoked(ids.clone(), handover));
        if let Err(RecvTimeoutError::Timeout) = taken.recv_timeout(self.handover_wait) {
            // The pipeline is stuck (a sink that does not write): the
            // group does not wait forever. A batch still held then may be
            // written after the commit below and read again by the next
            // owner, as records in flight past the revoke deadline are.
            tracing::warn!(
                group = %self.group, ?ids, wait = ?self.handover_wait,
                "the pipeline did not take the revocation in time; committing what it delivered"
            );
        }
        let Some(revoke) = self.revoke.get() else {
            return;
        };
        match revoke.revoke_blocking(ids.clone()) {
            Ok(committed) => {
                // `committed`: the group's offsets of the partitions, as
                // the checkpointer last committed them (by this revoke or
                // by the source driver's, whichever came first; a failure
                // of that one is said where it happened).
                tracing::info!(group = %self.group, ?ids, ?committed, "partitions revoked");
            }
            Err(err)
                if matches!(
                    err.downcast_ref::<etl_checkpoint::CheckpointError>(),
                    Some(etl_checkpoint::CheckpointError::RevokeUnsettled { .. })
                ) =>
            {
                // The revocation committed the watermark the partitions
                // pin (a failure of that commit is logged where it
                // happened) once the write under way ended, and halted
                // the run: the next owner starts from there.
                tracing::error!(
                    group = %self.group, ?ids, %err,
                    "revoke halted the run: an exactly-once write was under way at revoke_deadline; the partitions were released once it ended, with the watermark they pin committed"
                );
            }
            Err(err) => {
                // Nothing was lost: uncommitted records are read again by
                // the next owner.
                tracing::warn!(group = %self.group, ?ids, %err, "revoke did not commit; the next owner replays");
            }
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                // The group coordinator answered.
                self.outage.recovered();
                let ids = self.ids(tpl);
                if ids.is_empty() {
                    return;
                }
                // librdkafka keeps an application's pause on the
                // partition, not on the assignment: a partition paused
                // (for backpressure, or by the pipeline) when it was
                // revoked would come back paused, and nothing would ever
                // resume it: its records would stop flowing for good. So
                // every assignment sets the state explicitly: paused
                // while backpressure is engaged (its release resumes the
                // whole assignment), fetching otherwise.
                {
                    let mut paused = self.paused();
                    for id in &ids {
                        paused.remove(id);
                    }
                }
                self.drop_held(&ids);
                let pause = self.backpressure.load(Ordering::Acquire);
                let set = {
                    use rdkafka::consumer::Consumer;
                    if pause {
                        consumer.pause(tpl)
                    } else {
                        consumer.resume(tpl)
                    }
                };
                if let Err(err) = set {
                    tracing::warn!(%err, pause, "cannot set the pause state of newly assigned partitions");
                }
                // Their fetch queues go to the poll thread's queue, before
                // librdkafka starts fetching them (after this callback, once
                // it knows their offsets). A partition not attached would
                // still be read, through the consumer queue, only slower.
                let fetch = self
                    .fetch
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                if let Some(fetch) = fetch {
                    for e in tpl.elements() {
                        if !fetch.attach(consumer, e.topic(), e.partition()) {
                            tracing::warn!(
                                topic = e.topic(),
                                partition = e.partition(),
                                "cannot read the partition through its own queue"
                            );
                        }
                    }
                }
                tracing::info!(group = %self.group, ?ids, "partitions assigned");
                self.send(Event::Assigned(ids));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(err) => {
                tracing::error!(group = %self.group, %err, "rebalance failed");
            }
        }
    }
}
