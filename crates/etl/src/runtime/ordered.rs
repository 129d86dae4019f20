//! The transform stage on threads of its own: whole batches run on a
//! small pool of worker threads (the first with the transforms
//! themselves, each other one with a fork of them), and a second loop
//! hands the results on strictly in the order the batches came (a bounded
//! FIFO of pending results), so every sink still sees each partition in
//! order. A CPU-bound stage is kept off the async runtime's workers: tokio
//! runs a task woken from a worker next on that same worker, where no
//! other worker may take it, so the tasks the stage wakes would wait for
//! it.
//!
//! Invariant: from the moment a batch leaves the source channel until its
//! result is handed to the sinks, a guard ([`InHand`]) holds a clone of
//! its handle and fails it if the batch is dropped on the way (a stop, a
//! panic). A stage that stops ends the run, and nothing replays after it:
//! the guard records the halt before the handle it holds can fail, so the
//! checkpointer takes none of those failures for one to replay.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::thread;

use etl_ack::{AckRef, Acked};
use etl_record::{DeadLetter, Record};
use etl_source::SourceOutput;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::fanout::{Stage, StageOutput, StageStop, Steps};

/// What a worker answers: the batch's output, or the panic of a transform.
type Answer = thread::Result<StageOutput>;

/// Records the run's halt with the checkpointer
/// ([`CheckpointHandle::halt`](etl_checkpoint::CheckpointHandle::halt)).
pub(crate) type OnStop = Arc<dyn Fn() + Send + Sync>;

/// The end of the source's input, passed on to the sinks in order: only
/// once every output the source sent before announcing it has been handed
/// to the sinks. Told earlier, a sink would write its partial batch at
/// once and the last records read, still in the stage, in a write of
/// their own.
pub(crate) struct InputEnd {
    /// Turns `true` once the source driver has read all its input (after
    /// its last output is in the channel).
    ended: watch::Receiver<bool>,
    /// Tells the sinks; `None` once taken, or once no announcement can
    /// come.
    tell: Option<Tell>,
}

impl InputEnd {
    /// Watch `ended`; call `tell` once, when the end is to be passed on.
    pub(crate) fn new(ended: watch::Receiver<bool>, tell: impl FnOnce() + Send + 'static) -> Self {
        InputEnd {
            ended,
            tell: Some(Box::new(tell)),
        }
    }

    /// Once the end is announced and `input` holds nothing sent before
    /// it, what tells the sinks (once): the source sends its last output
    /// before it announces the end, so every output of the input is then
    /// taken. Checked at the top of each turn, never by waiting for the
    /// watch once it says `true` (that wait would be ready at once, turn
    /// after turn).
    fn reached(&mut self, input: &mpsc::Receiver<SourceOutput>) -> Option<Tell> {
        if *self.ended.borrow() && input.is_empty() {
            self.tell.take()
        } else {
            None
        }
    }

    /// Whether [`changed`](Self::changed) is worth awaiting: the end is
    /// still to come.
    fn awaited(&self) -> bool {
        self.tell.is_some() && !*self.ended.borrow()
    }

    /// Ready when the announcement changes; a watch whose sender is gone
    /// can announce nothing more.
    async fn changed(&mut self) {
        if self.ended.changed().await.is_err() {
            self.tell = None;
        }
    }
}

/// Tells the sinks the source's input ended.
type Tell = Box<dyn FnOnce() + Send>;

/// A clone of the handle of an output the stage works on. Given back
/// with [`done`](Self::done) once the output is handed on; dropped before
/// that (the stage stopped, a transform panicked, the task was torn
/// down), it records the run's halt and only then fails the batch.
struct InHand {
    held: Option<AckRef>,
    on_stop: OnStop,
}

impl InHand {
    fn new(ack: &AckRef, on_stop: &OnStop) -> Self {
        InHand {
            held: Some(ack.clone()),
            on_stop: on_stop.clone(),
        }
    }

    /// The output was handed on: let go of the clone, failing nothing.
    fn done(mut self) {
        drop(self.held.take());
    }
}

impl Drop for InHand {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            // First the word, then the failure: the checkpointer reads
            // the halt after it took the failure from its channel.
            (self.on_stop)();
            held.fail();
        }
    }
}

