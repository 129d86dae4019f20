//! The checkpointer: the single owner of partition state.
//!
//! It runs on its own OS thread. It drains acknowledgement events before
//! anything else (a biased loop: acks, then control messages, then timers),
//! so assign, revoke, ack and commit of a partition are totally ordered and
//! an epoch check can never interleave with the revoke that bumps it.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError};
use etl_ack::{AckEvent, AckReceiver};
use etl_record::{Offset, PartitionId};
use tokio::sync::{mpsc, oneshot};

use crate::CheckpointError;
use crate::budget::{InFlightBudget, InFlightLimits};
use crate::metrics::{CheckpointMetrics, PartitionMetrics};
use crate::store::{OffsetStore, Offsets};
use crate::sync::{Arc, Mutex, lock};
use crate::tracker::{Effect, PartitionTracker, ReplayRequest};

/// Most ack events handled before control messages get a turn, so a flood
/// of acks cannot starve a revoke.
const ACK_BURST: usize = 4096;
/// How often the metrics snapshot is refreshed while busy.
const METRICS_EVERY: Duration = Duration::from_millis(100);

/// Configuration of a checkpointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// How often moved watermarks are committed.
    pub commit_interval: Duration,
    /// How long a revoke waits for in-flight batches of the revoked
    /// partitions; keep it below a consumer group's session timeout.
    pub revoke_deadline: Duration,
    /// How long shutdown waits for in-flight batches before the final
    /// commit.
    pub shutdown_deadline: Duration,
    /// In-flight bounds.
    pub limits: InFlightLimits,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            commit_interval: Duration::from_secs(1),
            revoke_deadline: Duration::from_secs(10),
            shutdown_deadline: Duration::from_secs(30),
            limits: InFlightLimits::default(),
        }
    }
}

/// A partition's assignment: its fresh epoch and where to start reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assigned {
    /// The partition.
    pub partition: PartitionId,
    /// Its new epoch.
    pub epoch: u32,
    /// Seek here.
    pub start: Offset,
}

/// What the checkpointer committed last, returned by shutdown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointSummary {
    /// Committed offsets of the partitions assigned at shutdown.
    pub committed: Offsets,
    /// Whether in-flight batches were still unresolved at the deadline.
    pub timed_out: bool,
    /// Metrics at the end.
    pub metrics: CheckpointMetrics,
}

/// Replay requests for the source side.
pub type ReplayRequests = mpsc::UnboundedReceiver<ReplayRequest>;

type Reply<T> = oneshot::Sender<Result<T, CheckpointError>>;

enum Control {
    Assign(Vec<(PartitionId, Option<Offset>)>, Reply<Vec<Assigned>>),
    Revoke(Vec<PartitionId>, Reply<Offsets>),
    Commit(Reply<Offsets>),
    Shutdown(Reply<CheckpointSummary>),
}

/// Starts checkpointers.
#[derive(Debug)]
pub struct Checkpointer;

impl Checkpointer {
    /// Start a checkpointer thread owning `store` and draining `acks`.
    ///
    /// # Errors
    ///
    /// The thread could not be started.
    pub fn spawn(
        config: CheckpointConfig,
        store: Box<dyn OffsetStore>,
        acks: AckReceiver,
    ) -> Result<(CheckpointHandle, ReplayRequests), CheckpointError> {
        let (control_tx, control_rx) = crossbeam_channel::unbounded();
        let (replay_tx, replay_rx) = mpsc::unbounded_channel();
        let budget = InFlightBudget::new(config.limits);
        let metrics = Arc::new(Mutex::new(CheckpointMetrics::default()));
        let state = State {
            config,
            store,
            acks,
            acks_open: true,
            control: control_rx,
            replays: replay_tx,
            budget: budget.clone(),
            metrics: metrics.clone(),
            partitions: HashMap::new(),
            next_epoch: HashMap::new(),
            revokes: Vec::new(),
            shutdown: None,
            last_commit: Instant::now(),
            stale_unassigned: 0,
            commits: 0,
            commit_errors: 0,
            last_commit_error: None,
        };
        std::thread::Builder::new()
            .name("etl-checkpointer".to_owned())
            .spawn(move || state.run())
            .map_err(CheckpointError::Spawn)?;
        Ok((
            CheckpointHandle {
                control: control_tx,
                budget,
                metrics,
            },
            replay_rx,
        ))
    }
}

/// Talks to a running checkpointer. Cloneable.
#[derive(Clone, Debug)]
pub struct CheckpointHandle {
    control: Sender<Control>,
    budget: InFlightBudget,
    metrics: Arc<Mutex<CheckpointMetrics>>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::Assign(..) => "Assign",
            Control::Revoke(..) => "Revoke",
            Control::Commit(..) => "Commit",
            Control::Shutdown(..) => "Shutdown",
        })
    }
}

