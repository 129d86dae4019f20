//! Kafka to Kafka: records read by the group source and written by the
//! producer sink through the sink driver all arrive, each with its
//! idempotency key.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
use etl_kafka::{KafkaSink, KafkaSinkConfig, KafkaSource};
use etl_record::{Offset, SourceId};
use etl_sink::{RawLinesEncoder, SinkDriver};
use etl_source::{Source, SourceEvent};
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use tokio::time::Instant;

use support::{CommitSeen, TestBroker, produce, source_config, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_arrives_at_least_once() {
    let broker = TestBroker::start();
    let input = unique("k2k-in");
    let output = unique("k2k-out");
    broker.create_topic(&input, 4).await;
    broker.create_topic(&output, 2).await;
    produce(&broker, &input, 30, 4).await;
    let deadline = Instant::now() + Duration::from_secs(60);

    let mut source = KafkaSource::new(
        SourceId::new("in"),
        source_config(&broker, &unique("k2k-group"), &input),
    )
    .expect("source");
    let handler = CommitSeen {
        store: source.offset_store(),
        seen: Arc::default(),
        revoked: Arc::default(),
    };
    source.start(handler.clone()).expect("start");
    let sink = KafkaSink::new(KafkaSinkConfig::new(broker.addr(), &output)).expect("sink");
    let driver = SinkDriver::new(sink, RawLinesEncoder::new()).spawn();
    let (acker, mut acks) = etl_ack::channel();

    let mut expected = BTreeSet::new();
    let mut seq = 0;
    while expected.len() < 120 {
        assert!(Instant::now() < deadline, "read {} of 120", expected.len());
        match source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                for id in ids {
                    source.seek(id, Offset(0)).await.expect("seek");
                }
            }
            SourceEvent::Batch(batch) => {
                let (first, last) = (batch.first_offset(), batch.last_offset());
                let meta = BatchMeta {
                    id: BatchId {
                        partition: batch.partition,
                        epoch: 1,
                        seq,
                    },
                    first_offset: first.unwrap_or(Offset(0)),
                    last_offset: last.unwrap_or(Offset(0)),
                    records: u32::try_from(batch.records.len()).expect("small"),
                    bytes: batch.byte_len(),
                };
                seq += 1;
                for r in &batch.records {
                    expected.insert(r.idempotency_key().to_string());
                }
                let ack = acker.open(meta).expect("receiver alive");
                driver
                    .send(Acked::new(batch.records, ack))
                    .await
                    .expect("driver alive");
            }
            SourceEvent::Revoked(_) | SourceEvent::Idle | SourceEvent::End => {}
        }
    }
    driver.close().await.expect("sink drained");
    let mut delivered = 0;
    while let Ok(event) = acks.try_next() {
        if let AckEvent::Resolved(msg) = event {
            assert_eq!(msg.status, AckStatus::Delivered);
            delivered += 1;
        }
    }
    assert_eq!(delivered, seq, "every batch delivered after its reports");
    source.close().await;

    let consumer: StreamConsumer = broker
        .consumer_config(&unique("k2k-check"))
        .create()
        .expect("consumer");
    consumer.subscribe(&[&output]).expect("subscribe");
    let mut arrived = BTreeSet::new();
    while arrived.len() < expected.len() {
        let m = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {} arrived", arrived.len(), expected.len()))
            .expect("consume");
        let key = m
            .headers()
            .and_then(|hs| hs.iter().find(|h| h.key == "etl-idempotency-key"))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .expect("idempotency header");
        arrived.insert(key);
    }
    assert_eq!(arrived, expected);
}
