//! A sink that keeps what it is given in memory.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use etl_record::{Offset, PartitionId, Record};

use crate::{EncodedBatch, Sink, SinkError};

#[derive(Debug, Default)]
struct Contents {
    records: Vec<Record>,
    bytes: Vec<u8>,
    writes: u64,
    flushes: u64,
}

/// Keeps every record and byte written, in order. Clones share the
/// contents, so a test keeps one clone and gives the other to a driver.
#[derive(Clone, Debug, Default)]
pub struct MemorySink {
    contents: Arc<Mutex<Contents>>,
}

impl MemorySink {
    /// An empty sink.
    #[must_use]
    pub fn new() -> Self {
        MemorySink::default()
    }

    fn lock(&self) -> MutexGuard<'_, Contents> {
        self.contents.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every record written so far.
    #[must_use]
    pub fn records(&self) -> Vec<Record> {
        self.lock().records.clone()
    }

    /// `(partition, offset)` of every record written so far, in order.
    #[must_use]
    pub fn positions(&self) -> Vec<(PartitionId, Offset)> {
        self.lock()
            .records
            .iter()
            .map(|r| (r.position.partition, r.position.offset))
            .collect()
    }

    /// Every byte written so far.
    #[must_use]
    pub fn bytes(&self) -> Vec<u8> {
        self.lock().bytes.clone()
    }

    /// Successful writes so far.
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// Flushes so far.
    #[must_use]
    pub fn flushes(&self) -> u64 {
        self.lock().flushes
    }
}

#[async_trait]
impl Sink for MemorySink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut c = self.lock();
        c.records.extend_from_slice(batch.records());
        c.bytes.extend_from_slice(batch.bytes());
        c.writes += 1;
        Ok(())
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.lock().flushes += 1;
        Ok(())
    }
}
