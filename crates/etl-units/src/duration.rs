//! Durations as `"500ms"`, `"10s"`, `"2m"`, at most [`MAX_DURATION`].

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The longest duration accepted anywhere in a configuration. Longer ones
/// are typos or units mixed up, and some would overflow a clock when
/// added to the current time.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Why a text is not a duration. Its message quotes the text and shows
/// the expected form.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a number with a unit.
    Invalid {
        /// The text read.
        text: String,
        /// What `humantime` found wrong.
        source: humantime::DurationError,
    },
    /// Longer than [`MAX_DURATION`].
    OutOfRange {
        /// The text read.
        text: String,
    },
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Invalid { text, source } => write!(
                f,
                "invalid duration {text:?}: {source} (write e.g. \"500ms\", \"10s\", \"2m\")"
            ),
            DurationError::OutOfRange { text } => {
                write!(f, "duration {text:?} is out of range: at most 365 days")
            }
        }
    }
}

impl std::error::Error for DurationError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DurationError::Invalid { source, .. } => Some(source),
            DurationError::OutOfRange { .. } => None,
        }
    }
}

/// Parse a duration written as `"1s"`, `"250ms"`, `"2m 30s"`, at most
/// [`MAX_DURATION`].
///
/// # Errors
///
/// [`DurationError`], quoting the text and showing the expected form.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let parsed = humantime::parse_duration(text).map_err(|source| DurationError::Invalid {
        text: text.to_owned(),
        source,
    })?;
    if parsed > MAX_DURATION {
        return Err(DurationError::OutOfRange {
            text: text.to_owned(),
        });
    }
    Ok(parsed)
}

/// Deserialize a duration written as text with its unit (see [`parse`]):
/// `#[serde(deserialize_with = "etl_units::duration::deserialize")]`.
///
/// # Errors
///
/// The deserializer's error when the value is not a string, or does not
/// [`parse`].
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(serde::de::Error::custom)
}

/// Like [`deserialize`], for an optional field (with `#[serde(default)]`).
///
/// # Errors
///
/// As [`deserialize`].
pub fn deserialize_option<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    deserialize(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Duration, serde::de::value::Error> {
        deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text))
    }

    #[test]
    fn durations_are_read_with_their_unit() {
        assert_eq!(read("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(read("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(read("2m 30s"), Ok(Duration::from_secs(150)));
    }

    #[test]
    fn a_number_without_a_unit_is_refused_with_the_expected_form() {
        let e = read("500").unwrap_err().to_string();
        assert!(e.contains("\"500ms\""), "{e}");
        let e = deserialize(serde::de::value::U64Deserializer::<serde::de::value::Error>::new(500))
            .unwrap_err()
            .to_string();
        assert!(e.contains("string"), "{e}");
    }

    #[test]
    fn a_duration_that_does_not_parse_keeps_humantimes_reason_as_its_source() {
        let e = parse("ten seconds").unwrap_err();
        assert!(matches!(e, DurationError::Invalid { .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_some());
        assert!(e.to_string().contains("\"ten seconds\""), "{e}");
    }

    #[test]
    fn durations_past_a_year_are_refused() {
        assert_eq!(read("365days"), Ok(MAX_DURATION));
        assert!(
            read("366days")
                .unwrap_err()
                .to_string()
                .contains("out of range")
        );
        assert!(read("1000000000y").is_err());
    }
}
