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
        let outage = Arc::new(Outage::new("producer"));
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
            let mut message = FutureRecord::<[u8], [u8]>::to(&self.config.topic)
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
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let records = batch.records();
        let mut reports: Vec<Option<Result<(), ClientError>>> = Vec::new();
        reports.resize_with(records.len(), || None);
        let mut pending = VecDeque::with_capacity(records.len());
        let mut refused = Vec::new();
        for (i, record) in records.iter().enumerate() {
            let encoded = batch.encoded(i).unwrap_or_default();
            let value = encoded.strip_suffix(b"\n").unwrap_or(encoded);
            let field_key;
            let message_key = match &self.config.key_field {
                None => record.key.as_deref(),
                Some(field) => match key_from_field(value, field) {
                    Ok(key) => {
                        field_key = key;
                        Some(field_key.as_slice())
                    }
                    Err(reason) => {
                        refused.push(Reject::new(i, reason));
                        reports[i] = Some(Ok(()));
                        continue;
                    }
                },
            };
            match self
                .enqueue(record, value, message_key, &mut pending, &mut reports)
                .await
            {
                Ok(delivery) => pending.push_back((i, delivery)),
                Err(e) => reports[i] = Some(Err(e)),
            }
        }
        for (i, delivery) in pending {
            reports[i] = Some(outcome(delivery.await));
        }
        if reports.iter().any(|r| matches!(r, Some(Ok(())))) {
            self.outage.recovered();
        }
        match self.judge(records, reports) {
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

/// The message key `field` (a dotted path) gives in the JSON `value`: a
/// string's text, any other value as JSON.
fn key_from_field(value: &[u8], field: &str) -> Result<Vec<u8>, String> {
    let document: serde_json::Value = serde_json::from_slice(value)
        .map_err(|e| format!("key_field {field:?}: the value is not JSON: {e}"))?;
    let mut at = &document;
    for segment in field.split('.') {
        let next = match at {
            serde_json::Value::Object(map) => map.get(segment),
            serde_json::Value::Array(items) => {
                segment.parse::<usize>().ok().and_then(|i| items.get(i))
            }
            _ => None,
        };
        at = next.ok_or_else(|| format!("key_field {field:?}: the value has no such field"))?;
    }
    Ok(match at {
        serde_json::Value::String(s) => s.as_bytes().to_vec(),
        other => other.to_string().into_bytes(),
    })
}

impl KafkaSink {
    /// Turn the delivery reports of a batch into the write's outcome.
    fn judge(
        &self,
        records: &[Record],
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
            let class = classify(&source);
            let error = KafkaError::Produce {
                topic: self.config.topic.clone(),
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
    use super::key_from_field;

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
