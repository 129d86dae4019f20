//! The Kafka sink: a producer whose batches count as written only when
//! every delivery report says so.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etl_record::Record;
use etl_sink::{EncodedBatch, Reject, Sink, SinkError};
use futures::channel::oneshot::Canceled;
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use crate::outage::{Outage, OutageContext};
use crate::refusal::Security;
use rdkafka::types::RDKafkaErrorCode;

use crate::{ErrorClass, KafkaError, KafkaSinkConfig, classify};

/// How long to wait before enqueuing again when librdkafka's local queue
/// is full and no delivery of this batch is pending yet.
const QUEUE_FULL_BACKOFF: Duration = Duration::from_millis(10);

/// Writes each record of a batch as one Kafka message to a topic.
///
/// * The producer runs with `acks=all` and idempotence on, so a delivery
///   report means every in-sync replica has the message, and librdkafka's
///   own retries cannot duplicate or reorder it.
/// * [`write`](Sink::write) returns `Ok` only when the delivery report of
///   **every** message of the batch is a success; only then does the sink
///   driver deliver the batch's acknowledgements.
/// * The message key is the record's key; the record's headers are copied,
///   and the record's idempotency key (`source/partition/offset`) is added
///   as the header named by
///   [`idempotency_header`](KafkaSinkConfig::idempotency_header)
///   (`etl-idempotency-key` by default), so consumers can deduplicate
///   replays. The timestamp is carried over when the record has one.
/// * The message value is the record's encoding with one trailing newline
///   removed: line encoders frame records with newlines, Kafka frames
///   messages itself.
/// * Failures are classified by [`classify`](fn@classify): any retryable
///   failure makes the whole batch retryable (a retry may duplicate
///   messages that were delivered, which the idempotency header
///   identifies; an unreachable cluster halts the pipeline once the
///   driver's retry policy gives up); a failure of the environment (not
///   authorised, unknown topic) is [`SinkError::Permanent`] and halts the
///   pipeline; messages refused for what they are (too large, invalid)
///   are per-record rejects (the dead-letter path), even when every
///   message of the batch was refused.
pub struct KafkaSink {
    producer: FutureProducer<OutageContext>,
    /// Whether the brokers answer (shared with the producer's context).
    outage: Arc<Outage>,
    config: KafkaSinkConfig,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.config.topic)
            .field("brokers", &self.config.brokers)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// A sink writing to `config.topic`. Connects lazily: a broker that is
    /// down shows up as retryable write errors, not here.
    pub fn new(config: KafkaSinkConfig) -> Result<Self, KafkaError> {
        let outage = Arc::new(Outage::new(Security::new(
            "producer",
            &config.brokers,
            &config.properties,
        )));
        let producer = config
            .client_config()?
            .create_with_context(OutageContext(Arc::clone(&outage)))
            .map_err(|e| KafkaError::client("creating the producer", e))?;
        Ok(KafkaSink {
            producer,
            outage,
            config,
        })
    }

    /// The configuration the sink was built from.
    #[must_use]
    pub fn config(&self) -> &KafkaSinkConfig {
        &self.config
    }

    /// Build the message for `record` and hand it to librdkafka, waiting
    /// (for this batch's oldest pending delivery, or briefly) while the
    /// local queue is full.
    async fn enqueue(
        &self,
        record: &Record,
        topic: &str,
        value: &[u8],
        message_key: Option<&[u8]>,
        pending: &mut VecDeque<(usize, DeliveryFuture)>,
        reports: &mut [Option<Result<(), ClientError>>],
    ) -> Result<DeliveryFuture, ClientError> {
        let key = record.idempotency_key().to_string();
        loop {
            let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 1);
            for h in record.headers.iter() {
                headers = headers.insert(Header {
                    key: &h.key,
                    value: h.value.as_deref(),
                });
            }
            headers = headers.insert(Header {
                key: &self.config.idempotency_header,
                value: Some(key.as_bytes()),
            });
            let mut message = FutureRecord::<[u8], [u8]>::to(topic)
                .payload(value)
                .headers(headers);
            if let Some(k) = message_key {
                message = message.key(k);
            }
            if let Some(ts) = record.timestamp {
                message = message.timestamp(ts.0);
            }
            match self.producer.send_result(message) {
                Ok(delivery) => return Ok(delivery),
                Err((ClientError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    match pending.pop_front() {
                        Some((i, delivery)) => reports[i] = Some(outcome(delivery.await)),
                        None => tokio::time::sleep(QUEUE_FULL_BACKOFF).await,
                    }
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

#[async_trait]
impl Sink for KafkaSink {
    /// Write the batch; see [`KafkaSink`]. A broker that refused the
    /// producer's security settings (see [`KafkaError::Refused`]) fails
    /// the write at once, and every write after it, as a permanent error:
    /// waiting for delivery reports that cannot come would only time out.
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        if let Some(refused) = self.outage.refused() {
            return Err(SinkError::permanent(refused));
        }
        let write = self.write_batch(batch);
        let refused = self.outage.wait_refused();
        futures::pin_mut!(write, refused);
        match futures::future::select(write, refused).await {
            futures::future::Either::Left((written, _)) => written,
            futures::future::Either::Right((refused, _)) => Err(SinkError::permanent(refused)),
        }
    }
}

impl KafkaSink {
    async fn write_batch(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let records = batch.records();
        let mut reports: Vec<Option<Result<(), ClientError>>> = Vec::new();
        reports.resize_with(records.len(), || None);
        let mut pending = VecDeque::with_capacity(records.len());
        let mut refused = Vec::new();
        let mut topics: Vec<Option<String>> = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let encoded = batch.encoded(i).unwrap_or_default();
            let value = encoded.strip_suffix(b"\n").unwrap_or(encoded);
            let routed = match self.route(value) {
                Ok(routed) => routed,
                Err(reason) => {
                    refused.push(Reject::new(i, reason));
                    reports[i] = Some(Ok(()));
                    continue;
                }
            };
            let message_key = routed.key.as_deref().or(record.key.as_deref());
            let topic = routed.topic.as_deref().unwrap_or(&self.config.topic);
            match self
                .enqueue(
                    record,
                    topic,
                    value,
                    message_key,
                    &mut pending,
                    &mut reports,
                )
                .await
            {
                Ok(delivery) => pending.push_back((i, delivery)),
                Err(e) => reports[i] = Some(Err(e)),
            }
            if routed.topic.is_some() {
                topics.resize(i + 1, None);
                topics[i] = routed.topic;
            }
        }
        for (i, delivery) in pending {
            reports[i] = Some(outcome(delivery.await));
        }
        if reports.iter().any(|r| matches!(r, Some(Ok(())))) {
            self.outage.recovered();
        }
        match self.judge(records, &topics, reports) {
            Ok(()) if refused.is_empty() => Ok(()),
            Ok(()) => Err(SinkError::Rejected(refused)),
            Err(SinkError::Rejected(mut rejects)) => {
                rejects.extend(refused);
                rejects.sort_by_key(|r| r.index);
                Err(SinkError::Rejected(rejects))
            }
            Err(e) => Err(e),
        }
    }
}

/// Where a record's message goes, when fields of its value say: the key
/// `key_field` gives, and the topic `topic_field` gives.
#[derive(Debug, Default, PartialEq)]
struct Routed {
    key: Option<Vec<u8>>,
    topic: Option<String>,
}

impl KafkaSink {
    /// The key and topic the configured fields give for `value`, read in
    /// one parse; nothing (and no parse) when no field is configured.
    fn route(&self, value: &[u8]) -> Result<Routed, String> {
        let routed = route(
            value,
            self.config.key_field.as_deref(),
            self.config.topic_field.as_deref(),
        )?;
        if let (Some(topic), Some(field)) = (&routed.topic, &self.config.topic_field)
            && !self.config.topic_allowed(topic)
        {
            return Err(format!(
                "topic_field {field:?}: {topic:?} is not among allowed_topics"
            ));
        }
        Ok(routed)
    }
}

fn route(
    value: &[u8],
    key_field: Option<&str>,
    topic_field: Option<&str>,
) -> Result<Routed, String> {
    if key_field.is_none() && topic_field.is_none() {
        return Ok(Routed::default());
    }
    let (setting, field) = match (key_field, topic_field) {
        (Some(f), _) => ("key_field", f),
        (None, Some(f)) => ("topic_field", f),
        (None, None) => return Ok(Routed::default()),
    };
    let document: serde_json::Value = serde_json::from_slice(value)
        .map_err(|e| format!("{setting} {field:?}: the value is not JSON: {e}"))?;
    let key = match key_field {
        None => None,
        Some(field) => {
            let at = field_at(&document, field)
                .ok_or_else(|| format!("key_field {field:?}: the value has no such field"))?;
            Some(match at {
                serde_json::Value::String(s) => s.as_bytes().to_vec(),
                other => other.to_string().into_bytes(),
            })
        }
    };
    let topic = match topic_field {
        None => None,
        Some(field) => match field_at(&document, field) {
            // No such field: the configured topic.
            None => None,
            Some(serde_json::Value::String(name)) => {
                check_topic_name(name)
                    .map_err(|why| format!("topic_field {field:?}: {name:?} {why}"))?;
                Some(name.clone())
            }
            Some(other) => {
                return Err(format!(
                    "topic_field {field:?}: a topic name is a string, not {}",
                    json_kind(other)
                ));
            }
        },
    };
    Ok(Routed { key, topic })
}

/// The value at `field` (a dotted path, read as every component reads
/// one: [`etl_record::FieldPath`]) of `document`.
fn field_at<'a>(document: &'a serde_json::Value, field: &str) -> Option<&'a serde_json::Value> {
    etl_record::json_field(document, field.split('.'))
}

