//! Partitions that move away and back while batches are in flight: the
//! first member keeps running while a second one joins and leaves three
//! times, so its partitions are revoked and reassigned again and again
//! with records still on their way from its fetch queue to its sink.
//! Every handover commits on revoke, so nothing may be lost and nothing
//! written twice, and the group's commits end at the end of every
//! partition. A handover a member reports as not clean (its revoke
//! deadline passed with batches in flight, on a loaded machine) may
//! write the records then in flight twice, as at-least-once allows, and
//! no more.

use crate::kafka_support;

use std::time::{Duration, Instant};

use kafka_support::{
    Member, MemberConfig, TestBroker, count, produce_range, producer, read_ids, unique,
};

const PARTITIONS: i32 = 4;
/// Records produced per step, one step every [`STEP`].
const CHUNK: u64 = 400;
const STEP: Duration = Duration::from_millis(60);
/// Times the second member joins and leaves.
const VISITS: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_moved_back_and_forth_with_batches_in_flight_lose_nothing() {
    let broker = TestBroker::start();
    let topic = unique("reassign");
    let group = unique("reassign-group");
    broker.create_topic(&topic, PARTITIONS).await;
    let producer = producer(&broker);
    let mut produced = 0;
    let produce_step = async |produced: &mut u64| {
        let next = *produced + CHUNK;
        produce_range(&producer, &topic, PARTITIONS, *produced..next, "kafka").await;
        *produced = next;
    };
    produce_step(&mut produced).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = MemberConfig::new(&broker, &group, &topic);
    // Small batches, several in flight per partition: a revocation finds
    // some of them on their way.
    config.max_batch_records = 100;
    config.max_in_flight_batches = 16;
    let mut first = Member::new("first", dir.path(), &config);
    let mut second = Member::new("second", dir.path(), &config);
    let deadline = Instant::now() + Duration::from_secs(150);
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
    for visit in 1..=VISITS {
        let before = second.written();
        second.start();
        wait(
            &format!("the second member writes (visit {visit})"),
            &mut produced,
            &mut || second.written() > before,
        )
        .await;
        let status = second.terminate();
        assert!(
            status.success(),
            "second member after SIGTERM (visit {visit}): {status}\n{}",
            second.log(visit)
        );
        // The partitions come back to the first member before the next
        // visit, so that every visit takes them from it again.
        let assigned = |m: &Member| {
            m.log(1)
                .matches(r#""message":"partitions assigned""#)
                .count()
        };
        wait(
            &format!("the first member gets its partitions back (visit {visit})"),
            &mut produced,
            &mut || assigned(&first) > usize::try_from(visit).expect("small"),
        )
        .await;
    }
    // Producing stops; the first member, alone again, reads the rest.
    let records = produced;
    while !count(&read_ids(dir.path()), records).missing.is_empty() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the last records\n{}",
            first.state()
        );
        tokio::time::sleep(STEP).await;
    }
    let status = first.terminate();
    let first_log = first.log(1);
    assert!(
        status.success(),
        "first member after SIGTERM: {status}\n{first_log}"
    );
    assert!(
        first_log
            .matches(r#""message":"partitions revoked""#)
            .count()
            >= usize::try_from(VISITS).expect("small"),
        "the first member's partitions moved away at every visit:\n{}",
        first.state()
    );

    let counts = count(&read_ids(dir.path()), records);
    println!(
        "kafka reassign: {records} records; first wrote {}, second wrote {} in {VISITS} visits; \
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
    // A handover is clean when the revocation drains and commits in
    // time; on a loaded machine the revoke deadline may pass with batches
    // still in flight, and then at-least-once allows those records to be
    // written twice. The members say so when it happens: duplicates
    // without such a line are a bug, and with them they stay within the
    // records in flight at each.
    let unclean: Vec<String> = [&first, &second]
        .iter()
        .flat_map(|m| m.unclean_handovers())
        .collect();
    if unclean.is_empty() {
        assert_eq!(
            counts.duplicates,
            0,
            "a member wrote records another member had committed, or a successor read past a \
             handover again, though every handover was clean\n{}{}\nwhere:\n{}\nhandovers:\n{}{}",
            first.warnings(),
            second.warnings(),
            kafka_support::duplicates_by_file(dir.path(), PARTITIONS as u64),
            first.handovers(),
            second.handovers()
        );
    } else {
        let bound = unclean.len() as u64 * config.in_flight_records();
        println!(
            "kafka reassign: {} handovers not clean, {} duplicates (at most {bound}):\n{}",
            unclean.len(),
            counts.duplicates,
            unclean.join("\n")
        );
        assert!(
            counts.duplicates <= bound,
            "{} duplicates, more than the records in flight at {} handovers that were not clean \
             ({bound})\n{}",
            counts.duplicates,
            unclean.len(),
            unclean.join("\n")
        );
    }
    let committed = broker.committed(&group, &topic, PARTITIONS);
    let per_partition = i64::try_from(records / PARTITIONS as u64).expect("small");
    assert_eq!(
        committed,
        (0..PARTITIONS).map(|p| (p, per_partition)).collect(),
        "the group's commits end at the end of every partition"
    );
}
