//! The `etl` command itself, killed with SIGKILL again and again while a
//! writer commits transactions: every committed row reaches the file
//! sink, and the slot is never confirmed past what the file holds.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etl_postgres_cdc::Lsn;
use etl_test_support::{etl_binary, start_run};
use serde_json::Value;

use crate::support::{KillLoop, Names, client, kill_after_a_while};

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

/// Run `run` of the loop, logging JSON.
fn start(dir: &Path, config: &Path, run: u32) -> Child {
    start_run(dir, &["--log-format", "json"], config, run).unwrap()
}

/// The ids of `grows` rows the file holds (inserted or read), read as
/// the file grows: each call parses only the lines completed since the
/// last. A line cut short by a kill is no record (the next run's first
/// line continues it, and the two parse as nothing).
#[derive(Default)]
struct Delivered {
    /// The file's bytes up to the end of its last complete line, parsed.
    parsed: usize,
    ids: BTreeSet<i64>,
}

impl Delivered {
    fn read(&mut self, dir: &Path) -> &BTreeSet<i64> {
        let text = std::fs::read(dir.join("out.ndjson")).unwrap_or_default();
        if text.len() < self.parsed {
            // Never expected (the file sink appends): read it all again.
            *self = Delivered::default();
        }
        let Some(end) = text.iter().rposition(|b| *b == b'\n') else {
            return &self.ids;
        };
        if end < self.parsed {
            return &self.ids;
        }
        let ids = String::from_utf8_lossy(&text[self.parsed..=end])
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|change| change["op"] == "insert" || change["op"] == "read")
            .filter_map(|change| change["key"]["id"].as_i64())
            .collect::<Vec<_>>();
        self.ids.extend(ids);
        self.parsed = end + 1;
        &self.ids
    }
}

/// A committed transaction of the writer: its rows, and the server's
/// end of WAL once it committed (at or past its commit record's end).
struct Committed {
    ids: Vec<i64>,
    after: Lsn,
}

/// The size of `out.ndjson`, 0 before it exists.
fn output_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("out.ndjson")).map_or(0, |m| m.len())
}

/// Kills the `etl` process (SIGKILL) 24 times, during the initial
/// snapshot of 50,000 rows (at least once while its rows were being
/// written) and during streaming, while transactions commit; restarts it
/// each time. After every kill, each transaction that ends before the
/// slot's confirmed position is in the file whole; at the end every row
/// committed, before or during the runs, is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etl_process_killed_again_and_again_loses_no_committed_row() {
    const KILLS: u32 = 24;
    const PREFILLED: i64 = 50_000;
    /// Kills aimed at the snapshot before one is let to finish.
    const SNAPSHOT_KILLS: u32 = 2;
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

    // Kills that came while the snapshot's rows were being written (no
    // slot yet, the file grew), and kills while streaming (the slot
    // exists).
    let mut kills = KillLoop {
        in_snapshot: 0,
        snapshot_kills: SNAPSHOT_KILLS,
        streaming: 0,
        no_slot: 0,
        // Early or late in a run, while transactions commit.
        streaming_delays: [400, 1500, 3000, 900],
    };
    let mut delivered = Delivered::default();
    for run in 1..=KILLS {
        let before = output_len(&dir);
        let mut child = start(&dir, &config, run);
        let delay = kill_after_a_while(&mut child, &kills, &dir, run).await;

        let confirmed = names.confirmed(&db).await;
        eprintln!(
            "kill {run} after {delay} ms: slot confirmed at {confirmed:?}, output {} bytes",
            output_len(&dir)
        );
        let Some(confirmed) = confirmed else {
            // No slot yet: killed before the snapshot was delivered whole.
            kills.no_slot += 1;
            if output_len(&dir) > before {
                kills.in_snapshot += 1;
            }
            continue;
        };
        kills.no_slot = 0;
        kills.streaming += 1;
        let have = delivered.read(&dir);
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
    let KillLoop {
        in_snapshot,
        streaming,
        ..
    } = kills;
    eprintln!("{in_snapshot} kills while the snapshot was written, {streaming} while streaming");
    assert!(
        in_snapshot >= 1,
        "no kill came while the snapshot was being written"
    );
    assert!(
        streaming >= KILLS - 8,
        "only {streaming} of {KILLS} kills came while streaming"
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
        missing = expected.difference(delivered.read(&dir)).count();
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
