//! A complete source: a partitioned in-memory log, run through the source
//! driver with a checkpointer until every record is delivered and
//! committed.
//!
//! Run it with `cargo run -p etl-source --example memory_log`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;
use etl_checkpoint::{CheckpointConfig, Checkpointer, MemoryStore};
use etl_record::{Offset, PartitionId, PartitionOffsets, Position, Record, SourceId};
use etl_source::{
    DriverExit, PollBatch, Source, SourceDriver, SourceDriverConfig, SourceError, SourceEvent,
    SourceOutput,
};
use tokio_util::sync::CancellationToken;

/// A log of values in numbered partitions; offsets are indexes. Clones
/// share the log, so a writer can append while a source reads.
#[derive(Clone, Debug, Default)]
pub struct MemoryLog {
    partitions: Arc<Mutex<Vec<Vec<Bytes>>>>,
}

impl MemoryLog {
    /// A log with `partitions` empty partitions.
    pub fn new(partitions: usize) -> Self {
        MemoryLog {
            partitions: Arc::new(Mutex::new(vec![Vec::new(); partitions])),
        }
    }

    /// Append a value to a partition; returns its offset.
    pub fn append(&self, partition: usize, value: impl Into<Bytes>) -> Offset {
        let mut log = self
            .partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let p = &mut log[partition];
        p.push(value.into());
        Offset(p.len() as i64 - 1)
    }

    /// Up to `max` values of a partition from index `from`.
    fn read(&self, partition: usize, from: usize, max: usize) -> Vec<Bytes> {
        let log = self
            .partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        log.get(partition)
            .map(|p| p.iter().skip(from).take(max).cloned().collect())
            .unwrap_or_default()
    }

    fn partition_count(&self) -> usize {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Reads a [`MemoryLog`]: every partition is assigned once, batches go
/// round-robin, the source ends when every partition is read to its end.
#[derive(Debug)]
pub struct MemoryLogSource {
    name: SourceId,
    log: MemoryLog,
    /// Next index to read, per partition.
    cursors: BTreeMap<PartitionId, usize>,
    announced: bool,
    batch_size: usize,
    turn: usize,
}

impl MemoryLogSource {
    /// A source over `log`, named `name`.
    pub fn new(name: &str, log: MemoryLog, batch_size: usize) -> Self {
        let cursors = (0..log.partition_count() as u32)
            .map(|p| (PartitionId(p), 0))
            .collect();
        MemoryLogSource {
            name: SourceId::new(name),
            log,
            cursors,
            announced: false,
            batch_size: batch_size.max(1),
            turn: 0,
        }
    }
}

#[async_trait]
impl Source for MemoryLogSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        // A static source announces its partitions once, first.
        if !self.announced {
            self.announced = true;
            return Ok(SourceEvent::Assigned(
                self.cursors.keys().copied().collect(),
            ));
        }
        // No `.await` below: the call cannot be interrupted half-way, so it
        // is cancel safe by construction.
        let n = self.cursors.len();
        for k in 0..n {
            let (partition, cursor) = self
                .cursors
                .iter_mut()
                .nth((self.turn + k) % n)
                .map(|(p, c)| (*p, c))
                .ok_or_else(|| SourceError::custom("partition table changed"))?;
            let values = self
                .log
                .read(partition.0 as usize, *cursor, self.batch_size);
            if values.is_empty() {
                continue;
            }
            let first = *cursor;
            *cursor += values.len();
            self.turn = (self.turn + k + 1) % n;
            // One partition per batch, offsets strictly increasing.
            let records = values
                .into_iter()
                .enumerate()
                .map(|(i, value)| {
                    let offset = Offset((first + i) as i64);
                    Record::new(Position::new(self.name.clone(), partition, offset), value)
                })
                .collect();
            return Ok(SourceEvent::Batch(PollBatch::from_records(
                partition, records,
            )));
        }
        Ok(SourceEvent::End)
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        // Offsets are dense indexes, so "the first record at or after
        // `offset`" is simply index `offset`; buffered state is the cursor.
        let cursor = self
            .cursors
            .get_mut(&partition)
            .ok_or(SourceError::UnknownPartition { partition })?;
        *cursor = offset.0.max(0) as usize;
        Ok(())
    }
}

/// Append `per_partition` records to each of `partitions` partitions, run
/// them through the driver to a consumer that delivers everything, and
/// return the committed offsets.
pub async fn run(
    partitions: usize,
    per_partition: usize,
) -> Result<PartitionOffsets, Box<dyn std::error::Error + Send + Sync>> {
    let log = MemoryLog::new(partitions);
    for p in 0..partitions {
        for i in 0..per_partition {
            log.append(p, format!("{{\"partition\":{p},\"n\":{i}}}"));
        }
    }

    let store = MemoryStore::new();
    let (acker, acks) = etl_ack::channel();
    let (checkpoint, replays) =
        Checkpointer::spawn(CheckpointConfig::default(), Box::new(store.clone()), acks)?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let driver = SourceDriver::new(
        MemoryLogSource::new("memory-log", log, 32),
        acker,
        checkpoint.clone(),
        replays,
        tx,
        SourceDriverConfig::default(),
    );
    let driver = tokio::spawn(driver.run(CancellationToken::new()));

    // The "sink": consuming an output resolves its batch as delivered
    // (an output merely dropped would fail it and replay).
    let mut delivered = 0;
    while let Some(output) = rx.recv().await {
        if let SourceOutput::Batch(batch) = &output {
            delivered += batch.value().len();
        }
        output.consume();
    }
    assert_eq!(driver.await??, DriverExit::Ended);
    checkpoint.shutdown().await?;
    println!("delivered {delivered} records");
    Ok(store.offsets())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let committed = run(3, 100).await?;
    for (partition, offset) in &committed {
        println!("partition {partition}: committed offset {offset}");
    }
    Ok(())
}
