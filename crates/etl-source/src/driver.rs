//! The source driver: polls a source, opens a handle per batch under the
//! partition's epoch, waits for credits, serves replays and revocations.

use std::collections::BTreeMap;

use etl_ack::{AckSet, Acked, Acker, BatchId, BatchMeta};
use etl_checkpoint::{
    CheckpointError, CheckpointHandle, InFlightBudget, ReplayRequest, ReplayRequests,
};
use etl_record::{DeadLetter, Offset, PartitionId, Record};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::packed::extend_packed;
use crate::poison::{PoisonTracker, Verdict};
use crate::{
    BoxSource, DriverExit, PoisonPolicy, PollBatch, Source, SourceDriverConfig, SourceError,
    SourceEvent, SourceMetricsHandle, SourceOutput,
};

/// Runs one [`Source`]: turns its batches into acknowledged output.
///
/// For every partition the source announces, the driver asks the
/// checkpointer for an epoch and a start offset, and seeks there. Each
/// poll batch then waits for in-flight credits
/// ([`InFlightBudget::acquire`]), gets one handle opened through
/// [`Acker::open`] with `BatchId { partition, epoch, seq }`, and goes
/// downstream as [`SourceOutput`]s holding clones of it. A
/// [`ReplayRequest`] seeks its partition back to the watermark under the
/// new epoch; a range that keeps failing is narrowed to single records and
/// a record that fails alone `max_replays` times is poison (see
/// [`PoisonPolicy`]). A revoked partition stops being emitted and is
/// drained and committed by the checkpointer.
///
/// The driver asks the source for its next event only once the batch it
/// took before is opened (or dropped as stale): a source whose partitions
/// are revoked from another thread (a consumer group's rebalance
/// callback) may wait until the driver takes the revocation, and then
/// knows that every batch of those partitions it handed out is counted by
/// the checkpointer.
///
/// Invariant: no record leaves the driver without a handle opened for its
/// batch under its partition's current epoch. Output the driver cannot
/// hand downstream (shutdown, closed channel) is failed, never dropped as
/// delivered.
pub struct SourceDriver {
    source: BoxSource,
    acker: Acker,
    checkpoint: CheckpointHandle,
    budget: InFlightBudget,
    replays: ReplayRequests,
    output: mpsc::Sender<SourceOutput>,
    config: SourceDriverConfig,
    partitions: BTreeMap<PartitionId, PartitionState>,
    poison: PoisonTracker,
    metrics: SourceMetricsHandle,
    /// Set once the source reported the end of its input.
    input_ended: watch::Sender<bool>,
}

// Compile-time check: the driver and the future of its run move into a
// spawned task.
const _: fn() = || {
    fn assert_send<T: Send>(_: &T) {}
    fn run_is_send(driver: SourceDriver) {
        assert_send(&driver);
        assert_send(&driver.run(CancellationToken::new()));
    }
    let _ = run_is_send;
};

impl std::fmt::Debug for SourceDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceDriver")
            .field("partitions", &self.partitions)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, Debug)]
struct PartitionState {
    epoch: u32,
    /// Batches opened in the current epoch.
    seq: u64,
    /// Highest offset emitted in the current epoch, once `seq > 0`
    /// (meaningless before). Not an `Option`: that would cost 8 bytes
    /// more a partition, and a file source has one per input file.
    last: Offset,
}

impl PartitionState {
    /// A partition assigned or sought back under `epoch`: nothing emitted.
    fn new(epoch: u32) -> Self {
        PartitionState {
            epoch,
            seq: 0,
            last: Offset(0),
        }
    }

    /// Highest offset emitted in the current epoch.
    fn last_emitted(&self) -> Option<Offset> {
        (self.seq > 0).then_some(self.last)
    }
}

/// What woke the main loop.
enum Wake {
    Shutdown,
    Replay(ReplayRequest),
    Event(Result<SourceEvent, SourceError>),
    Timer,
    Commit,
}

/// One item of a batch, records and rejected input merged by offset.
enum Item {
    Record(Record),
    Rejected(DeadLetter),
}

