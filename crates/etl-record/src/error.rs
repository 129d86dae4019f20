//! The crate's error type.

use std::fmt;

/// An [`IdempotencyKey`](crate::IdempotencyKey) could not be parsed from
/// its text form `source/partition/offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseKeyError {
    input: String,
    reason: &'static str,
}

impl ParseKeyError {
    pub(crate) fn new(input: &str, reason: &'static str) -> Self {
        ParseKeyError {
            input: input.to_owned(),
            reason,
        }
    }

    /// The text that failed to parse.
    #[must_use]
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for ParseKeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid idempotency key {:?}: {} (expected source/partition/offset)",
            self.input, self.reason
        )
    }
}

impl std::error::Error for ParseKeyError {}
