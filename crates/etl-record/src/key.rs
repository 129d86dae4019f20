//! The stable identity of a record, for deduplicating replays.

use std::fmt;
use std::str::FromStr;

use crate::{Offset, ParseKeyError, PartitionId, Position, SourceId};

/// Stable identity of a record: `(source, partition, offset)`.
///
/// Replays re-deliver records with the same key, so a sink that stores it
/// (a unique column, a Kafka header) can drop or overwrite duplicates. The
/// text form is `source/partition/offset`; it parses from the right, so a
/// source name may itself contain `/`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct IdempotencyKey {
    /// The source's name.
    pub source: SourceId,
    /// The partition within the source.
    pub partition: PartitionId,
    /// The record's offset within the partition.
    pub offset: Offset,
}

impl From<Position> for IdempotencyKey {
    fn from(p: Position) -> Self {
        IdempotencyKey {
            source: p.source,
            partition: p.partition,
            offset: p.offset,
        }
    }
}

impl From<&Position> for IdempotencyKey {
    fn from(p: &Position) -> Self {
        p.clone().into()
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.source, self.partition, self.offset)
    }
}

impl FromStr for IdempotencyKey {
    type Err = ParseKeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.rsplitn(3, '/');
        let offset = parts
            .next()
            .ok_or_else(|| ParseKeyError::new(s, "missing offset"))?;
        let partition = parts
            .next()
            .ok_or_else(|| ParseKeyError::new(s, "missing partition"))?;
        let source = parts
            .next()
            .ok_or_else(|| ParseKeyError::new(s, "missing source"))?;
        let offset = offset
            .parse::<i64>()
            .map_err(|_| ParseKeyError::new(s, "offset is not an integer"))?;
        let partition = partition
            .parse::<u32>()
            .map_err(|_| ParseKeyError::new(s, "partition is not an unsigned integer"))?;
        Ok(IdempotencyKey {
            source: SourceId::new(source),
            partition: PartitionId(partition),
            offset: Offset(offset),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text_even_with_slashes_in_the_source() {
        let key = IdempotencyKey {
            source: SourceId::new("dir/file.ndjson"),
            partition: PartitionId(7),
            offset: Offset(-1),
        };
        let text = key.to_string();
        assert_eq!(text, "dir/file.ndjson/7/-1");
        assert_eq!(text.parse::<IdempotencyKey>(), Ok(key));
    }

    #[test]
    fn rejects_malformed_keys_with_the_input() {
        for bad in ["", "a", "a/b", "a/1/x", "a/-1/2", "/1"] {
            let err = bad.parse::<IdempotencyKey>().unwrap_err();
            assert_eq!(err.input(), bad);
            assert!(err.to_string().contains("source/partition/offset"));
        }
    }
}
