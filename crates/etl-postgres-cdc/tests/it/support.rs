//! A database per test's names, a workload, and the model the records
//! are replayed into.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use etl_postgres_cdc::{Lsn, PostgresCdcConfig};
use etl_record::Record;
use serde_json::Value;
use tokio_postgres::{Client, NoTls};

/// The server's URL.
pub(crate) fn url() -> String {
    etl_test_support::postgres::shared_url()
}

/// A client of the server (its connection runs on the test's runtime).
pub(crate) async fn client() -> Client {
    client_of(&url()).await
}

/// A client of the server at `url`.
pub(crate) async fn client_of(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// Tables, publication and slot names of one test.
pub(crate) struct Names {
    pub(crate) suffix: String,
    /// The server.
    pub(crate) url: String,
}

impl Names {
    pub(crate) fn new(test: &str) -> Names {
        Names::on(test, url())
    }

    /// Names on the server at `url`.
    pub(crate) fn on(test: &str, url: String) -> Names {
        static N: AtomicU32 = AtomicU32::new(0);
        Names {
            suffix: format!(
                "{test}_{}_{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            url,
        }
    }

    pub(crate) fn table(&self, base: &str) -> String {
        format!("{base}_{}", self.suffix)
    }

    pub(crate) fn publication(&self) -> String {
        format!("pub_{}", self.suffix)
    }

    pub(crate) fn slot(&self) -> String {
        format!("slot_{}", self.suffix)
    }

    /// The three tables (a composite key, TOASTed values, one altered
    /// mid-run) and a publication of them.
    pub(crate) async fn create(&self, db: &Client) {
        let (pairs, docs, grows) = (self.table("pairs"), self.table("docs"), self.table("grows"));
        db.batch_execute(&format!(
            "CREATE TABLE {pairs} (a int, b text, v int, PRIMARY KEY (a, b));
             CREATE TABLE {docs} (id int PRIMARY KEY, n int, body text);
             ALTER TABLE {docs} ALTER COLUMN body SET STORAGE EXTERNAL;
             CREATE TABLE {grows} (id int PRIMARY KEY, x int);
             CREATE PUBLICATION {} FOR TABLE {pairs}, {docs}, {grows};",
            self.publication()
        ))
        .await
        .unwrap();
    }

    pub(crate) fn config(&self) -> PostgresCdcConfig {
        let mut config = PostgresCdcConfig::new(&self.url, self.publication(), self.slot());
        config.status_interval = Duration::from_secs(1);
        config.max_batch_records = 50;
        config
    }

    /// The slot's confirmed position, once it exists.
    pub(crate) async fn confirmed(&self, db: &Client) -> Option<Lsn> {
        let rows = db
            .query(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot()],
            )
            .await
            .unwrap();
        rows.first()
            .and_then(|r| r.get::<_, Option<String>>(0))
            .map(|t| t.parse().unwrap())
    }

    pub(crate) async fn wait_for_slot(&self, db: &Client) {
        for _ in 0..300 {
            if self.confirmed(db).await.is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the slot {} was never created", self.slot());
    }

    pub(crate) async fn drop_all(&self, db: &Client) {
        let _ = db
            .execute("SELECT pg_drop_replication_slot($1)", &[&self.slot()])
            .await;
    }

    /// Round `round` of the workload: inserts, updates (some of the key,
    /// some leaving the TOASTed body unchanged), deletes, multi-statement
    /// transactions; the second round adds a column first. Ends with a
    /// sentinel row `grows.id = -round`.
    pub(crate) async fn workload(&self, db: &Client, round: i32) {
        let (pairs, docs, grows) = (self.table("pairs"), self.table("docs"), self.table("grows"));
        let base = round * 1000;
        if round == 2 {
            db.batch_execute(&format!("ALTER TABLE {grows} ADD COLUMN y text"))
                .await
                .unwrap();
        }
        for i in 0..40 {
            let a = base + i % 10;
            let b = format!("k{}", i / 10);
            db.execute(
                &format!("INSERT INTO {pairs} VALUES ($1, $2, $3)"),
                &[&a, &b, &i],
            )
            .await
            .unwrap();
        }
        // One transaction of many statements.
        db.batch_execute(&format!(
            "BEGIN;
             UPDATE {pairs} SET v = v * 10 WHERE a % 3 = 0 AND a >= {base};
             UPDATE {pairs} SET b = b || 'x' WHERE a = {base} + 1;
             DELETE FROM {pairs} WHERE a = {base} + 2 AND b = 'k0';
             COMMIT;"
        ))
        .await
        .unwrap();
        for id in 0..6 {
            let id = base + id;
            db.execute(
                &format!(
                    "INSERT INTO {docs} SELECT $1, 0, string_agg(md5((g + $1)::text), '') \
                     FROM generate_series(1, 120) g"
                ),
                &[&id],
            )
            .await
            .unwrap();
        }
        // Updates that leave the TOASTed body unchanged, then one that
        // changes it, then a delete.
        db.batch_execute(&format!(
            "UPDATE {docs} SET n = n + 1 WHERE id >= {base};
             UPDATE {docs} SET n = n + 1 WHERE id = {base} + 1;
             UPDATE {docs} SET body = 'short' WHERE id = {base} + 2;
             DELETE FROM {docs} WHERE id = {base} + 3;"
        ))
        .await
        .unwrap();
        for id in 0..20 {
            let sql = if round == 2 {
                format!("INSERT INTO {grows} VALUES ({}, {id}, 'y{id}')", base + id)
            } else {
                format!("INSERT INTO {grows} VALUES ({}, {id})", base + id)
            };
            db.batch_execute(&sql).await.unwrap();
        }
        db.batch_execute(&format!(
            "UPDATE {grows} SET x = -x WHERE id % 4 = 0 AND id >= {base};
             DELETE FROM {grows} WHERE id % 5 = 1 AND id >= {base};
             INSERT INTO {grows} (id, x) VALUES (-{round}, 0);"
        ))
        .await
        .unwrap();
    }

    /// Every row of the three tables, by table and key, as JSON.
    pub(crate) async fn rows(&self, db: &Client) -> Model {
        let mut model = Model::default();
        for (base, key) in [
            ("pairs", &["a", "b"][..]),
            ("docs", &["id"]),
            ("grows", &["id"]),
        ] {
            let table = self.table(base);
            let rows = db
                .query(&format!("SELECT row_to_json(t)::text FROM {table} t"), &[])
                .await
                .unwrap();
            for row in rows {
                let row: Value = serde_json::from_str(&row.get::<_, String>(0)).unwrap();
                let key: serde_json::Map<String, Value> = key
                    .iter()
                    .map(|k| ((*k).to_owned(), row[*k].clone()))
                    .collect();
                model
                    .tables
                    .entry(table.clone())
                    .or_default()
                    .insert(Value::Object(key).to_string(), row);
            }
        }
        model.without_nulls();
        model
    }
}

/// Tables as the records describe them: rows by key.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Model {
    pub(crate) tables: BTreeMap<String, BTreeMap<String, Value>>,
}

impl Model {
    /// Apply change records in order.
    pub(crate) fn apply(&mut self, records: &[Record]) {
        for record in records {
            let change: Value = serde_json::from_slice(&record.value).unwrap();
            let table = change["table"].as_str().unwrap().to_owned();
            let rows = self.tables.entry(table).or_default();
            let key = change["key"].to_string();
            match change["op"].as_str().unwrap() {
                // A row of the initial snapshot.
                "insert" | "read" => {
                    rows.insert(key, change["after"].clone());
                }
                "update" => {
                    // The old key, when the key changed.
                    let previous = match change["before"].as_object() {
                        Some(before) => rows.remove(&Value::Object(before.clone()).to_string()),
                        None => rows.get(&key).cloned(),
                    };
                    let mut after = change["after"].clone();
                    for column in change["unchanged_toast"].as_array().into_iter().flatten() {
                        let column = column.as_str().unwrap();
                        // Replayed after a kill, an update may come again
                        // after the row's delete was applied: the delete
                        // comes again too. A row left without its value at
                        // the end fails the comparison.
                        if let Some(old) = previous.as_ref().and_then(|p| p.get(column)) {
                            after[column] = old.clone();
                        }
                    }
                    rows.insert(key, after);
                }
                "delete" => {
                    rows.remove(&key);
                }
                "truncate" => rows.clear(),
                other => panic!("unknown op {other}"),
            }
        }
        self.tables.retain(|_, rows| !rows.is_empty());
        self.without_nulls();
    }

    /// Null columns left out: a column added later is null in the rows
    /// written before, which no change mentions.
    pub(crate) fn without_nulls(&mut self) {
        for rows in self.tables.values_mut() {
            for row in rows.values_mut() {
                if let Value::Object(columns) = row {
                    columns.retain(|_, v| !v.is_null());
                }
            }
        }
    }
}

/// Whether the records hold the sentinel of `round`.
pub(crate) fn has_sentinel(records: &[Record], round: i32) -> bool {
    records.iter().any(|r| {
        let change: Value = serde_json::from_slice(&r.value).unwrap();
        change["op"] == "insert" && change["key"]["id"] == -round
    })
}

/// Where a kill loop's run stands, for [`kill_after_a_while`].
pub(crate) struct KillLoop {
    /// Kills that came while the snapshot was being delivered.
    pub(crate) in_snapshot: u32,
    /// How many kills the snapshot should get before the runs grow.
    pub(crate) snapshot_kills: u32,
    /// Kills while streaming (the slot existed).
    pub(crate) streaming: u32,
    /// Kills in a row before the slot existed: each makes the next run
    /// longer, so that a snapshot completes on a loaded machine.
    pub(crate) no_slot: u64,
    /// How long a run lives once streaming, by run number (mod 4), in ms.
    pub(crate) streaming_delays: [u64; 4],
}

/// Let run `run` of the `etl` command (`child`, logging under `dir`) go
/// for a while chosen from where the loop stands, then SIGKILL it. It
/// must not have ended by itself. Returns how long it ran, in ms.
pub(crate) async fn kill_after_a_while(
    child: &mut std::process::Child,
    state: &KillLoop,
    dir: &std::path::Path,
    run: u32,
) -> u64 {
    let delay = if state.streaming > 0 {
        state.streaming_delays[run as usize % 4]
    } else if state.in_snapshot < state.snapshot_kills {
        // In the snapshot: soon after its first rows.
        300 + 300 * state.no_slot
    } else {
        2000 + 1500 * state.no_slot
    };
    tokio::time::sleep(Duration::from_millis(delay)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "run {run} ended by itself: {}",
        etl_test_support::run_stderr(dir, run)
    );
    child.kill().unwrap();
    child.wait().unwrap();
    delay
}
