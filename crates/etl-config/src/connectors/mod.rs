//! The built-in sources and sinks of the configuration language, each
//! registered in the [`Registry`] through the same methods as a user's
//! components: the loader and `etl validate` know none of them by name.

mod blackhole;
mod file;
mod generator;
mod stdout;

use etl_sink::{Encoder, NdjsonEncoder, RawLinesEncoder};

use crate::config::LineFormat;
use crate::registry::{ComponentContext, Registry};

/// `registry` with the built-in sources and sinks.
pub(crate) fn register(registry: Registry) -> Registry {
    let registry = file::register(registry);
    let registry = generator::register(registry);
    let registry = stdout::register(registry);
    blackhole::register(registry)
}

/// The encoder of a byte-oriented sink: NDJSON (checking each value
/// unless every value is known to be JSON) or raw lines.
fn encoder(encoding: LineFormat, context: &ComponentContext<'_>) -> Box<dyn Encoder> {
    match encoding {
        LineFormat::Ndjson if context.values_are_json() => Box::new(NdjsonEncoder::trusted()),
        LineFormat::Ndjson => Box::new(NdjsonEncoder::new()),
        LineFormat::Lines => Box::new(RawLinesEncoder::new()),
    }
}
