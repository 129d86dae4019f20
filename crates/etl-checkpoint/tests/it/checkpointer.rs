//! The checkpointer thread with a real ack channel: out-of-order
//! resolution, failure and replay, stale acknowledgements, revoke,
//! re-assignment, interval commits, shutdown, credits and commit errors.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use etl_ack::{AckRef, AckSet, Acker, BatchId, BatchMeta};
use etl_checkpoint::{
    CheckpointConfig, CheckpointError, CheckpointHandle, Checkpointer, InFlight, InFlightLimits,
    MemoryStore, OffsetStore, PartitionOffsets, ReplayRequest, ReplayRequests,
};
use etl_record::{Offset, PartitionId};

const P0: PartitionId = PartitionId(0);
const P1: PartitionId = PartitionId(1);
/// Only a failure guard: every wait below normally ends in milliseconds.
const GUARD: Duration = Duration::from_secs(20);

struct Fixture {
    acker: Acker,
    handle: CheckpointHandle,
    replays: ReplayRequests,
    store: MemoryStore,
}

fn config() -> CheckpointConfig {
    CheckpointConfig {
        // Commits happen only when a test asks, or on revoke/shutdown.
        commit_interval: Duration::from_secs(3600),
        revoke_deadline: Duration::from_secs(30),
        shutdown_timeout: Duration::from_secs(30),
        limits: InFlightLimits {
            max_in_flight_batches_per_partition: 8,
            max_in_flight_bytes_per_partition: 1 << 20,
            max_in_flight_batches: 16,
            max_in_flight_bytes: 1 << 20,
        },
    }
}

fn start_with(config: CheckpointConfig, store: MemoryStore) -> Fixture {
    let (acker, acks) = etl_ack::channel();
    let (handle, replays) = Checkpointer::spawn(config, Box::new(store.clone()), acks).unwrap();
    Fixture {
        acker,
        handle,
        replays,
        store,
    }
}

fn start() -> Fixture {
    start_with(config(), MemoryStore::new())
}

impl Fixture {
    /// Reserve credit and open batch `seq` covering offsets
    /// `first..=first + 9`.
    async fn open(&self, p: PartitionId, epoch: u32, seq: u64, first: i64) -> AckRef {
        self.handle.budget().acquire(p, 100).await;
        let id = BatchId {
            partition: p,
            epoch,
            seq,
        };
        self.acker
            .open(BatchMeta {
                id,
                first_offset: Offset(first),
                last_offset: Offset(first + 9),
                records: 10,
                bytes: 100,
            })
            .unwrap()
    }

    async fn epoch(&self, p: PartitionId) -> u32 {
        let assigned = self.handle.assign(vec![(p, None)]).await.unwrap();
        assigned[0].epoch
    }
}

fn offsets(pairs: &[(PartitionId, i64)]) -> PartitionOffsets {
    pairs.iter().map(|(p, o)| (*p, Offset(*o))).collect()
}

#[tokio::test]
async fn out_of_order_resolution_commits_the_contiguous_prefix() {
    let f = start();
    let e = f.epoch(P0).await;
    let a0 = f.open(P0, e, 0, 0).await;
    let a1 = f.open(P0, e, 1, 10).await;
    let a2 = f.open(P0, e, 2, 20).await;
    drop(a2);
    assert_eq!(
        f.handle.commit().await.unwrap(),
        PartitionOffsets::new(),
        "batch 0 pins"
    );
    drop(a0);
    assert_eq!(f.handle.commit().await.unwrap(), offsets(&[(P0, 10)]));
    drop(a1);
    assert_eq!(f.handle.commit().await.unwrap(), offsets(&[(P0, 30)]));
    assert_eq!(
        f.handle.commit().await.unwrap(),
        PartitionOffsets::new(),
        "nothing moved"
    );
    assert_eq!(f.store.offsets(), offsets(&[(P0, 30)]));
    assert_eq!(f.handle.budget().in_flight(), InFlight::default());
    let m = &f.handle.metrics().partitions[&P0];
    assert_eq!(
        (m.watermark, m.committed, m.in_flight_batches),
        (Offset(30), Some(Offset(30)), 0)
    );
}

