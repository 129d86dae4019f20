//! Transforms: what happens to each record between source and sinks.
//!
//! The [`Transform`] trait, its outcomes, the closures and the chain are
//! `etl-transform`'s; the JSON steps and the remap language are the
//! engine's, here. [`from_config`] builds a chain from a configuration's
//! `[[transforms]]`.

mod check;
mod faithful;
mod from_config;
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

pub use etl_transform::{
    ChainOutput, FilterFn, FlatMapFn, MapFn, Outcome, Refused, Transform, TransformChain, filter,
    filter_mut, flat_map, flat_map_mut, map, map_mut,
};
pub use from_config::{chain_from_config, try_chain_from_config};
pub(crate) use fused::Fuser;
pub use json::{JsonOp, JsonStage};
#[cfg(feature = "remap")]
pub use remap::{Remap, VrlError, VrlFilter, VrlProgram};
