//! Shared helpers of the integration tests: a real PostgreSQL server,
//! unique tables, records, and queries; acked batches are the test-support
//! crate's `AckedBatches`.
//!
//! The server is the one `ETL_TEST_POSTGRES` names (the `test` task starts
//! one), or else one this process starts with the same code as
//! `cargo xtask postgres`. It never skips: a missing server fails the test
//! with the reason.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicU64, Ordering};

use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use tokio_postgres::{Client, NoTls};

pub(crate) use etl_test_support::acks::AckedBatches;
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
