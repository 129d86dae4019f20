//! Settings of the Kafka source and sink, as they appear in a pipeline's
//! configuration file.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, ConsumerContext};
use rdkafka::error::KafkaError as ClientError;
use rdkafka::producer::{BaseProducer, DeliveryResult, ProducerContext};
use rdkafka::types::RDKafkaConfRes;
use rdkafka::{ClientConfig, Statistics};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};

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
    /// Topics to read, by name (a pattern such as `^orders\..*` is
    /// refused). Partition ids depend on each name, not on the order (see
    /// [`PartitionMap`](crate::PartitionMap)).
    pub topics: Vec<String>,
    /// `session.timeout.ms`, written as a duration (`"45s"`). The
    /// checkpointer's revoke deadline must stay below it (see
    /// [`KafkaSourceConfig::max_revoke_deadline`]).
    #[serde(
        default = "default_session_timeout",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub session_timeout: Duration,
    /// `heartbeat.interval.ms`, written as a duration (`"3s"`).
    #[serde(
        default = "default_heartbeat_interval",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub heartbeat_interval: Duration,
    /// `partition.assignment.strategy`: `cooperative-sticky` (default;
    /// rebalances move only the partitions that change owner) or an eager
    /// strategy such as `range` or `roundrobin`.
    #[serde(default = "default_assignment_strategy")]
    pub assignment_strategy: String,
    /// `auto.offset.reset`: where a partition without a committed offset
    /// starts, `earliest` (default, offset 0) or `latest` (its high
    /// watermark when it is assigned; see
    /// [`GroupOffsetStore`](crate::GroupOffsetStore)).
    #[serde(default = "default_auto_offset_reset")]
    pub auto_offset_reset: String,
    /// Where a partition without a committed offset starts, by time: at
    /// its first message with a timestamp at or after this one
    /// (milliseconds since the Unix epoch), found with the broker's
    /// offsets-for-times lookup; at its high watermark when every message
    /// is older. Takes the place of `auto_offset_reset` for such
    /// partitions; a partition with a committed offset resumes there.
    #[serde(default)]
    pub start_timestamp_ms: Option<i64>,
    /// How long a commit to the group may wait for the group
    /// coordinator before it fails (the previous commit then stands).
    /// Bounds revocations and graceful stops while the broker is
    /// unreachable. Written as a duration (`"10s"`).
    #[serde(
        default = "default_commit_timeout",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub commit_timeout: Duration,
    /// Most records in one poll batch (one partition each).
    #[serde(default = "default_max_batch_records")]
    pub max_batch_records: usize,
    /// Records fetched but not yet handed to the pipeline before the
    /// fetching partitions are paused (if the pipeline has not taken half
    /// of them within 100 ms).
    #[serde(default = "default_max_buffered_records")]
    pub max_buffered_records: usize,
    /// Further librdkafka consumer settings, passed through unchanged
    /// (secrets held as secrets: see [`KafkaProperties`]).
    #[serde(default)]
    pub properties: KafkaProperties,
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
            session_timeout: default_session_timeout(),
            heartbeat_interval: default_heartbeat_interval(),
            assignment_strategy: default_assignment_strategy(),
            auto_offset_reset: default_auto_offset_reset(),
            start_timestamp_ms: None,
            commit_timeout: default_commit_timeout(),
            max_batch_records: default_max_batch_records(),
            max_buffered_records: default_max_buffered_records(),
            properties: KafkaProperties::default(),
        }
    }

    /// The longest revoke deadline this group tolerates: two thirds of
    /// the session timeout, leaving room for the commit itself.
    #[must_use]
    pub fn max_revoke_deadline(&self) -> Duration {
        self.session_timeout * 2 / 3
    }

    /// Check the values and build the librdkafka configuration.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, KafkaError> {
        match self.settings_problems().into_iter().next() {
            Some(problem) => Err(problem),
            None => Ok(self.unchecked_client_config()),
        }
    }

    /// Check everything [`KafkaSource::new`](crate::KafkaSource::new)
    /// checks, without connecting anywhere: the settings, every property
    /// against librdkafka's own checks (known name, value of the right
    /// kind), and the whole configuration by creating a consumer that
    /// knows no broker (TLS files and key passwords are read then).
    ///
    /// # Errors
    ///
    /// Every problem found, each a [`KafkaError::Config`] naming the
    /// setting (`properties."name"` for a librdkafka property). No message
    /// holds the value of a secret.
    pub fn validate(&self) -> Result<(), Vec<KafkaError>> {
        checked::<BaseConsumer<Silent>>(
            self.settings_problems(),
            || self.unchecked_client_config(),
            &self.properties,
        )
    }

    fn settings_problems(&self) -> Vec<KafkaError> {
        let mut problems = Vec::new();
        if self.brokers.is_empty() {
            problems.push(KafkaError::config(
                "brokers",
                "must name at least one broker",
            ));
        }
        if self.group_id.is_empty() {
            problems.push(KafkaError::config("group_id", "must not be empty"));
        }
        for topic in self.topics.iter().filter(|t| t.starts_with('^')) {
            // librdkafka would subscribe by pattern, but partition ids,
            // offsets and commits work from the listed names: the records
            // of matching topics would have nowhere to go.
            problems.push(KafkaError::config(
                "topics",
                format!(
                    "`{topic}` is a pattern (librdkafka subscribes to a topic starting with `^` \
                     by regular expression); pattern subscriptions are not supported: list \
                     the topics by name"
                ),
            ));
        }
        if self.max_batch_records == 0 {
            problems.push(KafkaError::config(
                "max_batch_records",
                "must be at least 1",
            ));
        }
        if self.max_buffered_records == 0 {
            problems.push(KafkaError::config(
                "max_buffered_records",
                "must be at least 1",
            ));
        }
        if self.commit_timeout.is_zero() {
            problems.push(KafkaError::config("commit_timeout", "must be above zero"));
        }
        if self.heartbeat_interval >= self.session_timeout {
            problems.push(KafkaError::config(
                "heartbeat_interval",
                "must be below session_timeout",
            ));
        }
        for (key, value) in [
            ("assignment_strategy", &self.assignment_strategy),
            ("auto_offset_reset", &self.auto_offset_reset),
        ] {
            let name = key_name(key);
            if let Err(e) = ClientConfig::new().set(name, value).create_native_config() {
                problems.push(KafkaError::config(key, conf_refusal(&e, false)));
            }
        }
        problems.extend(self.properties.problems(OWNED_SOURCE_PROPERTIES));
        problems
    }

    fn unchecked_client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (k, v) in SOURCE_DEFAULTS {
            config.set(*k, *v);
        }
        self.properties.apply(&mut config);
        config
            .set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("session.timeout.ms", millis(self.session_timeout))
            .set("heartbeat.interval.ms", millis(self.heartbeat_interval))
            .set("partition.assignment.strategy", &self.assignment_strategy)
            .set("auto.offset.reset", &self.auto_offset_reset);
        with_debug_log(&mut config);
        config
    }
}

