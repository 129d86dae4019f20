//! The checkpointer thread: the single owner of partition state.
//!
//! It drains acknowledgement events before anything else (a biased loop:
//! acks, then one control message, then timers), so assign, revoke, ack
//! and commit of a partition are totally ordered and an epoch check can
//! never interleave with the revoke or replay that bumps it. Commits,
//! revokes and shutdown live in `commits.rs`.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, TryRecvError};
use etl_ack::{AckEvent, AckReceiver, WriteFence};
use etl_record::{Offset, PartitionId};
use tokio::sync::{mpsc, watch};

use crate::CheckpointError;
use crate::budget::InFlightBudget;
use crate::halt::{Halt, Halting, Verdict};
use crate::handle::{Assigned, CheckpointConfig, CheckpointSummary, Control, Reply};
use crate::metrics::{PartitionMetrics, PublishedMetrics};
use crate::partition_map::PartitionMap;
use crate::store::{OffsetStore, PartitionOffsets};
use crate::sync::{Arc, Mutex, lock};
use crate::tracker::{PartitionTracker, ReplayRequest};

/// Most ack events handled before a control message gets a turn, so a
/// flood of acks cannot starve a revoke.
const ACK_BURST: usize = 4096;
/// How often the metrics snapshot is refreshed while acks flow.
const METRICS_EVERY: Duration = Duration::from_millis(100);
/// Polling period while the ack side reports readiness without events.
const POLL: Duration = Duration::from_millis(2);

/// One assigned partition: a checkpointer may hold a great many (a file
/// source has one per input file), so nothing is wider than it needs.
pub(crate) struct Partition {
    pub(crate) tracker: PartitionTracker,
    /// Last committed offset (stored, or by this checkpointer), when
    /// `has_committed`: kept apart from its flag, as an `Option<Offset>`
    /// costs 8 bytes more a partition.
    committed: Offset,
    has_committed: bool,
    /// A watermark is committed only once it passes this: the stored
    /// offset or the start, whichever is higher, then each commit. So
    /// commits never regress and an untouched partition is not rewritten.
    pub(crate) floor: Offset,
    /// Identifies this assignment, so a revoke still waiting cannot drop a
    /// later assignment of the same partition.
    pub(crate) assignment: u64,
    pub(crate) revoking: bool,
}

impl Partition {
    /// Last committed offset (stored, or by this checkpointer).
    pub(crate) fn committed(&self) -> Option<Offset> {
        self.has_committed.then_some(self.committed)
    }

    /// A commit of `offset` succeeded: it is the last committed offset,
    /// and what a later watermark must pass.
    pub(crate) fn set_committed(&mut self, offset: Offset) {
        self.committed = offset;
        self.has_committed = true;
        self.floor = offset;
    }
}

/// A revoke waiting for in-flight batches.
pub(crate) struct PendingRevoke {
    /// Partitions, each with the assignment the revoke applies to.
    pub(crate) partitions: Vec<(PartitionId, u64)>,
    pub(crate) deadline: Instant,
    pub(crate) reply: Reply<PartitionOffsets>,
    /// The deadline passed with an exactly-once write of these partitions
    /// under way: the run halts, and the revocation waits for that write
    /// to end (the halt tears it down) before it hands anything over.
    pub(crate) unsettled: Option<Vec<PartitionId>>,
    /// On its last look, an exactly-once write of these partitions was
    /// under way: the revocation looks again every [`UNSETTLED_POLL`]
    /// (the write's end wakes it through its batch too, unless a failure
    /// ended that batch's epoch).
    pub(crate) writing: bool,
}

/// How often a revocation waiting for an exactly-once write looks whether
/// it ended (that write's end also wakes it, through its batch).
pub(crate) const UNSETTLED_POLL: Duration = Duration::from_millis(10);

