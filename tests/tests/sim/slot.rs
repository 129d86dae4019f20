//! A source that behaves like a PostgreSQL replication slot
//! (`Features::slot`).
//!
//! The world keeps the server's side ([`SlotServer`]): the position the
//! slot is confirmed at and every position it was confirmed at before. The
//! scenario's WAL ([`Slot`]) holds transactions (some empty, some spanning
//! several batches), each with its commit LSN. [`SlotSource`] streams them
//! the way PostgreSQL does: from the slot's confirmed position, exactly the
//! transactions whose commit record starts at or after it
//! (`DecodeTXNNeedSkip`), each as `BEGIN`, its changes and `COMMIT`, with
//! keepalives between them. It reads them as the `postgres_cdc` source's
//! reader does (`crates/etl-postgres-cdc/src/session.rs`): the offsets and
//! the positions it confirms come from that crate's own rule
//! (`etl_postgres_cdc::testing::SlotProgress`, its `progress.rs`), a batch
//! goes on when full or at a commit with nothing buffered behind it,
//! nothing below the offsets already handed on is sent again, and the
//! checkpointer's committed offset is followed as the real source follows
//! it. The stream drops at scripted messages (mid-transaction too): the
//! batch being filled is lost, and the server, perhaps restarted and back
//! at an older confirmed position, sends again from where it stands.
//!
//! What the model checks of it (`model.rs`): every change took the offset
//! the rule gives it from the WAL alone, however often it was sent;
//! every position confirmed lay below the changes not committed when it
//! was confirmed; and no position the server was ever confirmed at passes
//! a change that is not delivered.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use async_trait::async_trait;
use etl_checkpoint::{CheckpointHandle, PartitionOffsets};
use etl_postgres_cdc::Lsn;
use etl_postgres_cdc::testing::SlotProgress;
use etl_record::{DeadLetter, Offset, PartitionId, Position, Record, SourceId};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};

use super::scenario::{Scenario, TxnAt};
use super::world::{Life, World, value};

/// The slot is partition 0, as the real source's.
const PARTITION: PartitionId = PartitionId(0);

/// The slot as the server keeps it, over the scenario's runs.
#[derive(Debug, Default)]
pub struct SlotServer {
    /// The position the slot is confirmed at: the last standby status
    /// update's, or where a restart of the server brought it back.
    pub confirmed: Lsn,
    /// Every position it was confirmed at, in order (a restarted server
    /// comes back at one of them).
    pub history: Vec<Lsn>,
    /// Each confirmation: the position, and the highest committed offset
    /// any process had heard of by then (a process that read the position
    /// from the server confirms it again after the server fell back,
    /// though it heard of a lower commit: an exactly-once sink's progress
    /// may resume the pipeline below the last commit).
    pub confirmations: Vec<(Lsn, i64)>,
    /// The highest committed offset any process heard of.
    pub committed: i64,
    /// Messages sent so far, over all runs (the drops count them).
    pub messages: u64,
    /// The offset each change (transaction, index) took when first given.
    pub given: BTreeMap<(usize, i64), i64>,
    /// Changes given another offset than before.
    pub violations: Vec<String>,
}

/// What the server streams.
#[derive(Clone, Copy, Debug)]
enum Message {
    /// `BEGIN` of transaction `i`.
    Begin(usize),
    /// A change of transaction `i`.
    Change(usize),
    /// `COMMIT` of transaction `i`.
    Commit(usize),
    /// A keepalive: the server sent everything before this end of WAL.
    Keepalive(Lsn),
}

/// The transaction being read.
#[derive(Clone, Copy, Debug)]
struct Current {
    txn: usize,
    /// Its first change's offset; `None` when it is confirmed already and
    /// skipped.
    first: Option<i64>,
    /// Changes read so far.
    changes: i64,
}

/// One replication connection.
#[derive(Debug)]
struct Session {
    /// What the server sends from here on.
    stream: VecDeque<Message>,
    /// The offset below which every change is in the batch or was handed
    /// on.
    next: i64,
    current: Option<Current>,
    batch: PollBatch,
    /// A keepalive met with a batch to hand over first.
    keepalive: Option<Lsn>,
}

/// The simulated `postgres_cdc` source over the scenario's WAL.
pub struct SlotSource {
    world: World,
    life: Life,
    layout: Vec<TxnAt>,
    /// (message number, confirmations back) of each drop.
    drops: Vec<(u16, u8)>,
    max_batch: usize,
    /// Offsets of changes that cannot be decoded: dead letters.
    rejects: BTreeSet<i64>,
    progress: SlotProgress,
    /// The offset below which every change was handed on: a new session
    /// sends nothing below it.
    floor: i64,
    session: Option<Session>,
    announced: bool,
    batches: u64,
    commit_every: Option<u64>,
    commit_due: bool,
    checkpoint: CheckpointHandle,
}