/// Let librdkafka's debug messages through when this crate logs at debug
/// level. rdkafka takes the client's log level from the `log` crate,
/// which the command line does not feed: without this, librdkafka's
/// `debug` property (`properties.debug = "cgrp,topic"`) would print
/// nothing after the client starts.
fn with_debug_log(config: &mut ClientConfig) {
    if tracing::enabled!(tracing::Level::DEBUG) {
        config.set_log_level(RDKafkaLogLevel::Debug);
    }
}

/// A duration as librdkafka's `*.ms` settings take it: whole
/// milliseconds (librdkafka refuses a value out of its range, so one too
/// long for a `u64` cannot reach it).
fn millis(duration: Duration) -> String {
    duration.as_millis().to_string()
}

/// The librdkafka name of a dedicated setting.
fn key_name(key: &str) -> &'static str {
    match key {
        "assignment_strategy" => "partition.assignment.strategy",
        _ => "auto.offset.reset",
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
    /// before its delivery report says it failed, written as a duration
    /// (`"30s"`).
    #[serde(
        default = "default_message_timeout",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub message_timeout: Duration,
    /// Header that carries each record's idempotency key
    /// (`source/partition/offset`), so consumers can deduplicate replays.
    #[serde(default = "default_idempotency_header")]
    pub idempotency_header: String,
    /// Take each message's key from this field of the record's JSON value
    /// (a dotted path, digits index arrays: `customer.id`, `items.0.sku`)
    /// instead of the record's own key: a string's text, any other value
    /// as JSON. A record whose value has no such field, or is not JSON,
    /// is refused (to the dead-letter path, by the driver's policy).
    #[serde(default)]
    pub key_field: Option<String>,
    /// Write each message to the topic named by this field of the
    /// record's JSON value (a dotted path, as for `key_field`) instead of
    /// [`topic`](Self::topic); a record whose value lacks the field goes to
    /// `topic`. The topic must be one of
    /// [`allowed_topics`](Self::allowed_topics) (required with this
    /// setting), a valid topic name, and not internal (`__` first). A
    /// record naming any other, a value that is not a string or not JSON,
    /// and a topic the cluster does not have are refused (to the
    /// dead-letter path, by the driver's policy).
    #[serde(default)]
    pub topic_field: Option<String>,
    /// The topics [`topic_field`](Self::topic_field) may name: exact
    /// names, or prefixes ending in `*` (`orders.*`). Record data chooses
    /// the topic, so it may only choose among these: never the source's
    /// own topic by accident (a loop), another system's topic, or a new
    /// topic the broker would create for any value.
    #[serde(default)]
    pub allowed_topics: Vec<String>,
    /// Further librdkafka producer settings, passed through unchanged
    /// (secrets held as secrets: see [`KafkaProperties`]).
    #[serde(default)]
    pub properties: KafkaProperties,
}

