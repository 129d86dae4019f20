//! The runnable example `examples/postgres/` against a real server: the
//! orders land in the table, the two rows the database refuses are
//! dead-lettered with its reasons, and a second run adds nothing.

#![allow(clippy::unwrap_used)]

use crate::postgres_support;

use std::path::Path;
use std::time::Duration;

use postgres_support::{Etl, query, scalar, table};

#[test]
fn the_postgres_example_runs_and_a_second_run_adds_nothing() {
    let url = postgres_support::url();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/postgres");
    let config = std::fs::read_to_string(example.join("pipeline.toml")).unwrap();
    assert!(config.contains("table = \"orders\""));
    // A table of its own: the database is shared, and its progress too.
    let table = table("orders");
    let config = config.replace("table = \"orders\"", &format!("table = \"{table}\""));
    let mut etl = Etl::new(&url, &config).database_url(&url);
    let input = etl.dir.path().join("input");
    std::fs::create_dir(&input).unwrap();
    for entry in std::fs::read_dir(example.join("input")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), input.join(entry.file_name())).unwrap();
    }

    etl.run_to_end(Duration::from_secs(60));
    let count = format!("SELECT count(*) FROM \"{table}\"");
    assert_eq!(scalar(&url, &count), 911);
    let dead = std::fs::read_to_string(etl.dir.path().join("output/dead-letter.ndjson")).unwrap();
    let reasons: Vec<String> = dead
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"].to_string())
        .collect();
    assert_eq!(reasons.len(), 2, "{dead}");
    assert!(
        reasons.iter().any(|r| r.contains("timestamp")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("numeric field overflow")),
        "{reasons:?}"
    );
    let row = &query(
        &url,
        &format!("SELECT customer, total::text, sku, channel FROM \"{table}\" WHERE order_id = 0"),
    )[0];
    assert_eq!(row[2].as_deref(), Some("D-400"), "{row:?}");
    assert_eq!(row[3].as_deref(), Some("web"), "{row:?}");

    // A second run resumes at the commits: nothing is read again.
    etl.run_to_end(Duration::from_secs(60));
    assert!(etl.last_log().contains("\"read\":0"), "{}", etl.last_log());

    // Without the offset store, the files are read again, and the stored
    // progress skips every row: nothing is written twice.
    std::fs::remove_dir_all(etl.dir.path().join(".etl-state")).unwrap();
    etl.run_to_end(Duration::from_secs(60));
    assert_eq!(scalar(&url, &count), 911);
    assert!(
        etl.last_log().contains("\"written\":0"),
        "{}",
        etl.last_log()
    );
}
