//! The source on its own: what it confirms to the server, what it sends
//! again after a restart, how it fails, and the decoder over the
//! server's own bytes.

use std::time::Duration;

use etl_postgres_cdc::{Lsn, Message, PostgresCdcSource, decode};
use etl_record::{Offset, PartitionId, Record};
use etl_source::{Source, SourceError, SourceEvent};

use crate::support::{Names, client};

const SLOT: PartitionId = PartitionId(0);

async fn started(names: &Names, from: i64) -> PostgresCdcSource {
    let mut source = PostgresCdcSource::new(names.config()).unwrap();
    assert!(matches!(
        source.next().await.unwrap(),
        SourceEvent::Assigned(p) if p == vec![SLOT]
    ));
    source.seek(SLOT, Offset(from)).await.unwrap();
    source
}

async fn read(source: &mut PostgresCdcSource, n: usize) -> Vec<Record> {
    let mut records = Vec::new();
    for _ in 0..300 {
        if records.len() >= n {
            break;
        }
        if let SourceEvent::Batch(batch) = source.next().await.unwrap() {
            assert!(batch.rejected.is_empty(), "{:?}", batch.rejected);
            records.extend(batch.records);
        }
    }
    assert_eq!(records.len(), n, "records read");
    records
}

fn commit_lsn(record: &Record) -> Lsn {
    let change: serde_json::Value = serde_json::from_slice(&record.value).unwrap();
    change["commit_lsn"].as_str().unwrap().parse().unwrap()
}

async fn commit(source: &mut PostgresCdcSource, offset: Offset) {
    source
        .commit(&[(SLOT, offset)].into_iter().collect())
        .await
        .unwrap();
    // Two status intervals: the server has heard whatever was sent.
    tokio::time::sleep(Duration::from_millis(2200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_confirmed_only_past_transactions_committed_whole() {
    let names = Names::new("confirm");
    let db = client().await;
    names.create(&db).await;
    let grows = names.table("grows");
    let mut source = started(&names, 0).await;
    names.wait_for_slot(&db).await;
    let start = names.confirmed(&db).await.unwrap();

    db.batch_execute(&format!(
        "INSERT INTO {grows} VALUES (1, 1), (2, 2), (3, 3)"
    ))
    .await
    .unwrap();
    db.batch_execute(&format!("INSERT INTO {grows} VALUES (4, 4)"))
        .await
        .unwrap();
    let records = read(&mut source, 4).await;
    let offsets: Vec<i64> = records.iter().map(|r| r.position.offset.0).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]), "{offsets:?}");
    let (first, second) = (commit_lsn(&records[0]), commit_lsn(&records[3]));
    assert_eq!(
        commit_lsn(&records[2]),
        first,
        "one transaction, one commit LSN"
    );

    // Two of the first transaction's three changes: the slot stays at
    // or before its commit, so the server sends it again.
    commit(&mut source, Offset(offsets[1] + 1)).await;
    let confirmed = names.confirmed(&db).await.unwrap();
    assert!(
        confirmed >= start && confirmed <= first,
        "confirmed {confirmed}, past the commit at {first} of a transaction delivered in part"
    );
    // All three: confirmed past its commit, not past the second's.
    commit(&mut source, Offset(offsets[2] + 1)).await;
    let confirmed = names.confirmed(&db).await.unwrap();
    assert!(
        confirmed > first && confirmed <= second,
        "confirmed {confirmed}: the first transaction commits at {first}, the second at {second}"
    );
    drop(source);
    names.drop_all(&db).await;
}