#[tokio::test]
async fn a_failure_asks_for_exactly_one_replay_and_old_acks_go_stale() {
    let mut f = start();
    let e = f.epoch(P0).await;
    let a0 = f.open(P0, e, 0, 0).await;
    let a1 = f.open(P0, e, 1, 10).await;
    let a2 = f.open(P0, e, 2, 20).await;
    let a3 = f.open(P0, e, 3, 30).await;
    drop(a0);
    a1.fail();
    drop(a1);
    a2.fail();
    drop(a2); // a second failure of the dead epoch: no second replay
    let replay = tokio::time::timeout(GUARD, f.replays.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        replay,
        ReplayRequest {
            partition: P0,
            epoch: e + 1,
            from: Offset(10),
            failed: BatchId {
                partition: P0,
                epoch: e,
                seq: 1
            },
        }
    );
    drop(a3); // delivered, but of the dead epoch
    assert_eq!(f.handle.commit().await.unwrap(), offsets(&[(P0, 10)]));
    assert!(f.replays.try_recv().is_err(), "exactly one replay");
    // Every credit of the dead epoch came back when it ended.
    assert_eq!(f.handle.budget().in_flight(), InFlight::default());
    let m = &f.handle.metrics().partitions[&P0];
    assert_eq!(
        (m.epoch, m.failed_batches, m.replays, m.stale_acks),
        (e + 1, 1, 1, 2)
    );

    // The replay under the new epoch, seq from 0, moves the watermark on.
    let r0 = f.open(P0, e + 1, 0, 10).await;
    let r1 = f.open(P0, e + 1, 1, 20).await;
    drop((r0, r1));
    assert_eq!(f.handle.commit().await.unwrap(), offsets(&[(P0, 30)]));
}

#[tokio::test]
async fn revoke_waits_for_in_flight_and_commits_only_the_revoked() {
    let f = start();
    let assigned = f.handle.assign(vec![(P0, None), (P1, None)]).await.unwrap();
    let (e0, e1) = (assigned[0].epoch, assigned[1].epoch);
    let p0a = f.open(P0, e0, 0, 0).await;
    let p0b = f.open(P0, e0, 1, 10).await;
    let p1a = f.open(P1, e1, 0, 0).await;
    drop(p0a);
    drop(p1a);
    let revoke = tokio::spawn({
        let h = f.handle.clone();
        async move { h.revoke(vec![P0]).await }
    });
    // The revoke cannot finish while batch 1 of P0 is in flight; the
    // checkpointer keeps serving meanwhile.
    assert_eq!(
        f.handle.commit().await.unwrap(),
        offsets(&[(P0, 10), (P1, 10)])
    );
    let p1b = f.open(P1, e1, 1, 10).await;
    drop(p1b);
    assert!(!revoke.is_finished());
    drop(p0b);
    let revoked = tokio::time::timeout(GUARD, revoke)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(revoked, offsets(&[(P0, 20)]));
    // P1 moved to 20 as well, but only the revoked partition was committed.
    assert_eq!(f.store.offsets(), offsets(&[(P0, 20), (P1, 10)]));
    let m = f.handle.metrics();
    assert!(!m.partitions.contains_key(&P0), "revoked state is dropped");
    assert!(
        m.partitions.contains_key(&P1),
        "kept partitions are untouched"
    );
    assert_eq!(f.handle.budget().in_flight(), InFlight::default());
}

