//! A graceful handover of an exactly-once partition: the old owner's
//! write that is still on its way when the partition is revoked must not
//! land after the new owner's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use etl_ack::{Acked, Acker, BatchId, BatchMeta};
use etl_checkpoint::{CheckpointConfig, CheckpointHandle, Checkpointer, MemoryStore};
use etl_object_store::ObjectStoreSink;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::{ProgressSink, RetryPolicy, SinkDriver, SinkDriverConfig, SinkHandle};
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use serde_json::json;

use crate::faults::FaultyStore;
use crate::support::{config, deliver, record};

const P: PartitionId = PartitionId(0);
const GUARD: Duration = Duration::from_secs(20);

const NDJSON: &str = r#"
    key = "orders/{partition}-{first_offset}.ndjson"
    [store]
    kind = "local"
    path = "unused"
    [encoding]
    format = "ndjson"
"#;

fn ids(from: i64, to: i64) -> Vec<Record> {
    (from..to)
        .map(|o| record(0, o, &json!({ "id": o }).to_string()))
        .collect()
}

/// Open a batch of `records` (one partition, in offset order) on the
/// checkpointer's channel, as a source driver does.
async fn open(
    acker: &Acker,
    checkpointer: &CheckpointHandle,
    epoch: u32,
    seq: u64,
    records: Vec<Record>,
) -> Acked<Vec<Record>> {
    let bytes: u64 = records.iter().map(|r| r.value.len() as u64).sum();
    checkpointer.budget().acquire(P, bytes).await;
    let meta = BatchMeta {
        id: BatchId {
            partition: P,
            epoch,
            seq,
        },
        first_offset: records[0].position.offset,
        last_offset: records[records.len() - 1].position.offset,
        records: records.len() as u32,
        bytes,
    };
    Acked::new(records, acker.open(meta).unwrap())
}

/// Every `id` in the folder's objects, in key order, and the objects'
/// keys.
fn stored(folder: &std::path::Path) -> (Vec<i64>, Vec<String>) {
    let dir = folder.join("orders");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".ndjson"))
        .collect();
    names.sort();
    let mut ids = Vec::new();
    for name in &names {
        for line in std::fs::read_to_string(dir.join(name)).unwrap().lines() {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            ids.push(value["id"].as_i64().unwrap());
        }
    }
    (ids, names)
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(GUARD, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("waited too long for {what}"));
}

/// The reproduction of the unfenced handover: two exactly-once sinks over
/// one folder. The old owner's write of offsets 10..15, slowed on its way
/// to the store, is under way when the partition is revoked; the new owner
/// then writes 10..20. Had the slow write landed after it, it would
/// replace the new owner's first object (same key) and set the progress
/// back to 15: offsets 15..19 in no object. Fenced, the revocation does
/// not hand the partition over while the write may land: the run halts
/// (here the test stops the old owner's sink, as the pipeline does), and
/// every offset ends up in exactly one object.
#[tokio::test]
async fn a_slow_write_of_a_revoked_partition_never_lands_after_the_next_owner_s() {
    let folder = tempfile::tempdir().unwrap();
    let local: Arc<dyn ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(folder.path()).unwrap());
    let slow = Arc::new(FaultyStore::new(local.clone()));

    // The old owner: a checkpointer with a short revoke deadline, and its
    // exactly-once sink on the slow way to the folder.
    let (acker, receiver) = etl_ack::channel();
    let checkpoint = CheckpointConfig {
        commit_interval: Duration::from_secs(3600),
        revoke_deadline: Duration::from_millis(100),
        ..CheckpointConfig::default()
    };
    let (checkpointer, _replays) =
        Checkpointer::spawn(checkpoint, Box::new(MemoryStore::new()), receiver).unwrap();
    let old = ObjectStoreSink::exactly_once_with_store("lake", config(NDJSON), slow.clone())
        .await
        .unwrap();
    let encoder = old.encoder();
    let (driver, _) = SinkDriver::exactly_once(old.clone(), encoder);
    let old_driver: SinkHandle = driver
        .config(SinkDriverConfig {
            retry: RetryPolicy::never(),
            ..SinkDriverConfig::default()
        })
        .spawn();
    let assigned = checkpointer
        .assign(vec![(P, Some(Offset(0)))])
        .await
        .unwrap();
    let epoch = assigned[0].epoch;

    let first = open(&acker, &checkpointer, epoch, 0, ids(0, 10)).await;
    old_driver.send(first).await.unwrap();
    wait_for("offsets 0..10 stored", || {
        old.progress().get(P) == Some(Offset(10))
    })
    .await;

    // Offsets 10..15 are on their way when the revocation begins.
    *slow.put_delay.lock().unwrap() = Duration::from_millis(500);
    let second = open(&acker, &checkpointer, epoch, 1, ids(10, 15)).await;
    old_driver.send(second).await.unwrap();
    wait_for("the slow PUT", || {
        slow.puts_slowed.load(Ordering::SeqCst) > 0
    })
    .await;
    let revoking = {
        let checkpointer = checkpointer.clone();
        tokio::spawn(async move { checkpointer.hand_over(vec![P]).await })
    };
    // What the pipeline does: a halt stops the sinks at once.
    let mut old_driver = Some(old_driver);
    tokio::time::timeout(GUARD, async {
        while !revoking.is_finished() {
            if checkpointer.is_halting()
                && let Some(driver) = old_driver.take()
            {
                driver.abort().await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the revocation ends");
    let revoked = revoking.await.unwrap();
    assert!(
        matches!(
            revoked,
            Err(etl_checkpoint::CheckpointError::RevokeUnsettled { .. })
        ),
        "the revocation halted the run: {revoked:?}"
    );

    // The new owner reads the progress from the store and writes on.
    let new = ObjectStoreSink::exactly_once_with_store("lake", config(NDJSON), local.clone())
        .await
        .unwrap();
    let start = new.progress().get(P).unwrap_or(Offset(0));
    let encoder = new.encoder();
    let (driver, _) = SinkDriver::exactly_once(new, encoder);
    let (statuses, closed) = deliver(driver.spawn(), vec![ids(start.0, 20)]).await;
    closed.unwrap();
    assert!(statuses.iter().all(|s| *s == etl_ack::AckStatus::Delivered));

    // Whatever the old owner still held has had time to land.
    tokio::time::sleep(Duration::from_millis(800)).await;
    if let Some(driver) = old_driver.take() {
        let _ = tokio::time::timeout(GUARD, driver.close()).await;
    }

    let (got, keys) = stored(folder.path());
    assert_eq!(
        got,
        (0..20).collect::<Vec<_>>(),
        "every offset in exactly one object (objects {keys:?})"
    );
    let fresh = ObjectStoreSink::exactly_once_with_store("lake", config(NDJSON), local)
        .await
        .unwrap();
    assert_eq!(fresh.progress().get(P), Some(Offset(20)), "the progress");
    let _ = checkpointer.shutdown().await;
}