/// A group of a batch that travels under one handle.
enum Group {
    /// Records and rejected input, merged by offset; records may be
    /// poison.
    Items(Vec<Item>),
    /// Records only, in offset order, none of them isolated or poison:
    /// the common case, handed on as they came.
    Records(Vec<Record>),
}

impl Group {
    fn first(&self) -> Option<Offset> {
        match self {
            Group::Items(items) => items.first().map(Item::offset),
            Group::Records(records) => records.first().map(|r| r.position.offset),
        }
    }

    fn last(&self) -> Option<Offset> {
        match self {
            Group::Items(items) => items.last().map(Item::offset),
            Group::Records(records) => records.last().map(|r| r.position.offset),
        }
    }

    fn len(&self) -> usize {
        match self {
            Group::Items(items) => items.len(),
            Group::Records(records) => records.len(),
        }
    }

    /// In-flight credit: payload plus the per-record overhead.
    fn bytes(&self, overhead: u64) -> u64 {
        match self {
            Group::Items(items) => items.iter().map(|i| i.bytes(overhead)).sum(),
            Group::Records(records) => records.iter().map(|r| overhead + r.byte_len() as u64).sum(),
        }
    }
}

impl Item {
    fn offset(&self) -> Offset {
        match self {
            Item::Record(r) => r.position.offset,
            Item::Rejected(d) => d.record.position.offset,
        }
    }

    /// In-flight credit: payload plus the per-record overhead.
    fn bytes(&self, overhead: u64) -> u64 {
        overhead
            + match self {
                Item::Record(r) => r.byte_len() as u64,
                Item::Rejected(d) => d.record.byte_len() as u64,
            }
    }
}

impl SourceDriver {
    /// A driver for `source`, opening batches with `acker`, taking epochs,
    /// start offsets and credits from `checkpoint`, serving `replays`, and
    /// sending output on `output`.
    pub fn new(
        source: impl Source + 'static,
        acker: Acker,
        checkpoint: CheckpointHandle,
        replays: ReplayRequests,
        output: mpsc::Sender<SourceOutput>,
        config: SourceDriverConfig,
    ) -> Self {
        SourceDriver {
            source: Box::new(source),
            acker,
            budget: checkpoint.budget(),
            checkpoint,
            replays,
            output,
            poison: PoisonTracker::new(config.max_replays),
            config,
            partitions: BTreeMap::new(),
            metrics: SourceMetricsHandle::default(),
            input_ended: watch::Sender::new(false),
        }
    }

    /// Turns `true` once the source has reported the end of its input (a
    /// bounded source read to its end) and stays so: what is still on its
    /// way downstream is the last of it, or a replay. Sinks use it to write
    /// their last partial batch at once rather than linger for more.
    #[must_use]
    pub fn input_ended(&self) -> watch::Receiver<bool> {
        self.input_ended.subscribe()
    }

    /// The driver's counters, readable while it runs.
    #[must_use]
    pub fn metrics(&self) -> SourceMetricsHandle {
        self.metrics.clone()
    }

