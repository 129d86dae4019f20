//! Test support: the broker (`etl_test_support::kafka`), a revoke handler
//! that commits what was seen, producing test records and source settings.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etl_kafka::{GroupOffsetStore, KafkaSourceConfig, RevokeHandler};
use etl_record::{PartitionId, PartitionOffsets};
use rdkafka::producer::{FutureProducer, FutureRecord};

pub(crate) use etl_test_support::kafka::{TestBroker, unique};

/// Commits the next offset after everything seen, from another thread
/// (as the checkpointer does), when partitions are revoked.
#[derive(Clone)]
pub(crate) struct CommitSeen {
    pub(crate) store: GroupOffsetStore,
    pub(crate) seen: Arc<Mutex<PartitionOffsets>>,
    pub(crate) revoked: Arc<Mutex<Vec<PartitionId>>>,
}

impl RevokeHandler for CommitSeen {
    fn revoke_blocking(
        &self,
        partitions: Vec<PartitionId>,
    ) -> Result<PartitionOffsets, Box<dyn std::error::Error + Send + Sync>> {
        let seen = self.seen.lock().expect("lock").clone();
        let commit: BTreeMap<_, _> = seen
            .into_iter()
            .filter(|(p, _)| partitions.contains(p))
            .collect();
        self.revoked.lock().expect("lock").extend(partitions);
        let store = self.store.clone();
        let to_commit = commit.clone();
        std::thread::spawn(move || store.commit(&to_commit))
            .join()
            .expect("commit thread")?;
        Ok(commit)
    }
}

pub(crate) async fn produce(broker: &TestBroker, topic: &str, per_partition: i32, partitions: i32) {
    let producer: FutureProducer = broker.config().create().expect("producer");
    for i in 0..per_partition * partitions {
        let payload = format!("{{\"n\":{i}}}");
        producer
            .send(
                FutureRecord::<(), _>::to(topic)
                    .payload(&payload)
                    .partition(i % partitions),
                Duration::from_secs(10),
            )
            .await
            .expect("delivery");
    }
}

pub(crate) fn source_config(broker: &TestBroker, group: &str, topic: &str) -> KafkaSourceConfig {
    let mut c = KafkaSourceConfig::new(broker.addr(), group, vec![topic.to_owned()]);
    c.session_timeout = Duration::from_secs(6);
    c.heartbeat_interval = Duration::from_secs(1);
    c.max_batch_records = 4;
    c
}
