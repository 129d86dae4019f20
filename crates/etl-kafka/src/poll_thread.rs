//! The thread that owns the consumer's poll loop.
//!
//! librdkafka runs rebalance callbacks on the thread that polls, and a
//! revocation here blocks until the checkpointer has drained and committed
//! the revoked partitions. So polling lives on a dedicated OS thread, not
//! on an async task: blocking it never stalls the runtime, and the loop
//! keeps polling (serving callbacks and heartbeats' companions) while the
//! pipeline is slow, pausing partitions instead of stopping.
//!
//! A pipeline that is only briefly behind is waited for instead: pausing
//! a partition makes librdkafka drop what it prefetched for it and fetch
//! it again on resume, which stalls the partition (about a second against
//! the test broker) and costs the broker the same bytes twice. So the
//! thread stops polling for up to [`CATCH_UP_WAIT`] while the source takes
//! what is buffered, and pauses only if it is still behind then. Commands
//! are served meanwhile; callbacks wait at most that long (a rebalance
//! drops librdkafka's prefetched records by itself, so they do not queue
//! behind them).
//!
//! The pipeline's own pauses (its in-flight limit, usually for one sink
//! write) reach librdkafka only once they have lasted a while: until then
//! the thread holds the partition's records back itself (see
//! [`crate::pauses`]).
//!
//! Records arrive through the fetch queue (see [`FetchQueue`]), a batch
//! of up to `max_batch_records` at a time, and go to the source as one
//! event per run of a partition, their values and keys pointing into the
//! fetched messages. The consumer queue is polled without waiting after
//! each batch, for rebalance and error events (and for the records of a
//! partition librdkafka could not attach, one at a time, copied); it is
//! never batch-consumed, since a rebalance event met there makes
//! librdkafka assign by itself, past the commit on revoke.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use etl_record::{Offset, PartitionId, Position, Record, SourceId, Timestamp};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use rdkafka::{Offset as KafkaOffset, TopicPartitionList};

use crate::context::{Chunk, Event, GroupContext};
use crate::native::{FetchQueue, MessageView};
use crate::pauses::{PAUSE_GRACE, Pauses};

/// How long the thread waits for fetched messages when nothing is
/// pending (rebalance and error events wait at most that long too).
const POLL_WAIT: Duration = Duration::from_millis(20);
/// How long a seek may wait for the broker.
const SEEK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the thread waits, without polling, for the source to take
/// half of what is buffered before it pauses every partition instead.
const CATCH_UP_WAIT: Duration = Duration::from_millis(100);
/// How long one look at the source's progress sleeps while waiting.
const CATCH_UP_SLICE: Duration = Duration::from_micros(500);
/// How often the member logs its state (assignment, paused partitions,
/// positions), for an operator, or a test, looking at a partition that
/// does not move.
const REPORT_EVERY: Duration = Duration::from_secs(5);
/// How often every assigned partition is attached to the fetch queue
/// again (see [`PollThread::reattach`]): the longest a partition whose
/// forwarding librdkafka cleared late stays unread.
const REATTACH_EVERY: Duration = Duration::from_secs(1);
/// How long leaving the group may take. librdkafka's close waits for the
/// coordinator (and for commits still waiting on it); with the broker
/// unreachable that can be forever. Past this, the consumer is dropped
/// without a clean leave: the group notices after `session.timeout.ms`,
/// and what was committed stands.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the source asks of the poll thread.
#[derive(Debug)]
pub(crate) enum Command {
    /// Reposition a partition; records read afterwards carry `seek`.
    Seek {
        partition: PartitionId,
        offset: Offset,
        seek: u64,
    },
    /// Stop fetching partitions (the pipeline's in-flight limit).
    Pause(Vec<PartitionId>),
    /// Fetch paused partitions again.
    Resume(Vec<PartitionId>),
}

