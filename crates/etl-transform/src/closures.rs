//! Transforms from user closures, each with an explicit outcome.
//!
//! [`map`], [`filter`] and [`flat_map`] take a closure that is `Fn` and
//! `Clone`: it keeps no state of its own between records, so the pipeline
//! gives each transform worker a clone of it and runs batches in parallel
//! (as it does for any transform that can [`fork`](Transform::fork)). A
//! closure that must keep state across records (a counter, a running
//! window) goes through [`map_mut`], [`filter_mut`] or [`flat_map_mut`],
//! which run it on one thread, one batch after another.

use std::fmt;

use etl_record::Record;

use crate::{Outcome, Transform};

/// A record a closure refused, with the reason: it goes to the dead-letter
/// path as it is here (give back the record as it came in, or as far as it
/// got, whichever the dead letter should show).
///
/// The record is boxed: a `Result<Record, Refused>` stays as small as the
/// record, and only a refusal allocates.
#[derive(Debug)]
pub struct Refused {
    record: Box<Record>,
    reason: String,
}

impl Refused {
    /// Refuse `record` for `reason`.
    pub fn new(record: Record, reason: impl Into<String>) -> Self {
        Refused {
            record: Box::new(record),
            reason: reason.into(),
        }
    }

    /// The record for the dead-letter path.
    #[must_use]
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// Why it was refused.
    #[must_use]
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The record and the reason.
    #[must_use]
    pub fn into_parts(self) -> (Record, String) {
        (*self.record, self.reason)
    }
}

impl From<Refused> for Outcome {
    fn from(refused: Refused) -> Self {
        let (record, reason) = refused.into_parts();
        Outcome::Reject(record, reason)
    }
}

/// How a closure transform makes a copy of itself for another worker:
/// `Some` for a stateless (`Fn + Clone`) closure.
type ForkFn<F> = Option<fn(&F) -> F>;

/// A transform from a closure that rewrites a record (taken by value) or
/// rejects it.
pub struct MapFn<F> {
    name: String,
    f: F,
    fork: ForkFn<F>,
}

/// Build a map transform from a stateless closure: `Ok(record)` passes the
/// record on, `Err(Refused)` sends the record it holds to the dead-letter
/// path. It runs on every transform worker.
///
/// ```
/// use etl_transform::{Refused, map};
/// use etl_record::Record;
///
/// let upper = map("upper", |mut record: Record| {
///     if record.value.is_empty() {
///         return Err(Refused::new(record, "empty value"));
///     }
///     record.value = record.value.to_ascii_uppercase().into();
///     Ok(record)
/// });
/// ```
pub fn map<F>(name: impl Into<String>, f: F) -> MapFn<F>
where
    F: Fn(Record) -> Result<Record, Refused> + Clone + Send + 'static,
{
    MapFn {
        name: name.into(),
        f,
        fork: Some(F::clone),
    }
}

/// As [`map`], for a closure that keeps state across records: it runs on
/// one thread, one batch after another, and sees every record in partition
/// order within each batch.
pub fn map_mut<F>(name: impl Into<String>, f: F) -> MapFn<F>
where
    F: FnMut(Record) -> Result<Record, Refused> + Send + 'static,
{
    MapFn {
        name: name.into(),
        f,
        fork: None,
    }
}

impl<F> Transform for MapFn<F>
where
    F: FnMut(Record) -> Result<Record, Refused> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&mut self, record: Record) -> Outcome {
        match (self.f)(record) {
            Ok(r) => Outcome::Keep(r),
            Err(refused) => refused.into(),
        }
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        let fork = self.fork?;
        Some(Box::new(MapFn {
            name: self.name.clone(),
            f: fork(&self.f),
            fork: self.fork,
        }))
    }
}

/// A transform from a predicate.
pub struct FilterFn<F> {
    name: String,
    f: F,
    fork: ForkFn<F>,
}

/// Build a filter transform from a stateless predicate: `true` keeps the
/// record, `false` drops it and counts it as filtered. It runs on every
/// transform worker.
pub fn filter<F>(name: impl Into<String>, f: F) -> FilterFn<F>
where
    F: Fn(&Record) -> bool + Clone + Send + 'static,
{
    FilterFn {
        name: name.into(),
        f,
        fork: Some(F::clone),
    }
}

/// As [`filter`], for a predicate that keeps state across records (it
/// runs on one thread).
pub fn filter_mut<F>(name: impl Into<String>, f: F) -> FilterFn<F>
where
    F: FnMut(&Record) -> bool + Send + 'static,
{
    FilterFn {
        name: name.into(),
        f,
        fork: None,
    }
}

