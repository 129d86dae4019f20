//! A revocation whose `revoke_deadline` passes while the exactly-once sink
//! is still writing a batch of the revoked partition halts the run: the
//! partition is not handed over while that write can land. An
//! at-least-once sink, and a partition retired rather than handed over
//! (an input file replaced), are released at the deadline, as before.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use etl::{Pipeline, PipelineError};
use etl_checkpoint::{CheckpointConfig, CheckpointError, MemoryStore};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{
    EncodedBatch, Progress, ProgressSink, RawLinesEncoder, Sink, SinkDriver, SinkDriverConfig,
    SinkError,
};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};
use tokio_util::sync::CancellationToken;

const P: PartitionId = PartitionId(3);
const GUARD: Duration = Duration::from_secs(60);

/// A sink whose writes never end (a store that stopped answering), and
/// counts them.
#[derive(Debug, Clone, Default)]
struct Stuck {
    writes: Arc<AtomicUsize>,
}

#[async_trait]
impl Sink for Stuck {
    async fn write(&self, _batch: &EncodedBatch) -> Result<(), SinkError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
}

#[async_trait]
impl ProgressSink for Stuck {
    fn progress(&self) -> Progress {
        Progress::new()
    }
}

/// Assigns `P`, hands on one batch, and revokes `P` once the sink is
/// writing it; then ends.
struct RevokesWhileWriting {
    writes: Arc<AtomicUsize>,
    step: u32,
    /// The partition goes to another owner (a consumer group), rather
    /// than being retired (an input file replaced).
    hands_over: bool,
}

#[async_trait]
impl Source for RevokesWhileWriting {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        self.step += 1;
        Ok(match self.step {
            1 => SourceEvent::Assigned(vec![P]),
            2 => {
                let records = (0..10)
                    .map(|o| Record::new(Position::new(SourceId::new("s"), P, Offset(o)), "x"))
                    .collect();
                SourceEvent::Batch(PollBatch::from_records(P, records))
            }
            3 => {
                while self.writes.load(Ordering::SeqCst) == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                SourceEvent::Revoked(vec![P])
            }
            _ => SourceEvent::End,
        })
    }

    async fn seek(&mut self, _partition: PartitionId, _offset: Offset) -> Result<(), SourceError> {
        Ok(())
    }

    fn hands_over_revoked(&self) -> bool {
        self.hands_over
    }
}

fn checkpoint() -> CheckpointConfig {
    CheckpointConfig {
        revoke_deadline: Duration::from_millis(100),
        ..CheckpointConfig::default()
    }
}

/// No write timeout: only the halt can end the stuck write.
fn driver_config() -> SinkDriverConfig {
    SinkDriverConfig {
        linger: Duration::ZERO,
        write_timeout: None,
        ..SinkDriverConfig::default()
    }
}

#[tokio::test]
async fn a_revoke_deadline_passing_with_an_exactly_once_write_under_way_halts_the_run() {
    let sink = Stuck::default();
    let source = RevokesWhileWriting {
        writes: sink.writes.clone(),
        step: 0,
        hands_over: true,
    };
    let (driver, progress) = SinkDriver::exactly_once(sink.clone(), RawLinesEncoder::new());
    let pipeline = Pipeline::builder()
        .source(source)
        .exactly_once_sink("table", driver.config(driver_config()), progress)
        .offset_store(MemoryStore::new())
        .checkpoint(checkpoint())
        .build()
        .unwrap();
    let err = tokio::time::timeout(GUARD, pipeline.run(CancellationToken::new()))
        .await
        .expect("the halt tears the stuck write down")
        .unwrap_err();
    assert!(
        matches!(
            &err,
            PipelineError::Checkpoint(CheckpointError::RevokeUnsettled { partitions, .. })
                if partitions == &[P]
        ),
        "{err}"
    );
    assert_eq!(sink.writes.load(Ordering::SeqCst), 1);
}

/// The same stuck write under an at-least-once sink: the revocation
/// releases the partition at its deadline and the run goes on (here to
/// its end, whose graceful stop then gives the stuck sink up).
#[tokio::test]
async fn an_at_least_once_sink_s_write_under_way_does_not_halt_the_revocation() {
    let sink = Stuck::default();
    let source = RevokesWhileWriting {
        writes: sink.writes.clone(),
        step: 0,
        hands_over: true,
    };
    let pipeline = Pipeline::builder()
        .source(source)
        .sink(
            "table",
            SinkDriver::new(sink.clone(), RawLinesEncoder::new()).config(driver_config()),
        )
        .offset_store(MemoryStore::new())
        .checkpoint(CheckpointConfig {
            shutdown_timeout: Duration::from_secs(1),
            ..checkpoint()
        })
        .build()
        .unwrap();
    let err = tokio::time::timeout(GUARD, pipeline.run(CancellationToken::new()))
        .await
        .expect("the stop gives the stuck sink up")
        .unwrap_err();
    assert!(
        matches!(
            err,
            PipelineError::Sink {
                source: etl_sink::SinkDriverError::ShutdownTimeout(_),
                ..
            }
        ),
        "the revocation did not halt the run: {err}"
    );
}

/// A source that retires its revoked partition (a file source whose input
/// was replaced) rather than handing it over: nobody else will write it,
/// so the exactly-once sink's write is not fenced and the run goes on
/// past the deadline (here to its end, whose graceful stop then gives the
/// stuck sink up).
#[tokio::test]
async fn a_retired_partition_s_exactly_once_write_under_way_does_not_halt_the_revocation() {
    let sink = Stuck::default();
    let source = RevokesWhileWriting {
        writes: sink.writes.clone(),
        step: 0,
        hands_over: false,
    };
    let (driver, progress) = SinkDriver::exactly_once(sink.clone(), RawLinesEncoder::new());
    let pipeline = Pipeline::builder()
        .source(source)
        .exactly_once_sink("table", driver.config(driver_config()), progress)
        .offset_store(MemoryStore::new())
        .checkpoint(CheckpointConfig {
            shutdown_timeout: Duration::from_secs(1),
            ..checkpoint()
        })
        .build()
        .unwrap();
    let err = tokio::time::timeout(GUARD, pipeline.run(CancellationToken::new()))
        .await
        .expect("the stop gives the stuck sink up")
        .unwrap_err();
    assert!(
        matches!(
            err,
            PipelineError::Sink {
                source: etl_sink::SinkDriverError::ShutdownTimeout(_),
                ..
            }
        ),
        "the revocation did not halt the run: {err}"
    );
}