#[tokio::test]
async fn revoke_gives_up_at_its_deadline_and_late_acks_are_stale() {
    let config = CheckpointConfig {
        revoke_deadline: Duration::from_millis(30),
        ..config()
    };
    let f = start_with(config, MemoryStore::new());
    let e = f.epoch(P0).await;
    let a0 = f.open(P0, e, 0, 0).await;
    let stuck = f.open(P0, e, 1, 10).await;
    drop(a0);
    let revoked = tokio::time::timeout(GUARD, f.handle.revoke(vec![P0]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        revoked,
        offsets(&[(P0, 10)]),
        "the watermark the stuck batch pins"
    );
    assert_eq!(
        f.handle.budget().in_flight(),
        InFlight::default(),
        "its credit too"
    );
    drop(stuck);
    // Re-assigning starts from the commit under a newer epoch; the late ack
    // of the old epoch changed nothing.
    let again = f.handle.assign(vec![(P0, None)]).await.unwrap();
    assert!(again[0].epoch > e);
    assert_eq!(again[0].start, Offset(10));
    assert_eq!(f.handle.metrics().stale_acks_unassigned, 1);
    assert_eq!(f.store.offsets(), offsets(&[(P0, 10)]));
    // No write of the stuck batch was registered (an at-least-once sink
    // registers none): the deadline released the partition, and the run
    // goes on.
    assert!(!f.handle.is_halting());
    assert!(f.handle.revoke_halt().is_none());
}

/// An exactly-once sink registers its writes on the channel's fence. A
/// revocation closes the partition's epoch at once (a queued batch may
/// start no write), and if its deadline passes while a write is still
/// under way, the run halts and the partition is not handed over until
/// that write ended.
#[tokio::test]
async fn a_revoke_deadline_passing_with_an_exactly_once_write_under_way_halts_and_waits_for_it() {
    let config = CheckpointConfig {
        revoke_deadline: Duration::from_millis(50),
        ..config()
    };
    let mut f = start_with(config, MemoryStore::new());
    let e = f.epoch(P0).await;
    let e1 = f.epoch(P1).await;
    let writing: AckSet = vec![f.open(P0, e, 0, 0).await].into();
    let queued: AckSet = vec![f.open(P0, e, 1, 10).await].into();
    let other: AckSet = vec![f.open(P1, e1, 0, 0).await].into();
    let guard = writing.begin_write().expect("nothing revoked yet");

    let revoke = {
        let handle = f.handle.clone();
        tokio::spawn(async move { handle.hand_over(vec![P0]).await })
    };
    tokio::time::timeout(GUARD, async {
        while !queued.iter().all(AckRef::is_fenced) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the revocation closes the epoch");
    assert!(
        queued.begin_write().is_none(),
        "a queued batch starts no write"
    );
    assert!(other.begin_write().is_some(), "another partition's does");

    tokio::time::timeout(GUARD, f.handle.revoke_halted())
        .await
        .expect("the deadline halts the run");
    assert!(f.handle.is_halting());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !revoke.is_finished(),
        "not handed over while the write can land"
    );

    // The halt tears the write down: then the revocation answers.
    drop(guard);
    drop((writing, queued));
    let err = tokio::time::timeout(GUARD, revoke)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&err, CheckpointError::RevokeUnsettled { partitions, .. } if partitions == &[P0]),
        "{err}"
    );
    assert!(err.to_string().contains("revoke_deadline"), "{err}");
    assert!(matches!(
        f.handle.revoke_halt(),
        Some(CheckpointError::RevokeUnsettled { .. })
    ));
    assert!(f.replays.try_recv().is_err(), "the failures replay nothing");
    other.deliver();
}

