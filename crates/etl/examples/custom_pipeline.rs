//! A pipeline from Rust with a custom source and a custom sink: a source of
//! numbered sensor readings in three partitions, a filter and a map
//! written as closures, and a sink that keeps what it is given in memory.
//!
//! Run it with `cargo run -p etl --example custom_pipeline`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use etl::{Pipeline, filter, map};
use etl_checkpoint::MemoryStore;
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{EncodedBatch, RawLinesEncoder, Sink, SinkDriver, SinkError};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};
use tokio_util::sync::CancellationToken;

/// Readings `0..count` in each partition; offsets are reading numbers.
#[derive(Debug)]
struct Readings {
    count: i64,
    next: BTreeMap<PartitionId, i64>,
    announced: bool,
}

impl Readings {
    fn new(partitions: u32, count: i64) -> Self {
        Readings {
            count,
            next: (0..partitions).map(|p| (PartitionId(p), 0)).collect(),
            announced: false,
        }
    }
}

#[async_trait]
impl Source for Readings {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if !self.announced {
            self.announced = true;
            return Ok(SourceEvent::Assigned(self.next.keys().copied().collect()));
        }
        // No `.await` before returning: cancel safe by construction.
        let source = SourceId::new("sensors");
        for (partition, next) in &mut self.next {
            if *next < self.count {
                let end = (*next + 50).min(self.count);
                let records = (*next..end)
                    .map(|i| {
                        let position = Position::new(source.clone(), *partition, Offset(i));
                        Record::new(position, format!("sensor-{} reading {i}", partition.0))
                    })
                    .collect();
                *next = end;
                return Ok(SourceEvent::Batch(PollBatch::from_records(
                    *partition, records,
                )));
            }
        }
        Ok(SourceEvent::End)
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        match self.next.get_mut(&partition) {
            Some(next) => {
                *next = offset.0;
                Ok(())
            }
            None => Err(SourceError::custom(format!("no partition {partition}"))),
        }
    }
}

/// Keeps every written line; `Ok` from `write` means "stored", which here
/// is immediate.
#[derive(Debug, Default, Clone)]
struct MemorySink {
    lines: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl Sink for MemorySink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let text = String::from_utf8_lossy(batch.bytes());
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(text.lines().map(str::to_owned));
        Ok(())
    }
}

/// Build and run the pipeline; returns the lines the sink stored.
pub(crate) async fn run() -> Result<Vec<String>, etl::PipelineError> {
    let sink = MemorySink::default();
    let store = MemoryStore::new();
    let pipeline = Pipeline::builder()
        .source(Readings::new(3, 200))
        // Keep even readings only: the others are filtered on purpose.
        .transform(filter("even", |r: &Record| r.position.offset.0 % 2 == 0))
        .transform(map("shout", |mut r: Record| {
            r.value = r.value.to_ascii_uppercase().into();
            Ok(r)
        }))
        .sink(
            "memory",
            SinkDriver::new(sink.clone(), RawLinesEncoder::new()),
        )
        .offset_store(store.clone())
        .build()?;
    let summary = pipeline.run(CancellationToken::new()).await?;
    assert_eq!(summary.read, 600);
    assert_eq!(summary.filtered, 300);
    // Every partition committed past its last reading.
    assert!(store.offsets().values().all(|o| *o == Offset(200)));
    let lines = sink
        .lines
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Ok(lines)
}

#[tokio::main]
async fn main() -> Result<(), etl::PipelineError> {
    let lines = run().await?;
    println!("stored {} readings, e.g. {:?}", lines.len(), lines.first());
    Ok(())
}
