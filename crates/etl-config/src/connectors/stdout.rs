//! `[[sinks]] type = "stdout"`: standard output.

use etl_sink::{StdoutSink, StdoutSinkConfig};

use super::encoder;
use crate::config::StdoutSinkOptions;
use crate::registry::{BuiltSink, Registry, SinkPlugin};

pub(super) fn register(registry: Registry) -> Registry {
    registry.sink_plugin(
        "stdout",
        SinkPlugin::new(|s: StdoutSinkOptions, context| {
            // Refused when no record written there could be read: standard
            // output closed, read-only, or the null device (exit 74).
            let sink = StdoutSink::open(StdoutSinkConfig {
                allow_null_device: s.allow_null_device,
            })?;
            Ok(BuiltSink::new(sink).encoder(encoder(s.encoding, context)))
        }),
    )
}
