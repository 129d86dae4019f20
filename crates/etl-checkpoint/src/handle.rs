//! Starting a checkpointer and talking to it: configuration, the spawn
//! function and the cloneable [`CheckpointHandle`].

use std::time::Duration;

use crossbeam_channel::Sender;
use etl_ack::AckReceiver;
use etl_record::{Offset, PartitionId};
use tokio::sync::{mpsc, oneshot, watch};

use crate::CheckpointError;
use crate::budget::{InFlightBudget, InFlightLimits};
use crate::halt::Halt;
use crate::metrics::{CheckpointMetrics, PublishedMetrics};
use crate::store::{OffsetStore, PartitionOffsets};
use crate::sync::{Arc, Mutex, lock};
use crate::tracker::ReplayRequest;
use crate::worker::Worker;

/// Configuration of a checkpointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// How often moved watermarks are committed.
    pub commit_interval: Duration,
    /// How long a revoke waits for in-flight batches of the revoked
    /// partitions; keep it below a consumer group's session timeout.
    pub revoke_deadline: Duration,
    /// How long a graceful stop may take: shutdown waits this long at
    /// most for in-flight batches before the final commit, and the `etl`
    /// pipeline bounds its whole stop by it (`shutdown_timeout` in a
    /// configuration file's `[checkpoint]`).
    pub shutdown_timeout: Duration,
    /// In-flight bounds.
    pub limits: InFlightLimits,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            commit_interval: Duration::from_secs(1),
            revoke_deadline: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(30),
            limits: InFlightLimits::default(),
        }
    }
}

/// A partition's assignment: its fresh epoch and where to start reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assigned {
    /// The partition.
    pub partition: PartitionId,
    /// Its new epoch: every batch of this assignment carries it.
    pub epoch: u32,
    /// Seek here.
    pub start: Offset,
}

/// How a checkpointer ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckpointSummary {
    /// Committed offsets of the partitions assigned at shutdown.
    pub committed: PartitionOffsets,
    /// Whether batches were still unresolved when the deadline passed.
    pub timed_out: bool,
    /// Metrics at the end.
    pub metrics: CheckpointMetrics,
}

/// Replay requests for the source side.
pub type ReplayRequests = mpsc::UnboundedReceiver<ReplayRequest>;

pub(crate) type Reply<T> = oneshot::Sender<Result<T, CheckpointError>>;

/// A request to the checkpointer thread.
pub(crate) enum Control {
    Assign(Vec<(PartitionId, Option<Offset>)>, Reply<Vec<Assigned>>),
    /// The partitions, whether they go to another owner (then their
    /// epochs close on the write fence), and whom to answer.
    Revoke(Vec<PartitionId>, bool, Reply<PartitionOffsets>),
    Commit(Reply<PartitionOffsets>),
    Shutdown(Reply<CheckpointSummary>),
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Control::Assign(..) => "Assign",
            Control::Revoke(..) => "Revoke",
            Control::Commit(..) => "Commit",
            Control::Shutdown(..) => "Shutdown",
        })
    }
}

/// Starts checkpointers.
#[derive(Debug)]
pub struct Checkpointer;

