//! A pipeline read from a configuration file, with one more step in Rust.

use std::path::Path;

use bytes::Bytes;
use etl::{PipelineBuilder, Refused, map, pipeline_from_config};
use etl_record::Record;
use tokio_util::sync::CancellationToken;

fn config_text(dir: &Path) -> String {
    format!(
        r#"
[source]
type = "file"
paths = ["{dir}/in.ndjson"]

[[transforms]]
type = "filter"
field = "amount"
op = ">="
value = 10

[[sinks]]
name = "out"
type = "file"
path = "{dir}/out.ndjson"

[dead_letter]
type = "file"
path = "{dir}/dead.ndjson"

[checkpoint]
store = {{ type = "file", path = "{dir}/state" }}
"#,
        dir = dir.display()
    )
}

/// The Rust step: records with `"id":3` get a value that is not JSON.
fn breaks_id_3(mut record: Record) -> Result<Record, Refused> {
    if record.value.windows(6).any(|w| w == b"\"id\":3") {
        record.value = Bytes::from_static(b"not json {");
    } else {
        record
            .headers
            .push("seen-by", Some(Bytes::from_static(b"rust")));
    }
    Ok(record)
}

#[tokio::test]
async fn a_rust_step_runs_after_the_files_steps_and_its_non_json_is_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("in.ndjson"),
        "{\"id\":1,\"amount\":5}\n{\"id\":2,\"amount\":50}\n{\"id\":3,\"amount\":500}\n{\"id\":4,\"amount\":70}\n",
    )
    .unwrap();
    let config = etl::registry()
        .loader()
        .text(&config_text(dir.path()), dir.path())
        .unwrap();

    let summary = PipelineBuilder::from_config(&config)
        .await
        .unwrap()
        .transform(map("breaks id 3", breaks_id_3))
        .build()
        .unwrap()
        .run(CancellationToken::new())
        .await
        .unwrap();

    assert_eq!(summary.read, 4);
    // The file's filter ran first: id 1 never reached the Rust step.
    let out = std::fs::read_to_string(dir.path().join("out.ndjson")).unwrap();
    let ids: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, [2, 4], "{out}");
    // The value the Rust step made is not JSON: the NDJSON sink refused it
    // to the dead-letter path instead of writing it as a line of its file.
    let dead = std::fs::read_to_string(dir.path().join("dead.ndjson")).unwrap();
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(dead.contains("not json {"), "{dead}");
}

#[tokio::test]
async fn the_same_file_built_whole_gives_the_same_records_without_the_rust_step() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("in.ndjson"),
        "{\"id\":1,\"amount\":5}\n{\"id\":2,\"amount\":50}\n",
    )
    .unwrap();
    let config = etl::registry()
        .loader()
        .text(&config_text(dir.path()), dir.path())
        .unwrap();
    let summary = pipeline_from_config(&config)
        .await
        .unwrap()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((summary.read, summary.written()), (2, 1));
}
