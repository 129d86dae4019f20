//! A sink whose writes wait until a test opens the gate.

use async_trait::async_trait;
use tokio::sync::watch;

use crate::{EncodedBatch, Sink, SinkError};

/// Opens a [`Gated`] sink. Cloneable.
#[derive(Clone, Debug)]
pub struct Gate(std::sync::Arc<watch::Sender<bool>>);

impl Gate {
    /// Let every waiting and future write through.
    pub fn open(&self) {
        self.0.send_replace(true);
    }
}

/// Writes wait until its [`Gate`] opens, then go to the inner sink.
#[derive(Debug)]
pub struct Gated<S> {
    inner: S,
    open: watch::Receiver<bool>,
    gate: Gate,
}

impl<S> Gated<S> {
    /// Wrap `inner` behind a closed gate.
    pub fn new(inner: S) -> Self {
        let (tx, rx) = watch::channel(false);
        Gated {
            inner,
            open: rx,
            gate: Gate(std::sync::Arc::new(tx)),
        }
    }

    /// The gate that lets writes through.
    pub fn gate(&self) -> Gate {
        self.gate.clone()
    }

    /// The inner sink.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwrap the inner sink.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

#[async_trait]
impl<S: Sink> Sink for Gated<S> {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut open = self.open.clone();
        // The sender lives in `self.gate`, so waiting cannot fail.
        open.wait_for(|o| *o)
            .await
            .map_err(|_| SinkError::permanent("the gate was dropped"))?;
        self.inner.write(batch).await
    }

    fn settle_time(&self) -> std::time::Duration {
        self.inner.settle_time()
    }

    async fn settle(&self) {
        self.inner.settle().await;
    }

    async fn flush(&self) -> Result<(), SinkError> {
        self.inner.flush().await
    }
}
