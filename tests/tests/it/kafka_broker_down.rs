//! SIGTERM while the broker is unreachable: the graceful stop ends (the
//! final commit to the group fails at `commit_timeout` instead of
//! waiting for the broker to come back), and a run whose final commit
//! failed does not exit 0.

use crate::kafka_support;

use std::time::{Duration, Instant};

use kafka_support::{Member, MemberConfig, TestBroker, produce, unique};

const RECORDS: u64 = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_the_broker_down_stops_and_reports_the_failed_commit() {
    let mut broker = TestBroker::start();
    let topic = unique("down");
    let group = unique("down-group");
    broker.create_topic(&topic, 2).await;
    produce(&broker, &topic, 2, RECORDS, "kafka").await;

    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = MemberConfig::new(&broker, &group, &topic);
    config.commit_timeout_ms = Some(2_000);
    let mut member = Member::new("m", dir.path(), &config);
    member.start();

    // Kill the broker while records are still being written: those
    // already fetched keep moving the watermarks, which can no longer be
    // committed.
    let deadline = Instant::now() + Duration::from_secs(120);
    while member.written() < 2_000 {
        assert!(member.running(), "exited on its own:\n{}", member.log(1));
        assert!(Instant::now() < deadline, "nothing written in 120 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    broker.kill();
    let written = member.written();
    assert!(
        written < RECORDS,
        "all {written} records written before the broker went down"
    );

    // `terminate` fails the test if the stop does not end (within a
    // generous guard).
    let status = member.terminate();
    let log = member.log(1);
    assert!(
        !status.success(),
        "exit 0 after a failed final commit:\n{log}"
    );
    // 74 when the final commit itself failed; 1 when the group had
    // already dropped the member (its revocation's commit failed).
    assert!(matches!(status.code(), Some(74 | 1)), "{status}\n{log}");
    assert!(
        log.contains("no answer from the group coordinator"),
        "{log}"
    );
    // The outage is said once, not for every reconnection attempt, and
    // records fetched before it do not count as the broker answering.
    assert_eq!(log.matches("Kafka brokers unreachable").count(), 1, "{log}");
    assert!(!log.contains("reachable again"), "{log}");
}
