//! Records, batches and the driver, for every test.

use std::path::Path;

use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
use etl_object_store::ObjectStoreSinkConfig;
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::SinkHandle;
use etl_test_support::pyarrow::{self, Location};

/// A record of partition `p` at offset `o` with `value`.
pub(crate) fn record(p: u32, o: i64, value: &str) -> Record {
    Record::new(
        Position::new(SourceId::new("orders"), PartitionId(p), Offset(o)),
        value.to_owned(),
    )
}

/// Send each batch (records of one partition, in offset order) through
/// `driver`, close it, and return how each batch ended and the driver's
/// result.
pub(crate) async fn deliver(
    driver: SinkHandle,
    batches: Vec<Vec<Record>>,
) -> (Vec<AckStatus>, Result<(), String>) {
    let (acker, mut events) = etl_ack::channel();
    for (seq, records) in batches.into_iter().enumerate() {
        let first = records
            .first()
            .map(|r| r.position.clone())
            .unwrap_or_default();
        let last = records
            .last()
            .map(|r| r.position.clone())
            .unwrap_or_default();
        let meta = BatchMeta {
            id: BatchId {
                partition: first.partition,
                epoch: 1,
                seq: seq as u64,
            },
            first_offset: first.offset,
            last_offset: last.offset,
            records: records.len() as u32,
            bytes: records.iter().map(|r| r.value.len() as u64).sum(),
        };
        let ack = acker.open(meta).unwrap();
        if driver.send(Acked::new(records, ack)).await.is_err() {
            break;
        }
    }
    let closed = driver.close().await.map(drop).map_err(|e| e.to_string());
    let mut statuses = Vec::new();
    while let Ok(event) = events.try_next() {
        if let AckEvent::Resolved(message) = event {
            statuses.push(message.status);
        }
    }
    (statuses, closed)
}

/// A configuration from TOML.
pub(crate) fn config(text: &str) -> ObjectStoreSinkConfig {
    toml::from_str(text).unwrap()
}

/// Every object under `prefix` of the folder, as pyarrow reads it.
pub(crate) fn read_folder(
    folder: &Path,
    prefix: &str,
) -> Vec<(String, String, Vec<serde_json::Value>)> {
    pyarrow::read_objects(&Location::Folder(folder.to_path_buf()), prefix).unwrap()
}

/// Every row of `objects`, in key order.
pub(crate) fn rows(objects: &[(String, String, Vec<serde_json::Value>)]) -> Vec<serde_json::Value> {
    objects.iter().flat_map(|(_, _, r)| r.clone()).collect()
}
