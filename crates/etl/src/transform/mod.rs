//! Transforms: what happens to each record between source and sinks.
//!
//! Every transform returns an explicit [`Outcome`] for every record, so a
//! record leaves the pipeline only on purpose: kept, filtered out
//! (counted), expanded into several, or rejected to the dead-letter path
//! with a reason.

mod chain;
mod check;
mod closures;
mod faithful;
#[cfg(feature = "remap")]
mod fused;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod json;
mod json_fast;
#[cfg(feature = "remap")]
mod remap;
#[cfg(feature = "remap")]
mod remap_fast;
mod scan;

pub use chain::{ChainOutput, TransformChain};
pub use closures::{
    FilterFn, FlatMapFn, MapFn, Refused, filter, filter_mut, flat_map, flat_map_mut, map, map_mut,
};
pub use json::{JsonOp, JsonStage};
#[cfg(feature = "remap")]
pub use remap::{Remap, VrlError, VrlFilter, VrlProgram};

use etl_record::Record;

/// What a transform did with one record.
#[derive(Debug)]
pub enum Outcome {
    /// Pass the (possibly changed) record on.
    Keep(Record),
    /// Drop it on purpose; it counts as filtered, and its offset may be
    /// committed.
    Filtered,
    /// Replace it with these records (an empty list counts as filtered).
    Many(Vec<Record>),
    /// Set it (as it came in) aside for the dead-letter path, with the
    /// reason.
    Reject(Record, String),
    /// It (as it came in) can be neither processed nor set aside: its
    /// batch fails and the run halts with the reason; nothing from the
    /// batch on is committed.
    Halt(Record, String),
}

/// One step of the pipeline's per-record processing. Runs one record at a
/// time, in partition order within each batch.
///
/// A transform that can run on several batches at once returns a fresh
/// copy of itself from [`fork`](Transform::fork): the pipeline then runs
/// whole batches on a small pool of workers, each with its own copy, and
/// still hands the results to the sinks in the order the batches came.
/// The default, `None`, keeps every batch on one thread, one after
/// another. Either way a transform runs on a thread of its own inside the
/// pipeline's tokio runtime (it may use `tokio::runtime::Handle::current`),
/// never on one of the runtime's worker threads; on a current-thread
/// runtime with one worker it runs on the pipeline's task.
pub trait Transform: Send {
    /// Name in metrics, logs and dead-letter reasons.
    fn name(&self) -> &str;
    /// Decide what happens to `record`.
    fn apply(&mut self, record: Record) -> Outcome;
    /// An independent copy that behaves exactly like this one on any
    /// record, for another worker; `None` (the default) when the
    /// transform keeps state across records that must not be split.
    fn fork(&self) -> Option<Box<dyn Transform>> {
        None
    }
}

impl std::fmt::Debug for dyn Transform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Transform({})", self.name())
    }
}
