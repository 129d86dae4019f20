//! moto's S3 server on loopback, read back by pyarrow's own S3 client.

use etl_ack::AckStatus;
use etl_object_store::ObjectStoreSink;
use etl_sink::{SinkDriver, SinkDriverConfig};
use etl_test_support::pyarrow::{Location, read_objects};
use etl_test_support::s3::S3Server;
use serde_json::json;

use crate::support::{config, deliver, record, rows};

fn s3_config(server: &S3Server, bucket: &str, extra: &str) -> String {
    format!(
        r#"
        key = "lake/{{partition}}-{{first_offset}}.parquet"
        multipart_threshold = 1048576
        {extra}
        [store]
        kind = "s3"
        bucket = "{bucket}"
        region = "us-east-1"
        endpoint = "{endpoint}"
        access_key_id = "etl-test"
        secret_access_key = "etl-test-secret"
        [requests]
        max_retries = 2
        retry_timeout = "5s"
        [encoding]
        format = "parquet"
        compression = "zstd"
        columns = [
            {{ name = "id", type = "int64", nullable = false }},
            {{ name = "pad", type = "string" }},
        ]
        "#,
        endpoint = server.endpoint()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parquet_on_moto_single_and_multipart_objects_read_back_by_pyarrow() {
    let server = S3Server::start().unwrap();
    server.create_bucket("orders").unwrap();
    let folder = tempfile::tempdir().unwrap();
    let sink = ObjectStoreSink::new(
        "lake",
        folder.path(),
        config(&s3_config(&server, "orders", "")),
    )
    .unwrap();
    let encoder = sink.encoder();
    let driver = SinkDriver::new(sink, encoder)
        .config(SinkDriverConfig {
            batch_max_bytes: 64 << 20,
            ..SinkDriverConfig::default()
        })
        .spawn();
    // Partition 0: small, one PUT. Partition 1: random-looking padding
    // that compresses to about 8 MiB, two parts of a multipart upload.
    let small: Vec<_> = (0..100)
        .map(|o| record(0, o, &json!({"id": o, "pad": "x"}).to_string()))
        .collect();
    let mut seed = 7u64;
    let big: Vec<_> = (0..1400)
        .map(|o| {
            let pad: String = (0..10_000)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    char::from(b'a' + ((seed >> 33) % 26) as u8)
                })
                .collect();
            record(1, o, &json!({"id": o, "pad": pad}).to_string())
        })
        .collect();
    let (statuses, closed) = deliver(driver, vec![small, big]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered, AckStatus::Delivered]);

    let location = Location::S3 {
        endpoint: server.endpoint(),
        bucket: "orders".to_owned(),
        access_key: "etl-test".to_owned(),
        secret_key: "etl-test-secret".to_owned(),
        region: "us-east-1".to_owned(),
    };
    let objects = read_objects(&location, "lake").unwrap();
    let keys: Vec<&str> = objects.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "lake/0-00000000000000000000.parquet",
            "lake/1-00000000000000000000.parquet"
        ]
    );
    assert!(
        objects[0].1.contains("id: int64 not null"),
        "{}",
        objects[0].1
    );
    assert_eq!(objects[0].2.len(), 100);
    assert_eq!(objects[1].2.len(), 1400);
    let ids: Vec<i64> = rows(&objects)
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    let want: Vec<i64> = (0..100).chain(0..1400).collect();
    assert_eq!(ids, want);
    assert!(
        objects[1]
            .2
            .iter()
            .all(|r| r["pad"].as_str().unwrap().len() == 10_000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_halts_at_once_naming_sink_bucket_and_key_without_the_secret() {
    let server = S3Server::start().unwrap();
    let folder = tempfile::tempdir().unwrap();
    let sink = ObjectStoreSink::new(
        "lake",
        folder.path(),
        config(&s3_config(&server, "no-such-bucket", "")),
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
    assert!(!err.contains("etl-test-secret"), "{err}");
    // Not retried for the driver's minute: refused at once.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}
