//! Property tests of the sink driver against a simple model: whatever the
//! batching, concurrency and injected failures, every batch resolves
//! exactly once, and a batch resolves delivered only if every one of its
//! records reached the sink or the dead-letter sink.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etl_ack::AckStatus;
use etl_record::{Offset, PartitionId};
use etl_sink::testing::{FailEveryNth, Flaky, MemorySink};
use etl_sink::{NdjsonEncoder, PermanentErrorPolicy, RetryPolicy, SinkDriver, SinkDriverConfig};
use etl_test_support::acks::AckedBatches;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Scenario {
    items: Vec<(u32, usize)>,
    max_records: usize,
    max_in_flight: usize,
    fraction: f64,
    fail_every: u64,
    dead_letter: bool,
    seed: u64,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        prop::collection::vec((0u32..3, 1usize..12), 1..30),
        1usize..40,
        1usize..5,
        0.0f64..0.6,
        2u64..8,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(
            |(items, max_records, max_in_flight, fraction, fail_every, dead_letter, seed)| {
                Scenario {
                    items,
                    max_records,
                    max_in_flight,
                    fraction,
                    fail_every,
                    dead_letter,
                    seed,
                }
            },
        )
}

fn run(s: &Scenario) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut source = AckedBatches::new();
        let memory = MemorySink::new();
        let dead = MemorySink::new();
        let sink = Arc::new(FailEveryNth::data(
            Flaky::new(memory.clone(), s.fraction, s.seed),
            s.fail_every,
        ));
        let mut driver = SinkDriver::new(sink, NdjsonEncoder::new()).config(SinkDriverConfig {
            batch_max_records: s.max_records,
            concurrency: s.max_in_flight,
            linger: Duration::from_millis(3),
            retry: RetryPolicy {
                max_elapsed: Duration::from_secs(600),
                ..RetryPolicy::default()
            },
            on_permanent_error: if s.dead_letter {
                PermanentErrorPolicy::DeadLetter
            } else {
                PermanentErrorPolicy::Fail
            },
            ..SinkDriverConfig::default()
        });
        if s.dead_letter {
            driver = driver.dead_letters(dead.clone());
        }
        let handle = driver.spawn();
        let mut next = BTreeMap::new();
        let mut batches = BTreeMap::new();
        for (seq, &(p, n)) in s.items.iter().enumerate() {
            let from = *next.get(&p).unwrap_or(&0);
            let to = from + n as i64;
            next.insert(p, to);
            batches.insert(seq as u64, (p, from..to));
            handle.send(source.batch(p, from..to)).await.unwrap();
        }
        let metrics = handle.close().await.unwrap();
        let msgs = source.resolutions();
        prop_assert_eq!(
            msgs.len(),
            batches.len(),
            "every batch resolves exactly once"
        );
        let stored: BTreeSet<(PartitionId, Offset)> = memory
            .positions()
            .into_iter()
            .chain(dead.positions())
            .collect();
        for msg in &msgs {
            let (p, range) = batches[&msg.id.seq].clone();
            if msg.status == AckStatus::Delivered {
                for o in range {
                    prop_assert!(
                        stored.contains(&(PartitionId(p), Offset(o))),
                        "delivered but not stored: {}/{}",
                        p,
                        o
                    );
                }
            }
        }
        if s.dead_letter {
            prop_assert!(msgs.iter().all(|m| m.status == AckStatus::Delivered));
        }
        prop_assert_eq!(metrics.records_written, memory.positions().len() as u64);
        prop_assert_eq!(metrics.dead_lettered, dead.positions().len() as u64);
        Ok(())
    })
}

proptest! {
    #[test]
    fn prop_every_batch_resolves_once_and_only_stored_data_is_delivered(s in scenario()) {
        run(&s)?;
    }
}

#[test]
fn a_fixed_scenario_with_every_kind_of_failure() {
    run(&Scenario {
        items: (0..20).map(|i| (i % 3, 5 + (i as usize % 4))).collect(),
        max_records: 7,
        max_in_flight: 3,
        fraction: 0.3,
        fail_every: 3,
        dead_letter: false,
        seed: 1,
    })
    .unwrap();
}
