//! The store going away under the `etl` command: Garage stopped and
//! started again (retried within the request bounds, every record once),
//! its bucket deleted or the key's right to write withdrawn (exit 74,
//! naming the sink, the bucket and a key, no secret; the stored progress
//! covers only what the objects hold).

use std::path::Path;
use std::time::Duration;

use etl_test_support::garage::Garage;

use crate::garage::garage_location;
use crate::process::{
    PARTITIONS, PER_PARTITION, assert_progress_covered, etl_binary, garage_store, start, tally,
    wait, write_pipeline,
};

/// Request bounds that outlast a restart of a few seconds.
const PATIENT: &str = r#"
max_retries = 20
retry_timeout = "60s"
initial_backoff = "100ms"
max_backoff = "1s"
timeout = "5s"
"#;

/// What the run printed on standard error.
fn stderr_of(dir: &Path, run: u32) -> String {
    std::fs::read_to_string(dir.join(format!("run-{run}.err"))).unwrap_or_default()
}

#[test]
fn garage_stopped_and_started_mid_run_is_retried_and_every_record_lands_once() {
    let mut server = Garage::start().unwrap();
    server.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write_pipeline(
        dir.path(),
        &garage_store(&server, "lake"),
        1_000,
        "",
        PATIENT,
    );
    assert!(etl_binary().is_file());
    let mut child = start(dir.path(), &config, 1);
    std::thread::sleep(Duration::from_secs(3));
    assert!(child.try_wait().unwrap().is_none(), "the run ended early");
    server.stop();
    std::thread::sleep(Duration::from_secs(4));
    server.restart().unwrap();
    let status = wait(&mut child, Duration::from_secs(120));
    let err = stderr_of(dir.path(), 1);
    assert!(status.success(), "{status}: {err}");
    assert!(!err.contains(server.secret()), "{err}");
    let (counts, progress) = tally(&garage_location(&server, "lake"));
    assert_progress_covered(&counts, &progress, "at the end");
    assert_eq!(counts.len() as i64, PARTITIONS * PER_PARTITION);
    assert!(counts.values().all(|&n| n == 1));
}

/// Run `etl` into Garage's bucket `lake`, call `outage` on the server
/// two seconds in, and return the run's exit code and standard error.
/// The run would last over a minute: an outage that takes long to bring
/// about on a loaded machine (a bucket emptied while it is written to)
/// still lands before the input ends.
fn halted_by(outage: impl FnOnce(&Garage)) -> (Garage, Option<i32>, String) {
    let server = Garage::start().unwrap();
    server.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rate = 200;
    let config = write_pipeline(dir.path(), &garage_store(&server, "lake"), rate, "", "");
    assert!(etl_binary().is_file());
    let mut child = start(dir.path(), &config, 1);
    std::thread::sleep(Duration::from_secs(2));
    assert!(child.try_wait().unwrap().is_none(), "the run ended early");
    outage(&server);
    let status = wait(&mut child, Duration::from_secs(60));
    let err = stderr_of(dir.path(), 1);
    assert!(!err.contains(server.secret()), "{err}");
    (server, status.code(), err)
}

#[test]
fn a_bucket_deleted_mid_run_halts_with_74_naming_sink_bucket_and_key() {
    let (_server, code, err) = halted_by(|server| {
        // Garage deletes empty buckets only: empty it (the pipeline keeps
        // writing) until the deletion goes through.
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let store = store_of(server, "lake");
        for attempt in 0.. {
            runtime.block_on(empty(&*store));
            if server.delete_bucket("lake").is_ok() {
                break;
            }
            assert!(attempt < 100, "the bucket could not be deleted");
        }
    });
    assert_eq!(code, Some(74), "{err}");
    for part in ["\"lake\"", "s3://lake/", "bucket does not exist"] {
        assert!(err.contains(part), "{part} in {err}");
    }
}

#[test]
fn a_write_right_withdrawn_mid_run_halts_with_74_and_the_progress_covers_only_stored_records() {
    let (server, code, err) = halted_by(|server| {
        server
            .cli(&[
                "bucket",
                "deny",
                "--write",
                "lake",
                "--key",
                server.key_id(),
            ])
            .unwrap();
    });
    assert_eq!(code, Some(74), "{err}");
    for part in ["\"lake\"", "s3://lake/", "credential"] {
        assert!(err.contains(part), "{part} in {err}");
    }
    let (counts, progress) = tally(&garage_location(&server, "lake"));
    assert!(!counts.is_empty() && (counts.len() as i64) < PARTITIONS * PER_PARTITION);
    assert_progress_covered(&counts, &progress, "after the halt");
}

/// The S3 store of `bucket` on `server`, as the sink builds it.
fn store_of(server: &Garage, bucket: &str) -> std::sync::Arc<dyn object_store::ObjectStore> {
    let config = crate::garage::garage_config(server, bucket, server.key_id(), server.secret());
    etl_object_store::ObjectStoreSink::new("cleaner", Path::new("."), config)
        .unwrap()
        .store()
}

/// Delete every object of `store`.
async fn empty(store: &dyn object_store::ObjectStore) {
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    let Ok(metas) = store.list(None).try_collect::<Vec<_>>().await else {
        return;
    };
    for meta in metas {
        let _ = store.delete(&meta.location).await;
    }
}

#[test]
fn a_run_stopped_by_sigterm_mid_run_leaves_no_unfinished_multipart_upload() {
    let server = Garage::start().unwrap();
    server.create_bucket("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Every object a multipart upload.
    let config = write_pipeline(
        dir.path(),
        &garage_store(&server, "lake"),
        1_000,
        "multipart_threshold = 1",
        "",
    );
    assert!(etl_binary().is_file());
    let mut child = start(dir.path(), &config, 1);
    std::thread::sleep(Duration::from_secs(3));
    assert!(child.try_wait().unwrap().is_none(), "the run ended early");
    let term = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = wait(&mut child, Duration::from_secs(60));
    let err = stderr_of(dir.path(), 1);
    assert!(status.success(), "{status}: {err}");
    assert_eq!(server.unfinished_multipart_uploads("lake").unwrap(), 0);
    let (counts, progress) = tally(&garage_location(&server, "lake"));
    assert!(!counts.is_empty() && (counts.len() as i64) < PARTITIONS * PER_PARTITION);
    assert_progress_covered(&counts, &progress, "after the stop");
}
