//! Changes read through the whole pipeline into a sink, replayed into a
//! model, and compared row by row with the source's tables.

use std::time::Duration;

use etl::{Pipeline, PipelineError};
use etl_checkpoint::MemoryStore;
use etl_postgres_cdc::PostgresCdcSource;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::testing::MemorySink;
use etl_sink::{NdjsonEncoder, SinkDriver};
use etl_source::SourceDriverConfig;
use tokio_util::sync::CancellationToken;

use crate::support::{Model, Names, client, client_of, has_sentinel};

/// A pipeline from the slot into `sink`, committing into `store` and
/// passing commits to the source every 100 ms.
fn pipeline(names: &Names, sink: &MemorySink, store: &MemoryStore) -> Pipeline {
    Pipeline::builder()
        .source(PostgresCdcSource::new(names.config()).unwrap())
        .sink(
            "memory",
            SinkDriver::new(sink.clone(), NdjsonEncoder::new()),
        )
        .offset_store(store.clone())
        .source_driver(SourceDriverConfig {
            source_commit_interval: Some(Duration::from_millis(100)),
            ..SourceDriverConfig::default()
        })
        .build()
        .unwrap()
}

/// A pipeline whose source follows the checkpointer's commits itself
/// (the source driver passes it none).
fn pipeline_following(names: &Names, sink: &MemorySink, store: &MemoryStore) -> Pipeline {
    let config = names.config();
    Pipeline::builder()
        .source_factory(move |checkpoint| {
            let source = PostgresCdcSource::new(config)
                .map_err(|e| PipelineError::Invalid(e.to_string()))?;
            Ok(Box::new(source.following(checkpoint.clone())))
        })
        .sink(
            "memory",
            SinkDriver::new(sink.clone(), NdjsonEncoder::new()),
        )
        .offset_store(store.clone())
        .build()
        .unwrap()
}

