//! Batch vectors kept for reuse between the end of a pipeline and its
//! start.
//!
//! A batch's vector of records is large (160 bytes a record, hundreds of
//! KiB a batch): allocated fresh per batch, it is a mapping of its own
//! that the first write to each page faults in, and freeing it unmaps it
//! again. Measured on the transform benchmark's jobs (file to file, 90
//! and 400 byte records), reusing them took the page faults from 140k to
//! 20-30k and from 47k to 19k, and the CPU time down by 5% and 11%.
//! A sink gives an upstream batch's vector back with [`give_back`] once
//! it has gathered its records into a batch of its own (the vector of a
//! batch it wrote, it keeps for its next one); a source takes its next
//! batch's vector with [`records`].
//!
//! ```
//! use etl_record::{Offset, PartitionId, Position, Record, SourceId, reuse};
//!
//! let mut batch = reuse::records(2);
//! let at = Position::new(SourceId::new("doc"), PartitionId(0), Offset(0));
//! batch.push(Record::new(at, &b"{}"[..]));
//! // ... the batch is transformed and written ...
//! reuse::give_back(batch);
//! // The next batch may reuse its allocation.
//! assert!(reuse::records(2).capacity() >= 2);
//! ```

use std::mem;
use std::sync::{Mutex, PoisonError};

use crate::Record;

/// Bytes of spare vectors kept at most; a vector given back beyond it
/// is freed.
const SPARE_BYTES: usize = 8 << 20;

/// Spare vectors kept at most (a lookup goes through them).
const SPARE_VECTORS: usize = 64;

/// Spare vectors, empty, and the bytes their allocations hold.
static SPARE: Mutex<(Vec<Vec<Record>>, usize)> = Mutex::new((Vec::new(), 0));

fn bytes_of(records: &Vec<Record>) -> usize {
    records.capacity() * mem::size_of::<Record>()
}

/// Records a vector handed out for a small batch may have room for (see
/// [`records`]).
const SMALL_BATCH: usize = 1024;

/// An empty vector with room for at least `capacity` records: one given
/// back with [`give_back`] when there is one of about that size (the
/// smallest with room enough), else a new one.
///
/// "About that size" is at most four times `capacity` (or than 1024
/// records, for a smaller batch): a vector a sink grew by merging batches
/// is not handed to a small batch, where it would sit in flight holding
/// far more memory than the batch's records (the in-flight limits count
/// records, not the vectors around them).
#[must_use]
pub fn records(capacity: usize) -> Vec<Record> {
    let largest = capacity.max(SMALL_BATCH).saturating_mul(4);
    let spare = {
        let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
        // The smallest with room enough (a larger one stays for a larger
        // batch: a sink's, merging several), else the latest not too
        // large (it grows: a new allocation all the same).
        let fits = |v: &Vec<Record>| v.capacity() <= largest;
        let found = spare
            .0
            .iter()
            .enumerate()
            .filter(|(_, v)| fits(v) && v.capacity() >= capacity)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)
            .or_else(|| spare.0.iter().rposition(fits))
            .map(|i| spare.0.swap_remove(i));
        if let Some(v) = &found {
            spare.1 -= bytes_of(v);
        }
        found
    };
    let mut records = spare.unwrap_or_default();
    records.reserve(capacity);
    records
}

/// An empty vector with room for `capacity` records and for at most
/// `at_most`: the smallest given back with [`give_back`] in those bounds,
/// else a new one of `capacity`. For a batch whose room is already
/// chosen: one larger than `at_most` would sit in flight holding more
/// memory than the in-flight limits count.
#[must_use]
pub fn records_within(capacity: usize, at_most: usize) -> Vec<Record> {
    let spare = {
        let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
        let found = spare
            .0
            .iter()
            .enumerate()
            .filter(|(_, v)| (capacity..=at_most).contains(&v.capacity()))
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i)
            .map(|i| spare.0.swap_remove(i));
        if let Some(v) = &found {
            spare.1 -= bytes_of(v);
        }
        found
    };
    spare.unwrap_or_else(|| Vec::with_capacity(capacity))
}

