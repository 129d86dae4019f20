//! Scale-out into a data lake: two `etl` processes of one Kafka consumer
//! group read one topic of several partitions into an exactly-once
//! Parquet lake (`type = "object_store"`) in one bucket of Garage, a real
//! S3 server, while records keep being produced. Members are SIGKILLed
//! and started again, so partitions move from one member to the other
//! and back, again and again; each object is read back by pyarrow.
//!
//! After every kill, the progress the bucket holds covers only records
//! its objects hold, and no record is in two objects; at the end every
//! produced record is in exactly one object and the progress covers
//! every partition to its end.

use crate::kafka_support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etl_test_support::garage::{Garage, REGION};
use etl_test_support::pyarrow::{Location, read_objects};
use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng};

use kafka_support::{
    Member, MemberConfig, TestBroker, produce_range, producer, unique, wait_until,
};

const PARTITIONS: i32 = 4;
/// Kills, alternating between the two members.
const KILLS: usize = 4;
/// Records produced at a time, then a pause of [`PRODUCE_EVERY`].
const CHUNK: u64 = 100;
const PRODUCE_EVERY: Duration = Duration::from_millis(100);
const SEED: u64 = 0x6c61_6b65;
/// The bucket, the objects' prefix and the progress objects' prefix (the
/// sink is named `out`).
const BUCKET: &str = "lake";
const OBJECTS: &str = "orders";
const PROGRESS: &str = "_etl_progress/out";

/// Where each produced record is, by id: its partition id (as the Kafka
/// source numbers partitions) and offset.
type Produced = BTreeMap<u64, (u32, i64)>;

