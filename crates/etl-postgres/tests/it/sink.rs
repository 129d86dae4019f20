//! The sink against a real server: upserts make replays idempotent with
//! both write methods, bad rows come back with the database's reason and
//! reach the dead-letter path, and credentials stay out of errors.

// Helpers panic on failed queries: a panic there is a failed test.
#![allow(clippy::unwrap_used)]

use crate::support;

use etl_postgres::{PostgresError, PostgresSink, PostgresSinkConfig, WriteMethod};
use etl_sink::testing::MemorySink;
use etl_sink::{EncodedBatch, NdjsonEncoder, Sink, SinkDriver, SinkError};
use support::{AckedBatches, client, counts, record, records, table, url};

fn encode(records: Vec<etl_record::Record>) -> EncodedBatch {
    let (batch, refused) = EncodedBatch::encode(records, &NdjsonEncoder::new());
    assert!(refused.is_empty());
    batch
}

fn orders(url: &str, table: &str, method: WriteMethod) -> PostgresSinkConfig {
    PostgresSinkConfig::new(url, table)
        .column("id", "id", "bigint")
        .column("name", "name", "text")
        .create_table(true)
        .method(method)
}

#[tokio::test]
async fn replays_overwrite_their_own_rows_with_either_method() {
    let url = url();
    let db = client(&url).await;
    for method in [WriteMethod::Copy, WriteMethod::Insert] {
        let name = table("replay");
        let sink = PostgresSink::connect(orders(&url, &name, method))
            .await
            .unwrap();
        sink.write(&encode(records(0, 0..20))).await.unwrap();
        // A replay of the same records, then one overlapping the end.
        sink.write(&encode(records(0, 0..20))).await.unwrap();
        sink.write(&encode(records(0, 10..30))).await.unwrap();
        assert_eq!(counts(&db, &name, "etl_key").await, (30, 30), "{method:?}");
        let row = db
            .query_one(
                &format!("SELECT id, name FROM \"{name}\" WHERE etl_key = 'src/0/7'"),
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 7);
        assert_eq!(row.get::<_, String>(1), "n7");
    }
}

#[tokio::test]
async fn a_mapped_key_keeps_the_last_value_per_key() {
    let url = url();
    let db = client(&url).await;
    for method in [WriteMethod::Copy, WriteMethod::Insert] {
        let name = table("latest");
        let config = PostgresSinkConfig::new(&url, &name)
            .column("customer", "customer.id", "text")
            .column("total", "total", "numeric(10,2)")
            .key_column("customer")
            .create_table(true)
            .method(method);
        let sink = PostgresSink::connect(config).await.unwrap();
        let updates = (0..6)
            .map(|o| {
                let who = ["a", "b"][usize::try_from(o % 2).unwrap()];
                record(
                    0,
                    o,
                    format!("{{\"customer\":{{\"id\":\"{who}\"}},\"total\":{o}.5}}"),
                )
            })
            .collect();
        sink.write(&encode(updates)).await.unwrap();
        let rows = db
            .query(
                &format!("SELECT customer, total::text FROM \"{name}\" ORDER BY customer"),
                &[],
            )
            .await
            .unwrap();
        let got: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(
            got,
            vec![("a".into(), "4.50".into()), ("b".into(), "5.50".into())],
            "{method:?}"
        );
    }
}