impl KafkaSinkConfig {
    /// A configuration with the defaults for everything but the brokers
    /// and the topic.
    #[must_use]
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSinkConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            message_timeout: default_message_timeout(),
            idempotency_header: default_idempotency_header(),
            key_field: None,
            topic_field: None,
            allowed_topics: Vec::new(),
            properties: KafkaProperties::default(),
        }
    }

    /// Check the values and build the librdkafka configuration.
    pub(crate) fn client_config(&self) -> Result<ClientConfig, KafkaError> {
        match self.settings_problems().into_iter().next() {
            Some(problem) => Err(problem),
            None => Ok(self.unchecked_client_config()),
        }
    }

    /// Check everything [`KafkaSink::new`](crate::KafkaSink::new) checks,
    /// without connecting anywhere: the settings, every property against
    /// librdkafka's own checks, and the whole configuration by creating a
    /// producer that knows no broker.
    ///
    /// # Errors
    ///
    /// Every problem found, each a [`KafkaError::Config`] naming the
    /// setting. No message holds the value of a secret.
    pub fn validate(&self) -> Result<(), Vec<KafkaError>> {
        checked::<BaseProducer<Silent>>(
            self.settings_problems(),
            || self.unchecked_client_config(),
            &self.properties,
        )
    }

    fn settings_problems(&self) -> Vec<KafkaError> {
        let mut problems = Vec::new();
        if self.brokers.is_empty() {
            problems.push(KafkaError::config(
                "brokers",
                "must name at least one broker",
            ));
        }
        if self.topic.is_empty() {
            problems.push(KafkaError::config("topic", "must not be empty"));
        }
        for (name, field) in [
            ("key_field", &self.key_field),
            ("topic_field", &self.topic_field),
        ] {
            if let Some(field) = field
                && (field.is_empty() || field.split('.').any(str::is_empty))
            {
                problems.push(KafkaError::config(
                    name,
                    "must be a dotted path of non-empty field names (`customer.id`)",
                ));
            }
        }
        match (&self.topic_field, self.allowed_topics.is_empty()) {
            (Some(_), true) => problems.push(KafkaError::config(
                "allowed_topics",
                "must list the topics `topic_field` may name (names, or prefixes ending in `*`)",
            )),
            (None, false) => problems.push(KafkaError::config(
                "allowed_topics",
                "only applies with `topic_field`",
            )),
            _ => {}
        }
        for pattern in &self.allowed_topics {
            let name = pattern.strip_suffix('*').unwrap_or(pattern);
            if name.is_empty() || name.contains('*') {
                problems.push(KafkaError::config(
                    "allowed_topics",
                    format!("`{pattern}` is neither a topic name nor a prefix ending in `*`"),
                ));
            }
        }
        problems.extend(self.properties.problems(OWNED_SINK_PROPERTIES));
        problems
    }

    /// Whether `topic_field` may send a record to `topic`.
    pub(crate) fn topic_allowed(&self, topic: &str) -> bool {
        self.allowed_topics
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => topic.starts_with(prefix),
                None => topic == pattern,
            })
    }

    fn unchecked_client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        self.properties.apply(&mut config);
        config
            .set("bootstrap.servers", &self.brokers)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", millis(self.message_timeout));
        with_debug_log(&mut config);
        config
    }
}

