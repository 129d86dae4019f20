//! Three `etl` processes in one consumer group read 200,000 records from a
//! 4-partition topic into file sinks while members are killed with
//! SIGKILL and restarted at seeded moments (rebalances under load). By
//! idempotency key nothing is lost, and duplicates stay within the
//! in-flight bound of each kill.
//!
//! Every record is produced once (idempotent producer, one delivery report
//! each) and carries a unique `id`, so its id stands for its idempotency
//! key `source/partition/offset`.

use crate::kafka_support;

use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng};

use kafka_support::{
    LINE_BYTES, Member, MemberConfig, TestBroker, count, output_bytes, read_ids, unique,
};

/// What a failure shows: each member's assignment, paused partitions and
/// fetch positions as it last logged them, and the group's committed
/// offsets, so a partition that stopped can be told from a slow run.
fn diagnose(broker: &TestBroker, group: &str, topic: &str, members: &[Member]) -> String {
    let mut s = String::new();
    for m in members {
        s.push_str(&m.state());
        s.push('\n');
    }
    s.push_str(&format!(
        "committed offsets of {group}: {:?}",
        broker.committed(group, topic, PARTITIONS)
    ));
    s
}

const RECORDS: u64 = 200_000;
const PARTITIONS: i32 = 4;
const MEMBERS: usize = 3;
const KILLS: usize = 3;
const SEED: u64 = 0x006b_6166_6b61;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_members_killed_under_load_lose_nothing() {
    let broker = TestBroker::start();
    let topic = unique("crash");
    let group = unique("crash-group");
    broker.create_topic(&topic, PARTITIONS).await;
    let started = Instant::now();
    kafka_support::produce(&broker, &topic, PARTITIONS, RECORDS, "kafka").await;
    let produced_in = started.elapsed();

    let dir = tempfile::tempdir().expect("temp dir");
    let config = MemberConfig::new(&broker, &group, &topic);
    let mut members: Vec<Member> = (0..MEMBERS)
        .map(|m| Member::new(&format!("member{m}"), dir.path(), &config))
        .collect();
    for m in &mut members {
        m.start();
    }

    // Kill points: seeded fractions of the records written so far, and a
    // seeded victim for each; the victim restarts at once.
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut kills: Vec<(u64, usize)> = (0..KILLS)
        .map(|_| {
            (
                rng.random_range(RECORDS / 10..RECORDS * 7 / 10),
                rng.random_range(0..MEMBERS),
            )
        })
        .collect();
    kills.sort_unstable();
    let mut done_kills = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(150);
    loop {
        let written = output_bytes(dir.path()) / LINE_BYTES;
        while let Some(&(at, victim)) = kills.first()
            && written >= at
        {
            kills.remove(0);
            members[victim].kill();
            members[victim].start();
            done_kills.push((written, members[victim].name.clone()));
        }
        if kills.is_empty()
            && written >= RECORDS
            && count(&read_ids(dir.path()), RECORDS).missing.is_empty()
        {
            break;
        }
        for m in &mut members {
            assert!(
                m.running(),
                "{} exited on its own:\n{}",
                m.name,
                m.log(m.runs)
            );
        }
        assert!(
            Instant::now() < deadline,
            "not done after 150 s: {written} lines written, kills done {done_kills:?}, left {kills:?}\n{}",
            diagnose(&broker, &group, &topic, &members)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for m in &mut members {
        let status = m.terminate();
        assert!(
            status.success(),
            "{} after SIGTERM: {status}\n{}",
            m.name,
            m.log(m.runs)
        );
    }

    let counts = count(&read_ids(dir.path()), RECORDS);
    let bound = config.duplicate_bound_per_kill() * KILLS as u64;
    println!(
        "kafka group crash (seed {SEED:#x}): {RECORDS} records on {PARTITIONS} partitions, \
         produced in {produced_in:.1?}; {MEMBERS} members, {} runs, kills at {done_kills:?}; \
         {} lines, {} distinct, {} missing, {} unexpected, {} duplicates \
         (bound {bound} = {KILLS} kills x 2 x {} records in flight); {:.1?} in all",
        members.iter().map(|m| m.runs).sum::<u32>(),
        counts.lines,
        counts.distinct,
        counts.missing.len(),
        counts.unexpected,
        counts.duplicates,
        config.in_flight_records(),
        started.elapsed(),
    );
    assert_eq!(done_kills.len(), KILLS);
    assert!(
        counts.missing.is_empty(),
        "lost: {:?}\n{}",
        &counts.missing[..counts.missing.len().min(20)],
        diagnose(&broker, &group, &topic, &members)
    );
    assert_eq!(counts.unexpected, 0);
    assert!(
        counts.duplicates <= bound,
        "{} duplicates above the bound {bound}",
        counts.duplicates
    );
}