/// A failure of a handed-over partition's batch ends its epoch, so no
/// batch of it is counted in flight any more; an earlier batch's write
/// may still be under way all the same. The revocation asks the fence,
/// not the count: it does not answer while that write can land.
#[tokio::test]
async fn a_hand_over_waits_for_a_write_under_way_after_a_failure_emptied_the_partition() {
    let f = start();
    let e = f.epoch(P0).await;
    let writing: AckSet = vec![f.open(P0, e, 0, 0).await].into();
    let failing: AckSet = vec![f.open(P0, e, 1, 10).await].into();
    let guard = writing.begin_write().expect("nothing revoked yet");
    let revoke = {
        let handle = f.handle.clone();
        tokio::spawn(async move { handle.hand_over(vec![P0]).await })
    };
    tokio::time::timeout(GUARD, async {
        while !failing.iter().all(AckRef::is_fenced) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the revocation closes the epoch");
    failing.fail();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !revoke.is_finished(),
        "handed over while a write of the partition can land"
    );
    assert!(!f.handle.is_halting(), "the deadline is far");

    drop(guard);
    let revoked = tokio::time::timeout(GUARD, revoke)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(revoked, PartitionOffsets::new(), "nothing delivered");
    assert!(!f.handle.is_halting());
    writing.deliver();
}

/// As above, with the deadline passing while the write is under way:
/// the run halts, and the revocation answers `RevokeUnsettled` only once
/// the write ended.
#[tokio::test]
async fn a_hand_over_past_its_deadline_halts_on_a_write_under_way_after_a_failure() {
    let config = CheckpointConfig {
        revoke_deadline: Duration::from_millis(50),
        ..config()
    };
    let f = start_with(config, MemoryStore::new());
    let e = f.epoch(P0).await;
    let writing: AckSet = vec![f.open(P0, e, 0, 0).await].into();
    let failing: AckSet = vec![f.open(P0, e, 1, 10).await].into();
    let guard = writing.begin_write().expect("nothing revoked yet");
    let revoke = {
        let handle = f.handle.clone();
        tokio::spawn(async move { handle.hand_over(vec![P0]).await })
    };
    tokio::time::timeout(GUARD, async {
        while !failing.iter().all(AckRef::is_fenced) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the revocation closes the epoch");
    failing.fail();
    tokio::time::timeout(GUARD, f.handle.revoke_halted())
        .await
        .expect("the deadline halts the run");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !revoke.is_finished(),
        "handed over while a write of the partition can land"
    );

    drop(guard);
    let err = tokio::time::timeout(GUARD, revoke)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(&err, CheckpointError::RevokeUnsettled { partitions, .. } if partitions == &[P0]),
        "{err}"
    );
    writing.deliver();
}

/// A partition revoked without a handover (an input file retired) keeps
/// its epoch open: its queued batches may still be written, and a write
/// under way at the deadline does not halt the run.
#[tokio::test]
async fn a_revoke_that_hands_nothing_over_leaves_the_epoch_open() {
    let config = CheckpointConfig {
        revoke_deadline: Duration::from_millis(50),
        ..config()
    };
    let f = start_with(config, MemoryStore::new());
    let e = f.epoch(P0).await;
    let writing: AckSet = vec![f.open(P0, e, 0, 0).await].into();
    let queued: AckSet = vec![f.open(P0, e, 1, 10).await].into();
    let guard = writing.begin_write().expect("nothing revoked yet");
    let revoked = tokio::time::timeout(GUARD, f.handle.revoke(vec![P0]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked, PartitionOffsets::new(), "nothing delivered");
    assert!(!f.handle.is_halting());
    assert!(queued.begin_write().is_some(), "its batches may be written");
    drop(guard);
    writing.deliver();
    queued.deliver();
}

#[tokio::test]
async fn revoking_an_unassigned_partition_is_a_no_op() {
    let f = start();
    let e = f.epoch(P0).await;
    let a0 = f.open(P0, e, 0, 0).await;
    // Nothing of P1 to wait for: the reply comes at once (the revoke
    // deadline is far beyond the guard), and P0 is left as it was.
    let revoked = tokio::time::timeout(GUARD, f.handle.revoke(vec![P1]))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked, PartitionOffsets::new());
    assert_eq!(f.store.commits(), 0);
    let m = &f.handle.metrics().partitions[&P0];
    assert_eq!((m.epoch, m.in_flight_batches), (e, 1));
    assert_eq!(f.handle.budget().in_flight().batches, 1);
    drop(a0);
    assert_eq!(f.handle.commit().await.unwrap(), offsets(&[(P0, 10)]));
}

#[tokio::test]
async fn reassigning_reloads_the_store() {
    let f = start();
    let e = f.epoch(P0).await;
    drop(f.open(P0, e, 0, 0).await);
    assert_eq!(f.handle.commit().await.unwrap(), offsets(&[(P0, 10)]));
    // Another owner of the partition committed further meanwhile.
    let mut elsewhere = f.store.clone();
    elsewhere.commit(&offsets(&[(P0, 70)])).unwrap();
    let again = f.handle.assign(vec![(P0, None)]).await.unwrap();
    assert!(again[0].epoch > e, "a strictly larger epoch");
    assert_eq!(
        again[0].start,
        Offset(70),
        "from the store, not from memory"
    );
    let m = &f.handle.metrics().partitions[&P0];
    assert_eq!((m.watermark, m.committed), (Offset(70), Some(Offset(70))));
    // Delivering under the new epoch commits past the reloaded offset.
    drop(f.open(P0, again[0].epoch, 0, 70).await);
    assert_eq!(f.handle.commit().await.unwrap(), offsets(&[(P0, 80)]));
}

#[tokio::test]
async fn the_interval_commits_without_being_asked() {
    let config = CheckpointConfig {
        commit_interval: Duration::from_millis(10),
        ..config()
    };
    let f = start_with(config, MemoryStore::new());
    let e = f.epoch(P0).await;
    drop(f.open(P0, e, 0, 0).await);
    // No commit call: the interval does it, and the metrics (refreshed a
    // few times a second) catch up.
    let committed = |f: &Fixture| f.handle.metrics().partitions[&P0].committed;
    let deadline = std::time::Instant::now() + GUARD;
    while (f.store.offsets().is_empty() || committed(&f).is_none())
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(f.store.offsets(), offsets(&[(P0, 10)]));
    assert_eq!(committed(&f), Some(Offset(10)));
    assert!(f.handle.metrics().commits >= 1);
}

/// The interval commit of an idle pipeline is the last event there is:
/// its metrics must show it, or a scrape says "not committed" forever.
#[tokio::test]
async fn an_interval_commit_while_idle_is_published_in_the_metrics() {
    let config = CheckpointConfig {
        // Longer than the metrics refresh: the acknowledgement is
        // published long before the commit happens.
        commit_interval: Duration::from_millis(400),
        ..config()
    };
    let f = start_with(config, MemoryStore::new());
    let e = f.epoch(P0).await;
    drop(f.open(P0, e, 0, 0).await);
    let deadline = std::time::Instant::now() + GUARD;
    while f.store.offsets().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(f.store.offsets(), offsets(&[(P0, 10)]));
    let committed = |f: &Fixture| f.handle.metrics().partitions[&P0].committed;
    while committed(&f).is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        committed(&f),
        Some(Offset(10)),
        "the commit was never published"
    );
    assert_eq!(f.handle.metrics().commits, 1);
}

