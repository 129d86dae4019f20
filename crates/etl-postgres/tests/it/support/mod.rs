//! Shared helpers of the integration tests: a real PostgreSQL server,
//! unique tables, records, acked batches, and queries.
//!
//! The server is the one `ETL_TEST_POSTGRES` names (the `test` task starts
//! one), or else one this process starts with the same code as
//! `cargo xtask postgres`. It never skips: a missing server fails the test
//! with the reason.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};

use etl_ack::{AckEvent, AckMsg, AckReceiver, AckStatus, Acked, Acker, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use tokio_postgres::{Client, NoTls};

#[allow(unused_imports)]
pub(crate) use etl_test_support::postgres::CERT_USER;
pub(crate) use etl_test_support::postgres::Postgres;

/// The URL of the shared test server, starting it on first use.
pub fn url() -> String {
    etl_test_support::postgres::shared_url()
}

/// A server of this test's own (for stopping and restarting it).
pub fn own_server() -> Postgres {
    etl_test_support::postgres::start()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL server: {e}"))
}

/// A table name no other test uses.
pub fn table(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A plain client for checking what the sink wrote.
pub async fn client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"));
    tokio::spawn(connection);
    client
}

/// `SELECT count(*), count(DISTINCT <column>) FROM <table>`.
pub async fn counts(client: &Client, table: &str, column: &str) -> (i64, i64) {
    let row = client
        .query_one(
            &format!("SELECT count(*), count(DISTINCT \"{column}\") FROM \"{table}\""),
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// A record of source `src` with a JSON value.
pub fn record(partition: u32, offset: i64, value: impl Into<String>) -> Record {
    Record::new(
        Position::new(SourceId::new("src"), PartitionId(partition), Offset(offset)),
        value.into(),
    )
}

/// `{"id": <offset>, "name": "n<offset>"}` for each offset.
pub fn records(partition: u32, offsets: std::ops::Range<i64>) -> Vec<Record> {
    offsets
        .map(|o| record(partition, o, format!("{{\"id\":{o},\"name\":\"n{o}\"}}")))
        .collect()
}

/// Opens batches the way a source driver does and collects resolutions.
#[derive(Debug)]
pub struct TestSource {
    acker: Acker,
    receiver: AckReceiver,
    seq: u64,
}

impl TestSource {
    pub fn new() -> Self {
        let (acker, receiver) = etl_ack::channel();
        TestSource {
            acker,
            receiver,
            seq: 0,
        }
    }

    /// One poll batch of the given records (all of one partition).
    pub fn batch(&mut self, records: Vec<Record>) -> Acked<Vec<Record>> {
        let first = records.first().map_or(0, |r| r.position.offset.0);
        let last = records.last().map_or(0, |r| r.position.offset.0);
        let partition = records
            .first()
            .map_or(PartitionId(0), |r| r.position.partition);
        let id = BatchId {
            partition,
            epoch: 1,
            seq: self.seq,
        };
        self.seq += 1;
        let ack = self
            .acker
            .open(BatchMeta {
                id,
                first_offset: Offset(first),
                last_offset: Offset(last),
                records: u32::try_from(records.len()).unwrap(),
                bytes: records.iter().map(|r| r.byte_len() as u64).sum(),
            })
            .expect("receiver alive");
        Acked::new(records, ack)
    }

    /// Every resolution received so far.
    pub fn resolutions(&mut self) -> Vec<AckMsg> {
        let mut out = Vec::new();
        while let Ok(event) = self.receiver.try_next() {
            if let AckEvent::Resolved(msg) = event {
                out.push(msg);
            }
        }
        out
    }

    /// Resolutions so far: (delivered, failed).
    pub fn tally(&mut self) -> (usize, usize) {
        let all = self.resolutions();
        let delivered = all
            .iter()
            .filter(|m| m.status == AckStatus::Delivered)
            .count();
        (delivered, all.len() - delivered)
    }
}
