//! The transform stage: applies the transforms to each batch and fans the
//! result out to the sinks (every sink, or the ones the routes pick, each
//! after its branch's transforms), dead letters to the dead-letter sink.
//!
//! Every record leaves this stage with an explicit outcome. The batch's
//! handle is cloned once per sink that takes records of it (every sink
//! without routes) and per dead letter; it resolves *Delivered* only when
//! every one of them has written its copy, so a record routed to several
//! sinks is committed only once all of them hold it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use etl_ack::{AckRef, AckSet, Acked};
use etl_record::{DeadLetter, Record};
use etl_sink::{DeadLetterHandle, SinkSender};

use super::route::{Routed, Router};
use crate::transform::{ChainOutput, TransformChain};

/// Counters of the transform stage, shared with the metrics.
#[derive(Debug, Default)]
pub(crate) struct StageCounters {
    pub(crate) read: AtomicU64,
    pub(crate) filtered: AtomicU64,
    pub(crate) rejected: AtomicU64,
    /// Records no route took (and no unmatched sink received).
    pub(crate) unrouted: AtomicU64,
}

/// Where the stage sends its output.
#[derive(Debug)]
pub(crate) struct Outputs {
    pub(crate) sinks: Vec<SinkSender>,
    pub(crate) dead_letters: Option<Arc<DeadLetterHandle>>,
}

/// The work of the stage on a batch, wherever it runs (the stage's task
/// or a worker thread): the shared transforms, then the routes with each
/// sink's own steps.
#[derive(Debug, Default)]
pub(crate) struct Steps {
    pub(crate) chain: TransformChain,
    /// Which sinks each record goes to; `None`: every sink, unchanged.
    pub(crate) router: Option<Box<Router>>,
}

/// What [`Steps`] made of a batch.
#[derive(Debug, Default)]
pub(crate) struct StageOutput {
    /// The shared transforms' output; with routes, `kept` is empty (the
    /// records went to `routed`).
    pub(crate) out: ChainOutput,
    /// Where the routes sent the records kept.
    pub(crate) routed: Option<Routed>,
}

impl Steps {
    /// Whether there is nothing to run.
    pub(crate) fn is_empty(&self) -> bool {
        self.chain.is_empty() && self.router.is_none()
    }

    /// An independent copy for another worker, when every step can fork.
    pub(crate) fn fork(&self) -> Option<Steps> {
        let router = match &self.router {
            Some(router) => Some(Box::new(router.fork()?)),
            None => None,
        };
        Some(Steps {
            chain: self.chain.fork()?,
            router,
        })
    }

    /// Run a batch through the shared transforms and the routes.
    ///
    /// The routes' conditions are judged on the records the shared
    /// transforms' last stage kept, by that stage when it can (a fused
    /// run judging them while it writes each record, see
    /// [`Router::link`]).
    pub(crate) fn run(&mut self, records: Vec<Record>) -> StageOutput {
        let mut out = ChainOutput::default();
        if let Some(router) = &mut self.router {
            router.link(&mut self.chain);
        }
        self.chain.apply(records, &mut out);
        let routed = match &mut self.router {
            Some(router) => {
                router.take_verdicts(&mut self.chain);
                out.halted
                    .is_none()
                    .then(|| router.route(std::mem::take(&mut out.kept)))
            }
            None => None,
        };
        StageOutput { out, routed }
    }
}

/// Why the stage stopped early.
#[derive(Debug)]
pub(crate) enum StageStop {
    /// A sink driver is gone (it halted; its own error says why).
    SinkGone,
    /// A dead letter had nowhere to go.
    NoDeadLetterSink(DeadLetter),
    /// A transform worker went away without an answer.
    WorkerGone,
    /// A transform halted on a record.
    Halted(DeadLetter),
}

/// Runs one batch through the transforms and hands the result on.
#[derive(Debug)]
pub(crate) struct Stage {
    steps: Steps,
    outputs: Outputs,
    counters: Arc<StageCounters>,
}

impl Stage {
    /// `steps`: what the stage runs on its own task (nothing, when worker
    /// threads run them).
    pub(crate) fn new(steps: Steps, outputs: Outputs, counters: Arc<StageCounters>) -> Self {
        Stage {
            steps,
            outputs,
            counters,
        }
    }

