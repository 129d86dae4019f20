//! The `etl` command from the slot into the PostgreSQL sink with
//! `exactly_once = true`, killed with SIGKILL again and again during the
//! initial snapshot and while transactions of inserts, updates and
//! deletes over three tables commit: every change is written once, and
//! the slot is never confirmed past what the target holds.
//!
//! Each write on the source tables takes a number from a sequence (`w`),
//! and a trigger logs it (`table:op:w`, with its transaction id) in a
//! table outside the publication. The target holds one row per record,
//! keyed on its idempotency key, with the change's `table:op:w`; an
//! audit trigger on the target logs every write of a row, so a change
//! stored twice (under one offset or two) shows as two writes.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etl_postgres_cdc::Lsn;
use etl_test_support::{etl_binary, start_run, wait_exit};
use tokio_postgres::Client;

use crate::support::{KillLoop, Names, client, kill_after_a_while};

/// Rows in the first table before the pipeline starts: its snapshot.
const PREFILLED: i64 = 20_000;

/// The source tables, the change log, the target and its audit.
struct Tables {
    t1: String,
    t2: String,
    t3: String,
    log: String,
    target: String,
    writes: String,
    progress: String,
    seq: String,
}

impl Tables {
    fn new(names: &Names) -> Tables {
        Tables {
            t1: names.table("eo_items"),
            t2: names.table("eo_pairs"),
            t3: names.table("eo_docs"),
            log: names.table("eo_log"),
            target: names.table("eo_target"),
            writes: names.table("eo_writes"),
            progress: names.table("eo_progress"),
            seq: names.table("eo_w"),
        }
    }

    async fn create(&self, db: &Client, publication: &str) {
        let Tables {
            t1,
            t2,
            t3,
            log,
            target,
            writes,
            seq,
            ..
        } = self;
        db.batch_execute(&format!(
            "CREATE SEQUENCE {seq};
             CREATE TABLE {t1} (id int PRIMARY KEY, w bigint NOT NULL, v int);
             CREATE TABLE {t2} (a int, b text, w bigint NOT NULL, PRIMARY KEY (a, b));
             CREATE TABLE {t3} (id int PRIMARY KEY, w bigint NOT NULL, body text);
             ALTER TABLE {t1} REPLICA IDENTITY FULL;
             ALTER TABLE {t2} REPLICA IDENTITY FULL;
             ALTER TABLE {t3} REPLICA IDENTITY FULL;
             CREATE TABLE {log} (change text PRIMARY KEY, xid bigint NOT NULL);
             INSERT INTO {t1} SELECT g, nextval('{seq}'), g FROM generate_series(1, {PREFILLED}) g;
             INSERT INTO {log} SELECT '{t1}:read:' || w, 0 FROM {t1};
             CREATE FUNCTION {log}_f() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO {log} VALUES (
                 TG_TABLE_NAME || ':' || lower(TG_OP) || ':' ||
                   CASE WHEN TG_OP = 'DELETE' THEN OLD.w ELSE NEW.w END,
                 pg_current_xact_id()::text::bigint);
               RETURN NULL;
             END $$;
             CREATE TRIGGER log AFTER INSERT OR UPDATE OR DELETE ON {t1}
               FOR EACH ROW EXECUTE FUNCTION {log}_f();
             CREATE TRIGGER log AFTER INSERT OR UPDATE OR DELETE ON {t2}
               FOR EACH ROW EXECUTE FUNCTION {log}_f();
             CREATE TRIGGER log AFTER INSERT OR UPDATE OR DELETE ON {t3}
               FOR EACH ROW EXECUTE FUNCTION {log}_f();
             CREATE TABLE {target} (
               etl_key text PRIMARY KEY,
               doc jsonb NOT NULL,
               change text GENERATED ALWAYS AS (
                 (doc->>'table') || ':' || (doc->>'op') || ':' ||
                   coalesce(doc->'after'->>'w', doc->'before'->>'w')) STORED);
             CREATE TABLE {writes} (change text NOT NULL, etl_key text NOT NULL);
             CREATE FUNCTION {writes}_f() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO {writes} VALUES (NEW.change, NEW.etl_key);
               RETURN NULL;
             END $$;
             CREATE TRIGGER audit AFTER INSERT OR UPDATE ON {target}
               FOR EACH ROW EXECUTE FUNCTION {writes}_f();
             CREATE PUBLICATION {publication} FOR TABLE {t1}, {t2}, {t3};"
        ))
        .await
        .unwrap();
    }