/// Kafka's rule for topic names, and no internal topic (`__consumer_offsets`,
/// `__transaction_state`): record data must not write there.
fn check_topic_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 249 {
        return Err("is not 1 to 249 characters long");
    }
    if name == "." || name == ".." {
        return Err("is not a topic name");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err("has characters a topic name cannot have (a-z A-Z 0-9 . _ - only)");
    }
    if name.starts_with("__") {
        return Err("is an internal topic");
    }
    Ok(())
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl KafkaSink {
    /// Turn the delivery reports of a batch into the write's outcome.
    /// `topics[i]` is record `i`'s topic when a field chose it.
    fn judge(
        &self,
        records: &[Record],
        topics: &[Option<String>],
        reports: Vec<Option<Result<(), ClientError>>>,
    ) -> Result<(), SinkError> {
        let mut rejects = Vec::new();
        for (i, (record, report)) in records.iter().zip(reports).enumerate() {
            // Every slot is filled by `write`; an empty one would be a bug,
            // so it counts as a retryable failure rather than a success.
            let source = match report {
                Some(Ok(())) => continue,
                Some(Err(e)) => e,
                None => ClientError::Canceled,
            };
            let routed = topics.get(i).and_then(Option::as_ref);
            let mut class = classify(&source);
            // A topic the record chose that the cluster lacks is the
            // record's fault, not the environment's: the other records
            // still have somewhere to go.
            if routed.is_some() && unknown_topic(&source) {
                class = ErrorClass::Record;
            }
            let error = KafkaError::Produce {
                topic: routed.unwrap_or(&self.config.topic).clone(),
                key: record.idempotency_key(),
                source: Box::new(source),
            };
            match class {
                ErrorClass::Retryable => return Err(SinkError::retryable(error)),
                ErrorClass::Environment => return Err(SinkError::permanent(error)),
                ErrorClass::Record => rejects.push(Reject::new(i, error.to_string())),
            }
        }
        if rejects.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejects))
        }
    }
}

