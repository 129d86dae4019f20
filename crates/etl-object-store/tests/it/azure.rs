//! Azure Blob Storage against Azurite, Microsoft's own emulator
//! (installed once per machine from npm and started by the tests): the
//! `etl` command writing an exactly-once Parquet lake into a container,
//! killed and run again; a second run resuming from the progress the
//! container holds, with no local checkpoint; and a wrong account key or
//! a missing container refused at start (exit 74), with no key in any
//! output. Every object is read back by pyarrow's own Azure client.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use etl_test_support::azurite::{ACCOUNT, Azurite};
use etl_test_support::pyarrow::Location;
use etl_test_support::{run_stderr, wait_exit};

use crate::process::{
    PARTITIONS, PER_PARTITION, assert_progress_covered, etl_binary, start, tally, write_pipeline,
};

/// Records a second: a run of the whole input lasts about four seconds.
const RATE: u64 = 4_000;

/// The `[sinks.store]` lines of `container` on `server`, signed with
/// `key`.
fn azure_store(server: &Azurite, container: &str, key: &str) -> String {
    format!(
        "kind = \"azure\"\naccount = \"{ACCOUNT}\"\ncontainer = \"{container}\"\n\
         endpoint = \"{}\"\naccess_key = \"{key}\"\n",
        server.endpoint()
    )
}

/// Where pyarrow reads `container` of `server`.
fn azure_location(server: &Azurite, container: &str) -> Location {
    Location::Azure {
        service: server.service(),
        account: ACCOUNT.to_owned(),
        key: server.key().to_owned(),
        container: container.to_owned(),
    }
}

/// Every record in exactly one object, and each partition's stored
/// progress at its end.
fn assert_every_record_once(location: &Location) {
    let (counts, progress) = tally(location);
    assert_progress_covered(&counts, &progress, "at the end");
    assert_eq!(
        counts.len() as i64,
        PARTITIONS * PER_PARTITION,
        "every record in an object"
    );
    assert!(
        counts.values().all(|&n| n == 1),
        "every record in one object"
    );
    for p in 0..PARTITIONS {
        assert_eq!(progress.get(&p), Some(&PER_PARTITION), "{progress:?}");
    }
}

/// Run `run` of `config` in `dir` to its end (a generous bound), which
/// must be a success.
fn run_to_end(dir: &Path, config: &Path, run: u32) {
    let mut child = start(dir, config, run);
    let status = wait_exit(&mut child, Duration::from_secs(120)).unwrap();
    assert!(
        status.success(),
        "run {run}: {status}: {}",
        run_stderr(dir, run)
    );
}

/// Azurite with its container `lake`, and the first run of the pipeline
/// into it (`sink` lines in the sink's table), under way once the
/// container holds its first object: the server, the run's folder, its
/// configuration and its process.
fn first_run_under_way(sink: &str) -> (Azurite, tempfile::TempDir, PathBuf, Child) {
    let server = Azurite::start().unwrap();
    server.create_container("lake").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = azure_store(&server, "lake", server.key());
    let config = write_pipeline(dir.path(), &store, RATE, sink, "");
    assert!(etl_binary().is_file());
    let mut child = start(dir.path(), &config, 1);
    wait_for_first_object(&server, "lake", &mut child);
    (server, dir, config, child)
}

#[test]
fn the_etl_process_killed_mid_run_into_an_azurite_container_stores_every_record_once() {
    // Every object a block blob put as blocks and a block list (the
    // multipart path), the rest of the store as single puts.
    let (server, dir, config, mut child) = first_run_under_way("multipart_threshold = 1");
    let location = azure_location(&server, "lake");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before the kill: {}",
        run_stderr(dir.path(), 1)
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let (counts, progress) = tally(&location);
    assert!(
        !counts.is_empty() && (counts.len() as i64) < PARTITIONS * PER_PARTITION,
        "killed mid-run: {} records stored",
        counts.len()
    );
    assert_progress_covered(&counts, &progress, "after the kill");

    run_to_end(dir.path(), &config, 2);
    assert_every_record_once(&location);
}

/// Each object under `prefix` of `container` and its ETag, as the store
/// lists them (Azure gives an object a new ETag at every write, whatever
/// its bytes).
fn etags(server: &Azurite, container: &str, prefix: &str) -> BTreeMap<String, String> {
    use futures::TryStreamExt;
    let config: etl_object_store::ObjectStoreSinkConfig = toml::from_str(&format!(
        "key = \"{{partition}}-{{first_offset}}.ndjson\"\n[store]\n{}",
        azure_store(server, container, server.key())
    ))
    .unwrap();
    let store = etl_object_store::ObjectStoreSink::new("lister", Path::new("."), config)
        .unwrap()
        .store();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let metas: Vec<_> = runtime
        .block_on(store.list(Some(&prefix.into())).try_collect())
        .unwrap();
    metas
        .into_iter()
        .map(|m| (m.location.to_string(), m.e_tag.unwrap()))
        .collect()
}

