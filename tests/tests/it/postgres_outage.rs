//! The `etl` binary writing to a PostgreSQL server that is stopped and
//! started again mid-run: the sink retries, says so at WARN, and nothing
//! is lost or duplicated.

#![allow(clippy::unwrap_used)]

use crate::postgres_support;

use std::time::{Duration, Instant};

use postgres_support::{CHECKPOINT, Etl, counts, generator, own_server, postgres_sink, table};

const PARTITIONS: u32 = 2;
const PER_PARTITION: u64 = 1_500;
const RATE: u64 = 2_000;

#[test]
fn a_server_restart_mid_run_loses_nothing() {
    // Its own server: stopping the shared one would break other tests.
    let server = own_server();
    let url = server.url();
    let table = table("outage");
    let config = format!(
        "{}{}{}batch_max_records = 100\nlinger = \"5ms\"\nretry = {{ max_elapsed = \"60s\" }}\n",
        generator(PARTITIONS, PER_PARTITION, RATE),
        CHECKPOINT,
        postgres_sink(
            &url,
            &table,
            "columns = [{ name = \"id\", type = \"bigint\" }, { name = \"ts\", type = \"bigint\" }]",
        ),
    );
    let expected = i64::from(PARTITIONS) * i64::try_from(PER_PARTITION).unwrap();
    let mut etl = Etl::new(&url, &config);
    let mut child = etl.spawn();

    // Stop the server once the pipeline is writing, well before its end.
    let deadline = Instant::now() + Duration::from_secs(60);
    while counts(&url, &table).0 == 0 {
        assert!(Instant::now() < deadline, "no rows: {}", etl.last_log());
        assert!(child.try_wait().unwrap().is_none(), "{}", etl.last_log());
        std::thread::sleep(Duration::from_millis(20));
    }
    server.stop().unwrap();
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "etl gave up while the server was down: {}",
        etl.last_log()
    );
    server.restart().unwrap();

    let ended = etl.wait(child, Duration::from_secs(90));
    assert!(ended.status.success(), "{}", ended.log);
    let (rows, keys, ids) = counts(&url, &table);
    assert_eq!(rows, expected, "row count against input count");
    assert_eq!(keys, rows, "an idempotency key repeats");
    assert_eq!(ids, rows, "a record id repeats");
    assert!(!ended.log.contains("panicked"), "{}", ended.log);
    // The outage is said at WARN: unavailable (with the server's reason),
    // then reachable again.
    let warns: Vec<&str> = ended
        .log
        .lines()
        .filter(|l| l.contains("\"level\":\"WARN\""))
        .collect();
    assert!(
        warns.iter().any(|l| l.contains("PostgreSQL unavailable")),
        "{}",
        ended.log
    );
    assert!(
        warns.iter().any(|l| l.contains("reachable again")),
        "{}",
        ended.log
    );
}
