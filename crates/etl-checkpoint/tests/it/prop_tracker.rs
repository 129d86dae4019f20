//! The partition tracker against a small reference model, over random
//! sequences of assign, revoke, batch open, resolution in any order
//! (delivered or failed, stale epochs, duplicates), replay and commit.
//!
//! The harness below plays the checkpointer's part (epochs, commits,
//! credit), driving real `PartitionTracker`s; the model recomputes every
//! watermark from first principles. Invariants are checked after every
//! step.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Instant;

use etl_ack::{AckMsg, AckStatus, BatchId, BatchMeta};
use etl_checkpoint::{PartitionTracker, Release};
use etl_record::{Offset, PartitionId, PartitionOffsets};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

const PARTITIONS: u32 = 2;

#[derive(Clone, Debug)]
enum Op {
    Assign(u32),
    Revoke(u32),
    /// Open the next batch of a partition with this many records.
    Open(u32, i64),
    /// Open a batch under an epoch that is already over.
    OpenStale(u32),
    /// Resolve the n-th outstanding batch (any epoch, any order).
    Resolve(usize, bool),
    /// Resolve again a batch that already resolved.
    Duplicate(usize),
    Commit,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0..PARTITIONS).prop_map(Op::Assign),
        1 => (0..PARTITIONS).prop_map(Op::Revoke),
        6 => (0..PARTITIONS, 1..4i64).prop_map(|(p, n)| Op::Open(p, n)),
        1 => (0..PARTITIONS).prop_map(Op::OpenStale),
        6 => (any::<usize>(), prop::bool::weighted(0.9)).prop_map(|(i, ok)| Op::Resolve(i, ok)),
        1 => any::<usize>().prop_map(Op::Duplicate),
        1 => Just(Op::Commit),
    ]
}

/// The reference model of one assigned partition.
#[derive(Clone, Debug)]
struct ModelPartition {
    epoch: u32,
    /// Where the current epoch started.
    start: Offset,
    /// Batches of the current epoch by seq: (first, last, delivered).
    batches: Vec<(i64, i64, Option<bool>)>,
    /// Where the source reads next.
    next_offset: i64,
}

impl ModelPartition {
    fn watermark(&self) -> Offset {
        let mut w = self.start;
        for (_, last, status) in &self.batches {
            if *status != Some(true) {
                break;
            }
            w = Offset(last + 1);
        }
        w
    }
}

#[derive(Default)]
struct Harness {
    trackers: HashMap<PartitionId, PartitionTracker>,
    model: HashMap<PartitionId, ModelPartition>,
    next_epoch: HashMap<PartitionId, u32>,
    committed: PartitionOffsets,
    /// Batches whose handles are still alive: (meta, still unresolved).
    outstanding: Vec<BatchMeta>,
    resolved: Vec<AckMsg>,
    credit: i64,
    replays: u64,
}

impl Harness {
    fn release(&mut self, r: Release) {
        self.credit -= i64::from(r.batches);
        assert!(self.credit >= 0, "a credit was released twice");
    }

    fn commit(&mut self, p: PartitionId) {
        let w = self.trackers[&p].watermark();
        let old = self.committed.get(&p).copied();
        if old.is_none_or(|c| w > c) {
            self.committed.insert(p, w);
        }
    }

    fn end(&mut self, p: PartitionId) {
        if let Some(mut t) = self.trackers.remove(&p) {
            let r = t.end_epoch();
            self.next_epoch.insert(p, t.epoch() + 1);
            self.release(r);
        }
        self.model.remove(&p);
    }

    fn step(&mut self, op: Op) {
        let now = Instant::now();
        match op {
            Op::Assign(p) => {
                let p = PartitionId(p);
                self.end(p);
                let epoch = self.next_epoch.get(&p).copied().unwrap_or(1);
                self.next_epoch.insert(p, epoch + 1);
                let start = self.committed.get(&p).copied().unwrap_or(Offset(0));
                self.trackers
                    .insert(p, PartitionTracker::new(p, epoch, start));
                let m = ModelPartition {
                    epoch,
                    start,
                    batches: Vec::new(),
                    next_offset: start.0,
                };
                self.model.insert(p, m);
            }
            Op::Revoke(p) => {
                let p = PartitionId(p);
                if self.trackers.contains_key(&p) {
                    self.commit(p);
                }
                self.end(p); // a duplicate revoke is a no-op
            }
            Op::Open(p, n) => {
                let p = PartitionId(p);
                let Some(m) = self.model.get_mut(&p) else {
                    return;
                };
                let seq = m.batches.len() as u64;
                let first = m.next_offset;
                let meta = BatchMeta {
                    id: BatchId {
                        partition: p,
                        epoch: m.epoch,
                        seq,
                    },
                    first_offset: Offset(first),
                    last_offset: Offset(first + n - 1),
                    records: n as u32,
                    bytes: n as u64,
                };
                m.batches.push((first, first + n - 1, None));
                m.next_offset = first + n;
                self.credit += 1;
                let e = self.trackers.get_mut(&p).unwrap().opened(&meta, now);
                assert!(!e.ignored);
                self.release(e.release);
                self.outstanding.push(meta);
            }
            Op::OpenStale(p) => {
                let p = PartitionId(p);
                let Some(t) = self.trackers.get_mut(&p) else {
                    return;
                };
                if t.epoch() == 0 {
                    return;
                }
                let before = (t.watermark(), t.unresolved());
                let meta = BatchMeta {
                    id: BatchId {
                        partition: p,
                        epoch: t.epoch() - 1,
                        seq: 0,
                    },
                    first_offset: Offset(0),
                    last_offset: Offset(0),
                    records: 1,
                    bytes: 1,
                };
                self.credit += 1;
                let e = t.opened(&meta, now);
                assert!(
                    e.ignored && e.release.batches == 1,
                    "a stale open gives its credit back"
                );
                assert_eq!(before, (t.watermark(), t.unresolved()));
                self.release(e.release);
            }
            Op::Resolve(i, delivered) => {
                if self.outstanding.is_empty() {
                    return;
                }
                let meta = self.outstanding.swap_remove(i % self.outstanding.len());
                let status = if delivered {
                    AckStatus::Delivered
                } else {
                    AckStatus::Failed
                };
                let msg = AckMsg {
                    id: meta.id,
                    last_offset: meta.last_offset,
                    status,
                };
                self.resolve(msg);
                self.resolved.push(msg);
            }
            Op::Duplicate(i) => {
                if self.resolved.is_empty() {
                    return;
                }
                let msg = self.resolved[i % self.resolved.len()];
                let p = msg.id.partition;
                let Some(t) = self.trackers.get_mut(&p) else {
                    return;
                };
                let before = (t.watermark(), t.unresolved(), t.epoch());
                let e = t.resolved(&msg);
                assert!(e.ignored && e.replay.is_none() && e.release == Release::default());
                assert_eq!(before, (t.watermark(), t.unresolved(), t.epoch()));
            }
            Op::Commit => {
                let all: Vec<_> = self.trackers.keys().copied().collect();
                for p in all {
                    self.commit(p);
                }
            }
        }
    }

