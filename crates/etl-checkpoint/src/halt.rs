//! The halt of a run, as the checkpointer sees it.
//!
//! A run that halts (a sink that cannot write, a lost offset store, a
//! source that stopped on an error) replays nothing: nobody is left to
//! serve a replay, and the next run reads again from the last commit. A
//! batch that fails then still pins its partition's watermark, so
//! nothing past it is committed, but asks for no replay.
//!
//! Invariant: the part that halts records the halt
//! ([`CheckpointHandle::halt`](crate::CheckpointHandle::halt)) before
//! anything it holds fails. A failure reaches the checkpointer only
//! through the acknowledgement channel, after its handle failed, and the
//! checkpointer reads the flag after it took the failure from that
//! channel: so every failure the halt caused finds the halt recorded (a
//! failure that came before the halt still replays). No log filter
//! guesses which failures the halt caused.

use std::collections::HashSet;

use etl_record::PartitionId;
use tokio::sync::watch;

use crate::sync::{Arc, AtomicBool, Ordering};
use crate::tracker::ReplayRequest;

/// Whether the run halts, shared by the checkpointer and its handles.
pub(crate) struct Halt {
    recorded: AtomicBool,
    /// `on_failure = "halt"`: the first failed batch records the halt.
    on_failure: AtomicBool,
    /// Wakes those waiting for the halt (the pipeline's run loop).
    told: watch::Sender<bool>,
}

impl std::fmt::Debug for Halt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Halt")
            .field("recorded", &self.is_recorded())
            .finish()
    }
}

impl Halt {
    pub(crate) fn new() -> Self {
        Halt {
            recorded: AtomicBool::new(false),
            on_failure: AtomicBool::new(false),
            told: watch::Sender::new(false),
        }
    }

    /// Record the halt (once; later calls change nothing).
    pub(crate) fn record(&self) {
        // Release: whatever the halting part did before, the failures it
        // causes next included, comes after the flag for anyone who reads
        // it with acquire.
        if !self.recorded.swap(true, Ordering::AcqRel) {
            self.told.send_replace(true);
        }
    }

    pub(crate) fn is_recorded(&self) -> bool {
        self.recorded.load(Ordering::Acquire)
    }

    /// From now on the first failed batch records the halt.
    pub(crate) fn on_failure(&self) {
        self.on_failure.store(true, Ordering::Release);
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<bool> {
        self.told.subscribe()
    }
}

/// The checkpointer thread's side of the halt: the flag, and the
/// partitions it already said it does not replay.
pub(crate) struct Halting {
    halt: Arc<Halt>,
    not_replayed: HashSet<PartitionId>,
}

impl Halting {
    pub(crate) fn new(halt: Arc<Halt>) -> Self {
        Halting {
            halt,
            not_replayed: HashSet::new(),
        }
    }

    /// The flag, for the handles.
    pub(crate) fn shared(&self) -> Arc<Halt> {
        self.halt.clone()
    }

    /// Record the halt from the checkpointer's side (a revocation that
    /// cannot hand its partitions over).
    pub(crate) fn record(&self) {
        self.halt.record();
    }

    /// What becomes of `replay`. The first one of each partition that is
    /// not replayed is logged: where its next run starts.
    pub(crate) fn judge(&mut self, replay: &ReplayRequest) -> Verdict {
        if !self.halt.is_recorded() {
            if !self.halt.on_failure.load(Ordering::Acquire) {
                return Verdict::Replay;
            }
            // This failure halts the run: recorded before its request
            // leaves, so the failures the halt causes find it.
            self.halt.record();
            self.not_replayed.insert(replay.partition);
            tracing::warn!(
                partition = %replay.partition, from = %replay.from,
                failed_seq = replay.failed.seq,
                "batch failed and on_failure = \"halt\": the pipeline halts; the partition is not replayed (the next run reads it again from its last commit)"
            );
            return Verdict::Halts;
        }
        if self.not_replayed.insert(replay.partition) {
            tracing::info!(
                partition = %replay.partition, from = %replay.from,
                failed_seq = replay.failed.seq,
                "batch failed while the pipeline halts; the partition is not replayed (the next run reads it again from its last commit)"
            );
        }
        Verdict::Withhold
    }
}

/// What becomes of a failed batch's replay request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Asked for: the source replays the partition.
    Replay,
    /// The failure halts the run (`on_failure = "halt"`): the request
    /// goes to whoever refuses it, as the halt's cause; nothing replays.
    Halts,
    /// The run halts already: no request.
    Withhold,
}

