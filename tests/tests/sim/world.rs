//! The simulated world: the stores kept between runs (offsets, sink
//! contents, exactly-once progress, dead letters), and the scripted
//! source, sinks and offset store a run sees.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etl::{Outcome, Transform};
use etl_checkpoint::{CheckpointError, CheckpointHandle, OffsetStore, PartitionOffsets};
use etl_record::{DeadLetter, Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{EncodedBatch, Progress, ProgressSink, Sink, SinkError};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};

use super::scenario::{Fault, Scenario};

/// One write a sink saw: its records (partition, offset) and whether it
/// succeeded.
#[derive(Clone, Debug)]
pub struct Write {
    pub records: Vec<(u32, i64)>,
    pub ok: bool,
    /// It failed with an error of the environment (whatever the records).
    pub environment: bool,
}

/// What one sink holds, durably, and what it was asked.
#[derive(Debug, Default)]
pub struct SinkState {
    /// Every record written, as (partition, offset, value).
    pub contents: Vec<(u32, i64, String)>,
    /// Every write attempt.
    pub writes: Vec<Write>,
    /// Write calls so far (over all runs).
    pub calls: u64,
    /// Exactly-once: the progress stored with the data.
    pub progress: Progress,
}

/// Everything that survives a restart, plus the scenario's fault state.
#[derive(Debug, Default)]
pub struct State {
    /// Committed offsets.
    pub committed: PartitionOffsets,
    /// The sinks, then the dead-letter sink last.
    pub sinks: Vec<SinkState>,
    /// Scripted panics that already fired.
    pub panicked: BTreeSet<(u32, i64)>,
    /// Panics fired in the current run.
    pub panics_this_run: u32,
    /// The recovery run: every fault healed.
    pub healed: bool,
    /// Commit calls of the offset store so far (over all runs).
    pub store_calls: u64,
    /// The object store of a scenario whose sink is the object-store sink
    /// (`Scenario::lake`).
    pub lake: std::sync::Arc<object_store::memory::InMemory>,
    /// Requests to that store so far (over all runs).
    pub lake_calls: u64,
    /// The replication slot's server, in a slot scenario.
    pub slot: super::slot::SlotServer,
}

/// The shared world.
#[derive(Clone, Debug, Default)]
pub struct World(Arc<Mutex<State>>);

