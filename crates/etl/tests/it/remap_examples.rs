//! The VRL examples in `examples/` run as tests: every output record is
//! checked byte for byte, and every dead letter by its reason.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

/// Copy `examples/<name>` to a fresh folder, run its pipeline there, and
/// return the folder with the run's outputs.
async fn run_example(name: &str) -> (tempfile::TempDir, etl::Summary) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name);
    let dir = tempfile::tempdir().unwrap();
    copy(&from, dir.path());
    let config = etl::registry()
        .loader()
        .file(&dir.path().join("pipeline.toml"))
        .unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    let summary = pipeline.run(CancellationToken::new()).await.unwrap();
    (dir, summary)
}

fn copy(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target: PathBuf = to.join(path.file_name().unwrap());
        if path.is_dir() {
            if path.ends_with("output") || path.ends_with(".etl-state") {
                continue;
            }
            std::fs::create_dir_all(&target).unwrap();
            copy(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn remap_amounts_adds_cents_to_the_payments_it_keeps() {
    let (dir, summary) = run_example("remap_amounts").await;
    assert_eq!(
        lines(&dir.path().join("output/payments.ndjson")),
        [
            r#"{"id":1,"user":"u-001","amount":12.5,"currency":"EUR","ts":"2026-03-01T10:00:00Z","amount_cents":1250}"#,
            r#"{"id":3,"user":"u-003","amount":1,"currency":"USD","ts":"2026-03-01T10:00:02Z","amount_cents":100}"#,
            r#"{"id":4,"user":"u-004","amount":0.29e1,"currency":"USD","ts":"2026-03-01T10:00:03Z","amount_cents":290}"#,
            r#"{"id":7,"user":"u-007","amount":1999.99,"currency":"JPY","ts":"2026-03-01T10:00:06Z","amount_cents":199999}"#,
            r#"{"id":8,"user":"u-008","amount":1.005,"currency":"EUR","ts":"2026-03-01T10:00:07Z","amount_cents":100}"#,
        ]
    );
    assert!(lines(&dir.path().join("output/dead-letter.ndjson")).is_empty());
    assert_eq!(summary.dead_lettered, 0);
    assert_eq!((summary.read, summary.filtered), (8, 3));
}

#[tokio::test]
async fn remap_orders_totals_the_paid_orders_and_drops_the_email() {
    let (dir, summary) = run_example("remap_orders").await;
    assert_eq!(
        lines(&dir.path().join("output/orders.ndjson")),
        [
            r#"{"id":101,"order":{"status":"paid","items":[{"sku":"A-1","qty":2,"price":9.99},{"sku":"B-7","qty":1,"price":0.5},{"sku":"C-3","qty":3,"price":1.1}]},"customer":{"name":"Zoë \"Z\" Adler","tier":1},"note":"première\ncommande","total_cents":2378}"#,
            r#"{"id":103,"order":{"status":"paid","items":[{"sku":"D-9","qty":10,"price":12345678.91}]},"customer":{"name":"山田 太郎","tier":3},"note":"\u00e9t\u00e9","total_cents":12345678910}"#,
            r#"{"id":104,"order":{"status":"paid","items":[]},"customer":{"name":"Empty","tier":1.0e0},"note":null,"total_cents":0}"#,
        ]
    );
    let dead = lines(&dir.path().join("output/dead-letter.ndjson"));
    assert_eq!(dead.len(), 2, "{dead:#?}");
    let letters: Vec<serde_json::Value> = dead
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let text = |v: &serde_json::Value| v.to_string();
    assert!(text(&letters[0]).contains("Bad Qty"), "{dead:#?}");
    assert!(text(&letters[0]).contains("to_float"), "{dead:#?}");
    assert!(text(&letters[1]).contains("Bad Items"), "{dead:#?}");
    assert!(text(&letters[1]).contains("array"), "{dead:#?}");
    assert_eq!((summary.read, summary.filtered), (7, 2));
}

#[tokio::test]
async fn a_runtime_error_halts_the_run_when_drop_on_error_is_false() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("in.ndjson"),
        "{\"s\":\"1\"}\n{\"s\":\"x\"}\n{\"s\":\"3\"}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("pipeline.toml"),
        r#"
[source]
type = "file"
paths = ["in.ndjson"]

[[transforms]]
type = "remap"
source = '.n = to_int!(.s)'
drop_on_error = false

[[sinks]]
type = "file"
path = "out.ndjson"

[dead_letter]
type = "file"
path = "dead.ndjson"
"#,
    )
    .unwrap();
    let config = etl::registry()
        .loader()
        .file(&dir.path().join("pipeline.toml"))
        .unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
    assert!(
        matches!(&err, etl::PipelineError::TransformHalted { reason, .. } if reason.contains("to_int")),
        "{err}"
    );
    assert!(lines(&dir.path().join("dead.ndjson")).is_empty());
}
