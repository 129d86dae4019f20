//! The `postgres_cdc` source.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etl_checkpoint::CheckpointHandle;
use etl_record::{Offset, PartitionId, PartitionOffsets, SourceId};
use etl_source::{Source, SourceError, SourceEvent, SourceGauge};
use tokio::sync::{Notify, mpsc};

use crate::progress::Progress;
use crate::session::{self, Event, PARTITION, Shared};
use crate::{CdcError, Lsn, PostgresCdcConfig};

/// How long [`Source::next`] waits for changes before reporting idleness.
const IDLE_AFTER: Duration = Duration::from_millis(100);
/// Batches read ahead of the pipeline: the rest waits in the server.
const READ_AHEAD: usize = 4;

/// A logical replication slot as a [`Source`]: one partition, offsets
/// near the commit LSN (see the crate docs), the slot confirmed only past
/// transactions the checkpointer committed.
///
/// The replication stream is read by a task of its own, started at the
/// first [`seek`](Source::seek) (the driver seeks the partition to its
/// committed offset when it is assigned). Standby status updates go out
/// from another task every `status_interval`, at once when the
/// server asks, and whenever [`commit`](Source::commit) moves the
/// confirmed position, whatever the pipeline is doing. A broken
/// connection is reconnected with backoff; what was read and not
/// delivered comes again with the same offsets.
pub struct PostgresCdcSource {
    shared: Arc<Shared>,
    events: Option<mpsc::Receiver<Event>>,
    task: Option<tokio::task::JoinHandle<()>>,
    announced: bool,
}

impl fmt::Debug for PostgresCdcSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresCdcSource")
            .field("source", &self.shared.source)
            .field("slot", &self.shared.slot)
            .field("publication", &self.shared.publication)
            .finish_non_exhaustive()
    }
}

impl PostgresCdcSource {
    /// A source for `config`. Connects nowhere until the first seek.
    ///
    /// # Errors
    ///
    /// [`CdcError::Config`] for a value that needs no server to be
    /// wrong (a slot name, the URL, a certificate file).
    pub fn new(config: PostgresCdcConfig) -> Result<Self, CdcError> {
        config.validate()?;
        let settings = config.client_settings()?;
        let shared = Shared {
            settings,
            source: SourceId::new(config.name.as_deref().unwrap_or("postgres_cdc")),
            publication: config.publication,
            slot: config.slot,
            create_slot: config.create_slot,
            snapshot: config.snapshot,
            max_batch: config.max_batch_records,
            status_interval: config.status_interval,
            connect_timeout: config.connect_timeout,
            progress: Mutex::new(Progress::new(Lsn(0))),
            status_now: Notify::new(),
            checkpoint: Mutex::new(None),
        };
        Ok(PostgresCdcSource {
            shared: Arc::new(shared),
            events: None,
            task: None,
            announced: false,
        })
    }

    /// Follow `checkpoint`'s commits: the source reads the slot's last
    /// committed offset from it twice a second and confirms past what it
    /// covers, without waiting for [`commit`](Source::commit) (which the
    /// source driver calls only when its `source_commit_interval` is
    /// set). Reading the committed offset is all it does with the handle.
    ///
    /// ```no_run
    /// # use etl::{Pipeline, PipelineError};
    /// # use etl_postgres_cdc::{PostgresCdcConfig, PostgresCdcSource};
    /// # fn build(config: PostgresCdcConfig) -> etl::PipelineBuilder {
    /// Pipeline::builder().source_factory(move |checkpoint| {
    ///     let source = PostgresCdcSource::new(config)
    ///         .map_err(|e| PipelineError::Invalid(e.to_string()))?;
    ///     Ok(Box::new(source.following(checkpoint.clone())))
    /// })
    /// # }
    /// ```
    #[must_use]
    pub fn following(self, checkpoint: CheckpointHandle) -> Self {
        *self
            .shared
            .checkpoint
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(checkpoint);
        self
    }

    /// An exactly-once sink beside the source stored progress up to
    /// `offset` (it skips every record below it): the initial snapshot's
    /// rows, a new read of the tables rather than a replay, take offsets
    /// at or above it, so none is skipped as held already. Streamed
    /// changes need nothing: a restart gives them the offsets they had.
    /// [`register`](crate::register) passes the sink's progress when the
    /// pipeline is built; a program that builds the pipeline itself with
    /// an exactly-once sink passes it the same way.
    pub fn stored_progress(&self, offset: i64) {
        self.shared.progress().stored_progress(offset);
    }

