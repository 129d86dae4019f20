//! A row sink: it reads each batch's records, not the encoded bytes, so
//! it needs no encoder; `Unencoded` below gives the driver one that does
//! nothing.
//!
//! `OrdersTable` stands in for a database table keyed by each record's
//! idempotency key: a write is an upsert, so a replayed record replaces
//! its own row instead of adding a second one. Values that are not an
//! order are rejected one by one (they go to the dead-letter sink) after
//! every other row of the batch is stored.
//!
//! Run it with `cargo run -p etl-sink --example row_sink`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::BytesMut;
use etl_ack::{Acked, BatchId, BatchMeta};
use etl_record::{IdempotencyKey, Offset, PartitionId, Position, Record, SourceId};
use etl_sink::testing::MemorySink;
use etl_sink::{EncodedBatch, Encoder, Reject, Sink, SinkDriver, SinkError};
use serde::Deserialize;

// ANCHOR: sink
/// The encoder of a sink that reads `records()`: it writes no bytes, so
/// the driver copies nothing.
#[derive(Debug, Clone, Copy)]
pub struct Unencoded;

impl Encoder for Unencoded {
    fn encode(&self, _: &Record, _: &mut BytesMut) -> Result<(), SinkError> {
        Ok(())
    }
}

/// One row.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Order {
    /// Order id.
    pub id: u64,
    /// Amount.
    pub amount: f64,
}

/// Rows keyed by the idempotency key (`source/partition/offset`).
#[derive(Debug, Default)]
pub struct OrdersTable {
    rows: Mutex<BTreeMap<IdempotencyKey, Order>>,
}

#[async_trait]
impl Sink for OrdersTable {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut rows = Vec::with_capacity(batch.len());
        let mut rejects = Vec::new();
        for (index, record) in batch.records().iter().enumerate() {
            match serde_json::from_slice::<Order>(&record.value) {
                Ok(order) => rows.push((record.idempotency_key(), order)),
                Err(e) => rejects.push(Reject::new(index, format!("not an order: {e}"))),
            }
        }
        // An upsert of the good rows, durable (here: in the map) before
        // any reject is reported, since a reject report promises that the
        // rest of the batch is stored.
        self.rows
            .lock()
            .map_err(|_| SinkError::permanent("orders table poisoned"))?
            .extend(rows);
        if rejects.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejects))
        }
    }
}
// ANCHOR_END: sink

impl OrdersTable {
    /// The stored rows, in key order.
    pub fn rows(&self) -> Vec<Order> {
        self.rows
            .lock()
            .map(|rows| rows.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// Send one batch twice (the second time as a replay); returns the
/// stored rows and the dead letters.
pub async fn run() -> Result<(Vec<Order>, Vec<u8>), Box<dyn std::error::Error + Send + Sync>> {
    let (acker, _events) = etl_ack::channel();
    let table = std::sync::Arc::new(OrdersTable::default());
    let dead_letters = MemorySink::new();
    let sink = SinkDriver::new(table.clone(), Unencoded)
        .dead_letters(dead_letters.clone())
        .spawn();
    for seq in 0..2 {
        let ack = acker.open(BatchMeta {
            id: BatchId {
                partition: PartitionId(0),
                epoch: 1 + seq,
                seq: 0,
            },
            first_offset: Offset(0),
            last_offset: Offset(2),
            records: 3,
            bytes: 0,
        })?;
        let records = [
            r#"{"id":1,"amount":9.5}"#,
            "oops",
            r#"{"id":2,"amount":12}"#,
        ]
        .iter()
        .zip(0..)
        .map(|(v, o)| {
            let at = Position::new(SourceId::new("orders"), PartitionId(0), Offset(o));
            Record::new(at, *v)
        })
        .collect();
        sink.send(Acked::new(records, ack)).await?;
    }
    sink.close().await?;
    Ok((table.rows(), dead_letters.bytes()))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (rows, dead) = run().await?;
    println!("rows: {rows:?}");
    print!("dead letters: {}", String::from_utf8_lossy(&dead));
    Ok(())
}
