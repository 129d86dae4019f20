//! The transform engine on raw JSON: each record's value is JSON text, and
//! the engine decides from the text itself whenever it can.
//!
//! * [`JsonStage`] runs the built-in steps ([`JsonOp`]: filter on a field,
//!   add, rename, drop) in one pass. Steps on top-level fields run on the
//!   text without a document tree (the fast path); anything else parses,
//!   changes the tree, and writes it back byte-faithfully: every value no
//!   step changed keeps its original text, and keys keep their order.
//! * [`ops`] holds what the steps and the fast paths share: the
//!   comparison [`CompareOp`], the steps, and fields by dotted path.
//! * With the `remap` feature, `Remap` and `VrlFilter` run programs
//!   in the Vector Remap Language (`VrlProgram`); a program within the
//!   fast path's subset runs on the text too, and anything else on VRL's
//!   runtime. This is the only crate that depends on `vrl`.
//! * [`Conditions`] judges several conditions (a router's, one per
//!   sink) on one reading of each record, or has the fused run that
//!   wrote the record judge them and hand the [`Verdicts`] on.
//! * [`Fuser`] takes stages in chain order and makes each run of filters,
//!   conditions and a `remap` step with a fast form one `FusedRun`
//!   stage that reads each record once. A fused run is an ordinary
//!   [`Transform`](etl_transform::Transform): the chain that runs it
//!   knows nothing of the engine.
//!
//! Invariant: the fast path never decides what it is not sure of. A
//! record the fast path cannot read with certainty (invalid or unusual
//! JSON, numbers past `f64`, escapes it does not handle, a program
//! outside its subset) falls back to the general path, which decides
//! exactly as if there were no fast path; the property tests and the fuzz
//! targets hold the two to the same results.
//!
//! # Example
//!
//! Keep orders of 10 or more, mark them, and drop a field; the rest of
//! each record is written as it came:
//!
//! ```
//! use etl_json::{JsonOp, JsonStage, ops::CompareOp};
//! use etl_record::{Offset, PartitionId, Position, Record, SourceId};
//! use etl_transform::{Outcome, Transform};
//!
//! let mut stage = JsonStage::new(
//!     "orders",
//!     vec![
//!         JsonOp::Filter {
//!             path: JsonOp::path("order.qty"),
//!             op: CompareOp::Ge,
//!             value: 10.into(),
//!         },
//!         JsonOp::Add { path: JsonOp::path("big"), value: true.into() },
//!         JsonOp::Drop { path: JsonOp::path("debug") },
//!     ],
//! );
//! let record = |value: &str| {
//!     let position = Position::new(SourceId::new("s"), PartitionId(0), Offset(0));
//!     Record::new(position, value.as_bytes().to_vec())
//! };
//!
//! let Outcome::Keep(kept) = stage.apply(record(r#"{"order":{"qty":12, "price":1.50},"debug":1}"#))
//! else {
//!     panic!("an order of 12 is kept");
//! };
//! assert_eq!(&kept.value[..], br#"{"order":{"qty":12, "price":1.50},"big":true}"#);
//! assert!(matches!(stage.apply(record(r#"{"order":{"qty":3}}"#)), Outcome::Filtered));
//! assert!(matches!(stage.apply(record("not json")), Outcome::Reject(..)));
//! ```

// `deny`, not `forbid`: `block`'s SSE2 module allows it, for its SIMD
// loads.
#![deny(unsafe_code)]

#[cfg(any(
    test,
    all(
        any(target_arch = "x86", target_arch = "x86_64"),
        target_feature = "sse2"
    )
))]
mod block;
mod check;
mod conditions;
mod faithful;
mod fused;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod json;
mod json_fast;
#[cfg(feature = "remap")]
mod number;
pub mod ops;
#[cfg(feature = "remap")]
mod remap;
#[cfg(feature = "remap")]
mod remap_fast;
mod scan;

pub use conditions::{Condition, Conditions, Judging, Verdict, Verdicts};
#[cfg(feature = "remap")]
pub use fused::FusedRun;
pub use fused::Fuser;
pub use json::JsonStage;
pub use ops::{CompareOp, JsonOp};
#[cfg(feature = "remap")]
pub use remap::{Remap, VrlError, VrlFilter, VrlProgram};
