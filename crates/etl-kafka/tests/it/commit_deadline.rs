//! Commits to the group are bounded: with the broker unreachable, a
//! commit fails after `commit_timeout` instead of waiting until the
//! broker comes back (it blocked a revocation, or a graceful stop, for as
//! long as the broker was down), and leaving the group is bounded too.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etl_kafka::{KafkaError, KafkaSource};
use etl_record::{Offset, SourceId};
use etl_source::{Source, SourceEvent};

use support::{CommitSeen, TestBroker, produce, source_config, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_with_the_broker_down_fails_at_its_deadline() {
    let mut broker = TestBroker::start();
    let topic = unique("deadline");
    let group = unique("deadline-group");
    broker.create_topic(&topic, 1).await;
    produce(&broker, &topic, 5, 1).await;

    let mut config = source_config(&broker, &group, &topic);
    config.commit_timeout = Duration::from_secs(1);
    let mut source = KafkaSource::new(SourceId::new("k"), config).expect("source");
    let store = source.offset_store();
    source
        .start(CommitSeen {
            store: store.clone(),
            seen: Arc::default(),
            revoked: Arc::default(),
        })
        .expect("start");

    // Join and read the records, so the partition is ours.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut read = 0;
    let mut partition = None;
    while read < 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{read} of 5 records read in 60 s"
        );
        match source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                source.seek(ids[0], Offset(0)).await.expect("seek");
                partition = Some(ids[0]);
            }
            SourceEvent::Batch(b) => read += b.records.len(),
            _ => {}
        }
    }
    let partition = partition.expect("assigned");
    let first = BTreeMap::from([(partition, Offset(2))]);
    let s = store.clone();
    tokio::task::spawn_blocking(move || s.commit(&first))
        .await
        .expect("commit thread")
        .expect("commit with the broker up");

    broker.kill();
    // Two commits in a row: the second also waits for the first, still
    // unanswered, within its own deadline.
    for next in [Offset(4), Offset(5)] {
        let offsets = BTreeMap::from([(partition, next)]);
        let s = store.clone();
        let commit = tokio::task::spawn_blocking(move || s.commit(&offsets));
        // A guard against the hang this test is about, far above the
        // commit timeout: not a measure of it.
        let result = tokio::time::timeout(Duration::from_secs(60), commit)
            .await
            .expect("the commit returned with the broker down")
            .expect("commit thread");
        match result {
            Err(KafkaError::CommitTimedOut { offsets, .. }) => {
                assert!(offsets.ends_with(&format!("@{next}")), "{offsets}");
            }
            other => panic!("expected a commit timeout, got {other:?}"),
        }
    }
    tokio::time::timeout(Duration::from_secs(60), source.close())
        .await
        .expect("the member left (or gave up on) the group with the broker down");
}
