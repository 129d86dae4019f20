//! Settings of the Kafka source and sink, as they appear in a pipeline's
//! configuration file.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use serde::Deserialize;

use crate::KafkaError;

/// librdkafka settings the connector owns: setting them through
/// `properties` would break the delivery contract.
const OWNED_SOURCE_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
    "auto.offset.reset",
];
const OWNED_SINK_PROPERTIES: &[&str] = &["bootstrap.servers", "acks", "enable.idempotence"];

/// librdkafka consumer settings whose defaults the connector changes;
/// `properties` may set them otherwise.
///
/// `fetch.queue.backoff.ms`: once a partition's local queue passes
/// `queued.min.messages` (100,000) or `queued.max.messages.kbytes`,
/// librdkafka waits this long before it considers fetching that partition
/// again (default 1000 ms). A pipeline catching up drains such a queue in
/// a fraction of a second and then waits out the rest: the Kafka bench
/// read 0.2-0.3M rec/s with the default and 1.0-1.4M with 50 ms (see
/// `docs/benchmarks.md`). The decision is local (no request while backing
/// off), so checking more often costs next to nothing.
const SOURCE_DEFAULTS: &[(&str, &str)] = &[("fetch.queue.backoff.ms", "50")];

/// The Kafka source: one member of a consumer group.
///
/// Offsets are committed to the group, and only by the checkpointer:
/// auto-commit is always off.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KafkaSourceConfig {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The consumer group; every process of one pipeline uses the same.
    pub group_id: String,
    /// Topics to read. Their order defines the partition mapping (see
    /// [`PartitionMap`](crate::PartitionMap)).
    pub topics: Vec<String>,
    /// `session.timeout.ms`. The checkpointer's revoke deadline must stay
    /// below it (see [`KafkaSourceConfig::max_revoke_deadline`]).
    #[serde(default = "default_session_timeout_ms")]
    pub session_timeout_ms: u32,
    /// `heartbeat.interval.ms`.
    #[serde(default = "default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u32,
    /// `partition.assignment.strategy`: `cooperative-sticky` (default;
    /// rebalances move only the partitions that change owner) or an eager
    /// strategy such as `range` or `roundrobin`.
    #[serde(default = "default_assignment_strategy")]
    pub assignment_strategy: String,
    /// `auto.offset.reset`: where a partition without a committed offset
    /// starts, `earliest` (default) or `latest`.
    #[serde(default = "default_auto_offset_reset")]
    pub auto_offset_reset: String,
    /// How long a commit to the group may wait for the group
    /// coordinator before it fails (the previous commit then stands).
    /// Bounds revocations and graceful stops while the broker is
    /// unreachable.
    #[serde(default = "default_commit_timeout_ms")]
    pub commit_timeout_ms: u32,
    /// Most records in one poll batch (one partition each).
    #[serde(default = "default_max_batch_records")]
    pub max_batch_records: usize,
    /// Records fetched but not yet handed to the pipeline before the
    /// fetching partitions are paused (if the pipeline has not taken half
    /// of them within 100 ms).
    #[serde(default = "default_max_buffered_records")]
    pub max_buffered_records: usize,
    /// Further librdkafka consumer settings, passed through unchanged.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

impl KafkaSourceConfig {
    /// A configuration with the defaults for everything but the brokers,
    /// the group and the topics.
    #[must_use]
    pub fn new(
        brokers: impl Into<String>,
        group_id: impl Into<String>,
        topics: Vec<String>,
    ) -> Self {
        KafkaSourceConfig {
            brokers: brokers.into(),
            group_id: group_id.into(),
            topics,
            session_timeout_ms: default_session_timeout_ms(),
            heartbeat_interval_ms: default_heartbeat_interval_ms(),
            assignment_strategy: default_assignment_strategy(),
            auto_offset_reset: default_auto_offset_reset(),
            commit_timeout_ms: default_commit_timeout_ms(),
            max_batch_records: default_max_batch_records(),
            max_buffered_records: default_max_buffered_records(),
            properties: BTreeMap::new(),
        }
    }

    /// The longest revoke deadline this group tolerates: two thirds of
    /// the session timeout, leaving room for the commit itself.
    #[must_use]
    pub fn max_revoke_deadline(&self) -> Duration {
        Duration::from_millis(u64::from(self.session_timeout_ms) * 2 / 3)
    }

    /// Check the values and build the librdkafka configuration.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, KafkaError> {
        if self.brokers.is_empty() {
            return Err(KafkaError::config(
                "brokers",
                "must name at least one broker",
            ));
        }
        if self.group_id.is_empty() {
            return Err(KafkaError::config("group_id", "must not be empty"));
        }
        if self.max_batch_records == 0 {
            return Err(KafkaError::config(
                "max_batch_records",
                "must be at least 1",
            ));
        }
        if self.max_buffered_records == 0 {
            return Err(KafkaError::config(
                "max_buffered_records",
                "must be at least 1",
            ));
        }
        if self.commit_timeout_ms == 0 {
            return Err(KafkaError::config(
                "commit_timeout_ms",
                "must be at least 1",
            ));
        }
        if self.heartbeat_interval_ms >= self.session_timeout_ms {
            return Err(KafkaError::config(
                "heartbeat_interval_ms",
                "must be below session_timeout_ms",
            ));
        }
        reject_owned(&self.properties, OWNED_SOURCE_PROPERTIES)?;
        let mut config = ClientConfig::new();
        for (k, v) in SOURCE_DEFAULTS {
            config.set(*k, *v);
        }
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("session.timeout.ms", self.session_timeout_ms.to_string())
            .set(
                "heartbeat.interval.ms",
                self.heartbeat_interval_ms.to_string(),
            )
            .set("partition.assignment.strategy", &self.assignment_strategy)
            .set("auto.offset.reset", &self.auto_offset_reset);
        Ok(config)
    }
}

