//! `[source] type = "kafka"` and `[[sinks]] type = "kafka"`: the
//! consumer-group source and the producer sink of `etl-kafka`, opened from
//! their TOML tables.
//!
//! The source's offsets live in its consumer group, whatever
//! `[checkpoint] store` says: the group is the checkpointer's offset store,
//! and the checkpointer's handle drains and commits partitions the group
//! revokes, inside the rebalance callback. So the source is created by a
//! factory, once the checkpointer runs. The revoke deadline must leave the
//! commit time within the group's session timeout.
//!
//! Configuration problems are [`PipelineError::Invalid`] naming the
//! section and the key; a client librdkafka refuses to create is
//! [`PipelineError::Connector`]. Nothing connects before the pipeline
//! runs.

use std::sync::Arc;

use etl_kafka::{KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use etl_record::SourceId;
use etl_sink::Sink;
use serde::Deserialize;

use crate::config::CheckpointConfig;
use crate::{PipelineBuilder, PipelineError};

/// The source's name when the table has no `name`: part of every record's
/// idempotency key (`kafka/partition/offset`).
const DEFAULT_NAME: &str = "kafka";

/// Read a `[source] type = "kafka"` table: an optional `name` (the
/// records' source id) and the connector's [`KafkaSourceConfig`].
///
/// # Errors
///
/// [`PipelineError::Invalid`] naming the key.
pub(crate) fn source_config(
    table: &toml::Table,
) -> Result<(SourceId, KafkaSourceConfig), PipelineError> {
    let invalid = |m: String| PipelineError::Invalid(format!("[source] (kafka): {m}"));
    let mut table = table.clone();
    let name = match table.remove("name") {
        None => DEFAULT_NAME.to_owned(),
        Some(toml::Value::String(s)) if !s.is_empty() && !s.contains('/') => s,
        Some(other) => {
            return Err(invalid(format!(
                "name must be a non-empty string without '/', not {other}"
            )));
        }
    };
    let config = KafkaSourceConfig::deserialize(toml::Value::Table(table))
        .map_err(|e| invalid(e.to_string().trim_end().to_owned()))?;
    Ok((SourceId::new(name), config))
}

/// Make the Kafka source the pipeline's source and its consumer group the
/// pipeline's offset store. The consumer is created now (no connection
/// yet); it subscribes once the checkpointer runs, with the
/// checkpointer's handle as its revoke handler.
///
/// # Errors
///
/// [`PipelineError::Invalid`] for a bad table, or a
/// `[checkpoint] revoke_deadline` above two thirds of
/// `session_timeout_ms` (a revocation must drain and commit before the
/// group gives up on this member); [`PipelineError::Connector`] when
/// librdkafka refuses the settings.
pub(crate) fn with_source(
    builder: PipelineBuilder,
    table: &toml::Table,
    checkpoint: &CheckpointConfig,
) -> Result<PipelineBuilder, PipelineError> {
    let (name, config) = source_config(table)?;
    let max = config.max_revoke_deadline();
    if checkpoint.revoke_deadline > max {
        return Err(PipelineError::Invalid(format!(
            "[checkpoint] revoke_deadline = {} must stay below the Kafka source's \
             session_timeout_ms = {} (at most two thirds of it, {}): a revocation drains \
             and commits before the group's session times out; lower revoke_deadline or \
             raise session_timeout_ms",
            humantime::format_duration(checkpoint.revoke_deadline),
            config.session_timeout_ms,
            humantime::format_duration(max),
        )));
    }
    let mut source = KafkaSource::new(name, config).map_err(connector)?;
    let store = source.offset_store();
    Ok(builder.offset_store(store).source_factory(move |handle| {
        source.start(handle.clone()).map_err(connector)?;
        Ok(Box::new(source))
    }))
}

/// Open the producer sink a `type = "kafka"` table describes (no
/// connection yet: a broker that is down shows up as retryable write
/// errors).
///
/// # Errors
///
/// [`PipelineError::Invalid`] naming the sink and the key;
/// [`PipelineError::Connector`] when librdkafka refuses the settings.
pub(crate) fn open_sink(table: &toml::Table, name: &str) -> Result<Arc<dyn Sink>, PipelineError> {
    let config = sink_config(table, name)?;
    let sink = KafkaSink::new(config).map_err(|e| match e {
        etl_kafka::KafkaError::Config { .. } => {
            PipelineError::Invalid(format!("sink {name:?} (kafka): {e}"))
        }
        other => connector(other),
    })?;
    Ok(Arc::new(sink))
}

/// Read a `[[sinks]] type = "kafka"` table, without connecting.
///
/// # Errors
///
/// [`PipelineError::Invalid`] naming the sink and the key.
pub(crate) fn sink_config(
    table: &toml::Table,
    name: &str,
) -> Result<KafkaSinkConfig, PipelineError> {
    KafkaSinkConfig::deserialize(toml::Value::Table(table.clone())).map_err(|e| {
        PipelineError::Invalid(format!(
            "sink {name:?} (kafka): {}",
            e.to_string().trim_end()
        ))
    })
}

fn connector(e: etl_kafka::KafkaError) -> PipelineError {
    match e {
        etl_kafka::KafkaError::Config { .. } => PipelineError::Invalid(format!("[source] {e}")),
        other => PipelineError::Connector(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;
    use crate::Pipeline;

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    const SOURCE: &str = r#"
        brokers = "127.0.0.1:9"
        group_id = "g"
        topics = ["orders"]
        session_timeout_ms = 6000
        heartbeat_interval_ms = 1000
    "#;

    fn checkpoint(revoke_deadline: Duration) -> CheckpointConfig {
        CheckpointConfig {
            revoke_deadline,
            ..CheckpointConfig::default()
        }
    }

    #[test]
    fn source_table_takes_a_name_and_the_connector_settings() {
        let (name, config) = source_config(&table(SOURCE)).unwrap();
        assert_eq!(name, SourceId::new("kafka"));
        assert_eq!(config.topics, ["orders"]);
        let (name, _) = source_config(&table(&format!("name = \"orders\"\n{SOURCE}"))).unwrap();
        assert_eq!(name, SourceId::new("orders"));
    }

    #[test]
    fn unknown_keys_and_owned_properties_are_named() {
        let e = source_config(&table(&format!("{SOURCE}\ngroup = \"x\"")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("[source] (kafka)") && e.contains("group"), "{e}");
        let e = with_source(
            Pipeline::builder(),
            &table(&format!(
                "{SOURCE}\n[properties]\n\"enable.auto.commit\" = \"true\""
            )),
            &checkpoint(Duration::from_secs(1)),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("enable.auto.commit"), "{e}");
    }

    #[test]
    fn revoke_deadline_must_stay_below_the_session_timeout() {
        let e = with_source(
            Pipeline::builder(),
            &table(SOURCE),
            &checkpoint(Duration::from_secs(5)),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("revoke_deadline = 5s") && e.contains("session_timeout_ms = 6000"),
            "{e}"
        );
        with_source(
            Pipeline::builder(),
            &table(SOURCE),
            &checkpoint(Duration::from_secs(4)),
        )
        .unwrap();
        // The defaults fit each other.
        let defaults = table("brokers = \"b:1\"\ngroup_id = \"g\"\ntopics = [\"t\"]");
        with_source(Pipeline::builder(), &defaults, &CheckpointConfig::default()).unwrap();
    }

    #[test]
    fn sink_table_is_checked_before_anything_connects() {
        let sink = open_sink(&table("brokers = \"127.0.0.1:9\"\ntopic = \"out\""), "copy");
        assert!(sink.is_ok());
        let e = open_sink(&table("brokers = \"127.0.0.1:9\""), "copy")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("sink \"copy\" (kafka)") && e.contains("topic"),
            "{e}"
        );
        let e = open_sink(
            &table("brokers = \"b:1\"\ntopic = \"t\"\n[properties]\nacks = \"1\""),
            "copy",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("acks"), "{e}");
    }
}
