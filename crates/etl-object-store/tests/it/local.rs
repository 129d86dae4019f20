//! A local folder as the store.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use etl_ack::AckStatus;
use etl_object_store::ObjectStoreSink;
use etl_record::{Offset, PartitionId};
use etl_sink::testing::MemorySink;
use etl_sink::{ProgressSink, SinkDriver, SinkDriverConfig};
use object_store::local::LocalFileSystem;
use serde_json::json;

use crate::faults::FaultyStore;
use crate::support::{config, deliver, read_folder, record, rows};

const PARQUET: &str = r#"
    key = "orders/p={partition}/{first_offset}.parquet"
    [store]
    kind = "local"
    path = "lake"
    [encoding]
    format = "parquet"
    compression = "snappy"
    row_group_rows = 2
    columns = [
        { name = "id", type = "int64", nullable = false },
        { name = "price", type = "float64" },
        { name = "paid", type = "boolean" },
        { name = "at", type = "timestamp" },
        { name = "customer", type = "struct", fields = [
            { name = "name", type = "string", nullable = false },
            { name = "region", type = "string", field = "address.region" },
        ] },
        { name = "tags", type = "list", item = { name = "tag", type = "string" } },
    ]
"#;

fn order(id: i64) -> String {
    json!({
        "id": id,
        "price": id as f64 * 1.5,
        "paid": id % 2 == 0,
        "at": format!("2026-12-06T02:{:02}:00Z", id % 60),
        "customer": {"name": format!("c{id}"), "address": {"region": "eu"}},
        "tags": ["a", format!("t{id}")],
        "ignored": true,
    })
    .to_string()
}

#[tokio::test]
async fn parquet_objects_read_back_by_pyarrow_hold_every_row_and_the_declared_schema() {
    let folder = tempfile::tempdir().unwrap();
    let sink = ObjectStoreSink::new("lake", folder.path(), config(PARQUET)).unwrap();
    let encoder = sink.encoder();
    let driver = SinkDriver::new(sink, encoder).spawn();
    let batches = vec![
        (0..5).map(|o| record(0, o, &order(o))).collect(),
        (0..3).map(|o| record(1, o, &order(100 + o))).collect(),
    ];
    let (statuses, closed) = deliver(driver, batches).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered, AckStatus::Delivered]);

    let objects = read_folder(&folder.path().join("lake"), "orders");
    let keys: Vec<&str> = objects.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "orders/p=0/00000000000000000000.parquet",
            "orders/p=1/00000000000000000000.parquet"
        ]
    );
    let schema = &objects[0].1;
    for column in [
        "id: int64 not null",
        "price: double",
        "paid: bool",
        "at: timestamp[us, tz=UTC]",
        "customer: struct<name: string not null, region: string>",
        "tags: list<item: string>",
    ] {
        assert!(schema.contains(column), "{column} in {schema}");
    }
    let rows = rows(&objects);
    assert_eq!(rows.len(), 8);
    let ids: Vec<i64> = [0, 1, 2, 3, 4, 100, 101, 102].to_vec();
    for (row, id) in rows.iter().zip(ids) {
        assert_eq!(row["id"], json!(id));
        assert_eq!(row["price"], json!(id as f64 * 1.5));
        assert_eq!(row["paid"], json!(id % 2 == 0));
        assert_eq!(
            row["at"].as_str().unwrap(),
            format!("2026-12-06 02:{:02}:00+00:00", id % 60)
        );
        assert_eq!(
            row["customer"],
            json!({"name": format!("c{id}"), "region": "eu"})
        );
        assert_eq!(row["tags"], json!(["a", format!("t{id}")]));
        assert!(row.get("ignored").is_none(), "{row}");
    }
}