/// `problems`, or when there are none, whatever librdkafka refuses in
/// creating a client `C` of the configuration `config` builds (with no
/// broker: see [`without_brokers`]).
fn checked<C>(
    mut problems: Vec<KafkaError>,
    config: impl FnOnce() -> ClientConfig,
    properties: &KafkaProperties,
) -> Result<(), Vec<KafkaError>>
where
    C: rdkafka::config::FromClientConfigAndContext<Silent>,
{
    if problems.is_empty() {
        let mut config = config();
        if let Err(e) = without_brokers(&mut config).create_with_context::<_, C>(Silent) {
            problems.push(properties.refusal(e));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// `config` as a client that knows no broker, so creating it connects
/// nowhere, and that logs nothing (librdkafka warns that it has no
/// broker). A consumer or producer that knows a broker connects to it as
/// soon as it is created, before any poll.
fn without_brokers(config: &mut ClientConfig) -> &mut ClientConfig {
    config.remove("bootstrap.servers");
    config.remove("debug");
    config
        .set("log_level", "0")
        .set_log_level(RDKafkaLogLevel::Emerg)
}

/// A client context that logs nothing: the clients [`validate`]
/// creates are dropped at once.
///
/// [`validate`]: KafkaSourceConfig::validate
struct Silent;

impl ClientContext for Silent {
    fn log(&self, _: RDKafkaLogLevel, _: &str, _: &str) {}
    fn stats(&self, _: Statistics) {}
    fn error(&self, _: ClientError, _: &str) {}
}

impl ConsumerContext for Silent {}

impl ProducerContext for Silent {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// librdkafka's reason for refusing one setting, with the value replaced
/// by `***` when `plain` is false.
fn conf_refusal(e: &ClientError, plain: bool) -> String {
    match e {
        ClientError::ClientConfig(RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN, _, _, _) => {
            "librdkafka has no such property (see its CONFIGURATION.md)".to_owned()
        }
        ClientError::ClientConfig(_, desc, _, value) => {
            let desc = if plain || value.is_empty() {
                desc.clone()
            } else {
                desc.replace(value.as_str(), "***")
            };
            format!("librdkafka refuses it: {desc}")
        }
        other => format!("librdkafka refuses it: {other}"),
    }
}

/// Whether the value of the librdkafka property `name` may be a secret:
/// a password, a key (or a key's PEM text), a token, a client secret, a
/// JAAS or OAUTHBEARER configuration, or a name librdkafka does not know
/// (a misspelled secret is still a secret). Such values are held as
/// [`SecretString`]s and never printed.
#[must_use]
pub fn is_secret_property(name: &str) -> bool {
    const MARKS: &[&str] = &[
        "pass",
        "pwd",
        "secret",
        "key",
        "pem",
        "token",
        "credential",
        "jaas",
        "oauthbearer",
        "private",
    ];
    let lower = name.to_ascii_lowercase();
    MARKS.iter().any(|m| lower.contains(m)) || !is_known_property(name)
}

/// Whether librdkafka knows the property `name`.
fn is_known_property(name: &str) -> bool {
    !matches!(
        ClientConfig::new().set(name, "").create_native_config(),
        Err(ClientError::ClientConfig(
            RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN,
            ..
        ))
    )
}

/// One property's value.
#[derive(Clone)]
enum PropertyValue {
    Plain(String),
    Secret(SecretString),
}

impl PropertyValue {
    fn new(name: &str, value: String) -> Self {
        if is_secret_property(name) {
            PropertyValue::Secret(value.into())
        } else {
            PropertyValue::Plain(value)
        }
    }

    fn expose(&self) -> &str {
        match self {
            PropertyValue::Plain(v) => v,
            PropertyValue::Secret(v) => v.expose_secret(),
        }
    }
}

/// librdkafka properties passed through to the client, by name.
///
/// The value of every property whose name may hold a secret (see
/// [`is_secret_property`]) is held as a [`SecretString`]: `Debug` prints
/// it as `[REDACTED]`, and no error names it. In a configuration file a
/// value is a string, a number or a boolean (`"linger.ms" = 5`); librdkafka
/// reads them all as text.
#[derive(Clone, Default)]
pub struct KafkaProperties(BTreeMap<String, PropertyValue>);

impl KafkaProperties {
    /// No properties.
    #[must_use]
    pub fn new() -> Self {
        KafkaProperties::default()
    }

    /// Set property `name` to `value` (held as a secret if the name says
    /// it may be one).
    pub fn insert(&mut self, name: String, value: String) {
        let value = PropertyValue::new(&name, value);
        self.0.insert(name, value);
    }

    /// Remove every property.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Remove property `name`; whether it was set.
    pub fn remove(&mut self, name: &str) -> bool {
        self.0.remove(name).is_some()
    }

    /// Whether property `name` is set.
    #[must_use]
    pub fn contains_key(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The names of the properties set, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// How many properties are set.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no property is set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the value of property `name` is held as a secret.
    #[must_use]
    pub fn is_secret(&self, name: &str) -> bool {
        matches!(self.0.get(name), Some(PropertyValue::Secret(_)))
    }

    /// The value of property `name`, a secret or not: for the client
    /// only, never to be printed.
    #[must_use]
    pub fn expose_value(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(PropertyValue::expose)
    }

    fn apply(&self, config: &mut ClientConfig) {
        for (k, v) in &self.0 {
            config.set(k, v.expose());
        }
    }

    /// Properties the connector owns, then every property librdkafka
    /// refuses on its own.
    fn problems(&self, owned: &[&str]) -> Vec<KafkaError> {
        let mut problems = Vec::new();
        for (name, value) in &self.0 {
            if owned.contains(&name.as_str()) {
                problems.push(KafkaError::config(
                    property_key(name),
                    "is set by the connector itself; use the dedicated setting or leave it out",
                ));
                continue;
            }
            let plain = matches!(value, PropertyValue::Plain(_));
            if let Err(e) = ClientConfig::new()
                .set(name, value.expose())
                .create_native_config()
            {
                problems.push(KafkaError::config(
                    property_key(name),
                    conf_refusal(&e, plain),
                ));
            }
        }
        problems
    }

    /// A client librdkafka refused to create, as a problem naming the
    /// property its reason names, with every secret value taken out.
    fn refusal(&self, e: ClientError) -> KafkaError {
        let reason = match &e {
            ClientError::ClientCreation(reason) => reason.clone(),
            ClientError::ClientConfig(..) => {
                let plain = match &e {
                    ClientError::ClientConfig(_, _, name, _) => !self.is_secret(name),
                    _ => false,
                };
                conf_refusal(&e, plain)
            }
            other => other.to_string(),
        };
        let reason = self.redact(&reason);
        if let Some(problem) = self.key_problem(&reason) {
            return problem;
        }
        // The property the reason names, in full or by a shorter alias in
        // backquotes (`max.in.flight` for
        // `max.in.flight.requests.per.connection`).
        let aliases: Vec<&str> = reason.split('`').skip(1).step_by(2).collect();
        let key = self
            .0
            .keys()
            .filter(|name| {
                reason.contains(name.as_str())
                    || aliases
                        .iter()
                        .any(|a| !a.is_empty() && name.starts_with(&format!("{a}.")))
            })
            .max_by_key(|name| name.len())
            .map_or_else(|| "properties".to_owned(), |name| property_key(name));
        KafkaError::config(
            key,
            format!("librdkafka refuses the configuration: {reason}"),
        )
    }

    /// A private key librdkafka could not load, said for what it is when
    /// the key is encrypted. librdkafka reports OpenSSL's last error
    /// against `ssl.key.location` (`PEM lib`) whatever the cause, and for
    /// an encrypted key the cause is nearly always its password.
    fn key_problem(&self, reason: &str) -> Option<KafkaError> {
        let (name, text) = if reason.contains("ssl.key.pem") {
            ("ssl.key.pem", self.expose_value("ssl.key.pem")?.to_owned())
        } else if reason.contains("ssl.key.location") {
            let path = self.expose_value("ssl.key.location")?;
            ("ssl.key.location", std::fs::read_to_string(path).ok()?)
        } else {
            return None;
        };
        let encrypted = text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
            || text.contains("Proc-Type: 4,ENCRYPTED");
        if !encrypted {
            return None;
        }
        // Not the path itself: `ssl.key.location` is held as a secret.
        let key = format!("the private key of {name}");
        Some(match self.expose_value("ssl.key.password") {
            Some(password) if !password.is_empty() => KafkaError::config(
                property_key("ssl.key.password"),
                format!(
                    "does not decrypt {key}: the key is encrypted and this password is not \
                     its password (OpenSSL: {reason})"
                ),
            ),
            _ => KafkaError::config(
                property_key(name),
                format!(
                    "{key} is encrypted and ssl.key.password is not set: set it to the key's \
                     password (OpenSSL: {reason})"
                ),
            ),
        })
    }

    /// `text` with the value of every secret property replaced by `***`.
    #[must_use]
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for value in self.0.values() {
            if let PropertyValue::Secret(secret) = value {
                let secret = secret.expose_secret();
                if !secret.is_empty() {
                    out = out.replace(secret, "***");
                }
            }
        }
        out
    }
}

/// How the configuration names property `name`.
fn property_key(name: &str) -> String {
    format!("properties.\"{name}\"")
}

impl fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (name, value) in &self.0 {
            match value {
                PropertyValue::Plain(v) => map.entry(name, v),
                PropertyValue::Secret(_) => map.entry(name, &format_args!("[REDACTED]")),
            };
        }
        map.finish()
    }
}

impl PartialEq for KafkaProperties {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|((a, x), (b, y))| a == b && x.expose() == y.expose())
    }
}

