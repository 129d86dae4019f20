//! Connectors with heavy dependencies, each behind its own feature.

#[cfg(feature = "kafka")]
pub(crate) mod kafka;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "postgres")]
pub(crate) use postgres::open_postgres;

use crate::config::{Config, SinkKind, SourceConfig};

/// Check the connector tables of `config` (`type = "kafka"`,
/// `type = "postgres"`) the way `etl run` reads them, without connecting
/// anywhere. Returns one message per problem, naming the section.
#[must_use]
pub fn check_connectors(config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    let mut report = |e: crate::PipelineError| problems.push(e.to_string());
    if let SourceConfig::Kafka(table) = &config.source {
        #[cfg(feature = "kafka")]
        if let Err(e) = kafka::source_config(table) {
            report(e);
        }
        #[cfg(not(feature = "kafka"))]
        {
            let _ = table;
            report(crate::PipelineError::Invalid(
                "[source]: this build of etl has no Kafka connector".to_owned(),
            ));
        }
    }
    let sinks = config
        .sinks
        .iter()
        .map(|s| (s.name.as_str(), &s.kind))
        .chain(config.dead_letter.iter().map(|k| ("dead_letter", k)));
    for (name, kind) in sinks {
        match kind {
            #[cfg(feature = "kafka")]
            SinkKind::Kafka(table) => {
                if let Err(e) = kafka::sink_config(table, name) {
                    report(e);
                }
            }
            #[cfg(feature = "postgres")]
            SinkKind::Postgres(table) => {
                if let Err(e) = postgres::postgres_config(table, name) {
                    report(e);
                }
            }
            #[cfg(not(all(feature = "kafka", feature = "postgres")))]
            SinkKind::Kafka(_) | SinkKind::Postgres(_) => report(crate::PipelineError::Invalid(
                format!("sink {name:?}: this build of etl has no such connector"),
            )),
            _ => {}
        }
    }
    problems
}