#[tokio::test]
async fn ndjson_gzip_and_zstd_objects_read_back_by_pyarrow() {
    for (compression, ext) in [
        ("none", "ndjson"),
        ("gzip", "ndjson.gz"),
        ("zstd", "ndjson.zst"),
    ] {
        let folder = tempfile::tempdir().unwrap();
        let text = format!(
            "key = \"events/{{topic}}/{{partition}}-{{first_offset}}.{ext}\"\n\
             [store]\nkind = \"local\"\npath = \"lake\"\n\
             [encoding]\nformat = \"ndjson\"\ncompression = \"{compression}\"\n"
        );
        let sink = ObjectStoreSink::new("lake", folder.path(), config(&text)).unwrap();
        let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new()).spawn();
        let values: Vec<String> = (0..50)
            .map(|i| json!({"n": i, "s": "é\"x"}).to_string())
            .collect();
        let batch = values
            .iter()
            .enumerate()
            .map(|(o, v)| record(2, o as i64, v))
            .collect();
        let (statuses, closed) = deliver(driver, vec![batch]).await;
        closed.unwrap();
        assert_eq!(statuses, [AckStatus::Delivered], "{compression}");
        let objects = read_folder(&folder.path().join("lake"), "events");
        assert_eq!(objects.len(), 1, "{compression}");
        assert_eq!(
            objects[0].0,
            format!("events/orders/2-00000000000000000000.{ext}")
        );
        let got = rows(&objects);
        let want: Vec<serde_json::Value> = values
            .iter()
            .map(|v| serde_json::from_str(v).unwrap())
            .collect();
        assert_eq!(got, want, "{compression}");
    }
}