/// The checkpointer thread's state.
pub(crate) struct Worker {
    pub(crate) config: CheckpointConfig,
    pub(crate) store: Box<dyn OffsetStore>,
    acks: AckReceiver,
    acks_open: bool,
    control: Receiver<Control>,
    replays: mpsc::UnboundedSender<ReplayRequest>,
    pub(crate) budget: InFlightBudget,
    pub(crate) metrics: Arc<Mutex<PublishedMetrics>>,
    pub(crate) partitions: PartitionMap<Partition>,
    pub(crate) next_epoch: PartitionMap<u32>,
    assignments: u64,
    pub(crate) revokes: Vec<PendingRevoke>,
    pub(crate) shutdown: Option<(Instant, Reply<CheckpointSummary>)>,
    pub(crate) last_commit: Instant,
    stale_unassigned: u64,
    pub(crate) commits: u64,
    pub(crate) commit_errors: u64,
    pub(crate) last_commit_error: Option<String>,
    /// The store's I/O failed ([`CheckpointError::Io`]): it is lost, every
    /// later commit fails too. The first such failure (path, step, kind,
    /// text), kept for the final answer.
    pub(crate) lost: Option<(std::path::PathBuf, &'static str, std::io::ErrorKind, String)>,
    /// Tells the handles the store is lost, so the run stops.
    pub(crate) lost_tx: watch::Sender<bool>,
    /// Whether the run halts: then a failure asks for no replay.
    pub(crate) halting: Halting,
    /// The acknowledgement channel's write fence: a revocation closes its
    /// partitions' epochs there, and asks it at its deadline whether an
    /// exactly-once write of them is still under way.
    pub(crate) fence: Arc<WriteFence>,
    /// Tells the handles a revocation halted the run, and why.
    pub(crate) unsettled_tx: watch::Sender<Option<(Vec<PartitionId>, Duration)>>,
}

impl Worker {
    pub(crate) fn new(
        config: CheckpointConfig,
        store: Box<dyn OffsetStore>,
        acks: AckReceiver,
        control: Receiver<Control>,
        replays: mpsc::UnboundedSender<ReplayRequest>,
        budget: InFlightBudget,
        metrics: Arc<Mutex<PublishedMetrics>>,
    ) -> Self {
        let fence = acks.fence();
        Worker {
            config,
            store,
            fence,
            unsettled_tx: watch::Sender::new(None),
            acks,
            acks_open: true,
            control,
            replays,
            budget,
            metrics,
            partitions: PartitionMap::default(),
            next_epoch: PartitionMap::default(),
            assignments: 0,
            revokes: Vec::new(),
            shutdown: None,
            last_commit: Instant::now(),
            stale_unassigned: 0,
            commits: 0,
            commit_errors: 0,
            last_commit_error: None,
            lost: None,
            lost_tx: watch::Sender::new(false),
            halting: Halting::new(Arc::new(Halt::new())),
        }
    }

    pub(crate) fn run(mut self) {
        let mut control_open = true;
        let mut last_publish = Instant::now();
        let mut poll = false;
        // Events handled since the metrics were last published: then the
        // wait below wakes in time to publish them, so a watermark never
        // looks stale for a whole commit interval.
        let mut unpublished = false;
        loop {
            let drained = self.drain_acks(ACK_BURST);
            let mut busy = drained;
            let mut publish = false;
            unpublished |= drained;
            if control_open {
                match self.control.try_recv() {
                    Ok(msg) => {
                        // Every ack sent before this message is queued by
                        // now: handle those first, so a caller that resolved
                        // batches and then asked (commit, revoke, shutdown)
                        // sees them counted.
                        let queued = self.acks.len();
                        self.drain_acks(queued);
                        self.handle(msg);
                        busy = true;
                        publish = true;
                    }
                    Err(TryRecvError::Disconnected) => control_open = false,
                    Err(TryRecvError::Empty) => {}
                }
            }
            self.finish_revokes(false);
            if self.last_commit.elapsed() >= self.config.commit_interval {
                // A failure is logged and counted; the next interval retries.
                // Either way the metrics say so now: on an idle pipeline
                // this commit is the last event, and nothing else would
                // publish it.
                if !matches!(self.commit_moved(), Ok(moved) if moved.is_empty()) {
                    publish = true;
                }
            }
            // Metrics are refreshed a few times a second, not per event, so
            // their cost does not ride on every acknowledgement.
            if publish || (unpublished && last_publish.elapsed() >= METRICS_EVERY) {
                self.publish_metrics();
                last_publish = Instant::now();
                unpublished = false;
            }
            if let Some(answer) = self.try_finish_shutdown() {
                // The store goes (with the lock it holds on its state)
                // before the caller hears the checkpointer stopped: a
                // pipeline started right after may open the same state.
                drop(self);
                answer.send();
                return;
            }
            if !control_open && self.revokes.is_empty() && (!self.acks_open || self.acks.is_empty())
            {
                // Every handle is gone: nobody can ask for anything again.
                // Commit what was delivered and stop.
                let _ = self.commit_moved();
                self.publish_metrics();
                return;
            }
            if drained {
                poll = false;
            }
            if !busy {
                let due = unpublished.then(|| last_publish + METRICS_EVERY);
                let woke_by_acks = self.wait(control_open, poll, due);
                // Woken by the ack side, yet the next drain may find
                // nothing: the `Acker` is gone (its channel stays "ready")
                // while handles may still resolve. Then poll, not spin.
                poll = woke_by_acks && self.acks.is_empty();
            }
        }
    }

