//! The producer sink against a real broker: what a message carries, and
//! that acknowledgements follow delivery reports.

use crate::support;

use std::time::Duration;

use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
use etl_kafka::{KafkaSink, KafkaSinkConfig};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{EncodedBatch, RawLinesEncoder, Sink, SinkDriver, SinkError};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;

use support::{TestBroker, unique};

fn record(offset: i64, value: &str) -> Record {
    Record::new(
        Position::new(SourceId::new("orders"), PartitionId(2), Offset(offset)),
        value.to_owned(),
    )
}

fn sink_config(broker: &TestBroker, topic: &str) -> KafkaSinkConfig {
    let mut c = KafkaSinkConfig::new(broker.addr(), topic);
    c.message_timeout = Duration::from_secs(10);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_carry_key_headers_and_idempotency_key() {
    let broker = TestBroker::start();
    let topic = unique("sink");
    broker.create_topic(&topic, 1).await;
    let sink = KafkaSink::new(sink_config(&broker, &topic)).expect("sink");

    let records = vec![
        record(7, "first")
            .with_key(&b"k1"[..])
            .with_header("trace", &b"abc"[..]),
        record(8, "second"),
    ];
    let (batch, refused) = EncodedBatch::encode(records, &RawLinesEncoder::new());
    assert!(refused.is_empty());
    sink.write(&batch).await.expect("durable write");

    let consumer: StreamConsumer = broker
        .consumer_config(&unique("sink-check"))
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("messages within 30 s")
            .expect("consume");
        let headers: Vec<(String, Vec<u8>)> = m
            .headers()
            .map(|hs| {
                hs.iter()
                    .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        seen.push((
            m.key().map(<[u8]>::to_vec),
            m.payload().unwrap_or_default().to_vec(),
            headers,
        ));
    }
    assert_eq!(seen[0].0.as_deref(), Some(&b"k1"[..]));
    assert_eq!(
        seen[0].1, b"first",
        "the line encoder's newline is not part of the value"
    );
    assert_eq!(
        seen[0].2,
        vec![
            ("trace".to_owned(), b"abc".to_vec()),
            ("etl-idempotency-key".to_owned(), b"orders/2/7".to_vec()),
        ]
    );
    assert_eq!(seen[1].0, None);
    assert_eq!(seen[1].1, b"second");
    assert_eq!(
        seen[1].2,
        vec![("etl-idempotency-key".to_owned(), b"orders/2/8".to_vec())]
    );
}

/// Run one batch through a sink driver and return how its handle resolved.
async fn resolve_through_driver(sink: KafkaSink, records: Vec<Record>) -> AckStatus {
    let (acker, mut receiver) = etl_ack::channel();
    let id = BatchId {
        partition: PartitionId(2),
        epoch: 1,
        seq: 0,
    };
    let last = records.last().map_or(0, |r| r.position.offset.0);
    let ack = acker
        .open(BatchMeta {
            id,
            first_offset: Offset(0),
            last_offset: Offset(last),
            records: u32::try_from(records.len()).expect("small batch"),
            bytes: 0,
        })
        .expect("receiver alive");
    let driver = SinkDriver::new(sink, RawLinesEncoder::new()).spawn();
    driver
        .send(Acked::new(records, ack))
        .await
        .expect("driver alive");
    let _ = driver.close().await;
    loop {
        match receiver.try_next() {
            Ok(AckEvent::Resolved(msg)) => return msg.status,
            Ok(AckEvent::Opened(_)) => {}
            other => panic!("batch not resolved: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_is_delivered_only_when_every_report_succeeds() {
    let broker = TestBroker::start();
    let topic = unique("sink-acks");
    broker.create_topic(&topic, 1).await;

    let ok = KafkaSink::new(sink_config(&broker, &topic)).expect("sink");
    let records = (0..20).map(|o| record(o, "small")).collect();
    assert_eq!(
        resolve_through_driver(ok, records).await,
        AckStatus::Delivered
    );

    // One record over the producer's size limit: the others are written,
    // but the batch's handle fails (no dead-letter sink), so it replays.
    let mut config = sink_config(&broker, &topic);
    config
        .properties
        .insert("message.max.bytes".into(), "1000".into());
    let strict = KafkaSink::new(config).expect("sink");
    let mut records: Vec<Record> = (0..5).map(|o| record(o, "small")).collect();
    records.push(record(5, &"x".repeat(5_000)));
    assert_eq!(
        resolve_through_driver(strict, records).await,
        AckStatus::Failed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_classified() {
    let broker = TestBroker::start();
    let topic = unique("sink-errors");
    broker.create_topic(&topic, 1).await;

    let mut config = sink_config(&broker, &topic);
    config
        .properties
        .insert("message.max.bytes".into(), "1000".into());
    let strict = KafkaSink::new(config).expect("sink");
    let (too_big, _) =
        EncodedBatch::encode(vec![record(0, &"x".repeat(5_000))], &RawLinesEncoder::new());
    let err = strict.write(&too_big).await.expect_err("too large");
    assert!(
        matches!(&err, SinkError::Rejected(rejects) if rejects.len() == 1),
        "a message too large is the record's fault, even alone: {err}"
    );
    let (mixed, _) = EncodedBatch::encode(
        vec![
            record(0, "ok"),
            record(1, &"x".repeat(5_000)),
            record(2, "ok"),
        ],
        &RawLinesEncoder::new(),
    );
    match strict.write(&mixed).await {
        Err(SinkError::Rejected(rejects)) => {
            assert_eq!(rejects.len(), 1);
            assert_eq!(rejects[0].index, 1);
            assert!(
                rejects[0].reason.contains("orders/2/1"),
                "{}",
                rejects[0].reason
            );
        }
        other => panic!("expected a per-record reject, got {other:?}"),
    }

    // Nothing listens on this port: the report times out, which a later
    // attempt may not.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("port");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let mut config = KafkaSinkConfig::new(format!("127.0.0.1:{port}"), &topic);
    config.message_timeout = Duration::from_secs(1);
    let unreachable = KafkaSink::new(config).expect("sink");
    let (batch, _) = EncodedBatch::encode(vec![record(0, "x")], &RawLinesEncoder::new());
    let err = unreachable.write(&batch).await.expect_err("no broker");
    assert!(err.is_retryable(), "{err}");
}

/// `compression.type = zstd` on the producer: librdkafka is built with
/// zstd, the configuration validates, and what a consumer reads back is
/// byte for byte what was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zstd_compressed_batches_read_back_byte_for_byte() {
    let broker = TestBroker::start();
    let topic = unique("zstd");
    broker.create_topic(&topic, 1).await;
    let mut config = sink_config(&broker, &topic);
    config
        .properties
        .insert("compression.type".into(), "zstd".into());
    config.validate().expect("zstd is supported");
    let sink = KafkaSink::new(config).expect("sink");

    let values: Vec<String> = (0..50)
        .map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(200)))
        .collect();
    let records = values
        .iter()
        .enumerate()
        .map(|(i, v)| record(i64::try_from(i).expect("small"), v))
        .collect();
    let (batch, refused) = EncodedBatch::encode(records, &RawLinesEncoder::new());
    assert!(refused.is_empty());
    sink.write(&batch).await.expect("durable write");

    let consumer: StreamConsumer = broker
        .consumer_config(&unique("zstd-check"))
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut seen = Vec::new();
    while seen.len() < values.len() {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("messages within 30 s")
            .expect("consume");
        seen.push(String::from_utf8(m.payload().unwrap_or_default().to_vec()).expect("utf-8"));
    }
    assert_eq!(seen, values);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_field_keys_each_message_and_a_record_without_it_is_refused() {
    let broker = TestBroker::start();
    let topic = unique("sink-key-field");
    broker.create_topic(&topic, 1).await;
    let mut config = sink_config(&broker, &topic);
    config.key_field = Some("customer.id".to_owned());
    let sink = KafkaSink::new(config).expect("sink");

    let records = vec![
        record(1, r#"{"customer":{"id":"c-1"},"n":1}"#).with_key(&b"ignored"[..]),
        record(2, r#"{"customer":{},"n":2}"#),
        record(3, r#"{"customer":{"id":7},"n":3}"#),
    ];
    let (batch, refused) = EncodedBatch::encode(records, &RawLinesEncoder::new());
    assert!(refused.is_empty());
    match sink.write(&batch).await {
        Err(SinkError::Rejected(rejects)) => {
            assert_eq!(rejects.len(), 1, "{rejects:?}");
            assert_eq!(rejects[0].index, 1);
            assert!(rejects[0].reason.contains("customer.id"), "{rejects:?}");
        }
        other => panic!("the record without the field is refused: {other:?}"),
    }

    let consumer: StreamConsumer = broker
        .consumer_config(&unique("key-field-check"))
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut keys = Vec::new();
    while keys.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("messages within 30 s")
            .expect("consume");
        keys.push(m.key().map(<[u8]>::to_vec));
    }
    assert_eq!(keys, vec![Some(b"c-1".to_vec()), Some(b"7".to_vec())]);
}

/// The values of the first `n` messages of `topic`.
async fn read_values(broker: &TestBroker, topic: &str, n: usize) -> Vec<String> {
    let consumer: StreamConsumer = broker
        .consumer_config(&unique("topic-field-check"))
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut values = Vec::new();
    while values.len() < n {
        let m = tokio::time::timeout(Duration::from_secs(30), consumer.recv())
            .await
            .expect("messages within 30 s")
            .expect("consume");
        values.push(String::from_utf8(m.payload().unwrap_or_default().to_vec()).expect("utf-8"));
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_field_routes_each_message_and_refuses_what_names_no_topic_it_may_write() {
    let broker = TestBroker::start();
    let default = unique("sink-topic-default");
    let routed = unique("sink-topic-routed");
    broker.create_topic(&default, 1).await;
    broker.create_topic(&routed, 1).await;
    let mut config = sink_config(&broker, &default);
    config.topic_field = Some("route.to".to_owned());
    config.allowed_topics = vec!["sink-topic-routed*".to_owned()];
    config.message_timeout = Duration::from_secs(5);
    let sink = KafkaSink::new(config).expect("sink");

    let to_routed = format!(r#"{{"route":{{"to":"{routed}"}},"n":1}}"#);
    let records = vec![
        record(1, &to_routed),
        record(2, r#"{"n":2}"#),
        record(3, r#"{"route":{"to":"__consumer_offsets"},"n":3}"#),
        record(4, r#"{"route":{"to":42},"n":4}"#),
        record(5, &format!(r#"{{"route":{{"to":"{default}"}},"n":5}}"#)),
    ];
    let (batch, refused) = EncodedBatch::encode(records, &RawLinesEncoder::new());
    assert!(refused.is_empty());
    match sink.write(&batch).await {
        Err(SinkError::Rejected(rejects)) => {
            let indexes: Vec<usize> = rejects.iter().map(|r| r.index).collect();
            assert_eq!(indexes, vec![2, 3, 4], "{rejects:?}");
            assert!(rejects[0].reason.contains("internal topic"), "{rejects:?}");
            assert!(rejects[1].reason.contains("not a number"), "{rejects:?}");
            assert!(
                rejects[2].reason.contains("not among allowed_topics"),
                "{rejects:?}"
            );
        }
        other => panic!("the records naming no writable topic are refused: {other:?}"),
    }
    assert_eq!(read_values(&broker, &routed, 1).await, vec![to_routed]);
    assert_eq!(read_values(&broker, &default, 1).await, vec![r#"{"n":2}"#]);
}
