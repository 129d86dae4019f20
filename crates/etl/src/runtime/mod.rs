//! The pipeline runtime: one source driver, the transforms, fan-out to the
//! sinks, one checkpointer; graceful shutdown; a summary at the end.

mod build;
mod error;
mod fanout;
#[cfg(test)]
mod halt_tests;
mod hub;
mod ordered;
#[cfg(test)]
mod ordered_tests;
mod pipeline;
mod progress_store;
mod route;
#[cfg(test)]
mod route_fast_tests;
#[cfg(test)]
mod route_tests;
#[cfg(all(test, feature = "remap"))]
mod route_verdict_tests;

pub use build::pipeline_from_config;
pub use error::PipelineError;
pub use hub::{MetricsHub, PipelineSnapshot};
pub use pipeline::{Pipeline, PipelineBuilder, SourceFactory, Summary};
pub use route::Route;