impl Checkpointer {
    /// Start a checkpointer thread owning `store` and draining `acks`.
    ///
    /// # Errors
    ///
    /// The thread could not be started.
    pub fn spawn(
        config: CheckpointConfig,
        store: Box<dyn OffsetStore>,
        acks: AckReceiver,
    ) -> Result<(CheckpointHandle, ReplayRequests), CheckpointError> {
        let (control_tx, control_rx) = crossbeam_channel::unbounded();
        let (replay_tx, replay_rx) = mpsc::unbounded_channel();
        let budget = InFlightBudget::new(config.limits);
        let metrics = Arc::new(Mutex::new(PublishedMetrics::default()));
        let worker = Worker::new(
            config,
            store,
            acks,
            control_rx,
            replay_tx,
            budget.clone(),
            metrics.clone(),
        );
        let lost = worker.lost_tx.subscribe();
        let unsettled = worker.unsettled_tx.subscribe();
        let halt = worker.halting.shared();
        // The thread logs where the thread that started it logs: to its
        // scoped subscriber if it has one (a test's, an application's
        // per-pipeline one), else to the global one. With neither yet,
        // it takes none of its own, so a global subscriber installed
        // later still gets its lines.
        let dispatch = tracing::dispatcher::get_default(|current| {
            (!current.is::<tracing::subscriber::NoSubscriber>()).then(|| current.clone())
        });
        std::thread::Builder::new()
            .name("etl-checkpointer".to_owned())
            .spawn(move || match dispatch {
                Some(dispatch) => tracing::dispatcher::with_default(&dispatch, || worker.run()),
                None => worker.run(),
            })
            .map_err(CheckpointError::Spawn)?;
        Ok((
            CheckpointHandle {
                control: control_tx,
                budget,
                metrics,
                lost,
                halt,
                unsettled,
            },
            replay_rx,
        ))
    }
}

/// Talks to a running checkpointer. Clones talk to the same one; when the
/// last clone drops, the checkpointer commits what was delivered and stops.
#[derive(Clone, Debug)]
pub struct CheckpointHandle {
    control: Sender<Control>,
    budget: InFlightBudget,
    metrics: Arc<Mutex<PublishedMetrics>>,
    /// Whether the store is lost.
    lost: watch::Receiver<bool>,
    /// Whether the run halts.
    halt: Arc<Halt>,
    /// The partitions whose revocation halted the run, and its deadline.
    unsettled: watch::Receiver<Option<(Vec<PartitionId>, Duration)>>,
}

// Compile-time check: a handle is shared by the source driver, the sink
// drivers and the runtime's tasks, so it must move and be shared between
// threads.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CheckpointHandle>();
};

type Pending<T> = oneshot::Receiver<Result<T, CheckpointError>>;

