//! The initial snapshot: the rows present before the slot, once each,
//! then the changes from the slot's consistent point, with nothing lost
//! or doubled between them; a snapshot interrupted by a kill is taken
//! again, as is one interrupted by a restart of the server.

use std::collections::BTreeMap;
use std::time::Duration;

use etl::Pipeline;
use etl_checkpoint::MemoryStore;
use etl_postgres_cdc::PostgresCdcSource;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::testing::MemorySink;
use etl_sink::{NdjsonEncoder, SinkDriver};
use etl_source::{Source, SourceDriverConfig, SourceEvent};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::support::{Model, Names, client, client_of, has_sentinel};

const SLOT: PartitionId = PartitionId(0);

fn change(record: &Record) -> Value {
    serde_json::from_slice(&record.value).unwrap()
}

/// `rows` rows in `grows` and a tenth as many TOASTed ones in `docs`,
/// before anything reads the slot.
async fn fill(names: &Names, db: &tokio_postgres::Client, rows: i32) {
    db.batch_execute(&format!(
        "INSERT INTO {grows} SELECT g, g FROM generate_series(1, {rows}) g;
         INSERT INTO {docs} SELECT g, 0, repeat(md5(g::text), 80) \
           FROM generate_series(1, {tenth}) g;
         INSERT INTO {pairs} VALUES (1, 'a', 1), (1, 'b', 2);",
        grows = names.table("grows"),
        docs = names.table("docs"),
        pairs = names.table("pairs"),
        tenth = rows / 10,
    ))
    .await
    .unwrap();
}

/// The rows the snapshot read, by table and key; a key read twice fails.
fn read_once(records: &[Record]) -> BTreeMap<(String, String), Value> {
    let mut read = BTreeMap::new();
    for record in records {
        let change = change(record);
        if change["op"] != "read" {
            continue;
        }
        let key = (
            change["table"].as_str().unwrap().to_owned(),
            change["key"].to_string(),
        );
        assert!(
            read.insert(key.clone(), change["after"].clone()).is_none(),
            "{key:?} read twice"
        );
    }
    read
}

/// Reads the first part of the snapshot, then writes (updates and
/// deletes of rows not read yet, inserts), then reads on: the snapshot
/// holds exactly the rows as they were before the writes, each once, and
/// every write arrives after it as a change. Replayed, the records give
/// the tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rows_present_before_the_slot_arrive_once_then_every_change_made_during_the_snapshot() {
    const ROWS: i32 = 2000;
    let names = Names::new("snap");
    let db = client().await;
    names.create(&db).await;
    fill(&names, &db, ROWS).await;
    let before = names.rows(&db).await;
    let grows = names.table("grows");

    let mut source = PostgresCdcSource::new(names.config()).unwrap();
    assert!(matches!(
        source.next().await.unwrap(),
        SourceEvent::Assigned(_)
    ));
    source.seek(SLOT, Offset(0)).await.unwrap();
    let mut records: Vec<Record> = Vec::new();
    while records.len() < 100 {
        if let SourceEvent::Batch(batch) = source.next().await.unwrap() {
            assert!(batch.rejected.is_empty(), "{:?}", batch.rejected);
            records.extend(batch.records);
        }
    }
    assert!(
        names.confirmed(&db).await.is_none(),
        "the slot exists before its snapshot was delivered"
    );
    // Written while the snapshot is being read: the rows at the end of
    // the table are not read yet.
    db.batch_execute(&format!(
        "UPDATE {grows} SET x = -x WHERE id > {ROWS} - 100;
         DELETE FROM {grows} WHERE id > {ROWS} - 10;
         INSERT INTO {grows} VALUES ({ROWS} + 1, 1), ({ROWS} + 2, 2);
         INSERT INTO {grows} (id, x) VALUES (-1, 0);",
    ))
    .await
    .unwrap();

    let total = before.tables.values().map(BTreeMap::len).sum::<usize>();
    for _ in 0..3000 {
        if has_sentinel(&records, 1) {
            break;
        }
        match source.next().await.unwrap() {
            SourceEvent::Batch(batch) => {
                assert!(batch.rejected.is_empty(), "{:?}", batch.rejected);
                records.extend(batch.records);
            }
            SourceEvent::Idle => {
                // The slot is made once the snapshot is delivered.
                let last = records.last().unwrap().position.offset.0;
                let offsets = [(SLOT, Offset(last + 1))].into_iter().collect();
                source.commit(&offsets).await.unwrap();
            }
            _ => {}
        }
    }
    assert!(has_sentinel(&records, 1), "the changes never came");

    let read = read_once(&records);
    assert_eq!(read.len(), total, "rows read");
    let mut as_read = Model::default();
    as_read.apply(&records[..total]);
    assert_eq!(
        as_read, before,
        "the snapshot is the tables before the writes"
    );
    assert!(
        records[total..].iter().all(|r| change(r)["op"] != "read"),
        "the changes come after the snapshot"
    );
    let offsets: Vec<i64> = records.iter().map(|r| r.position.offset.0).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "offsets grow");

    let mut replayed = Model::default();
    replayed.apply(&records);
    assert_eq!(replayed, names.rows(&db).await, "rows lost or doubled");
    drop(source);
    names.drop_all(&db).await;
}

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