/// Drop `records`' records and keep its allocation for a later
/// [`records`], within a bound on the bytes kept (8 MiB) and on the
/// vectors kept (64); beyond it the vector is freed.
pub fn give_back(mut records: Vec<Record>) {
    // Records are dropped outside the lock: dropping one can release a
    // buffer it points into.
    records.clear();
    let bytes = bytes_of(&records);
    if bytes == 0 {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
    if spare.1 + bytes <= SPARE_BYTES && spare.0.len() < SPARE_VECTORS {
        spare.1 += bytes;
        spare.0.push(records);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Offset, PartitionId, Position, SourceId};

    #[test]
    fn a_vector_given_back_is_handed_out_again_empty_and_the_bound_holds() {
        let at = Position::new(SourceId::new("reuse"), PartitionId(0), Offset(0));
        let mut batch = records(100);
        assert!(batch.capacity() >= 100);
        for _ in 0..10 {
            batch.push(Record::new(at.clone(), &b"x"[..]));
        }
        give_back(batch);
        // Other tests may take it first; whatever comes back is empty.
        let again = records(10);
        assert!(again.is_empty() && again.capacity() >= 10);
        give_back(again);
        // Far too large to keep: freed, and the count stays in bound.
        give_back(Vec::with_capacity(
            SPARE_BYTES / mem::size_of::<Record>() + 1,
        ));
        let spare = SPARE.lock().unwrap();
        assert!(spare.1 <= SPARE_BYTES && spare.0.len() <= SPARE_VECTORS);
        assert_eq!(spare.1, spare.0.iter().map(bytes_of).sum::<usize>());
    }

    #[test]
    fn a_vector_with_room_enough_is_handed_out_before_a_later_smaller_one() {
        let roomy: Vec<Record> = Vec::with_capacity(3 * SMALL_BATCH);
        let at = roomy.as_ptr();
        give_back(roomy);
        give_back(Vec::with_capacity(SMALL_BATCH));
        // Other tests may take it first: then it is not handed out here.
        let taken = records(2 * SMALL_BATCH);
        assert!(taken.capacity() >= 2 * SMALL_BATCH);
        let spare = SPARE.lock().unwrap();
        let still_kept = spare.0.iter().any(|v| v.as_ptr() == at);
        assert!(
            taken.as_ptr() == at || !still_kept,
            "the vector with room was passed over for a smaller one"
        );
    }

    #[test]
    fn the_smallest_vector_with_room_enough_is_handed_out() {
        // Sizes no other test gives back.
        let roomy: Vec<Record> = Vec::with_capacity(3 * SMALL_BATCH + 3);
        let tight: Vec<Record> = Vec::with_capacity(2 * SMALL_BATCH + 3);
        let (roomy_at, tight_at) = (roomy.as_ptr(), tight.as_ptr());
        give_back(tight);
        give_back(roomy);
        // Other tests may take it first: then it is not handed out here.
        let taken = records(2 * SMALL_BATCH + 1);
        let spare = SPARE.lock().unwrap();
        let still_kept = |at| spare.0.iter().any(|v| v.as_ptr() == at);
        assert!(
            taken.as_ptr() == tight_at || !still_kept(tight_at),
            "the vector that fits was passed over"
        );
        assert!(taken.as_ptr() != roomy_at || !still_kept(tight_at));
    }

    #[test]
    fn a_vector_within_bounds_or_a_new_one_of_the_room_asked() {
        // Sizes no other test gives back.
        give_back(Vec::with_capacity(5 * SMALL_BATCH + 5));
        let within = records_within(5 * SMALL_BATCH + 1, 5 * SMALL_BATCH + 2);
        assert_eq!(
            within.capacity(),
            5 * SMALL_BATCH + 1,
            "a new one: none fits"
        );
        let fits: Vec<Record> = Vec::with_capacity(6 * SMALL_BATCH + 5);
        let at = fits.as_ptr();
        give_back(fits);
        let taken = records_within(6 * SMALL_BATCH, 7 * SMALL_BATCH);
        let kept = SPARE.lock().unwrap().0.iter().any(|v| v.as_ptr() == at);
        assert!(
            taken.as_ptr() == at || !kept,
            "the one within bounds was passed over"
        );
        assert!((6 * SMALL_BATCH..=7 * SMALL_BATCH).contains(&taken.capacity()));
    }

    #[test]
    fn a_small_batch_is_not_handed_a_vector_a_sink_grew() {
        give_back(Vec::with_capacity(16 * SMALL_BATCH));
        for _ in 0..8 {
            assert!(records(10).capacity() <= 4 * SMALL_BATCH);
        }
    }
}
