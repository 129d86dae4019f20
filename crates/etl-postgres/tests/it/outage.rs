//! The server stops and restarts while a pipeline writes: writes fail as
//! retryable, the driver retries on fresh connections, nothing is lost,
//! and WARN lines say what is happening (lost, retried with the server's
//! reason, reachable again).

// Helpers panic on failed queries: a panic there is a failed test.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etl_postgres::{PostgresSink, PostgresSinkConfig};
use etl_sink::{NdjsonEncoder, RetryPolicy, SinkDriver, SinkDriverConfig};
use support::{AckedBatches, client, counts, records, table};

const BATCHES: i64 = 20;
const PER_BATCH: i64 = 20;

/// Lines written by any thread of this test binary (its other modules'
/// tests included: the assertions keep the lines about this test's own
/// server).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        std::io::stderr().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_run_loses_nothing() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .unwrap();
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
        .config(SinkDriverConfig {
            batch_max_records: PER_BATCH as usize,
            linger: Duration::from_millis(1),
            retry: RetryPolicy {
                initial_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(300),
                max_elapsed: Duration::from_secs(60),
                max_retries: None,
            },
            ..SinkDriverConfig::default()
        })
        .spawn();
    let mut source = AckedBatches::new();
    let batch = |i: i64| records(0, i * PER_BATCH..(i + 1) * PER_BATCH);

    for i in 0..BATCHES / 2 {
        handle.send(source.batch_of(batch(i))).await.unwrap();
    }
    let stopping = server.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .unwrap()
        .unwrap();
    // Written while the server is down: every attempt fails until it is
    // back.
    for i in BATCHES / 2..BATCHES {
        handle.send(source.batch_of(batch(i))).await.unwrap();
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

    let log = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    // Every line about a connection names its target: this server's own
    // address keeps the other tests' lines out.
    let address = format!("127.0.0.1:{}/", server.port());
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains(&address))
        .collect();
    let said = |what: &str| warns.iter().any(|l| l.contains(what));
    assert!(said("PostgreSQL unavailable"), "{log}");
    assert!(said("retried"), "{log}");
    assert!(said("reachable again"), "{log}");
    // The server's reason is given (the refused connection).
    assert!(
        said("refused") || said("terminat") || said("shut") || said("closed"),
        "{log}"
    );
    // Rate-limited: a 0.5 s outage with fast retries says a few lines,
    // not one per attempt.
    assert!(warns.len() <= 6, "{} WARN lines:\n{log}", warns.len());
}
