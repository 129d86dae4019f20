//! The replication session: a task that connects, checks the server's
//! setup, streams the slot and turns changes into batches, reconnecting
//! after a broken connection; and, beside it, a task that answers the
//! server with standby status updates whatever the pipeline is doing.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use etl_checkpoint::CheckpointHandle;
use etl_postgres::ClientSettings;
use etl_record::{DeadLetter, Offset, PartitionId, Position, Record, SourceId};
use etl_source::PollBatch;
use tokio::sync::{Notify, mpsc};

use crate::change::{Change, Op, Relations, TxnInfo, record};
use crate::pgoutput::{self, Message};
use crate::progress::{Begun, Progress};
use crate::wire::{Connection, ReplicationReader, ReplicationWriter, ServerMessage};
use crate::{CdcError, Lsn, Snapshot, snapshot};

/// The one partition: the slot.
pub(crate) const PARTITION: PartitionId = PartitionId(0);

/// Longest wait between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What a session tells the source.
#[derive(Debug)]
pub(crate) enum Event {
    /// Records and dead letters of the slot.
    Batch(PollBatch),
    /// The session stopped for good.
    Fatal(CdcError),
}

/// Everything a session needs, shared by every session of a source.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) settings: ClientSettings,
    pub(crate) source: SourceId,
    pub(crate) publication: String,
    pub(crate) slot: String,
    pub(crate) create_slot: bool,
    pub(crate) snapshot: Snapshot,
    pub(crate) max_batch: usize,
    pub(crate) status_interval: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) progress: Mutex<Progress>,
    /// Wakes the status task: the position to confirm moved, or the
    /// server asked for an answer.
    pub(crate) status_now: Notify,
    /// The checkpointer, when the source follows its commits itself (see
    /// [`PostgresCdcSource::following`](crate::PostgresCdcSource::following)).
    pub(crate) checkpoint: Mutex<Option<CheckpointHandle>>,
}

/// How often the status task reads the checkpointer's committed offset,
/// when it follows the checkpointer.
const FOLLOW_EVERY: Duration = Duration::from_millis(500);

impl Shared {
    /// Read the checkpointer's last committed offset of the slot, when
    /// following it, and confirm past what it covers. Returns whether the
    /// position to confirm moved.
    pub(crate) fn follow_commits(&self) -> bool {
        let committed = {
            let handle = self
                .checkpoint
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let Some(handle) = handle.as_ref() else {
                return false;
            };
            handle.with_metrics(|m| m.partition(PARTITION).and_then(|p| p.committed))
        };
        match committed {
            Some(offset) => self.progress().delivered(offset.0),
            None => false,
        }
    }

    pub(crate) fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        // The state stays consistent at every step: a panic elsewhere
        // does not make it wrong.
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `'text'` as an SQL literal.
pub(crate) fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `"name"` as an SQL identifier.
pub(crate) fn identifier(text: &str) -> String {
    format!("\"{}\"", text.replace('"', "\"\""))
}

/// Run sessions until one fails for good or the receiver is gone. Offsets
/// below `floor` are not sent.
pub(crate) async fn run(shared: Arc<Shared>, mut floor: i64, tx: mpsc::Sender<Event>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        match stream(&shared, &mut floor, &tx).await {
            Ok(()) => return,
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, retry_in = ?backoff, "replication connection lost; reconnecting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Err(e) => {
                let _ = tx.send(Event::Fatal(e)).await;
                return;
            }
        }
    }
}

/// Check the server's setup and find the slot: its confirmed position,
/// or `None` when it is missing and may be created.
async fn prepare(shared: &Shared, conn: &mut Connection) -> Result<Option<Lsn>, CdcError> {
    let target = conn.target().to_owned();
    let setup = |reason: String| CdcError::Setup {
        target: target.clone(),
        reason,
    };
    let level = conn.query("SHOW wal_level").await?;
    let level = level.first().and_then(|r| r.first().cloned().flatten());
    if level.as_deref() != Some("logical") {
        return Err(setup(format!(
            "wal_level is {}; logical decoding needs wal_level = logical (in postgresql.conf, \
             then restart the server)",
            level.as_deref().unwrap_or("unknown")
        )));
    }
    let publication = conn
        .query(&format!(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = {}",
            literal(&shared.publication)
        ))
        .await?;
    if publication.is_empty() {
        return Err(setup(format!(
            "publication {:?} does not exist in this database; create it: CREATE PUBLICATION {} \
             FOR TABLE ... (or FOR ALL TABLES)",
            shared.publication,
            identifier(&shared.publication)
        )));
    }
    let slot = conn
        .query(&format!(
            "SELECT plugin, confirmed_flush_lsn, database = current_database() \
             FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
            literal(&shared.slot)
        ))
        .await?;
    match slot.first() {
        Some(row) => {
            let plugin = row.first().cloned().flatten().unwrap_or_default();
            let same_db = row.get(2).cloned().flatten().unwrap_or_default();
            if plugin != "pgoutput" || same_db != "t" {
                return Err(setup(format!(
                    "slot {:?} exists but is not a pgoutput slot of this database \
                     (plugin {plugin:?}); choose another slot name",
                    shared.slot
                )));
            }
            let confirmed = row.get(1).cloned().flatten().unwrap_or_default();
            confirmed
                .parse::<Lsn>()
                .map(Some)
                .map_err(|e| setup(format!("slot {:?}: confirmed_flush_lsn {e}", shared.slot)))
        }
        None if shared.create_slot => Ok(None),
        None => Err(setup(format!(
            "replication slot {:?} does not exist and create_slot = false; create it \
             (SELECT pg_create_logical_replication_slot('{}', 'pgoutput')) or set \
             create_slot = true",
            shared.slot, shared.slot
        ))),
    }
}

