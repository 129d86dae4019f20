//! Tests of the transform stage on several workers: per-partition order
//! into the sinks, an outcome for every record, panics failing the batch.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etl_checkpoint::MemoryStore;
use etl_record::{Offset, PartitionId, Record};
use etl_sink::{EncodedBatch, RawLinesEncoder, Sink, SinkDriver, SinkError};
use etl_source::{GeneratorConfig, GeneratorSource};
use tokio_util::sync::CancellationToken;

use super::{Pipeline, PipelineError};
use crate::transform::{Outcome, Transform, TransformChain, map};

/// Keeps the positions of what it is given, in the order given.
#[derive(Debug, Default, Clone)]
struct Collect(Arc<Mutex<Vec<(PartitionId, Offset)>>>);

#[async_trait]
impl Sink for Collect {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut seen = self.0.lock().unwrap();
        seen.extend(
            batch
                .records()
                .iter()
                .map(|r| (r.position.partition, r.position.offset)),
        );
        Ok(())
    }
}

/// Slower on some batches than on others, so workers finish out of
/// order; filters offsets divisible by 5, rejects those that are 3 mod 7,
/// and panics at `panic_at` when set.
#[derive(Debug, Clone)]
struct Uneven {
    forks: Arc<AtomicUsize>,
    panic_at: Option<i64>,
}

impl Transform for Uneven {
    fn name(&self) -> &str {
        "uneven"
    }

    fn apply(&mut self, record: Record) -> Outcome {
        let offset = record.position.offset.0;
        assert!(self.panic_at != Some(offset), "a bug in user code");
        if (offset / 3) % 4 == 0 {
            std::thread::sleep(Duration::from_micros(300));
        }
        if offset % 5 == 0 {
            Outcome::Filtered
        } else if offset % 7 == 3 {
            Outcome::Reject(record, "three mod seven".to_owned())
        } else {
            Outcome::Keep(record)
        }
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        self.forks.fetch_add(1, Ordering::Relaxed);
        Some(Box::new(self.clone()))
    }
}

const PARTITIONS: u32 = 3;
const PER_PARTITION: u64 = 300;

