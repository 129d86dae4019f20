//! The `Source` trait: what a source implements, and its contract.

use async_trait::async_trait;
use etl_record::{Offset, PartitionId, PartitionOffsets};

use crate::{PollBatch, SourceError};

/// What a call to [`Source::next`] produced.
#[derive(Debug)]
pub enum SourceEvent {
    /// These partitions are now this source's to read. The driver starts
    /// an epoch for each and [seeks](Source::seek) each to its start
    /// position before polling again. A static source announces its
    /// partitions once, with its first event.
    Assigned(Vec<PartitionId>),
    /// These partitions are no longer this source's (a consumer-group
    /// rebalance). No batch of them may follow until they are assigned
    /// again.
    Revoked(Vec<PartitionId>),
    /// Records (and rejected input) of one partition.
    Batch(PollBatch),
    /// Nothing to read right now; ask again later. The driver backs off
    /// briefly before polling again.
    Idle,
    /// A bounded source is exhausted: every assigned partition was read to
    /// its end. The driver keeps serving replays until everything emitted
    /// is resolved, so a source MUST serve batches again after a later
    /// [`seek`](Source::seek).
    End,
}

/// A figure a source keeps of its own (the bytes of WAL a replication
/// slot retains, files waiting to be read), which the pipeline exports
/// beside its own metrics: on Prometheus as the gauge
/// `etl_source_<name>`, and on the progress line as `<name> <value>`
/// (a size in bytes when the name ends in `_bytes`).
///
/// ```
/// use etl_source::SourceGauge;
///
/// let gauge = SourceGauge::new("retained_wal_bytes", "WAL the slot retains.", 4096);
/// assert!(gauge.has_valid_name());
/// assert!(!SourceGauge::new("Retained WAL", "", 0).has_valid_name());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceGauge {
    /// Its name: a lower-case ASCII letter, then lower-case letters,
    /// digits and underscores; `_bytes` at the end for a size in bytes.
    /// A gauge with another name, or with the name of one before it, is
    /// not exported.
    pub name: &'static str,
    /// What it measures, in one sentence (the Prometheus help text).
    pub help: &'static str,
    /// Its value now.
    pub value: i64,
}

impl SourceGauge {
    /// A gauge `name` of `value`, described by `help`.
    #[must_use]
    pub fn new(name: &'static str, help: &'static str, value: i64) -> Self {
        SourceGauge { name, help, value }
    }

    /// Whether the name is one the pipeline exports (see
    /// [`name`](Self::name)).
    #[must_use]
    pub fn has_valid_name(&self) -> bool {
        let mut chars = self.name.chars();
        chars.next().is_some_and(|c| c.is_ascii_lowercase())
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    }
}

/// A partitioned, replayable source of records.
///
/// The source driver owns the source: it polls [`next`](Source::next),
/// opens an acknowledgement handle per batch, bounds what is in flight and
/// replays partitions after failures by seeking back. The key words MUST,
/// MUST NOT, SHOULD and MAY are to be read as in RFC 2119.
///
/// # Implementor contract
///
/// **Partitions.** A source MUST announce every partition with
/// [`SourceEvent::Assigned`] before returning any batch of it, and MUST NOT
/// return a batch of a partition it has announced as
/// [`Revoked`](SourceEvent::Revoked) (until it is assigned again). A static
/// source (files, a generator) announces its partitions once, with its
/// first event.
///
/// **Batches.** A batch MUST hold records of one partition only. Offsets
/// (of records and rejected input together) MUST increase strictly within
/// a batch and from one batch of a partition to the next, until a seek.
/// Offsets need not be dense (a file source uses byte positions). Every
/// offset read MUST appear in exactly one batch, as a record or as a
/// [rejected](PollBatch::rejected) dead letter: input that cannot be
/// turned into a record is rejected with a reason, never skipped silently.
/// A source SHOULD bound its batches (a few thousand records or a few
/// MiB) so in-flight limits stay meaningful.
///
/// **Seek.** After `seek(p, o)` the next batch of `p` MUST start at the
/// first record whose offset is `>= o`, whatever was read or buffered
/// before: buffered records of `p` MUST be discarded. `o` is a committed
/// position, "the offset after the last delivered record", so it may lie
/// between two records' offsets. Seeking a partition MUST NOT affect any
/// other partition. A source that has returned [`SourceEvent::End`] MUST
/// serve the partition again from `o`.
///
/// **Revoke.** When a source learns that partitions are taken from it, it
/// MUST return `Revoked` for them before any other event, and MUST NOT
/// return their batches afterwards. The driver then lets the checkpointer
/// drain and commit them; a source whose group protocol waits for the
/// revocation to complete (Kafka) SHOULD hold the rebalance until the
/// driver's next call, which comes only after that commit.
///
/// **Cancellation and shutdown.** [`next`](Source::next) MUST be cancel
/// safe: if the future is dropped before it completes, no input is lost
/// (the next call returns it). The driver drops it to serve a replay or to
/// shut down. On shutdown the driver stops polling and drops the source;
/// a source MUST NOT rely on a final call, and MUST NOT commit offsets on
/// its own (nothing but the checkpointer decides what is delivered).
///
/// **Idleness.** `next` SHOULD return [`SourceEvent::Idle`] rather than
/// wait long when nothing is available, so the driver can serve replays
/// and shutdown promptly; it MAY wait briefly (up to about 100 ms) first.
///
/// **Offsets kept by the source.** A source whose offsets also live
/// elsewhere (a Kafka consumer group) MAY implement
/// [`commit`](Source::commit), which receives offsets the checkpointer has
/// already committed. It MUST NOT commit anything else.
///
/// **Figures of its own.** A source MAY report figures only it knows
/// (the WAL a replication slot retains) through
/// [`gauges`](Source::gauges); the driver reads them after every batch
/// and while idle, and the pipeline exports them on Prometheus and the
/// progress line. Like [`high_watermark`](Source::high_watermark), it
/// MUST NOT block: it returns what the source last heard.
#[async_trait]
pub trait Source: Send {
    /// The next event: an assignment change, a batch, idleness or the end.
    /// MUST be cancel safe.
    async fn next(&mut self) -> Result<SourceEvent, SourceError>;