#[cfg(all(test, not(etl_loom)))]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Write;
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use etl_ack::{AckRef, Acker, BatchId, BatchMeta};
    use etl_record::{Offset, PartitionId};

    use crate::{
        CheckpointConfig, CheckpointHandle, Checkpointer, InFlightLimits, MemoryStore,
        PartitionOffsets,
    };

    /// Partitions no other test of this crate uses: the log is process-wide.
    const BEFORE: PartitionId = PartitionId(7100);
    const P1: PartitionId = PartitionId(7101);
    const P2: PartitionId = PartitionId(7102);
    const P3: PartitionId = PartitionId(7103);
    const P4: PartitionId = PartitionId(7104);
    const GUARD: Duration = Duration::from_secs(20);

    /// Every log line of this test binary, from any thread (the
    /// checkpointer logs on its own).
    fn log() -> &'static Mutex<Vec<u8>> {
        static LOG: OnceLock<&'static Mutex<Vec<u8>>> = OnceLock::new();
        LOG.get_or_init(|| {
            let log: &'static Mutex<Vec<u8>> = Box::leak(Box::new(Mutex::new(Vec::new())));
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .with_writer(move || Captured(log))
                .finish();
            tracing::subscriber::set_global_default(subscriber).unwrap();
            log
        })
    }

    struct Captured(&'static Mutex<Vec<u8>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Lines about `partition` holding `text`.
    fn lines(partition: PartitionId, text: &str) -> Vec<String> {
        let log = String::from_utf8_lossy(&log().lock().unwrap()).into_owned();
        log.lines()
            .filter(|l| l.contains(&format!("partition={partition}")) && l.contains(text))
            .map(str::to_owned)
            .collect()
    }

    async fn open(
        acker: &Acker,
        handle: &CheckpointHandle,
        id: (PartitionId, u32, u64),
        first: i64,
    ) -> AckRef {
        let (partition, epoch, seq) = id;
        handle.budget().acquire(partition, 10).await;
        acker
            .open(BatchMeta {
                id: BatchId {
                    partition,
                    epoch,
                    seq,
                },
                first_offset: Offset(first),
                last_offset: Offset(first + 9),
                records: 10,
                bytes: 10,
            })
            .unwrap()
    }

    fn fail(ack: AckRef) {
        ack.fail();
        drop(ack);
    }

    #[tokio::test]
    async fn a_failure_after_the_halt_pins_its_partition_and_is_not_replayed() {
        log();
        let store = MemoryStore::new();
        let (acker, acks) = etl_ack::channel();
        let config = CheckpointConfig {
            commit_interval: Duration::from_secs(3600),
            limits: InFlightLimits {
                max_in_flight_batches_per_partition: 8,
                max_in_flight_bytes_per_partition: 1 << 20,
                max_in_flight_batches: 32,
                max_in_flight_bytes: 1 << 20,
            },
            ..CheckpointConfig::default()
        };
        let (handle, mut replays) =
            Checkpointer::spawn(config, Box::new(store.clone()), acks).unwrap();
        let assigned = handle
            .assign(vec![(BEFORE, None), (P1, None), (P2, None)])
            .await
            .unwrap();
        let epoch = |p: PartitionId| assigned.iter().find(|a| a.partition == p).unwrap().epoch;

        // Before the halt, a failure replays.
        let b0 = open(&acker, &handle, (BEFORE, epoch(BEFORE), 0), 0).await;
        fail(b0);
        let replay = tokio::time::timeout(GUARD, replays.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(replay.partition, BEFORE);

        let e1 = epoch(P1);
        let a0 = open(&acker, &handle, (P1, e1, 0), 0).await;
        let a1 = open(&acker, &handle, (P1, e1, 1), 10).await;
        let a2 = open(&acker, &handle, (P1, e1, 2), 20).await;
        let c0 = open(&acker, &handle, (P2, epoch(P2), 0), 0).await;
        drop(a0);
        assert!(!handle.is_halting());
        handle.halt();
        assert!(handle.is_halting());
        tokio::time::timeout(GUARD, handle.halting())
            .await
            .expect("the halt is announced");
        // What the halting part held fails now.
        fail(a1);
        drop(a2); // delivered, but past the failure
        fail(c0);
        // A later epoch of the same partition (a new assignment) failing
        // too: still no replay, and no second line.
        let next = open(&acker, &handle, (P1, e1 + 1, 0), 10).await;
        fail(next);

        assert_eq!(
            handle.commit().await.unwrap(),
            PartitionOffsets::from([(P1, Offset(10))]),
            "the failure pins P1 at 10: nothing past it is committed"
        );
        assert!(replays.try_recv().is_err(), "no replay after the halt");
        for p in [P1, P2] {
            assert_eq!(
                lines(p, "not replayed").len(),
                1,
                "one line for partition {p}"
            );
            assert!(lines(p, "replaying").is_empty());
        }
        assert!(lines(P1, "not replayed")[0].contains("from=10"));
        assert!(lines(BEFORE, "not replayed").is_empty());
        assert_eq!(lines(BEFORE, "replaying").len(), 1);

        let summary = handle.shutdown().await.unwrap();
        assert_eq!(summary.committed.get(&P1), Some(&Offset(10)));
        assert_eq!(summary.committed.get(&P2), None, "P2 never moved");
        assert_eq!(store.offsets().get(&P1), Some(&Offset(10)));
        assert!(replays.recv().await.is_none(), "and none on the way");
    }

    /// `on_failure = "halt"`: the first failed batch halts the run. Its
    /// request still reaches whoever refuses it (the pipeline reports
    /// it), but no line announces a replay, of it or of the failures
    /// the halt causes.
    #[tokio::test]
    async fn with_halt_on_failure_the_first_failure_halts_and_none_is_announced_as_a_replay() {
        log();
        let (acker, acks) = etl_ack::channel();
        let (handle, mut replays) = Checkpointer::spawn(
            CheckpointConfig::default(),
            Box::new(MemoryStore::new()),
            acks,
        )
        .unwrap();
        handle.halt_on_failure();
        let assigned = handle.assign(vec![(P3, None), (P4, None)]).await.unwrap();
        let epoch = |p: PartitionId| assigned.iter().find(|a| a.partition == p).unwrap().epoch;
        let a0 = open(&acker, &handle, (P3, epoch(P3), 0), 0).await;
        let b0 = open(&acker, &handle, (P4, epoch(P4), 0), 0).await;

        fail(a0);
        let refused = tokio::time::timeout(GUARD, replays.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(refused.partition, P3, "the request reaches the refuser");
        // The refuser halts the run, and what it held fails.
        handle.halt();
        fail(b0);
        let _ = handle.commit().await.unwrap();

        assert!(replays.try_recv().is_err(), "no request for P4");
        for p in [P3, P4] {
            assert!(
                lines(p, "replaying").is_empty(),
                "{p}: {:?}",
                lines(p, "replaying")
            );
            assert_eq!(lines(p, "not replayed").len(), 1, "one line for {p}");
        }
        assert!(
            lines(P3, "on_failure").len() == 1,
            "P3's line names the policy"
        );
        handle.shutdown().await.unwrap();
    }
}
