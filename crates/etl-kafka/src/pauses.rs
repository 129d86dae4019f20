//! The pipeline's pauses, as librdkafka sees them: late, or never.
//!
//! librdkafka drops what it prefetched for a partition when the partition
//! is paused, and again when it is resumed (each bumps the partition's
//! fetch version), then fetches it all again from the last message
//! consumed. The pipeline pauses a partition whenever its in-flight limit
//! is reached, typically for one sink write (a few to tens of
//! milliseconds), hundreds of times a run: the fetch thread then read the
//! same messages one and a half to two times (`docs/benchmarks.md`). So
//! the poll thread holds a paused partition's records back itself (see
//! [`Held`](crate::context::Held)) and tells librdkafka only once the
//! pause has lasted [`PAUSE_GRACE`]; a pause lifted before then never
//! reaches it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use etl_record::PartitionId;

/// How long a pipeline's pause lasts before librdkafka is told. The
/// pauses measured on the Kafka bench's filter row lasted 0.1-45 ms
/// (one sink write and sync each); the records read meanwhile count
/// toward the source's `max_buffered_records` like any others.
pub(crate) const PAUSE_GRACE: Duration = Duration::from_millis(100);

/// Which partitions the pipeline paused, and which of those librdkafka
/// has paused for it.
#[derive(Debug, Default)]
pub(crate) struct Pauses {
    /// Asked by the pipeline, not yet passed to librdkafka: since when.
    pending: BTreeMap<PartitionId, Instant>,
    /// Paused in librdkafka.
    applied: BTreeSet<PartitionId>,
}

impl Pauses {
    /// The pipeline paused `ids` at `now`.
    pub(crate) fn ask(&mut self, ids: &[PartitionId], now: Instant) {
        for id in ids {
            if !self.applied.contains(id) {
                self.pending.entry(*id).or_insert(now);
            }
        }
    }

    /// The pauses to pass to librdkafka at `now`: those asked at least
    /// `grace` ago that the pipeline still holds (`still`); they count as
    /// applied from here. A pause the pipeline no longer holds without
    /// having lifted it (a new assignment cleared it, and resumed the
    /// partition in librdkafka) is forgotten, pending or applied, so the
    /// next pause of that partition reaches librdkafka again once it
    /// lasts.
    pub(crate) fn due(
        &mut self,
        now: Instant,
        grace: Duration,
        still: impl Fn(PartitionId) -> bool,
    ) -> Vec<PartitionId> {
        self.applied.retain(|id| still(*id));
        if self.pending.is_empty() {
            return Vec::new();
        }
        let mut due = Vec::new();
        self.pending.retain(|id, since| {
            if !still(*id) {
                return false;
            }
            if now.saturating_duration_since(*since) < grace {
                return true;
            }
            due.push(*id);
            false
        });
        self.applied.extend(due.iter().copied());
        due
    }

    /// The pipeline resumed `ids`: those librdkafka has paused for it,
    /// which it must now resume (the others it never heard of).
    pub(crate) fn lift(&mut self, ids: &[PartitionId]) -> Vec<PartitionId> {
        ids.iter()
            .filter(|id| {
                self.pending.remove(id);
                self.applied.remove(id)
            })
            .copied()
            .collect()
    }

    /// librdkafka paused every assigned partition (backpressure): the
    /// pending pauses are applied too.
    pub(crate) fn all_paused(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        self.applied.extend(pending.into_keys());
    }

    /// Pauses asked and not yet passed to librdkafka.
    pub(crate) fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: PartitionId = PartitionId(1);
    const Q: PartitionId = PartitionId(2);
    const GRACE: Duration = Duration::from_millis(100);

    #[test]
    fn a_pause_lifted_within_the_grace_never_reaches_librdkafka() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        pauses.ask(&[P], t0);
        assert!(pauses.due(t0 + GRACE / 2, GRACE, |_| true).is_empty());
        assert!(pauses.lift(&[P]).is_empty());
        assert!(pauses.due(t0 + GRACE * 2, GRACE, |_| true).is_empty());
        assert_eq!(pauses.pending(), 0);
    }

    #[test]
    fn a_pause_that_lasts_the_grace_is_applied_once_and_lifted_once() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        pauses.ask(&[P, Q], t0);
        // Asked again later: the first ask's time counts.
        pauses.ask(&[P], t0 + GRACE / 2);
        assert_eq!(pauses.due(t0 + GRACE, GRACE, |_| true), [P, Q]);
        assert!(pauses.due(t0 + GRACE * 3, GRACE, |_| true).is_empty());
        // Asked again while applied: nothing new to tell librdkafka.
        pauses.ask(&[P], t0 + GRACE * 3);
        assert!(pauses.due(t0 + GRACE * 5, GRACE, |_| true).is_empty());
        assert_eq!(pauses.lift(&[P]), [P]);
        assert!(pauses.lift(&[P]).is_empty());
        assert_eq!(pauses.lift(&[Q]), [Q]);
    }

    #[test]
    fn a_pending_pause_the_pipeline_no_longer_holds_is_forgotten() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        pauses.ask(&[P, Q], t0);
        assert_eq!(pauses.due(t0 + GRACE, GRACE, |id| id == Q), [Q]);
        assert_eq!(pauses.pending(), 0);
        assert!(pauses.lift(&[P]).is_empty());
    }

    /// A partition paused in librdkafka and then revoked (the pipeline
    /// sends no resume for a partition no longer its own) and assigned
    /// anew: `post_rebalance` clears the pipeline's pause and resumes it in
    /// librdkafka, so a later pause of the new assignment that lasts must
    /// reach librdkafka again; remembered as still applied, it never does
    /// and the poll thread holds the partition's records until
    /// backpressure pauses the whole assignment.
    #[test]
    fn a_pause_after_the_partition_is_assigned_anew_reaches_librdkafka_once_it_lasts() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        pauses.ask(&[P], t0);
        assert_eq!(pauses.due(t0 + GRACE, GRACE, |_| true), [P]);
        // Revoked and assigned anew: the pipeline no longer holds the pause
        // (`GroupContext::paused` cleared, librdkafka resumed), no lift.
        assert!(pauses.due(t0 + GRACE * 2, GRACE, |_| false).is_empty());
        // The pipeline pauses it again, for longer than the grace.
        pauses.ask(&[P], t0 + GRACE * 3);
        assert_eq!(
            pauses.due(t0 + GRACE * 5, GRACE, |_| true),
            [P],
            "the new pause never reaches librdkafka"
        );
    }

    #[test]
    fn backpressure_applies_the_pending_pauses_so_their_resume_reaches_librdkafka() {
        let mut pauses = Pauses::default();
        let t0 = Instant::now();
        pauses.ask(&[P], t0);
        pauses.all_paused();
        assert_eq!(pauses.pending(), 0);
        assert!(pauses.due(t0 + GRACE, GRACE, |_| true).is_empty());
        assert_eq!(pauses.lift(&[P]), [P]);
    }
}