/// Everything the poll thread owns.
pub(crate) struct PollThread {
    pub(crate) consumer: Arc<BaseConsumer<GroupContext>>,
    pub(crate) commands: Receiver<Command>,
    pub(crate) source: SourceId,
    pub(crate) max_batch_records: usize,
    pub(crate) max_buffered: usize,
    /// Seek count per partition: records are tagged with it so the source
    /// can drop what was read before its latest seek.
    pub(crate) seeks: BTreeMap<PartitionId, u64>,
    /// Since when the source has been behind (more than `max_buffered`
    /// records waiting, not yet half taken) without a pause.
    pub(crate) behind_since: Option<Instant>,
    /// When the state was last logged.
    pub(crate) reported_at: Instant,
    /// When the assigned partitions were last attached again.
    pub(crate) attached_at: Instant,
    /// Where assigned partitions' messages arrive (see [`FetchQueue`]);
    /// `None` until [`run`](PollThread::run) creates it, or if librdkafka
    /// could not (then everything comes through the consumer queue).
    pub(crate) fetch: Option<Arc<FetchQueue>>,
    /// Records read through the fetch queue, and through the consumer
    /// queue (partitions not attached), for the state report.
    pub(crate) read: (u64, u64),
    /// The pipeline's pauses, and which of them librdkafka has seen (see
    /// [`crate::pauses`]).
    pub(crate) pauses: Pauses,
}

impl Drop for PollThread {
    fn drop(&mut self) {
        // The queue holds the consumer, whose context holds the queue:
        // taken out here, it goes before the consumer (librdkafka's handle
        // must outlive its queues), even if the thread unwinds.
        self.fetch = None;
        self.context()
            .fetch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
    }
}

impl PollThread {
    /// Poll until the source is dropped, then leave the group cleanly:
    /// closing the consumer revokes every partition through the rebalance
    /// callback, which commits them.
    pub(crate) fn run(mut self) {
        self.fetch = FetchQueue::new(&self.consumer).map(Arc::new);
        if self.fetch.is_none() {
            tracing::warn!("cannot create the fetch queue; reading through the consumer queue");
        }
        self.context()
            .fetch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone_from(&self.fetch);
        let mut busy = false;
        while self.serve_commands() {
            if self.attached_at.elapsed() >= REATTACH_EVERY {
                self.attached_at = Instant::now();
                self.reattach();
            }
            self.apply_due_pauses();
            if self.reported_at.elapsed() >= REPORT_EVERY {
                self.reported_at = Instant::now();
                self.report();
            }
            if self.backpressure() {
                std::thread::sleep(CATCH_UP_SLICE);
                continue;
            }
            let wait = if busy || self.has_chunk() {
                Duration::ZERO
            } else {
                POLL_WAIT
            };
            busy = self.take_fetched(wait) > 0;
            // Events (the rebalance callbacks run in here), and records of
            // partitions not attached to the fetch queue.
            busy |= self.poll_consumer_queue();
        }
        self.context().flush_chunk(&[]);
        if let Err(err) = self.consumer.close_queue() {
            tracing::warn!(%err, "cannot close the consumer cleanly");
            return;
        }
        let deadline = Instant::now() + CLOSE_TIMEOUT;
        while !self.consumer.closed() {
            if Instant::now() >= deadline {
                tracing::warn!(
                    group = %self.context().group,
                    timeout = ?CLOSE_TIMEOUT,
                    "the consumer did not leave the group in time (is the broker reachable?); \
                     dropping it, the group notices after its session timeout"
                );
                return;
            }
            let _ = self.consumer.poll(POLL_WAIT);
        }
    }