/// A transaction delivered in part, sent again after a restart: its
/// changes take the offsets they had, so the committed offset skips
/// exactly the delivered one and the rest come once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partially_delivered_transaction_resumes_after_its_delivered_changes_at_the_same_offsets()
{
    let names = Names::new("partial");
    let db = client().await;
    names.create(&db).await;
    let grows = names.table("grows");
    let mut source = started(&names, 0).await;
    names.wait_for_slot(&db).await;
    db.batch_execute(&format!("INSERT INTO {grows} VALUES (1, 1)"))
        .await
        .unwrap();
    db.batch_execute(&format!(
        "INSERT INTO {grows} VALUES (2, 2), (3, 3), (4, 4)"
    ))
    .await
    .unwrap();
    let records = read(&mut source, 4).await;
    // The first transaction and one change of the second delivered.
    let committed = Offset(records[1].position.offset.0 + 1);
    commit(&mut source, committed).await;
    drop(source);

    let mut source = started(&names, committed.0).await;
    let again = read(&mut source, 2).await;
    let ids: Vec<serde_json::Value> = again
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.value).unwrap()["key"]["id"].clone()
        })
        .collect();
    assert_eq!(ids, [3, 4], "the second transaction's undelivered changes");
    let offsets: Vec<Offset> = again.iter().map(|r| r.position.offset).collect();
    let before: Vec<Offset> = records[2..].iter().map(|r| r.position.offset).collect();
    assert_eq!(offsets, before, "the offsets they had");
    drop(source);
    names.drop_all(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_publication_is_a_configuration_error_naming_the_fix() {
    let names = Names::new("nopub");
    let mut source = started(&names, 0).await;
    let error = loop {
        match source.next().await {
            Ok(SourceEvent::Idle) => {}
            Ok(other) => panic!("{other:?}"),
            Err(e) => break e,
        }
    };
    match error {
        SourceError::Config(message) => {
            assert!(message.contains("CREATE PUBLICATION"), "{message}");
        }
        other => panic!("not a configuration error: {other}"),
    }
}

/// The decoder over the server's own bytes: the same slot's changes read
/// through the SQL interface (a test's convenience, not the source's
/// path) decode into the messages the statements made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_own_pgoutput_bytes_decode_message_by_message() {
    let names = Names::new("capture");
    let db = client().await;
    names.create(&db).await;
    let (docs, grows) = (names.table("docs"), names.table("grows"));
    db.execute(
        "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
        &[&names.slot()],
    )
    .await
    .unwrap();
    // One transaction each (a multi-statement query is one transaction).
    for statement in [
        format!("INSERT INTO {grows} VALUES (1, 10)"),
        format!("ALTER TABLE {grows} REPLICA IDENTITY FULL"),
        format!("UPDATE {grows} SET x = 11 WHERE id = 1"),
        format!("DELETE FROM {grows} WHERE id = 1"),
        format!(
            "INSERT INTO {docs} SELECT 1, 0, string_agg(md5(g::text), '') \
             FROM generate_series(1, 100) g"
        ),
        format!("UPDATE {docs} SET n = 1"),
        format!("TRUNCATE {grows}"),
    ] {
        db.batch_execute(&statement).await.unwrap();
    }
    let rows = db
        .query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, \
             'proto_version', '1', 'publication_names', $2)",
            &[&names.slot(), &names.publication()],
        )
        .await
        .unwrap();
    let mut kinds = Vec::new();
    for row in rows {
        let data: Vec<u8> = row.get(0);
        let message = decode(data.into()).unwrap();
        kinds.push(match message {
            Message::Begin(_) => "B",
            Message::Commit(_) => "C",
            Message::Relation(_) => "R",
            Message::Insert { .. } => "I",
            Message::Update { old: Some(_), .. } => "U+old",
            Message::Update { .. } => "U",
            Message::Delete { .. } => "D",
            Message::Truncate { .. } => "T",
            _ => "?",
        });
        if let Message::Update { new, .. } = &message
            && kinds.iter().filter(|k| k.starts_with('U')).count() == 2
        {
            assert!(
                new.contains(&etl_postgres_cdc::Value::UnchangedToast),
                "the docs body is TOASTed and unchanged: {new:?}"
            );
        }
    }
    assert_eq!(
        kinds,
        [
            "B", "R", "I", "C", // insert
            "B", "R", "U+old", "C", // the relation again, now FULL
            "B", "D", "C", //
            "B", "R", "I", "C", // docs
            "B", "U", "C", // TOAST unchanged
            "B", "R", "T", "C", // a truncate describes the relation again
        ]
    );
    names.drop_all(&db).await;
}

/// Writes to a table outside the publication move the slot on once
/// everything read is delivered: the server's keepalives carry its end of
/// WAL, and with nothing unconfirmed the source confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_publication_on_a_busy_server_does_not_pin_wal() {
    let names = Names::new("quiet");
    let db = client().await;
    names.create(&db).await;
    let other = names.table("other");
    db.batch_execute(&format!("CREATE TABLE {other} (id int)"))
        .await
        .unwrap();
    let mut source = started(&names, 0).await;
    names.wait_for_slot(&db).await;
    let start = names.confirmed(&db).await.unwrap();
    db.batch_execute(&format!(
        "INSERT INTO {other} SELECT g FROM generate_series(1, 1000) g"
    ))
    .await
    .unwrap();
    let written: String = db
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    let written: Lsn = written.parse().unwrap();
    assert!(written > start);
    let mut confirmed = start;
    for _ in 0..100 {
        // Polled as the driver would: the stream is read meanwhile.
        assert!(matches!(source.next().await.unwrap(), SourceEvent::Idle));
        confirmed = names.confirmed(&db).await.unwrap();
        if confirmed >= written {
            break;
        }
    }
    assert!(
        confirmed >= written,
        "the slot stayed at {confirmed}, before {written}, with nothing to deliver"
    );
    drop(source);
    names.drop_all(&db).await;
}