    /// Run until `shutdown` is cancelled, the source ends and everything
    /// emitted is resolved, or an error. Cancellation stops polling at
    /// once; output not yet handed downstream is failed. The driver does
    /// not shut the checkpointer down: the caller does, after the sinks
    /// drained.
    ///
    /// # Errors
    ///
    /// Errors of the source, of the checkpointer, a closed downstream
    /// channel, a contract violation of the source, or a poison record
    /// under [`PoisonPolicy::Halt`]. On an error the driver first tells
    /// the checkpointer that the run halts
    /// ([`CheckpointHandle::halt`]): nothing serves a replay any more.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<DriverExit, SourceError> {
        let result = self.serve(shutdown).await;
        if result.is_err() {
            // The run ends on this error; what fails from now on (the
            // teardown, a batch still being written) asks for no replay.
            self.checkpoint.halt();
        }
        result
    }

    async fn serve(&mut self, shutdown: CancellationToken) -> Result<DriverExit, SourceError> {
        let mut ended = false;
        // Whether the watermarks were refreshed since the source ended.
        let mut refreshed = false;
        let mut commit_tick = self.config.source_commit_interval.map(|every| {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick
        });
        loop {
            let wait = if ended {
                self.config.end_check_interval
            } else {
                self.config.idle_backoff
            };
            let wake = tokio::select! {
                biased;
                () = shutdown.cancelled() => Wake::Shutdown,
                Some(req) = self.replays.recv() => Wake::Replay(req),
                _ = async { commit_tick.as_mut()?.tick().await; Some(()) }, if commit_tick.is_some() => Wake::Commit,
                event = self.source.next(), if !ended => Wake::Event(event),
                () = tokio::time::sleep(wait), if ended => Wake::Timer,
            };
            match wake {
                Wake::Shutdown => return Ok(DriverExit::Shutdown),
                Wake::Replay(req) => {
                    self.replay(req).await?;
                    ended = false;
                    refreshed = false;
                }
                Wake::Timer => {
                    if self.all_resolved() {
                        return Ok(DriverExit::Ended);
                    }
                    // Nothing in flight means the checkpointer has handled
                    // every resolution, but it publishes watermarks only a
                    // few times a second (and not while it sleeps until its
                    // next commit). A control message makes them current:
                    // without it a bounded run ends up to a commit interval
                    // late.
                    if !refreshed && self.budget.in_flight().batches == 0 && self.replays.is_empty()
                    {
                        refreshed = true;
                        if self.checkpoint.commit().await.is_ok() && self.all_resolved() {
                            return Ok(DriverExit::Ended);
                        }
                    }
                }
                Wake::Commit => {
                    let committed = self.checkpoint.commit().await?;
                    self.source.commit(&committed).await?;
                }
                Wake::Event(event) => match event? {
                    SourceEvent::Assigned(partitions) => self.assign(partitions).await?,
                    SourceEvent::Revoked(partitions) => self.revoke(partitions).await?,
                    SourceEvent::Batch(batch) => {
                        if !self.emit(batch, &shutdown).await? {
                            return Ok(DriverExit::Shutdown);
                        }
                    }
                    SourceEvent::Idle => {
                        // Records may arrive at a partition nothing is
                        // read from (paused, or caught up): its lag grows.
                        for p in self.partitions.keys() {
                            if let Some(high) = self.source.high_watermark(*p) {
                                self.metrics.update(*p, |m| m.high_watermark = Some(high));
                            }
                        }
                        self.metrics.set_gauges(self.source.gauges());
                        let wake = tokio::select! {
                            biased;
                            () = shutdown.cancelled() => Wake::Shutdown,
                            Some(req) = self.replays.recv() => Wake::Replay(req),
                            () = tokio::time::sleep(self.config.idle_backoff) => Wake::Timer,
                        };
                        match wake {
                            Wake::Shutdown => return Ok(DriverExit::Shutdown),
                            Wake::Replay(req) => self.replay(req).await?,
                            _ => {}
                        }
                    }
                    SourceEvent::End => {
                        ended = true;
                        self.input_ended.send_replace(true);
                    }
                },
            }
        }
    }

    /// Whether everything emitted is delivered: nothing in flight, no
    /// replay pending, and every partition's watermark past the last offset
    /// emitted (a failure pins the watermark, so a replay request still on
    /// its way cannot be missed).
    fn all_resolved(&self) -> bool {
        if self.budget.in_flight().batches != 0 || !self.replays.is_empty() {
            return false;
        }
        // Read in place: a copy of the snapshot would be a second copy
        // of every partition's metrics (a partition per input file).
        self.checkpoint.with_metrics(|metrics| {
            self.partitions
                .iter()
                .all(|(p, state)| match state.last_emitted() {
                    None => true,
                    Some(last) => metrics.partition(*p).is_some_and(|m| m.watermark > last),
                })
        })
    }

    async fn assign(&mut self, partitions: Vec<PartitionId>) -> Result<(), SourceError> {
        let request = partitions
            .iter()
            .map(|p| (*p, self.config.start_offsets.get(p).copied()))
            .collect();
        let assigned = self.checkpoint.assign(request).await?;
        self.metrics
            .assigned(assigned.iter().map(|a| (a.partition, a.epoch)));
        extend_packed(
            &mut self.partitions,
            assigned
                .iter()
                .map(|a| (a.partition, PartitionState::new(a.epoch))),
        );
        for a in assigned {
            tracing::debug!(partition = %a.partition, epoch = a.epoch, start = %a.start, "assigned");
            self.poison.reset(a.partition);
            self.source.seek(a.partition, a.start).await?;
        }
        Ok(())
    }

    async fn revoke(&mut self, partitions: Vec<PartitionId>) -> Result<(), SourceError> {
        for p in &partitions {
            self.partitions.remove(p);
            self.poison.reset(*p);
            self.metrics.update(*p, |m| m.assigned = false);
        }
        let revoked = if self.source.hands_over_revoked() {
            self.checkpoint.hand_over(partitions.clone()).await
        } else {
            self.checkpoint.revoke(partitions.clone()).await
        };
        let committed = match revoked {
            Ok(committed) => committed,
            // The partitions are gone either way (a consumer group that
            // dropped this member while its coordinator was unreachable):
            // the previous commit stands, and their next owner reads on
            // from it, so what was delivered since is read again, never
            // lost. Not a reason to end the run, whichever of the revoke
            // paths (this one, or a group callback's) saw the failure. A
            // local store's I/O failure (a full disk) is another matter:
            // every later commit would fail too, so it still ends the run.
            Err(CheckpointError::Commit { source, .. })
                if !matches!(*source, CheckpointError::Io { .. }) =>
            {
                tracing::warn!(
                    ?partitions, error = %source,
                    "revoked partitions could not be committed; their next owner reads them again from the last commit"
                );
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        tracing::debug!(?committed, "revoked and committed");
        self.source.commit(&committed).await
    }

    async fn replay(&mut self, req: ReplayRequest) -> Result<(), SourceError> {
        let Some(state) = self.partitions.get_mut(&req.partition) else {
            tracing::debug!(partition = %req.partition, "replay request of an unassigned partition ignored");
            return Ok(());
        };
        if req.epoch <= state.epoch {
            tracing::debug!(partition = %req.partition, epoch = req.epoch, "stale replay request ignored");
            return Ok(());
        }
        *state = PartitionState::new(req.epoch);
        let verdict = self.poison.failed(req.failed, req.from);
        tracing::info!(partition = %req.partition, from = %req.from, epoch = req.epoch, "replaying");
        if let Verdict::Poison { offset, replays } = verdict {
            if self.config.poison == PoisonPolicy::Halt {
                return Err(SourceError::Poison {
                    partition: req.partition,
                    offset,
                    replays,
                });
            }
            tracing::warn!(partition = %req.partition, %offset, replays, "poison record goes to the dead-letter path");
        }
        self.metrics.update(req.partition, |m| {
            m.replays += 1;
            m.epoch = req.epoch;
            m.position = None;
        });
        self.source.seek(req.partition, req.from).await
    }

    /// Emit one poll batch, split where records must travel alone. Returns
    /// false when shutdown interrupted it.
    async fn emit(
        &mut self,
        batch: PollBatch,
        shutdown: &CancellationToken,
    ) -> Result<bool, SourceError> {
        let partition = batch.partition;
        if !self.partitions.contains_key(&partition) {
            return Err(SourceError::Contract {
                partition,
                reason: "a batch of a partition that is not assigned".into(),
            });
        }
        let groups = match self.ordered(batch) {
            Ok(records) => vec![Group::Records(records)],
            Err(batch) => {
                if let Err(reason) = batch.check() {
                    return Err(SourceError::Contract { partition, reason });
                }
                self.split(batch).into_iter().map(Group::Items).collect()
            }
        };
        for group in groups {
            // A replay of this partition while waiting for credits makes
            // the rest of the batch stale: the source was sought back.
            let epoch = self.partitions.get(&partition).map(|s| s.epoch);
            // Summed once a group: the credit taken is the credit given
            // back or carried by the batch's handle.
            let bytes = group.bytes(self.config.record_overhead_bytes);
            if !self.reserve(partition, bytes, shutdown).await? {
                return Ok(false);
            }
            let state = self.partitions.get(&partition).copied();
            if state.map(|s| s.epoch) != epoch || state.is_none() {
                self.budget.release(partition, bytes);
                return Ok(true);
            }
            if !self
                .open_and_send(partition, group, bytes, shutdown)
                .await?
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The fast path: a batch of records only, of its partition, with
    /// offsets strictly increasing and none isolated or poison, goes on
    /// as it came (one pass, no sort, no regrouping). Anything else comes
    /// back for the full check and [`split`](Self::split).
    fn ordered(&self, batch: PollBatch) -> Result<Vec<Record>, PollBatch> {
        let partition = batch.partition;
        let (Some(first), Some(last)) = (batch.records.first(), batch.records.last()) else {
            return Err(batch);
        };
        let (first, last) = (first.position.offset, last.position.offset);
        let plain = batch.rejected.is_empty()
            && batch
                .records
                .iter()
                .all(|r| r.position.partition == partition)
            && batch
                .records
                .windows(2)
                .all(|w| w[0].position.offset < w[1].position.offset)
            && !self.poison.affects(partition, first, last);
        if plain { Ok(batch.records) } else { Err(batch) }
    }

    /// Group the batch's items: runs of ordinary items together, every
    /// isolated (narrowed or poison) item alone.
    fn split(&self, batch: PollBatch) -> Vec<Vec<Item>> {
        let partition = batch.partition;
        let mut items: Vec<Item> = batch
            .records
            .into_iter()
            .map(Item::Record)
            .chain(batch.rejected.into_iter().map(Item::Rejected))
            .collect();
        items.sort_by_key(Item::offset);
        // Almost always nothing is isolated: the batch stays one group.
        if !items
            .iter()
            .any(|item| self.poison.isolate(partition, item.offset()))
        {
            return vec![items];
        }
        let mut groups: Vec<Vec<Item>> = Vec::new();
        let mut run: Vec<Item> = Vec::with_capacity(items.len());
        for item in items {
            if self.poison.isolate(partition, item.offset()) {
                if !run.is_empty() {
                    groups.push(std::mem::take(&mut run));
                }
                groups.push(vec![item]);
            } else {
                run.push(item);
            }
        }
        if !run.is_empty() {
            groups.push(run);
        }
        groups
    }

    /// Wait for a group's `bytes` of credit, serving replays meanwhile.
    /// False when shutdown came first.
    async fn reserve(
        &mut self,
        partition: PartitionId,
        bytes: u64,
        shutdown: &CancellationToken,
    ) -> Result<bool, SourceError> {
        if self.budget.try_acquire(partition, bytes) {
            return Ok(true);
        }
        self.source.pause(&[partition]).await?;
        let budget = self.budget.clone();
        let acquire = budget.acquire(partition, bytes);
        tokio::pin!(acquire);
        loop {
            let wake = tokio::select! {
                biased;
                () = shutdown.cancelled() => Wake::Shutdown,
                Some(req) = self.replays.recv() => Wake::Replay(req),
                () = &mut acquire => Wake::Timer,
            };
            match wake {
                Wake::Shutdown => return Ok(false),
                Wake::Replay(req) => self.replay(req).await?,
                _ => break,
            }
        }
        if self.partitions.contains_key(&partition) {
            self.source.resume(&[partition]).await?;
        }
        Ok(true)
    }

    /// Open the group's handle under the current epoch and send it down;
    /// `bytes` is the credit reserved for it.
    async fn open_and_send(
        &mut self,
        partition: PartitionId,
        group: Group,
        bytes: u64,
        shutdown: &CancellationToken,
    ) -> Result<bool, SourceError> {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            self.budget.release(partition, bytes);
            return Ok(true);
        };
        let Some(state) = self.partitions.get_mut(&partition) else {
            self.budget.release(partition, bytes);
            return Ok(true);
        };
        let id = BatchId {
            partition,
            epoch: state.epoch,
            seq: state.seq,
        };
        let meta = BatchMeta {
            id,
            first_offset: first,
            last_offset: last,
            records: group.len() as u32,
            bytes,
        };
        let ack = match self.acker.open(meta) {
            Ok(ack) => ack,
            Err(_) => {
                self.budget.release(partition, bytes);
                return Err(SourceError::CheckpointerGone { partition });
            }
        };
        // Until every output of this batch is handed downstream, the batch
        // is failed if this future is dropped (the task aborted, the driver
        // cancelled from outside) or unwinds: a bare handle would resolve
        // *Delivered* on drop and commit records nobody received.
        let in_hand = AckSet::from(vec![ack.clone()]);
        state.seq += 1;
        state.last = last;
        self.poison.opened(id, first, last, group.len());

        let (mut rejected, mut poisoned) = (0u64, 0u64);
        let mut letters = Vec::new();
        let items = match group {
            // Checked by `ordered`: none of them is poison.
            Group::Records(records) => {
                return self
                    .send_outputs(
                        partition,
                        records,
                        letters,
                        (ack, in_hand),
                        (0, 0),
                        last,
                        shutdown,
                    )
                    .await;
            }
            Group::Items(items) => items,
        };
        let mut records = Vec::with_capacity(items.len());
        for item in items {
            match item {
                Item::Record(r) if self.poison.is_poison(partition, r.position.offset) => {
                    poisoned += 1;
                    let reason = format!(
                        "poison record: partition {partition} offset {} failed {} replays on its own",
                        r.position.offset, self.config.max_replays
                    );
                    letters.push(DeadLetter::new(r, reason));
                }
                Item::Record(r) => records.push(r),
                Item::Rejected(d) => {
                    rejected += 1;
                    letters.push(d);
                }
            }
        }
        self.send_outputs(
            partition,
            records,
            letters,
            (ack, in_hand),
            (rejected, poisoned),
            last,
            shutdown,
        )
        .await
    }

    /// Hand a group's records and dead letters downstream under its
    /// handle, `ack`; `in_hand` (a clone of it) fails the batch unless
    /// everything was handed on. False when shutdown came first.
    #[allow(clippy::too_many_arguments)]
    async fn send_outputs(
        &mut self,
        partition: PartitionId,
        records: Vec<Record>,
        letters: Vec<DeadLetter>,
        (ack, in_hand): (etl_ack::AckRef, AckSet),
        (rejected, poisoned): (u64, u64),
        last: Offset,
        shutdown: &CancellationToken,
    ) -> Result<bool, SourceError> {
        let count = records.len() as u64;
        let high_watermark = self.source.high_watermark(partition);
        self.metrics.set_gauges(self.source.gauges());
        self.metrics.update(partition, |m| {
            if high_watermark.is_some() {
                m.high_watermark = high_watermark;
            }
            m.batches += 1;
            m.records += count;
            m.rejected += rejected;
            m.poison_records += poisoned;
            m.position = Some(last);
        });
        let mut outputs = Vec::with_capacity(1 + letters.len());
        if !records.is_empty() {
            outputs.push(SourceOutput::Batch(Acked::new(records, ack.clone())));
        }
        outputs.extend(
            letters
                .into_iter()
                .map(|d| SourceOutput::DeadLetter(Acked::new(d, ack.clone()))),
        );
        for output in outputs {
            let sent = tokio::select! {
                biased;
                () = shutdown.cancelled() => None,
                sent = self.output.send(output) => Some(sent),
            };
            match sent {
                Some(Ok(())) => {}
                // Whatever downstream holds of this batch fails with it.
                Some(Err(mpsc::error::SendError(output))) => {
                    output.fail();
                    return Err(SourceError::DownstreamClosed);
                }
                None => {
                    ack.fail();
                    return Ok(false);
                }
            }
        }
        in_hand.deliver();
        Ok(true)
    }
}