    /// Serve the consumer queue without waiting: its events, and up to a
    /// batch of records of partitions read through it. Whether it held
    /// records.
    fn poll_consumer_queue(&mut self) -> bool {
        for n in 0..self.max_batch_records {
            match self.consumer.poll(Duration::ZERO) {
                None => {
                    self.context().flush_chunk(&[]);
                    return n > 0;
                }
                Some(Ok(message)) => {
                    self.read.1 += 1;
                    self.take(&message);
                }
                // The error callback saw the same event first, with
                // librdkafka's reason, and fed the outage (or the refusal)
                // with it: counted again here, a failure that follows a
                // refusal would read as an outage.
                Some(Err(err))
                    if crate::outage::is_transport(&err) || crate::outage::is_refusal(&err) =>
                {
                    tracing::debug!(%err, "kafka consumer error");
                }
                // Said by the error callback, which has the topic's name.
                Some(Err(err)) if crate::outage::is_unknown_topic(&err) => {
                    tracing::debug!(%err, "kafka consumer error");
                }
                Some(Err(err)) => {
                    tracing::warn!(%err, "kafka consumer error");
                    if matches!(err, rdkafka::error::KafkaError::MessageConsumptionFatal(_)) {
                        self.context().send(Event::Fatal(err.to_string()));
                    }
                }
            }
        }
        true
    }

    /// Take up to a batch of fetched messages (waiting up to `wait` for
    /// the first) and send them on, one event per run of a partition.
    /// Returns how many were taken.
    fn take_fetched(&mut self, wait: Duration) -> usize {
        let Some(fetch) = &self.fetch else {
            return 0;
        };
        let consumed = fetch.consume(&self.consumer, self.max_batch_records, wait);
        if consumed.errors > 0 {
            tracing::debug!(
                errors = consumed.errors,
                "fetch errors from the partition queues"
            );
        }
        let batch = consumed.batch;
        if batch.len() == 0 {
            return 0;
        }
        self.read.0 += batch.len() as u64;
        // Records read through the consumer queue are older: first.
        self.context().flush_chunk(&[]);
        let mut run: Option<(usize, i32, PartitionId)> = None;
        let mut topic = None;
        let mut records = etl_record::reuse::records(batch.len());
        for i in 0..batch.len() {
            let Some(view) = batch.get(i) else {
                continue;
            };
            let same = run.is_some_and(|(t, p, _)| t == view.topic && p == view.partition);
            if !same {
                if let Some((_, _, partition)) = run {
                    self.send_records(partition, std::mem::take(&mut records));
                }
                run = batch
                    .topic_name(i)
                    .and_then(|t| self.context().map.id(t, view.partition).ok())
                    .map(|id| (view.topic, view.partition, id));
                topic = run.and_then(|(_, _, id)| self.context().map.shared_topic(id));
            }
            if let Some((_, _, partition)) = run {
                let mut record = view_to_record(&self.source, partition, view);
                record.topic.clone_from(&topic);
                records.push(record);
            }
        }
        if let Some((_, _, partition)) = run {
            self.send_records(partition, records);
        }
        batch.len()
    }

    /// Send records of `partition`, read now, to the source (or hold them
    /// back while the pipeline has the partition paused).
    fn send_records(&self, partition: PartitionId, records: Vec<Record>) {
        if records.is_empty() {
            return;
        }
        self.context().send_or_hold(Chunk {
            partition,
            seek: self.seeks.get(&partition).copied().unwrap_or(0),
            revocations: self.context().revocations(partition),
            records,
        });
    }

    /// Pass to librdkafka the pipeline's pauses that lasted
    /// [`PAUSE_GRACE`].
    fn apply_due_pauses(&mut self) {
        let due = {
            let paused = self.consumer.context().paused();
            self.pauses
                .due(Instant::now(), PAUSE_GRACE, |id| paused.contains(&id))
        };
        if !due.is_empty() {
            self.set_paused(&due, true);
        }
    }

