//! Garage, a real S3 server, on loopback: objects read back by pyarrow's
//! own S3 client, and the errors of its environment (a missing bucket, a
//! denied or refused credential) as the server itself answers them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use etl_ack::AckStatus;
use etl_object_store::{ObjectStoreSink, ObjectStoreSinkConfig};
use etl_sink::{SinkDriver, SinkDriverConfig};
use etl_test_support::garage::{Garage, REGION};
use etl_test_support::pyarrow::{Location, read_objects};
use serde_json::json;

use crate::faults::FaultyStore;
use crate::support::{config, deliver, record, rows};

/// A Parquet sink on `bucket` of `server`, with `key_id`/`secret`.
pub(crate) fn garage_config(
    server: &Garage,
    bucket: &str,
    key_id: &str,
    secret: &str,
) -> ObjectStoreSinkConfig {
    config(&format!(
        r#"
        key = "lake/{{partition}}-{{first_offset}}.parquet"
        multipart_threshold = 1048576
        [store]
        kind = "s3"
        bucket = "{bucket}"
        region = "{REGION}"
        endpoint = "{endpoint}"
        access_key_id = "{key_id}"
        secret_access_key = "{secret}"
        [requests]
        max_retries = 2
        retry_timeout = "5s"
        initial_backoff = "50ms"
        max_backoff = "500ms"
        [encoding]
        format = "parquet"
        compression = "zstd"
        columns = [
            {{ name = "id", type = "int64", nullable = false }},
            {{ name = "pad", type = "string" }},
        ]
        "#,
        endpoint = server.endpoint()
    ))
}

/// Where pyarrow reads `bucket` of `server`.
pub(crate) fn garage_location(server: &Garage, bucket: &str) -> Location {
    Location::S3 {
        endpoint: server.endpoint(),
        bucket: bucket.to_owned(),
        access_key: server.key_id().to_owned(),
        secret_key: server.secret().to_owned(),
        region: REGION.to_owned(),
    }
}