impl CheckpointHandle {
    fn request<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Control,
    ) -> Result<Pending<T>, CheckpointError> {
        let (tx, rx) = oneshot::channel();
        self.control
            .send(make(tx))
            .map_err(|_| CheckpointError::Stopped)?;
        Ok(rx)
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Control) -> Result<T, CheckpointError> {
        self.request(make)?
            .await
            .map_err(|_| CheckpointError::Stopped)?
    }

    fn call_blocking<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Control,
    ) -> Result<T, CheckpointError> {
        self.request(make)?
            .blocking_recv()
            .map_err(|_| CheckpointError::Stopped)?
    }

    /// Start tracking partitions, each with fresh state and a fresh epoch
    /// (epochs only grow per partition for the checkpointer's lifetime).
    /// `Some(start)` overrides the store (a sink that keeps its own
    /// progress); `None` starts at the committed offset, or 0. Assigning a
    /// partition that is already assigned ends its current epoch first.
    ///
    /// # Errors
    ///
    /// The store could not be read, or the checkpointer stopped.
    pub async fn assign(
        &self,
        partitions: Vec<(PartitionId, Option<Offset>)>,
    ) -> Result<Vec<Assigned>, CheckpointError> {
        self.call(|r| Control::Assign(partitions, r)).await
    }

    /// As [`assign`](Self::assign), blocking the calling thread (for
    /// callbacks outside async code, such as a rebalance callback). Must
    /// not be called from inside an async runtime.
    ///
    /// # Errors
    ///
    /// As [`assign`](Self::assign).
    pub fn assign_blocking(
        &self,
        partitions: Vec<(PartitionId, Option<Offset>)>,
    ) -> Result<Vec<Assigned>, CheckpointError> {
        self.call_blocking(|r| Control::Assign(partitions, r))
    }

    /// End the partitions' epochs: wait until their in-flight batches
    /// resolve (or the revoke deadline passes), commit their watermarks,
    /// drop their state. Returns the committed offset of every revoked
    /// partition that has one. Other partitions are untouched; partitions
    /// not assigned are ignored.
    ///
    /// A revocation that hands nothing to another owner (an input file
    /// retired) keeps the partitions' epochs open: what the sinks hold of
    /// them is still written. For partitions that go to another owner,
    /// use [`hand_over`](Self::hand_over). Either kind, at its deadline,
    /// waits for an exactly-once write of a partition whose epoch another
    /// revocation closed, as `hand_over` does.
    ///
    /// # Errors
    ///
    /// The commit failed (the partitions are dropped all the same; their
    /// previous commit stands), the revocation halted the run
    /// ([`CheckpointError::RevokeUnsettled`]), or the checkpointer
    /// stopped.
    pub async fn revoke(
        &self,
        partitions: Vec<PartitionId>,
    ) -> Result<PartitionOffsets, CheckpointError> {
        self.call(|r| Control::Revoke(partitions, false, r)).await
    }

    /// [`revoke`](Self::revoke) partitions that go to another owner (a
    /// consumer group's rebalance). As the revocation begins, their epochs
    /// close on the acknowledgement channel's
    /// [`WriteFence`](etl_ack::WriteFence): an exactly-once sink starts
    /// no write of their batches from then on (a queued batch or a retry
    /// fails instead, and is not replayed: the next owner reads it from
    /// the sink's stored progress). A write already under way goes on,
    /// and the revocation waits for it. If the deadline passes while one
    /// is still under way, the run halts ([`halt`](Self::halt),
    /// [`revoke_halted`](Self::revoke_halted)) and the revocation waits
    /// on until that write ended (the halt tears it down), then answers
    /// [`CheckpointError::RevokeUnsettled`]: the partitions are never
    /// handed over while the write can land. Batches of a sink that
    /// fences nothing (an at-least-once sink) are released at the
    /// deadline, as before.
    ///
    /// # Errors
    ///
    /// As [`revoke`](Self::revoke).
    pub async fn hand_over(
        &self,
        partitions: Vec<PartitionId>,
    ) -> Result<PartitionOffsets, CheckpointError> {
        self.call(|r| Control::Revoke(partitions, true, r)).await
    }

    /// As [`hand_over`](Self::hand_over), blocking the calling thread (a
    /// rebalance callback). Must not be called from inside an async
    /// runtime.
    ///
    /// # Errors
    ///
    /// As [`revoke`](Self::revoke).
    pub fn hand_over_blocking(
        &self,
        partitions: Vec<PartitionId>,
    ) -> Result<PartitionOffsets, CheckpointError> {
        self.call_blocking(|r| Control::Revoke(partitions, true, r))
    }

    /// As [`revoke`](Self::revoke), blocking the calling thread. Must not
    /// be called from inside an async runtime.
    ///
    /// # Errors
    ///
    /// As [`revoke`](Self::revoke).
    pub fn revoke_blocking(
        &self,
        partitions: Vec<PartitionId>,
    ) -> Result<PartitionOffsets, CheckpointError> {
        self.call_blocking(|r| Control::Revoke(partitions, false, r))
    }

    /// Commit every watermark that moved since its last commit; returns
    /// what was committed.
    ///
    /// # Errors
    ///
    /// The commit failed (nothing advanced), or the checkpointer stopped.
    pub async fn commit(&self) -> Result<PartitionOffsets, CheckpointError> {
        self.call(Control::Commit).await
    }

    /// Wait for in-flight batches (up to the shutdown deadline), make a
    /// final commit and stop the thread.
    ///
    /// # Errors
    ///
    /// The final commit failed, or the checkpointer had stopped.
    pub async fn shutdown(&self) -> Result<CheckpointSummary, CheckpointError> {
        self.call(Control::Shutdown).await
    }

    /// A snapshot of the metrics. It is refreshed after every control
    /// message and a few times a second while acknowledgements flow.
    #[must_use]
    pub fn metrics(&self) -> CheckpointMetrics {
        lock(&self.metrics).to_metrics()
    }

    /// Read the published metrics in place: `f` sees them under their
    /// lock, so a figure summed over many partitions needs no copy of
    /// them all. Keep `f` short: the checkpointer waits for it to
    /// publish.
    pub fn with_metrics<R>(&self, f: impl FnOnce(&PublishedMetrics) -> R) -> R {
        f(&lock(&self.metrics))
    }

    /// Resolves once the store is lost: a commit failed with an I/O error
    /// ([`CheckpointError::Io`]: a failed write or fsync of a local
    /// store), after which every commit fails too, so the run should stop
    /// (its final commit then fails with that error). Never resolves
    /// otherwise.
    pub async fn store_lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|lost| *lost).await.is_err() {
            // The checkpointer ended with its store intact.
            std::future::pending::<()>().await;
        }
    }

    /// Record that the run halts: a part stopped with an error the run
    /// ends on (a sink that cannot write, a source that failed), so
    /// nothing will serve a replay. From now on a failed batch still pins
    /// its partition's watermark, so nothing past it is committed, but
    /// asks for no replay; the checkpointer logs once per partition that
    /// it is not replayed (the next run reads it again from its last
    /// commit). Failures it took before the call replay as usual.
    ///
    /// The halting part MUST call it before anything it holds fails: the
    /// checkpointer sees a failure only after its handle failed, so every
    /// failure the halt causes then finds the halt recorded. Calling it
    /// again changes nothing; there is no way back.
    pub fn halt(&self) {
        self.halt.record();
    }

    /// Halt on the first failed batch (`on_failure = "halt"`): its replay
    /// request is still sent, for whoever refuses it to report the
    /// failure, but the checkpointer records the halt
    /// ([`halt`](Self::halt)) before it sends it and logs the failure as
    /// halting the run, not as a replay; later failures ask for no
    /// replay. Call it before the first batch opens.
    pub fn halt_on_failure(&self) {
        self.halt.on_failure();
    }

    /// Resolves once a revocation halted the run: its deadline passed with
    /// an exactly-once write of a revoked partition still under way (see
    /// [`revoke`](Self::revoke)). Never resolves otherwise. The run should
    /// stop at once, tearing its sinks down rather than draining them, so
    /// that the write ends and the revocation can answer.
    pub async fn revoke_halted(&self) {
        let mut unsettled = self.unsettled.clone();
        if unsettled.wait_for(Option::is_some).await.is_err() {
            // The checkpointer ended with no revocation halting the run.
            std::future::pending::<()>().await;
        }
    }

    /// The error of a revocation that halted the run
    /// ([`CheckpointError::RevokeUnsettled`]), if one did.
    #[must_use]
    pub fn revoke_halt(&self) -> Option<CheckpointError> {
        self.unsettled
            .borrow()
            .as_ref()
            .map(|(partitions, deadline)| CheckpointError::RevokeUnsettled {
                partitions: partitions.clone(),
                deadline: *deadline,
            })
    }

    /// Whether [`halt`](Self::halt) was called (by any clone).
    #[must_use]
    pub fn is_halting(&self) -> bool {
        self.halt.is_recorded()
    }

    /// Resolves once [`halt`](Self::halt) is called (by any clone); never
    /// otherwise.
    pub async fn halting(&self) {
        let mut halting = self.halt.subscribe();
        if halting.wait_for(|halting| *halting).await.is_err() {
            // Unreachable while this handle holds the sender; wait for
            // ever rather than report a halt that never came.
            std::future::pending::<()>().await;
        }
    }

    /// The in-flight budget the source side reserves credit from.
    #[must_use]
    pub fn budget(&self) -> InFlightBudget {
        self.budget.clone()
    }
}