impl std::fmt::Debug for InHand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InHand")
            .field("held", &self.held.is_some())
            .finish_non_exhaustive()
    }
}

struct Job {
    records: Vec<Record>,
    reply: oneshot::Sender<Answer>,
}

/// Worker threads running copies of the transform chain.
#[derive(Debug)]
pub(crate) struct Workers {
    jobs: std_mpsc::Sender<Job>,
    count: usize,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("records", &self.records.len())
            .finish_non_exhaustive()
    }
}

impl Workers {
    /// Up to `count` worker threads: the first runs `chain` (the steps)
    /// itself, each other one a fork of it. One thread when a step cannot
    /// fork, fewer when a thread cannot start. The steps come back, to run
    /// on the stage's own task, when there are none (nothing to do),
    /// `count` is 0 or no thread starts.
    pub(crate) fn spawn(chain: Steps, count: usize) -> Result<Workers, Steps> {
        if count == 0 || chain.is_empty() {
            return Err(chain);
        }
        // All the forks or none: a chain with one stage that cannot fork
        // runs on one thread.
        let forks = (1..count)
            .map(|_| chain.fork())
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        let (jobs, rx) = std_mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        // Transforms run inside the runtime the pipeline runs on, as they
        // did on its task.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let mut started = 0;
        for (i, chain) in std::iter::once(chain).chain(forks).enumerate() {
            // The thread takes its chain from here; when it cannot start,
            // the chain is still here to take back.
            let slot = Arc::new(Mutex::new(Some(chain)));
            let spawned = thread::Builder::new()
                .name(format!("etl-transform-{i}"))
                .spawn({
                    let (rx, slot, runtime) = (rx.clone(), slot.clone(), runtime.clone());
                    move || {
                        let _inside = runtime.as_ref().map(tokio::runtime::Handle::enter);
                        if let Some(chain) = take(&slot) {
                            work(chain, &rx);
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, started, "cannot start a transform worker: running on fewer");
                // No thread took the chain: it runs on the stage's task.
                // (Were it gone, no thread would answer, and every batch
                // would fail rather than pass untransformed.)
                if started == 0
                    && let Some(chain) = take(&slot)
                {
                    return Err(chain);
                }
                break;
            }
            started += 1;
        }
        Ok(Workers {
            jobs,
            count: started,
        })
    }

    /// Number of worker threads.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Queue a batch; its answer comes on the returned receiver (which
    /// reports an error if the workers are gone).
    fn submit(&self, records: Vec<Record>) -> oneshot::Receiver<Answer> {
        let (reply, answer) = oneshot::channel();
        // A send error drops the job with its reply sender: the receiver
        // then reports the workers gone.
        let _ = self.jobs.send(Job { records, reply });
        answer
    }
}

/// What `slot` holds, taken out of it.
fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
}

/// A worker's loop: runs until the job queue closes.
fn work(mut steps: Steps, jobs: &Mutex<std_mpsc::Receiver<Job>>) {
    loop {
        let job = {
            let rx = jobs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            rx.recv()
        };
        let Ok(Job { records, reply }) = job else {
            return;
        };
        // The stage stopped (its guard failed the batch): the records are
        // read again, so they are not transformed here.
        if reply.is_closed() {
            continue;
        }
        let answer = catch_unwind(AssertUnwindSafe(|| steps.run(records)));
        // The stage may have stopped; its guard fails the batch.
        let _ = reply.send(answer);
    }
}

/// One source output on its way through the workers, in arrival order.
enum Pending {
    Batch {
        read: usize,
        answer: oneshot::Receiver<Answer>,
        ack: AckRef,
        in_hand: InHand,
    },
    Letter {
        letter: Acked<DeadLetter>,
        in_hand: InHand,
    },
    /// The source's input ended after the outputs ahead of this.
    End(Tell),
}

/// Run the stage until the source channel closes or the stage stops:
/// batches go to `workers`, and their results go to the sinks in order.
/// A transform's panic is resumed on this task, as if it ran here. A stop
/// or a panic calls `on_stop` before anything held fails.
pub(crate) async fn run_parallel(
    mut stage: Stage,
    workers: Workers,
    mut input: mpsc::Receiver<SourceOutput>,
    mut end: InputEnd,
    cancel: CancellationToken,
    on_stop: OnStop,
) -> Result<(), StageStop> {
    let (fifo_tx, mut fifo_rx) = mpsc::channel::<Pending>(workers.count() * 2);
    let stopped = CancellationToken::new();

    let dispatch = async {
        // Owned here, so the queue and the workers close when this ends.
        let (fifo_tx, workers) = (fifo_tx, workers);
        loop {
            if let Some(tell) = end.reached(&input)
                && fifo_tx.send(Pending::End(tell)).await.is_err()
            {
                break;
            }
            let output = tokio::select! {
                biased;
                () = stopped.cancelled() => break,
                output = input.recv() => match output {
                    Some(output) => output,
                    None => return,
                },
                () = end.changed(), if end.awaited() => continue,
            };
            let pending = match output {
                SourceOutput::Batch(batch) => {
                    let (records, ack) = batch.into_parts();
                    let in_hand = InHand::new(&ack, &on_stop);
                    Pending::Batch {
                        read: records.len(),
                        answer: workers.submit(records),
                        ack,
                        in_hand,
                    }
                }
                SourceOutput::DeadLetter(letter) => Pending::Letter {
                    in_hand: InHand::new(letter.ack(), &on_stop),
                    letter,
                },
            };
            // An error means the stage stopped: the guard fails the batch.
            if fifo_tx.send(pending).await.is_err() {
                break;
            }
        }
        // Fail what is still queued: it never reached a sink.
        input.close();
        while let Ok(output) = input.try_recv() {
            output.fail();
        }
    };

    let deliver = async {
        while let Some(pending) = fifo_rx.recv().await {
            let result = match pending {
                Pending::Batch {
                    read,
                    answer,
                    ack,
                    in_hand,
                } => match answer.await {
                    Ok(Ok(out)) => stage.deliver(read, out, ack).await.map(|()| in_hand),
                    Ok(Err(panic)) => {
                        drop(in_hand);
                        std::panic::resume_unwind(panic)
                    }
                    Err(_) => Err(StageStop::WorkerGone),
                },
                Pending::Letter { letter, in_hand } => {
                    stage.dead_letter(letter).await.map(|()| in_hand)
                }
                Pending::End(tell) => {
                    tell();
                    continue;
                }
            };
            match result {
                Ok(in_hand) => in_hand.done(),
                Err(stop) => {
                    // The erring output's guard is gone (it recorded the
                    // halt); the rest fail after it too.
                    on_stop();
                    cancel.cancel();
                    stopped.cancel();
                    // Dropping the rest fails it (its guards).
                    fifo_rx.close();
                    while fifo_rx.try_recv().is_ok() {}
                    return Err(stop);
                }
            }
        }
        Ok(())
    };

    let ((), result) = tokio::join!(dispatch, deliver);
    result
}

/// The serial stage: every batch on this task, one after another. A stop
/// or a panic calls `on_stop` before anything held fails.
pub(crate) async fn run_serial(
    mut stage: Stage,
    mut input: mpsc::Receiver<SourceOutput>,
    mut end: InputEnd,
    cancel: CancellationToken,
    on_stop: OnStop,
) -> Result<(), StageStop> {
    loop {
        if let Some(tell) = end.reached(&input) {
            tell();
        }
        let output = tokio::select! {
            biased;
            output = input.recv() => match output {
                Some(output) => output,
                None => break,
            },
            () = end.changed(), if end.awaited() => continue,
        };
        let (result, in_hand) = match output {
            SourceOutput::Batch(batch) => {
                let in_hand = InHand::new(batch.ack(), &on_stop);
                (stage.batch(batch).await, in_hand)
            }
            SourceOutput::DeadLetter(letter) => {
                let in_hand = InHand::new(letter.ack(), &on_stop);
                (stage.dead_letter(letter).await, in_hand)
            }
        };
        match result {
            Ok(()) => in_hand.done(),
            Err(stop) => {
                // The guard records the halt before the batch fails, and
                // before the source driver stops and fails its own.
                drop(in_hand);
                cancel.cancel();
                // Fail what is still queued: it never reached a sink.
                input.close();
                while let Ok(o) = input.try_recv() {
                    o.fail();
                }
                return Err(stop);
            }
        }
    }
    Ok(())
}
