//! `[source] type = "kafka"` and `[[sinks]] type = "kafka"`: the
//! consumer-group source and the producer sink of `etl-kafka`, opened from
//! their TOML tables.
//!
//! The source's offsets live in its consumer group (`[checkpoint] store`
//! is `source` or left out; another store is refused, as it would stay
//! empty): the group is the checkpointer's offset store,
//! and the checkpointer's handle drains and commits partitions the group
//! revokes, inside the rebalance callback. So the source is created by a
//! factory, once the checkpointer runs. The revoke deadline must leave the
//! commit time within the group's session timeout.
//!
//! Both register in the [`Registry`] like any component. Configuration
//! problems are found when the configuration is loaded ([`check_source`],
//! [`check_sink`]: `etl validate` and `etl run` check the same, each
//! problem at its line) and again when the clients are created
//! ([`PipelineError::Invalid`] naming the section and the key). A Kafka
//! client's error of the configuration (refused credentials, a failed
//! handshake) is [`ErrorKind::Config`]. Nothing connects before the pipeline runs. The tables are
//! [`ConnectorTable`]s, and no message holds the value of a secret
//! property.

use etl_kafka::{KafkaError, KafkaSink, KafkaSinkConfig, KafkaSource, KafkaSourceConfig};
use etl_record::SourceId;
use secrecy::ExposeSecret;
use serde::Deserialize;

use crate::PipelineError;
use crate::config::{CheckpointOptions, ConnectorTable, StoreConfig};
use etl_config::{
    BuiltSink, BuiltSource, CheckReport, ErrorKind, Registry, SinkPlugin, SourcePlugin,
};

/// `registry` with the Kafka source and sink.
pub(super) fn register(registry: Registry) -> Registry {
    registry
        .source_plugin(
            "kafka",
            SourcePlugin::new(|table: ConnectorTable, context| {
                open_source(&table, context.checkpoint()).map_err(Into::into)
            })
            .check(|table, report| {
                report.keeps_offsets();
                let checkpoint = report.checkpoint().clone();
                place(report, check_source(table, &checkpoint));
            }),
        )
        .sink_plugin(
            "kafka",
            SinkPlugin::new(|table: ConnectorTable, context| {
                Ok(BuiltSink::new(open_sink(&table, context.name())?))
            })
            .check(|table, report| place(report, check_sink(table))),
        )
        .error_kind(|e| {
            e.downcast_ref::<KafkaError>()
                .filter(|e| e.is_configuration())
                .map(|_| ErrorKind::Config)
        })
}

/// Report `problems` each at its key: `revoke_deadline` in
/// `[checkpoint]`, the others in the component's table.
fn place(report: &mut CheckReport<'_>, problems: Vec<Problem>) {
    for p in problems {
        if p.key.as_deref() == Some("revoke_deadline") {
            report.checkpoint_problem("revoke_deadline", p.message);
        } else {
            let path = problem_key(p.key.as_deref(), &p.message);
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            report.problem_at(&path, p.message);
        }
    }
}

/// The key path a problem names: `properties."name"` (the form the
/// Kafka connector uses), or the first name in backquotes (the form of a
/// deserialization error).
fn problem_key(key: Option<&str>, message: &str) -> Vec<String> {
    let property = message.find("properties.\"").and_then(|at| {
        message[at..]
            .split_once("\":")
            .map(|(k, _)| &message[at..at + k.len() + 1])
    });
    let quoted = message
        .split_once('`')
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(k, _)| k)
        .filter(|k| !k.is_empty());
    let key = key.or(property).or(quoted);
    match key {
        Some(k) => match k.strip_prefix("properties.\"") {
            Some(name) => vec![
                "properties".to_owned(),
                name.trim_end_matches('"').to_owned(),
            ],
            None => vec![k.to_owned()],
        },
        None => Vec::new(),
    }
}

/// One problem of a Kafka table, for the configuration loader to place.
#[derive(Debug)]
pub(crate) struct Problem {
    /// The key it concerns, as the connector names it (`group_id`,
    /// `properties."sasl.password"`, `revoke_deadline` of `[checkpoint]`),
    /// when known.
    pub(crate) key: Option<String>,
    /// What is wrong (no secret value in it).
    pub(crate) message: String,
}

impl Problem {
    fn of(e: &KafkaError) -> Self {
        match e {
            KafkaError::Config { key, message } => Problem {
                key: Some(key.clone()),
                message: format!("kafka: {key}: {message}"),
            },
            other => Problem {
                key: None,
                message: other.to_string(),
            },
        }
    }

    fn message(message: String) -> Self {
        Problem {
            key: None,
            message: format!("kafka: {message}"),
        }
    }
}

