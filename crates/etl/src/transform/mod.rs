//! Transforms: what happens to each record between source and sinks.
//!
//! The [`Transform`] trait, its outcomes, the closures and the chain are
//! `etl-transform`'s; the JSON steps and the remap language are
//! `etl-json`'s. [`from_config`] builds a chain from a configuration's
//! `[[transforms]]`, the one place that knows both the configuration and
//! the engine.

mod from_config;

pub use etl_json::{JsonOp, JsonStage};
#[cfg(feature = "remap")]
pub use etl_json::{Remap, VrlError, VrlFilter, VrlProgram};
pub use etl_transform::{
    ChainOutput, FilterFn, FlatMapFn, MapFn, Outcome, Refused, Transform, TransformChain, filter,
    filter_mut, flat_map, flat_map_mut, map, map_mut,
};
pub use from_config::{ChainError, chain_from_config, try_chain_from_config};
pub(crate) use from_config::{condition_form, steps_write_json, try_chain_labelled};