#[tokio::test]
async fn a_record_that_does_not_fit_the_schema_goes_to_the_dead_letter_sink_and_the_rest_lands() {
    let folder = tempfile::tempdir().unwrap();
    let sink = ObjectStoreSink::new("lake", folder.path(), config(PARQUET)).unwrap();
    let encoder = sink.encoder();
    let letters = MemorySink::new();
    let driver = SinkDriver::new(sink, encoder)
        .dead_letters(letters.clone())
        .spawn();
    let batch = vec![
        record(0, 0, &order(0)),
        record(0, 1, r#"{"id": "one"}"#),
        record(0, 2, r#"{"price": 2}"#),
        record(0, 3, "not json"),
        record(0, 4, &order(4)),
    ];
    let (statuses, closed) = deliver(driver, vec![batch]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    let dead: Vec<i64> = letters
        .records()
        .iter()
        .map(|r| r.position.offset.0)
        .collect();
    assert_eq!(dead, [1, 2, 3]);
    let objects = read_folder(&folder.path().join("lake"), "orders");
    let ids: Vec<i64> = rows(&objects)
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [0, 4]);
}

#[tokio::test]
async fn the_sink_rejects_what_the_plain_encoder_let_through_and_writes_the_rest() {
    // The registry's path: batches encoded as plain NDJSON, the sink
    // itself refusing what does not fit.
    let folder = tempfile::tempdir().unwrap();
    let sink = ObjectStoreSink::new("lake", folder.path(), config(PARQUET)).unwrap();
    let letters = MemorySink::new();
    let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new())
        .dead_letters(letters.clone())
        .spawn();
    let batch = vec![record(0, 0, &order(0)), record(0, 1, r#"{"id": 1.5}"#)];
    let (statuses, closed) = deliver(driver, vec![batch]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    assert_eq!(letters.records().len(), 1);
    assert_eq!(
        rows(&read_folder(&folder.path().join("lake"), "orders")).len(),
        1
    );
}

#[tokio::test]
async fn objects_are_cut_where_the_key_changes_and_at_offset_multiples() {
    let folder = tempfile::tempdir().unwrap();
    let text = r#"
        key = "by-region/{region}/{partition}-{first_offset}.ndjson"
        max_object_offsets = 4
        [store]
        kind = "local"
        path = "lake"
    "#;
    let sink = ObjectStoreSink::new("lake", folder.path(), config(text)).unwrap();
    let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new()).spawn();
    let regions = ["eu", "eu", "us", "us", "us", "us", "us", "eu"];
    let batch = regions
        .iter()
        .enumerate()
        .map(|(o, r)| record(0, o as i64, &json!({"region": r, "o": o}).to_string()))
        .collect();
    let (_, closed) = deliver(driver, vec![batch]).await;
    closed.unwrap();
    let objects = read_folder(&folder.path().join("lake"), "by-region");
    let layout: Vec<(String, usize)> = objects
        .iter()
        .map(|(k, _, r)| (k.clone(), r.len()))
        .collect();
    let key = |region: &str, first: u32| format!("by-region/{region}/0-{first:020}.ndjson");
    assert_eq!(
        layout,
        [
            (key("eu", 0), 2),
            (key("eu", 7), 1),
            (key("us", 2), 2),
            (key("us", 4), 3),
        ]
    );
}

#[tokio::test]
async fn date_and_hour_come_from_the_date_field_else_from_the_records_timestamp() {
    let folder = tempfile::tempdir().unwrap();
    let key = "t/dt={date}/h={hour}/{partition}-{first_offset}.ndjson";
    // From `date_field`: an RFC 3339 time (an offset other than UTC
    // counted in UTC), or milliseconds since 1970.
    let text = format!(
        "key = \"{key}\"\ndate_field = \"at\"\n[store]\nkind = \"local\"\npath = \"by-field\"\n"
    );
    let sink = ObjectStoreSink::new("lake", folder.path(), config(&text)).unwrap();
    let letters = MemorySink::new();
    let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new())
        .dead_letters(letters.clone())
        .spawn();
    let times = [
        json!("2026-12-06T23:59:59Z"),
        json!("2026-12-07T01:30:00+02:00"),
        json!(1_796_601_600_000_i64),
        json!("not a time"),
    ];
    let batch = times
        .iter()
        .enumerate()
        .map(|(o, at)| record(0, o as i64, &json!({"at": at, "o": o}).to_string()))
        .collect();
    let (_, closed) = deliver(driver, vec![batch]).await;
    closed.unwrap();
    let layout: Vec<(String, usize)> = read_folder(&folder.path().join("by-field"), "t")
        .iter()
        .map(|(k, _, r)| (k.clone(), r.len()))
        .collect();
    assert_eq!(
        layout,
        [
            (
                "t/dt=2026-12-06/h=23/0-00000000000000000000.ndjson".to_owned(),
                2
            ),
            (
                "t/dt=2026-12-07/h=00/0-00000000000000000002.ndjson".to_owned(),
                1
            ),
        ],
    );
    // A record whose date field is no time is dead-lettered, not placed
    // under the time of writing.
    let dead: Vec<i64> = letters
        .records()
        .iter()
        .map(|r| r.position.offset.0)
        .collect();
    assert_eq!(dead, [3]);

    // Without `date_field`: the record's timestamp.
    let text = format!("key = \"{key}\"\n[store]\nkind = \"local\"\npath = \"by-timestamp\"\n");
    let sink = ObjectStoreSink::new("lake", folder.path(), config(&text)).unwrap();
    let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new()).spawn();
    let mut stamped = record(0, 0, "{}");
    stamped.timestamp = Some(etl_record::Timestamp(1_796_605_200_000));
    let (_, closed) = deliver(driver, vec![vec![stamped]]).await;
    closed.unwrap();
    let keys: Vec<String> = read_folder(&folder.path().join("by-timestamp"), "t")
        .into_iter()
        .map(|(k, _, _)| k)
        .collect();
    assert_eq!(keys, ["t/dt=2026-12-07/h=01/0-00000000000000000000.ndjson"]);
}

/// Records of one partition under two topics in one batch: each run of a
/// topic is an object of its own, as the key's `{topic}` says, though the
/// key reads no field.
#[tokio::test]
async fn a_partitions_records_of_another_topic_start_an_object_of_their_own() {
    let folder = tempfile::tempdir().unwrap();
    let text = r#"
        key = "t/{topic}/{partition}-{first_offset}.parquet"
        [store]
        kind = "local"
        path = "lake"
        [encoding]
        format = "parquet"
        columns = [{ name = "o", type = "int64", nullable = false }]
    "#;
    let sink = ObjectStoreSink::new("lake", folder.path(), config(text)).unwrap();
    let encoder = sink.encoder();
    let driver = SinkDriver::new(sink, encoder).spawn();
    let topics = ["a", "a", "b", "b", "b", "a"];
    let batch = topics
        .iter()
        .enumerate()
        .map(|(o, t)| {
            let mut r = record(0, o as i64, &json!({ "o": o }).to_string());
            r.topic = Some((*t).into());
            r
        })
        .collect();
    let (_, closed) = deliver(driver, vec![batch]).await;
    closed.unwrap();
    let objects = read_folder(&folder.path().join("lake"), "t");
    let layout: Vec<(String, Vec<serde_json::Value>)> = objects
        .iter()
        .map(|(k, _, r)| (k.clone(), r.clone()))
        .collect();
    let key = |topic: &str, first: u32| format!("t/{topic}/0-{first:020}.parquet");
    let of = |os: &[u32]| os.iter().map(|o| json!({ "o": o })).collect::<Vec<_>>();
    assert_eq!(
        layout,
        [
            (key("a", 0), of(&[0, 1])),
            (key("a", 5), of(&[5])),
            (key("b", 2), of(&[2, 3, 4])),
        ]
    );
}

#[tokio::test]
async fn a_failed_multipart_upload_is_aborted_and_leaves_no_object() {
    let folder = tempfile::tempdir().unwrap();
    let local: Arc<dyn object_store::ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(folder.path()).unwrap());
    let store = Arc::new(FaultyStore::new(local));
    store.fail_parts.store(true, Ordering::SeqCst);
    let text = r#"
        key = "big/{partition}-{first_offset}.ndjson"
        multipart_threshold = 1
        [store]
        kind = "local"
        path = "unused"
    "#;
    let sink = ObjectStoreSink::with_store("lake", config(text), store.clone()).unwrap();
    let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new())
        .config(SinkDriverConfig {
            retry: etl_sink::RetryPolicy::never(),
            ..SinkDriverConfig::default()
        })
        .spawn();
    let (statuses, closed) = deliver(driver, vec![vec![record(0, 0, "{}")]]).await;
    assert!(closed.is_err(), "the sink failed whatever the records");
    assert_eq!(statuses, [AckStatus::Failed]);
    assert_eq!(store.aborted.load(Ordering::SeqCst), 1);
    assert!(read_folder(folder.path(), "big").is_empty());
    // With the parts going through, the same upload completes.
    store.fail_parts.store(false, Ordering::SeqCst);
    let sink = ObjectStoreSink::with_store("lake", config(text), store.clone()).unwrap();
    let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new()).spawn();
    let (statuses, closed) = deliver(driver, vec![vec![record(0, 0, "{}")]]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    assert_eq!(rows(&read_folder(folder.path(), "big")).len(), 1);
}