    /// Position `partition` so its next batch starts at the first record
    /// with offset `>= offset`, discarding anything buffered for it.
    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError>;

    /// Stop fetching these partitions for now: their in-flight limit is
    /// reached. Batches already buffered MAY still be returned. The default
    /// does nothing.
    async fn pause(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        let _ = partitions;
        Ok(())
    }

    /// Fetch these partitions again after [`pause`](Source::pause). The
    /// default does nothing.
    async fn resume(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        let _ = partitions;
        Ok(())
    }

    /// Offsets the checkpointer has committed, for a source that also keeps
    /// them itself (a consumer group). Each is the position after the last
    /// delivered record. The default does nothing.
    async fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), SourceError> {
        let _ = offsets;
        Ok(())
    }

    /// The offset after the last record `partition` holds now (Kafka's
    /// high watermark), as the source last heard it without asking
    /// anyone; the driver reports it in the metrics, from which the
    /// partition's lag follows. MUST NOT block. The default knows none.
    fn high_watermark(&self, partition: PartitionId) -> Option<Offset> {
        let _ = partition;
        None
    }

    /// The source's own figures now ([`SourceGauge`]), as it last heard
    /// them without asking anyone: exported as `etl_source_<name>` gauges
    /// and on the progress line. MUST NOT block. The default has none.
    fn gauges(&self) -> Vec<SourceGauge> {
        Vec::new()
    }

    /// Whether the partitions this source revokes go to another owner (a
    /// member of a consumer group), rather than being retired (an input
    /// file replaced). Then the driver revokes them with
    /// [`CheckpointHandle::hand_over`](etl_checkpoint::CheckpointHandle::hand_over):
    /// an exactly-once sink writes nothing more of them once the
    /// revocation began, and a write of them still under way at the
    /// revoke deadline halts the run, so that no late write of this
    /// process lands after the new owner's. A retired partition's
    /// batches are still written. The default is `false`.
    fn hands_over_revoked(&self) -> bool {
        false
    }
}

/// A source behind a box, as the driver and the runtime hold it.
pub type BoxSource = Box<dyn Source>;

#[async_trait]
impl<S: Source + ?Sized> Source for Box<S> {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        (**self).next().await
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        (**self).seek(partition, offset).await
    }

    async fn pause(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        (**self).pause(partitions).await
    }

    async fn resume(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        (**self).resume(partitions).await
    }

    async fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), SourceError> {
        (**self).commit(offsets).await
    }

    fn high_watermark(&self, partition: PartitionId) -> Option<Offset> {
        (**self).high_watermark(partition)
    }

    fn gauges(&self) -> Vec<SourceGauge> {
        (**self).gauges()
    }

    fn hands_over_revoked(&self) -> bool {
        (**self).hands_over_revoked()
    }
}

/// Compile-time check that [`Source`] stays object safe: this fails to
/// build as soon as a method makes `dyn Source` impossible.
const _: fn(&mut dyn Source) = |_| {};

/// Compile-time check that a boxed source can move into a spawned task.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<BoxSource>();
};
