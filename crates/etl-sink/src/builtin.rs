//! Small built-in sinks: standard output and a blackhole.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::BytesMut;
use etl_record::Record;

use crate::{EncodedBatch, Encoder, Sink, SinkError};

/// Writes batches to standard output and flushes it before returning.
/// "Durable" here means handed to the reader of the pipe.
#[derive(Debug, Default)]
pub struct StdoutSink {
    _private: (),
}

impl StdoutSink {
    /// The sink.
    #[must_use]
    pub fn new() -> Self {
        StdoutSink::default()
    }
}

#[async_trait]
impl Sink for StdoutSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let bytes = batch.bytes().clone();
        tokio::task::spawn_blocking(move || {
            let mut out = std::io::stdout().lock();
            out.write_all(&bytes).and_then(|()| out.flush())
        })
        .await
        .map_err(|e| SinkError::permanent(format!("stdout task failed: {e}")))?
        // A broken pipe (the reader went away) is not retried and halts
        // the pipeline; see `SinkError::is_retryable`.
        .map_err(|e| SinkError::io("write to", "standard output", e))
    }
}

/// Accepts every batch at once and keeps nothing but counts: for
/// benchmarks that measure everything but the sink. Drive it with
/// [`BlackholeSink::encoder`], which copies nothing: its batches count
/// records and carry no bytes.
#[derive(Debug, Default)]
pub struct BlackholeSink {
    records: AtomicU64,
    bytes: AtomicU64,
}

impl BlackholeSink {
    /// The sink.
    #[must_use]
    pub fn new() -> Self {
        BlackholeSink::default()
    }

    /// The encoder for this sink: it takes every record and appends
    /// nothing, so no value is copied on its way into the void.
    #[must_use]
    pub fn encoder() -> DiscardEncoder {
        DiscardEncoder { _private: () }
    }

    /// Records accepted so far.
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// Bytes accepted so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Sink for BlackholeSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        self.records
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.bytes
            .fetch_add(batch.bytes().len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Takes every record and encodes it as nothing: for a sink that keeps
/// nothing (see [`BlackholeSink::encoder`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardEncoder {
    _private: (),
}

impl Encoder for DiscardEncoder {
    fn encode(&self, _record: &Record, _out: &mut BytesMut) -> Result<(), SinkError> {
        Ok(())
    }
}