const EXACTLY_ONCE: &str = r#"
    key = "orders/{partition}-{first_offset}.parquet"
    [store]
    kind = "local"
    path = "unused"
    [encoding]
    format = "parquet"
    columns = [{ name = "id", type = "int64", nullable = false }]
"#;

#[tokio::test]
async fn exactly_once_a_crash_between_data_and_progress_replays_into_the_same_keys_with_the_same_bytes()
 {
    let folder = tempfile::tempdir().unwrap();
    let local: Arc<dyn object_store::ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(folder.path()).unwrap());
    let store = Arc::new(FaultyStore::new(local.clone()));
    let ids = |from: i64, to: i64| -> Vec<etl_record::Record> {
        (from..to)
            .map(|o| record(0, o, &json!({"id": o}).to_string()))
            .collect()
    };

    // The first run stores offsets 0..10 and their progress.
    let sink =
        ObjectStoreSink::exactly_once_with_store("lake", config(EXACTLY_ONCE), store.clone())
            .await
            .unwrap();
    assert!(sink.progress().is_empty());
    let encoder = sink.encoder();
    let (driver, _) = SinkDriver::exactly_once(sink, encoder);
    let (statuses, closed) = deliver(driver.spawn(), vec![ids(0, 10)]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);

    // The second run writes 10..20, then "crashes" before its progress.
    *store.fail_puts_under.lock().unwrap() = Some("_etl_progress".to_owned());
    let sink =
        ObjectStoreSink::exactly_once_with_store("lake", config(EXACTLY_ONCE), store.clone())
            .await
            .unwrap();
    assert_eq!(sink.progress().get(PartitionId(0)), Some(Offset(10)));
    let encoder = sink.encoder();
    let (driver, _) = SinkDriver::exactly_once(sink, encoder);
    let driver = driver.config(SinkDriverConfig {
        retry: etl_sink::RetryPolicy::never(),
        ..SinkDriverConfig::default()
    });
    let (statuses, closed) = deliver(driver.spawn(), vec![ids(10, 20)]).await;
    assert!(closed.is_err());
    assert_eq!(statuses, [AckStatus::Failed]);
    let second = "orders/0-00000000000000000010.parquet";
    let before = std::fs::read(folder.path().join(second)).unwrap();

    // The third run resumes from the progress the store holds (10, not
    // 20) and replays 10..20: the same key, the same bytes.
    *store.fail_puts_under.lock().unwrap() = None;
    let sink =
        ObjectStoreSink::exactly_once_with_store("lake", config(EXACTLY_ONCE), store.clone())
            .await
            .unwrap();
    let encoder = sink.encoder();
    let (driver, progress) = SinkDriver::exactly_once(sink, encoder);
    assert_eq!(progress.get(PartitionId(0)), Some(Offset(10)));
    let (statuses, closed) = deliver(driver.spawn(), vec![ids(10, 20)]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    assert_eq!(std::fs::read(folder.path().join(second)).unwrap(), before);

    let objects = read_folder(folder.path(), "orders");
    assert_eq!(objects.len(), 2);
    let got: Vec<i64> = rows(&objects)
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(
        got,
        (0..20).collect::<Vec<_>>(),
        "no record lost, none twice"
    );

    // A fourth opening, with no local state at all, reads the same
    // progress from the store; so does a running sink reloading it.
    let fresh = ObjectStoreSink::exactly_once_with_store("lake", config(EXACTLY_ONCE), local)
        .await
        .unwrap();
    assert_eq!(fresh.progress().get(PartitionId(0)), Some(Offset(20)));
    assert_eq!(
        fresh.reload_progress().await.unwrap().get(PartitionId(0)),
        Some(Offset(20))
    );
}

