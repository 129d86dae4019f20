//! The broker stopped for longer than the group's session timeout, then
//! started again with its data (Tansu on S3 storage): the pipeline keeps
//! retrying through the outage, says so, rejoins, and writes every
//! record; nothing is lost and the run stops cleanly afterwards.

use crate::kafka_support;

use std::time::{Duration, Instant};

use etl_test_support::s3::S3Server;
use etl_test_support::tansu::BrokerCommand;
use kafka_support::{
    Member, MemberConfig, TestBroker, count, produce_range, producer, read_ids, unique,
};

const FIRST: u64 = 20_000;
const SECOND: u64 = 20_000;
/// Longer than the members' session timeout (6 s).
const OUTAGE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_down_longer_than_the_session_timeout_and_back_loses_nothing() {
    let s3 = S3Server::start().expect("the test S3 server");
    s3.create_bucket("tansu").expect("a bucket for the broker");
    let logs = tempfile::tempdir().expect("temp dir");
    let mut command = BrokerCommand::new()
        .storage_engine("s3://tansu/")
        .log_to(logs.path());
    for (key, value) in s3.tansu_env() {
        command = command.env(key, value);
    }
    let mut broker = TestBroker::private(command);
    let topic = unique("restart");
    let group = unique("restart-group");
    broker.create_topic(&topic, 2).await;
    produce_range(&producer(&broker), &topic, 2, 0..FIRST, "kafka").await;

    let dir = tempfile::tempdir().expect("temp dir");
    let config = MemberConfig::new(&broker, &group, &topic);
    let mut member = Member::new("m", dir.path(), &config);
    member.start();
    let deadline = Instant::now() + Duration::from_secs(120);
    while member.written() < FIRST / 2 {
        assert!(member.running(), "exited on its own:\n{}", member.log(1));
        assert!(Instant::now() < deadline, "too little written in 120 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    broker.kill();
    let outage_ends = Instant::now() + OUTAGE;
    while Instant::now() < outage_ends {
        assert!(
            member.running(),
            "the run ended during the outage:\n{}",
            member.log(1)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    broker.restart();
    // Records produced after the restart reach the member too: it rejoined.
    produce_range(
        &producer(&broker),
        &topic,
        2,
        FIRST..FIRST + SECOND,
        "kafka",
    )
    .await;

    let deadline = Instant::now() + Duration::from_secs(180);
    while !count(&read_ids(dir.path()), FIRST + SECOND)
        .missing
        .is_empty()
    {
        assert!(
            member.running(),
            "the run ended after the outage:\n{}",
            member.log(1)
        );
        assert!(
            Instant::now() < deadline,
            "not every record written within 180 s of the restart ({} missing):\n{}",
            count(&read_ids(dir.path()), FIRST + SECOND).missing.len(),
            member.log(1)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let status = member.terminate();
    let log = member.log(1);
    assert!(status.success(), "{status}\n{log}");
    let counts = count(&read_ids(dir.path()), FIRST + SECOND);
    eprintln!(
        "{} records, {} lines, {} duplicates",
        counts.distinct, counts.lines, counts.duplicates
    );
    assert!(counts.missing.is_empty(), "lost: {:?}", counts.missing);
    assert_eq!(counts.unexpected, 0, "{log}");
    // Duplicates are allowed (at least once: records delivered while the
    // commits could not reach the broker are read again), but bounded by
    // what one member can have written past its last commit.
    assert!(
        counts.duplicates <= FIRST,
        "{} duplicates\n{log}",
        counts.duplicates
    );
    assert!(log.contains("Kafka brokers unreachable"), "{log}");
    assert!(log.contains("reachable again"), "{log}");
}