    /// Handle up to `limit` ack events; whether any was handled.
    fn drain_acks(&mut self, limit: usize) -> bool {
        if !self.acks_open {
            return false;
        }
        let now = Instant::now();
        for n in 0..limit {
            match self.acks.try_next() {
                Ok(event) => self.on_event(event, now),
                Err(TryRecvError::Empty) => return n > 0,
                Err(TryRecvError::Disconnected) => {
                    // Every acker and handle is gone: nothing more will come.
                    self.acks_open = false;
                    return n > 0;
                }
            }
        }
        limit > 0
    }

    fn on_event(&mut self, event: AckEvent, now: Instant) {
        let partition = match event {
            AckEvent::Opened(m) => m.id.partition,
            AckEvent::Resolved(m) => m.id.partition,
        };
        let Some(state) = self.partitions.get_mut(&partition) else {
            // Not assigned (revoked, never assigned): stale. An open still
            // holds credit, which goes back now.
            self.stale_unassigned += 1;
            if let AckEvent::Opened(m) = event {
                self.budget.release(partition, m.bytes);
            }
            return;
        };
        let effect = match &event {
            AckEvent::Opened(m) => state.tracker.opened(m, now),
            AckEvent::Resolved(m) => state.tracker.resolved(m),
        };
        self.budget
            .release_many(partition, effect.release.batches, effect.release.bytes);
        let Some(replay) = effect.replay else {
            return;
        };
        self.next_epoch
            .insert(partition, replay.epoch.wrapping_add(1));
        if state.revoking {
            // A partition being revoked is not replayed here: its next
            // owner starts from the commit, which the failure pinned.
            tracing::info!(partition = %partition, failed_seq = replay.failed.seq, "batch failed during revoke; not replaying");
            return;
        }
        match self.halting.judge(&replay) {
            Verdict::Replay => {}
            // The run halts: nobody serves a replay, and the next run
            // starts from the commit, which the failure pinned.
            Verdict::Withhold => return,
            // The refuser learns of the failure that halts the run.
            Verdict::Halts => {
                let _ = self.replays.send(replay);
                return;
            }
        }
        tracing::warn!(
            partition = %partition, from = %replay.from, epoch = replay.epoch,
            failed_seq = replay.failed.seq, "batch failed; replaying the partition"
        );
        // The source side may be gone at shutdown; then there is nothing
        // left to replay into.
        let _ = self.replays.send(replay);
    }

    /// Handle a control message. Metrics are published before any reply,
    /// so a caller that got its answer sees a snapshot at least as new.
    fn handle(&mut self, msg: Control) {
        match msg {
            Control::Assign(partitions, reply) => {
                let result = self.assign(partitions);
                self.publish_metrics();
                let _ = reply.send(result);
            }
            Control::Revoke(partitions, hand_over, reply) => {
                self.start_revoke(partitions, hand_over, reply);
            }
            Control::Commit(reply) => {
                let result = self.commit_moved();
                self.publish_metrics();
                let _ = reply.send(result);
            }
            Control::Shutdown(reply) => {
                if let Some((_, earlier)) = self.shutdown.take() {
                    // A second shutdown supersedes the first; the first
                    // caller learns the checkpointer stopped.
                    let _ = earlier.send(Err(CheckpointError::Stopped));
                }
                self.shutdown = Some((Instant::now() + self.config.shutdown_timeout, reply));
            }
        }
    }