impl std::fmt::Debug for SlotSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotSource")
            .field("progress", &self.progress)
            .field("floor", &self.floor)
            .finish_non_exhaustive()
    }
}

impl SlotSource {
    /// The source of a slot scenario (`s.slot` is set), for one process
    /// `life`.
    pub fn new(s: &Scenario, world: World, life: Life, checkpoint: CheckpointHandle) -> Self {
        let slot = s.slot.clone().unwrap_or_else(|| super::scenario::Slot {
            wal: Vec::new(),
            drops: Vec::new(),
        });
        SlotSource {
            world,
            life,
            layout: slot.layout(),
            drops: slot.drops,
            max_batch: usize::from(s.source_batch.max(1)),
            rejects: s
                .source_rejects
                .iter()
                .filter(|(p, _)| *p == 0)
                .map(|(_, o)| *o)
                .collect(),
            progress: SlotProgress::new(),
            floor: 0,
            session: None,
            announced: false,
            batches: 0,
            commit_every: s.commit_every.map(u64::from),
            commit_due: false,
            checkpoint,
        }
    }

    /// Connect: the server streams from the slot's confirmed position,
    /// and the status task's first update says where the slot may be.
    fn connect(&mut self) {
        let from = self.world.lock().slot.confirmed;
        self.progress.server_confirmed(from);
        let mut stream = VecDeque::new();
        for (i, t) in self.layout.iter().enumerate() {
            // DecodeTXNNeedSkip: a transaction whose commit record
            // starts before the confirmed position is not sent.
            if t.commit < from.0 {
                continue;
            }
            stream.push_back(Message::Begin(i));
            stream.extend((0..t.changes).map(|_| Message::Change(i)));
            stream.push_back(Message::Commit(i));
            if let Some(end) = t.keepalive {
                stream.push_back(Message::Keepalive(Lsn(end)));
            }
        }
        // Caught up: a keepalive at the server's end of WAL.
        let end = self.layout.last().map_or(0, |t| t.end);
        stream.push_back(Message::Keepalive(Lsn(end)));
        self.session = Some(Session {
            stream,
            next: self.floor,
            current: None,
            batch: PollBatch::new(PARTITION),
            keepalive: None,
        });
        self.status();
    }

    /// A standby status update: the server's slot is confirmed at the
    /// position to confirm (nothing once the process is dead).
    fn status(&self) {
        let flushed = self.progress.flushed();
        let mut state = self.world.lock();
        if !self.life.alive() {
            return;
        }
        let server = &mut state.slot;
        server.committed = server.committed.max(self.progress.committed());
        if flushed != server.confirmed {
            server.confirmed = flushed;
            server.history.push(flushed);
            server.confirmations.push((flushed, server.committed));
        }
    }

    /// Follow the checkpointer's commits, as the real source's status
    /// task does.
    fn follow(&mut self) {
        let committed = self
            .checkpoint
            .with_metrics(|m| m.partition(PARTITION).and_then(|p| p.committed));
        if let Some(offset) = committed
            && self.progress.delivered(offset.0)
        {
            self.status();
        }
    }

    /// Whether the stream drops before the next message; counts it.
    fn drops_now(&mut self) -> Option<u8> {
        let mut state = self.world.lock();
        let n = state.slot.messages;
        state.slot.messages += 1;
        if state.healed {
            return None;
        }
        self.drops
            .iter()
            .find(|(at, _)| u64::from(*at) == n)
            .map(|(_, back)| *back)
    }

    /// The stream dropped: the batch being filled is lost; a server that
    /// restarted (`back > 0`) is back at a position it was confirmed at
    /// before; the source connects again.
    fn reconnect(&mut self, back: u8) {
        if back > 0 {
            let mut state = self.world.lock();
            let history = &state.slot.history;
            let to = history
                .len()
                .checked_sub(1 + usize::from(back))
                .map_or(Lsn(0), |i| history[i]);
            state.slot.confirmed = to;
        }
        self.connect();
    }

    /// Hand the batch being filled to the pipeline.
    fn hand_over(&mut self) -> Option<SourceEvent> {
        let session = self.session.as_mut()?;
        if session.batch.is_empty() {
            return None;
        }
        let batch = std::mem::replace(&mut session.batch, PollBatch::new(PARTITION));
        self.floor = session.next;
        self.batches += 1;
        if self
            .commit_every
            .is_some_and(|every| self.batches.is_multiple_of(every))
        {
            self.commit_due = true;
        }
        Some(SourceEvent::Batch(batch))
    }