impl CheckpointHandle {
    fn request<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Control,
    ) -> Result<oneshot::Receiver<Result<T, CheckpointError>>, CheckpointError> {
        let (tx, rx) = oneshot::channel();
        self.control
            .send(make(tx))
            .map_err(|_| CheckpointError::Stopped)?;
        Ok(rx)
    }

    /// Start tracking partitions, each with fresh state and a fresh epoch.
    /// `Some(start)` overrides the store (a sink that keeps its own
    /// progress); `None` starts at the committed offset, or 0.
    ///
    /// # Errors
    ///
    /// The store could not be read, or the checkpointer stopped.
    pub async fn assign(
        &self,
        partitions: Vec<(PartitionId, Option<Offset>)>,
    ) -> Result<Vec<Assigned>, CheckpointError> {
        let rx = self.request(|r| Control::Assign(partitions, r))?;
        rx.await.map_err(|_| CheckpointError::Stopped)?
    }

    /// As [`assign`](Self::assign), blocking the calling thread (for
    /// callbacks outside async code, such as a rebalance callback).
    ///
    /// # Errors
    ///
    /// As [`assign`](Self::assign).
    pub fn assign_blocking(
        &self,
        partitions: Vec<(PartitionId, Option<Offset>)>,
    ) -> Result<Vec<Assigned>, CheckpointError> {
        let rx = self.request(|r| Control::Assign(partitions, r))?;
        rx.blocking_recv().map_err(|_| CheckpointError::Stopped)?
    }

    /// End the partitions' epochs: wait until their in-flight batches
    /// resolve (or the revoke deadline passes), commit their watermarks,
    /// drop their state. Other partitions are untouched; partitions not
    /// assigned are ignored.
    ///
    /// # Errors
    ///
    /// The commit failed, or the checkpointer stopped.
    pub async fn revoke(&self, partitions: Vec<PartitionId>) -> Result<Offsets, CheckpointError> {
        let rx = self.request(|r| Control::Revoke(partitions, r))?;
        rx.await.map_err(|_| CheckpointError::Stopped)?
    }

    /// As [`revoke`](Self::revoke), blocking the calling thread.
    ///
    /// # Errors
    ///
    /// As [`revoke`](Self::revoke).
    pub fn revoke_blocking(
        &self,
        partitions: Vec<PartitionId>,
    ) -> Result<Offsets, CheckpointError> {
        let rx = self.request(|r| Control::Revoke(partitions, r))?;
        rx.blocking_recv().map_err(|_| CheckpointError::Stopped)?
    }

    /// Commit every moved watermark now; returns what was committed.
    ///
    /// # Errors
    ///
    /// The commit failed, or the checkpointer stopped.
    pub async fn commit(&self) -> Result<Offsets, CheckpointError> {
        let rx = self.request(Control::Commit)?;
        rx.await.map_err(|_| CheckpointError::Stopped)?
    }

    /// Wait for in-flight batches (up to the shutdown deadline), make a
    /// final commit and stop the thread.
    ///
    /// # Errors
    ///
    /// The final commit failed, or the checkpointer had stopped.
    pub async fn shutdown(&self) -> Result<CheckpointSummary, CheckpointError> {
        let rx = self.request(Control::Shutdown)?;
        rx.await.map_err(|_| CheckpointError::Stopped)?
    }

    /// A snapshot of the metrics (refreshed after every burst of events).
    #[must_use]
    pub fn metrics(&self) -> CheckpointMetrics {
        lock(&self.metrics).clone()
    }

    /// The in-flight budget the source side reserves credit from.
    #[must_use]
    pub fn budget(&self) -> InFlightBudget {
        self.budget.clone()
    }
}

struct Partition {
    tracker: PartitionTracker,
    committed: Option<Offset>,
    revoking: bool,
}

struct PendingRevoke {
    partitions: Vec<PartitionId>,
    deadline: Instant,
    reply: Reply<Offsets>,
}

struct State {
    config: CheckpointConfig,
    store: Box<dyn OffsetStore>,
    acks: AckReceiver,
    acks_open: bool,
    control: Receiver<Control>,
    replays: mpsc::UnboundedSender<ReplayRequest>,
    budget: InFlightBudget,
    metrics: Arc<Mutex<CheckpointMetrics>>,
    partitions: HashMap<PartitionId, Partition>,
    next_epoch: HashMap<PartitionId, u32>,
    revokes: Vec<PendingRevoke>,
    shutdown: Option<(Instant, Reply<CheckpointSummary>)>,
    last_commit: Instant,
    stale_unassigned: u64,
    commits: u64,
    commit_errors: u64,
    last_commit_error: Option<String>,
}

