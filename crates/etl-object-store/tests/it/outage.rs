//! The store going away under the `etl` command: Garage stopped and
//! started again (retried within the request bounds, every record once);
//! stopped for good, then a SIGTERM (the stop bounded by
//! `shutdown_timeout`, exit 1); its bucket deleted or the key's right to
//! write withdrawn (exit 74, naming the sink, the bucket and a key, no
//! secret; the stored progress covers only what the objects hold);
//! refusing the sink from the start (a wrong secret, an unknown key, a
//! missing bucket, a wrong region: exit 74 as well); and a store that
//! does not answer at the start or holds a progress object that does
//! not parse (exit 1: not the configuration's error).

use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::Duration;

use etl_test_support::garage::Garage;

use crate::garage::garage_location;
use crate::process::{
    PARTITIONS, PER_PARTITION, assert_progress_covered, etl_binary, garage_store, start, tally,
    write_pipeline,
};
use etl_test_support::{run_stderr, wait_exit};

/// Request bounds that outlast a restart of a few seconds.
const PATIENT: &str = r#"
max_retries = 20
retry_timeout = "60s"
initial_backoff = "100ms"
max_backoff = "1s"
timeout = "5s"
"#;

/// One run of `etl` into Garage's bucket `lake`, under way.
struct Running {
    server: Garage,
    dir: tempfile::TempDir,
    child: Child,
}

impl Running {
    /// Start Garage and a run of `etl` into its bucket `lake` (`rate`
    /// records a second, `sink` and `requests` lines as
    /// [`write_pipeline`] takes them), and let it run for `first`.
    fn start(rate: u64, sink: &str, requests: &str, first: Duration) -> Running {
        Running::start_edited(rate, sink, requests, first, |text| text)
    }

