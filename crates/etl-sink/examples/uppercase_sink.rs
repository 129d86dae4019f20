//! A complete user-written sink, run by the sink driver.
//!
//! `LineCollector` keeps lines in memory (standing in for a remote
//! service). It shows the three outcomes a sink reports: `Ok` once the
//! data is durable, a retryable error for a transient failure (its first
//! call fails, the driver retries), and per-record rejects (records whose
//! value holds the word "reject" go to the dead-letter sink).
//!
//! Run it with `cargo run -p etl-sink --example uppercase_sink`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::testing::MemorySink;
use etl_sink::{
    EncodedBatch, RawLinesEncoder, Reject, Sink, SinkDriver, SinkDriverConfig, SinkError,
};

/// Stores the upper-cased lines of every record it accepts.
#[derive(Debug, Default)]
pub struct LineCollector {
    lines: Mutex<Vec<String>>,
    calls: AtomicU32,
}

impl LineCollector {
    /// What was stored so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl Sink for LineCollector {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        // A transient failure: the driver retries the same batch.
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(SinkError::retryable("service briefly unavailable"));
        }
        let mut accepted = Vec::new();
        let mut rejects = Vec::new();
        for i in 0..batch.len() {
            let line = batch.encoded(i).unwrap_or_default();
            let text = String::from_utf8_lossy(line).trim_end().to_uppercase();
            if text.contains("REJECT") {
                rejects.push(Reject::new(i, "the service refuses this value"));
            } else {
                accepted.push(text);
            }
        }
        // Store everything accepted *before* reporting rejects: a reject
        // report promises the other records are durable.
        self.lines
            .lock()
            .map_err(|_| SinkError::permanent("store poisoned"))?
            .extend(accepted);
        if rejects.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejects))
        }
    }
}

/// Run the example; returns the stored lines and the dead-letter bytes.
pub async fn run() -> Result<(Vec<String>, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
    let (acker, mut receiver) = etl_ack::channel();
    let id = BatchId {
        partition: PartitionId(0),
        epoch: 1,
        seq: 0,
    };
    let ack = acker.open(BatchMeta {
        id,
        first_offset: Offset(0),
        last_offset: Offset(2),
        records: 3,
        bytes: 20,
    })?;
    let records: Vec<Record> = ["hello", "please reject me", "world"]
        .iter()
        .zip(0..)
        .map(|(v, o)| {
            Record::new(
                Position::new(SourceId::new("demo"), PartitionId(0), Offset(o)),
                *v,
            )
        })
        .collect();

    let collector = std::sync::Arc::new(LineCollector::default());
    let dead_letters = MemorySink::new();
    let sink = SinkDriver::new(collector.clone(), RawLinesEncoder::new())
        .config(SinkDriverConfig::default())
        .dead_letters(dead_letters.clone())
        .spawn();
    sink.send(Acked::new(records, ack)).await?;
    let metrics = sink.close().await?;
    assert_eq!(
        (
            metrics.records_written,
            metrics.dead_lettered,
            metrics.retries
        ),
        (2, 1, 1)
    );

    // The batch was delivered only after both writes were durable.
    let mut delivered = false;
    while let Ok(event) = receiver.try_next() {
        if let AckEvent::Resolved(msg) = event {
            delivered = msg.status == AckStatus::Delivered;
        }
    }
    assert!(delivered);
    Ok((collector.lines(), dead_letters.bytes()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (lines, dead) = run().await?;
    println!("stored: {lines:?}");
    print!("dead letters: {}", String::from_utf8_lossy(&dead));
    Ok(())
}
