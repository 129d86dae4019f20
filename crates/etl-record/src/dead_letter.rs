//! A record that could not be processed, with the reason.

use std::fmt;

use crate::Record;

/// A record set aside instead of delivered: bad input (invalid UTF-8, an
/// oversized line), a poison record that failed every replay, or a row a
/// sink rejected. Writing it to the dead-letter sink counts as delivering
/// it; it is never dropped silently.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeadLetter {
    /// The record as read (its position says where it came from).
    pub record: Record,
    /// Why it was set aside, for a human: names the stage and the cause.
    pub reason: String,
}

impl DeadLetter {
    /// A dead letter from a record and a reason.
    #[must_use]
    pub fn new(record: Record, reason: impl Into<String>) -> Self {
        DeadLetter {
            record,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for DeadLetter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "record {} dead-lettered: {}",
            self.record.idempotency_key(),
            self.reason
        )
    }
}
