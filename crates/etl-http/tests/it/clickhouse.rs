//! A real receiver: ClickHouse's HTTP interface (Debian's
//! `clickhouse-server`, started on loopback by the test), fed by whole
//! pipelines from NDJSON files, and counted back with a query.

use std::path::Path;
use std::time::Duration;

use etl::Registry;
use etl_test_support::clickhouse;
use tokio_util::sync::CancellationToken;

/// `n` orders as NDJSON in `dir/input/orders.ndjson`.
fn write_orders(dir: &Path, n: i64) {
    std::fs::create_dir_all(dir.join("input")).unwrap();
    let lines: String = (1..=n)
        .map(|i| {
            format!(
                "{{\"id\":{i},\"user\":\"u{}\",\"amount\":{}.5}}\n",
                i % 7,
                i % 100
            )
        })
        .collect();
    std::fs::write(dir.join("input/orders.ndjson"), lines).unwrap();
}

/// The example's pipeline, against `url`, with `extra` sink options.
fn example(url: &str, dir: &Path, source_extra: &str, extra: &str) -> etl::Config {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/http_clickhouse/pipeline.toml");
    let text = std::fs::read_to_string(path).unwrap();
    // The example's own line of each key `extra` sets goes.
    let keys: Vec<String> = extra
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| format!("{k} = ")))
        .collect();
    let text: String = text
        .lines()
        .filter(|l| !keys.iter().any(|k| l.starts_with(k.as_str())))
        .map(|l| format!("{l}\n"))
        .collect();
    let text = text
        .replace("\n[dead_letter]", &format!("{extra}\n\n[dead_letter]"))
        .replace("\n[[sinks]]", &format!("{source_extra}\n\n[[sinks]]"));
    let url = url.to_owned();
    etl_http::register(Registry::new())
        .loader()
        .env(move |name| (name == "CLICKHOUSE_URL").then(|| url.clone()))
        .text(&text, dir)
        .unwrap()
}

const TABLE: &str =
    "CREATE TABLE orders (id Int64, user String, amount Float64) ENGINE = MergeTree ORDER BY id";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_inserts_every_record_into_clickhouse_and_counts_back_the_same() {
    let server = clickhouse::start().unwrap();
    server.query(TABLE).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_orders(dir.path(), 20_000);
    let config = example(&server.url(), dir.path(), "", "batch_max_records = 3000");
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    let expected: i64 = (1..=20_000).map(|i| i % 100).sum();
    let counted = server
        .query("SELECT count(), uniqExact(id), min(id), max(id), sum(amount - 0.5) FROM orders")
        .unwrap();
    assert_eq!(
        counted.trim(),
        format!("20000\t20000\t1\t20000\t{expected}")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clickhouse_restart_mid_run_loses_no_record() {
    let mut server = clickhouse::start().unwrap();
    server.query(TABLE).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_orders(dir.path(), 6_000);
    // 100 rows a request, 20 requests a second: a run of about 3 s, with
    // the server killed after 1 s and back 1 s later.
    let config = example(
        &server.url(),
        dir.path(),
        "max_batch_records = 100",
        "batch_max_records = 100\nlinger = \"5ms\"\nrate_limit = { requests_per_second = 20 }\n\
         [sinks.retry]\ninitial_backoff = \"50ms\"\nmax_backoff = \"500ms\"\nmax_elapsed = \"60s\"",
    );
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    let run = tokio::spawn(pipeline.run(CancellationToken::new()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = server.query("SELECT count() FROM orders").unwrap();
    let server = tokio::task::spawn_blocking(move || {
        server.restart(Duration::from_secs(1)).unwrap();
        server
    })
    .await
    .unwrap();
    run.await.unwrap().unwrap();
    let before: u64 = before.trim().parse().unwrap();
    assert!(
        before > 0 && before < 6_000,
        "{before} rows before the restart"
    );
    let counted = server
        .query("SELECT uniqExact(id), min(id), max(id), count() >= 6000 FROM orders")
        .unwrap();
    assert_eq!(
        counted.trim(),
        "6000\t1\t6000\t1",
        "rows lost across the restart"
    );
}
