//! Records, batches and the driver, for every test.

use std::time::Duration;

use etl_ack::{AckEvent, AckStatus, Acked, BatchId, BatchMeta};
use etl_http::{HttpSink, HttpSinkConfig};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::testing::MemorySink;
use etl_sink::{
    NdjsonEncoder, PermanentErrorPolicy, RetryPolicy, SinkDriver, SinkDriverConfig, SinkHandle,
};

/// A record of partition 0 at offset `o` with `value`.
pub(crate) fn record(o: i64, value: &str) -> Record {
    Record::new(
        Position::new(SourceId::new("in"), PartitionId(0), Offset(o)),
        value.to_owned(),
    )
}

/// `n` records `{"id":o}` cut into batches of `per_batch`.
pub(crate) fn batches(n: i64, per_batch: usize) -> Vec<Vec<Record>> {
    let all: Vec<Record> = (0..n)
        .map(|o| record(o, &format!("{{\"id\":{o}}}")))
        .collect();
    all.chunks(per_batch).map(<[Record]>::to_vec).collect()
}

/// A sink from TOML.
pub(crate) fn sink(text: &str) -> HttpSink {
    let config: HttpSinkConfig = toml::from_str(text).unwrap();
    HttpSink::new("svc", ".".as_ref(), config).unwrap()
}

/// A driver config: one record or `per_write` a write, quick retries for
/// a minute, `on_permanent_error = "dead_letter"`.
pub(crate) fn driver_config(per_write: usize, concurrency: usize) -> SinkDriverConfig {
    SinkDriverConfig {
        batch_max_records: per_write,
        linger: Duration::from_millis(1),
        concurrency,
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(200),
            max_elapsed: Duration::from_secs(60),
            max_retries: None,
        },
        on_permanent_error: PermanentErrorPolicy::DeadLetter,
        ..SinkDriverConfig::default()
    }
}

/// `sink` under a driver with `config` and a memory dead-letter sink.
pub(crate) fn drive(sink: HttpSink, config: SinkDriverConfig) -> (SinkHandle, MemorySink) {
    let letters = MemorySink::new();
    let driver = SinkDriver::new(sink, NdjsonEncoder::new())
        .config(config)
        .dead_letters(letters.clone())
        .spawn();
    (driver, letters)
}

/// Send each batch through `driver`, close it, and return how each batch
/// ended and the driver's result.
pub(crate) async fn deliver(
    driver: SinkHandle,
    batches: Vec<Vec<Record>>,
) -> (Vec<AckStatus>, Result<(), etl_sink::SinkDriverError>) {
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
    let closed = driver.close().await.map(drop);
    let mut statuses = Vec::new();
    while let Ok(event) = events.try_next() {
        if let AckEvent::Resolved(message) = event {
            statuses.push(message.status);
        }
    }
    (statuses, closed)
}

/// The ids of NDJSON lines `{"id":N,...}`.
pub(crate) fn ids(lines: &[String]) -> std::collections::BTreeSet<i64> {
    lines
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect()
}