    fn resolve(&mut self, msg: AckMsg) {
        let p = msg.id.partition;
        let Some(t) = self.trackers.get_mut(&p) else {
            return;
        };
        let m = self.model.get_mut(&p).unwrap();
        let current = msg.id.epoch == m.epoch;
        let before = (t.watermark(), t.unresolved(), t.epoch());
        let e = t.resolved(&msg);
        if !current {
            assert!(e.ignored, "an ack of another epoch is stale");
            assert_eq!(
                before,
                (t.watermark(), t.unresolved(), t.epoch()),
                "and changes nothing"
            );
            assert_eq!(e.release, Release::default(), "and releases nothing");
            return;
        }
        let slot = &mut m.batches[msg.id.seq as usize];
        assert_eq!(slot.2, None);
        slot.2 = Some(msg.status == AckStatus::Delivered);
        if msg.status == AckStatus::Failed {
            let from = m.watermark();
            let replay = e.replay.expect("a failure asks for a replay");
            assert_eq!(
                (replay.epoch, replay.from, replay.failed),
                (m.epoch + 1, from, msg.id)
            );
            let still_pending = m.batches.iter().filter(|b| b.2.is_none()).count() as u32 + 1;
            assert_eq!(e.release.batches, still_pending, "the whole epoch's credit");
            self.replays += 1;
            *m = ModelPartition {
                epoch: m.epoch + 1,
                start: from,
                batches: Vec::new(),
                next_offset: from.0,
            };
            self.next_epoch.insert(p, m.epoch + 1);
        } else {
            assert!(e.replay.is_none());
            assert_eq!(e.release.batches, 1);
        }
        let r = e.release;
        self.release(r);
    }

    fn check(&self, last: &mut HashMap<(PartitionId, u32), Offset>, committed: &PartitionOffsets) {
        let mut unresolved = 0;
        for (p, t) in &self.trackers {
            let m = &self.model[p];
            let w = t.watermark();
            assert_eq!(t.epoch(), m.epoch);
            assert_eq!(w, m.watermark(), "the watermark is the delivered prefix");
            for (first, _, status) in &m.batches {
                if *status != Some(true) {
                    assert!(w.0 <= *first, "never past an unresolved or failed batch");
                }
            }
            if m.batches.iter().all(|b| b.2 == Some(true)) {
                let end = m.batches.last().map_or(m.start, |b| Offset(b.1 + 1));
                assert_eq!(w, end, "all delivered: last offset + 1");
            }
            if let Some(prev) = last.get(&(*p, m.epoch)) {
                assert!(w >= *prev, "never regresses within an epoch");
            }
            unresolved += t.unresolved();
        }
        assert_eq!(
            self.credit, unresolved as i64,
            "credit held = unresolved batches"
        );
        for (p, c) in committed {
            assert!(self.committed[p] >= *c, "commits never regress");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/prop_tracker.txt",
        ))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn prop_tracker_matches_the_model(ops in prop::collection::vec(op(), 1..120)) {
        let mut h = Harness::default();
        let mut last = HashMap::new();
        for op in ops {
            let committed = h.committed.clone();
            h.step(op);
            h.check(&mut last, &committed);
            for (p, t) in &h.trackers {
                last.insert((*p, t.epoch()), t.watermark());
            }
        }
    }
}

#[test]
fn the_model_harness_catches_a_stale_ack_after_a_replay() {
    let mut h = Harness::default();
    let mut last = HashMap::new();
    for op in [
        Op::Assign(0),
        Op::Open(0, 2),
        Op::Open(0, 2),
        Op::Resolve(0, false),
        Op::Resolve(0, true),
        Op::Open(0, 3),
        Op::Resolve(0, true),
        Op::Commit,
    ] {
        let committed = h.committed.clone();
        h.step(op);
        h.check(&mut last, &committed);
    }
    assert_eq!(h.replays, 1);
    assert_eq!(h.committed[&PartitionId(0)], Offset(3));
}