impl World {
    pub fn new(sinks: usize) -> Self {
        let w = World::default();
        w.lock().sinks = (0..=sinks).map(|_| SinkState::default()).collect();
        w
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The life of one process: once it is dead, nothing it does becomes
/// durable.
#[derive(Clone, Debug)]
pub struct Life(Arc<AtomicBool>);

impl Life {
    pub fn new() -> Self {
        Life(Arc::new(AtomicBool::new(true)))
    }

    pub fn alive(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    pub fn kill(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// The offset store: committed offsets live in the world.
#[derive(Debug)]
pub struct SimStore {
    pub world: World,
    pub life: Life,
    /// Commit calls `from..from + calls` fail (until healed).
    pub outage: Option<(u16, u16)>,
}

impl OffsetStore for SimStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        Ok(self.world.lock().committed.clone())
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        let mut state = self.world.lock();
        // Checked under the lock: a commit either lands before the crash
        // or not at all.
        if !self.life.alive() {
            return Err(CheckpointError::Store("the process is dead".into()));
        }
        let call = state.store_calls;
        state.store_calls += 1;
        if let Some((from, calls)) = self.outage
            && !state.healed
            && (u64::from(from)..u64::from(from) + u64::from(calls)).contains(&call)
        {
            return Err(CheckpointError::Store(
                "sim: the coordinator is out of reach".into(),
            ));
        }
        state
            .committed
            .extend(offsets.iter().map(|(p, o)| (*p, *o)));
        Ok(())
    }
}

/// The value of record `offset` of `partition` as the source reads it.
pub fn value(partition: u32, offset: i64) -> String {
    format!("{partition}:{offset}")
}

/// A scripted, replayable source: dense offsets per partition, batches
/// taken round-robin, bad input at scripted offsets, revocations and
/// reassignments after scripted numbers of events, and commits requested
/// every few batches.
pub struct SimSource {
    counts: Vec<i64>,
    positions: Vec<i64>,
    assigned: Vec<bool>,
    batch: i64,
    rejects: BTreeSet<(u32, i64)>,
    /// (event number, revoke?, partitions), in event order.
    script: VecDeque<(u64, bool, Vec<u32>)>,
    events: u64,
    batches: u64,
    announced: bool,
    next_partition: usize,
    commit_every: Option<u64>,
    commit_due: bool,
    /// Revocations hand the partitions over (the write fence closes
    /// their epochs) rather than retire them.
    hands_over: bool,
    checkpoint: CheckpointHandle,
}

impl std::fmt::Debug for SimSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimSource")
            .field("positions", &self.positions)
            .finish_non_exhaustive()
    }
}

impl SimSource {
    pub fn new(s: &Scenario, checkpoint: CheckpointHandle) -> Self {
        let n = s.partitions.len();
        let mut script = Vec::new();
        for r in &s.rebalances {
            let mut ps: Vec<u32> = r
                .partitions
                .iter()
                .map(|p| u32::from(*p) % n as u32)
                .collect();
            ps.sort_unstable();
            ps.dedup();
            let at = u64::from(r.after);
            script.push((at, true, ps.clone()));
            script.push((at + 1 + u64::from(r.back_after), false, ps));
        }
        // Stable: a revocation keeps its place before its reassignment.
        script.sort_by_key(|(at, _, _)| *at);
        SimSource {
            counts: s.partitions.iter().map(|c| i64::from(*c)).collect(),
            positions: vec![0; n],
            assigned: vec![false; n],
            batch: i64::from(s.source_batch.max(1)),
            rejects: s
                .source_rejects
                .iter()
                .map(|(p, o)| (u32::from(*p), *o))
                .collect(),
            script: script.into(),
            events: 0,
            batches: 0,
            announced: false,
            next_partition: 0,
            commit_every: s.commit_every.map(u64::from),
            commit_due: false,
            hands_over: s.hands_over,
            checkpoint,
        }
    }

    fn event(&mut self) -> SourceEvent {
        if !self.announced {
            self.announced = true;
            self.assigned.iter_mut().for_each(|a| *a = true);
            return SourceEvent::Assigned((0..self.counts.len() as u32).map(PartitionId).collect());
        }
        self.events += 1;
        if let Some((at, _, _)) = self.script.front()
            && *at <= self.events
            && let Some((_, revoke, ps)) = self.script.pop_front()
        {
            // Only partitions whose state changes are announced.
            let ps: Vec<u32> = ps
                .into_iter()
                .filter(|p| self.assigned[*p as usize] == revoke)
                .collect();
            if !ps.is_empty() {
                for p in &ps {
                    self.assigned[*p as usize] = !revoke;
                }
                let ids = ps.into_iter().map(PartitionId).collect();
                return if revoke {
                    SourceEvent::Revoked(ids)
                } else {
                    SourceEvent::Assigned(ids)
                };
            }
        }
        let n = self.counts.len();
        for i in 0..n {
            let p = (self.next_partition + i) % n;
            if !self.assigned[p] || self.positions[p] >= self.counts[p] {
                continue;
            }
            self.next_partition = (p + 1) % n;
            let from = self.positions[p];
            let to = (from + self.batch).min(self.counts[p]);
            self.positions[p] = to;
            let mut batch = PollBatch::new(PartitionId(p as u32));
            for o in from..to {
                let record = Record::new(
                    Position::new(SourceId::new("sim"), PartitionId(p as u32), Offset(o)),
                    value(p as u32, o),
                );
                if self.rejects.contains(&(p as u32, o)) {
                    batch
                        .rejected
                        .push(DeadLetter::new(record, "sim: bad input"));
                } else {
                    batch.records.push(record);
                }
            }
            self.batches += 1;
            if self
                .commit_every
                .is_some_and(|every| self.batches.is_multiple_of(every))
            {
                self.commit_due = true;
            }
            return SourceEvent::Batch(batch);
        }
        if self.script.is_empty() {
            SourceEvent::End
        } else {
            SourceEvent::Idle
        }
    }
}

#[async_trait]
impl Source for SimSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if self.commit_due {
            // A failed commit (a dead process) is the checkpointer's to
            // report; the source reads on.
            let _ = self.checkpoint.commit().await;
            self.commit_due = false;
        }
        Ok(self.event())
    }

    fn hands_over_revoked(&self) -> bool {
        self.hands_over
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        if let Some(pos) = self.positions.get_mut(partition.0 as usize) {
            *pos = offset.0.max(0);
        }
        Ok(())
    }
}

