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
///
/// An idle partition (nothing of its current epoch past the watermark)
/// holds no heap memory, so a checkpointer can track a great many of them
/// (a file source has a partition per input file): the batches past the
/// watermark live in a window allocated when the first one opens and
/// dropped when the last one folds in, and the failure and stale counts
/// are allocated at their first event.
#[derive(Debug)]
pub struct PartitionTracker {
    partition: PartitionId,
    epoch: u32,
    watermark: Offset,
    base_seq: u64,
    /// The batches of the current epoch past the watermark; `None` when
    /// there are none.
    window: Option<Box<Window>>,
    /// Failures, replays and stale events; `None` while all are zero.
    counts: Option<Box<Counts>>,
}

/// The batches of a partition's current epoch past its watermark.
#[derive(Debug, Default)]
struct Window {
    /// Indexed by `seq - base_seq`; never empty while the window exists.
    slots: VecDeque<Slot>,
    in_flight_bytes: u64,
    /// Pending slots, kept as a count so revoke and shutdown checks are
    /// O(1).
    pending: usize,
}

/// Counts that stay zero on a healthy partition.
#[derive(Debug, Default)]
struct Counts {
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
            window: None,
            counts: None,
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
        self.window.as_ref().map_or(0, |w| w.slots.len())
    }

    /// Unresolved batches of the current epoch: the ones holding credit.
    #[must_use]
    pub fn unresolved(&self) -> usize {
        self.window.as_ref().map_or(0, |w| w.pending)
    }

    /// Payload bytes of unresolved batches.
    #[must_use]
    pub fn in_flight_bytes(&self) -> u64 {
        self.window.as_ref().map_or(0, |w| w.in_flight_bytes)
    }

    /// When the oldest unresolved batch was opened.
    #[must_use]
    pub fn oldest_unresolved(&self) -> Option<Instant> {
        // The delivered prefix is always folded away, so the front slot,
        // if any, is the lowest unresolved seq, opened first.
        let window = self.window.as_ref()?;
        window.slots.front().map(|s| s.opened_at)
    }

    /// Failed batches seen (current and earlier epochs of this tracker).
    #[must_use]
    pub fn failed_batches(&self) -> u64 {
        self.counts.as_ref().map_or(0, |c| c.failed_batches)
    }

    /// Replays requested.
    #[must_use]
    pub fn replays(&self) -> u64 {
        self.counts.as_ref().map_or(0, |c| c.replays)
    }

    /// Stale or duplicate events discarded.
    #[must_use]
    pub fn stale(&self) -> u64 {
        self.counts.as_ref().map_or(0, |c| c.stale)
    }

    /// An announcement that changes nothing (stale epoch, duplicate): count
    /// it and give back the credit reserved for it.
    fn ignore_open(&mut self, meta: &BatchMeta) -> Effect {
        self.counts().stale += 1;
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
        let expected = self.base_seq + self.tracked_batches() as u64;
        let gap = meta
            .id
            .seq
            .checked_sub(self.base_seq)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| {
                self.window
                    .as_ref()
                    .and_then(|w| w.slots.get(*i))
                    .is_some_and(|s| s.state == SlotState::Unopened)
            });
        if gap.is_none() && meta.id.seq < expected {
            // A duplicate announcement: the batch is already known. Every
            // announcement follows its own reservation, so give it back.
            return self.ignore_open(meta);
        }
        let window = self.window.get_or_insert_with(Box::default);
        let slot = Slot {
            bytes: meta.bytes,
            opened_at: now,
            state: SlotState::Pending,
        };
        if let Some(index) = gap {
            // The announcement of a seq skipped earlier: it holds credit
            // from now on, like any batch.
            window.slots[index] = slot;
        } else {
            // A gap (announcements out of order; never produced by the
            // driver) leaves unopened seqs: they pin the watermark, the
            // safe side, but hold no credit until their own announcement
            // comes.
            while self.base_seq + (window.slots.len() as u64) < meta.id.seq {
                tracing::warn!(partition = %self.partition, seq = meta.id.seq, "batch sequence gap");
                window.slots.push_back(Slot {
                    bytes: 0,
                    opened_at: now,
                    state: SlotState::Unopened,
                });
            }
            window.slots.push_back(slot);
        }
        window.in_flight_bytes += meta.bytes;
        window.pending += 1;
        Effect::default()
    }

    /// A batch resolved.
    pub fn resolved(&mut self, msg: &AckMsg) -> Effect {
        let ignored = Effect {
            ignored: true,
            ..Effect::default()
        };
        if msg.id.epoch != self.epoch || msg.id.partition != self.partition {
            self.counts().stale += 1;
            return ignored;
        }
        let Some((window, index)) = self.window.as_mut().and_then(|w| {
            let index = msg
                .id
                .seq
                .checked_sub(self.base_seq)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|i| *i < w.slots.len())?;
            Some((w, index))
        }) else {
            // Already folded into the watermark, or never opened.
            self.counts().stale += 1;
            return ignored;
        };
        if window.slots[index].state != SlotState::Pending {
            self.counts().stale += 1;
            return ignored;
        }
        match msg.status {
            AckStatus::Failed => {
                let counts = self.counts();
                counts.failed_batches += 1;
                counts.replays += 1;
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
                window.slots[index].state = SlotState::Delivered {
                    last_offset: msg.last_offset,
                };
                let mut release = Release::default();
                release.add(window.slots[index].bytes);
                window.in_flight_bytes -= window.slots[index].bytes;
                window.pending -= 1;
                while let Some(Slot {
                    state: SlotState::Delivered { last_offset },
                    ..
                }) = window.slots.front().copied()
                {
                    let next = last_offset.next();
                    if next > self.watermark {
                        self.watermark = next;
                    }
                    window.slots.pop_front();
                    self.base_seq += 1;
                }
                if window.slots.is_empty() {
                    // Everything folded in: the partition is idle again.
                    self.window = None;
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
        if let Some(window) = self.window.take() {
            for slot in window.slots {
                if slot.state == SlotState::Pending {
                    release.add(slot.bytes);
                }
            }
        }
        self.epoch = self.epoch.wrapping_add(1);
        self.base_seq = 0;
        release
    }

    /// The counts, allocated at their first event.
    fn counts(&mut self) -> &mut Counts {
        self.counts.get_or_insert_with(Box::default)
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
    fn an_idle_partition_holds_no_window_and_no_counts() {
        let now = Instant::now();
        let mut t = PartitionTracker::new(P, 1, Offset(0));
        let (b0, b1) = (meta(1, 0, 0, 9), meta(1, 1, 10, 19));
        t.opened(&b0, now);
        t.opened(&b1, now);
        t.resolved(&ack(&b1, AckStatus::Delivered));
        assert!(t.window.is_some(), "batch 0 still pins");
        t.resolved(&ack(&b0, AckStatus::Delivered));
        assert!(t.window.is_none() && t.counts.is_none(), "{t:?}");
        assert_eq!(
            (t.watermark(), t.unresolved(), t.in_flight_bytes()),
            (Offset(20), 0, 0)
        );
        // The next batch follows on, as before the window went.
        let b2 = meta(1, 2, 20, 29);
        assert_eq!(t.opened(&b2, now), Effect::default());
        assert!(t.opened(&b1, now).ignored, "an old seq is a duplicate");
        t.resolved(&ack(&b2, AckStatus::Delivered));
        assert_eq!(t.watermark(), Offset(30));
        // A stale event counts, and only then allocates the counts; an
        // ended epoch leaves no window behind.
        t.opened(&meta(1, 3, 30, 39), now);
        assert_eq!(t.end_epoch().batches, 1);
        assert!(t.window.is_none());
        assert!(t.resolved(&ack(&b2, AckStatus::Delivered)).ignored);
        assert_eq!(t.stale(), 2);
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