/// Every problem of a `[source] type = "kafka"` table that `etl run`
/// would meet before connecting: the table's keys and types, the
/// connector's settings, librdkafka's checks of every property and of the
/// whole client configuration (created without a broker), the topic list,
/// and the revoke deadline against the session timeout.
pub(crate) fn check_source(table: &ConnectorTable, checkpoint: &CheckpointOptions) -> Vec<Problem> {
    let (_, config) = match read_source(table) {
        Ok(read) => read,
        Err(message) => return vec![Problem::message(message)],
    };
    let mut problems: Vec<Problem> = match config.validate() {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(Problem::of).collect(),
    };
    if let Err(e) = etl_kafka::PartitionMap::new(config.topics.clone()) {
        problems.push(Problem {
            key: Some("topics".to_owned()),
            message: e.to_string(),
        });
    }
    if let Some(message) = revoke_deadline_problem(&config, checkpoint) {
        problems.push(Problem {
            key: Some("revoke_deadline".to_owned()),
            message,
        });
    }
    if let Some(message) = store_problem(&config, checkpoint) {
        problems.push(Problem {
            key: Some("store".to_owned()),
            message,
        });
    }
    problems
}

/// A `[checkpoint] store` other than the group, set explicitly: it would
/// be ignored (the group keeps the offsets), and `etl offsets` would read
/// the empty store and show no offsets while the group holds them. The
/// default store (`store` left out) is not refused: it is never opened.
fn store_problem(config: &KafkaSourceConfig, checkpoint: &CheckpointOptions) -> Option<String> {
    let store = &checkpoint.store;
    if matches!(store, StoreConfig::Source) || *store == CheckpointOptions::default().store {
        return None;
    }
    let kind = match store {
        StoreConfig::File { .. } => "file",
        StoreConfig::Memory => "memory",
        StoreConfig::Source => "source",
    };
    Some(format!(
        "kafka: [checkpoint] store = {{ type = \"{kind}\" }} cannot hold a Kafka source's offsets: \
         they live in the consumer group `{}` (the checkpointer commits to it), so this store \
         would stay empty and `etl offsets` would show nothing; write \
         store = {{ type = \"source\" }} (or leave store out) and read the group's offsets \
         with the broker's tools (kafka-consumer-groups --describe --group {})",
        config.group_id, config.group_id
    ))
}

/// Every problem of a `[[sinks]] type = "kafka"` table that `etl run`
/// would meet before connecting.
pub(crate) fn check_sink(table: &ConnectorTable) -> Vec<Problem> {
    let config =
        match KafkaSinkConfig::deserialize(toml::Value::Table(table.expose_secret().clone())) {
            Ok(config) => config,
            Err(e) => return vec![Problem::message(one_line(&e))],
        };
    match config.validate() {
        Ok(()) => Vec::new(),
        Err(errors) => errors.iter().map(Problem::of).collect(),
    }
}

/// A deserialization error on one line (`toml` puts the key it was in on
/// a line of its own).
fn one_line(e: &toml::de::Error) -> String {
    e.to_string().trim_end().replace('\n', " ")
}

fn revoke_deadline_problem(
    config: &KafkaSourceConfig,
    checkpoint: &CheckpointOptions,
) -> Option<String> {
    let max = config.max_revoke_deadline();
    (checkpoint.revoke_deadline > max).then(|| {
        format!(
            "[checkpoint] revoke_deadline = {} must stay below the Kafka source's \
             session_timeout = {} (at most two thirds of it, {}): a revocation drains \
             and commits before the group's session times out; lower revoke_deadline or \
             raise session_timeout",
            humantime::format_duration(checkpoint.revoke_deadline),
            humantime::format_duration(config.session_timeout),
            humantime::format_duration(max),
        )
    })
}

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
    table: &ConnectorTable,
) -> Result<(SourceId, KafkaSourceConfig), PipelineError> {
    read_source(table).map_err(|m| PipelineError::Invalid(format!("[source] (kafka): {m}")))
}

fn read_source(table: &ConnectorTable) -> Result<(SourceId, KafkaSourceConfig), String> {
    let mut table = table.expose_secret().clone();
    let name = match table.remove("name") {
        None => DEFAULT_NAME.to_owned(),
        Some(toml::Value::String(s)) if !s.is_empty() && !s.contains('/') => s,
        Some(other) => {
            return Err(format!(
                "name must be a non-empty string without '/', not {other}"
            ));
        }
    };
    let config =
        KafkaSourceConfig::deserialize(toml::Value::Table(table)).map_err(|e| one_line(&e))?;
    Ok((SourceId::new(name), config))
}

