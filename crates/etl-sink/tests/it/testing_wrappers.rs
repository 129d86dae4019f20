//! The fault-injecting wrappers of `etl_sink::testing` are sinks in their
//! own right: what a wrapped sink does besides writing (its flush, how
//! long it settles and the settling itself) reaches it through each of
//! them, so a sink under test stops as it would unwrapped.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use etl_sink::testing::{
    FailEveryNth, FailWhere, Flaky, Gated, MemorySink, Panic, Recording, Rejecting, Slow,
};
use etl_sink::{EncodedBatch, Sink, SinkError};

/// Counts its flushes, settles in 7 s and says when it settled.
#[derive(Debug, Clone, Default)]
struct Settles {
    flushed: Arc<AtomicU64>,
    settled: Arc<AtomicBool>,
}

#[async_trait]
impl Sink for Settles {
    async fn write(&self, _batch: &EncodedBatch) -> Result<(), SinkError> {
        Ok(())
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.flushed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn settle_time(&self) -> Duration {
        Duration::from_secs(7)
    }

    async fn settle(&self) {
        self.settled.store(true, Ordering::SeqCst);
    }
}

/// Checks that `wrapped` (holding `inner`) forwards flush, settle time
/// and settle.
async fn forwards(name: &str, wrapped: impl Sink, inner: Settles) {
    assert_eq!(
        wrapped.settle_time(),
        Duration::from_secs(7),
        "{name} hides its sink's settle time"
    );
    wrapped.settle().await;
    assert!(
        inner.settled.load(Ordering::SeqCst),
        "{name} does not settle its sink"
    );
    wrapped.flush().await.unwrap();
    assert_eq!(
        inner.flushed.load(Ordering::SeqCst),
        1,
        "{name} does not flush its sink"
    );
}

#[tokio::test]
async fn every_testing_wrapper_forwards_flush_and_settle_to_its_sink() {
    let s = Settles::default();
    forwards("FailEveryNth", FailEveryNth::transient(s.clone(), 2), s).await;
    let s = Settles::default();
    forwards("Flaky", Flaky::new(s.clone(), 0.5, 1), s).await;
    let s = Settles::default();
    forwards("Panic", Panic::new(s.clone(), 2), s).await;
    let s = Settles::default();
    forwards("Slow", Slow::new(s.clone(), Duration::from_millis(1)), s).await;
    let s = Settles::default();
    forwards("Rejecting", Rejecting::new(s.clone(), |_| None), s).await;
    let s = Settles::default();
    forwards("FailWhere", FailWhere::new(s.clone(), |_| false), s).await;
    let s = Settles::default();
    forwards("Gated", Gated::new(s.clone()), s).await;
    let s = Settles::default();
    forwards("Recording", Recording::new(s.clone()), s).await;
    // The in-memory sink has nothing in the background.
    assert_eq!(MemorySink::new().settle_time(), Duration::ZERO);
}