    /// Process one batch of records with their handle.
    pub(crate) async fn batch(&mut self, batch: Acked<Vec<Record>>) -> Result<(), StageStop> {
        let (records, ack) = batch.into_parts();
        // A transform that panics, or this future dropped half-way, must
        // fail the batch: the bare handle would resolve *Delivered* and
        // commit records that never reached a sink.
        let in_hand = AckSet::from(vec![ack.clone()]);
        let result = self.process(records, ack).await;
        in_hand.deliver();
        result
    }

    async fn process(&mut self, records: Vec<Record>, ack: AckRef) -> Result<(), StageStop> {
        let read = records.len();
        let output = self.steps.run(records);
        self.deliver(read, output, ack).await
    }

    /// Hand on what the transforms made of a batch of `read` records:
    /// rejected records to the dead-letter sink, kept ones to every sink.
    pub(crate) async fn deliver(
        &mut self,
        read: usize,
        output: StageOutput,
        ack: AckRef,
    ) -> Result<(), StageStop> {
        let StageOutput { out, routed } = output;
        let ChainOutput {
            kept,
            rejected,
            filtered,
            halted,
        } = out;
        if let Some(letter) = halted {
            ack.fail();
            return Err(StageStop::Halted(letter));
        }
        self.counters.read.fetch_add(read as u64, Ordering::Relaxed);
        self.counters
            .filtered
            .fetch_add(filtered, Ordering::Relaxed);
        for letter in rejected {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            self.dead_letter(Acked::new(letter, ack.clone())).await?;
        }
        if let Some(routed) = routed {
            return self.route_out(routed, ack).await;
        }
        if kept.is_empty() {
            // Everything was filtered or dead-lettered: dropping `ack`
            // resolves this share of the batch as consumed.
            return Ok(());
        }
        self.fan_out(kept, ack).await
    }

    /// Hand on what the routes made of a batch: each sink its records
    /// (a sink that takes none holds no share of the batch's handle),
    /// what a condition or a branch set aside to the dead-letter sink.
    async fn route_out(&mut self, routed: Routed, ack: AckRef) -> Result<(), StageStop> {
        let Routed {
            to,
            rejected,
            filtered,
            unrouted,
            halted,
        } = routed;
        if let Some(letter) = halted {
            ack.fail();
            return Err(StageStop::Halted(letter));
        }
        self.counters
            .filtered
            .fetch_add(filtered, Ordering::Relaxed);
        self.counters
            .unrouted
            .fetch_add(unrouted, Ordering::Relaxed);
        for letter in rejected {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            self.dead_letter(Acked::new(letter, ack.clone())).await?;
        }
        for (sink, records) in self.outputs.sinks.iter().zip(to) {
            if records.is_empty() {
                continue;
            }
            if sink.send(Acked::new(records, ack.clone())).await.is_err() {
                ack.fail();
                return Err(StageStop::SinkGone);
            }
        }
        Ok(())
    }

    async fn fan_out(&mut self, kept: Vec<Record>, ack: AckRef) -> Result<(), StageStop> {
        let Some((last, others)) = self.outputs.sinks.split_last() else {
            // A pipeline is built with at least one sink.
            ack.fail();
            return Err(StageStop::SinkGone);
        };
        for sink in others {
            if sink
                .send(Acked::new(kept.clone(), ack.clone()))
                .await
                .is_err()
            {
                ack.fail();
                return Err(StageStop::SinkGone);
            }
        }
        if last.send(Acked::new(kept, ack.clone())).await.is_err() {
            ack.fail();
            return Err(StageStop::SinkGone);
        }
        Ok(())
    }

    /// Send a dead letter (from the source or a transform) to the
    /// dead-letter sink; without one, fail its batch and stop.
    pub(crate) async fn dead_letter(&mut self, letter: Acked<DeadLetter>) -> Result<(), StageStop> {
        // A sink that halted closed its input before it failed what it
        // held; a record that failed because of that is not poison, and
        // whatever comes now is part of a stopping pipeline: it fails and
        // is read again, never dead-lettered.
        if self.outputs.sinks.iter().any(SinkSender::is_closed) {
            letter.fail();
            return Err(StageStop::SinkGone);
        }
        match &self.outputs.dead_letters {
            Some(dlq) => dlq.send(letter).await.map_err(|_| StageStop::SinkGone),
            None => {
                let (letter, ack) = letter.into_parts();
                ack.fail();
                Err(StageStop::NoDeadLetterSink(letter))
            }
        }
    }
}