async fn wait_for(sink: &MemorySink, round: i32) -> Vec<Record> {
    for _ in 0..600 {
        let records = sink.records();
        if has_sentinel(&records, round) {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("round {round}'s changes never reached the sink");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_replayed_from_the_sink_match_the_tables_row_by_row() {
    let names = Names::new("rows");
    let db = client().await;
    names.create(&db).await;
    let sink = MemorySink::new();
    let store = MemoryStore::new();
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline_following(&names, &sink, &store).run(stop.clone()));
    names.wait_for_slot(&db).await;
    let start = names.confirmed(&db).await.unwrap();

    names.workload(&db, 1).await;
    names.workload(&db, 2).await;
    let records = wait_for(&sink, 2).await;

    let mut replayed = Model::default();
    replayed.apply(&records);
    let expected = names.rows(&db).await;
    assert_eq!(
        replayed.tables.keys().collect::<Vec<_>>(),
        expected.tables.keys().collect::<Vec<_>>()
    );
    for (table, rows) in &expected.tables {
        for (key, row) in rows {
            assert_eq!(replayed.tables[table].get(key), Some(row), "{table} {key}");
        }
        assert_eq!(replayed.tables[table].len(), rows.len(), "{table}");
    }

    // The slot follows the checkpointer's commits, read by the source
    // itself: the driver passes it none.
    let mut moved = false;
    for _ in 0..100 {
        if names.confirmed(&db).await.unwrap() > start {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(moved, "the slot never moved past {start}");
    stop.cancel();
    run.await.unwrap().unwrap();
    names.drop_all(&db).await;
}

/// Kills the pipeline (its task aborted, nothing flushed or committed on
/// the way out) eight times, each while a round of the workload is being
/// written, at a different moment; after every kill checks the slot is
/// not ahead of the committed offset; then runs it once more from the
/// same offset store: the tables replayed from everything the sink got
/// match the source's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_pipeline_resumes_with_nothing_lost_and_the_slot_never_ahead() {
    const KILLS: i32 = 8;
    let names = Names::new("kill");
    let db = client().await;
    names.create(&db).await;
    let sink = MemorySink::new();
    let store = MemoryStore::new();
    for round in 1..=KILLS {
        let run = tokio::spawn(pipeline(&names, &sink, &store).run(CancellationToken::new()));
        names.wait_for_slot(&db).await;
        let writer = {
            let names = Names {
                suffix: names.suffix.clone(),
                url: names.url.clone(),
            };
            tokio::spawn(async move {
                let db = client().await;
                names.workload(&db, round).await;
            })
        };
        // Killed early in the round, or late, or after it.
        let delay = [150, 600, 1200, 2500][round as usize % 4];
        tokio::time::sleep(Duration::from_millis(delay)).await;
        run.abort();
        let _ = run.await;
        writer.await.unwrap();

        // Every change before the slot's confirmed position was committed.
        let confirmed = names.confirmed(&db).await.unwrap();
        let committed = store
            .offsets()
            .get(&PartitionId(0))
            .copied()
            .unwrap_or(Offset(0));
        for record in sink.records() {
            let change: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
            let commit_lsn: etl_postgres_cdc::Lsn =
                change["commit_lsn"].as_str().unwrap().parse().unwrap();
            if commit_lsn < confirmed && record.position.offset >= committed {
                // Read again after a kill: offsets of a new run. What
                // counts is that some run committed it.
                let committed_before = sink
                    .records()
                    .iter()
                    .any(|r| r.value == record.value && r.position.offset < committed);
                assert!(
                    committed_before,
                    "kill {round}: the slot is confirmed at {confirmed}, past a change \
                     (commit {commit_lsn}, offset {}) the checkpointer has not committed \
                     ({committed})",
                    record.position.offset
                );
            }
        }
    }

    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline(&names, &sink, &store).run(stop.clone()));
    let records = wait_for(&sink, KILLS).await;
    let mut replayed = Model::default();
    replayed.apply(&records);
    assert_eq!(
        replayed,
        names.rows(&db).await,
        "rows lost or wrong after the kills"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
    names.drop_all(&db).await;
}

/// The source server stopped and started again mid-stream: the source
/// reconnects by itself and the rows replayed from the sink match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_mid_stream_is_reconnected_with_nothing_lost() {
    let server = etl_test_support::postgres::start().unwrap();
    let names = Names::on("restart", server.url());
    let db = client_of(&names.url).await;
    names.create(&db).await;
    let sink = MemorySink::new();
    let store = MemoryStore::new();
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline(&names, &sink, &store).run(stop.clone()));
    names.wait_for_slot(&db).await;
    names.workload(&db, 1).await;
    wait_for(&sink, 1).await;

    server.stop().unwrap();
    server.restart().unwrap();
    let db = client_of(&names.url).await;
    names.workload(&db, 2).await;
    let records = wait_for(&sink, 2).await;
    let mut replayed = Model::default();
    replayed.apply(&records);
    assert_eq!(
        replayed,
        names.rows(&db).await,
        "rows lost or wrong across the restart"
    );
    assert!(!run.is_finished(), "the pipeline stopped: {:?}", run.await);
    stop.cancel();
    run.await.unwrap().unwrap();
}

/// The pipeline `etl run` builds from its configuration, through the
/// registry (`register`, the `etl` command's line for this crate): the
/// source follows the checkpointer's commits, so the slot moves past
/// delivered transactions while the pipeline runs rather than keeping the
/// server's WAL until it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_built_from_the_configuration_moves_the_slot_while_it_runs() {
    let names = Names::new("registry");
    let db = client().await;
    names.create(&db).await;
    let folder = std::env::temp_dir().join(format!("etl-cdc-registry-{}", names.suffix));
    std::fs::create_dir_all(&folder).unwrap();
    let text = format!(
        "[source]\ntype = \"postgres_cdc\"\nurl = \"{}\"\npublication = \"{}\"\nslot = \"{}\"\n\
         status_interval = \"1s\"\n\n[[sinks]]\ntype = \"file\"\npath = \"changes.ndjson\"\n",
        names.url,
        names.publication(),
        names.slot()
    );
    let registry = etl_postgres_cdc::register(etl::registry());
    let config = registry.loader().text(&text, &folder).unwrap();
    let pipeline = etl::pipeline_from_config(&config).await.unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline.run(stop.clone()));
    names.wait_for_slot(&db).await;
    let start = names.confirmed(&db).await.unwrap();

    names.workload(&db, 1).await;
    // The slot may move to the commit of the first transaction before
    // it is delivered (the server sends that one again after a
    // restart): wait for the changes in the file as well.
    let (mut moved, mut written) = (false, String::new());
    for _ in 0..300 {
        moved = names.confirmed(&db).await.unwrap() > start;
        written = std::fs::read_to_string(folder.join("changes.ndjson")).unwrap_or_default();
        if moved && written.lines().count() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    names.drop_all(&db).await;
    let _ = std::fs::remove_dir_all(&folder);
    assert!(
        moved,
        "the slot never moved past {start} while the pipeline ran ({} lines written)",
        written.lines().count()
    );
    assert!(written.lines().count() > 0, "no change was written");
}

