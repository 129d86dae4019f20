//! Where a record comes from: source, partition, offset.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Identifier of one partition of a source (a Kafka partition, one input
/// file). Stable across restarts: offsets are stored under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct PartitionId(pub u32);

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Position of a record within its partition. Offsets increase with the
/// order of records in a partition but need not be dense (a file source
/// uses byte positions of line starts).
///
/// The committed offset of a partition is the offset of the *next* record
/// to read: after delivering the record at `o`, the partition may commit
/// [`o.next()`](Offset::next).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Offset(pub i64);

/// An offset per partition: what a store has committed, what a sink has
/// stored, where partitions start. The one type for "offset by partition"
/// across the workspace (offset stores, [`Source::commit`], sink progress,
/// start positions, progress reports); what the offset of each entry means
/// is said where it is used (for committed offsets and sink progress: the
/// next offset to read).
///
/// [`Source::commit`]: https://docs.rs/etl-source/latest/etl_source/trait.Source.html#method.commit
pub type PartitionOffsets = std::collections::BTreeMap<PartitionId, Offset>;

impl Offset {
    /// The offset right after this one: what a partition commits once the
    /// record at `self` is delivered.
    #[must_use]
    pub const fn next(self) -> Offset {
        Offset(self.0.saturating_add(1))
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<i64> for Offset {
    fn from(value: i64) -> Self {
        Offset(value)
    }
}

/// Name of a source, shared by every record it produces. Cloning it is
/// copying a pointer: names are interned, each distinct name stored once
/// for the life of the process.
///
/// Every record carries one, and records are made on one thread and
/// dropped on others: a reference count here (as in an `Arc<str>`) was one
/// contended atomic increment and decrement per record. The price is that
/// a name, once made, is never freed; a process makes a handful (its
/// sources, and those named in what it reads back), not one per record.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceId(&'static str);

/// The names made so far.
fn interned() -> &'static Mutex<HashSet<&'static str>> {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    NAMES.get_or_init(|| Mutex::new(HashSet::new()))
}

impl SourceId {
    /// A source name. Any text is allowed; it is part of every record's
    /// [`IdempotencyKey`](crate::IdempotencyKey). Making one takes a
    /// global lock (the name is interned); cloning one does not.
    #[must_use]
    pub fn new(name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        let mut names = interned().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = names.get(name) {
            return SourceId(known);
        }
        let leaked: &'static str = Box::leak(Box::from(name));
        names.insert(leaked);
        SourceId(leaked)
    }

    /// The name as text.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl fmt::Debug for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl From<&str> for SourceId {
    fn from(value: &str) -> Self {
        SourceId::new(value)
    }
}

impl Default for SourceId {
    /// The empty name, made without the names' lock: a record taken out
    /// of its place in a batch leaves a default one behind, once per
    /// record and transform. Names compare by their text, so it equals
    /// `SourceId::new("")`.
    fn default() -> Self {
        SourceId("")
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for SourceId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for SourceId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(SourceId::new(name))
    }
}

/// Where a record was read: source, partition and offset.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Position {
    /// The source that produced the record.
    pub source: SourceId,
    /// The partition within the source.
    pub partition: PartitionId,
    /// The record's offset within the partition.
    pub offset: Offset,
}

impl Position {
    /// A position from its parts.
    #[must_use]
    pub fn new(source: SourceId, partition: PartitionId, offset: Offset) -> Self {
        Position {
            source,
            partition,
            offset,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_offset_saturates() {
        assert_eq!(Offset(1).next(), Offset(2));
        assert_eq!(Offset(i64::MAX).next(), Offset(i64::MAX));
    }

    #[test]
    fn source_ids_compare_by_name() {
        assert_eq!(SourceId::new("a"), SourceId::from("a"));
        assert!(SourceId::new("a") < SourceId::new("b"));
        assert_eq!(format!("{:?}", SourceId::new("a")), "\"a\"");
    }

    #[test]
    fn a_default_source_id_takes_no_lock() {
        // A record taken out of its place in a batch leaves a default one
        // behind, once per record and transform: that must not queue on
        // the names' lock, held here by another thread all along.
        let names = interned().lock().unwrap_or_else(PoisonError::into_inner);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let id = SourceId::default();
            let _ = tx.send(id);
        });
        let made = rx.recv_timeout(std::time::Duration::from_secs(30));
        drop(names);
        assert_eq!(
            made.expect("made while the lock was held"),
            SourceId::new("")
        );
    }

    #[test]
    fn a_name_is_stored_once() {
        let a = SourceId::new(String::from("interned"));
        let b = SourceId::new("interned");
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_ne!(SourceId::new("interned-other"), a);
    }
}