/// Why a slot made at `consistent` cannot follow what the pipeline
/// `held` (its committed offset, or an exactly-once sink's stored
/// progress): the changes after it take offsets from their commit LSNs
/// on, below what is held, and would be skipped as delivered. This is a
/// server restored from a backup or failed over to a standby behind the
/// one the pipeline read (slots are in neither), or a sink's progress
/// kept from another server.
pub(crate) fn new_slot_below(consistent: Lsn, held: i64) -> Option<String> {
    let start = i64::try_from(consistent.0).unwrap_or(i64::MAX);
    (start < held).then(|| {
        format!(
            "the slot was missing and was made at {consistent}, below what the pipeline already \
             delivered (offset {held}): the server's WAL is behind the one the pipeline read (a \
             restore, a failover), so its changes would be skipped; the slot was dropped again. \
             Start the pipeline with an empty offset store and sink progress to read this \
             server from now on (with snapshot = \"initial\" to copy its tables first)"
        )
    })
}

/// Create the slot without a snapshot and return its consistent point.
async fn create_slot(shared: &Shared, conn: &mut Connection) -> Result<Lsn, CdcError> {
    let rows = conn
        .query(&format!(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput NOEXPORT_SNAPSHOT",
            identifier(&shared.slot)
        ))
        .await?;
    tracing::info!(slot = %shared.slot, "replication slot created");
    consistent_point(conn.target(), &rows)
}

/// The consistent point in `CREATE_REPLICATION_SLOT`'s answer.
pub(crate) fn consistent_point(
    target: &str,
    rows: &[Vec<Option<String>>],
) -> Result<Lsn, CdcError> {
    let consistent = rows.first().and_then(|r| r.get(1).cloned().flatten());
    consistent
        .unwrap_or_default()
        .parse::<Lsn>()
        .map_err(|e| CdcError::Setup {
            target: target.to_owned(),
            reason: format!("the new slot's consistent point: {e}"),
        })
}

async fn stream(
    shared: &Arc<Shared>,
    floor: &mut i64,
    tx: &mpsc::Sender<Event>,
) -> Result<(), CdcError> {
    let mut conn = Connection::connect(
        &shared.settings,
        &format!("etl postgres_cdc {}", shared.slot),
        shared.connect_timeout,
    )
    .await?;
    let confirmed = match prepare(shared, &mut conn).await? {
        Some(confirmed) => confirmed,
        None if shared.snapshot == Snapshot::Initial => {
            match snapshot::take(shared, floor, tx).await? {
                Some(confirmed) => confirmed,
                // Nobody takes the rows any more.
                None => return Ok(()),
            }
        }
        None => {
            let consistent = create_slot(shared, &mut conn).await?;
            let held = shared.progress().held(*floor);
            if let Some(reason) = new_slot_below(consistent, held) {
                // Left in place, the slot would be found at the next
                // start, and this check would not be made again.
                let dropped = conn
                    .query(&format!(
                        "DROP_REPLICATION_SLOT {}",
                        identifier(&shared.slot)
                    ))
                    .await;
                if let Err(e) = dropped {
                    tracing::warn!(error = %e, slot = %shared.slot, "cannot drop the slot just made");
                }
                return Err(CdcError::Setup {
                    target: conn.target().to_owned(),
                    reason,
                });
            }
            consistent
        }
    };
    shared.progress().server_confirmed(confirmed);
    let command = format!(
        "START_REPLICATION SLOT {} LOGICAL 0/0 (proto_version '1', publication_names {})",
        identifier(&shared.slot),
        literal(&identifier(&shared.publication)),
    );
    let (reader, writer) = conn.start_replication(&command).await?;
    tracing::info!(slot = %shared.slot, %confirmed, "streaming");
    let status = StatusTask(tokio::spawn(status_loop(Arc::clone(shared), writer)));
    let result = read_loop(shared, reader, floor, tx).await;
    drop(status);
    result
}

