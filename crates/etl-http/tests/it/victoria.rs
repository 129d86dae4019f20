//! A second real receiver: VictoriaMetrics' JSON-lines import
//! (`/api/v1/import`, Debian's `victoria-metrics` started on loopback by
//! the test), fed by a whole pipeline and exported back.

use std::collections::BTreeMap;

use etl::Registry;
use etl_test_support::victoria_metrics;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_sample_imported_into_victoria_metrics_is_exported_back() {
    let server = victoria_metrics::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("input")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let lines: String = (0..3000)
        .map(|i| {
            format!(
                "{{\"metric\":{{\"__name__\":\"orders\",\"id\":\"{i}\"}},\"values\":[{i}],\"timestamps\":[{now}]}}\n"
            )
        })
        .collect();
    std::fs::write(dir.path().join("input/samples.ndjson"), lines).unwrap();
    let text = format!(
        "[source]\ntype = \"file\"\npaths = [\"input/*.ndjson\"]\nformat = \"ndjson\"\nmax_batch_records = 250\n\n\
         [[sinks]]\ntype = \"http\"\nname = \"vm\"\nuri = \"{}/api/v1/import\"\ncompression = \"gzip\"\n\
         batch_max_records = 500\nrequest_concurrency = 2\nconcurrency = 2\n",
        server.url()
    );
    let config = etl_http::register(Registry::new())
        .loader()
        .text(&text, dir.path())
        .unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    // A sample VictoriaMetrics acknowledged (204) is searchable once its
    // in-memory parts are flushed and its new series indexed: poll.
    let started = std::time::Instant::now();
    let mut values: BTreeMap<String, f64> = BTreeMap::new();
    while values.len() < 3000 && started.elapsed() < std::time::Duration::from_secs(30) {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        server.get("/internal/force_flush").unwrap();
        let exported = server.get("/api/v1/export?match[]=orders").unwrap();
        values.clear();
        for line in exported.lines() {
            let series: serde_json::Value = serde_json::from_str(line).unwrap();
            let id = series["metric"]["id"].as_str().unwrap().to_owned();
            values.insert(id, series["values"][0].as_f64().unwrap());
        }
    }
    assert_eq!(values.len(), 3000, "series exported");
    assert!(
        values
            .iter()
            .all(|(id, v)| id.parse::<f64>().unwrap() == *v),
        "a sample's value differs from what was sent"
    );
}