/// `n` records of partition `p` whose padding, random-looking, does not
/// compress: `n` = 1400 makes a Parquet object of about 8 MiB.
pub(crate) fn padded(p: u32, n: i64) -> Vec<etl_record::Record> {
    let mut seed = 7u64;
    (0..n)
        .map(|o| {
            let pad: String = (0..10_000)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    char::from(b'a' + ((seed >> 33) % 26) as u8)
                })
                .collect();
            record(p, o, &json!({"id": o, "pad": pad}).to_string())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_on_garage_single_put_and_multipart_objects_read_back_by_pyarrow() {
    let server = Garage::start().unwrap();
    server.create_bucket("orders").unwrap();
    let sink = ObjectStoreSink::new(
        "lake",
        std::path::Path::new("."),
        garage_config(&server, "orders", server.key_id(), server.secret()),
    )
    .unwrap();
    let encoder = sink.encoder();
    let driver = SinkDriver::new(sink, encoder)
        .config(SinkDriverConfig {
            batch_max_bytes: 64 << 20,
            ..SinkDriverConfig::default()
        })
        .spawn();
    // Partition 0: small, one PUT. Partition 1: about 8 MiB, two parts of
    // a multipart upload.
    let small: Vec<_> = (0..100)
        .map(|o| record(0, o, &json!({"id": o, "pad": "x"}).to_string()))
        .collect();
    let (statuses, closed) = deliver(driver, vec![small, padded(1, 1400)]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered, AckStatus::Delivered]);

    let objects = read_objects(&garage_location(&server, "orders"), "lake").unwrap();
    let keys: Vec<&str> = objects.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "lake/0-00000000000000000000.parquet",
            "lake/1-00000000000000000000.parquet"
        ]
    );
    for (_, schema, _) in &objects {
        assert!(schema.contains("id: int64 not null"), "{schema}");
        assert!(schema.contains("pad: string"), "{schema}");
    }
    assert_eq!(objects[0].2.len(), 100);
    assert_eq!(objects[1].2.len(), 1400);
    let ids: Vec<i64> = rows(&objects)
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    let want: Vec<i64> = (0..100).chain(0..1400).collect();
    assert_eq!(ids, want);
    assert!(objects[0].2.iter().all(|r| r["pad"] == "x"));
    let want_pads: Vec<serde_json::Value> = padded(1, 1400)
        .iter()
        .map(|r| serde_json::from_slice::<serde_json::Value>(&r.value).unwrap()["pad"].clone())
        .collect();
    let got_pads: Vec<serde_json::Value> = objects[1].2.iter().map(|r| r["pad"].clone()).collect();
    assert!(
        got_pads == want_pads,
        "the multipart object's values differ"
    );
    // The multipart upload completed: the server holds none unfinished.
    assert_eq!(server.unfinished_multipart_uploads("orders").unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_on_garage_halts_at_once_naming_sink_bucket_and_key_without_the_secret() {
    let server = Garage::start().unwrap();
    let sink = ObjectStoreSink::new(
        "lake",
        std::path::Path::new("."),
        garage_config(&server, "no-such-bucket", server.key_id(), server.secret()),
    )
    .unwrap();
    let encoder = sink.encoder();
    let driver = SinkDriver::new(sink, encoder).spawn();
    let started = std::time::Instant::now();
    let (statuses, closed) = deliver(driver, vec![vec![record(0, 0, r#"{"id": 1}"#)]]).await;
    assert_eq!(statuses, [AckStatus::Failed]);
    let err = closed.unwrap_err();
    for part in [
        "\"lake\"",
        "s3://no-such-bucket/lake/0-00000000000000000000.parquet",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    assert!(!err.contains(server.secret()), "{err}");
    // Not retried for the driver's minute: refused at once.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_garage_denies_or_refuses_halts_at_once_without_the_secret() {
    let server = Garage::start().unwrap();
    server.create_bucket("orders").unwrap();
    // A key the server knows but that holds no right on the bucket, and
    // the bucket's own key with a wrong secret.
    let (stranger, stranger_secret) = server.create_key("stranger").unwrap();
    let wrong_secret = format!("{}0", &server.secret()[1..]);
    for (key_id, secret) in [
        (stranger.as_str(), stranger_secret.as_str()),
        (server.key_id(), wrong_secret.as_str()),
    ] {
        let sink = ObjectStoreSink::new(
            "lake",
            std::path::Path::new("."),
            garage_config(&server, "orders", key_id, secret),
        )
        .unwrap();
        let encoder = sink.encoder();
        let driver = SinkDriver::new(sink, encoder).spawn();
        let started = std::time::Instant::now();
        let (statuses, closed) = deliver(driver, vec![vec![record(0, 0, r#"{"id": 1}"#)]]).await;
        assert_eq!(statuses, [AckStatus::Failed], "{key_id}");
        let err = closed.unwrap_err();
        for part in [
            "\"lake\"",
            "s3://orders/lake/0-00000000000000000000.parquet",
            "credential",
        ] {
            assert!(err.contains(part), "{key_id}: {part} in {err}");
        }
        for secret in [secret, server.secret(), stranger_secret.as_str()] {
            assert!(!err.contains(secret), "{err}");
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{key_id}: {:?}",
            started.elapsed()
        );
    }
    let objects = read_objects(&garage_location(&server, "orders"), "lake").unwrap();
    assert!(objects.is_empty(), "{objects:?}");
}

/// A Parquet sink named `lake` on the bucket `orders` of `server`
/// (created), through a [`FaultyStore`]: the store is returned to set
/// its faults on.
pub(crate) fn faulty_sink(server: &Garage) -> (ObjectStoreSink, Arc<FaultyStore>) {
    server.create_bucket("orders").unwrap();
    let config = garage_config(server, "orders", server.key_id(), server.secret());
    let s3 = ObjectStoreSink::new("lake", std::path::Path::new("."), config.clone())
        .unwrap()
        .store();
    let store = Arc::new(FaultyStore::new(s3));
    let sink = ObjectStoreSink::with_store("lake", config, store.clone()).unwrap();
    (sink, store)
}

/// The driver of `sink` for one batch of large records: never retried,
/// given up at `write_timeout`.
pub(crate) fn multipart_driver(
    sink: ObjectStoreSink,
    write_timeout: Option<std::time::Duration>,
) -> etl_sink::SinkHandle {
    let encoder = sink.encoder();
    SinkDriver::new(sink, encoder)
        .config(SinkDriverConfig {
            batch_max_bytes: 64 << 20,
            write_timeout,
            retry: etl_sink::RetryPolicy::never(),
            ..SinkDriverConfig::default()
        })
        .spawn()
}

/// Wait until the server shows `n` multipart uploads unfinished in
/// `orders`: the uploads started, their parts held unanswered.
pub(crate) async fn uploads_under_way(server: &Garage, n: u64) {
    let seen = std::time::Instant::now();
    while server.unfinished_multipart_uploads("orders").unwrap() < n {
        assert!(
            // A bound for a server that never shows them, not a speed:
            // on a loaded machine 4 s were seen to pass.
            seen.elapsed() < std::time::Duration::from_secs(60),
            "the server never showed the upload"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_multipart_upload_on_garage_is_aborted_on_the_server() {
    let server = Garage::start().unwrap();
    // The upload is started on the server, then its parts fail.
    let (sink, store) = faulty_sink(&server);
    store.fail_parts.store(true, Ordering::SeqCst);
    let driver = multipart_driver(sink, None);
    let (statuses, closed) = deliver(driver, vec![padded(0, 200)]).await;
    assert!(closed.is_err());
    assert_eq!(statuses, [AckStatus::Failed]);
    assert_eq!(store.aborted.load(Ordering::SeqCst), 1);
    assert_eq!(server.unfinished_multipart_uploads("orders").unwrap(), 0);
    let objects = read_objects(&garage_location(&server, "orders"), "lake").unwrap();
    assert!(objects.is_empty(), "{objects:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_abandoned_at_the_write_timeout_is_aborted_on_the_server() {
    let server = Garage::start().unwrap();
    // The upload is started on the server; its parts never get an
    // answer, so the driver gives the write up at its timeout and drops
    // it, as a shutdown past its deadline does.
    let (sink, store) = faulty_sink(&server);
    store.hang_parts.store(true, Ordering::SeqCst);
    let driver = multipart_driver(sink, Some(std::time::Duration::from_secs(4)));
    let delivery = tokio::spawn(deliver(driver, vec![padded(0, 200)]));
    // While the write hangs, the server shows the upload unfinished.
    uploads_under_way(&server, 1).await;
    let (statuses, closed) = delivery.await.unwrap();
    assert!(closed.is_err());
    assert_eq!(statuses, [AckStatus::Failed]);
    let started = std::time::Instant::now();
    loop {
        let unfinished = server.unfinished_multipart_uploads("orders").unwrap();
        if unfinished == 0 {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{unfinished} multipart upload(s) left on the server"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(store.aborted.load(Ordering::SeqCst), 1);
}

/// A run that ends right after its stop deadline, as the `etl` command
/// does: its multi-thread runtime shut down in the background at once.
/// The multipart upload the stop gave up was aborted on the server before
/// the runtime went, though the abort itself is slow to answer.
#[test]
fn a_multipart_upload_given_up_at_the_stop_deadline_is_aborted_before_the_runtime_ends() {
    let server = Garage::start().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stopped = runtime.block_on(async {
        // The parts never get an answer; the abort answers only after a
        // while, so a process that does not wait for it ends first.
        let (sink, store) = faulty_sink(&server);
        store.hang_parts.store(true, Ordering::SeqCst);
        *store.abort_delay.lock().unwrap() = std::time::Duration::from_millis(500);
        let driver = multipart_driver(sink, None);
        let (acker, _events) = etl_ack::channel();
        let records = padded(0, 200);
        let meta = etl_ack::BatchMeta {
            id: etl_ack::BatchId {
                partition: etl_record::PartitionId(0),
                epoch: 1,
                seq: 0,
            },
            first_offset: etl_record::Offset(0),
            last_offset: etl_record::Offset(199),
            records: 200,
            bytes: records.iter().map(|r| r.value.len() as u64).sum(),
        };
        let ack = acker.open(meta).unwrap();
        driver
            .send(etl_ack::Acked::new(records, ack))
            .await
            .unwrap();
        uploads_under_way(&server, 1).await;
        let stopped = driver.shutdown(std::time::Duration::from_millis(100)).await;
        (stopped, store)
    });
    let (stopped, store) = stopped;
    assert!(
        matches!(stopped, Err(etl_sink::SinkDriverError::ShutdownTimeout(_))),
        "{stopped:?}"
    );
    runtime.shutdown_background();
    assert_eq!(
        server.unfinished_multipart_uploads("orders").unwrap(),
        0,
        "the upload given up is left unfinished on the server"
    );
    assert_eq!(store.aborted.load(Ordering::SeqCst), 1);
}

/// Garage 2.5 takes a PUT whatever its precondition: a second
/// `If-None-Match: *` (`PutMode::Create`) and an `If-Match` naming an
/// ETag the object no longer has (`PutMode::Update`) both replace the
/// object. No conditional write can fence a stale writer there; see
/// docs/object-storage.md ("Members of one consumer group").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garage_replaces_an_object_whatever_the_put_s_precondition() {
    use object_store::{GetOptions, ObjectStore, PutMode, PutOptions, UpdateVersion};

    let server = Garage::start().unwrap();
    server.create_bucket("orders").unwrap();
    let config = garage_config(&server, "orders", server.key_id(), server.secret());
    let store = ObjectStoreSink::new("lake", std::path::Path::new("."), config)
        .unwrap()
        .store();
    let path = object_store::path::Path::from("fence/progress.json");
    let read = |store: Arc<dyn ObjectStore>, path: object_store::path::Path| async move {
        let got = store.get_opts(&path, GetOptions::default()).await;
        got.unwrap().bytes().await.unwrap()
    };
    let create = PutOptions::from(PutMode::Create);
    let first = store
        .put_opts(&path, "first".into(), create.clone())
        .await
        .unwrap();
    let second = store.put_opts(&path, "second".into(), create).await;
    assert!(second.is_ok(), "If-None-Match: * refused: {second:?}");
    assert_eq!(read(store.clone(), path.clone()).await, "second");

    // `first`'s ETag is stale now: an update conditional on it is taken.
    let stale = PutOptions::from(PutMode::Update(UpdateVersion {
        e_tag: first.e_tag,
        version: first.version,
    }));
    let third = store.put_opts(&path, "third".into(), stale).await;
    assert!(third.is_ok(), "If-Match on a stale ETag refused: {third:?}");
    assert_eq!(read(store, path).await, "third");
}
