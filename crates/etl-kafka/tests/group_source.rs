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
    assert_eq!(revoked, (0..4).map(PartitionId).collect::<Vec<_>>());
    assert_eq!(
        broker.committed(&group, &topic, 4),
        (0..4).map(|p| (p, 10)).collect()
    );
}