/// Wait until the run writing into `container` stored its first object
/// (a bound for a run that never does, not a speed), then a little more:
/// a stop right after is a stop mid-run, however slow the machine is to
/// start it. A run that stores none is killed before the test fails.
fn wait_for_first_object(server: &Azurite, container: &str, run: &mut Child) {
    let started = std::time::Instant::now();
    while etags(server, container, "gen").is_empty() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = run.kill();
            let _ = run.wait();
            panic!("no object stored within a minute");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
}

#[test]
fn a_second_run_without_its_local_checkpoint_resumes_from_the_progress_the_container_holds() {
    let (server, dir, config, mut child) = first_run_under_way("");
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = wait_exit(&mut child, Duration::from_secs(60)).unwrap();
    assert!(status.success(), "{status}: {}", run_stderr(dir.path(), 1));
    let first = etags(&server, "lake", "gen");
    let (counts, _) = tally(&azure_location(&server, "lake"));
    assert!(
        !first.is_empty() && (counts.len() as i64) < PARTITIONS * PER_PARTITION,
        "stopped mid-run: {} records stored",
        counts.len()
    );

    // The pipeline's own checkpoint gone: what the first run stored can
    // be known from the container alone.
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    run_to_end(dir.path(), &config, 2);
    let second = etags(&server, "lake", "gen");
    let rewritten: Vec<&String> = first
        .iter()
        .filter(|(key, etag)| second.get(*key) != Some(etag))
        .map(|(key, _)| key)
        .collect();
    assert!(
        rewritten.is_empty(),
        "the second run wrote again {} of the first run's {} objects: {:?}",
        rewritten.len(),
        first.len(),
        &rewritten[..rewritten.len().min(5)]
    );
    assert!(second.len() > first.len(), "the second run wrote nothing");
    assert_every_record_once(&azure_location(&server, "lake"));
}

/// `etl run CONFIG` in `dir` with every log on (`ETL_LOG=trace`), within
/// a generous bound: its exit code and its standard output and error.
fn run_traced(dir: &Path, config: &Path) -> (Option<i32>, String) {
    let file = |name: &str| std::fs::File::create(dir.join(name)).unwrap();
    let mut child = Command::new(etl_binary())
        .arg("run")
        .arg(config)
        .current_dir(dir)
        .env("ETL_LOG", "trace")
        .stdin(Stdio::null())
        .stdout(file("traced.out"))
        .stderr(file("traced.err"))
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(90)).unwrap();
    let mut text = std::fs::read_to_string(dir.join("traced.out")).unwrap();
    text.push_str(&std::fs::read_to_string(dir.join("traced.err")).unwrap());
    (status.code(), text)
}

#[test]
fn at_start_a_wrong_account_key_or_a_missing_container_exit_74_naming_sink_and_container_without_a_key()
 {
    let server = Azurite::start().unwrap();
    server.create_container("lake").unwrap();
    // A well-formed key of the same length that is not the account's.
    // (32 bytes of 0x5a in base64.)
    let wrong_key = format!("{}Wlo=", "Wlpa".repeat(10));
    assert_ne!(wrong_key, server.key());
    let cases = [
        (
            "a wrong account key",
            "lake",
            azure_store(&server, "lake", &wrong_key),
            "credential",
        ),
        (
            "a container that does not exist",
            "no-such-lake",
            azure_store(&server, "no-such-lake", server.key()),
            "does not exist",
        ),
    ];
    let mut failures = Vec::new();
    for (name, container, store, reason) in cases {
        let dir = tempfile::tempdir().unwrap();
        let config = write_pipeline(dir.path(), &store, RATE, "", "");
        let (code, output) = run_traced(dir.path(), &config);
        let keys = [server.key(), wrong_key.as_str()];
        if keys.iter().any(|key| output.contains(key)) {
            failures.push(format!("{name}: an account key in its output"));
        }
        // What the failures below show, without a key.
        let output = keys
            .iter()
            .fold(output, |text, key| text.replace(key, "<KEY>"));
        if code != Some(74) {
            failures.push(format!("{name}: exited {code:?}, not 74: {output}"));
        }
        for part in ["\"lake\"", &format!("az://{container}/"), reason] {
            if !output.contains(part) {
                failures.push(format!("{name}: no {part:?} in {output}"));
            }
        }
    }
    // The sink did not open: nothing was written.
    let (counts, progress) = tally(&azure_location(&server, "lake"));
    assert!(
        counts.is_empty() && progress.is_empty(),
        "{counts:?} {progress:?}"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
