//! Exactly-once mode: progress commits with the rows, survives crashes of
//! the writer, and resuming stores every record exactly once.

// Helpers panic on failed queries: a panic there is a failed test.
#![allow(clippy::unwrap_used)]

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use etl_postgres::{PostgresSink, PostgresSinkConfig, WriteMethod};
use etl_record::{Offset, PartitionId};
use etl_sink::testing::{FailEveryNth, MemorySink};
use etl_sink::{NdjsonEncoder, ProgressSink, SinkDriver, SinkDriverConfig};
use support::{AckedBatches, client, counts, records, table, url};

const PARTITIONS: u32 = 2;
const PER_PARTITION: i64 = 150;
const SOURCE_BATCH: i64 = 10;

fn config(url: &str, table: &str, method: WriteMethod) -> PostgresSinkConfig {
    PostgresSinkConfig::new(url, table)
        .column("id", "id", "bigint")
        .column("name", "name", "text")
        .create_table(true)
        .exactly_once(true)
        .method(method)
}

fn driver_config() -> SinkDriverConfig {
    SinkDriverConfig {
        batch_max_records: 25,
        linger: Duration::from_millis(1),
        ..SinkDriverConfig::default()
    }
}

/// Every source batch from `from[p]` on, partitions interleaved.
fn batches_from(from: &HashMap<u32, i64>) -> Vec<Vec<etl_record::Record>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < PER_PARTITION {
        for p in 0..PARTITIONS {
            let first = start.max(from.get(&p).copied().unwrap_or(0));
            let end = (start + SOURCE_BATCH).min(PER_PARTITION);
            if first < end {
                out.push(records(p, first..end));
            }
        }
        start += SOURCE_BATCH;
    }
    out
}

async fn rows_per_partition(db: &tokio_postgres::Client, table: &str) -> HashMap<u32, i64> {
    let rows = db
        .query(
            &format!(
                "SELECT split_part(etl_key, '/', 2)::int, count(*) FROM \"{table}\" GROUP BY 1"
            ),
            &[],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| (u32::try_from(r.get::<_, i32>(0)).unwrap(), r.get(1)))
        .collect()
}