/// How a sink's faults answer one write call.
enum Verdict {
    Write,
    Fail(SinkError),
    Hang,
}

/// A sink holding its contents in the world, failing as scripted.
/// Index `index` in the world's sinks; the dead-letter sink is last.
#[derive(Debug)]
pub struct SimSink {
    pub world: World,
    pub life: Life,
    pub index: usize,
    pub faults: Vec<Fault>,
    pub partitions: u32,
    pub exactly_once: bool,
}

impl SimSink {
    fn verdict(&self, call: u64, records: &[(u32, i64)], healed: bool) -> Verdict {
        if healed {
            return Verdict::Write;
        }
        for fault in &self.faults {
            match *fault {
                Fault::Transient(n) if u64::from(n) == call => {
                    return Verdict::Fail(SinkError::retryable(format!(
                        "sim: transient at call {call}"
                    )));
                }
                Fault::Permanent(n) if u64::from(n) == call => {
                    return Verdict::Fail(SinkError::permanent(format!(
                        "sim: permanent at call {call}"
                    )));
                }
                Fault::Hang(n) if u64::from(n) == call => return Verdict::Hang,
                Fault::Outage { from, calls }
                    if (u64::from(from)..u64::from(from) + u64::from(calls)).contains(&call) =>
                {
                    return Verdict::Hang;
                }
                Fault::Broken(n) if u64::from(n) <= call => {
                    return Verdict::Fail(environment_error());
                }
                Fault::Poison(p, o)
                    if records.contains(&(u32::from(p) % self.partitions, i64::from(o))) =>
                {
                    // The records' fault: the batch replays, narrowed down.
                    return Verdict::Fail(SinkError::data(format!(
                        "sim: record {}:{o} is poison",
                        u32::from(p) % self.partitions
                    )));
                }
                _ => {}
            }
        }
        Verdict::Write
    }

    fn slowness(&self, healed: bool) -> Option<Duration> {
        if healed {
            return None;
        }
        self.faults.iter().find_map(|f| match f {
            Fault::Slow(ms) => Some(Duration::from_millis(u64::from(*ms))),
            _ => None,
        })
    }
}

/// The error a sink returns when its environment is broken, whatever the
/// record (a broken pipe, a read-only file system).
pub fn environment_error() -> SinkError {
    SinkError::retryable(std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "sim: the environment is broken",
    ))
}

#[async_trait]
impl Sink for SimSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let records: Vec<(u32, i64)> = batch
            .records()
            .iter()
            .map(|r| (r.position.partition.0, r.position.offset.0))
            .collect();
        let (verdict, slow, entry) = {
            let mut state = self.world.lock();
            let healed = state.healed;
            let sink = &mut state.sinks[self.index];
            let call = sink.calls;
            sink.calls += 1;
            // Logged as failed until it succeeds: a write that hangs until
            // its timeout, or dies with the process, failed.
            let verdict = self.verdict(call, &records, healed);
            sink.writes.push(Write {
                records: records.clone(),
                ok: false,
                environment: matches!(&verdict, Verdict::Fail(e)
                    if e.kind() == etl_sink::FailureKind::Environment),
            });
            (verdict, self.slowness(healed), sink.writes.len() - 1)
        };
        if let Some(delay) = slow {
            tokio::time::sleep(delay).await;
        }
        let result = match verdict {
            Verdict::Hang => return std::future::pending().await,
            Verdict::Fail(e) => Err(e),
            Verdict::Write => Ok(()),
        };
        let mut state = self.world.lock();
        if !self.life.alive() {
            // The process is dead: nothing becomes durable any more.
            drop(state);
            return std::future::pending().await;
        }
        let sink = &mut state.sinks[self.index];
        if result.is_ok() {
            sink.writes[entry].ok = true;
            for (i, r) in batch.records().iter().enumerate() {
                // What the sink stores: the encoded line (for the
                // dead-letter sink, the letter) without its line break.
                let line = batch.encoded(i).unwrap_or_default();
                let line = line.strip_suffix(b"\n").unwrap_or(line);
                let value = String::from_utf8_lossy(line).into_owned();
                sink.contents
                    .push((r.position.partition.0, r.position.offset.0, value));
            }
            if self.exactly_once {
                sink.progress.advance_past(batch.records());
            }
        }
        result
    }
}