/// The Kafka source, keeping its offsets in its consumer group (the
/// pipeline's offset store). The consumer is created now (no connection
/// yet); it subscribes once the checkpointer runs, with the
/// checkpointer's handle as its revoke handler.
///
/// # Errors
///
/// [`PipelineError::Invalid`] for a bad table, or a
/// `[checkpoint] revoke_deadline` above two thirds of
/// `session_timeout` (a revocation must drain and commit before the
/// group gives up on this member); [`PipelineError::Connector`] when
/// librdkafka refuses the settings.
pub(crate) fn open_source(
    table: &ConnectorTable,
    checkpoint: &CheckpointOptions,
) -> Result<BuiltSource, PipelineError> {
    let (name, config) = source_config(table)?;
    if let Some(message) = revoke_deadline_problem(&config, checkpoint) {
        return Err(PipelineError::Invalid(message));
    }
    // Partition ids an exactly-once sink stored by the mapping by topic
    // index of earlier versions may name another partition now.
    let partitions = etl_kafka::PartitionMap::new(config.topics.clone())
        .map_err(|e| PipelineError::Invalid(format!("[source] {e}")))?;
    let properties = config.properties.clone();
    let mut source =
        KafkaSource::new(name, config).map_err(|e| connector(e, &properties, "[source]"))?;
    let store = source.offset_store();
    Ok(BuiltSource::with_handle(move |handle| {
        source
            .start(handle.clone())
            .map_err(|e| connector(e, &properties, "[source]"))?;
        Ok(Box::new(source))
    })
    .offset_store(store)
    .check_stored_progress(move |progress| {
        partitions
            .check_stored(progress.iter().map(|(p, _)| p))
            .map_err(Into::into)
    })
    // The members of one group write one progress (the group keeps
    // their partitions apart).
    .shares_progress())
}

/// Open the producer sink a `type = "kafka"` table describes (no
/// connection yet: a broker that is down shows up as retryable write
/// errors).
///
/// # Errors
///
/// [`PipelineError::Invalid`] naming the sink and the key;
/// [`PipelineError::Connector`] when librdkafka refuses the settings.
pub(crate) fn open_sink(table: &ConnectorTable, name: &str) -> Result<KafkaSink, PipelineError> {
    let config = sink_config(table, name)?;
    let properties = config.properties.clone();
    let sink = KafkaSink::new(config)
        .map_err(|e| connector(e, &properties, &format!("sink {name:?} (kafka):")))?;
    Ok(sink)
}

/// Read a `[[sinks]] type = "kafka"` table, without connecting.
///
/// # Errors
///
/// [`PipelineError::Invalid`] naming the sink and the key.
pub(crate) fn sink_config(
    table: &ConnectorTable,
    name: &str,
) -> Result<KafkaSinkConfig, PipelineError> {
    KafkaSinkConfig::deserialize(toml::Value::Table(table.expose_secret().clone())).map_err(|e| {
        PipelineError::Invalid(format!(
            "sink {name:?} (kafka): {}",
            e.to_string().trim_end()
        ))
    })
}

/// A connector's error: a refused setting or a client librdkafka refused
/// to create is a configuration problem (exit 78), with any secret
/// property's value taken out of the message.
fn connector(
    e: KafkaError,
    properties: &etl_kafka::KafkaProperties,
    section: &str,
) -> PipelineError {
    match e {
        e if e.is_configuration() => {
            PipelineError::Invalid(properties.redact(&format!("{section} {e}")))
        }
        other => PipelineError::Connector(Box::new(other)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    fn table(text: &str) -> ConnectorTable {
        ConnectorTable::new(text.parse().unwrap())
    }

    const SOURCE: &str = r#"
        brokers = "127.0.0.1:9"
        group_id = "g"
        topics = ["orders"]
        session_timeout = "6s"
        heartbeat_interval = "1s"
    "#;

    fn checkpoint(revoke_deadline: Duration) -> CheckpointOptions {
        CheckpointOptions {
            revoke_deadline,
            ..CheckpointOptions::default()
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
        let e = open_source(
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
        let e = open_source(&table(SOURCE), &checkpoint(Duration::from_secs(5)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("revoke_deadline = 5s") && e.contains("session_timeout = 6s"),
            "{e}"
        );
        open_source(&table(SOURCE), &checkpoint(Duration::from_secs(4))).unwrap();
        // The defaults fit each other.
        let defaults = table("brokers = \"b:1\"\ngroup_id = \"g\"\ntopics = [\"t\"]");
        open_source(&defaults, &CheckpointOptions::default()).unwrap();
    }

    #[test]
    fn a_store_other_than_the_group_is_refused_for_a_kafka_source() {
        let with_store = |store: StoreConfig| CheckpointOptions {
            store,
            ..checkpoint(Duration::from_secs(1))
        };
        let file = check_source(
            &table(SOURCE),
            &with_store(StoreConfig::File {
                path: "state".into(),
            }),
        );
        assert_eq!(file.len(), 1, "{file:?}");
        assert_eq!(file[0].key.as_deref(), Some("store"));
        assert!(
            file[0].message.contains("consumer group `g`")
                && file[0].message.contains("type = \"source\""),
            "{}",
            file[0].message
        );
        assert_eq!(
            check_source(&table(SOURCE), &with_store(StoreConfig::Memory)).len(),
            1
        );
        assert!(check_source(&table(SOURCE), &with_store(StoreConfig::Source)).is_empty());
        // Left out: the default, never opened.
        assert!(check_source(&table(SOURCE), &checkpoint(Duration::from_secs(1))).is_empty());
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
