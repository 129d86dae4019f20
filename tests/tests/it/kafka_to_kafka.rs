//! Kafka to Kafka through the real `etl` binary: the group source reads a
//! topic, the producer sink writes another (acks=all, a batch acknowledged
//! only on its delivery reports). Every record arrives at least once,
//! carrying its idempotency key as the `etl-idempotency-key` header and
//! its value unchanged.

use crate::kafka_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use tokio::time::Instant;

use kafka_support::{Member, MemberConfig, TestBroker, unique};

const RECORDS: u64 = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_arrives_at_least_once() {
    let broker = TestBroker::start();
    let input = unique("k2k-in");
    let output = unique("k2k-out");
    broker.create_topic(&input, 4).await;
    broker.create_topic(&output, 2).await;
    let keys = kafka_support::produce(&broker, &input, 4, RECORDS, "kafka").await;
    let ids: BTreeMap<&str, u64> = keys.iter().map(|(id, k)| (k.as_str(), *id)).collect();

    let dir = tempfile::tempdir().expect("temp dir");
    let config = MemberConfig::new(&broker, &unique("k2k-group"), &input);
    let mut member = Member::new("copy", dir.path(), &config);
    member.start_with(&format!(
        "type = \"kafka\"\nbrokers = {:?}\ntopic = {output:?}\nlinger = \"5ms\"",
        broker.addr()
    ));

    let consumer: StreamConsumer = broker
        .consumer_config(&unique("k2k-check"))
        .create()
        .expect("consumer");
    consumer.subscribe(&[&output]).expect("subscribe");
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut arrived = BTreeSet::new();
    let mut messages = 0u64;
    while arrived.len() < keys.len() {
        let Ok(m) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await else {
            assert!(
                member.running() && Instant::now() < deadline,
                "{} of {RECORDS} arrived; pipeline log:\n{}",
                arrived.len(),
                member.log(1)
            );
            continue;
        };
        let m = m.expect("consume");
        messages += 1;
        let key = m
            .headers()
            .and_then(|hs| hs.iter().find(|h| h.key == "etl-idempotency-key"))
            .and_then(|h| h.value)
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .expect("idempotency header");
        let id = *ids
            .get(key.as_str())
            .unwrap_or_else(|| panic!("unknown idempotency key {key}"));
        assert_eq!(
            m.payload(),
            Some(kafka_support::value(id).as_bytes()),
            "value of {key}"
        );
        arrived.insert(id);
    }
    let status = member.terminate();
    assert!(
        status.success(),
        "after SIGTERM: {status}\n{}",
        member.log(1)
    );
    println!(
        "kafka to kafka: {RECORDS} records, {messages} messages read back, {} distinct",
        arrived.len()
    );
}

/// A Kafka source's offsets live in its consumer group, so a file store
/// under `[checkpoint]` would stay empty: `etl offsets show` printed "no
/// committed offsets" (exit 0) while the group held them. Every command
/// refuses it as a configuration error that says where the offsets are.
#[test]
fn a_kafka_source_refuses_a_store_other_than_its_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = MemberConfig::with_brokers("127.0.0.1:9", "orders-group", "orders")
        .render("type = \"file\"\npath = \"out.ndjson\"");
    let source_store = "store = { type = \"source\" }";
    assert!(config.contains(source_store), "{config}");
    let path = dir.path().join("pipeline.toml");
    std::fs::write(
        &path,
        config.replace(
            source_store,
            "store = { type = \"file\", path = \"state\" }",
        ),
    )
    .expect("write config");
    // The exit code and everything `etl <command> pipeline.toml` printed.
    let etl = |command: &[&str]| {
        let out = std::process::Command::new(etl_tests::etl_binary())
            .args(command)
            .arg(&path)
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run etl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    for command in [&["validate"][..], &["offsets", "show"], &["run"]] {
        let (code, text) = etl(command);
        assert_eq!(code, Some(78), "etl {command:?}:\n{text}");
        assert!(
            text.contains("consumer group `orders-group`") && text.contains("type = \"source\""),
            "etl {command:?} says where the offsets are:\n{text}"
        );
        assert!(!text.contains("no committed offsets"), "{text}");
    }
    // Without any store named, the default folder under `[checkpoint]` is
    // not the source's either: `offsets show` says where the offsets are.
    std::fs::write(&path, config.replace(source_store, "")).expect("write config");
    let (code, text) = etl(&["offsets", "show"]);
    assert_eq!(code, Some(78), "etl offsets show:\n{text}");
    assert!(text.contains("kafka-consumer-groups"), "{text}");
    assert!(!text.contains("no committed offsets"), "{text}");
}