#[tokio::test]
async fn a_stale_open_releases_its_credit_at_once() {
    let f = start();
    let e = f.epoch(P0).await;
    let late = f.open(P0, e - 1, 0, 0).await; // an epoch already over
    let unassigned = f.open(P1, 1, 0, 0).await; // a partition never assigned
    f.handle.commit().await.unwrap();
    assert_eq!(f.handle.budget().in_flight(), InFlight::default());
    drop((late, unassigned));
    assert_eq!(f.handle.commit().await.unwrap(), PartitionOffsets::new());
    assert_eq!(f.handle.metrics().partitions[&P0].watermark, Offset(0));
}

#[tokio::test]
async fn reassigning_ends_the_epoch_and_releases_its_credit() {
    let f = start();
    let e = f.epoch(P0).await;
    let pending = f.open(P0, e, 0, 0).await;
    assert_eq!(f.handle.budget().in_flight().batches, 1);
    let e2 = f.epoch(P0).await;
    assert!(e2 > e, "epochs only grow");
    assert_eq!(f.handle.budget().in_flight(), InFlight::default());
    drop(pending);
    assert_eq!(
        f.handle.commit().await.unwrap(),
        PartitionOffsets::new(),
        "stale"
    );
}

#[tokio::test]
async fn shutdown_waits_for_in_flight_then_commits() {
    let f = start();
    let e = f.epoch(P0).await;
    let a0 = f.open(P0, e, 0, 100).await;
    let shutdown = tokio::spawn({
        let h = f.handle.clone();
        async move { h.shutdown().await }
    });
    tokio::task::yield_now().await;
    drop(a0);
    let summary = tokio::time::timeout(GUARD, shutdown)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!summary.timed_out);
    assert_eq!(summary.committed, offsets(&[(P0, 110)]));
    assert_eq!(f.store.offsets(), offsets(&[(P0, 110)]));
    assert!(matches!(
        f.handle.commit().await,
        Err(CheckpointError::Stopped)
    ));
}

#[tokio::test]
async fn shutdown_gives_up_at_its_deadline() {
    let config = CheckpointConfig {
        shutdown_timeout: Duration::from_millis(30),
        ..config()
    };
    let f = start_with(config, MemoryStore::with_offsets(offsets(&[(P0, 50)])));
    let e = f.epoch(P0).await;
    let a0 = f.open(P0, e, 0, 50).await;
    let _stuck = f.open(P0, e, 1, 60).await;
    drop(a0);
    let summary = tokio::time::timeout(GUARD, f.handle.shutdown())
        .await
        .unwrap()
        .unwrap();
    assert!(summary.timed_out);
    assert_eq!(summary.committed, offsets(&[(P0, 60)]));
}