impl Eq for KafkaProperties {}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for KafkaProperties {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut properties = KafkaProperties::new();
        for (k, v) in iter {
            properties.insert(k.into(), v.into());
        }
        properties
    }
}

impl<'de> Deserialize<'de> for KafkaProperties {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(PropertiesVisitor)
    }
}

struct PropertiesVisitor;

impl<'de> Visitor<'de> for PropertiesVisitor {
    type Value = KafkaProperties;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table of librdkafka properties")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut properties = KafkaProperties::new();
        while let Some(name) = map.next_key::<String>()? {
            // The value's own error would quote it: name the property instead.
            let value = map.next_value::<Scalar>().map_err(|_| {
                de::Error::custom(format!(
                    "{}: must be a string, a number or a boolean",
                    property_key(&name)
                ))
            })?;
            properties.insert(name, value.0);
        }
        Ok(properties)
    }
}

/// A property's value: a string, a number or a boolean, as text.
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl Visitor<'_> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, a number or a boolean")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar(v.to_string()))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar(v.to_string()))
    }
}

/// Kafka's own default since 3.0: long enough for the default revoke
/// deadline of a pipeline (10 s) to stay within two thirds of it.
fn default_session_timeout() -> Duration {
    Duration::from_secs(45)
}
fn default_heartbeat_interval() -> Duration {
    Duration::from_secs(3)
}
fn default_assignment_strategy() -> String {
    "cooperative-sticky".to_owned()
}
fn default_auto_offset_reset() -> String {
    "earliest".to_owned()
}
fn default_commit_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_max_batch_records() -> usize {
    500
}
fn default_max_buffered_records() -> usize {
    10_000
}
fn default_message_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_idempotency_header() -> String {
    "etl-idempotency-key".to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_field_needs_the_topics_it_may_name() {
        let mut c = KafkaSinkConfig::new("127.0.0.1:9092", "orders");
        c.topic_field = Some("route".into());
        let problems = c.settings_problems();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].to_string().contains("allowed_topics"),
            "{problems:?}"
        );

        c.allowed_topics = vec!["orders.eu".into(), "audit.*".into()];
        assert!(c.settings_problems().is_empty());
        assert!(c.topic_allowed("orders.eu"));
        assert!(c.topic_allowed("audit.2026"));
        assert!(!c.topic_allowed("orders.us"));
        assert!(!c.topic_allowed("orders.eu2"));

        c.allowed_topics = vec!["*".into(), "a*b*".into()];
        assert_eq!(c.settings_problems().len(), 2);

        c.topic_field = None;
        c.allowed_topics = vec!["orders.eu".into()];
        let problems = c.settings_problems();
        assert!(
            problems[0]
                .to_string()
                .contains("only applies with `topic_field`"),
            "{problems:?}"
        );
    }

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
    fn durations_are_read_with_their_unit_and_reach_librdkafka_in_milliseconds() {
        let c: KafkaSourceConfig = serde_json::from_str(
            r#"{"brokers": "b:1", "group_id": "g", "topics": ["t"],
                "session_timeout": "6s", "heartbeat_interval": "1500ms"}"#,
        )
        .expect("the new form");
        let rd = c.client_config().expect("valid");
        assert_eq!(rd.get("session.timeout.ms"), Some("6000"));
        assert_eq!(rd.get("heartbeat.interval.ms"), Some("1500"));
        let s: KafkaSinkConfig =
            serde_json::from_str(r#"{"brokers": "b:1", "topic": "t", "message_timeout": "2s"}"#)
                .expect("the new form");
        assert_eq!(
            s.client_config().expect("valid").get("message.timeout.ms"),
            Some("2000")
        );
        let e = serde_json::from_str::<KafkaSourceConfig>(
            r#"{"brokers": "b:1", "group_id": "g", "topics": ["t"], "session_timeout": 6000}"#,
        )
        .expect_err("a bare number");
        assert!(e.to_string().contains("string"), "{e}");
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
        c.heartbeat_interval = c.session_timeout;
        assert!(
            c.client_config()
                .expect_err("heartbeat")
                .to_string()
                .contains("heartbeat_interval")
        );
    }

    /// librdkafka subscribes to a topic starting with `^` by pattern; the
    /// partition mapping knows only the listed names, so every record of
    /// a matching topic was dropped as outside the mapping and its
    /// assignments ignored. Such a topic is refused instead.
    #[test]
    fn a_regex_topic_is_refused_by_validate_and_new() {
        let c = KafkaSourceConfig::new("b:1", "g", vec!["a".into(), r"^orders\..*".into()]);
        let problems = c.validate().expect_err("a pattern topic");
        assert_eq!(problems.len(), 1, "{problems:?}");
        let message = problems[0].to_string();
        assert!(message.contains("topics"), "{message}");
        assert!(message.contains(r"^orders\..*"), "{message}");
        assert!(message.contains("pattern"), "{message}");
        assert!(
            crate::KafkaSource::new(etl_record::SourceId::new("k"), c).is_err(),
            "refused when the source is built too"
        );
    }

    const SECRET: &str = "Zq9SecretPw";

    /// A source configuration with these properties.
    fn source(properties: &[(&str, &str)]) -> Result<KafkaSourceConfig, String> {
        let mut c = KafkaSourceConfig::new("127.0.0.1:9", "g", vec!["t".into()]);
        c.properties = properties.iter().copied().collect();
        Ok(c)
    }

    fn problems(config: &KafkaSourceConfig) -> Vec<String> {
        config
            .validate()
            .err()
            .unwrap_or_default()
            .iter()
            .flat_map(|e| [e.to_string(), format!("{e:?}")])
            .collect()
    }

    #[test]
    fn secret_properties_never_print_in_debug() {
        let c = source(&[
            ("sasl.password", SECRET),
            ("ssl.key.password", SECRET),
            ("sasl.oauthbearer.client.secret", SECRET),
            ("ssl.key.pem", SECRET),
            ("sasl.passwd", SECRET),
            ("sasl.pssword", SECRET),
            ("linger.ms", "5"),
        ])
        .expect("valid");
        let shown = format!("{c:?}");
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(shown.contains("\"sasl.password\": [REDACTED]"), "{shown}");
        // Misspelled names are unknown to librdkafka: held as secrets too.
        assert!(c.properties.is_secret("sasl.pssword"), "{shown}");
        assert!(shown.contains("\"linger.ms\": \"5\""), "{shown}");
        let sink = KafkaSinkConfig {
            properties: c.properties.clone(),
            ..KafkaSinkConfig::new("b:1", "t")
        };
        assert!(!format!("{sink:?}").contains(SECRET));
        assert_eq!(c.properties.expose_value("sasl.password"), Some(SECRET));
    }

    #[test]
    fn validate_names_every_property_librdkafka_refuses_without_secrets() {
        let c = source(&[
            ("sasl.passwd", SECRET),
            ("linger.ms", "soon"),
            ("ssl.key.password", SECRET),
            ("ssl.keystore.password", SECRET),
        ])
        .expect("deserializes");
        let shown = problems(&c);
        let all = shown.join("\n");
        assert!(!all.contains(SECRET), "{all}");
        assert!(
            all.contains("properties.\"sasl.passwd\"") && all.contains("no such property"),
            "{all}"
        );
        // A plain value is quoted back: it helps, and it is no secret.
        assert!(all.contains("properties.\"linger.ms\""), "{all}");
        // An owned property is named as before.
        let mut owned = source(&[]).expect("valid");
        owned.properties.insert("group.id".into(), "x".into());
        assert!(problems(&owned).join("\n").contains("group.id"));
        // A valid configuration passes.
        source(&[("linger.ms", "5")])
            .expect("valid")
            .validate()
            .expect("valid");
        KafkaSinkConfig::new("b:1", "t").validate().expect("valid");
    }

    #[test]
    fn validate_refuses_what_only_creating_the_client_finds() {
        // Each value is fine alone; librdkafka refuses the combination when
        // the client is created.
        let mut sink = KafkaSinkConfig::new("b:1", "t");
        sink.properties
            .insert("max.in.flight.requests.per.connection".into(), "10".into());
        let e = sink
            .validate()
            .expect_err("idempotence allows at most 5 in flight");
        let shown = format!("{e:?}");
        assert!(
            shown.contains("properties.\\\"max.in.flight.requests.per.connection\\\""),
            "{shown}"
        );
    }

    #[test]
    fn validate_connects_nowhere() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let broker = listener.local_addr().expect("address").to_string();
        KafkaSourceConfig::new(&broker, "g", vec!["t".into()])
            .validate()
            .expect("valid");
        KafkaSinkConfig::new(&broker, "t")
            .validate()
            .expect("valid");
        // The clients are gone: a connection they made would wait in the
        // backlog.
        listener.set_nonblocking(true).expect("nonblocking");
        assert_eq!(
            listener.accept().map(|_| ()).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock)
        );
    }
}
