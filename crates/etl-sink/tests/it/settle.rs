//! A stopped driver waits for its sink to settle: within the stop's
//! deadline when the deadline leaves room for it, for the sink's settle
//! time at most otherwise.

// Helpers outside `#[test]` functions unwrap too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use etl_sink::{EncodedBatch, NdjsonEncoder, Sink, SinkDriver, SinkDriverError, SinkError};
use etl_test_support::acks::AckedBatches;
use tokio::time::Instant;

/// Writes never end; settling takes `settle_takes` (forever when `None`)
/// and then marks `settled`.
#[derive(Debug)]
struct Settling {
    settle_takes: Option<Duration>,
    settled: Arc<AtomicBool>,
}

#[async_trait]
impl Sink for Settling {
    async fn write(&self, _batch: &EncodedBatch) -> Result<(), SinkError> {
        std::future::pending().await
    }

    fn settle_time(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn settle(&self) {
        match self.settle_takes {
            Some(takes) => tokio::time::sleep(takes).await,
            None => std::future::pending().await,
        }
        self.settled.store(true, Ordering::SeqCst);
    }
}

/// A driver of a [`Settling`] sink with one write under way.
async fn writing(settle_takes: Option<Duration>) -> (etl_sink::SinkHandle, Arc<AtomicBool>) {
    let settled = Arc::new(AtomicBool::new(false));
    let sink = SinkDriver::new(
        Settling {
            settle_takes,
            settled: settled.clone(),
        },
        NdjsonEncoder::new(),
    )
    .spawn();
    let mut source = AckedBatches::new();
    sink.send(source.batch(0, 0..10)).await.unwrap();
    sink.input_ended();
    tokio::time::sleep(Duration::from_millis(10)).await;
    (sink, settled)
}

#[tokio::test(start_paused = true)]
async fn a_stop_with_room_in_its_deadline_settles_the_sink_within_it() {
    let (sink, settled) = writing(None).await;
    let started = Instant::now();
    let err = sink.shutdown(Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, SinkDriverError::ShutdownTimeout(_)), "{err}");
    // The driver was aborted at 4 s, the settle given up at 5 s.
    assert_eq!(started.elapsed(), Duration::from_secs(5));
    assert!(!settled.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_stop_shorter_than_the_settle_time_still_waits_for_the_sink_to_settle() {
    let (sink, settled) = writing(Some(Duration::from_millis(600))).await;
    let started = Instant::now();
    let err = sink.shutdown(Duration::from_millis(100)).await.unwrap_err();
    assert!(matches!(err, SinkDriverError::ShutdownTimeout(_)), "{err}");
    assert!(settled.load(Ordering::SeqCst), "the stop did not wait");
    // Aborted at 50 ms, settled 600 ms later.
    assert_eq!(started.elapsed(), Duration::from_millis(650));
}

#[tokio::test(start_paused = true)]
async fn an_aborted_driver_waits_for_its_sink_to_settle_for_the_settle_time_at_most() {
    let (sink, settled) = writing(None).await;
    let started = Instant::now();
    sink.abort().await;
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert!(!settled.load(Ordering::SeqCst));
}

/// A stop without a deadline (`Duration::MAX`) is no overflow: the
/// driver closes and the sink settles.
#[tokio::test(start_paused = true)]
async fn a_stop_without_a_deadline_settles_the_sink_and_ends() {
    let settled = Arc::new(AtomicBool::new(false));
    let sink = SinkDriver::new(
        Settling {
            settle_takes: Some(Duration::from_millis(10)),
            settled: settled.clone(),
        },
        NdjsonEncoder::new(),
    )
    .spawn();
    sink.input_ended();
    sink.shutdown(Duration::MAX).await.unwrap();
    assert!(settled.load(Ordering::SeqCst));
}