/// Aborts the status task when the session ends.
struct StatusTask(tokio::task::JoinHandle<()>);

impl Drop for StatusTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn status_loop(shared: Arc<Shared>, mut writer: ReplicationWriter) {
    loop {
        let (received, flushed, retained) = {
            let p = shared.progress();
            (p.received(), p.flushed(), p.retained())
        };
        tracing::debug!(slot = %shared.slot, confirmed = %flushed, retained_wal_bytes = retained, "standby status update");
        if let Err(e) = writer.status(received.0.max(flushed.0), flushed.0).await {
            // The reading side sees the same broken connection.
            tracing::debug!(error = %e, "standby status update failed");
            return;
        }
        // Until the interval is over, the server asks, or the position
        // to confirm moves (by a commit passed in, or one read from the
        // checkpointer followed).
        let until = tokio::time::Instant::now() + shared.status_interval;
        loop {
            let tick = until.min(tokio::time::Instant::now() + FOLLOW_EVERY);
            tokio::select! {
                () = tokio::time::sleep_until(tick) => {}
                () = shared.status_now.notified() => break,
            }
            if shared.follow_commits() || tokio::time::Instant::now() >= until {
                break;
            }
        }
    }
}

/// The transaction being read.
struct Current {
    info: TxnInfo,
    /// The offset of its first change; `None` when it is confirmed
    /// already and skipped.
    first: Option<i64>,
    /// Changes read so far.
    changes: i64,
}

struct Reader<'a> {
    shared: &'a Shared,
    tx: &'a mpsc::Sender<Event>,
    /// The offset below which every change was handed to the source: a
    /// new session (after a broken connection) sends nothing below it.
    /// Moved only when a batch is handed on, never when a change enters
    /// the batch: a batch dropped with its session is read again.
    floor: &'a mut i64,
    /// The offset below which every change is in the batch or was handed
    /// on: `floor` once the batch is.
    next: i64,
    relations: Relations,
    current: Option<Current>,
    batch: PollBatch,
}

async fn read_loop(
    shared: &Shared,
    mut reader: ReplicationReader,
    floor: &mut i64,
    tx: &mpsc::Sender<Event>,
) -> Result<(), CdcError> {
    let next = *floor;
    let mut state = Reader {
        shared,
        tx,
        floor,
        next,
        relations: Relations::default(),
        current: None,
        batch: PollBatch::new(PARTITION),
    };
    loop {
        match reader.next().await? {
            ServerMessage::Keepalive { end, reply } => {
                if !state.send_batch().await {
                    return Ok(());
                }
                let moved = state.current.is_none() && shared.progress().idle(Lsn(end));
                if reply || moved {
                    shared.status_now.notify_one();
                }
            }
            ServerMessage::XLogData {
                start,
                wal_end,
                data,
            } => {
                shared.progress().server_end(Lsn(wal_end));
                let lsn = Lsn(start);
                let committed = state.message(lsn, data, reader.target())?;
                if (state.batch.len() >= shared.max_batch
                    || (committed && !reader.has_buffered_frame()))
                    && !state.send_batch().await
                {
                    return Ok(());
                }
            }
        }
    }
}

