//! The file source's NDJSON line check, reachable by the fuzz targets in
//! `fuzz/` (feature `fuzzing`; not a stable interface).

use crate::ndjson_check::{self, Verdict};

/// What the line check says of a line: "surely one JSON value" (with or
/// without every byte ASCII) or "not sure" (serde_json then decides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineVerdict {
    /// Surely one JSON value, and every byte ASCII (so UTF-8 too).
    AsciiValue,
    /// Surely one JSON value once the line is known to be UTF-8 (the
    /// reader's UTF-8 check refuses any other first).
    Value,
    /// Not sure, never "invalid": serde_json decides.
    NotSure,
}

/// The check the file source runs on an NDJSON line (without its
/// newline) before serde_json's: it never says "surely one value" of a
/// line `serde_json::from_slice::<serde::de::IgnoredAny>` refuses (a
/// line that is UTF-8, for [`LineVerdict::Value`]), and says
/// [`LineVerdict::AsciiValue`] exactly when it is sure and every byte is
/// ASCII.
#[must_use]
pub fn check_line(line: &[u8]) -> LineVerdict {
    match ndjson_check::check_line(line) {
        Verdict::AsciiValue => LineVerdict::AsciiValue,
        Verdict::Value => LineVerdict::Value,
        Verdict::NotSure => LineVerdict::NotSure,
    }
}