impl<F> Transform for FilterFn<F>
where
    F: FnMut(&Record) -> bool + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&mut self, record: Record) -> Outcome {
        if (self.f)(&record) {
            Outcome::Keep(record)
        } else {
            Outcome::Filtered
        }
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        let fork = self.fork?;
        Some(Box::new(FilterFn {
            name: self.name.clone(),
            f: fork(&self.f),
            fork: self.fork,
        }))
    }
}

/// A transform from a closure that expands a record into several.
pub struct FlatMapFn<F> {
    name: String,
    f: F,
    fork: ForkFn<F>,
}

/// Build a flat-map transform from a stateless closure: `Ok(records)`
/// replaces the record (an empty list counts as filtered), `Err(Refused)`
/// sends the record it holds to the dead-letter path. Records it creates
/// keep the original's position, so they share its idempotency key. It
/// runs on every transform worker.
pub fn flat_map<F>(name: impl Into<String>, f: F) -> FlatMapFn<F>
where
    F: Fn(Record) -> Result<Vec<Record>, Refused> + Clone + Send + 'static,
{
    FlatMapFn {
        name: name.into(),
        f,
        fork: Some(F::clone),
    }
}

/// As [`flat_map`], for a closure that keeps state across records (it
/// runs on one thread).
pub fn flat_map_mut<F>(name: impl Into<String>, f: F) -> FlatMapFn<F>
where
    F: FnMut(Record) -> Result<Vec<Record>, Refused> + Send + 'static,
{
    FlatMapFn {
        name: name.into(),
        f,
        fork: None,
    }
}

impl<F> Transform for FlatMapFn<F>
where
    F: FnMut(Record) -> Result<Vec<Record>, Refused> + Send + 'static,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&mut self, record: Record) -> Outcome {
        match (self.f)(record) {
            Ok(records) => Outcome::Many(records),
            Err(refused) => refused.into(),
        }
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        let fork = self.fork?;
        Some(Box::new(FlatMapFn {
            name: self.name.clone(),
            f: fork(&self.f),
            fork: self.fork,
        }))
    }
}

macro_rules! debug_by_name {
    ($($t:ident),*) => {$(
        impl<F> fmt::Debug for $t<F> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("name", &self.name)
                    .field("forks", &self.fork.is_some())
                    .finish_non_exhaustive()
            }
        }
    )*};
}
debug_by_name!(MapFn, FilterFn, FlatMapFn);

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use etl_record::{Offset, PartitionId, Position, SourceId};

    use super::*;

    fn rec(value: &str) -> Record {
        Record::new(
            Position::new(SourceId::new("s"), PartitionId(0), Offset(0)),
            value.as_bytes().to_vec(),
        )
    }

    #[test]
    fn stateless_closures_fork_and_stateful_ones_do_not() {
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let counted = map("counted", move |r: Record| {
            seen.fetch_add(1, Ordering::Relaxed);
            Ok(r)
        });
        let mut copy = counted.fork().expect("a Fn + Clone closure forks");
        assert!(matches!(copy.apply(rec("a")), Outcome::Keep(_)));
        assert_eq!(
            calls.load(Ordering::Relaxed),
            1,
            "the copy runs the closure"
        );
        assert_eq!(copy.name(), "counted");

        assert!(filter("f", |_: &Record| true).fork().is_some());
        assert!(flat_map("fm", |r: Record| Ok(vec![r])).fork().is_some());

        let mut numbered = 0u64;
        let stateful = map_mut("numbered", move |mut r: Record| {
            numbered += 1;
            r.value = numbered.to_string().into_bytes().into();
            Ok(r)
        });
        assert!(stateful.fork().is_none());
        assert!(filter_mut("f", |_: &Record| true).fork().is_none());
        assert!(flat_map_mut("fm", |r: Record| Ok(vec![r])).fork().is_none());
    }

    #[test]
    fn a_rejected_record_goes_to_the_dead_letter_path_as_given_back() {
        let mut t = map("refuse", |mut r: Record| {
            r.value = b"changed".to_vec().into();
            Err(Refused::new(r, "no"))
        });
        match t.apply(rec("a")) {
            Outcome::Reject(r, reason) => {
                assert_eq!(&r.value[..], b"changed");
                assert_eq!(reason, "no");
            }
            other => panic!("{other:?}"),
        }
    }
}