/// Whether a delivery failed because the cluster has no such topic
/// (librdkafka's verdict once metadata has had time to propagate; the
/// broker's own `UnknownTopicOrPartition` stays retryable, as it also
/// answers while a new topic's leaders are being chosen).
fn unknown_topic(error: &ClientError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopic)
}

fn outcome(report: Result<OwnedDeliveryResult, Canceled>) -> Result<(), ClientError> {
    match report {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _message))) => Err(e),
        // The producer went away before reporting: nothing is known.
        Err(Canceled) => Err(ClientError::Canceled),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_topic_name, route};

    fn key_from_field(value: &[u8], field: &str) -> Result<Vec<u8>, String> {
        route(value, Some(field), None).map(|r| r.key.unwrap_or_default())
    }

    #[test]
    fn a_key_field_reads_array_indexes_as_a_filter_does() {
        let value = br#"{"items":[{"sku":"a"},{"sku":"b"}]}"#;
        assert_eq!(key_from_field(value, "items.1.sku").unwrap(), b"b");
        // `+1` is a name, not an index, for every component.
        let plus = key_from_field(value, "items.+1.sku").unwrap_err();
        assert!(plus.contains("no such field"), "{plus}");
    }

    #[test]
    fn a_topic_field_names_the_topic_and_a_value_without_it_keeps_the_configured_one() {
        let value = br#"{"route":{"to":"orders.eu"},"n":1,"bad":"__consumer_offsets","num":7}"#;
        let routed = route(value, None, Some("route.to")).unwrap();
        assert_eq!(routed.topic.as_deref(), Some("orders.eu"));
        assert_eq!(routed.key, None);
        assert_eq!(route(value, None, Some("route.from")).unwrap().topic, None);
        let internal = route(value, None, Some("bad")).unwrap_err();
        assert!(internal.contains("internal topic"), "{internal}");
        let number = route(value, None, Some("num")).unwrap_err();
        assert!(number.contains("not a number"), "{number}");
        let not_json = route(b"text", None, Some("route.to")).unwrap_err();
        assert!(not_json.contains("not JSON"), "{not_json}");
        // Both fields from one parse.
        let both = route(value, Some("n"), Some("route.to")).unwrap();
        assert_eq!(both.key.as_deref(), Some(&b"1"[..]));
        assert_eq!(both.topic.as_deref(), Some("orders.eu"));
        // No field configured: no parse, even of a value that is not JSON.
        assert_eq!(route(b"text", None, None).unwrap(), Default::default());
    }

    /// The test broker creates topics on first use, so a topic the
    /// cluster lacks is judged here, from the delivery report it gives.
    #[test]
    fn a_missing_topic_a_record_chose_is_the_records_fault_and_the_configured_ones_the_environments()
     {
        use etl_record::{Offset, PartitionId, Position, Record, SourceId};
        use etl_sink::SinkError;
        use rdkafka::error::KafkaError as ClientError;
        use rdkafka::types::RDKafkaErrorCode;

        let sink = super::KafkaSink::new(crate::KafkaSinkConfig::new("127.0.0.1:1", "fallback"))
            .expect("a producer connects lazily");
        let records = vec![Record::new(
            Position::new(SourceId::new("s"), PartitionId(0), Offset(0)),
            "{}",
        )];
        let unknown = || {
            vec![Some(Err(ClientError::MessageProduction(
                RDKafkaErrorCode::UnknownTopic,
            )))]
        };
        match sink.judge(&records, &[Some("chosen".to_owned())], unknown()) {
            Err(SinkError::Rejected(rejects)) => {
                assert!(rejects[0].reason.contains("chosen"), "{rejects:?}");
            }
            other => panic!("refused to the dead-letter path: {other:?}"),
        }
        match sink.judge(&records, &[], unknown()) {
            Err(e @ SinkError::Permanent(_)) => {
                assert!(e.to_string().contains("fallback"), "{e}");
            }
            other => panic!("the configured topic missing halts: {other:?}"),
        }
    }

    #[test]
    fn topic_names_follow_kafkas_rule() {
        assert!(check_topic_name("orders-2026.eu_west").is_ok());
        for bad in [
            "",
            ".",
            "..",
            "has space",
            "slash/no",
            "ünïcode",
            &"x".repeat(250),
        ] {
            assert!(check_topic_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_key_field_takes_a_strings_text_and_any_other_value_as_json() {
        let value = br#"{"customer":{"id":"c-7","n":42},"items":[{"sku":"a"},{"sku":"b"}]}"#;
        assert_eq!(key_from_field(value, "customer.id").unwrap(), b"c-7");
        assert_eq!(key_from_field(value, "customer.n").unwrap(), b"42");
        assert_eq!(key_from_field(value, "items.1.sku").unwrap(), b"b");
        assert_eq!(
            key_from_field(value, "customer").unwrap(),
            br#"{"id":"c-7","n":42}"#
        );
        let missing = key_from_field(value, "customer.email").unwrap_err();
        assert!(missing.contains("no such field"), "{missing}");
        let not_json = key_from_field(b"plain text", "id").unwrap_err();
        assert!(not_json.contains("not JSON"), "{not_json}");
    }
}
