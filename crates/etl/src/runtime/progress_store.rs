//! The offset store of an exactly-once pipeline: the pipeline's store,
//! with the sink's progress read at every assignment.

use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::time::Duration;

use etl_checkpoint::{CheckpointError, OffsetStore, PartitionOffsets};
use etl_sink::ProgressSink;

/// How long reading the sink's progress may take before the assignment
/// fails.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(30);

/// An [`OffsetStore`] whose [`load`](OffsetStore::load) (the checkpointer
/// calls it on every assignment) also reads the exactly-once sink's
/// stored progress at that moment, through
/// [`ProgressSink::reload_progress`]: a partition starts at the lower of
/// its committed offset and the sink's progress, and the sink skips what
/// its progress holds.
///
/// Progress read once when the pipeline was built is not enough when
/// several processes write one store: a partition that comes back after
/// another member of its consumer group advanced it would be sought to
/// the stale position and written twice. Reading it at assignment also
/// refreshes what the sink itself (and its driver) skip.
///
/// Commits go to the inner store unchanged.
pub(crate) struct SinkProgressStore {
    inner: Box<dyn OffsetStore>,
    sink: Arc<dyn ProgressSink>,
    runtime: tokio::runtime::Handle,
}

impl SinkProgressStore {
    /// Wrap `inner`; `runtime` runs the sink's reads (the checkpointer
    /// calls `load` on its own thread, outside the runtime).
    pub(crate) fn new(
        inner: Box<dyn OffsetStore>,
        sink: Arc<dyn ProgressSink>,
        runtime: tokio::runtime::Handle,
    ) -> Self {
        SinkProgressStore {
            inner,
            sink,
            runtime,
        }
    }

    fn reload(&self) -> Result<PartitionOffsets, CheckpointError> {
        let (tx, rx) = sync_channel(1);
        let sink = Arc::clone(&self.sink);
        self.runtime.spawn(async move {
            let _ = tx.send(sink.reload_progress().await);
        });
        match rx.recv_timeout(RELOAD_TIMEOUT) {
            Ok(Ok(progress)) => Ok(progress.iter().collect()),
            Ok(Err(e)) => Err(CheckpointError::Store(Box::new(e))),
            Err(RecvTimeoutError::Timeout) => Err(CheckpointError::Store(
                format!("reading the sink's stored progress took more than {RELOAD_TIMEOUT:?}")
                    .into(),
            )),
            Err(RecvTimeoutError::Disconnected) => Err(CheckpointError::Store(
                "reading the sink's stored progress stopped without an answer".into(),
            )),
        }
    }
}

impl OffsetStore for SinkProgressStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        let mut offsets = self.inner.load()?;
        // Reading the progress also refreshes what the sink and its driver
        // skip. A partition resumes at the lower of its commit and the
        // sink's progress: the commit covers only records whose every
        // destination (dead letters included) is durable, the progress
        // may pass a dead letter never written; what the progress holds is
        // skipped, so the sink still gets each record once.
        for (partition, at) in self.reload()? {
            if let Some(committed) = offsets.get_mut(&partition) {
                *committed = (*committed).min(at);
            }
        }
        Ok(offsets)
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        self.inner.commit(offsets)
    }
}