    /// Give change `index` of transaction `txn` its offset, as read now;
    /// a change given another offset before is a violation.
    fn given(&self, txn: usize, index: i64, offset: i64) {
        let mut state = self.world.lock();
        let before = *state.slot.given.entry((txn, index)).or_insert(offset);
        if before != offset {
            let commit = self.layout[txn].commit;
            state.slot.violations.push(format!(
                "slot: change {index} of transaction {txn} (commit {}) was sent again with offset \
                 {offset}, after {before}",
                Lsn(commit)
            ));
        }
    }

    /// Read the stream until a batch is ready or it is exhausted.
    fn read(&mut self) -> Result<SourceEvent, SourceError> {
        loop {
            let Some(session) = self.session.as_mut() else {
                return Ok(SourceEvent::Idle);
            };
            if let Some(end) = session.keepalive.take() {
                if session.current.is_none() && self.progress.idle(end) {
                    self.status();
                }
                continue;
            }
            let Some(message) = session.stream.front().copied() else {
                return Ok(self.hand_over().unwrap_or(SourceEvent::End));
            };
            if let Some(back) = self.drops_now() {
                self.reconnect(back);
                continue;
            }
            let Some(session) = self.session.as_mut() else {
                return Ok(SourceEvent::Idle);
            };
            session.stream.pop_front();
            match message {
                Message::Begin(i) => {
                    let t = self.layout[i];
                    let first = self
                        .progress
                        .begin(Lsn(t.commit), Lsn(t.first_lsn))
                        .map_err(SourceError::custom)?;
                    session.current = Some(Current {
                        txn: i,
                        first,
                        changes: 0,
                    });
                }
                Message::Change(i) => {
                    let Some(current) = session.current.as_mut().filter(|c| c.txn == i) else {
                        return Err(SourceError::custom(format!(
                            "sim: a change of transaction {i} outside it"
                        )));
                    };
                    // A transaction confirmed already, sent again.
                    let Some(first) = current.first else { continue };
                    let index = current.changes;
                    let offset = first + index;
                    current.changes += 1;
                    let fresh = offset >= session.next;
                    if fresh {
                        session.next = offset + 1;
                        let record = Record::new(
                            Position::new(SourceId::new("sim"), PARTITION, Offset(offset)),
                            value(PARTITION.0, offset),
                        );
                        if self.rejects.contains(&offset) {
                            session.batch.rejected.push(DeadLetter::new(
                                record,
                                "sim: a change that cannot be decoded",
                            ));
                        } else {
                            session.batch.records.push(record);
                        }
                    }
                    let full = session.batch.len() >= self.max_batch;
                    self.given(i, index, offset);
                    if full && let Some(event) = self.hand_over() {
                        return Ok(event);
                    }
                }
                Message::Commit(i) => {
                    let t = self.layout[i];
                    let Some(current) = session.current.take().filter(|c| c.txn == i) else {
                        return Err(SourceError::custom(format!(
                            "sim: a commit of transaction {i} outside it"
                        )));
                    };
                    if let Some(first) = current.first {
                        self.progress.commit(first, Lsn(t.end), current.changes);
                    }
                    let full = session.batch.len() >= self.max_batch;
                    if (full || !t.buffered_after)
                        && let Some(event) = self.hand_over()
                    {
                        return Ok(event);
                    }
                }
                Message::Keepalive(end) => {
                    // The batch goes first, then the slot may move.
                    session.keepalive = Some(end);
                    if let Some(event) = self.hand_over() {
                        return Ok(event);
                    }
                }
            }
        }
    }
}

#[async_trait]
impl Source for SlotSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if !self.announced {
            self.announced = true;
            return Ok(SourceEvent::Assigned(vec![PARTITION]));
        }
        if self.commit_due {
            // A failed commit (a dead process) is the checkpointer's to
            // report; the source reads on.
            let _ = self.checkpoint.commit().await;
            self.commit_due = false;
        }
        self.follow();
        if self.session.is_none() {
            // Not positioned yet: the driver seeks after the assignment.
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Ok(SourceEvent::Idle);
        }
        self.read()
    }

    /// A new session: the server sends again from the slot's confirmed
    /// position, and what lies below `offset` is skipped.
    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        if partition != PARTITION {
            return Err(SourceError::UnknownPartition { partition });
        }
        self.floor = offset.0;
        self.connect();
        Ok(())
    }

    async fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), SourceError> {
        if let Some(offset) = offsets.get(&PARTITION)
            && self.progress.delivered(offset.0)
        {
            self.status();
        }
        Ok(())
    }
}
