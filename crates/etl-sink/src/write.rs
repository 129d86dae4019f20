//! The life of one batch: write with retries, route failures, resolve.

use std::collections::BTreeSet;
use std::sync::Arc;

use etl_ack::AckSet;
use etl_record::DeadLetter;
use tokio::time::Instant;

use crate::dead_letter::dead_letter_batch;
use crate::metrics::{MetricsCell, add};
use crate::{DriverConfig, EncodedBatch, OnPermanentFailure, Sink, SinkError};

/// What every write of one driver shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) dead_letters: Option<Arc<dyn Sink>>,
    pub(crate) config: DriverConfig,
    pub(crate) metrics: Arc<MetricsCell>,
}

/// One batch on its way to the sink, with the handles it covers and the
/// records already refused by the encoder.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) batch: EncodedBatch,
    pub(crate) acks: AckSet,
    pub(crate) refused: Vec<DeadLetter>,
}

/// How a job ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    Delivered,
    Failed(String),
}

impl Shared {
    /// One write, retried by the policy, each attempt bounded by the
    /// configured timeout.
    async fn write_to(&self, sink: &dyn Sink, batch: &EncodedBatch) -> Result<(), SinkError> {
        let timeout = self.config.write_timeout;
        self.config
            .retry
            .run(
                || async move {
                    match timeout {
                        Some(limit) => tokio::time::timeout(limit, sink.write(batch))
                            .await
                            .unwrap_or(Err(SinkError::Timeout(limit))),
                        None => sink.write(batch).await,
                    }
                },
                |_| add(&self.metrics.retries, 1),
            )
            .await
    }

    /// Write dead letters durably; `Err` says why they are not.
    async fn write_dead_letters(&self, letters: Vec<DeadLetter>) -> Result<(), String> {
        let Some(sink) = &self.dead_letters else {
            return Err(format!(
                "{} record(s) need the dead-letter sink and there is none; first: {}",
                letters.len(),
                letters.first().map_or("", |l| l.reason.as_str())
            ));
        };
        let count = letters.len() as u64;
        let batch = dead_letter_batch(letters);
        match self.write_to(&**sink, &batch).await {
            Ok(()) => {
                add(&self.metrics.dead_lettered, count);
                Ok(())
            }
            Err(err) => Err(format!("dead-letter write failed: {err}")),
        }
    }
}

/// Run one job to its end. The handles are delivered only after every
/// record of the batch is durable in the sink or the dead-letter sink;
/// otherwise they fail. Dropping this future mid-way drops the set, which
/// fails it.
pub(crate) async fn run_job(shared: Arc<Shared>, job: Job) -> Outcome {
    let started = Instant::now();
    let Job {
        batch,
        acks,
        mut refused,
    } = job;
    let m = &shared.metrics;
    let written = if batch.is_empty() {
        Ok(())
    } else {
        shared.write_to(&*shared.sink, &batch).await
    };
    let failure = match written {
        Ok(()) => {
            add(&m.records_written, batch.len() as u64);
            add(&m.bytes_written, batch.bytes().len() as u64);
            add(&m.batches_written, 1);
            None
        }
        Err(SinkError::Rejected(rejects)) => {
            let indices: BTreeSet<usize> = rejects.iter().map(|r| r.index).collect();
            if let Some(bad) = indices.iter().find(|&&i| i >= batch.len()) {
                Some(format!(
                    "sink rejected record {bad} of a batch of {}",
                    batch.len()
                ))
            } else {
                let accepted_bytes: usize = (0..batch.len())
                    .filter(|i| !indices.contains(i))
                    .filter_map(|i| batch.range(i).map(|r| r.len()))
                    .sum();
                add(&m.records_written, (batch.len() - indices.len()) as u64);
                add(&m.bytes_written, accepted_bytes as u64);
                add(&m.batches_written, 1);
                for reject in rejects {
                    if let Some(record) = batch.records().get(reject.index) {
                        refused.push(DeadLetter::new(
                            record.clone(),
                            format!("rejected by the sink: {}", reject.reason),
                        ));
                    }
                }
                None
            }
        }
        Err(err) => match shared.config.on_permanent_failure {
            OnPermanentFailure::Fail => Some(err.to_string()),
            OnPermanentFailure::DeadLetter => {
                let reason = format!("sink write failed: {err}");
                for record in batch.into_records() {
                    refused.push(DeadLetter::new(record, reason.clone()));
                }
                None
            }
        },
    };
    let outcome = match failure {
        Some(reason) => Outcome::Failed(reason),
        None if refused.is_empty() => Outcome::Delivered,
        None => match shared.write_dead_letters(refused).await {
            Ok(()) => Outcome::Delivered,
            Err(reason) => Outcome::Failed(reason),
        },
    };
    m.record_latency(started.elapsed());
    match &outcome {
        Outcome::Delivered => acks.deliver(),
        Outcome::Failed(reason) => {
            tracing::warn!(%reason, batches = acks.len(), "sink batch failed; its partitions will replay");
            add(&m.batches_failed, 1);
            acks.fail();
        }
    }
    outcome
}
