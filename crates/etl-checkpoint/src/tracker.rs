//! The per-partition watermark tracker: a pure, synchronous state machine.
//!
//! It follows one partition through one assignment epoch at a time. The
//! delivered watermark is the committable position after the contiguous
//! prefix (by `seq`) of delivered batches. A failed batch pins it and ends
//! the epoch, asking for a replay from the watermark under the next epoch.
//! Resolutions of any other epoch are stale: counted, and nothing else.
//!
//! Each event costs O(1) amortized: pending batches live in a ring indexed
//! by `seq - base_seq`, and the prefix only ever pops from the front.

use std::collections::VecDeque;
use std::time::Instant;

use etl_ack::{AckMsg, AckStatus, BatchId, BatchMeta};
use etl_record::{Offset, PartitionId};

/// A batch the tracker knows of.
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// Payload bytes, to release its credit.
    bytes: u64,
    opened_at: Instant,
    state: SlotState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    /// A seq skipped by a later announcement: not opened yet, so it holds
    /// no credit, but it pins the watermark until it opens and delivers.
    Unopened,
    Pending,
    Delivered {
        last_offset: Offset,
    },
}

/// Credit to give back to the in-flight budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Release {
    /// Batches no longer in flight.
    pub batches: u32,
    /// Their payload bytes.
    pub bytes: u64,
}

impl Release {
    fn add(&mut self, bytes: u64) {
        self.batches += 1;
        self.bytes += bytes;
    }
}

/// A replay the source must perform after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayRequest {
    /// The partition to replay.
    pub partition: PartitionId,
    /// The new epoch the source must use from now on (seq restarts at 0).
    pub epoch: u32,
    /// The partition's delivered watermark: seek here.
    pub from: Offset,
    /// The batch whose failure caused the replay.
    pub failed: BatchId,
}

/// What an event did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effect {
    /// Credit to release.
    pub release: Release,
    /// A replay to request (only on the first failure of an epoch).
    pub replay: Option<ReplayRequest>,
    /// Whether the event was stale (another epoch) or a duplicate.
    pub ignored: bool,
}

/// Watermark tracking of one partition.
#[derive(Debug)]
pub struct PartitionTracker {
    partition: PartitionId,
    epoch: u32,
    watermark: Offset,
    base_seq: u64,
    slots: VecDeque<Slot>,
    in_flight_bytes: u64,
    /// Pending slots, kept as a count so revoke and shutdown checks are
    /// O(1).
    pending: usize,
    failed_batches: u64,
    replays: u64,
    stale: u64,
}

impl PartitionTracker {
    /// Start tracking `partition` under `epoch`, with nothing delivered
    /// past `start`.
    #[must_use]
    pub fn new(partition: PartitionId, epoch: u32, start: Offset) -> Self {
        PartitionTracker {
            partition,
            epoch,
            watermark: start,
            base_seq: 0,
            slots: VecDeque::new(),
            in_flight_bytes: 0,
            pending: 0,
            failed_batches: 0,
            replays: 0,
            stale: 0,
        }
    }

    /// The partition.
    #[must_use]
    pub fn partition(&self) -> PartitionId {
        self.partition
    }

    /// The current epoch.
    #[must_use]
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The delivered watermark: every offset below it was delivered.
    #[must_use]
    pub fn watermark(&self) -> Offset {
        self.watermark
    }

    /// Batches of the current epoch not yet folded into the watermark
    /// (unresolved, delivered behind an unresolved one, or skipped by an
    /// out-of-order announcement).
    #[must_use]
    pub fn tracked_batches(&self) -> usize {
        self.slots.len()
    }

    /// Unresolved batches of the current epoch: the ones holding credit.
    #[must_use]
    pub fn unresolved(&self) -> usize {
        self.pending
    }

    /// Payload bytes of unresolved batches.
    #[must_use]
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    /// When the oldest unresolved batch was opened.
    #[must_use]
    pub fn oldest_unresolved(&self) -> Option<Instant> {
        // The delivered prefix is always folded away, so the front slot,
        // if any, is the lowest unresolved seq, opened first.
        self.slots.front().map(|s| s.opened_at)
    }

    /// Failed batches seen (current and earlier epochs of this tracker).
    #[must_use]
    pub fn failed_batches(&self) -> u64 {
        self.failed_batches
    }

    /// Replays requested.
    #[must_use]
    pub fn replays(&self) -> u64 {
        self.replays
    }

    /// Stale or duplicate events discarded.
    #[must_use]
    pub fn stale(&self) -> u64 {
        self.stale
    }

