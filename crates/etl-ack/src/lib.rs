//! Batch acknowledgement handles, in the manner of Vector's finalizers.
//!
//! A source's poll batch gets one [`AckRef`]; records (or slices of the
//! batch) travelling downstream hold clones of it. When the last clone
//! drops, one [`AckMsg`] reaches the checkpointer with the batch's
//! [`BatchId`], its last offset and the worst [`AckStatus`] any holder
//! reported. A bare `AckRef` resolves *Delivered* on drop: for a record,
//! drop means consumed (written, filtered out or skipped by policy). On
//! the sink path, an [`AckSet`] holds the handles of data not yet durably
//! written and **fails** them if it is dropped without
//! [`AckSet::deliver`]: torn-down work costs a replay, never a loss.
//!
//! Data travels downstream as [`Acked`] values: records of one poll batch
//! (or a slice of it) together with the batch's handle.
//!
//! Handles are opened through an [`Acker`], created together with the
//! checkpointer's [`AckReceiver`] by [`channel`]. The receiver yields
//! [`AckEvent`]s in causal order: a batch's `Opened` event always comes
//! before its `Resolved` event.
//!
//! # Example
//!
//! ```
//! use etl_ack::{AckEvent, AckSet, AckStatus, BatchId, BatchMeta};
//! use etl_record::{Offset, PartitionId};
//!
//! let (acker, mut receiver) = etl_ack::channel();
//! let id = BatchId { partition: PartitionId(0), epoch: 1, seq: 0 };
//! let meta = BatchMeta {
//!     id,
//!     first_offset: Offset(0),
//!     last_offset: Offset(9),
//!     records: 10,
//!     bytes: 640,
//! };
//! let ack = acker.open(meta).expect("the receiver is alive");
//!
//! // The sink path collects handles; consecutive clones of one batch
//! // occupy a single slot.
//! let mut set = AckSet::new();
//! for _ in 0..10 {
//!     set.push(ack.clone());
//! }
//! drop(ack);
//! assert_eq!(set.len(), 1);
//!
//! // ...durable write succeeded:
//! set.deliver();
//!
//! assert!(matches!(receiver.try_next(), Ok(AckEvent::Opened(m)) if m.id == id));
//! match receiver.try_next() {
//!     Ok(AckEvent::Resolved(msg)) => {
//!         assert_eq!(msg.status, AckStatus::Delivered);
//!         assert_eq!(msg.last_offset, Offset(9));
//!     }
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```

mod ack_ref;
mod ack_set;
mod acked;
mod acker;
mod batch;
mod fence;
#[cfg(all(test, etl_loom))]
mod loom_tests;
mod sync;

pub use ack_ref::AckRef;
pub use ack_set::AckSet;
pub use acked::Acked;
pub use acker::{AckEvent, AckReceiver, Acker, ReceiverClosed, channel};
pub use batch::{AckMsg, AckStatus, BatchId, BatchMeta};
/// Channel types of the receiving side, re-exported so callers can wait on
/// an [`AckReceiver`] together with their own channels.
pub use crossbeam_channel;
pub use fence::{WriteFence, WriteGuard};

#[cfg(etl_loom)]
#[doc(hidden)]
pub use ack_ref::loom_support;