/// A server that times replication connections out after two seconds
/// asks for a status update after one; the source answers whatever its
/// own interval (here a minute), so the server keeps the same
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_are_answered_within_the_servers_timeout() {
    let server = etl_test_support::postgres::start().unwrap();
    let names = Names::on("keepalive", server.url());
    let db = crate::support::client_of(&names.url).await;
    names.create(&db).await;
    db.batch_execute("ALTER SYSTEM SET wal_sender_timeout = '2s'")
        .await
        .unwrap();
    db.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let mut config = names.config();
    config.status_interval = Duration::from_secs(60);
    let mut source = PostgresCdcSource::new(config).unwrap();
    assert!(matches!(
        source.next().await.unwrap(),
        SourceEvent::Assigned(_)
    ));
    source.seek(SLOT, Offset(0)).await.unwrap();
    names.wait_for_slot(&db).await;
    let sender = || async {
        let rows = db
            .query(
                "SELECT pid FROM pg_stat_replication WHERE application_name = $1",
                &[&format!("etl postgres_cdc {}", names.slot())],
            )
            .await
            .unwrap();
        rows.first().map(|r| r.get::<_, i32>(0))
    };
    let mut first = None;
    for _ in 0..100 {
        first = sender().await;
        if first.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = first.expect("the source's walsender");
    // Three timeouts long, polled as the driver would.
    let until = tokio::time::Instant::now() + Duration::from_secs(6);
    while tokio::time::Instant::now() < until {
        assert!(matches!(source.next().await.unwrap(), SourceEvent::Idle));
    }
    assert_eq!(
        sender().await,
        Some(first),
        "the server dropped the connection: its keepalives went unanswered"
    );
    drop(source);
    names.drop_all(&db).await;
}

/// The WAL the slot retains past its confirmed position, and the
/// partition's high watermark (the source's lag follows from it), while
/// changes are read and not delivered: bounded by what the server itself
/// says, and at least the changes not yet confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slots_retained_wal_and_the_high_watermark_follow_the_stream() {
    let names = Names::new("lag");
    let db = client().await;
    names.create(&db).await;
    let grows = names.table("grows");
    let mut source = started(&names, 0).await;
    names.wait_for_slot(&db).await;
    let start = names.confirmed(&db).await.unwrap();
    db.batch_execute(&format!(
        "INSERT INTO {grows} VALUES (1, 1), (2, 2), (3, 3)"
    ))
    .await
    .unwrap();
    db.batch_execute(&format!("INSERT INTO {grows} VALUES (4, 4)"))
        .await
        .unwrap();
    let records = read(&mut source, 4).await;
    let first = records.first().unwrap();
    let last = records.last().unwrap();

    let retained = source.retained_wal_bytes();
    let server = db
        .query_one(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&names.slot()],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    // The slot's position is at or before the first transaction read and
    // not delivered (not `start`: while nothing was pending, keepalives
    // moved it past WAL the other tests' tables wrote since).
    assert!(start <= commit_lsn(first));
    assert!(
        retained >= commit_lsn(last).0 - commit_lsn(first).0,
        "retained {retained}: the last change commits {} bytes after the first one's",
        commit_lsn(last).0 - commit_lsn(first).0
    );
    assert!(
        retained <= u64::try_from(server).unwrap(),
        "retained {retained}, the server says {server}"
    );
    let high = source.high_watermark(SLOT).expect("a high watermark");
    assert!(
        high > last.position.offset,
        "{high:?} after {:?}",
        last.position.offset
    );

    // Delivered and confirmed: the slot retains no more than the server
    // wrote since.
    commit(&mut source, Offset(last.position.offset.0 + 1)).await;
    let server = db
        .query_one(
            "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&names.slot()],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert!(source.retained_wal_bytes() <= u64::try_from(server).unwrap());
    drop(source);
    names.drop_all(&db).await;
}