#[tokio::test]
async fn bad_rows_are_rejected_with_the_database_reason() {
    let url = url();
    let db = client(&url).await;
    let name = table("bad");
    db.batch_execute(&format!(
        "CREATE TABLE \"{name}\" (etl_key text PRIMARY KEY, id bigint, qty int CHECK (qty >= 0))"
    ))
    .await
    .unwrap();
    let config = PostgresSinkConfig::new(&url, &name)
        .column("id", "id", "bigint")
        .column("qty", "qty", "int");
    let sink = PostgresSink::connect(config).await.unwrap();
    let batch = encode(vec![
        record(0, 0, r#"{"id": 1, "qty": 1}"#),
        record(0, 1, r#"{"id": "abc", "qty": 1}"#),
        record(0, 2, r#"{"id": 3, "qty": -1}"#),
        record(0, 3, r#"{"id": 4, "qty": 2}"#),
    ]);
    let err = sink.write(&batch).await.unwrap_err();
    let SinkError::Rejected(rejects) = err else {
        panic!("expected rejects, got {err}");
    };
    let by_index: Vec<(usize, &str)> = rejects
        .iter()
        .map(|r| (r.index, r.reason.as_str()))
        .collect();
    assert_eq!(by_index.len(), 2, "{by_index:?}");
    assert_eq!(by_index[0].0, 1);
    assert!(
        by_index[0]
            .1
            .contains("invalid input syntax for type bigint"),
        "{by_index:?}"
    );
    assert_eq!(by_index[1].0, 2);
    assert!(by_index[1].1.contains("check constraint"), "{by_index:?}");
    assert_eq!(counts(&db, &name, "id").await, (2, 2));
}

#[tokio::test]
async fn the_driver_dead_letters_bad_rows_and_delivers_the_batch() {
    let url = url();
    let db = client(&url).await;
    let name = table("dlq");
    let sink = PostgresSink::connect(orders(&url, &name, WriteMethod::Copy))
        .await
        .unwrap();
    let letters = MemorySink::new();
    let handle = SinkDriver::new(sink, NdjsonEncoder::new())
        .dead_letters(letters.clone())
        .spawn();
    let mut source = AckedBatches::new();
    let mut input = records(0, 0..5);
    input.push(record(0, 5, r#"{"id": "six", "name": "bad"}"#));
    input.push(record(0, 6, "not json at all"));
    input.extend(records(0, 7..10));
    handle.send(source.batch_of(input)).await.unwrap();
    let metrics = handle.close().await.unwrap();
    assert_eq!(metrics.dead_lettered, 2);
    assert_eq!(source.tally(), (1, 0));
    assert_eq!(counts(&db, &name, "etl_key").await, (8, 8));
    let dead = String::from_utf8(letters.bytes()).unwrap();
    assert!(
        dead.contains("invalid input syntax for type bigint"),
        "{dead}"
    );
    assert!(dead.contains("not valid JSON"), "{dead}");
}

#[tokio::test]
async fn passwords_never_appear_in_errors() {
    let url = url();
    let secret = "wrong-s3cret-a1b2c3";
    // A wrong password given in the config, and one inside the URL.
    let base = url.split_once('@').map_or(url.as_str(), |(_, rest)| rest);
    let config =
        PostgresSinkConfig::new(format!("postgres://etl@{base}"), table("auth")).password(secret);
    let in_url = PostgresSinkConfig::new(format!("postgres://etl:{secret}@{base}"), table("auth"));
    for config in [config, in_url] {
        assert!(!format!("{config:?}").contains(secret));
        let err = PostgresSink::connect(config).await.unwrap_err();
        assert!(matches!(err, PostgresError::Connect { .. }), "{err}");
        assert!(!err.is_retryable(), "a wrong password is not retryable");
        let sink_err = SinkError::from(err);
        for text in [
            sink_err.to_string(),
            format!("{sink_err:?}"),
            format!("{:?}", std::error::Error::source(&sink_err)),
        ] {
            assert!(!text.contains(secret), "{text}");
        }
    }
    // A malformed URL holding the password.
    let bad = PostgresSinkConfig::new(
        format!("postgres://etl:{secret}@127.0.0.1:notaport/db"),
        "t",
    );
    let err = PostgresSink::connect(bad).await.unwrap_err();
    assert!(!err.to_string().contains(secret) && !format!("{err:?}").contains(secret));
    // The right password in the config field works.
    let password = url
        .split_once("://etl:")
        .and_then(|(_, rest)| rest.split_once('@'))
        .map(|(p, _)| p.to_owned())
        .unwrap();
    let good = PostgresSinkConfig::new(format!("postgres://etl@{base}"), table("auth"))
        .password(password.clone())
        .create_table(true);
    let sink = PostgresSink::connect(good).await.unwrap();
    assert!(!format!("{sink:?}").contains(&password));
}

#[tokio::test]
async fn a_dropped_table_halts_the_driver_and_dead_letters_nothing() {
    // No row is at fault when the table is gone (SQLSTATE 42P01): the
    // driver stops with the error instead of replaying the records into
    // the dead-letter sink.
    let url = url();
    let db = client(&url).await;
    let name = table("dropped");
    let sink = PostgresSink::connect(orders(&url, &name, WriteMethod::Copy))
        .await
        .unwrap();
    let letters = MemorySink::new();
    let handle = SinkDriver::new(sink, NdjsonEncoder::new())
        .config(etl_sink::SinkDriverConfig {
            on_permanent_error: etl_sink::PermanentErrorPolicy::DeadLetter,
            ..etl_sink::SinkDriverConfig::default()
        })
        .dead_letters(letters.clone())
        .spawn();
    let mut source = AckedBatches::new();
    db.batch_execute(&format!("DROP TABLE \"{name}\""))
        .await
        .unwrap();
    let _ = handle.send(source.batch_of(records(0, 0..10))).await;
    let err = handle.close().await.unwrap_err();
    let etl_sink::SinkDriverError::Sink(err) = err else {
        panic!("a write failed for good: {err}");
    };
    assert!(matches!(err, SinkError::Permanent(_)), "{err}");
    assert_eq!(err.kind(), etl_sink::FailureKind::Environment);
    assert!(err.to_string().contains(&name), "{err}");
    assert!(err.to_string().contains("42P01"), "{err}");
    assert_eq!(source.tally(), (0, 1));
    assert!(letters.positions().is_empty(), "nothing dead-lettered");
}