/// Records produced in chunks on their own thread, until stopped.
struct Producer {
    produced: Arc<Mutex<Produced>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Producer {
    fn start(broker: &TestBroker, topic: &str) -> Producer {
        let producer = producer(broker);
        let topic = topic.to_owned();
        let produced = Arc::new(Mutex::new(Produced::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (produced, stop) = (produced.clone(), stop.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                let mut next = 0;
                while !stop.load(Ordering::Relaxed) {
                    let keys = runtime.block_on(produce_range(
                        &producer,
                        &topic,
                        PARTITIONS,
                        next..next + CHUNK,
                        "kafka",
                    ));
                    let mut produced = produced.lock().expect("the producer's record");
                    for (id, key) in keys {
                        produced.insert(id, position(&key));
                    }
                    drop(produced);
                    next += CHUNK;
                    std::thread::sleep(PRODUCE_EVERY);
                }
            })
        };
        Producer {
            produced,
            stop,
            thread: Some(thread),
        }
    }

    /// What was produced (every delivery reported) so far.
    fn produced(&self) -> Produced {
        self.produced.lock().expect("the producer's record").clone()
    }

    /// Stop producing; what was produced in all.
    fn finish(mut self) -> Produced {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the producer thread");
        }
        self.produced()
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `(partition id, offset)` of an idempotency key `source/partition/offset`.
fn position(key: &str) -> (u32, i64) {
    let mut parts = key.rsplitn(3, '/');
    let offset = parts.next().and_then(|o| o.parse().ok());
    let partition = parts.next().and_then(|p| p.parse().ok());
    match (partition, offset) {
        (Some(p), Some(o)) => (p, o),
        _ => panic!("not an idempotency key: {key}"),
    }
}

/// Each partition's progress as the bucket stores it (its next offset).
fn progress_of(location: &Location) -> BTreeMap<u32, i64> {
    let mut progress = BTreeMap::new();
    for (key, _, rows) in read_objects(location, PROGRESS).expect("pyarrow reads the progress") {
        for row in rows {
            let partition = row["partition"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok());
            let next = row["next_offset"].as_i64();
            let (Some(partition), Some(next)) = (partition, next) else {
                panic!("{key}: not a progress object: {row}");
            };
            progress.insert(partition, next);
        }
    }
    progress
}

/// What the bucket holds: each partition's stored progress, then how
/// many objects hold each record id. The progress is read first: it is
/// written after the objects it covers, so the objects read after it hold
/// at least what it says, even while a member writes.
fn tally(location: &Location) -> (BTreeMap<u32, i64>, BTreeMap<u64, usize>) {
    let progress = progress_of(location);
    let mut counts = BTreeMap::new();
    for (key, _, rows) in read_objects(location, OBJECTS).expect("pyarrow reads the objects") {
        assert!(
            key.ends_with(".parquet"),
            "not an object of the sink: {key}"
        );
        for row in rows {
            let id = row["id"].as_u64().unwrap_or_else(|| panic!("{key}: {row}"));
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    (progress, counts)
}

/// The contract at any moment: no record in two objects, and every
/// produced record below its partition's stored progress in an object.
fn assert_progress_covered(
    produced: &Produced,
    progress: &BTreeMap<u32, i64>,
    counts: &BTreeMap<u64, usize>,
    when: &str,
) {
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{when}: records in two objects: {:?}",
        &twice[..twice.len().min(20)]
    );
    let uncovered: Vec<_> = produced
        .iter()
        .filter(|(id, (p, o))| {
            progress.get(p).is_some_and(|next| o < next) && !counts.contains_key(id)
        })
        .map(|(id, at)| (*id, *at))
        .collect();
    assert!(
        uncovered.is_empty(),
        "{when}: the stored progress {progress:?} covers records no object holds \
         (id, (partition, offset)): {:?}",
        &uncovered[..uncovered.len().min(20)]
    );
}

/// Lines of `member`'s current run announcing an assignment.
fn assignments(member: &Member) -> usize {
    member
        .log(member.runs)
        .matches("partitions assigned")
        .count()
}

// A plain test: the producer runs on a thread of its own.
#[test]
fn a_group_of_two_killed_in_turn_writes_every_record_into_exactly_one_object() {
    let server = Garage::start().unwrap();
    server.create_bucket(BUCKET).unwrap();
    let location = Location::S3 {
        endpoint: server.endpoint(),
        bucket: BUCKET.to_owned(),
        access_key: server.key_id().to_owned(),
        secret_key: server.secret().to_owned(),
        region: REGION.to_owned(),
    };
    let broker = TestBroker::start();
    let topic = unique("lake");
    let group = unique("lake-group");
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(broker.create_topic(&topic, PARTITIONS));
    }
    let sink = format!(
        "type = \"object_store\"\nexactly_once = true\n\
         key = \"{OBJECTS}/{{partition}}-{{first_offset}}.parquet\"\nbatch_max_records = 200\n\
         store = {{ kind = \"s3\", bucket = \"{BUCKET}\", region = \"{REGION}\", endpoint = \"{}\", \
         access_key_id = \"{}\", secret_access_key = \"{}\" }}\n\
         encoding = {{ format = \"parquet\", columns = [\
         {{ name = \"id\", type = \"int64\", nullable = false }}, \
         {{ name = \"pad\", type = \"string\", nullable = false }}] }}\n",
        server.endpoint(),
        server.key_id(),
        server.secret(),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let config = MemberConfig::new(&broker, &group, &topic);
    let mut a = Member::new("a", dir.path(), &config);
    let mut b = Member::new("b", dir.path(), &config);
    let started = Instant::now();
    let producer = Producer::start(&broker, &topic);

    a.start_with(&sink);
    b.start_with(&sink);
    wait_until("both assigned", &mut [&mut a, &mut b], |m| {
        m.iter().all(|m| assignments(m) > 0)
    });

    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut kills = Vec::new();
    for kill in 0..KILLS {
        let (victim, survivor) = if kill % 2 == 0 {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        // Both write for a while, then the victim dies holding its
        // partitions, a write possibly half done.
        let pause = Duration::from_millis(rng.random_range(1_500..4_000));
        let until = Instant::now() + pause;
        wait_until(
            "written a while",
            &mut [&mut *victim, &mut *survivor],
            |_| Instant::now() >= until,
        );
        let seen = assignments(survivor);
        victim.kill();
        kills.push((victim.name.clone(), pause));
        let (progress, counts) = tally(&location);
        let when = format!("after kill {} ({})", kill + 1, victim.name);
        assert!(!progress.is_empty(), "{when}: no progress stored yet");
        assert_progress_covered(&producer.produced(), &progress, &counts, &when);

        // The survivor takes the victim's partitions over, then gives
        // some back to the victim started again.
        wait_until("taken over", &mut [&mut *survivor], |m| {
            assignments(m[0]) > seen
        });
        victim.start_with(&sink);
        wait_until("rejoined", &mut [&mut *victim, &mut *survivor], |m| {
            assignments(m[0]) > 0
        });
    }

    let produced = producer.finish();
    let mut ends: BTreeMap<u32, i64> = BTreeMap::new();
    for &(partition, offset) in produced.values() {
        let end = ends.entry(partition).or_insert(0);
        *end = (*end).max(offset + 1);
    }
    let caught_up = format!("the progress at the ends {ends:?}");
    wait_until(&caught_up, &mut [&mut a, &mut b], |_| {
        progress_of(&location) == ends
    });
    for m in [&mut a, &mut b] {
        let status = m.terminate();
        assert!(
            status.success(),
            "{} after SIGTERM: {status}\n{}",
            m.name,
            m.log(m.runs)
        );
    }

    let (progress, counts) = tally(&location);
    assert_progress_covered(&produced, &progress, &counts, "at the end");
    assert_eq!(
        progress, ends,
        "the progress covers every partition to its end"
    );
    let missing: Vec<u64> = produced
        .keys()
        .filter(|id| !counts.contains_key(id))
        .copied()
        .collect();
    let unexpected: Vec<u64> = counts
        .keys()
        .filter(|id| !produced.contains_key(id))
        .copied()
        .collect();
    println!(
        "kafka lake (seed {SEED:#x}): {} records on {PARTITIONS} partitions, 2 members, \
         {} runs, kills {kills:?}; {} records in objects, {} missing; {:.1?} in all",
        produced.len(),
        a.runs + b.runs,
        counts.len(),
        missing.len(),
        started.elapsed(),
    );
    assert!(
        missing.is_empty(),
        "lost: {:?}",
        &missing[..missing.len().min(20)]
    );
    assert!(unexpected.is_empty(), "never produced: {unexpected:?}");
    assert!(
        counts.values().all(|&n| n == 1),
        "every record in one object"
    );
}
