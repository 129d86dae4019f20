//! The group source alone (no pipeline): assignment events, seeks on fresh
//! assignments, and a clean leave that commits through the revoke handler.

mod support;

use std::sync::Arc;
use std::time::Duration;

use etl_kafka::KafkaSource;
use etl_record::{Offset, PartitionId, SourceId};
use etl_source::{Source, SourceEvent};

use support::{CommitSeen, TestBroker, produce, source_config, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_every_partition_and_commits_on_leave() {
    let broker = TestBroker::start();
    let topic = unique("src");
    let group = unique("src-group");
    broker.create_topic(&topic, 4).await;
    produce(&broker, &topic, 10, 4).await;

    let mut source = KafkaSource::new(SourceId::new("k"), source_config(&broker, &group, &topic))
        .expect("source");
    let store = source.offset_store();
    let handler = CommitSeen {
        store: store.clone(),
        seen: Arc::default(),
        revoked: Arc::default(),
    };
    source.start(handler.clone()).expect("start");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut total = 0;
    while total < 40 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {total} of 40 records in 30 s"
        );
        match source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                let committed = store.load().expect("load");
                for id in ids {
                    let start = committed.get(&id).copied().unwrap_or(Offset(0));
                    source.seek(id, start).await.expect("seek");
                }
            }
            SourceEvent::Batch(batch) => {
                assert!(batch.records.len() <= 4);
                let last = batch.last_offset().expect("non-empty");
                let mut seen = handler.seen.lock().expect("lock");
                let expected = seen.get(&batch.partition).copied().unwrap_or(Offset(0));
                assert_eq!(batch.first_offset(), Some(expected), "no gap, no repeat");
                seen.insert(batch.partition, last.next());
                total += batch.records.len();
            }
            SourceEvent::Revoked(ids) => panic!("unexpected revoke of {ids:?}"),
            SourceEvent::Idle | SourceEvent::End => {}
        }
    }
    assert_eq!(total, 40);
    source.close().await;
    let mut revoked = handler.revoked.lock().expect("lock").clone();
    revoked.sort();
    let map = etl_kafka::PartitionMap::new(vec![topic.clone()]).expect("map");
    let mut all: Vec<PartitionId> = (0..4).map(|p| map.id(&topic, p).expect("mapped")).collect();
    all.sort();
    assert_eq!(revoked, all);
    assert_eq!(
        broker.committed(&group, &topic, 4),
        (0..4).map(|p| (p, 10)).collect()
    );
}

/// librdkafka keeps a paused partition paused across its revocation: a
/// partition paused (for backpressure, or by the pipeline's in-flight
/// limit) when the group took it away came back paused, and since its new
/// assignment starts with nothing paused in the pipeline's view, nothing
/// ever resumed it. Its records stopped flowing for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_paused_when_revoked_is_read_again_when_it_comes_back() {
    const PER_PARTITION: i32 = 10;
    let broker = TestBroker::start();
    let topic = unique("paused");
    let group = unique("paused-group");
    broker.create_topic(&topic, 2).await;
    produce(&broker, &topic, PER_PARTITION, 2).await;

    let start = |name: &str| {
        let mut source =
            KafkaSource::new(SourceId::new(name), source_config(&broker, &group, &topic))
                .expect("source");
        let handler = CommitSeen {
            store: source.offset_store(),
            seen: Arc::default(),
            revoked: Arc::default(),
        };
        source.start(handler).expect("start");
        source
    };

    // The first member gets both partitions and pauses them at once.
    let mut first = start("first");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut assigned = Vec::new();
    while assigned.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no assignment in 60 s"
        );
        if let SourceEvent::Assigned(ids) = first.next().await.expect("next") {
            first.pause(&ids).await.expect("pause");
            for id in ids {
                first.seek(id, Offset(0)).await.expect("seek");
                assigned.push(id);
            }
        }
    }

    // A second member takes one of them (still paused) away...
    let second = start("second");
    let moved = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no revocation in 60 s"
        );
        match first.next().await.expect("next") {
            SourceEvent::Revoked(ids) => break ids,
            SourceEvent::Batch(b) => panic!("a paused partition was read: {:?}", b.partition),
            _ => {}
        }
    };
    assert_eq!(moved.len(), 1, "one partition moves: {moved:?}");

    // ...and leaves: the partition comes back, and must be read.
    second.close().await;
    let mut read = 0;
    let mut back = false;
    while read < PER_PARTITION as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "partition {moved:?} came back: {back}; {read} of {PER_PARTITION} records read in 60 s"
        );
        match first.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                assert_eq!(ids, moved);
                back = true;
                first.seek(ids[0], Offset(0)).await.expect("seek");
            }
            SourceEvent::Batch(b) => {
                assert_eq!(b.partition, moved[0], "the partition still paused was read");
                read += b.records.len();
            }
            _ => {}
        }
    }
    first.close().await;
}