    fn assign(
        &mut self,
        partitions: Vec<(PartitionId, Option<Offset>)>,
    ) -> Result<Vec<Assigned>, CheckpointError> {
        // Reload on every assignment: another group member may have
        // committed since the last load. The committed offsets are looked
        // up in the store's own, not in a copy of every one.
        let mut committed_of = Vec::with_capacity(partitions.len());
        let mut lent = 0usize;
        self.store.load_with(&mut |stored| {
            lent += 1;
            committed_of.clear();
            committed_of.extend(partitions.iter().map(|(p, _)| stored.get(p).copied()));
        })?;
        if lent != 1 {
            // Not lent: no partition would be assigned; lent in pieces:
            // the partitions of all but the last would start from 0.
            return Err(CheckpointError::Store(
                format!("the offset store's load_with lent its offsets {lent} times, not once")
                    .into(),
            ));
        }
        let mut assigned = Vec::with_capacity(partitions.len());
        // Grown once, not step by step (a file source assigns its
        // partitions, one per input file, at once).
        self.partitions.reserve(partitions.len());
        self.next_epoch.reserve(partitions.len());
        for ((partition, start), committed) in partitions.into_iter().zip(committed_of) {
            if let Some(mut old) = self.partitions.remove(&partition) {
                // Re-assignment: end the old epoch first.
                let release = old.tracker.end_epoch();
                self.budget
                    .release_many(partition, release.batches, release.bytes);
            }
            let epoch = self.next_epoch.get(&partition).copied().unwrap_or(1);
            self.next_epoch.insert(partition, epoch.wrapping_add(1));
            let start = start.or(committed).unwrap_or(Offset(0));
            self.assignments += 1;
            self.partitions.insert(
                partition,
                Partition {
                    tracker: PartitionTracker::new(partition, epoch, start),
                    committed: committed.unwrap_or_default(),
                    has_committed: committed.is_some(),
                    floor: committed.map_or(start, |c| c.max(start)),
                    assignment: self.assignments,
                    revoking: false,
                },
            );
            assigned.push(Assigned {
                partition,
                epoch,
                start,
            });
        }
        Ok(assigned)
    }

    fn next_deadline(&self) -> Instant {
        let mut at = self.last_commit + self.config.commit_interval;
        for r in &self.revokes {
            at = at.min(if r.unsettled.is_some() || r.writing {
                Instant::now() + UNSETTLED_POLL
            } else {
                r.deadline
            });
        }
        if let Some((d, _)) = &self.shutdown {
            at = at.min(*d);
        }
        at
    }

    /// Wait for an event, the next deadline, or `metrics_due`; whether the
    /// ack side woke it. With `poll`, the ack side is checked every [`POLL`] instead.
    fn wait(&self, control_open: bool, poll: bool, metrics_due: Option<Instant>) -> bool {
        let mut deadline = self.next_deadline();
        if let Some(due) = metrics_due {
            deadline = deadline.min(due);
        }
        let mut select = Select::new();
        let watch_acks = self.acks_open && !poll;
        if watch_acks {
            self.acks.register(&mut select);
        } else if self.acks_open {
            deadline = deadline.min(Instant::now() + POLL);
        }
        let control = control_open.then(|| select.recv(&self.control));
        if !watch_acks && control.is_none() {
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            return false;
        }
        // Readiness only: the loop's try_recv calls do the receiving.
        match select.ready_deadline(deadline) {
            Ok(index) => watch_acks && Some(index) != control,
            Err(_) => false,
        }
    }

    /// Refresh the published metrics in place (see
    /// [`PublishedMetrics::refresh`]): publishing never holds two copies
    /// of every partition's figures (a file source has a partition per
    /// input file).
    pub(crate) fn publish_metrics(&self) {
        let now = Instant::now();
        let mut m = lock(&self.metrics);
        m.refresh(
            self.partitions.len(),
            self.partitions.iter().map(|(p, s)| {
                let t = &s.tracker;
                let metrics = PartitionMetrics {
                    epoch: t.epoch(),
                    watermark: t.watermark(),
                    committed: s.committed(),
                    in_flight_batches: t.unresolved() as u64,
                    in_flight_bytes: t.in_flight_bytes(),
                    oldest_unresolved_age: t.oldest_unresolved().map(|at| now - at),
                    failed_batches: t.failed_batches(),
                    replays: t.replays(),
                    stale_acks: t.stale(),
                };
                (*p, metrics)
            }),
        );
        m.commits = self.commits;
        m.commit_errors = self.commit_errors;
        m.last_commit_error.clone_from(&self.last_commit_error);
        m.stale_acks_unassigned = self.stale_unassigned;
    }
}
