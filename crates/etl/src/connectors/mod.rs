//! The built-in sources and sinks, each registered in the
//! [`Registry`](crate::Registry) through the same methods as a user's
//! components: the loader, `etl validate` and the builder know none of
//! them by name. Connectors with heavy dependencies are behind their
//! features.

mod blackhole;
mod file;
mod generator;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "postgres")]
mod postgres;
mod stdout;

use etl_sink::{Encoder, NdjsonEncoder, RawLinesEncoder};

use crate::config::Encoding;
use crate::registry::{ComponentContext, Registry};

/// `registry` with every built-in source and sink of this build.
pub(crate) fn register(registry: Registry) -> Registry {
    let registry = file::register(registry);
    let registry = generator::register(registry);
    let registry = stdout::register(registry);
    let registry = blackhole::register(registry);
    #[cfg(feature = "kafka")]
    let registry = kafka::register(registry);
    #[cfg(feature = "postgres")]
    let registry = postgres::register(registry);
    registry
}

/// The encoder of a byte-oriented sink: NDJSON (checking each value
/// unless every value is known to be JSON) or raw lines.
fn encoder(encoding: Encoding, context: &ComponentContext<'_>) -> Box<dyn Encoder> {
    match encoding {
        Encoding::Ndjson if context.values_are_json() => Box::new(NdjsonEncoder::trusted()),
        Encoding::Ndjson => Box::new(NdjsonEncoder::new()),
        Encoding::Lines => Box::new(RawLinesEncoder::new()),
    }
}