fn source() -> GeneratorSource {
    GeneratorSource::new(GeneratorConfig {
        partitions: PARTITIONS,
        records_per_partition: Some(PER_PARTITION),
        max_batch_records: 3,
        ..GeneratorConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_keep_partition_order_and_every_outcome() {
    let forks = Arc::new(AtomicUsize::new(0));
    let (out, dlq) = (Collect::default(), Collect::default());
    let pipeline = Pipeline::builder()
        .source(source())
        .transform(Uneven {
            forks: forks.clone(),
            panic_at: None,
        })
        .transform_workers(2)
        .sink("out", SinkDriver::new(out.clone(), RawLinesEncoder::new()))
        .dead_letter(dlq.clone())
        .build()
        .unwrap();
    let summary = tokio::time::timeout(
        Duration::from_secs(60),
        pipeline.run(CancellationToken::new()),
    )
    .await
    .unwrap()
    .unwrap();
    // The first worker runs the chain itself, the second a fork.
    assert_eq!(forks.load(Ordering::Relaxed), 1, "ran on the workers");

    let total = u64::from(PARTITIONS) * PER_PARTITION;
    assert_eq!(summary.read, total);
    assert_eq!(
        summary.written() + summary.filtered + summary.dead_lettered,
        total
    );
    let mut by_partition: BTreeMap<PartitionId, Vec<i64>> = BTreeMap::new();
    for (p, o) in out.0.lock().unwrap().iter() {
        by_partition.entry(*p).or_default().push(o.0);
    }
    let expected: Vec<i64> = (0..PER_PARTITION as i64)
        .filter(|o| o % 5 != 0 && o % 7 != 3)
        .collect();
    assert_eq!(by_partition.len(), PARTITIONS as usize);
    for (p, offsets) in by_partition {
        assert_eq!(offsets, expected, "partition {p}: in order, each once");
    }
    let rejected = (0..PER_PARTITION as i64)
        .filter(|o| o % 5 != 0 && o % 7 == 3)
        .count();
    assert_eq!(dlq.0.lock().unwrap().len(), rejected * PARTITIONS as usize);
    assert_eq!(summary.committed.len(), PARTITIONS as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_on_a_worker_fails_its_batch() {
    let store = MemoryStore::new();
    let pipeline = Pipeline::builder()
        .source(source())
        .transform(Uneven {
            forks: Arc::default(),
            panic_at: Some(25),
        })
        .transform_workers(2)
        .sink(
            "out",
            SinkDriver::new(Collect::default(), RawLinesEncoder::new()),
        )
        .dead_letter(Collect::default())
        .offset_store(store.clone())
        .build()
        .unwrap();
    let err = pipeline.run(CancellationToken::new()).await.unwrap_err();
    assert!(matches!(err, PipelineError::Internal(_)), "{err}");
    for p in 0..PARTITIONS {
        let committed = store
            .offsets()
            .get(&PartitionId(p))
            .copied()
            .unwrap_or(Offset(0));
        assert!(committed <= Offset(24), "partition {p}: {committed}");
    }
}

#[test]
fn workers_fork_the_chain_or_run_it_on_one_thread() {
    use super::ordered::Workers;
    let threads = |chain: TransformChain, count| {
        let steps = super::fanout::Steps {
            chain,
            router: None,
        };
        Workers::spawn(steps, count).map(|w| w.count())
    };
    let uneven = || {
        Box::new(Uneven {
            forks: Arc::default(),
            panic_at: None,
        })
    };
    assert!(threads(TransformChain::new(), 2).is_err(), "empty");
    let mut chain = TransformChain::new();
    chain.push(uneven());
    assert!(threads(chain, 0).is_err(), "no thread asked for");
    let mut chain = TransformChain::new();
    chain.push(uneven());
    assert_eq!(threads(chain, 1).unwrap(), 1);
    let mut chain = TransformChain::new();
    chain.push(uneven());
    chain.push(Box::new(map("stateless closure", |r: Record| Ok(r))));
    assert_eq!(threads(chain, 3).unwrap(), 3, "a stateless closure forks");
    let mut chain = TransformChain::new();
    chain.push(uneven());
    chain.push(Box::new(crate::map_mut("stateful closure", |r: Record| {
        Ok(r)
    })));
    assert_eq!(threads(chain, 3).unwrap(), 1, "a stateful closure does not");
}

/// Where a record's transform ran: whether inside the async runtime
/// (`Handle::current` works), and the thread's name.
type Ran = (bool, Option<String>);

/// Where each record's transform ran.
#[derive(Debug, Default, Clone)]
struct Where(Arc<Mutex<Vec<Ran>>>);

impl Where {
    fn note(seen: &Mutex<Vec<Ran>>) {
        let inside = tokio::runtime::Handle::try_current().is_ok();
        let name = std::thread::current().name().map(str::to_owned);
        seen.lock().unwrap().push((inside, name));
    }

    /// A run with `workers` asked for, of a transform that can fork or,
    /// as a stateful closure, cannot.
    async fn run(&self, workers: usize, forks: bool) -> Vec<Ran> {
        let seen = self.0.clone();
        let builder = Pipeline::builder().source(source());
        let builder = if forks {
            builder.transform(map("where", move |r: Record| {
                Where::note(&seen);
                Ok(r)
            }))
        } else {
            builder.transform(crate::map_mut("where", move |r: Record| {
                Where::note(&seen);
                Ok(r)
            }))
        };
        let pipeline = builder
            .transform_workers(workers)
            .sink(
                "out",
                SinkDriver::new(Collect::default(), RawLinesEncoder::new()),
            )
            .build()
            .unwrap();
        let summary = pipeline.run(CancellationToken::new()).await.unwrap();
        assert_eq!(summary.read, u64::from(PARTITIONS) * PER_PARTITION);
        let seen = self.0.lock().unwrap().clone();
        assert_eq!(seen.len() as u64, summary.read);
        seen
    }
}

/// Every record's transform ran inside the runtime, on this thread.
fn all_on(seen: &[Ran], thread: &str) {
    for (inside, name) in seen {
        assert!(*inside, "a transform ran outside the runtime ({name:?})");
        assert_eq!(name.as_deref(), Some(thread));
    }
}

// A CPU-bound stage on a runtime worker holds up the very tasks it wakes:
// tokio runs a woken task next on the waking worker, where no other
// worker may take it, so the sink waited for the stage's whole backlog
// and the source for credit, and two cores did the work of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_transform_worker_runs_on_a_thread_of_its_own_not_on_the_runtime() {
    all_on(&Where::default().run(1, true).await, "etl-transform-0");
    all_on(&Where::default().run(1, false).await, "etl-transform-0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_that_cannot_fork_runs_on_one_thread_whatever_the_workers_asked() {
    all_on(&Where::default().run(4, false).await, "etl-transform-0");
}

// A current-thread runtime asked for one thread: with one worker the
// transforms stay on the pipeline's task (the simulation's determinism
// rests on it).
#[tokio::test(flavor = "current_thread")]
async fn on_a_current_thread_runtime_one_worker_stays_on_the_pipelines_task() {
    let here = std::thread::current().name().map(str::to_owned).unwrap();
    all_on(&Where::default().run(1, true).await, &here);
    all_on(&Where::default().run(1, false).await, &here);
}