#[tokio::test]
async fn assign_starts_from_the_store_unless_told_otherwise() {
    let f = start_with(config(), MemoryStore::with_offsets(offsets(&[(P0, 40)])));
    let a = f
        .handle
        .assign(vec![
            (P0, None),
            (P1, None),
            (PartitionId(2), Some(Offset(7))),
        ])
        .await
        .unwrap();
    let starts: Vec<_> = a.iter().map(|a| a.start).collect();
    assert_eq!(starts, [Offset(40), Offset(0), Offset(7)]);
    // Nothing delivered: nothing is rewritten.
    assert_eq!(f.handle.commit().await.unwrap(), PartitionOffsets::new());
    assert_eq!(f.store.commits(), 0);
}

#[tokio::test]
async fn an_override_below_the_store_never_regresses_it() {
    let f = start_with(config(), MemoryStore::with_offsets(offsets(&[(P0, 40)])));
    let a = f.handle.assign(vec![(P0, Some(Offset(0)))]).await.unwrap();
    let first = f.open(P0, a[0].epoch, 0, 0).await;
    drop(first);
    assert_eq!(f.handle.commit().await.unwrap(), PartitionOffsets::new());
    assert_eq!(f.store.offsets(), offsets(&[(P0, 40)]));
}

/// A store whose commits fail until told otherwise.
#[derive(Debug)]
struct FlakyStore {
    inner: MemoryStore,
    fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl OffsetStore for FlakyStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        self.inner.load()
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(CheckpointError::Store("disk on fire".into()));
        }
        self.inner.commit(offsets)
    }
}

#[tokio::test]
async fn a_failed_commit_is_surfaced_and_retried_never_skipped() {
    let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let inner = MemoryStore::new();
    let store = FlakyStore {
        inner: inner.clone(),
        fail: fail.clone(),
    };
    let (acker, acks) = etl_ack::channel();
    let (handle, _replays) = Checkpointer::spawn(config(), Box::new(store), acks).unwrap();
    let f = Fixture {
        acker,
        handle,
        replays: tokio::sync::mpsc::unbounded_channel().1,
        store: inner,
    };
    let e = f.epoch(P0).await;
    drop(f.open(P0, e, 0, 0).await);
    let err = f.handle.commit().await.unwrap_err();
    assert!(matches!(&err, CheckpointError::Commit { partitions, .. } if partitions == &[P0]));
    assert!(err.to_string().contains("disk on fire"), "{err}");
    let m = f.handle.metrics();
    assert_eq!(m.commit_errors, 1);
    assert!(m.last_commit_error.is_some());
    assert_eq!(m.partitions[&P0].committed, None, "no silent advance");
    assert!(f.store.offsets().is_empty());
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(f.handle.commit().await.unwrap(), offsets(&[(P0, 10)]));
    assert_eq!(f.handle.metrics().last_commit_error, None);
}

/// A store whose first commit fails with an I/O error (a failed fsync)
/// and whose later ones would succeed, as a retried fsync reports success
/// for pages the kernel dropped.
#[derive(Debug)]
struct FsyncFailsOnce {
    inner: MemoryStore,
    failed: bool,
}

impl OffsetStore for FsyncFailsOnce {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        self.inner.load()
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        if !self.failed {
            self.failed = true;
            return Err(CheckpointError::Io {
                path: "state/offsets.tmp".into(),
                op: "fsync",
                source: std::io::Error::from_raw_os_error(5),
            });
        }
        self.inner.commit(offsets)
    }
}

#[tokio::test]
async fn an_io_failure_makes_the_store_lost_and_the_run_is_told_to_stop() {
    let inner = MemoryStore::new();
    let store = FsyncFailsOnce {
        inner: inner.clone(),
        failed: false,
    };
    let (acker, acks) = etl_ack::channel();
    let (handle, _replays) = Checkpointer::spawn(config(), Box::new(store), acks).unwrap();
    let f = Fixture {
        acker,
        handle,
        replays: tokio::sync::mpsc::unbounded_channel().1,
        store: inner,
    };
    let e = f.epoch(P0).await;
    drop(f.open(P0, e, 0, 0).await);
    let err = f.handle.commit().await.unwrap_err();
    assert!(
        matches!(&err, CheckpointError::Commit { source, .. } if matches!(**source, CheckpointError::Io { .. })),
        "{err}"
    );
    tokio::time::timeout(GUARD, f.handle.store_lost())
        .await
        .expect("the run is told the store is lost");
    // The store would accept the next commit; a lost one is not asked.
    drop(f.open(P0, e, 1, 10).await);
    let later = f.handle.commit().await.unwrap_err();
    assert!(
        matches!(&later, CheckpointError::Commit { source, .. } if matches!(**source, CheckpointError::Io { .. })),
        "{later}"
    );
    assert!(later.to_string().contains("lost"), "{later}");
    assert_eq!(f.store.commits(), 0, "never retried");
    let end = f.handle.shutdown().await.unwrap_err();
    assert!(
        matches!(&end, CheckpointError::Commit { source, .. } if matches!(**source, CheckpointError::Io { .. })),
        "{end}"
    );
    assert!(f.store.offsets().is_empty());
}