    async fn drop_all(&self, db: &Client, publication: &str) {
        let Tables {
            t1,
            t2,
            t3,
            log,
            target,
            writes,
            progress,
            seq,
        } = self;
        let _ = db
            .batch_execute(&format!(
                "DROP PUBLICATION IF EXISTS {publication};
                 DROP TABLE IF EXISTS {t1}, {t2}, {t3}, {log}, {target}, {writes}, {progress};
                 DROP FUNCTION IF EXISTS {log}_f(), {writes}_f();
                 DROP SEQUENCE IF EXISTS {seq};"
            ))
            .await;
    }

    /// Changes of the transactions `xids` (every change, if `None`) the
    /// target does not hold.
    async fn missing(&self, db: &Client, xids: Option<&[i64]>) -> i64 {
        let (log, target) = (&self.log, &self.target);
        let sql = format!(
            "SELECT count(*) FROM {log} l WHERE ($1::int8[] IS NULL OR l.xid = ANY($1)) \
             AND NOT EXISTS (SELECT 1 FROM {target} t WHERE t.change = l.change)"
        );
        db.query_one(&sql, &[&xids]).await.unwrap().get(0)
    }

    /// Streamed changes written more than once to the target, and rows
    /// of the target that are no change of the log.
    async fn duplicates(&self, db: &Client) -> (i64, i64) {
        let (log, target, writes) = (&self.log, &self.target, &self.writes);
        let twice: i64 = db
            .query_one(
                &format!(
                    "SELECT count(*) FROM (SELECT change FROM {writes} \
                     WHERE change NOT LIKE '%:read:%' GROUP BY change HAVING count(*) > 1) d"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let foreign: i64 = db
            .query_one(
                &format!(
                    "SELECT count(*) FROM {target} t \
                     WHERE NOT EXISTS (SELECT 1 FROM {log} l WHERE l.change = t.change)"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (twice, foreign)
    }

    async fn target_rows(&self, db: &Client) -> i64 {
        db.query_one(&format!("SELECT count(*) FROM {}", self.target), &[])
            .await
            .unwrap()
            .get(0)
    }
}

/// The pipeline: the slot into the target, exactly once.
fn config(dir: &Path, names: &Names, tables: &Tables) -> PathBuf {
    let path = dir.join("pipeline.toml");
    std::fs::write(
        &path,
        format!(
            "[source]\ntype = \"postgres_cdc\"\nurl = \"{url}\"\npublication = \"{publication}\"\n\
             slot = \"{slot}\"\nmax_batch_records = 200\nstatus_interval = \"1s\"\n\n\
             [[sinks]]\ntype = \"postgres\"\nurl = \"{url}\"\ntable = \"{target}\"\n\
             exactly_once = true\nprogress_table = \"{progress}\"\n\
             columns = [{{ name = \"doc\", path = \"\", type = \"jsonb\" }}]\n\n\
             [checkpoint]\ncommit_interval = \"200ms\"\n\
             store = {{ type = \"file\", path = \"state\" }}\n",
            url = names.url,
            publication = names.publication(),
            slot = names.slot(),
            target = tables.target,
            progress = tables.progress,
        ),
    )
    .unwrap();
    path
}

/// A transaction of the writer: its id, and the server's end of WAL once
/// it committed (at or past its commit record's end).
struct Committed {
    xid: i64,
    after: Lsn,
}

async fn xid(db: &Client) -> i64 {
    db.query_one("SELECT pg_current_xact_id()::text::int8", &[])
        .await
        .unwrap()
        .get(0)
}

async fn wal_end(db: &Client) -> Lsn {
    let end: String = db
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    end.parse().unwrap()
}

/// Round `n` of the workload, on two connections: a large transaction
/// (an update of a few hundred rows) held open while a small one writes,
/// the two committed back to back, so the small one commits a few bytes
/// after the large one and its offsets follow the large one's rather
/// than its commit LSN; then single inserts, updates and deletes.
async fn round(a: &Client, b: &Client, tables: &Tables, n: i64) -> Vec<i64> {
    let Tables {
        t1, t2, t3, seq, ..
    } = tables;
    let mut xids = Vec::new();
    a.batch_execute(&format!(
        "BEGIN; UPDATE {t1} SET w = nextval('{seq}'), v = v + 1 WHERE id % 97 = {};",
        n % 97
    ))
    .await
    .unwrap();
    xids.push(xid(a).await);
    b.batch_execute(&format!(
        "BEGIN; INSERT INTO {t2} VALUES ({n}, 'x', nextval('{seq}')), ({n}, 'y', nextval('{seq}'));
         INSERT INTO {t3} VALUES ({n}, nextval('{seq}'), repeat('d', 100));"
    ))
    .await
    .unwrap();
    xids.push(xid(b).await);
    a.batch_execute("COMMIT").await.unwrap();
    b.batch_execute("COMMIT").await.unwrap();
    // Then transactions of one statement or a few, each on its own.
    let transactions = [
        vec![format!(
            "INSERT INTO {t1} VALUES ({}, nextval('{seq}'), 0)",
            100_000 + n
        )],
        vec![format!(
            "UPDATE {t2} SET w = nextval('{seq}'), b = 'z' WHERE a = {n} AND b = 'y'"
        )],
        vec![format!(
            "UPDATE {t3} SET w = nextval('{seq}'), body = 'e' WHERE id = {n}"
        )],
        vec![
            format!("DELETE FROM {t2} WHERE a = {n} AND b = 'x'"),
            format!("DELETE FROM {t1} WHERE id = {}", n + 1),
            format!(
                "INSERT INTO {t3} VALUES ({}, nextval('{seq}'), 'f')",
                1_000_000 + n
            ),
        ],
    ];
    for statements in transactions {
        a.batch_execute("BEGIN").await.unwrap();
        for statement in statements {
            a.batch_execute(&statement).await.unwrap();
        }
        xids.push(xid(a).await);
        a.batch_execute("COMMIT").await.unwrap();
    }
    xids
}

/// Kills the `etl` process (SIGKILL) again and again, during the initial
/// snapshot (no writes yet; its rows are at least once: a snapshot cut
/// short is read again) and during streaming, while transactions of
/// inserts, updates and deletes commit on three tables, a large one
/// followed closely by a small one (whose offsets then follow the large
/// one's, not its commit LSN); restarts it each time. After every kill
/// (20 of them while streaming), every change of a transaction
/// that ends before the slot's confirmed position is in the target. At
/// the end every change is in it, and no streamed change was written
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_again_and_again_the_exactly_once_sink_writes_every_change_once() {
    /// Kills while streaming; kills before the slot exists come on top.
    const STREAMING_KILLS: u32 = 20;
    /// Runs at most: the snapshot must complete well before.
    const MAX_RUNS: u32 = 40;
    /// Kills aimed at the snapshot before one is let to finish.
    const SNAPSHOT_KILLS: u32 = 2;
    let names = Names::new("eo");
    let tables = Tables::new(&names);
    let db = client().await;
    tables.create(&db, &names.publication()).await;
    let dir = std::env::temp_dir().join(format!("etl-cdc-exactly-once-{}", names.suffix));
    std::fs::create_dir_all(&dir).unwrap();
    let config = config(&dir, &names, &tables);
    let binary = tokio::task::spawn_blocking(etl_binary).await.unwrap();
    assert!(binary.is_file(), "{}", binary.display());

    let committed: Arc<Mutex<Vec<Committed>>> = Arc::default();
    let (go, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let writer = {
        let (committed, go, stop) = (committed.clone(), go.clone(), stop.clone());
        let tables = Tables::new(&names);
        tokio::spawn(async move {
            let (a, b) = (client().await, client().await);
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) {
                if !go.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                let xids = round(&a, &b, &tables, n).await;
                let after = wal_end(&a).await;
                committed
                    .lock()
                    .unwrap()
                    .extend(xids.into_iter().map(|xid| Committed { xid, after }));
                n += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    let mut kills = KillLoop {
        in_snapshot: 0,
        snapshot_kills: SNAPSHOT_KILLS,
        streaming: 0,
        no_slot: 0,
        // Early or late in a run, while transactions commit.
        streaming_delays: [700, 1500, 2500, 1100],
    };
    let mut run = 0;
    while kills.streaming < STREAMING_KILLS {
        run += 1;
        assert!(
            run <= MAX_RUNS,
            "{} kills while streaming after {MAX_RUNS} runs",
            kills.streaming
        );
        let before = tables.target_rows(&db).await;
        let mut child: Child = start_run(&dir, &["--log-format", "json"], &config, run).unwrap();
        let delay = kill_after_a_while(&mut child, &kills, &dir, run).await;

        let confirmed = names.confirmed(&db).await;
        eprintln!(
            "kill {run} after {delay} ms: slot confirmed at {confirmed:?}, target {} rows",
            tables.target_rows(&db).await
        );
        let Some(confirmed) = confirmed else {
            kills.no_slot += 1;
            if tables.target_rows(&db).await > before {
                kills.in_snapshot += 1;
            }
            continue;
        };
        // The snapshot is delivered: the writes begin.
        go.store(true, Ordering::Relaxed);
        kills.no_slot = 0;
        kills.streaming += 1;
        let xids: Vec<i64> = committed
            .lock()
            .unwrap()
            .iter()
            .filter(|txn| txn.after <= confirmed)
            .map(|txn| txn.xid)
            .collect();
        let missing = tables.missing(&db, Some(&xids)).await;
        assert_eq!(
            missing, 0,
            "kill {run}: the slot is confirmed at {confirmed}, past changes the target does not hold"
        );
    }
    let KillLoop {
        in_snapshot,
        streaming,
        ..
    } = kills;
    eprintln!("{in_snapshot} kills while the snapshot was written, {streaming} while streaming");
    assert!(
        in_snapshot >= 1,
        "no kill came while the snapshot was written"
    );
    // The last run: the writer stops, the pipeline catches up.
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    let rounds = committed.lock().unwrap().len();
    assert!(rounds > 50, "only {rounds} transactions committed");
    let mut child = start_run(&dir, &["--log-format", "json"], &config, run + 1).unwrap();
    let mut missing = -1;
    for _ in 0..600 {
        missing = tables.missing(&db, None).await;
        if missing == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stopped gracefully: what it holds is final.
    let pid = i32::try_from(child.id()).unwrap();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    wait_exit(&mut child, Duration::from_secs(30)).unwrap();
    assert_eq!(
        missing, 0,
        "changes committed and never written to the target"
    );
    let (twice, foreign) = tables.duplicates(&db).await;
    let reads: i64 = db
        .query_one(
            &format!(
                "SELECT count(*) - count(DISTINCT change) FROM {} WHERE change LIKE '%:read:%'",
                tables.writes
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    eprintln!(
        "{rounds} transactions; snapshot rows written again after a kill in the snapshot: {reads}"
    );
    // Transactions whose offsets did not start at their commit LSN: the
    // chains the slot may not be confirmed inside were exercised.
    let unanchored: i64 = db
        .query_one(
            &format!(
                "SELECT count(*) FROM (SELECT doc->>'commit_lsn' AS lsn, \
                 min(reverse(split_part(reverse(etl_key), '/', 1))::numeric) AS first \
                 FROM {} WHERE doc->>'op' <> 'read' GROUP BY 1) t \
                 WHERE first > (lsn::pg_lsn - '0/0'::pg_lsn)",
                tables.target
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    eprintln!("{unanchored} transactions took offsets past their commit LSN");
    assert!(
        unanchored > 0,
        "no transaction's offsets ran past its commit LSN"
    );
    assert_eq!(twice, 0, "streamed changes written more than once");
    assert_eq!(foreign, 0, "target rows that are no change");
    names.drop_all(&db).await;
    tables.drop_all(&db, &names.publication()).await;
    let _ = std::fs::remove_dir_all(&dir);
}
