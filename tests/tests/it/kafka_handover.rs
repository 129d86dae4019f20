//! Commit on revoke, through the real `etl` binary: a second member that
//! joins takes partitions the first hands over, and a member stopped with
//! SIGTERM while records keep arriving hands all of its partitions over.
//! Every handover commits inside the rebalance callback, so the successor
//! starts exactly at the committed offsets: zero duplicates, nothing lost.

use crate::kafka_support;

use std::time::{Duration, Instant};

use kafka_support::{
    Member, MemberConfig, TestBroker, count, produce_range, producer, read_ids, unique,
};

const PARTITIONS: i32 = 4;
/// Records produced per step, one step every [`STEP`]: the topic grows
/// while the members run, so a stop always lands mid-stream.
const CHUNK: u64 = 500;
const STEP: Duration = Duration::from_millis(80);
/// Steps produced after the first member stopped.
const STEPS_AFTER_STOP: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_hand_partitions_over_at_the_committed_offsets() {
    let broker = TestBroker::start();
    let topic = unique("handover");
    let group = unique("handover-group");
    broker.create_topic(&topic, PARTITIONS).await;
    let producer = producer(&broker);
    // Records `0..produced` are in the topic; producing stops at `until`.
    let mut produced = 0;
    let until = std::cell::Cell::new(u64::MAX);
    let produce_step = async |produced: &mut u64| {
        if *produced < until.get() {
            let next = *produced + CHUNK;
            produce_range(&producer, &topic, PARTITIONS, *produced..next, "kafka").await;
            *produced = next;
        }
    };
    produce_step(&mut produced).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let config = MemberConfig::new(&broker, &group, &topic);
    let mut first = Member::new("first", dir.path(), &config);
    let mut second = Member::new("second", dir.path(), &config);
    // A bound on a hang, not on speed: alone the test takes 65-77 s, most
    // of it the broker's rebalances, and a loaded machine stretches them.
    let deadline = Instant::now() + Duration::from_secs(240);
    let wait = async |what: &str, produced: &mut u64, done: &mut dyn FnMut() -> bool| {
        while !done() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what} ({produced} produced)"
            );
            produce_step(produced).await;
            tokio::time::sleep(STEP).await;
        }
    };

    first.start();
    wait("the first member writes", &mut produced, &mut || {
        first.written() > 0
    })
    .await;
    second.start();
    wait("the second member writes", &mut produced, &mut || {
        second.written() > 0
    })
    .await;
    let status = first.terminate();
    assert!(
        status.success(),
        "first member after SIGTERM: {status}\n{}",
        first.log(1)
    );
    let first_log = first.log(1);
    assert!(
        first_log.contains("partitions revoked"),
        "the first member committed on revoke:\n{first_log}"
    );
    until.set(produced + STEPS_AFTER_STOP * CHUNK);
    let records = until.get();
    wait("everything arrives", &mut produced, &mut || {
        count(&read_ids(dir.path()), records).missing.is_empty()
    })
    .await;
    let status = second.terminate();
    assert!(
        status.success(),
        "second member after SIGTERM: {status}\n{}",
        second.log(1)
    );

    let counts = count(&read_ids(dir.path()), records);
    println!(
        "kafka handover: {records} records; first wrote {}, second wrote {}; \
         {} missing, {} duplicates",
        first.written(),
        second.written(),
        counts.missing.len(),
        counts.duplicates
    );
    assert!(
        counts.missing.is_empty(),
        "lost {} records",
        counts.missing.len()
    );
    assert_eq!(counts.unexpected, 0);
    assert_eq!(
        counts.duplicates, 0,
        "a successor read past a handover again"
    );
}
