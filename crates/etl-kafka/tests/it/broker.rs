//! The test broker speaks enough Kafka for this crate: topics with several
//! partitions, produce, and a consumer group with committed offsets.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};

use support::{TestBroker, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_partitions_produce_and_group_consume() {
    let broker = TestBroker::start();
    let topic = unique("smoke");
    broker.create_topic(&topic, 4).await;

    let producer: FutureProducer = broker
        .config()
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for i in 0..40i32 {
        let payload = format!("v{i}");
        producer
            .send(
                FutureRecord::<(), _>::to(&topic)
                    .payload(&payload)
                    .partition(i % 4),
                Duration::from_secs(10),
            )
            .await
            .expect("delivery");
    }

    let consumer: StreamConsumer = broker
        .consumer_config(&unique("smoke-group"))
        .create()
        .expect("consumer");
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut per_partition = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while per_partition.values().sum::<usize>() < 40 {
        let message = tokio::time::timeout_at(deadline, consumer.recv())
            .await
            .expect("40 records within 30 s")
            .expect("consume");
        *per_partition.entry(message.partition()).or_insert(0usize) += 1;
    }
    assert_eq!(
        per_partition,
        BTreeMap::from([(0, 10), (1, 10), (2, 10), (3, 10)])
    );
    consumer
        .commit_consumer_state(CommitMode::Sync)
        .expect("commit");
    let committed = consumer
        .committed(Duration::from_secs(10))
        .expect("committed offsets");
    for element in committed.elements() {
        assert_eq!(element.offset(), rdkafka::Offset::Offset(10), "{element:?}");
    }
}
