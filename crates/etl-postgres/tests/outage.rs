//! The server stops and restarts while a pipeline writes: writes fail as
//! retryable, the driver retries on fresh connections, nothing is lost.

// Helpers panic on failed queries: a panic there is a failed test.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use etl_postgres::{PostgresSink, PostgresSinkConfig};
use etl_sink::{DriverConfig, NdjsonEncoder, RetryPolicy, SinkDriver};
use support::{TestSource, client, counts, records, table};

const BATCHES: i64 = 20;
const PER_BATCH: i64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_run_loses_nothing() {
    let server = Arc::new(
        tokio::task::spawn_blocking(support::own_server)
            .await
            .unwrap(),
    );
    let url = server.url();
    let name = table("outage");
    let config = PostgresSinkConfig::new(&url, &name)
        .column("id", "id", "bigint")
        .create_table(true);
    let sink = PostgresSink::connect(config).await.unwrap();
    let handle = SinkDriver::new(sink, NdjsonEncoder::new())
        .config(DriverConfig {
            max_records: PER_BATCH as usize,
            linger: Duration::from_millis(1),
            retry: RetryPolicy {
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(300),
                max_elapsed: Duration::from_secs(60),
                max_retries: None,
            },
            ..DriverConfig::default()
        })
        .spawn();
    let mut source = TestSource::new();
    let batch = |i: i64| records(0, i * PER_BATCH..(i + 1) * PER_BATCH);

    for i in 0..BATCHES / 2 {
        handle.send(source.batch(batch(i))).await.unwrap();
    }
    let stopping = server.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .unwrap()
        .unwrap();
    // Written while the server is down: every attempt fails until it is
    // back.
    for i in BATCHES / 2..BATCHES {
        handle.send(source.batch(batch(i))).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let restarting = server.clone();
    tokio::task::spawn_blocking(move || restarting.restart())
        .await
        .unwrap()
        .unwrap();

    let metrics = tokio::time::timeout(Duration::from_secs(120), handle.close())
        .await
        .expect("the driver finishes once the server is back")
        .unwrap();
    assert_eq!(metrics.batches_failed, 0);
    assert!(metrics.retries > 0, "the outage caused retries");
    assert_eq!(source.tally(), (BATCHES as usize, 0));
    let db = client(&url).await;
    assert_eq!(
        counts(&db, &name, "etl_key").await,
        (BATCHES * PER_BATCH, BATCHES * PER_BATCH)
    );
}