/// The replication connection broken again and again while one large
/// transaction streams: the changes read but not yet handed on when it
/// broke are read again after the reconnect, never skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_broken_in_the_middle_of_a_transaction_loses_none_of_its_changes() {
    const ROWS: usize = 20_000;
    let names = Names::new("midtxn");
    let db = client().await;
    names.create(&db).await;
    let sink = MemorySink::new();
    let stop = CancellationToken::new();
    // A slow sink: the source waits on it, so the server is still sending
    // the transaction when its connection is broken.
    let slow = etl_sink::testing::Slow::new(sink.clone(), Duration::from_millis(10));
    let pipeline = Pipeline::builder()
        .source(PostgresCdcSource::new(names.config()).unwrap())
        .sink(
            "slow",
            SinkDriver::new(slow, NdjsonEncoder::new()).config(etl_sink::SinkDriverConfig {
                batch_max_records: 50,
                ..etl_sink::SinkDriverConfig::default()
            }),
        )
        .offset_store(MemoryStore::new())
        .source_driver(SourceDriverConfig {
            source_commit_interval: Some(Duration::from_millis(100)),
            ..SourceDriverConfig::default()
        })
        .build()
        .unwrap();
    let run = tokio::spawn(pipeline.run(stop.clone()));
    names.wait_for_slot(&db).await;
    let grows = names.table("grows");
    let ids = |sink: &MemorySink| {
        sink.records()
            .iter()
            .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.value).ok())
            .filter(|v| v["table"] == grows.as_str())
            .filter_map(|v| v["after"]["id"].as_i64())
            .collect::<std::collections::BTreeSet<i64>>()
    };
    db.batch_execute(&format!(
        "INSERT INTO {grows} (id, x) SELECT g, g FROM generate_series(1, {ROWS}) g"
    ))
    .await
    .unwrap();

    // Break the walsender's connection whenever some, not all, of the
    // transaction's changes have arrived.
    let mut broken = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut seen = 0;
    while ids(&sink).len() < ROWS && std::time::Instant::now() < deadline {
        let now = ids(&sink).len();
        if broken < 8 && now > seen {
            seen = now;
            let ended = db
                .query(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                     WHERE slot_name = $1 AND active_pid IS NOT NULL",
                    &[&names.slot()],
                )
                .await
                .unwrap();
            broken += ended.len();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let got = ids(&sink);
    eprintln!(
        "{broken} connections broken; {} of {ROWS} changes",
        got.len()
    );
    stop.cancel();
    let _ = run.await;
    names.drop_all(&db).await;
    assert!(
        broken > 0,
        "the connection was never broken mid-transaction"
    );
    assert_eq!(
        got.len(),
        ROWS,
        "{} changes lost after {broken} broken connections",
        ROWS - got.len()
    );
}

/// The value of the gauge `name` in the metrics' text, if it is there.
fn gauge(text: &str, name: &str) -> Option<i64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The WAL the slot retains is a gauge of the pipeline's metrics (what
/// `/metrics` serves): it rises with a large transaction the pipeline
/// has read and not yet delivered, to at least half the WAL the
/// transaction wrote, and falls back once it is delivered and the slot
/// confirmed past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retained_wal_is_a_gauge_on_the_metrics_that_follows_the_stream() {
    const NAME: &str = "etl_source_retained_wal_bytes";
    const ROWS: i32 = 50_000;
    let names = Names::new("gauge");
    let db = client().await;
    names.create(&db).await;
    let grows = names.table("grows");
    let sink = MemorySink::new();
    let store = MemoryStore::new();
    let pipeline = pipeline_following(&names, &sink, &store);
    let hub = pipeline.metrics();
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline.run(stop.clone()));
    names.wait_for_slot(&db).await;
    let mut present = false;
    for _ in 0..300 {
        if gauge(&hub.prometheus(), NAME).is_some() {
            present = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(present, "no {NAME} gauge: {}", hub.prometheus());

    let wal = |row: tokio_postgres::Row| -> i64 { row.get(0) };
    let before = wal(db
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::int8", &[])
        .await
        .unwrap());
    db.batch_execute(&format!(
        "INSERT INTO {grows} SELECT g, g FROM generate_series(1, {ROWS}) g; \
         INSERT INTO {grows} (id, x) VALUES (-1, 0);"
    ))
    .await
    .unwrap();
    let after = wal(db
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::int8", &[])
        .await
        .unwrap());
    let written = after - before;
    let mut peak = 0;
    for _ in 0..6000 {
        peak = peak.max(gauge(&hub.prometheus(), NAME).unwrap_or(0));
        if hub.totals().written > ROWS as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(has_sentinel(&sink.records(), 1), "the changes never came");
    assert!(
        peak >= written / 2,
        "the gauge peaked at {peak} while a transaction of {written} bytes of WAL was read \
         and not delivered"
    );
    // The sentinel commits a few bytes after the large transaction, so
    // its offsets follow the large one's (50,000 of them) rather than its
    // commit LSN: a restart must decode both again until the server's end
    // of WAL passes their offsets. A busy server gets there by itself;
    // here, WAL on a table outside the publication.
    let other = names.table("other");
    db.batch_execute(&format!(
        "CREATE TABLE {other} AS SELECT g AS id, md5(g::text) AS pad FROM generate_series(1, 5000) g"
    ))
    .await
    .unwrap();
    let mut now = peak;
    for _ in 0..300 {
        now = gauge(&hub.prometheus(), NAME).unwrap_or(now);
        if now < peak / 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        now < peak / 4,
        "the gauge stays at {now} (peak {peak}) once everything was delivered"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
    db.batch_execute(&format!("DROP TABLE {other}"))
        .await
        .unwrap();
    names.drop_all(&db).await;
}