    /// An announcement that changes nothing (stale epoch, duplicate): count
    /// it and give back the credit reserved for it.
    fn ignore_open(&mut self, meta: &BatchMeta) -> Effect {
        self.stale += 1;
        let mut release = Release::default();
        release.add(meta.bytes);
        Effect {
            release,
            ignored: true,
            ..Effect::default()
        }
    }

    /// A batch was opened. A batch of another epoch is stale: its credit is
    /// released at once.
    pub fn opened(&mut self, meta: &BatchMeta, now: Instant) -> Effect {
        if meta.id.epoch != self.epoch || meta.id.partition != self.partition {
            return self.ignore_open(meta);
        }
        let expected = self.base_seq + self.slots.len() as u64;
        let gap = meta
            .id
            .seq
            .checked_sub(self.base_seq)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| {
                self.slots
                    .get(*i)
                    .is_some_and(|s| s.state == SlotState::Unopened)
            });
        if let Some(index) = gap {
            // The announcement of a seq skipped earlier: it holds credit
            // from now on, like any batch.
            self.slots[index] = Slot {
                bytes: meta.bytes,
                opened_at: now,
                state: SlotState::Pending,
            };
            self.in_flight_bytes += meta.bytes;
            self.pending += 1;
            return Effect::default();
        }
        if meta.id.seq < expected {
            // A duplicate announcement: the batch is already known. Every
            // announcement follows its own reservation, so give it back.
            return self.ignore_open(meta);
        }
        // A gap (announcements out of order; never produced by the driver)
        // leaves unopened seqs: they pin the watermark, the safe side, but
        // hold no credit until their own announcement comes.
        while self.base_seq + (self.slots.len() as u64) < meta.id.seq {
            tracing::warn!(partition = %self.partition, seq = meta.id.seq, "batch sequence gap");
            self.slots.push_back(Slot {
                bytes: 0,
                opened_at: now,
                state: SlotState::Unopened,
            });
        }
        self.slots.push_back(Slot {
            bytes: meta.bytes,
            opened_at: now,
            state: SlotState::Pending,
        });
        self.in_flight_bytes += meta.bytes;
        self.pending += 1;
        Effect::default()
    }

    /// A batch resolved.
    pub fn resolved(&mut self, msg: &AckMsg) -> Effect {
        let ignored = Effect {
            ignored: true,
            ..Effect::default()
        };
        if msg.id.epoch != self.epoch || msg.id.partition != self.partition {
            self.stale += 1;
            return ignored;
        }
        let Some(index) = msg
            .id
            .seq
            .checked_sub(self.base_seq)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| *i < self.slots.len())
        else {
            // Already folded into the watermark, or never opened.
            self.stale += 1;
            return ignored;
        };
        if self.slots[index].state != SlotState::Pending {
            self.stale += 1;
            return ignored;
        }
        match msg.status {
            AckStatus::Failed => {
                self.failed_batches += 1;
                self.replays += 1;
                let from = self.watermark;
                let release = self.end_epoch();
                Effect {
                    release,
                    replay: Some(ReplayRequest {
                        partition: self.partition,
                        epoch: self.epoch,
                        from,
                        failed: msg.id,
                    }),
                    ignored: false,
                }
            }
            AckStatus::Delivered => {
                self.slots[index].state = SlotState::Delivered {
                    last_offset: msg.last_offset,
                };
                let mut release = Release::default();
                release.add(self.slots[index].bytes);
                self.in_flight_bytes -= self.slots[index].bytes;
                self.pending -= 1;
                while let Some(Slot {
                    state: SlotState::Delivered { last_offset },
                    ..
                }) = self.slots.front().copied()
                {
                    let next = last_offset.next();
                    if next > self.watermark {
                        self.watermark = next;
                    }
                    self.slots.pop_front();
                    self.base_seq += 1;
                }
                Effect {
                    release,
                    ..Effect::default()
                }
            }
        }
    }

    /// End the current epoch (replay, revoke, re-assign): every pending
    /// batch stops counting, later events of this epoch are stale. The
    /// watermark stays. Returns the credit still held.
    pub fn end_epoch(&mut self) -> Release {
        let mut release = Release::default();
        for slot in self.slots.drain(..) {
            if slot.state == SlotState::Pending {
                release.add(slot.bytes);
            }
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.base_seq = 0;
        self.in_flight_bytes = 0;
        self.pending = 0;
        release
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: PartitionId = PartitionId(3);

    fn meta(epoch: u32, seq: u64, first: i64, last: i64) -> BatchMeta {
        BatchMeta {
            id: BatchId {
                partition: P,
                epoch,
                seq,
            },
            first_offset: Offset(first),
            last_offset: Offset(last),
            records: (last - first + 1) as u32,
            bytes: 10,
        }
    }

    fn ack(m: &BatchMeta, status: AckStatus) -> AckMsg {
        AckMsg {
            id: m.id,
            last_offset: m.last_offset,
            status,
        }
    }

    #[test]
    fn watermark_is_the_contiguous_delivered_prefix() {
        let now = Instant::now();
        let mut t = PartitionTracker::new(P, 1, Offset(0));
        let b: Vec<_> = (0..3)
            .map(|s| meta(1, s, s as i64 * 10, s as i64 * 10 + 9))
            .collect();
        for m in &b {
            assert_eq!(t.opened(m, now), Effect::default());
        }
        t.resolved(&ack(&b[2], AckStatus::Delivered));
        assert_eq!(t.watermark(), Offset(0), "batch 0 still unresolved");
        t.resolved(&ack(&b[0], AckStatus::Delivered));
        assert_eq!(t.watermark(), Offset(10));
        let e = t.resolved(&ack(&b[1], AckStatus::Delivered));
        assert_eq!(
            e.release,
            Release {
                batches: 1,
                bytes: 10
            }
        );
        assert_eq!(t.watermark(), Offset(30));
        assert_eq!((t.tracked_batches(), t.unresolved()), (0, 0));
        assert!(
            t.resolved(&ack(&b[1], AckStatus::Delivered)).ignored,
            "duplicate"
        );
    }

    #[test]
    fn a_failure_pins_the_watermark_and_asks_for_one_replay() {
        let now = Instant::now();
        let mut t = PartitionTracker::new(P, 4, Offset(100));
        let b: Vec<_> = (0..3)
            .map(|s| meta(4, s, 100 + s as i64, 100 + s as i64))
            .collect();
        for m in &b {
            t.opened(m, now);
        }
        t.resolved(&ack(&b[0], AckStatus::Delivered));
        let e = t.resolved(&ack(&b[1], AckStatus::Failed));
        assert_eq!(
            e.replay,
            Some(ReplayRequest {
                partition: P,
                epoch: 5,
                from: Offset(101),
                failed: b[1].id
            })
        );
        assert_eq!(
            e.release,
            Release {
                batches: 2,
                bytes: 20
            },
            "b1 and b2 stop counting"
        );
        // Batch 2 of the dead epoch delivering later changes nothing.
        assert!(t.resolved(&ack(&b[2], AckStatus::Delivered)).ignored);
        assert!(t.resolved(&ack(&b[2], AckStatus::Failed)).replay.is_none());
        assert_eq!(t.watermark(), Offset(101));
        assert_eq!((t.epoch(), t.stale(), t.replays()), (5, 2, 1));
        // A stale open releases its credit at once.
        let late = t.opened(&meta(4, 3, 103, 103), now);
        assert!(late.ignored);
        assert_eq!(late.release.batches, 1);
    }

    #[test]
    fn out_of_order_announcements_release_each_credit_once() {
        let now = Instant::now();
        let mut t = PartitionTracker::new(P, 1, Offset(0));
        let (b0, b1, b2) = (meta(1, 0, 0, 9), meta(1, 1, 10, 19), meta(1, 2, 20, 29));
        // Seq 1 announced before seq 0: seq 0 pins, holding no credit yet.
        assert_eq!(t.opened(&b1, now), Effect::default());
        assert_eq!((t.unresolved(), t.in_flight_bytes()), (1, 10));
        // Its own announcement is not a duplicate: it now holds credit.
        assert_eq!(t.opened(&b0, now), Effect::default());
        assert_eq!((t.unresolved(), t.in_flight_bytes(), t.stale()), (2, 20, 0));
        let mut released = Release::default();
        for m in [&b1, &b0] {
            let e = t.resolved(&ack(m, AckStatus::Delivered));
            released.batches += e.release.batches;
            released.bytes += e.release.bytes;
        }
        assert_eq!(
            released,
            Release {
                batches: 2,
                bytes: 20
            }
        );
        assert_eq!(t.watermark(), Offset(20));
        // A gap still open when the epoch ends gives back only what was
        // announced.
        t.opened(&b2, now);
        t.opened(&meta(1, 4, 40, 49), now);
        assert_eq!(t.unresolved(), 2);
        assert_eq!(
            t.end_epoch(),
            Release {
                batches: 2,
                bytes: 20
            }
        );
        assert_eq!(t.watermark(), Offset(20));
    }
}