    /// The partitions assigned to this member.
    fn assignment(&self) -> Vec<PartitionId> {
        match self.consumer.assignment() {
            Ok(assignment) => assignment
                .elements()
                .iter()
                .filter_map(|e| self.context().map.id(e.topic(), e.partition()).ok())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Attach every assigned partition to the fetch queue again.
    ///
    /// The rebalance callback attaches a partition when it is assigned,
    /// but librdkafka clears a partition's forwarding when it stops the
    /// partition's fetch, on its own thread and later than the revocation
    /// that asked for it: a stop served after the next assignment attached
    /// the partition again would leave it assigned, unpaused and read by
    /// nobody, for good (its queue stays marked as the application's, so
    /// librdkafka does not forward it to the consumer queue either).
    /// Attaching is idempotent and moves whatever waited in the partition's
    /// queue, in order, so doing it again bounds such a stall to
    /// [`REATTACH_EVERY`]. Only partitions of the current assignment are
    /// attached: a revoked one is never read again here (and what its queue
    /// still holds is of an ended fetch version, which librdkafka drops).
    fn reattach(&self) {
        let Some(fetch) = &self.fetch else {
            return;
        };
        let Ok(assignment) = self.consumer.assignment() else {
            return;
        };
        for e in assignment.elements() {
            if !fetch.attach(&self.consumer, e.topic(), e.partition()) {
                tracing::debug!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "cannot attach the partition to the fetch queue again"
                );
            }
        }
    }

    /// Log the member's state: its assignment, what is paused and where
    /// each partition's fetch stands.
    fn report(&self) {
        let assigned = self.assignment();
        let paused: Vec<PartitionId> = self.context().paused().iter().copied().collect();
        let positions: Vec<String> = match self.consumer.position() {
            Ok(tpl) => tpl
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    KafkaOffset::Offset(o) => format!("{}/{}@{o}", e.topic(), e.partition()),
                    other => format!("{}/{}@{other:?}", e.topic(), e.partition()),
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        tracing::info!(
            group = %self.context().group,
            ?assigned,
            paused_by_pipeline = ?paused,
            pauses_not_yet_in_librdkafka = self.pauses.pending(),
            held_for_paused = self.context().held_records(),
            backpressure = self.context().backpressure.load(Ordering::Acquire),
            buffered = self.context().buffered.load(Ordering::Acquire),
            ?positions,
            read_through_fetch_queue = self.read.0,
            read_through_consumer_queue = self.read.1,
            "kafka member state"
        );
    }

    fn context(&self) -> &GroupContext {
        self.consumer.context()
    }

    fn has_chunk(&self) -> bool {
        self.context()
            .chunk
            .lock()
            .map(|c| c.is_some())
            .unwrap_or(false)
    }

    /// Apply queued commands; `false` when the source is gone.
    fn serve_commands(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(Command::Seek {
                    partition,
                    offset,
                    seek,
                }) => self.seek(partition, offset, seek),
                // Records of the partitions read from now on are held back
                // here; librdkafka pauses them only if the pause lasts (see
                // `crate::pauses`).
                Ok(Command::Pause(ids)) => {
                    self.context().paused().extend(ids.iter().copied());
                    self.pauses.ask(&ids, Instant::now());
                }
                Ok(Command::Resume(ids)) => {
                    {
                        let mut paused = self.context().paused();
                        for id in &ids {
                            paused.remove(id);
                        }
                    }
                    let lift = self.pauses.lift(&ids);
                    if !lift.is_empty() && !self.context().backpressure.load(Ordering::Acquire) {
                        self.set_paused(&lift, false);
                    }
                    self.context().release(&ids);
                }
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn seek(&mut self, partition: PartitionId, offset: Offset, seek: u64) {
        self.seeks.insert(partition, seek);
        // Records gathered before the seek are of the old position.
        {
            let mut chunk = self
                .context()
                .chunk
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if chunk.as_ref().is_some_and(|c| c.partition == partition) {
                *chunk = None;
            }
        }
        self.context().drop_held(&[partition]);
        let Ok((topic, p)) = self.context().map.topic_partition(partition) else {
            return;
        };
        if let Err(err) = self
            .consumer
            .seek(topic, p, KafkaOffset::Offset(offset.0), SEEK_TIMEOUT)
        {
            // A partition revoked meanwhile cannot be positioned, and need
            // not be: its revocation is already on the way to the source.
            tracing::warn!(%partition, %offset, %err, "seek failed");
        }
    }

    /// While the source is behind, wait for it to catch up by half
    /// (`true`: do not poll now) for up to [`CATCH_UP_WAIT`], then pause
    /// every partition; resume them (except what the pipeline paused) once
    /// it caught up by half.
    fn backpressure(&mut self) -> bool {
        // Records held back for paused partitions wait in memory too.
        let buffered =
            self.context().buffered.load(Ordering::Acquire) + self.context().held_records();
        let engaged = self.context().backpressure.load(Ordering::Acquire);
        let caught_up = buffered <= self.max_buffered / 2;
        if !engaged {
            let since = match self.behind_since {
                None if buffered < self.max_buffered => return false,
                Some(_) if caught_up => {
                    self.behind_since = None;
                    return false;
                }
                Some(since) => since,
                None => *self.behind_since.insert(Instant::now()),
            };
            if since.elapsed() < CATCH_UP_WAIT {
                return true;
            }
            self.behind_since = None;
            self.context().backpressure.store(true, Ordering::Release);
            if let Ok(assignment) = self.consumer.assignment() {
                let _ = self.consumer.pause(&assignment);
            }
            self.pauses.all_paused();
        } else if caught_up {
            self.context().backpressure.store(false, Ordering::Release);
            let ids: Vec<PartitionId> = {
                let paused = self.context().paused();
                self.assignment()
                    .into_iter()
                    .filter(|id| !paused.contains(id))
                    .collect()
            };
            self.set_paused(&ids, false);
        }
        false
    }

    fn set_paused(&self, ids: &[PartitionId], pause: bool) {
        let mut tpl = TopicPartitionList::new();
        for id in ids {
            if let Ok((topic, p)) = self.context().map.topic_partition(*id) {
                tpl.add_partition(topic, p);
            }
        }
        if tpl.count() == 0 {
            return;
        }
        let result = if pause {
            self.consumer.pause(&tpl)
        } else {
            self.consumer.resume(&tpl)
        };
        if let Err(err) = result {
            tracing::warn!(?ids, pause, %err, "cannot pause or resume partitions");
        }
    }

    /// Add a message to the chunk, sending the chunk first when the message
    /// belongs elsewhere or it is full.
    fn take(&self, message: &BorrowedMessage<'_>) {
        let Ok(partition) = self.context().map.id(message.topic(), message.partition()) else {
            return;
        };
        let seek = self.seeks.get(&partition).copied().unwrap_or(0);
        let mut record = to_record(&self.source, partition, message);
        record.topic = self.context().map.shared_topic(partition);
        let full = {
            let mut guard = self
                .context()
                .chunk
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let same = guard
                .as_ref()
                .is_some_and(|c| c.partition == partition && c.seek == seek);
            if !same {
                if let Some(c) = guard.take() {
                    self.context().send_or_hold(c);
                }
                *guard = Some(Chunk {
                    partition,
                    seek,
                    revocations: self.context().revocations(partition),
                    records: etl_record::reuse::records(self.max_batch_records.min(1024)),
                });
            }
            match guard.as_mut() {
                Some(c) => {
                    c.records.push(record);
                    c.records.len() >= self.max_batch_records
                }
                None => false,
            }
        };
        if full {
            self.context().flush_chunk(&[]);
        }
    }
}

/// A record whose value and key point into the fetched message.
fn view_to_record(source: &SourceId, partition: PartitionId, view: MessageView) -> Record {
    let mut record = Record::new(
        Position::new(source.clone(), partition, Offset(view.offset)),
        view.value,
    );
    record.key = view.key;
    record.timestamp = view.timestamp.map(Timestamp);
    record.headers = view.headers;
    record
}

fn to_record(source: &SourceId, partition: PartitionId, message: &BorrowedMessage<'_>) -> Record {
    let mut record = Record::new(
        Position::new(source.clone(), partition, Offset(message.offset())),
        Bytes::copy_from_slice(message.payload().unwrap_or_default()),
    );
    if let Some(key) = message.key() {
        record.key = Some(Bytes::copy_from_slice(key));
    }
    if let Some(ms) = message.timestamp().to_millis() {
        record.timestamp = Some(Timestamp(ms));
    }
    if let Some(headers) = message.headers() {
        for h in headers.iter() {
            record
                .headers
                .push(h.key, h.value.map(Bytes::copy_from_slice));
        }
    }
    record
}