/// The Kafka sink: a producer writing every record to one topic.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KafkaSinkConfig {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The topic to write to.
    pub topic: String,
    /// `message.timeout.ms`: how long librdkafka retries one record
    /// before its delivery report says it failed.
    #[serde(default = "default_message_timeout_ms")]
    pub message_timeout_ms: u32,
    /// Header that carries each record's idempotency key
    /// (`source/partition/offset`), so consumers can deduplicate replays.
    #[serde(default = "default_idempotency_header")]
    pub idempotency_header: String,
    /// Further librdkafka producer settings, passed through unchanged.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

impl KafkaSinkConfig {
    /// A configuration with the defaults for everything but the brokers
    /// and the topic.
    #[must_use]
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSinkConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            message_timeout_ms: default_message_timeout_ms(),
            idempotency_header: default_idempotency_header(),
            properties: BTreeMap::new(),
        }
    }

    /// Check the values and build the librdkafka configuration.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, KafkaError> {
        if self.brokers.is_empty() {
            return Err(KafkaError::config(
                "brokers",
                "must name at least one broker",
            ));
        }
        if self.topic.is_empty() {
            return Err(KafkaError::config("topic", "must not be empty"));
        }
        reject_owned(&self.properties, OWNED_SINK_PROPERTIES)?;
        let mut config = ClientConfig::new();
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", &self.brokers)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", self.message_timeout_ms.to_string());
        Ok(config)
    }
}

fn reject_owned(properties: &BTreeMap<String, String>, owned: &[&str]) -> Result<(), KafkaError> {
    match properties.keys().find(|k| owned.contains(&k.as_str())) {
        Some(key) => Err(KafkaError::config(
            format!("properties.\"{key}\""),
            "is set by the connector itself; use the dedicated setting or leave it out",
        )),
        None => Ok(()),
    }
}

/// Kafka's own default since 3.0: long enough for the default revoke
/// deadline of a pipeline (10 s) to stay within two thirds of it.
fn default_session_timeout_ms() -> u32 {
    45_000
}
fn default_heartbeat_interval_ms() -> u32 {
    3_000
}
fn default_assignment_strategy() -> String {
    "cooperative-sticky".to_owned()
}
fn default_auto_offset_reset() -> String {
    "earliest".to_owned()
}
fn default_commit_timeout_ms() -> u32 {
    10_000
}
fn default_max_batch_records() -> usize {
    500
}
fn default_max_buffered_records() -> usize {
    10_000
}
fn default_message_timeout_ms() -> u32 {
    30_000
}
fn default_idempotency_header() -> String {
    "etl-idempotency-key".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_forces_manual_commits() {
        let c = KafkaSourceConfig::new("127.0.0.1:9092", "g", vec!["t".into()]);
        let rd = c.client_config().expect("valid");
        assert_eq!(rd.get("enable.auto.commit"), Some("false"));
        assert_eq!(
            rd.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(c.max_revoke_deadline(), Duration::from_secs(30));
    }

    #[test]
    fn source_defaults_give_way_to_properties() {
        let mut c = KafkaSourceConfig::new("b:1", "g", vec!["t".into()]);
        let rd = c.client_config().expect("valid");
        assert_eq!(rd.get("fetch.queue.backoff.ms"), Some("50"));
        c.properties
            .insert("fetch.queue.backoff.ms".into(), "1000".into());
        let rd = c.client_config().expect("valid");
        assert_eq!(rd.get("fetch.queue.backoff.ms"), Some("1000"));
    }

    #[test]
    fn owned_properties_are_rejected() {
        let mut c = KafkaSourceConfig::new("b:1", "g", vec!["t".into()]);
        c.properties
            .insert("enable.auto.commit".into(), "true".into());
        let e = c.client_config().expect_err("owned");
        assert!(e.to_string().contains("enable.auto.commit"), "{e}");

        let mut s = KafkaSinkConfig::new("b:1", "t");
        s.properties.insert("acks".into(), "1".into());
        assert!(s.client_config().is_err());
        s.properties.clear();
        s.properties.insert("linger.ms".into(), "5".into());
        let rd = s.client_config().expect("valid");
        assert_eq!(rd.get("acks"), Some("all"));
        assert_eq!(rd.get("enable.idempotence"), Some("true"));
        assert_eq!(rd.get("linger.ms"), Some("5"));
    }

    #[test]
    fn bad_values_name_the_setting() {
        let mut c = KafkaSourceConfig::new("b:1", "", vec!["t".into()]);
        assert!(
            c.client_config()
                .expect_err("empty group")
                .to_string()
                .contains("group_id")
        );
        c.group_id = "g".into();
        c.heartbeat_interval_ms = c.session_timeout_ms;
        assert!(
            c.client_config()
                .expect_err("heartbeat")
                .to_string()
                .contains("heartbeat_interval_ms")
        );
    }
}
