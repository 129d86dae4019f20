//! The `etl` command itself, killed with SIGKILL again and again while a
//! writer commits transactions: every committed row reaches the file
//! sink, and the slot is never confirmed past what the file holds.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use etl_postgres_cdc::Lsn;
use serde_json::Value;

use crate::support::{Names, client};

/// The `etl` binary beside this test's profile, built (or found up to
/// date) once by `cargo build -p etl-cli --bin etl`.
fn etl_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let mut dir = exe.parent().unwrap().to_path_buf();
            if dir.file_name() == Some("deps".as_ref()) {
                dir = dir.parent().unwrap().to_path_buf();
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
            let mut build = Command::new(cargo);
            build
                .args(["build", "-p", "etl-cli", "--bin", "etl"])
                .current_dir(root);
            if dir.file_name() == Some("release".as_ref()) {
                build.arg("--release");
            }
            let status = build.status().unwrap();
            assert!(status.success(), "building the etl binary failed: {status}");
            dir.join("etl")
        })
        .clone()
}

/// A configuration from the slot into `out.ndjson` beside it, offsets
/// in the file store `state`.
fn config(dir: &Path, names: &Names) -> PathBuf {
    let path = dir.join("pipeline.toml");
    std::fs::write(
        &path,
        format!(
            "[source]\ntype = \"postgres_cdc\"\nurl = \"{}\"\npublication = \"{}\"\n\
             slot = \"{}\"\nmax_batch_records = 200\nstatus_interval = \"1s\"\n\n\
             [[sinks]]\ntype = \"file\"\npath = \"out.ndjson\"\n\n\
             [checkpoint]\ncommit_interval = \"200ms\"\n\
             store = {{ type = \"file\", path = \"state\" }}\n",
            names.url,
            names.publication(),
            names.slot()
        ),
    )
    .unwrap();
    path
}

fn start(dir: &Path, config: &Path, run: u32) -> Child {
    Command::new(etl_binary())
        .args(["--log-format", "json", "run"])
        .arg(config)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("run-{run}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("run-{run}.err"))).unwrap())
        .spawn()
        .unwrap()
}

/// The ids of `grows` rows the file holds (inserted or read); a line cut
/// short by the kill is no record.
fn delivered(dir: &Path) -> BTreeSet<i64> {
    let text = std::fs::read(dir.join("out.ndjson")).unwrap_or_default();
    String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|change| change["op"] == "insert" || change["op"] == "read")
        .filter_map(|change| change["key"]["id"].as_i64())
        .collect()
}

/// A committed transaction of the writer: its rows, and the server's
/// end of WAL once it committed (at or past its commit record's end).
struct Committed {
    ids: Vec<i64>,
    after: Lsn,
}

/// Kills the `etl` process (SIGKILL) eight times, during the initial
/// snapshot of 5,000 rows and during streaming, while transactions
/// commit; restarts it each time. After every kill, each transaction that
/// ends before the slot's confirmed position is in the file whole; at the
/// end every row committed, before or during the runs, is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etl_process_killed_again_and_again_loses_no_committed_row() {
    const KILLS: u32 = 8;
    const PREFILLED: i64 = 5_000;
    let names = Names::new("proc");
    let db = client().await;
    names.create(&db).await;
    let grows = names.table("grows");
    db.batch_execute(&format!(
        "INSERT INTO {grows} SELECT g, g FROM generate_series(1, {PREFILLED}) g"
    ))
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!("etl-cdc-process-{}", names.suffix));
    std::fs::create_dir_all(&dir).unwrap();
    let config = config(&dir, &names);
    let binary = tokio::task::spawn_blocking(etl_binary).await.unwrap();
    assert!(binary.is_file(), "{}", binary.display());

    let committed: Arc<Mutex<Vec<Committed>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (committed, stop, grows) = (committed.clone(), stop.clone(), grows.clone());
        tokio::spawn(async move {
            let db = client().await;
            let mut next = 100_000i64;
            while !stop.load(Ordering::Relaxed) {
                let ids = vec![next, next + 1, next + 2];
                db.batch_execute(&format!(
                    "BEGIN; INSERT INTO {grows} VALUES ({}, 1), ({}, 2); \
                     INSERT INTO {grows} VALUES ({}, 3); COMMIT;",
                    ids[0], ids[1], ids[2]
                ))
                .await
                .unwrap();
                let after: String = db
                    .query_one("SELECT pg_current_wal_lsn()::text", &[])
                    .await
                    .unwrap()
                    .get(0);
                committed.lock().unwrap().push(Committed {
                    ids,
                    after: after.parse().unwrap(),
                });
                next += 3;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let mut confirmed_seen = 0;
    // Kills in a row that came before the slot existed: each makes the
    // next run longer, so that a snapshot completes on a loaded machine.
    let mut in_snapshot = 0;
    for run in 1..=KILLS {
        let mut child = start(&dir, &config, run);
        // Early (in the snapshot, at first), or late.
        let delay = [400, 1500, 3000, 900][run as usize % 4] + 2000 * in_snapshot;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        assert!(
            child.try_wait().unwrap().is_none(),
            "run {run} ended by itself: {}",
            std::fs::read_to_string(dir.join(format!("run-{run}.err"))).unwrap_or_default()
        );
        child.kill().unwrap();
        child.wait().unwrap();

        let Some(confirmed) = names.confirmed(&db).await else {
            // Killed during the snapshot: no slot yet.
            in_snapshot += 1;
            continue;
        };
        in_snapshot = 0;
        confirmed_seen += 1;
        let have = delivered(&dir);
        for txn in committed.lock().unwrap().iter() {
            if txn.after <= confirmed {
                for id in &txn.ids {
                    assert!(
                        have.contains(id),
                        "kill {run}: the slot is confirmed at {confirmed}, past the commit of \
                         row {id} (before {}), which the file does not hold",
                        txn.after
                    );
                }
            }
        }
    }
    assert!(
        confirmed_seen > 0,
        "every kill came before the slot existed"
    );

    // The last run: the writer stops, the pipeline catches up.
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let mut child = start(&dir, &config, KILLS + 1);
    let mut expected: BTreeSet<i64> = (1..=PREFILLED).collect();
    for txn in committed.lock().unwrap().iter() {
        expected.extend(txn.ids.iter().copied());
    }
    let mut missing = expected.len();
    for _ in 0..600 {
        let have = delivered(&dir);
        missing = expected.difference(&have).count();
        if missing == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        missing,
        0,
        "rows committed and never delivered (of {})",
        expected.len()
    );
    names.drop_all(&db).await;
    let _ = std::fs::remove_dir_all(&dir);
}