/// Kills the pipeline (its task aborted) while the snapshot is being
/// delivered, with rows written meanwhile: no slot is left behind, and
/// the next run takes the snapshot again; replayed, everything the sink
/// got gives the tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_killed_midway_is_taken_again_and_loses_nothing() {
    const ROWS: i32 = 20_000;
    let names = Names::new("snapkill");
    let db = client().await;
    names.create(&db).await;
    fill(&names, &db, ROWS).await;
    let grows = names.table("grows");
    let sink = MemorySink::new();
    let store = MemoryStore::new();

    let run = tokio::spawn(pipeline(&names, &sink, &store).run(CancellationToken::new()));
    let mut seen = 0;
    for _ in 0..20_000 {
        seen = sink.records().len();
        if seen > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    db.batch_execute(&format!(
        "UPDATE {grows} SET x = x + 1 WHERE id % 7 = 0; DELETE FROM {grows} WHERE id % 11 = 0;"
    ))
    .await
    .unwrap();
    run.abort();
    let _ = run.await;
    let delivered = sink.records().len();
    assert!(
        seen > 0 && delivered < ROWS as usize,
        "killed after {delivered} records: not during the snapshot"
    );
    assert!(
        names.confirmed(&db).await.is_none(),
        "a slot was left by a snapshot not delivered"
    );

    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline(&names, &sink, &store).run(stop.clone()));
    // Once the second snapshot is delivered and the slot made, changes.
    for _ in 0..1200 {
        if names.confirmed(&db).await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    db.batch_execute(&format!(
        "UPDATE {grows} SET x = 0 WHERE id % 13 = 0; INSERT INTO {grows} (id, x) VALUES (-1, 0);"
    ))
    .await
    .unwrap();
    let mut records = Vec::new();
    let mut checked = 0;
    for _ in 0..600 {
        records = sink.records();
        if has_sentinel(&records[checked..], 1) {
            break;
        }
        checked = records.len();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        has_sentinel(&records[checked..], 1),
        "the changes never came: {} records, committed {:?}, slot {:?}",
        records.len(),
        store.offsets(),
        names.confirmed(&db).await
    );
    // The second run's snapshot and changes, replayed over what the first
    // delivered, give the tables: the first run's rows are read again.
    // (Which run a record came from is not told apart: the aborted run's
    // tasks may still hand the sink a batch after the abort.)
    let mut replayed = Model::default();
    replayed.apply(&records);
    assert_eq!(replayed, names.rows(&db).await, "rows lost after the kill");
    stop.cancel();
    run.await.unwrap().unwrap();
    names.drop_all(&db).await;
}

/// The source server stopped (fast shutdown) and started again while the
/// snapshot's rows are being delivered: the temporary slot and the
/// exported snapshot go with the server, so the source, reconnecting by
/// itself, takes the snapshot again from the beginning (the documented
/// rule: restart, not resume) before it makes the slot and streams.
/// Replayed, everything the sink got gives the tables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_during_the_snapshot_has_it_taken_again_with_nothing_lost() {
    const ROWS: i32 = 30_000;
    let server = etl_test_support::postgres::start().unwrap();
    let names = Names::on("snaprestart", server.url());
    let db = client_of(&names.url).await;
    names.create(&db).await;
    fill(&names, &db, ROWS).await;
    // The rows `fill` wrote: grows, a tenth as many docs, two pairs.
    let rows = (ROWS + ROWS / 10 + 2) as usize;
    let grows = names.table("grows");
    let sink = MemorySink::new();
    let store = MemoryStore::new();
    let stop = CancellationToken::new();
    let run = tokio::spawn(pipeline(&names, &sink, &store).run(stop.clone()));
    for _ in 0..20_000 {
        if !sink.records().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    server.stop().unwrap();
    let delivered = sink.records().len();
    assert!(
        delivered > 0 && delivered < rows,
        "stopped after {delivered} of {rows} rows: not during the snapshot"
    );
    server.restart().unwrap();
    let db = client_of(&names.url).await;
    // The slot exists once a snapshot was delivered whole; then changes.
    for _ in 0..1200 {
        if names.confirmed(&db).await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    db.batch_execute(&format!(
        "UPDATE {grows} SET x = 0 WHERE id % 13 = 0; DELETE FROM {grows} WHERE id % 17 = 0; \
         INSERT INTO {grows} (id, x) VALUES (-1, 0);"
    ))
    .await
    .unwrap();
    let mut records = Vec::new();
    for _ in 0..600 {
        records = sink.records();
        if has_sentinel(&records, 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        has_sentinel(&records, 1),
        "the changes never came: {} records, committed {:?}, slot {:?}",
        records.len(),
        store.offsets(),
        names.confirmed(&db).await
    );
    assert!(!run.is_finished(), "the pipeline stopped: {:?}", run.await);
    // Taken again from the beginning: the first row read before the stop
    // is read again after it.
    let first = change(&records[0]);
    assert_eq!(first["op"], "read");
    let again = records[delivered..]
        .iter()
        .map(change)
        .any(|c| c["op"] == "read" && c["table"] == first["table"] && c["key"] == first["key"]);
    assert!(again, "the snapshot was not taken again: {first}");
    let offsets: Vec<i64> = records.iter().map(|r| r.position.offset.0).collect();
    assert!(
        offsets.windows(2).all(|w| w[0] < w[1]),
        "offsets go back across the restart"
    );
    let mut replayed = Model::default();
    replayed.apply(&records);
    assert_eq!(
        replayed,
        names.rows(&db).await,
        "rows lost across the restart"
    );
    stop.cancel();
    run.await.unwrap().unwrap();
}
