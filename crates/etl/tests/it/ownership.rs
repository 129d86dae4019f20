//! One pipeline per state, within one process too: a second pipeline built
//! on an offset store or an exactly-once output that a live one owns is
//! refused, and builds once the first is gone.

#![allow(clippy::unwrap_used)]

use std::path::Path;

use etl::PipelineError;
use etl_checkpoint::CheckpointError;
use tokio_util::sync::CancellationToken;

fn config(dir: &Path, name: &str, state: &str) -> etl::Config {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            r#"
[source]
type = "generator"
partitions = 2
records_per_partition = 500

[[sinks]]
type = "file"
path = "out.ndjson"
exactly_once = true

[checkpoint]
store = {{ type = "file", path = "{state}" }}
"#
        ),
    )
    .unwrap();
    etl::registry().loader().file(&path).unwrap()
}

#[tokio::test]
async fn a_second_pipeline_in_one_process_is_refused_while_the_first_lives() {
    let dir = tempfile::tempdir().unwrap();
    let same = config(dir.path(), "a.toml", "state");
    let first = etl::pipeline_from_config(&same).await.unwrap();

    let err = etl::pipeline_from_config(&same).await.unwrap_err();
    assert!(
        matches!(&err, PipelineError::Checkpoint(CheckpointError::Lock(e)) if e.is_in_use()),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("this process"), "{text}");

    // Another store, the same exactly-once output: the output's lock.
    let other = config(dir.path(), "b.toml", "other-state");
    let err = etl::pipeline_from_config(&other).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, PipelineError::Sink { .. }), "{text}");
    assert!(text.contains("out.ndjson.lock"), "{text}");

    drop(first);
    let again = etl::pipeline_from_config(&same).await.unwrap();
    let summary = again.run(CancellationToken::new()).await.unwrap();
    assert_eq!(summary.read, 1000);
}
