//! Configuration and outputs of the source driver.

use std::collections::BTreeMap;
use std::time::Duration;

use etl_ack::Acked;
use etl_record::{DeadLetter, PartitionOffsets, Record};

use crate::PoisonPolicy;

/// How a [`SourceDriver`](crate::SourceDriver) behaves.
#[derive(Clone, Debug)]
pub struct SourceDriverConfig {
    /// Failures of the same range before it is narrowed to one record per
    /// batch, and failures of a record alone before it is poison. At
    /// least 1.
    pub max_replays: u32,
    /// What happens to a poison record.
    pub poison: PoisonPolicy,
    /// How long to wait after the source reported
    /// [`Idle`](crate::SourceEvent::Idle).
    pub idle_backoff: Duration,
    /// After the source reported [`End`](crate::SourceEvent::End), how
    /// often to check whether everything emitted is resolved.
    pub end_check_interval: Duration,
    /// Start positions that override the offset store on assignment (for
    /// a sink that keeps its own progress). Partitions not listed start
    /// at their committed offset.
    pub start_offsets: PartitionOffsets,
    /// How often to pass committed offsets to
    /// [`Source::commit`](crate::Source::commit), for a source that keeps
    /// offsets itself. `None`: only after a revocation.
    pub source_commit_interval: Option<Duration>,
    /// Bytes of in-flight credit a record takes beyond its payload, so
    /// that `max_in_flight_bytes` bounds memory rather than payload: the
    /// in-memory [`Record`] itself and its share of the vectors and
    /// buffers that carry it to the sinks. The default is
    /// `size_of::<Record>()` plus 64 (measured on the file-to-file
    /// benchmark; see `docs/operations.md`). 0 counts payload only.
    pub record_overhead_bytes: u64,
}

/// Credit a record takes beyond its payload, by default.
pub(crate) const RECORD_OVERHEAD_BYTES: u64 = std::mem::size_of::<Record>() as u64 + 64;

impl Default for SourceDriverConfig {
    fn default() -> Self {
        SourceDriverConfig {
            max_replays: 3,
            poison: PoisonPolicy::DeadLetter,
            idle_backoff: Duration::from_millis(10),
            end_check_interval: Duration::from_millis(10),
            start_offsets: BTreeMap::new(),
            source_commit_interval: None,
            record_overhead_bytes: RECORD_OVERHEAD_BYTES,
        }
    }
}

/// What the driver sends downstream: records of one batch, or one dead
/// letter, each with a clone of the batch's acknowledgement handle.
#[derive(Debug)]
pub enum SourceOutput {
    /// Records of one poll batch (or of a narrowed slice of it).
    Batch(Acked<Vec<Record>>),
    /// Input the source rejected, or a poison record: to be written to
    /// the dead-letter sink, which counts as its delivery.
    DeadLetter(Acked<DeadLetter>),
}

impl SourceOutput {
    /// Mark the covered batch failed (for code that cannot finish with
    /// this output), then drop it. Dropping an output does the same: an
    /// [`Acked`] value fails its handle unless taken out with
    /// [`Acked::into_parts`].
    pub fn fail(self) {
        match self {
            SourceOutput::Batch(a) => a.fail(),
            SourceOutput::DeadLetter(a) => a.fail(),
        }
    }

    /// Finish with this output: its share of the batch resolves as
    /// consumed (see [`Acked::consume`]).
    pub fn consume(self) {
        match self {
            SourceOutput::Batch(a) => a.consume(),
            SourceOutput::DeadLetter(a) => a.consume(),
        }
    }
}

/// Why [`SourceDriver::run`](crate::SourceDriver::run) returned normally.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverExit {
    /// Shutdown was requested.
    Shutdown,
    /// The source ended and everything emitted was resolved.
    Ended,
}
