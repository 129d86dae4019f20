//! Transforms from user closures, each with an explicit outcome.

use std::fmt;

use etl_record::Record;

use super::{Outcome, Transform};

/// A transform from a closure that rewrites a record or rejects it.
pub struct MapFn<F> {
    name: String,
    f: F,
}

/// Build a map transform: `Ok(record)` passes it on, `Err(reason)` sends
/// the original record to the dead-letter path.
pub fn map<F>(name: impl Into<String>, f: F) -> MapFn<F>
where
    F: FnMut(&Record) -> Result<Record, String> + Send,
{
    MapFn {
        name: name.into(),
        f,
    }
}

impl<F> Transform for MapFn<F>
where
    F: FnMut(&Record) -> Result<Record, String> + Send,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&mut self, record: Record) -> Outcome {
        match (self.f)(&record) {
            Ok(r) => Outcome::Keep(r),
            Err(reason) => Outcome::Reject(record, reason),
        }
    }
}

/// A transform from a predicate.
pub struct FilterFn<F> {
    name: String,
    f: F,
}

/// Build a filter transform: `true` keeps the record, `false` drops it and
/// counts it as filtered.
pub fn filter<F>(name: impl Into<String>, f: F) -> FilterFn<F>
where
    F: FnMut(&Record) -> bool + Send,
{
    FilterFn {
        name: name.into(),
        f,
    }
}

impl<F> Transform for FilterFn<F>
where
    F: FnMut(&Record) -> bool + Send,
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
}

/// A transform from a closure that expands a record into several.
pub struct FlatMapFn<F> {
    name: String,
    f: F,
}

/// Build a flat-map transform: `Ok(records)` replaces the record (an empty
/// list counts as filtered), `Err(reason)` sends it to the dead-letter
/// path. Records it creates keep the original's position, so they share
/// its idempotency key.
pub fn flat_map<F>(name: impl Into<String>, f: F) -> FlatMapFn<F>
where
    F: FnMut(&Record) -> Result<Vec<Record>, String> + Send,
{
    FlatMapFn {
        name: name.into(),
        f,
    }
}

impl<F> Transform for FlatMapFn<F>
where
    F: FnMut(&Record) -> Result<Vec<Record>, String> + Send,
{
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&mut self, record: Record) -> Outcome {
        match (self.f)(&record) {
            Ok(records) => Outcome::Many(records),
            Err(reason) => Outcome::Reject(record, reason),
        }
    }
}

macro_rules! debug_by_name {
    ($($t:ident),*) => {$(
        impl<F> fmt::Debug for $t<F> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t)).field("name", &self.name).finish_non_exhaustive()
            }
        }
    )*};
}
debug_by_name!(MapFn, FilterFn, FlatMapFn);