    /// [`Running::start`], with the pipeline's text as `edit` returns it.
    fn start_edited(
        rate: u64,
        sink: &str,
        requests: &str,
        first: Duration,
        edit: impl FnOnce(String) -> String,
    ) -> Running {
        let server = Garage::start().unwrap();
        server.create_bucket("lake").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = garage_store(&server, "lake");
        let config = write_pipeline(dir.path(), &store, rate, sink, requests);
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, edit(text)).unwrap();
        assert!(etl_binary().is_file());
        let mut child = start(dir.path(), &config, 1);
        std::thread::sleep(first);
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        Running { server, dir, child }
    }

    /// Wait for the run's end (at most `limit`): its status and standard
    /// error, which holds no secret.
    fn end(&mut self, limit: Duration) -> (ExitStatus, String) {
        let status = wait_exit(&mut self.child, limit).unwrap();
        let err = run_stderr(self.dir.path(), 1);
        assert!(!err.contains(self.server.secret()), "{err}");
        (status, err)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn garage_stopped_and_started_mid_run_is_retried_and_every_record_lands_once() {
    let mut run = Running::start(1_000, "", PATIENT, Duration::from_secs(3));
    let server = &mut run.server;
    server.stop();
    std::thread::sleep(Duration::from_secs(4));
    server.restart().unwrap();
    let (status, err) = run.end(Duration::from_secs(120));
    assert!(status.success(), "{status}: {err}");
    let (counts, progress) = tally(&garage_location(&run.server, "lake"));
    assert_progress_covered(&counts, &progress, "at the end");
    assert_eq!(counts.len() as i64, PARTITIONS * PER_PARTITION);
    assert!(counts.values().all(|&n| n == 1));
}

/// Run `etl` into Garage's bucket `lake`, call `outage` on the server
/// two seconds in, and return the run, its exit code and standard error.
/// The run would last over a minute: an outage that takes long to bring
/// about on a loaded machine (a bucket emptied while it is written to)
/// still lands before the input ends.
fn halted_by(outage: impl FnOnce(&Garage)) -> (Running, Option<i32>, String) {
    let mut run = Running::start(200, "", "", Duration::from_secs(2));
    outage(&run.server);
    let (status, err) = run.end(Duration::from_secs(60));
    (run, status.code(), err)
}

#[test]
fn a_bucket_deleted_mid_run_halts_with_74_naming_sink_bucket_and_key() {
    let (_run, code, err) = halted_by(|server| {
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
    let (run, code, err) = halted_by(|server| {
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
    let (counts, progress) = tally(&garage_location(&run.server, "lake"));
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
    // Every object a multipart upload.
    let mut run = Running::start(1_000, "multipart_threshold = 1", "", Duration::from_secs(3));
    let term = std::process::Command::new("kill")
        .args(["-TERM", &run.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let (status, err) = run.end(Duration::from_secs(60));
    assert!(status.success(), "{status}: {err}");
    let server = &run.server;
    assert_eq!(server.unfinished_multipart_uploads("lake").unwrap(), 0);
    let (counts, progress) = tally(&garage_location(server, "lake"));
    assert!(!counts.is_empty() && (counts.len() as i64) < PARTITIONS * PER_PARTITION);
    assert_progress_covered(&counts, &progress, "after the stop");
}

#[test]
fn at_start_a_wrong_secret_an_unknown_key_a_missing_bucket_or_a_wrong_region_exit_74_naming_sink_and_bucket()
 {
    let server = Garage::start().unwrap();
    server.create_bucket("lake").unwrap();
    let good = garage_store(&server, "lake");
    let wrong_secret = "0".repeat(server.secret().len());
    let cases = [
        (
            "a wrong secret key",
            good.replace(server.secret(), &wrong_secret),
            "credential",
        ),
        (
            "a key id the server does not know",
            good.replace(server.key_id(), "GK000000000000000000000000"),
            "credential",
        ),
        (
            "a bucket that does not exist",
            garage_store(&server, "no-such-lake"),
            "bucket does not exist",
        ),
        (
            "a region the server is not",
            good.replace(etl_test_support::garage::REGION, "eu-west-9"),
            "",
        ),
    ];
    let mut failures = Vec::new();
    for (name, store, reason) in cases {
        let dir = tempfile::tempdir().unwrap();
        let config = write_pipeline(dir.path(), &store, 1_000, "", "");
        let mut child = start(dir.path(), &config, 1);
        let status = wait_exit(&mut child, Duration::from_secs(90)).unwrap();
        let err = run_stderr(dir.path(), 1);
        let bucket = if name.contains("bucket") {
            "no-such-lake"
        } else {
            "lake"
        };
        if status.code() != Some(74) {
            failures.push(format!("{name}: exited {status}, not 74: {err}"));
        }
        for part in ["\"lake\"", &format!("s3://{bucket}/"), reason] {
            if !err.contains(part) {
                failures.push(format!("{name}: no {part:?} in {err}"));
            }
        }
        for secret in [server.secret(), wrong_secret.as_str()] {
            if err.contains(secret) {
                failures.push(format!("{name}: the secret in {err}"));
            }
        }
    }
    // The sink did not open: nothing was written.
    let (counts, progress) = tally(&garage_location(&server, "lake"));
    assert!(
        counts.is_empty() && progress.is_empty(),
        "{counts:?} {progress:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn at_start_a_store_that_does_not_answer_or_a_corrupt_progress_object_exits_1_naming_the_sink() {
    // A server that takes connections and never answers (the kernel
    // accepts them into the listener's backlog; nothing reads): every
    // request waits out its `timeout`, is retried within the short
    // bounds below, then given up. Held for the whole test, so no other
    // server can take its port.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = silent.local_addr().unwrap().port();
    let unreachable = format!(
        "kind = \"s3\"\nbucket = \"lake\"\nregion = \"garage\"\n\
         endpoint = \"http://127.0.0.1:{closed}\"\naccess_key_id = \"GK1\"\n\
         secret_access_key = \"a-secret-never-printed\"\n"
    );
    let folder = tempfile::tempdir().unwrap();
    let progress = folder.path().join("_etl_progress/lake");
    std::fs::create_dir_all(&progress).unwrap();
    std::fs::write(progress.join("partition-0.json"), "{\"partition\": 0, ").unwrap();
    let corrupt = format!("kind = \"local\"\npath = \"{}\"\n", folder.path().display());
    let short = "max_retries = 2\nretry_timeout = \"2s\"\ninitial_backoff = \"50ms\"\n\
                 max_backoff = \"100ms\"\ntimeout = \"1s\"\n";
    let cases = [
        (
            "a store that does not answer",
            unreachable,
            format!("127.0.0.1:{closed}"),
        ),
        (
            "a progress object that does not parse",
            corrupt,
            "partition-0.json".to_owned(),
        ),
    ];
    let mut failures = Vec::new();
    for (name, store, place) in cases {
        let dir = tempfile::tempdir().unwrap();
        let config = write_pipeline(dir.path(), &store, 1_000, "", short);
        let mut child = start(dir.path(), &config, 1);
        let status = wait_exit(&mut child, Duration::from_secs(90)).unwrap();
        let err = run_stderr(dir.path(), 1);
        // Not the configuration's error (78): the same configuration
        // runs once the store answers or the object is mended.
        if status.code() != Some(1) {
            failures.push(format!("{name}: exited {status}, not 1: {err}"));
        }
        for part in ["\"lake\"", place.as_str()] {
            if !err.contains(part) {
                failures.push(format!("{name}: no {part:?} in {err}"));
            }
        }
        if err.contains("a-secret-never-printed") {
            failures.push(format!("{name}: the secret in {err}"));
        }
    }
    drop(silent);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn garage_stopped_for_good_and_a_sigterm_end_the_run_within_shutdown_timeout_with_1() {
    // Requests patient enough to retry for ten minutes: only the stop's
    // bound can end the run in time.
    let patient = "max_retries = 1000\nretry_timeout = \"600s\"\ninitial_backoff = \"100ms\"\n\
                   max_backoff = \"1s\"\ntimeout = \"5s\"\n";
    let mut run = Running::start_edited(1_000, "", patient, Duration::from_secs(3), |text| {
        let line = "commit_interval = \"200ms\"\n";
        assert!(text.contains(line), "{text}");
        text.replace(line, &format!("{line}shutdown_timeout = \"4s\"\n"))
    });
    run.server.stop();
    // Writes under way meet the stopped store and retry.
    std::thread::sleep(Duration::from_secs(1));
    let term = std::process::Command::new("kill")
        .args(["-TERM", &run.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let signalled = std::time::Instant::now();
    let (status, err) = run.end(Duration::from_secs(90));
    // The stop is bounded: far below the requests' own ten minutes, and
    // far above the 4 s bound, so a loaded machine does not fail it.
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(30),
        "the stop took {took:?}: {err}"
    );
    assert_eq!(status.code(), Some(1), "{status}: {err}");
    // The sink's driver was torn down at the stop's deadline, its
    // batches failed (docs/operations.md: "a sink ... had to be torn
    // down").
    for part in ["sink \"lake\"", "did not drain"] {
        assert!(err.contains(part), "{part} in {err}");
    }
    // What the store held when it stopped is consistent: its progress
    // covers only records its objects hold.
    run.server.restart().unwrap();
    let (counts, progress) = tally(&garage_location(&run.server, "lake"));
    assert!((counts.len() as i64) < PARTITIONS * PER_PARTITION);
    assert_progress_covered(&counts, &progress, "after the bounded stop");
}

#[test]
fn a_proxy_given_in_the_providers_environment_carries_the_sinks_requests() {
    use std::io::{BufRead, BufReader};
    // A proxy that records the first line of each request it is given
    // and answers none (the run then gives up within the short bounds).
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = proxy.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let seen = seen.clone();
        std::thread::spawn(move || {
            for stream in proxy.incoming().flatten() {
                let mut line = String::new();
                let _ = BufReader::new(&stream).read_line(&mut line);
                seen.lock().unwrap().push(line);
            }
        });
    }
    let dir = tempfile::tempdir().unwrap();
    // A store no request could reach but through the proxy.
    let store = "kind = \"s3\"\nbucket = \"lake\"\nregion = \"garage\"\n\
                 endpoint = \"http://lake.invalid:3900\"\naccess_key_id = \"GK1\"\n\
                 secret_access_key = \"a-secret-never-printed\"\n";
    let short = "max_retries = 1\nretry_timeout = \"2s\"\ninitial_backoff = \"50ms\"\n\
                 max_backoff = \"100ms\"\ntimeout = \"1s\"\n";
    let config = write_pipeline(dir.path(), store, 1_000, "", short);
    let mut child = std::process::Command::new(etl_binary())
        .arg("run")
        .arg(&config)
        .current_dir(dir.path())
        .env("AWS_PROXY_URL", format!("http://127.0.0.1:{port}"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(90)).unwrap();
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().any(|l| l.contains("lake.invalid:3900")),
        "exit {status}; the proxy saw {seen:?}"
    );
}