    /// A handle that passes an exactly-once sink's progress to the
    /// source once it has moved into the pipeline.
    pub(crate) fn progress_keeper(&self) -> StoredProgress {
        StoredProgress(Arc::clone(&self.shared))
    }

    /// The position confirmed (or about to be) to the server: every
    /// change before it is delivered.
    #[must_use]
    pub fn confirmed_lsn(&self) -> Lsn {
        self.shared.progress().flushed()
    }

    /// Bytes of WAL the slot retains for the pipeline: the server's end
    /// of WAL as its last message said, minus the position confirmed (or
    /// about to be) or, when earlier, the first change of a transaction
    /// a restart would decode again (the slot may be confirmed at the
    /// commit of a transaction not yet delivered). It grows while the
    /// pipeline cannot deliver.
    #[must_use]
    pub fn retained_wal_bytes(&self) -> u64 {
        self.shared.progress().retained()
    }

    fn stop_session(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.events = None;
    }
}

/// Passes an exactly-once sink's stored progress to a source
/// ([`PostgresCdcSource::stored_progress`]).
pub(crate) struct StoredProgress(Arc<Shared>);

impl StoredProgress {
    /// As [`PostgresCdcSource::stored_progress`].
    pub(crate) fn stored_progress(&self, offset: i64) {
        self.0.progress().stored_progress(offset);
    }
}

impl Drop for PostgresCdcSource {
    fn drop(&mut self) {
        self.stop_session();
    }
}

#[async_trait]
impl Source for PostgresCdcSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if !self.announced {
            self.announced = true;
            return Ok(SourceEvent::Assigned(vec![PARTITION]));
        }
        let Some(events) = self.events.as_mut() else {
            // Not positioned yet: the driver seeks right after the
            // assignment.
            tokio::time::sleep(IDLE_AFTER).await;
            return Ok(SourceEvent::Idle);
        };
        match tokio::time::timeout(IDLE_AFTER, events.recv()).await {
            Err(_elapsed) => Ok(SourceEvent::Idle),
            Ok(Some(Event::Batch(batch))) => Ok(SourceEvent::Batch(batch)),
            Ok(Some(Event::Fatal(e))) => {
                self.stop_session();
                Err(e.into())
            }
            Ok(None) => {
                self.stop_session();
                Err(SourceError::custom(format!(
                    "postgres_cdc slot {:?}: the replication task stopped",
                    self.shared.slot
                )))
            }
        }
    }

    /// Restart the stream so the next batch starts at `offset`: the
    /// server sends again from the slot's confirmed position, and what
    /// lies before `offset` is skipped.
    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        if partition != PARTITION {
            return Err(SourceError::UnknownPartition { partition });
        }
        self.stop_session();
        let (tx, rx) = mpsc::channel(READ_AHEAD);
        self.events = Some(rx);
        self.task = Some(tokio::spawn(session::run(
            Arc::clone(&self.shared),
            offset.0,
            tx,
        )));
        Ok(())
    }

    /// The offset the server's end of WAL stands for, as its last message
    /// said: the driver reports it (`etl_partition_high_watermark`), and
    /// the partition's lag (`etl_partition_lag`) is it minus the
    /// delivered watermark, about the WAL bytes not yet delivered.
    fn high_watermark(&self, partition: PartitionId) -> Option<Offset> {
        if partition != PARTITION || self.task.is_none() {
            return None;
        }
        Some(Offset(self.shared.progress().high_watermark()))
    }

    /// `retained_wal_bytes`: [`retained_wal_bytes`](Self::retained_wal_bytes),
    /// exported as `etl_source_retained_wal_bytes` and on the progress
    /// line, once the stream started.
    fn gauges(&self) -> Vec<SourceGauge> {
        if self.task.is_none() {
            return Vec::new();
        }
        vec![SourceGauge::new(
            "retained_wal_bytes",
            "Bytes of WAL the replication slot retains past the position confirmed to the server.",
            i64::try_from(self.retained_wal_bytes()).unwrap_or(i64::MAX),
        )]
    }

    /// The checkpointer committed `offsets`: confirm the slot past every
    /// transaction they cover whole, at once.
    async fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), SourceError> {
        if let Some(offset) = offsets.get(&PARTITION)
            && self.shared.progress().delivered(offset.0)
        {
            self.shared.status_now.notify_one();
        }
        Ok(())
    }
}
