//! The record itself.

use std::sync::Arc;

use bytes::Bytes;

use crate::{Headers, IdempotencyKey, Position};

/// Milliseconds since the Unix epoch, as Kafka stores record timestamps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Timestamp(pub i64);

/// One record read from a source.
///
/// Key, value and header values are [`Bytes`], so cloning a record (for
/// fan-out to several sinks) shares the buffers instead of copying them.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Record {
    /// Optional key (a Kafka message key).
    pub key: Option<Bytes>,
    /// The payload.
    pub value: Bytes,
    /// Headers, in order.
    pub headers: Headers,
    /// When the record was produced, if the source knows.
    pub timestamp: Option<Timestamp>,
    /// Where the record was read.
    pub position: Position,
    /// The topic (or stream) it was read from, for a source that reads
    /// several under one name: a Kafka source sets the record's topic.
    /// Shared by the records of one topic, not copied.
    pub topic: Option<Arc<str>>,
}

impl Record {
    /// A record with a value and no key, headers or timestamp.
    #[must_use]
    pub fn new(position: Position, value: impl Into<Bytes>) -> Self {
        Record {
            key: None,
            value: value.into(),
            headers: Headers::new(),
            timestamp: None,
            position,
            topic: None,
        }
    }

    /// Set the key.
    #[must_use]
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Append a header.
    #[must_use]
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push(key, Some(value.into()));
        self
    }

    /// Set the timestamp.
    #[must_use]
    pub fn with_timestamp(mut self, timestamp: Timestamp) -> Self {
        self.timestamp = Some(timestamp);
        self
    }

    /// The record's stable identity, `(source, partition, offset)`.
    #[must_use]
    pub fn idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey::from(&self.position)
    }

    /// Payload bytes (key, value and headers) for in-flight accounting.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.key.as_ref().map_or(0, Bytes::len) + self.value.len() + self.headers.byte_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Offset, PartitionId, SourceId};

    #[test]
    fn byte_len_counts_key_value_and_headers() {
        let r = Record::new(
            Position::new(SourceId::new("s"), PartitionId(0), Offset(0)),
            &b"value"[..],
        )
        .with_key(&b"k"[..])
        .with_header("h", &b"vv"[..]);
        assert_eq!(r.byte_len(), 1 + 5 + 1 + 2);
    }

    #[test]
    fn clones_share_the_payload() {
        let r = Record::new(Position::default(), vec![1u8; 1024]);
        let c = r.clone();
        assert_eq!(r.value.as_ptr(), c.value.as_ptr());
    }

    #[cfg(feature = "serde")]
    #[test]
    fn serde_round_trip() {
        let r = Record::new(
            Position::new(SourceId::new("s"), PartitionId(1), Offset(2)),
            &b"v"[..],
        )
        .with_timestamp(Timestamp(5));
        let json = serde_json::to_string(&r).unwrap();
        let back: Record = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
    }
}