impl ProgressSink for SimSink {
    fn progress(&self) -> Progress {
        self.world.lock().sinks[self.index].progress.clone()
    }
}

/// Per-record fates the transform steps give (used by the model too).
pub fn apply_steps(
    steps: &[super::scenario::Step],
    partition: u32,
    offset: i64,
    value: String,
) -> StepResult {
    use super::scenario::Step;
    let mut kept = vec![value];
    let mut rejected = false;
    for step in steps {
        let mut next = Vec::new();
        for v in kept {
            match *step {
                Step::Filter { every, at } if hits(offset, every, at) => {}
                Step::Expand { every, at, copies } if hits(offset, every, at) => {
                    next.extend((0..copies).map(|k| format!("{v}#{k}")));
                }
                Step::Reject { every, at } if hits(offset, every, at) => rejected = true,
                _ => next.push(v),
            }
        }
        kept = next;
        if rejected {
            kept.clear();
            break;
        }
    }
    let _ = partition;
    StepResult { kept, rejected }
}

/// What the steps make of one record.
#[derive(Debug, Default)]
pub struct StepResult {
    /// Values that reach every sink.
    pub kept: Vec<String>,
    /// Whether the record (or one of its copies) was rejected.
    pub rejected: bool,
}

pub fn hits(offset: i64, every: u8, at: u8) -> bool {
    let every = i64::from(every.max(1));
    offset % every == i64::from(at) % every
}

/// The scenario's transform steps as one transform, with the scripted
/// panics (each fires once over the scenario). It forks, so a scenario
/// with transform workers runs it on the parallel stage.
#[derive(Clone, Debug)]
pub struct SimTransform {
    steps: Vec<super::scenario::Step>,
    panics: BTreeSet<(u32, i64)>,
    world: World,
}

impl SimTransform {
    /// The scenario's shared steps.
    pub fn new(s: &Scenario, world: World) -> Self {
        Self::of(&s.steps, s.partitions.len() as u32, world)
    }

    /// `steps` (a sink's own), over `n` partitions.
    pub fn of(steps: &[super::scenario::Step], n: u32, world: World) -> Self {
        use super::scenario::Step;
        let panics = steps
            .iter()
            .filter_map(|st| match st {
                Step::Panic { partition, offset } => {
                    Some((u32::from(*partition) % n, i64::from(*offset)))
                }
                _ => None,
            })
            .collect();
        SimTransform {
            steps: steps.to_vec(),
            panics,
            world,
        }
    }
}

impl Transform for SimTransform {
    fn name(&self) -> &str {
        "sim"
    }

    fn apply(&mut self, record: Record) -> Outcome {
        let (p, o) = (record.position.partition.0, record.position.offset.0);
        if self.panics.contains(&(p, o)) {
            let mut state = self.world.lock();
            if !state.healed && state.panicked.insert((p, o)) {
                state.panics_this_run += 1;
                drop(state);
                panic!("sim: scripted panic at {p}:{o}");
            }
        }
        let value = String::from_utf8_lossy(&record.value).into_owned();
        let out = apply_steps(&self.steps, p, o, value);
        if out.rejected {
            return Outcome::Reject(record, "sim: rejected by a step".to_owned());
        }
        Outcome::Many(
            out.kept
                .into_iter()
                .map(|v| {
                    let mut r = record.clone();
                    r.value = v.into();
                    r
                })
                .collect(),
        )
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(self.clone()))
    }
}
