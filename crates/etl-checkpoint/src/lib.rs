//! Partition watermarks, the checkpointer, in-flight credits and offset
//! stores: the heart of the delivery contract.
//!
//! * [`PartitionTracker`] is a pure state machine per partition: the
//!   delivered watermark is the contiguous prefix of delivered batches; a
//!   failed batch pins it and asks for one [`ReplayRequest`] under a new
//!   epoch; acknowledgements of other epochs change nothing.
//! * [`Checkpointer`] runs the trackers on its own thread, the single owner
//!   of partition state. It drains acknowledgements first, commits on an
//!   interval, on revoke (only the revoked partitions) and on shutdown.
//!   Once the run halts ([`CheckpointHandle::halt`]), a failed batch still
//!   pins its partition but asks for no replay.
//! * [`InFlightBudget`] bounds in-flight batches and bytes per partition
//!   and in total; the checkpointer returns credit as batches resolve.
//! * [`OffsetStore`] keeps commits: [`MemoryStore`], and [`FileStore`],
//!   crash-safe with a checksummed previous generation to fall back on.
//!
//! # Example
//!
//! ```
//! use etl_ack::{BatchId, BatchMeta};
//! use etl_checkpoint::{CheckpointConfig, Checkpointer, MemoryStore};
//! use etl_record::{Offset, PartitionId};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! let (acker, receiver) = etl_ack::channel();
//! let (checkpointer, _replays) =
//!     Checkpointer::spawn(CheckpointConfig::default(), Box::new(store.clone()), receiver)?;
//!
//! let p = PartitionId(0);
//! let assigned = checkpointer.assign(vec![(p, None)]).await?;
//! let (epoch, start) = (assigned[0].epoch, assigned[0].start);
//! assert_eq!(start, Offset(0));
//!
//! checkpointer.budget().acquire(p, 64).await;
//! let id = BatchId { partition: p, epoch, seq: 0 };
//! let ack = acker
//!     .open(BatchMeta { id, first_offset: Offset(0), last_offset: Offset(9), records: 10, bytes: 64 })
//!     .expect("checkpointer alive");
//! drop(ack); // every record of the batch was delivered
//!
//! let summary = checkpointer.shutdown().await?;
//! assert_eq!(summary.committed[&p], Offset(10));
//! assert_eq!(store.offsets()[&p], Offset(10));
//! # Ok::<(), etl_checkpoint::CheckpointError>(())
//! # }).unwrap();
//! ```

mod budget;
mod commits;
mod error;
mod failure;
mod file_store;
mod halt;
mod handle;
#[cfg(all(test, etl_loom))]
mod loom_tests;
mod metrics;
mod partition_map;
mod sealed;
pub mod sparse;
mod store;
mod sync;
mod tracker;
mod worker;

pub use budget::{InFlight, InFlightBudget, InFlightLimits};
pub use error::CheckpointError;
pub use failure::FailurePolicy;
pub use file_store::FileStore;
pub use handle::{
    Assigned, CheckpointConfig, CheckpointHandle, CheckpointSummary, Checkpointer, ReplayRequests,
};
pub use metrics::{CheckpointMetrics, PartitionMetrics, PublishedMetrics};
pub use sealed::{UnsealError, seal, unseal};
pub use store::{MemoryStore, OffsetStore, PartitionOffsets};
pub use tracker::{Effect, PartitionTracker, Release, ReplayRequest};
