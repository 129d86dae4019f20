//! Commit on revoke: partitions that move to another member, and a member
//! that leaves cleanly, are handed over at exactly the committed offsets,
//! so the successor reads nothing twice.

use crate::support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use etl_kafka::KafkaSource;
use etl_record::{Offset, PartitionId, SourceId};
use etl_source::{Source, SourceEvent};
use tokio::time::Instant;

use support::{CommitSeen, TestBroker, produce, source_config, unique};

const PARTITIONS: i32 = 4;
const PER_PARTITION: i32 = 25;

struct Member {
    source: KafkaSource,
    handler: CommitSeen,
    assigned: BTreeSet<PartitionId>,
}

impl Member {
    fn start(broker: &TestBroker, group: &str, topic: &str) -> Member {
        let mut config = source_config(broker, group, topic);
        config.max_batch_records = 3;
        let mut source = KafkaSource::new(SourceId::new("k"), config).expect("source");
        let handler = CommitSeen {
            store: source.offset_store(),
            seen: Arc::default(),
            revoked: Arc::default(),
        };
        source.start(handler.clone()).expect("start");
        Member {
            source,
            handler,
            assigned: BTreeSet::new(),
        }
    }

    /// Serve one event as the source driver would: seek new partitions
    /// to the group's committed offsets, record every batch as delivered.
    async fn step(&mut self, read: &mut Vec<(PartitionId, Offset)>) {
        match self.source.next().await.expect("next") {
            SourceEvent::Assigned(ids) => {
                let committed = self.handler.store.load().expect("load");
                for id in ids {
                    let start = committed.get(&id).copied().unwrap_or(Offset(0));
                    self.handler.seen.lock().expect("lock").insert(id, start);
                    self.source.seek(id, start).await.expect("seek");
                    self.assigned.insert(id);
                }
            }
            SourceEvent::Revoked(ids) => {
                for id in ids {
                    self.assigned.remove(&id);
                }
            }
            SourceEvent::Batch(batch) => {
                assert!(self.assigned.contains(&batch.partition));
                let mut seen = self.handler.seen.lock().expect("lock");
                let next = seen.get(&batch.partition).copied().unwrap_or(Offset(0));
                assert_eq!(
                    batch.first_offset(),
                    Some(next),
                    "partition {}",
                    batch.partition
                );
                for r in &batch.records {
                    read.push((batch.partition, r.position.offset));
                }
                if let Some(last) = batch.last_offset() {
                    seen.insert(batch.partition, last.next());
                }
            }
            SourceEvent::Idle | SourceEvent::End => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_and_departing_partitions_hand_over_without_duplicates() {
    let broker = TestBroker::start();
    let topic = unique("handover");
    let group = unique("handover-group");
    broker.create_topic(&topic, PARTITIONS).await;
    produce(&broker, &topic, PER_PARTITION, PARTITIONS).await;
    let total = usize::try_from(PER_PARTITION * PARTITIONS).expect("small");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut read = Vec::new();

    // A alone reads part of the topic, then stops taking input.
    let mut a = Member::start(&broker, &group, &topic);
    while read.len() < total / 4 {
        assert!(
            Instant::now() < deadline,
            "A read only {} records",
            read.len()
        );
        a.step(&mut read).await;
    }

    // B joins; the group moves some of A's partitions to B. A's revoke
    // callback commits what A delivered before B gets them.
    let mut b = Member::start(&broker, &group, &topic);
    while b.assigned.is_empty() {
        assert!(Instant::now() < deadline, "B got no partitions");
        b.step(&mut read).await;
    }
    // A catches up with the rebalance and both read on.
    let split = |a: &Member, b: &Member| {
        !a.assigned.is_empty()
            && !b.assigned.is_empty()
            && a.assigned.is_disjoint(&b.assigned)
            && a.assigned.len() + b.assigned.len() == 4
    };
    while read.len() < total / 2 || !split(&a, &b) {
        assert!(
            Instant::now() < deadline,
            "only {} records with two members",
            read.len()
        );
        a.step(&mut read).await;
        b.step(&mut read).await;
    }

    // A leaves cleanly; B takes everything over at A's commits.
    a.source.close().await;
    while read.len() < total {
        assert!(
            Instant::now() < deadline,
            "only {} of {total} records",
            read.len()
        );
        b.step(&mut read).await;
    }
    // Nothing more arrives.
    for _ in 0..5 {
        b.step(&mut read).await;
    }
    let unique_read: BTreeSet<_> = read.iter().copied().collect();
    assert_eq!(unique_read.len(), total, "every record read");
    assert_eq!(read.len(), total, "no record read twice");
    b.source.close().await;
    assert_eq!(
        broker.committed(&group, &topic, PARTITIONS),
        (0..PARTITIONS)
            .map(|p| (p, i64::from(PER_PARTITION)))
            .collect()
    );
}
