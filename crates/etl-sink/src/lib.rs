//! Sinks: where records end up, and the driver that gets them there
//! without ever acknowledging what is not durable.
//!
//! * [`Sink`] writes an [`EncodedBatch`] durably (`Ok` means durable) and
//!   classifies its failures ([`SinkError`]: retryable or not, and of the
//!   environment or of the data, [`FailureKind`]). [`Encoder`]s
//!   ([`NdjsonEncoder`], [`RawLinesEncoder`]) turn records into bytes.
//! * [`SinkDriver`] runs a sink as a tokio task: it takes
//!   `Acked<Vec<Record>>` from a bounded channel, batches by count, bytes
//!   and linger time, retries retryable failures by its [`RetryPolicy`]
//!   (exponential backoff with full jitter, a limit on the time spent and
//!   optionally on the retries), bounds each attempt by a write timeout,
//!   keeps up to `concurrency` writes in flight and delivers each
//!   batch's [`AckSet`](etl_ack::AckSet) only after its durable write.
//!   A failure of the data fails the set (the partition replays) or goes
//!   to a dead-letter sink by policy; a failure of the environment stops
//!   the driver with the error; teardown (abort, panic, shutdown timeout)
//!   fails what the driver held.
//! * [`DeadLetterHandle`] writes dead letters as NDJSON lines.
//! * Built-in sinks: [`FileSink`] (fsync before acknowledging, rotation,
//!   crash recovery, exactly-once mode through [`ProgressSink`]),
//!   [`StdoutSink`], [`BlackholeSink`].
//! * With the `testing` feature, `testing` has an in-memory sink and
//!   wrappers that inject faults (failing, rejecting, hanging, panicking,
//!   slow and gated writes) for testing pipelines and sinks:
//!   `etl-sink = { ..., features = ["testing"] }` in `[dev-dependencies]`.
//!
//! # Example
//!
//! ```
//! use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
//! use etl_record::{Offset, PartitionId, Position, Record, SourceId};
//! use etl_sink::testing::MemorySink;
//! use etl_sink::{NdjsonEncoder, SinkDriver};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let (acker, mut receiver) = etl_ack::channel();
//! let id = BatchId { partition: PartitionId(0), epoch: 1, seq: 0 };
//! let meta = BatchMeta {
//!     id,
//!     first_offset: Offset(0),
//!     last_offset: Offset(1),
//!     records: 2,
//!     bytes: 14,
//! };
//! let ack = acker.open(meta)?;
//! let records = (0..2)
//!     .map(|o| {
//!         let at = Position::new(SourceId::new("in"), PartitionId(0), Offset(o));
//!         Record::new(at, format!("{{\"n\":{o}}}"))
//!     })
//!     .collect();
//!
//! let memory = MemorySink::new();
//! let sink = SinkDriver::new(memory.clone(), NdjsonEncoder::new()).spawn();
//! sink.send(Acked::new(records, ack)).await?;
//! let metrics = sink.close().await?;
//!
//! assert_eq!(metrics.records_written, 2);
//! assert_eq!(memory.bytes(), b"{\"n\":0}\n{\"n\":1}\n");
//! assert!(matches!(receiver.try_next(), Ok(AckEvent::Opened(_))));
//! assert!(matches!(
//!     receiver.try_next(),
//!     Ok(AckEvent::Resolved(msg)) if msg.status == AckStatus::Delivered
//! ));
//! # Ok(())
//! # }
//! ```

mod batch;
mod builtin;
mod config;
mod dead_letter;
mod driver;
mod encoder;
mod error;
mod file_outputs;
mod file_progress;
mod file_recovery;
mod file_sink;
mod file_state;
mod handle;
mod metrics;
mod progress;
mod retry;
mod sink;
#[cfg(feature = "testing")]
pub mod testing;
mod write;

pub use batch::{BatchEncoding, EncodedBatch};
pub use builtin::{BlackholeSink, DiscardEncoder, StdoutSink, StdoutSinkConfig};
pub use config::{PermanentErrorPolicy, SinkDriverConfig};
pub use dead_letter::{DeadLetterHandle, encode_dead_letter};
pub use driver::SinkDriver;
pub use encoder::{Encoder, NdjsonEncoder, RawLinesEncoder};
pub use error::{BoxError, FailureKind, Reject, SendError, SinkDriverError, SinkError};
pub use file_outputs::{FileOutputs, FileOutputsConfig, OutputPathError, PathTemplate};
pub use file_sink::{FileSink, FileSinkConfig, FsyncPolicy};
pub use handle::{SinkHandle, SinkSender};
pub use metrics::SinkMetrics;
pub use progress::{Progress, ProgressSink};
pub use retry::RetryPolicy;
pub use sink::{BoxSink, Sink};
