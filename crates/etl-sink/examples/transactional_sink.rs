//! A transactional sink with exactly-once output: each batch's rows and
//! the progress past them are committed in one transaction, so a crash
//! leaves both or neither, and a restarted pipeline resumes exactly after
//! what is stored.
//!
//! `Database` stands in for a database client: a transaction works on a
//! copy of the tables and `commit` swaps it in at once, the way a real
//! transaction becomes visible (and durable) at commit or not at all. The
//! PostgreSQL sink (`etl-postgres`) does the same with a progress table
//! updated in the rows' transaction.
//!
//! Run it with `cargo run -p etl-sink --example transactional_sink`.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use etl_ack::{Acked, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{EncodedBatch, NdjsonEncoder, Progress, ProgressSink, Sink, SinkDriver, SinkError};

/// What a transaction sees and changes.
#[derive(Debug, Clone, Default)]
pub struct Tables {
    /// The rows, in insertion order.
    pub rows: Vec<String>,
    /// The progress table: per partition, the next offset not stored.
    pub progress: Progress,
}

/// A client whose transactions commit atomically.
#[derive(Debug, Clone, Default)]
pub struct Database {
    committed: Arc<Mutex<Tables>>,
}

impl Database {
    /// Start a transaction.
    pub fn begin(&self) -> Tables {
        self.read()
    }

    /// Make `tx` visible and durable, all of it at once.
    pub fn commit(&self, tx: Tables) {
        *self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = tx;
    }

    /// What is committed.
    pub fn read(&self) -> Tables {
        self.committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

// ANCHOR: sink
/// Stores rows and progress in one transaction per batch.
#[derive(Debug)]
pub struct TransactionalSink {
    db: Database,
}

impl TransactionalSink {
    /// Open the sink on `db` (reads nothing yet: `progress` reads the
    /// committed progress table each time).
    pub fn new(db: Database) -> Self {
        TransactionalSink { db }
    }
}

#[async_trait]
impl Sink for TransactionalSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut tx = self.db.begin();
        for record in batch.records() {
            // Rule 12: what the stored progress covers is stored already
            // (a retry after a commit whose reply was lost, a replay).
            if tx.progress.covers(record) {
                continue;
            }
            let row = std::str::from_utf8(&record.value)
                // Returning before `commit` drops the transaction: nothing
                // of the batch is stored, as `SinkError::Data` promises.
                .map_err(|e| SinkError::data(format!("{}: {e}", record.idempotency_key())))?;
            tx.rows.push(row.to_owned());
        }
        // Rule 10: the progress past the batch, in the same transaction.
        tx.progress.advance_past(batch.records());
        self.db.commit(tx);
        Ok(())
    }
}

impl ProgressSink for TransactionalSink {
    fn progress(&self) -> Progress {
        // Rule 11: what is committed, nothing else.
        self.db.read().progress
    }
}
// ANCHOR_END: sink

fn batch(
    acker: &etl_ack::Acker,
    epoch: u32,
    offsets: std::ops::Range<i64>,
) -> Result<Acked<Vec<Record>>, Box<dyn std::error::Error + Send + Sync>> {
    let ack = acker.open(BatchMeta {
        id: BatchId {
            partition: PartitionId(0),
            epoch,
            seq: 0,
        },
        first_offset: Offset(offsets.start),
        last_offset: Offset(offsets.end - 1),
        records: u32::try_from(offsets.end - offsets.start)?,
        bytes: 0,
    })?;
    let records = offsets
        .map(|o| {
            let at = Position::new(SourceId::new("orders"), PartitionId(0), Offset(o));
            Record::new(at, format!("{{\"n\":{o}}}"))
        })
        .collect();
    Ok(Acked::new(records, ack))
}

/// Store offsets 0..3, "restart", and receive 0..5 again (a source that
/// replays): the rows hold each record once.
pub async fn run() -> Result<Tables, Box<dyn std::error::Error + Send + Sync>> {
    let db = Database::default();
    let (acker, _events) = etl_ack::channel();

    let (driver, progress) =
        SinkDriver::exactly_once(TransactionalSink::new(db.clone()), NdjsonEncoder::new());
    assert!(progress.is_empty(), "a new database has no progress");
    let sink = driver.spawn();
    sink.send(batch(&acker, 1, 0..3)?).await?;
    sink.close().await?;

    // The restart: the pipeline would resume the source at `progress`.
    let (driver, progress) =
        SinkDriver::exactly_once(TransactionalSink::new(db.clone()), NdjsonEncoder::new());
    assert_eq!(progress.get(PartitionId(0)), Some(Offset(3)));
    let sink = driver.spawn();
    sink.send(batch(&acker, 2, 0..5)?).await?;
    sink.close().await?;
    Ok(db.read())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let tables = run().await?;
    println!("rows: {:?}", tables.rows);
    println!("progress: {:?}", tables.progress);
    Ok(())
}