async fn xmins(db: &tokio_postgres::Client, table: &str) -> HashMap<String, String> {
    let rows = db
        .query(&format!("SELECT etl_key, xmin::text FROM \"{table}\""), &[])
        .await
        .unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_then_resume_store_every_record_exactly_once() {
    let url = url();
    let db = client(&url).await;
    for method in [WriteMethod::Copy, WriteMethod::Insert] {
        let name = table("eo");
        // Crash after sending a growing part of the input, three times;
        // then run to the end. Rounds 0 and 2 replay from offset 0 (an
        // offset store that knows nothing), round 1 from the progress.
        for round in 0..4 {
            let sink = PostgresSink::connect(config(&url, &name, method))
                .await
                .unwrap();
            let (driver, resume) = SinkDriver::exactly_once(sink, NdjsonEncoder::new());
            // The stored progress matches the stored rows exactly: data and
            // progress committed together.
            let stored = rows_per_partition(&db, &name).await;
            for p in 0..PARTITIONS {
                let rows = stored.get(&p).copied().unwrap_or(0);
                let next = resume.get(PartitionId(p)).unwrap_or(Offset(0));
                assert_eq!(next, Offset(rows), "{method:?} round {round} partition {p}");
            }
            let before = xmins(&db, &name).await;
            let from: HashMap<u32, i64> = if round == 1 {
                resume.iter().map(|(p, o)| (p.0, o.0)).collect()
            } else {
                HashMap::new()
            };
            let handle = driver.config(driver_config()).spawn();
            let mut source = AckedBatches::new();
            let batches = batches_from(&from);
            let crash_after = batches.len() * (round + 1) / 4;
            let last_round = round == 3;
            for (i, batch) in batches.into_iter().enumerate() {
                if !last_round && i == crash_after {
                    break;
                }
                handle.send(source.batch_of(batch)).await.unwrap();
            }
            if last_round {
                handle.close().await.unwrap();
            } else {
                // Let some writes commit, then crash mid-run: whatever was
                // in flight is dropped with its transaction.
                tokio::time::sleep(Duration::from_millis(20)).await;
                handle.abort().await;
            }
            // Rows stored before this round were not written again.
            let after = xmins(&db, &name).await;
            for (key, xmin) in &before {
                assert_eq!(after.get(key), Some(xmin), "{method:?}: {key} rewritten");
            }
        }
        assert_eq!(
            counts(&db, &name, "etl_key").await,
            (
                i64::from(PARTITIONS) * PER_PARTITION,
                i64::from(PARTITIONS) * PER_PARTITION
            ),
            "{method:?}"
        );
        let sink = PostgresSink::connect(config(&url, &name, method))
            .await
            .unwrap();
        for p in 0..PARTITIONS {
            assert_eq!(
                sink.progress().get(PartitionId(p)),
                Some(Offset(PER_PARTITION))
            );
        }
    }
}

#[tokio::test]
async fn progress_is_kept_per_sink_name() {
    let url = url();
    let name = table("names");
    let sink = PostgresSink::connect(config(&url, &name, WriteMethod::Copy))
        .await
        .unwrap();
    let (batch, _) = etl_sink::EncodedBatch::encode(records(3, 0..5), &NdjsonEncoder::new());
    etl_sink::Sink::write(&sink, &batch).await.unwrap();
    assert_eq!(sink.progress().get(PartitionId(3)), Some(Offset(5)));
    assert_eq!(sink.read_progress().await.unwrap(), sink.progress());
    let mut other = config(&url, &name, WriteMethod::Copy);
    other.progress_name = Some(format!("{name}-other"));
    let other = PostgresSink::connect(other).await.unwrap();
    assert!(other.progress().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_never_passes_a_rejected_row_before_its_dead_letter_is_written() {
    let url = url();
    // A row the database refuses (not a bigint), and a value that is not
    // a JSON document (refused before the transaction; the encoder trusts
    // its input, as it does behind the pipeline's JSON steps).
    for (bad, value) in [(4, r#"{"id":"abc","name":"x"}"#), (6, "not json")] {
        let name = table("eo_reject");
        let sink = PostgresSink::connect(config(&url, &name, WriteMethod::Copy))
            .await
            .unwrap();
        let (driver, _) = SinkDriver::exactly_once(sink, NdjsonEncoder::trusted());
        // The dead-letter sink is on a full disk.
        let handle = driver
            .config(driver_config())
            .dead_letters(FailEveryNth::permanent(MemorySink::new(), 1))
            .spawn();
        let mut source = AckedBatches::new();
        let mut batch = records(0, 0..10);
        batch[bad] = support::record(0, bad as i64, value);
        handle.send(source.batch_of(batch)).await.unwrap();
        assert!(handle.close().await.is_err(), "the dead letter failed");
        assert_eq!(source.tally(), (0, 1));

        // The next run must read the refused row again, so the stored
        // progress stops before it.
        let again = PostgresSink::connect(config(&url, &name, WriteMethod::Copy))
            .await
            .unwrap();
        let next = again.progress().get(PartitionId(0)).unwrap_or(Offset(0));
        assert!(
            next <= Offset(bad as i64),
            "progress {next} passes offset {bad}, whose dead letter was never written"
        );
    }
}

/// Open a sink, retrying while the previous holder's session is still
/// ending on the server (its connection closes asynchronously).
async fn open_when_free(config: PostgresSinkConfig) -> PostgresSink {
    let mut last = None;
    for _ in 0..50 {
        match PostgresSink::connect(config.clone()).await {
            Ok(sink) => return sink,
            Err(e) if e.is_in_use() => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the progress lock was never released: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sink_on_the_same_progress_is_refused_until_the_first_closes() {
    let url = url();
    let name = table("eo_lock");
    let first = PostgresSink::connect(config(&url, &name, WriteMethod::Copy))
        .await
        .unwrap();

    // Same table and progress name: refused at open, with a typed error
    // naming the progress table and the holder.
    let err = PostgresSink::connect(config(&url, &name, WriteMethod::Insert))
        .await
        .expect_err("a second sink on the same progress must be refused");
    assert!(err.is_in_use(), "{err}");
    assert!(!err.is_retryable(), "{err}");
    let text = err.to_string();
    assert!(text.contains("etl_progress"), "{text}");
    assert!(text.contains(&name), "{text}");
    assert!(text.contains("pid"), "{text}");
    assert!(matches!(
        etl_sink::SinkError::from(err),
        etl_sink::SinkError::Permanent(_)
    ));

    // The same table spelt with its schema is the same progress.
    let mut qualified = config(&url, &name, WriteMethod::Copy);
    qualified.progress_table = "public.etl_progress".to_owned();
    let err = PostgresSink::connect(qualified).await.unwrap_err();
    assert!(err.is_in_use(), "{err}");

    // Another progress name is another lock.
    let mut other = config(&url, &name, WriteMethod::Copy);
    other.progress_name = Some(format!("{name}-other"));
    let other = PostgresSink::connect(other).await.unwrap();

    // The first one writes, closes; a new one opens and resumes.
    let (driver, _) = SinkDriver::exactly_once(first, NdjsonEncoder::new());
    let handle = driver.config(driver_config()).spawn();
    let mut source = AckedBatches::new();
    handle
        .send(source.batch_of(records(0, 0..10)))
        .await
        .unwrap();
    handle.close().await.unwrap();
    let again = open_when_free(config(&url, &name, WriteMethod::Copy)).await;
    assert_eq!(again.progress().get(PartitionId(0)), Some(Offset(10)));
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_needs_no_create_privilege_when_the_tables_exist() {
    let url = url();
    let db = client(&url).await;
    let schema = table("noc");
    let role = format!("{schema}_writer");
    db.batch_execute(&format!(
        "CREATE SCHEMA {schema}; \
         CREATE TABLE {schema}.target (etl_key text PRIMARY KEY, id bigint); \
         CREATE TABLE {schema}.progress (name text NOT NULL, partition bigint NOT NULL, \
           next_offset bigint NOT NULL, PRIMARY KEY (name, partition)); \
         CREATE ROLE {role} LOGIN PASSWORD 'writer-pw'; \
         GRANT USAGE ON SCHEMA {schema} TO {role}; \
         GRANT SELECT, INSERT, UPDATE ON {schema}.target, {schema}.progress TO {role}"
    ))
    .await
    .unwrap();
    let (_, host) = url.split_once('@').unwrap();
    let as_role = format!("postgres://{role}:writer-pw@{host}");
    let config = |progress: &str| {
        let mut c = PostgresSinkConfig::new(&as_role, format!("{schema}.target"))
            .column("id", "id", "bigint")
            .create_table(true)
            .exactly_once(true);
        c.progress_table = format!("{schema}.{progress}");
        c
    };

    let sink = PostgresSink::connect(config("progress")).await.unwrap();
    let (batch, _) = etl_sink::EncodedBatch::encode(records(0, 0..5), &NdjsonEncoder::new());
    etl_sink::Sink::write(&sink, &batch).await.unwrap();
    assert_eq!(sink.progress().get(PartitionId(0)), Some(Offset(5)));
    drop(sink);

    // A progress table that does not exist cannot be created: the error
    // names it, not the data table.
    let err = PostgresSink::connect(config("missing_progress"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("missing_progress"), "{text}");
    assert!(!text.contains("target"), "{text}");
    assert!(text.contains("42501"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_lost_its_lock_to_another_writes_nothing_more() {
    let url = url();
    let db = client(&url).await;
    let name = table("eo_lost");
    // Named, so that only its session is ended below.
    let named = format!("{url}?application_name={name}");
    let first = PostgresSink::connect(config(&named, &name, WriteMethod::Copy))
        .await
        .unwrap();
    async fn write(sink: &PostgresSink, from: i64) -> Result<(), etl_sink::SinkError> {
        let (batch, _) =
            etl_sink::EncodedBatch::encode(records(0, from..from + 5), &NdjsonEncoder::new());
        etl_sink::Sink::write(sink, &batch).await
    }
    write(&first, 0).await.unwrap();

    // The server ends the first sink's session (an administrator, a
    // network cut), and a second sink takes the progress meanwhile.
    let ended = db
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    assert!(ended > 0, "the first sink's session was found");
    let second = open_when_free(config(&url, &name, WriteMethod::Copy)).await;

    // The first one's next writes fail (the lost connection is retryable),
    // then for good: it cannot take the lock again.
    let mut last = None;
    for _ in 0..3 {
        match write(&first, 5).await {
            Err(e) if e.is_retryable() => last = Some(e),
            other => {
                last = other.err();
                break;
            }
        }
    }
    let err = last.expect("the write without the lock fails");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("in use by another sink"), "{err}");
    assert_eq!(counts(&db, &name, "etl_key").await.0, 5, "nothing written");

    // Once the second one is gone, the first takes the lock again.
    drop(second);
    let mut written = false;
    for _ in 0..50 {
        if write(&first, 5).await.is_ok() {
            written = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(written, "the lock was never taken again");
    assert_eq!(first.progress().get(PartitionId(0)), Some(Offset(10)));
}