#[test]
fn blocking_calls_work_outside_a_runtime() {
    let store = MemoryStore::new();
    let (_acker, acks) = etl_ack::channel();
    let (handle, _replays) = Checkpointer::spawn(config(), Box::new(store), acks).unwrap();
    let a = handle.assign_blocking(vec![(P0, Some(Offset(5)))]).unwrap();
    assert_eq!(a[0].start, Offset(5));
    assert_eq!(
        handle.revoke_blocking(vec![P0, P1]).unwrap(),
        PartitionOffsets::new()
    );
    assert!(handle.metrics().partitions.is_empty());
}

#[test]
fn dropping_every_handle_commits_and_stops_the_thread() {
    let store = MemoryStore::new();
    let (acker, acks) = etl_ack::channel();
    let (handle, _replays) = Checkpointer::spawn(config(), Box::new(store.clone()), acks).unwrap();
    let a = handle.assign_blocking(vec![(P0, None)]).unwrap();
    let id = BatchId {
        partition: P0,
        epoch: a[0].epoch,
        seq: 0,
    };
    let ack = acker
        .open(BatchMeta {
            id,
            first_offset: Offset(0),
            last_offset: Offset(4),
            records: 5,
            bytes: 1,
        })
        .unwrap();
    drop(ack);
    drop(acker);
    drop(handle);
    let deadline = std::time::Instant::now() + GUARD;
    while store.offsets().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(store.offsets(), offsets(&[(P0, 5)]));
}

#[tokio::test]
async fn metrics_follow_acks_without_waiting_for_a_commit() {
    // The commit interval is an hour: the watermark must still show up in
    // the metrics promptly after the batch resolves.
    let f = start();
    let epoch = f.epoch(P0).await;
    let ack = f.open(P0, epoch, 0, 0).await;
    drop(ack);
    let started = std::time::Instant::now();
    loop {
        let m = f.handle.metrics();
        if m.partitions.get(&P0).map(|p| p.watermark) == Some(Offset(10)) {
            break;
        }
        assert!(
            started.elapsed() < GUARD,
            "metrics never showed the watermark"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(f.store.offsets().is_empty(), "no commit was asked for");
}

/// A store whose `load_with` breaks its contract: it lends its offsets
/// `times` times (0: never).
struct LendsWrongly {
    inner: MemoryStore,
    times: usize,
}

impl OffsetStore for LendsWrongly {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        self.inner.load()
    }

    fn load_with(
        &mut self,
        read: &mut dyn FnMut(&PartitionOffsets),
    ) -> Result<(), CheckpointError> {
        let offsets = self.inner.load()?;
        for _ in 0..self.times {
            read(&offsets);
        }
        Ok(())
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        self.inner.commit(offsets)
    }
}

#[tokio::test]
async fn a_store_that_lends_its_offsets_other_than_once_fails_the_assignment() {
    for times in [0, 2] {
        let inner = MemoryStore::new();
        inner.clone().commit(&offsets(&[(P0, 40)])).unwrap();
        let store = LendsWrongly { inner, times };
        let (_acker, acks) = etl_ack::channel();
        let (handle, _replays) = Checkpointer::spawn(config(), Box::new(store), acks).unwrap();
        let refused = handle.assign(vec![(P0, None), (P1, None)]).await;
        let Err(e) = refused else {
            panic!("lent {times} times: assigned {refused:?}");
        };
        assert!(e.to_string().contains("load_with"), "{e}");
    }
}
