//! Transforms: what happens to each record between source and sinks.
//!
//! Every transform returns an explicit [`Outcome`] for every record, so a
//! record leaves the pipeline only on purpose: kept, filtered out
//! (counted), expanded into several, set aside for the dead-letter path
//! with a reason, or halting the run.
//!
//! * [`Transform`] is the one interface: a name and an `apply` from a
//!   record to its outcome, with [`fork`](Transform::fork) for a
//!   transform that can run on several batches at once.
//! * [`map`], [`filter`] and [`flat_map`] (and their `_mut` forms for
//!   closures that keep state) make a transform from a closure.
//! * [`TransformChain`] runs a batch through its stages in order and says
//!   what became of every record in a [`ChainOutput`]: kept, filtered,
//!   dead letters with the stage's name, or the record the run halted on.
//!
//! The chain knows nothing of where its stages come from: the JSON engine
//! (`etl-json`) and the configuration each give it boxed transforms like
//! any other.
//!
//! # Example
//!
//! Even offsets kept, values upper-cased, a value `bad` refused to the
//! dead-letter path:
//!
//! ```
//! use etl_record::{Offset, PartitionId, Position, Record, SourceId};
//! use etl_transform::{ChainOutput, Refused, TransformChain, filter, map};
//!
//! let mut chain = TransformChain::new();
//! chain.push(Box::new(filter("even", |r: &Record| r.position.offset.0 % 2 == 0)));
//! chain.push(Box::new(map("upper", |mut r: Record| {
//!     if &r.value[..] == b"bad" {
//!         return Err(Refused::new(r, "bad value"));
//!     }
//!     r.value = r.value.to_ascii_uppercase().into();
//!     Ok(r)
//! })));
//!
//! let records = ["a", "b", "bad", "c", "d"].iter().zip(0..).map(|(v, offset)| {
//!     let position = Position::new(SourceId::new("s"), PartitionId(0), Offset(offset));
//!     Record::new(position, v.as_bytes().to_vec())
//! });
//! let mut out = ChainOutput::default();
//! chain.apply(records.collect(), &mut out);
//!
//! let kept: Vec<&[u8]> = out.kept.iter().map(|r| &r.value[..]).collect();
//! assert_eq!(kept, [&b"A"[..], b"D"]);
//! assert_eq!(out.filtered, 2);
//! assert_eq!(out.rejected[0].reason, "transform upper: bad value");
//! ```

#![forbid(unsafe_code)]

mod chain;
mod closures;

pub use chain::{ChainOutput, TransformChain};
pub use closures::{
    FilterFn, FlatMapFn, MapFn, Refused, filter, filter_mut, flat_map, flat_map_mut, map, map_mut,
};

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
    /// Name in metrics, logs and dead-letter reasons. The chain reads it
    /// after [`apply`](Transform::apply) or
    /// [`apply_in_place`](Transform::apply_in_place), for the reason of
    /// the record just applied.
    fn name(&self) -> &str;
    /// Decide what happens to `record`.
    fn apply(&mut self, record: Record) -> Outcome;
    /// [`apply`](Transform::apply) to the record where it lies in its
    /// batch: `None` when it is kept there (changed or not), else what
    /// became of it (the records it holds taken out of `record`; what is
    /// left in `record` is then dropped). The default takes the record
    /// out (leaving a [`Record::default`], which allocates nothing),
    /// applies it and puts a kept one back, so a transform need only
    /// write [`apply`](Transform::apply). A transform that keeps most
    /// records as they are, or changes only their value, overrides it to
    /// spare the batch moving every record out and back (a record is
    /// about 150 bytes). The chain calls either for any record (`apply`
    /// for the records after one that became several, and in the stages
    /// after one that took a record out), so both must decide alike and
    /// count alike.
    fn apply_in_place(&mut self, record: &mut Record) -> Option<Outcome> {
        match self.apply(std::mem::take(record)) {
            Outcome::Keep(kept) => {
                *record = kept;
                None
            }
            other => Some(other),
        }
    }
    /// An independent copy that behaves exactly like this one on any
    /// record, for another worker; `None` (the default) when the
    /// transform keeps state across records that must not be split.
    fn fork(&self) -> Option<Box<dyn Transform>> {
        None
    }
    /// The stage as its own type, for the code that built it and knows
    /// what more it offers (a fused run of JSON stages that also judges
    /// a router's conditions); `None` (the default) for a stage that
    /// offers nothing beyond this trait.
    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }
}

impl std::fmt::Debug for dyn Transform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Transform({})", self.name())
    }
}

/// The chain holds `Box<dyn Transform>`: the trait must stay object-safe.
const _: Option<&dyn Transform> = None;
