//! `[[sinks]] type = "blackhole"`: every record discarded, unchecked.

use etl_sink::BlackholeSink;

use crate::config::BlackholeSinkOptions;
use crate::registry::{BuiltSink, Registry, SinkPlugin};

pub(super) fn register(registry: Registry) -> Registry {
    registry.sink_plugin(
        "blackhole",
        SinkPlugin::new(|_: BlackholeSinkOptions, _context| {
            // Nothing is written, so there is no format to check values
            // against, and its encoder copies nothing either.
            Ok(BuiltSink::new(BlackholeSink::new()).encoder(BlackholeSink::encoder()))
        }),
    )
}
