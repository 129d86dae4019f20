//! Consumer options against the real broker: where a partition without a
//! committed offset starts.

use crate::support;

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

/// A new group with `start_timestamp_ms` starts each partition where the
/// broker's offsets-for-times lookup puts that time (its first message at
/// or after it), and a partition of a group that committed resumes at its
/// commit. The test broker answers offset 0 to every lookup by time, so
/// this checks that the store asks the broker by time and applies its
/// answer, compared with the same lookup made directly; which offset a
/// time maps to is the broker's part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_timestamp_starts_a_new_group_where_the_broker_puts_that_time() {
    use rdkafka::consumer::{BaseConsumer, Consumer as _};
    use rdkafka::{Offset as KafkaOffset, TopicPartitionList};

    let broker = TestBroker::start();
    let topic = unique("by-time");
    broker.create_topic(&topic, 2).await;
    produce(&broker, &topic, 10, 2).await;
    let at = 1_700_000_006_000_i64;

    // The broker's own answer, asked directly.
    let direct: BaseConsumer = broker
        .consumer_config(&unique("by-time-direct"))
        .create()
        .expect("consumer");
    let mut ask = TopicPartitionList::new();
    for p in 0..2 {
        ask.add_partition_offset(&topic, p, KafkaOffset::Offset(at))
            .expect("add");
    }
    let answered = direct
        .offsets_for_times(ask, Duration::from_secs(10))
        .expect("offsets for times");
    let expected: Vec<i64> = (0..2)
        .map(|p| {
            match answered
                .find_partition(&topic, p)
                .expect("answered")
                .offset()
            {
                KafkaOffset::Offset(o) if o >= 0 => o,
                // Every message older: the store starts at the high
                // watermark.
                _ => {
                    direct
                        .fetch_watermarks(&topic, p, Duration::from_secs(10))
                        .expect("watermarks")
                        .1
                }
            }
        })
        .collect();

    let group = unique("by-time-group");
    let mut config = source_config(&broker, &group, &topic);
    config.start_timestamp_ms = Some(at);
    let source = KafkaSource::new(SourceId::new("k"), config).expect("source");
    let store = source.offset_store();
    let ids: Vec<_> = (0..2)
        .map(|p| source.partition_map().id(&topic, p).expect("mapped"))
        .collect();
    let stored = store.load().expect("load");
    for (p, id) in ids.iter().enumerate() {
        assert_eq!(
            stored.get(id),
            Some(&Offset(expected[p])),
            "partition {p}: where the broker puts the time"
        );
    }

    // A commit wins over the time for its partition only.
    let committed: etl_record::PartitionOffsets = [(ids[0], Offset(9))].into();
    store.commit(&committed).expect("commit");
    let stored = store.load().expect("load");
    assert_eq!(stored.get(&ids[0]), Some(&Offset(9)), "the commit");
    assert_eq!(
        stored.get(&ids[1]),
        Some(&Offset(expected[1])),
        "still by time"
    );
}
