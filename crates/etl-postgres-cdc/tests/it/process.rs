//! The `etl` command itself, killed with SIGKILL again and again while a
//! writer commits transactions: every committed row reaches the file
//! sink (at least once, and with `exactly_once = true` exactly once),
//! and the slot is never confirmed past what the file holds.

use std::collections::{BTreeMap, BTreeSet};
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
/// in the file store `state`; the file sink exactly once or not.
fn config(dir: &Path, names: &Names, exactly_once: bool) -> PathBuf {
    let path = dir.join("pipeline.toml");
    std::fs::write(
        &path,
        format!(
            "[source]\ntype = \"postgres_cdc\"\nurl = \"{}\"\npublication = \"{}\"\n\
             slot = \"{}\"\nmax_batch_records = 200\nstatus_interval = \"1s\"\n\n\
             [[sinks]]\ntype = \"file\"\npath = \"out.ndjson\"\nexactly_once = {exactly_once}\n\n\
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

/// The `grows` rows the file holds (inserted or read), read as the file
/// grows: each call parses only the lines completed since the last,
/// unless the file no longer starts with the bytes parsed (an
/// exactly-once run cuts what its progress does not cover before it
/// writes), when it is read again from its start. A line cut short by a
/// kill is no record (the next run's first line continues it, and the
/// two parse as nothing).
#[derive(Default)]
struct Delivered {
    /// The file's bytes up to the end of its last complete line, parsed.
    text: Vec<u8>,
    ids: BTreeSet<i64>,
    /// How many times each row is in the file, by its key and its
    /// change's `commit_lsn` (a snapshot's consistent point for a row it
    /// read).
    rows: BTreeMap<(i64, String), u32>,
}

impl Delivered {
    fn read(&mut self, dir: &Path) -> &BTreeSet<i64> {
        let text = std::fs::read(dir.join("out.ndjson")).unwrap_or_default();
        if !text.starts_with(&self.text) {
            *self = Delivered::default();
        }
        let Some(end) = text.iter().rposition(|b| *b == b'\n') else {
            return &self.ids;
        };
        if end < self.text.len() {
            return &self.ids;
        }
        let rows = String::from_utf8_lossy(&text[self.text.len()..=end])
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|change| change["op"] == "insert" || change["op"] == "read")
            .filter_map(|change| {
                let lsn = change["commit_lsn"].as_str()?.to_owned();
                Some((change["key"]["id"].as_i64()?, lsn))
            })
            .collect::<Vec<_>>();
        for (id, lsn) in rows {
            self.ids.insert(id);
            *self.rows.entry((id, lsn)).or_default() += 1;
        }
        self.text = text[..=end].to_vec();
        &self.ids
    }

    /// The rows the file holds more than once under the same key and
    /// LSN, with their counts.
    fn twice(&self) -> Vec<(&(i64, String), &u32)> {
        self.rows.iter().filter(|(_, n)| **n > 1).collect()
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

/// One kill loop: how the file sink writes, how many kills, how many
/// rows the snapshot reads.
struct Plan {
    /// The file sink's `exactly_once`.
    exactly_once: bool,
    kills: u32,
    /// Rows in the table before the first run (the initial snapshot).
    prefilled: i64,
    /// Kills aimed at the snapshot before one is let to finish (the loop
    /// fails unless one of them came while its rows were written).
    snapshot_kills: u32,
}

/// Kills the `etl` process (SIGKILL) `plan.kills` times, during the
/// initial snapshot of `plan.prefilled` rows (at least once while its
/// rows were being written, when `plan.snapshot_kills` is not 0) and
/// during streaming, while transactions commit; restarts it each time.
/// After every kill, each transaction that ends before the slot's
/// confirmed position is in the file whole; at the end every row
/// committed, before or during the runs, is in it. Returns the file as
/// it is once the last run, killed too, caught up.
async fn kill_loop(plan: Plan) -> Delivered {
    let Plan {
        exactly_once,
        kills: runs,
        prefilled,
        snapshot_kills,
    } = plan;
    let names = Names::new(if exactly_once { "proc_once" } else { "proc" });
    let db = client().await;
    names.create(&db).await;
    let grows = names.table("grows");
    db.batch_execute(&format!(
        "INSERT INTO {grows} SELECT g, g FROM generate_series(1, {prefilled}) g"
    ))
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!("etl-cdc-process-{}", names.suffix));
    std::fs::create_dir_all(&dir).unwrap();
    let config = config(&dir, &names, exactly_once);
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
        snapshot_kills,
        streaming: 0,
        no_slot: 0,
        // Early or late in a run, while transactions commit.
        streaming_delays: [400, 1500, 3000, 900],
    };
    let mut delivered = Delivered::default();
    for run in 1..=runs {
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
        in_snapshot >= 1 || snapshot_kills == 0,
        "no kill came while the snapshot was being written"
    );
    assert!(
        streaming >= runs - 8,
        "only {streaming} of {runs} kills came while streaming"
    );

    // The last run: the writer stops, the pipeline catches up.
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let mut child = start(&dir, &config, runs + 1);
    let mut expected: BTreeSet<i64> = (1..=prefilled).collect();
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
    delivered.read(&dir);
    names.drop_all(&db).await;
    let _ = std::fs::remove_dir_all(&dir);
    delivered
}

/// The file sink at least once: [`kill_loop`] 24 times, during the
/// snapshot of 50,000 rows and while streaming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etl_process_killed_again_and_again_loses_no_committed_row() {
    kill_loop(Plan {
        exactly_once: false,
        kills: 24,
        prefilled: 50_000,
        snapshot_kills: 2,
    })
    .await;
}

/// The file sink with `exactly_once = true`: [`kill_loop`] 20 times,
/// during the snapshot of 50,000 rows and while streaming; in the end
/// every committed row is in the file once under its key and LSN (a row
/// of a snapshot taken again after a kill comes again under the new
/// slot's consistent point: a new read, docs/postgres-cdc.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etl_process_killed_again_and_again_writes_every_committed_row_once_exactly_once() {
    let delivered = kill_loop(Plan {
        exactly_once: true,
        kills: 20,
        prefilled: 50_000,
        snapshot_kills: 2,
    })
    .await;
    let twice = delivered.twice();
    eprintln!(
        "{} rows in the file under {} keys and LSNs, {} of them more than once",
        delivered.rows.values().sum::<u32>(),
        delivered.rows.len(),
        twice.len()
    );
    assert!(
        twice.is_empty(),
        "{} rows of {} in the file more than once under the same key and LSN, \
         (id, commit_lsn) and count, first ones: {:?}",
        twice.len(),
        delivered.rows.len(),
        &twice[..twice.len().min(20)]
    );
}