impl State {
    fn run(mut self) {
        let mut control_open = true;
        let mut last_publish = Instant::now();
        loop {
            let mut busy = self.drain_acks();
            let mut publish = false;
            if control_open {
                match self.control.try_recv() {
                    Ok(msg) => {
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
                if let Err(e) = self.commit_moved() {
                    tracing::error!(error = %e, "periodic commit failed; will retry");
                }
            }
            // Metrics are refreshed a few times a second, not per event, so
            // their cost does not ride on every acknowledgement.
            if publish || last_publish.elapsed() >= METRICS_EVERY {
                self.publish_metrics();
                last_publish = Instant::now();
            }
            if self.try_finish_shutdown().is_some() {
                return;
            }
            if !control_open && (!self.acks_open || self.acks.is_empty()) && self.revokes.is_empty()
            {
                // Every handle is gone: nobody can ask for anything again.
                // Commit what was delivered and stop.
                if let Err(e) = self.commit_moved() {
                    tracing::error!(error = %e, "final commit failed");
                }
                self.publish_metrics();
                return;
            }
            if !busy {
                if !control_open && !self.acks_open {
                    return;
                }
                self.wait(control_open);
            }
        }
    }

    /// Handle up to [`ACK_BURST`] ack events; whether any was handled.
    fn drain_acks(&mut self) -> bool {
        if !self.acks_open {
            return false;
        }
        let now = Instant::now();
        for n in 0..ACK_BURST {
            match self.acks.try_next() {
                Ok(event) => self.on_event(event, now),
                Err(TryRecvError::Empty) => return n > 0,
                Err(TryRecvError::Disconnected) => {
                    // Every acker and handle is gone; a disconnected
                    // channel is always "ready", so stop waiting on it.
                    self.acks_open = false;
                    return n > 0;
                }
            }
        }
        true
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
        let effect: Effect = match &event {
            AckEvent::Opened(m) => state.tracker.opened(m, now),
            AckEvent::Resolved(m) => state.tracker.resolved(m),
        };
        self.budget
            .release_many(partition, effect.release.batches, effect.release.bytes);
        if let Some(replay) = effect.replay {
            self.next_epoch
                .insert(partition, replay.epoch.wrapping_add(1));
            if state.revoking {
                // A revoked partition is not replayed here; its next owner
                // starts from the commit.
                return;
            }
            tracing::warn!(
                partition = %partition, from = %replay.from, epoch = replay.epoch,
                failed_seq = replay.failed.seq, "batch failed; replaying the partition"
            );
            // The source side may be gone at shutdown; then there is
            // nothing left to replay into.
            let _ = self.replays.send(replay);
        }
    }

    fn handle(&mut self, msg: Control) {
        match msg {
            Control::Assign(partitions, reply) => {
                let _ = reply.send(self.assign(partitions));
            }
            Control::Revoke(partitions, reply) => {
                let known: Vec<PartitionId> = partitions
                    .into_iter()
                    .filter(|p| self.partitions.contains_key(p))
                    .collect();
                for p in &known {
                    if let Some(state) = self.partitions.get_mut(p) {
                        state.revoking = true;
                    }
                }
                self.revokes.push(PendingRevoke {
                    partitions: known,
                    deadline: Instant::now() + self.config.revoke_deadline,
                    reply,
                });
                self.finish_revokes(false);
            }
            Control::Commit(reply) => {
                let _ = reply.send(self.commit_moved());
            }
            Control::Shutdown(reply) => {
                self.shutdown = Some((Instant::now() + self.config.shutdown_deadline, reply));
            }
        }
    }

    fn assign(
        &mut self,
        partitions: Vec<(PartitionId, Option<Offset>)>,
    ) -> Result<Vec<Assigned>, CheckpointError> {
        // Reload on every assignment: another group member may have
        // committed since the last load.
        let stored = self.store.load()?;
        let mut assigned = Vec::with_capacity(partitions.len());
        for (partition, start) in partitions {
            if let Some(old) = self.partitions.remove(&partition) {
                // Re-assignment: end the old epoch first.
                let mut tracker = old.tracker;
                let release = tracker.end_epoch();
                self.budget
                    .release_many(partition, release.batches, release.bytes);
            }
            let epoch = self.next_epoch.get(&partition).copied().unwrap_or(1);
            self.next_epoch.insert(partition, epoch.wrapping_add(1));
            let committed = stored.get(&partition).copied();
            let start = start.or(committed).unwrap_or(Offset(0));
            self.partitions.insert(
                partition,
                Partition {
                    tracker: PartitionTracker::new(partition, epoch, start),
                    committed,
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

    fn unresolved(&self, partitions: &[PartitionId]) -> usize {
        partitions
            .iter()
            .filter_map(|p| self.partitions.get(p))
            .map(|s| s.tracker.unresolved())
            .sum()
    }

    fn finish_revokes(&mut self, force: bool) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.revokes.len() {
            let ready = force
                || now >= self.revokes[i].deadline
                || self.unresolved(&self.revokes[i].partitions) == 0;
            if !ready {
                i += 1;
                continue;
            }
            let revoke = self.revokes.swap_remove(i);
            let result = self.commit_partitions(&revoke.partitions);
            for p in &revoke.partitions {
                if let Some(mut state) = self.partitions.remove(p) {
                    let release = state.tracker.end_epoch();
                    self.next_epoch
                        .insert(*p, state.tracker.epoch().wrapping_add(1));
                    self.budget.release_many(*p, release.batches, release.bytes);
                }
            }
            if now >= revoke.deadline && result.is_ok() {
                tracing::warn!(partitions = ?revoke.partitions, "revoke deadline passed with batches in flight; committed the watermark they pinned");
            }
            let _ = revoke.reply.send(result);
        }
    }

    /// Commit the watermarks of `partitions` that moved past their last
    /// commit; returns what was committed.
    fn commit_partitions(
        &mut self,
        partitions: &[PartitionId],
    ) -> Result<Offsets, CheckpointError> {
        let mut moved = Offsets::new();
        for p in partitions {
            if let Some(state) = self.partitions.get(p) {
                let w = state.tracker.watermark();
                if state.committed.is_none_or(|c| w > c) {
                    moved.insert(*p, w);
                }
            }
        }
        if moved.is_empty() {
            return Ok(moved);
        }
        match self.store.commit(&moved) {
            Ok(()) => {
                for (p, o) in &moved {
                    if let Some(state) = self.partitions.get_mut(p) {
                        state.committed = Some(*o);
                    }
                }
                self.commits += 1;
                self.last_commit_error = None;
                tracing::debug!(offsets = ?moved, "committed");
                Ok(moved)
            }
            Err(e) => {
                self.commit_errors += 1;
                self.last_commit_error = Some(e.to_string());
                Err(CheckpointError::Commit {
                    partitions: moved.keys().copied().collect(),
                    source: Box::new(e),
                })
            }
        }
    }

    fn commit_moved(&mut self) -> Result<Offsets, CheckpointError> {
        self.last_commit = Instant::now();
        let all: Vec<PartitionId> = self.partitions.keys().copied().collect();
        self.commit_partitions(&all)
    }

    fn try_finish_shutdown(&mut self) -> Option<()> {
        let (deadline, _) = self.shutdown.as_ref()?;
        let all: Vec<PartitionId> = self.partitions.keys().copied().collect();
        let unresolved = self.unresolved(&all);
        let timed_out = Instant::now() >= *deadline;
        if unresolved > 0 && !timed_out {
            return None;
        }
        self.finish_revokes(true);
        let result = self.commit_moved();
        self.publish_metrics();
        let (_, reply) = self.shutdown.take()?;
        let committed: Offsets = self
            .partitions
            .iter()
            .filter_map(|(p, s)| s.committed.map(|c| (*p, c)))
            .collect();
        let summary = result.map(|_| CheckpointSummary {
            committed,
            timed_out: unresolved > 0,
            metrics: lock(&self.metrics).clone(),
        });
        let _ = reply.send(summary);
        Some(())
    }

    fn next_deadline(&self) -> Instant {
        let mut at = self.last_commit + self.config.commit_interval;
        for r in &self.revokes {
            at = at.min(r.deadline);
        }
        if let Some((d, _)) = &self.shutdown {
            at = at.min(*d);
        }
        at
    }

    fn wait(&self, control_open: bool) {
        let deadline = self.next_deadline();
        let mut select = Select::new();
        if self.acks_open {
            self.acks.register(&mut select);
        }
        if control_open {
            select.recv(&self.control);
        }
        // Readiness only: the loop's try_recv calls do the receiving.
        let _ = select.ready_deadline(deadline);
    }

    fn publish_metrics(&self) {
        let now = Instant::now();
        let partitions: BTreeMap<PartitionId, PartitionMetrics> = self
            .partitions
            .iter()
            .map(|(p, s)| {
                let t = &s.tracker;
                (
                    *p,
                    PartitionMetrics {
                        epoch: t.epoch(),
                        watermark: t.watermark(),
                        committed: s.committed,
                        in_flight_batches: t.in_flight_batches() as u64,
                        in_flight_bytes: t.in_flight_bytes(),
                        oldest_unresolved_age: t.oldest_unresolved().map(|at| now - at),
                        failed_batches: t.failed_batches(),
                        replays: t.replays(),
                        stale_acks: t.stale(),
                    },
                )
            })
            .collect();
        let mut m = lock(&self.metrics);
        m.partitions = partitions;
        m.commits = self.commits;
        m.commit_errors = self.commit_errors;
        m.last_commit_error.clone_from(&self.last_commit_error);
        m.stale_acks_unassigned = self.stale_unassigned;
    }
}
