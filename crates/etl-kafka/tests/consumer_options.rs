//! Consumer options against the real broker: where a partition without a
//! committed offset starts.

mod support;

use std::sync::Arc;
use std::time::Duration;

use etl_kafka::KafkaSource;
use etl_record::{Offset, SourceId};
use etl_source::{Source, SourceEvent};

use support::{CommitSeen, TestBroker, produce, source_config, unique};

/// A new group with `auto_offset_reset = "latest"` reads only what is
/// produced after it joined. The pipeline seeks every assigned partition
/// to what the offset store says (offset 0 when it says nothing), so the
/// store must resolve the reset point of a partition nothing was
/// committed for: a new group read the whole topic from 0 before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_reads_only_records_produced_after_joining() {
    let broker = TestBroker::start();
    let topic = unique("latest");
    let group = unique("latest-group");
    broker.create_topic(&topic, 1).await;
    produce(&broker, &topic, 5, 1).await;

    let mut config = source_config(&broker, &group, &topic);
    config.auto_offset_reset = "latest".to_owned();
    let mut source = KafkaSource::new(SourceId::new("k"), config).expect("source");
    let store = source.offset_store();
    source
        .start(CommitSeen {
            store: store.clone(),
            seen: Arc::default(),
            revoked: Arc::default(),
        })
        .expect("start");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut offsets = Vec::new();
    let mut produced = false;
    let mut idle_after_all = 0;
    while idle_after_all < 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "read {offsets:?} in 30 s"
        );
        match source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                // As the checkpointer does: the stored offset, else 0.
                let stored = store.load().expect("load");
                for id in ids {
                    let start = stored.get(&id).copied().unwrap_or(Offset(0));
                    source.seek(id, start).await.expect("seek");
                }
                if !produced {
                    produced = true;
                    produce(&broker, &topic, 3, 1).await;
                }
            }
            SourceEvent::Batch(batch) => {
                offsets.extend(batch.records.iter().map(|r| r.position.offset.0));
            }
            SourceEvent::Revoked(ids) => panic!("unexpected revoke of {ids:?}"),
            SourceEvent::Idle | SourceEvent::End => {
                if offsets.len() >= 3 {
                    idle_after_all += 1;
                }
            }
        }
    }
    let partition = source.partition_map().id(&topic, 0).expect("mapped");
    assert_eq!(
        source.high_watermark(partition),
        Some(Offset(8)),
        "the high watermark the broker reported with the last fetch"
    );
    source.close().await;
    assert_eq!(
        offsets,
        vec![5, 6, 7],
        "exactly the records produced after joining"
    );
}

/// Every record read carries the topic it was read from, so transforms
/// and sinks can tell the topics of one source apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_carry_their_topic() {
    let broker = TestBroker::start();
    let orders = unique("orders");
    let refunds = unique("refunds");
    let group = unique("topic-group");
    broker.create_topic(&orders, 2).await;
    broker.create_topic(&refunds, 2).await;
    produce(&broker, &orders, 3, 2).await;
    produce(&broker, &refunds, 2, 2).await;

    let mut config = source_config(&broker, &group, &orders);
    config.topics.push(refunds.clone());
    let mut source = KafkaSource::new(SourceId::new("k"), config).expect("source");
    let map = source.partition_map().clone();
    let store = source.offset_store();
    source
        .start(CommitSeen {
            store,
            seen: Arc::default(),
            revoked: Arc::default(),
        })
        .expect("start");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut per_topic = std::collections::BTreeMap::<String, usize>::new();
    while per_topic.values().sum::<usize>() < 10 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "read {per_topic:?} in 30 s"
        );
        match source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                for id in ids {
                    source.seek(id, Offset(0)).await.expect("seek");
                }
            }
            SourceEvent::Batch(batch) => {
                let (expected, _) = map.topic_partition(batch.partition).expect("mapped");
                for record in &batch.records {
                    assert_eq!(record.topic.as_deref(), Some(expected));
                }
                *per_topic.entry(expected.to_owned()).or_default() += batch.records.len();
            }
            SourceEvent::Revoked(ids) => panic!("unexpected revoke of {ids:?}"),
            SourceEvent::Idle | SourceEvent::End => {}
        }
    }
    source.close().await;
    assert_eq!(per_topic, [(orders, 6), (refunds, 4)].into_iter().collect());
}