impl Reader<'_> {
    /// Hand the batch to the source; false when nobody takes it any more.
    async fn send_batch(&mut self) -> bool {
        if self.batch.is_empty() {
            return true;
        }
        let batch = std::mem::replace(&mut self.batch, PollBatch::new(PARTITION));
        let sent = self.tx.send(Event::Batch(batch)).await.is_ok();
        if sent {
            *self.floor = self.next;
        }
        sent
    }

    /// Take one message; returns whether it was a commit.
    fn message(&mut self, lsn: Lsn, data: Bytes, target: &str) -> Result<bool, CdcError> {
        let message = match pgoutput::decode(data.clone()) {
            Ok(message) => message,
            Err(e) => {
                // A change that cannot be decoded is set aside with its
                // position; anything else breaks the stream's meaning.
                if self.current.is_some() && matches!(data.first(), Some(b'I' | b'U' | b'D' | b'T'))
                {
                    // In a transaction confirmed already (sent again), it
                    // was delivered or set aside before.
                    if let Some(offset) = self.next_offset() {
                        self.reject(offset, data, format!("at LSN {lsn}: {e}"));
                    }
                    return Ok(false);
                }
                return Err(CdcError::Decode {
                    target: target.to_owned(),
                    lsn,
                    source: e,
                });
            }
        };
        let in_txn = |what: &str| CdcError::Protocol {
            target: target.to_owned(),
            reason: format!("{what} outside a transaction at LSN {lsn}"),
        };
        match message {
            Message::Begin(begin) => {
                let begun = self.shared.progress().begin_at(begin.final_lsn, lsn);
                let first = match begun {
                    Ok(Begun::At(first)) => Some(first),
                    Ok(Begun::Confirmed) => None,
                    Err(reason) => {
                        return Err(CdcError::Protocol {
                            target: target.to_owned(),
                            reason,
                        });
                    }
                };
                self.current = Some(Current {
                    info: TxnInfo {
                        commit_lsn: begin.final_lsn,
                        commit_time_micros: begin.commit_time_micros,
                        xid: Some(begin.xid),
                    },
                    first,
                    changes: 0,
                });
            }
            Message::Commit(commit) => {
                let current = self.current.take().ok_or_else(|| in_txn("COMMIT"))?;
                if let Some(first) = current.first {
                    self.shared
                        .progress()
                        .commit(first, commit.end_lsn, current.changes);
                }
                return Ok(true);
            }
            Message::Relation(relation) => self.relations.put(relation),
            Message::Type { .. } | Message::Origin { .. } | Message::LogicalMessage(_) => {}
            Message::Insert { relation, new } => {
                self.change(Op::Insert, relation, None, Some(&new), &data, lsn, target)?;
            }
            Message::Update { relation, old, new } => {
                self.change(
                    Op::Update,
                    relation,
                    old.as_ref(),
                    Some(&new),
                    &data,
                    lsn,
                    target,
                )?;
            }
            Message::Delete { relation, old } => {
                self.change(Op::Delete, relation, Some(&old), None, &data, lsn, target)?;
            }
            Message::Truncate { relations, .. } => {
                for relation in relations {
                    self.change(Op::Truncate, relation, None, None, &data, lsn, target)?;
                }
            }
        }
        Ok(false)
    }

    /// The offset the next change of the current transaction takes.
    fn next_offset(&self) -> Option<i64> {
        let current = self.current.as_ref()?;
        Some(current.first?.saturating_add(current.changes))
    }

    fn reject(&mut self, offset: i64, data: Bytes, reason: String) {
        if let Some(current) = self.current.as_mut() {
            current.changes += 1;
        }
        if offset < self.next {
            return;
        }
        self.next = offset.saturating_add(1);
        let record = Record::new(
            Position::new(self.shared.source.clone(), PARTITION, Offset(offset)),
            data,
        );
        self.batch.rejected.push(DeadLetter::new(record, reason));
    }

    #[allow(clippy::too_many_arguments)]
    fn change(
        &mut self,
        op: Op,
        relation: u32,
        old: Option<&pgoutput::OldTuple>,
        new: Option<&pgoutput::Tuple>,
        data: &Bytes,
        lsn: Lsn,
        target: &str,
    ) -> Result<(), CdcError> {
        let current = self.current.as_ref().ok_or_else(|| CdcError::Protocol {
            target: target.to_owned(),
            reason: format!("a change outside a transaction at LSN {lsn}"),
        })?;
        let Some(offset) = self.next_offset() else {
            // A transaction confirmed already, sent again.
            return Ok(());
        };
        let info = current.info;
        let Some(rel) = self.relations.get(relation) else {
            self.reject(
                offset,
                data.clone(),
                format!("at LSN {lsn}: a change of relation {relation}, which the stream never described"),
            );
            return Ok(());
        };
        let built = record(
            &self.shared.source,
            PARTITION,
            offset,
            &info,
            &Change {
                op,
                relation: rel,
                old,
                new,
            },
        );
        match built {
            Ok(record) => {
                if let Some(current) = self.current.as_mut() {
                    current.changes += 1;
                }
                if offset >= self.next {
                    self.next = offset.saturating_add(1);
                    self.batch.records.push(record);
                }
            }
            Err(reason) => self.reject(offset, data.clone(), format!("at LSN {lsn}: {reason}")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_made_below_what_was_delivered_is_refused() {
        assert!(new_slot_below(Lsn(5_000), 4_999).is_none());
        assert!(new_slot_below(Lsn(5_000), 5_000).is_none());
        let reason = new_slot_below(Lsn(3_000), 5_000).unwrap_or_default();
        assert!(reason.contains("offset 5000"), "{reason}");
        assert!(reason.contains("empty offset store"), "{reason}");
    }
}
