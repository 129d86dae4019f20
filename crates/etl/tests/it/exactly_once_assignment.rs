//! Exactly-once with partitions that move between processes: a partition
//! assigned again resumes at the progress its sink has stored *now*, not
//! at what the sink held when the pipeline was built. Another process
//! (a member of the same consumer group, writing the same progress table)
//! may have advanced it meanwhile; the stale position wrote its records a
//! second time.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use etl::Pipeline;
use etl_checkpoint::{MemoryStore, OffsetStore};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{
    EncodedBatch, Progress, ProgressSink, RawLinesEncoder, Sink, SinkDriver, SinkError,
};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};
use tokio_util::sync::CancellationToken;

const P: PartitionId = PartitionId(7);
const END: i64 = 100;
/// Where the first assignment stops reading: then the partition is
/// revoked.
const FIRST_UNTIL: i64 = 30;
/// How far the other process writes while it owns the partition.
const OTHER_UNTIL: i64 = 80;

/// What the processes share: the stored progress (a progress table) and
/// the offsets their group committed.
#[derive(Clone, Debug, Default)]
struct Shared {
    stored: Arc<Mutex<Progress>>,
    group: MemoryStore,
}

impl Shared {
    /// The other member owned the partition and wrote up to `next`.
    fn other_member_writes_up_to(&self, next: i64) {
        self.stored.lock().unwrap().advance(P, Offset(next));
        self.group
            .clone()
            .commit(&BTreeMap::from([(P, Offset(next))]))
            .unwrap();
    }
}

/// A progress-keeping sink as the PostgreSQL one is: progress stored with
/// the rows, a cached copy skips what is already stored, and
/// `reload_progress` reads the shared store again.
#[derive(Debug)]
struct SharedStoreSink {
    shared: Shared,
    cache: Mutex<Progress>,
    written: Arc<Mutex<Vec<i64>>>,
}

#[async_trait]
impl Sink for SharedStoreSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut cache = self.cache.lock().unwrap();
        let mut stored = self.shared.stored.lock().unwrap();
        for r in batch.records() {
            if cache.covers(r) {
                continue;
            }
            self.written.lock().unwrap().push(r.position.offset.0);
            cache.advance(P, r.position.offset.next());
            stored.advance(P, r.position.offset.next());
        }
        Ok(())
    }
}

#[async_trait]
impl ProgressSink for SharedStoreSink {
    fn progress(&self) -> Progress {
        self.cache.lock().unwrap().clone()
    }

    async fn reload_progress(&self) -> Result<Progress, SinkError> {
        let stored = self.shared.stored.lock().unwrap().clone();
        let mut cache = self.cache.lock().unwrap();
        for (p, next) in stored.iter() {
            cache.advance(p, next);
        }
        Ok(cache.clone())
    }
}

/// One partition, assigned, revoked (the other member then advances it)
/// and assigned again; it records where it is sought.
struct MovingPartition {
    shared: Shared,
    step: u32,
    position: Option<i64>,
    seeks: Arc<Mutex<Vec<i64>>>,
}

impl MovingPartition {
    fn batch(&mut self, until: i64) -> Option<SourceEvent> {
        let from = self.position.filter(|from| *from < until)?;
        self.position = Some(until);
        let records = (from..until)
            .map(|o| Record::new(Position::new(SourceId::new("s"), P, Offset(o)), "x"))
            .collect();
        Some(SourceEvent::Batch(PollBatch::from_records(P, records)))
    }
}

#[async_trait]
impl Source for MovingPartition {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        let event = match self.step {
            0 => {
                self.step = 1;
                SourceEvent::Assigned(vec![P])
            }
            1 => match self.batch(FIRST_UNTIL) {
                Some(batch) => batch,
                None if self.position.is_some() => {
                    self.step = 2;
                    self.position = None;
                    SourceEvent::Revoked(vec![P])
                }
                None => SourceEvent::Idle,
            },
            2 => {
                self.shared.other_member_writes_up_to(OTHER_UNTIL);
                self.step = 3;
                SourceEvent::Assigned(vec![P])
            }
            _ => match self.batch(END) {
                Some(batch) => batch,
                None if self.position == Some(END) => SourceEvent::End,
                None => SourceEvent::Idle,
            },
        };
        Ok(event)
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        assert_eq!(partition, P);
        self.seeks.lock().unwrap().push(offset.0);
        self.position = Some(offset.0);
        Ok(())
    }
}

#[tokio::test]
async fn a_partition_assigned_again_resumes_at_the_progress_stored_now() {
    let shared = Shared::default();
    // An earlier run stored the first ten records.
    shared.other_member_writes_up_to(10);
    let written = Arc::new(Mutex::new(Vec::new()));
    let sink = SharedStoreSink {
        shared: shared.clone(),
        cache: Mutex::new(shared.stored.lock().unwrap().clone()),
        written: written.clone(),
    };
    let seeks = Arc::new(Mutex::new(Vec::new()));
    let source = MovingPartition {
        shared: shared.clone(),
        step: 0,
        position: None,
        seeks: seeks.clone(),
    };
    let (driver, progress) = SinkDriver::exactly_once(sink, RawLinesEncoder::new());
    let pipeline = Pipeline::builder()
        .source(source)
        .exactly_once_sink("table", driver, progress)
        .offset_store(shared.group.clone())
        .build()
        .unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();

    assert_eq!(
        *seeks.lock().unwrap(),
        [10, OTHER_UNTIL],
        "each assignment starts at the progress stored then"
    );
    let expected: Vec<i64> = (10..FIRST_UNTIL).chain(OTHER_UNTIL..END).collect();
    assert_eq!(
        *written.lock().unwrap(),
        expected,
        "records the other member wrote are not written again"
    );
}