#[tokio::test]
async fn exactly_once_refuses_keys_a_replay_could_not_repeat() {
    let folder = tempfile::tempdir().unwrap();
    for (key, why) in [
        ("orders/{first_offset}.parquet", "{partition}"),
        (
            "orders/{date}/{partition}-{first_offset}.parquet",
            "date_field",
        ),
    ] {
        let text = EXACTLY_ONCE.replace("orders/{partition}-{first_offset}.parquet", key);
        let err = ObjectStoreSink::exactly_once("lake", folder.path(), config(&text))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(why), "{key}: {err}");
    }
    let inferred = EXACTLY_ONCE.replace(
        "columns = [{ name = \"id\", type = \"int64\", nullable = false }]",
        "",
    );
    let err = ObjectStoreSink::exactly_once("lake", folder.path(), config(&inferred))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("declared Parquet `columns`"), "{err}");
}

#[tokio::test]
async fn an_inferred_schema_comes_from_the_first_record_and_a_misfit_is_dead_lettered() {
    let folder = tempfile::tempdir().unwrap();
    let text = r#"
        key = "inferred/{partition}-{first_offset}.parquet"
        [store]
        kind = "local"
        path = "lake"
        [encoding]
        format = "parquet"
    "#;
    let sink = ObjectStoreSink::new("lake", folder.path(), config(text)).unwrap();
    let encoder = sink.encoder();
    let letters = MemorySink::new();
    let driver = SinkDriver::new(sink, encoder)
        .dead_letters(letters.clone())
        .spawn();
    let batch = vec![
        record(
            0,
            0,
            r#"{"id": 1, "name": "a", "tags": ["x"], "who": {"n": 1.5}}"#,
        ),
        record(0, 1, r#"{"id": 2, "name": null}"#),
        record(0, 2, r#"{"id": "three"}"#),
    ];
    let (statuses, closed) = deliver(driver, vec![batch]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    let dead: Vec<i64> = letters
        .records()
        .iter()
        .map(|r| r.position.offset.0)
        .collect();
    assert_eq!(dead, [2]);
    let objects = read_folder(&folder.path().join("lake"), "inferred");
    let schema = &objects[0].1;
    for column in [
        "id: int64",
        "name: string",
        "tags: list<item: string>",
        "who: struct<n: double>",
    ] {
        assert!(schema.contains(column), "{column} in {schema}");
    }
    assert_eq!(
        rows(&objects),
        [
            json!({"id": 1, "name": "a", "tags": ["x"], "who": {"n": 1.5}}),
            json!({"id": 2, "name": null, "tags": null, "who": null}),
        ]
    );
}

#[tokio::test]
async fn two_exactly_once_sinks_in_one_store_keep_their_progress_apart() {
    let folder = tempfile::tempdir().unwrap();
    let store: Arc<dyn object_store::ObjectStore> =
        Arc::new(LocalFileSystem::new_with_prefix(folder.path()).unwrap());
    let table = |key: &str, prefix: &str| {
        config(&EXACTLY_ONCE.replace(
            "key = \"orders/{partition}-{first_offset}.parquet\"",
            &format!("key = \"{key}/{{partition}}-{{first_offset}}.parquet\"\n{prefix}"),
        ))
    };
    let ids = |n: i64| -> Vec<etl_record::Record> {
        (0..n)
            .map(|o| record(0, o, &json!({"id": o}).to_string()))
            .collect()
    };
    // Pipeline `a` writes 100 records; pipeline `b`, another sink in the
    // same store, must not read a's progress as its own and skip its 60.
    for (name, key, n) in [("a", "A", 100), ("b", "B", 60)] {
        let sink = ObjectStoreSink::exactly_once_with_store(name, table(key, ""), store.clone())
            .await
            .unwrap();
        assert!(
            sink.progress().is_empty(),
            "{name} found another's progress"
        );
        let encoder = sink.encoder();
        let (driver, _) = SinkDriver::exactly_once(sink, encoder);
        let (statuses, closed) = deliver(driver.spawn(), vec![ids(n)]).await;
        closed.unwrap();
        assert_eq!(statuses, [AckStatus::Delivered]);
    }
    assert_eq!(rows(&read_folder(folder.path(), "A")).len(), 100);
    assert_eq!(rows(&read_folder(folder.path(), "B")).len(), 60);

    // Told to share one prefix, the second refuses to start rather than
    // skip records by the first one's progress.
    let shared = "progress_prefix = \"_etl_progress/shared\"";
    let sink = ObjectStoreSink::exactly_once_with_store("a", table("A", shared), store.clone())
        .await
        .unwrap();
    let encoder = sink.encoder();
    let (driver, _) = SinkDriver::exactly_once(sink, encoder);
    let (_, closed) = deliver(driver.spawn(), vec![ids(10)]).await;
    closed.unwrap();
    let error = ObjectStoreSink::exactly_once_with_store("b", table("B", shared), store.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("A/{partition}-{first_offset}.parquet") && error.contains("progress_prefix"),
        "{error}"
    );
}

#[tokio::test]
async fn a_local_store_removes_the_partial_files_a_killed_writer_left_when_the_sink_opens() {
    // object_store writes a local object to `KEY#N`, then renames it: a
    // writer killed in between leaves `KEY#N`, which a reader of the
    // folder (pyarrow, Spark) would take for an object.
    let folder = tempfile::tempdir().unwrap();
    let lake = folder.path().join("lake");
    let partial = [
        lake.join("orders/p=0/00000000000000000000.parquet#1"),
        lake.join("_etl_progress/partition-0.json#12"),
    ];
    let kept = [
        lake.join("orders/p=0/00000000000000000007.parquet"),
        lake.join("orders/notes#draft"),
    ];
    for path in partial.iter().chain(&kept) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"PAR1 cut short").unwrap();
    }
    let _sink = ObjectStoreSink::new("lake", folder.path(), config(PARQUET)).unwrap();
    for path in &partial {
        assert!(!path.exists(), "{} left", path.display());
    }
    for path in &kept {
        assert!(path.exists(), "{} removed", path.display());
    }
}
