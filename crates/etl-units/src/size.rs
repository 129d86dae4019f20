//! Sizes in bytes, as an integer or as text with a unit (`"64MiB"`).

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A size in bytes, written as an integer or as text with a unit: `B`,
/// `KB`/`MB`/`GB` (powers of 1000), `KiB`/`MiB`/`GiB` (powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

/// Why a text is not a size. Its message quotes the text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SizeError {
    /// No number before the unit.
    Number {
        /// The text read.
        text: String,
    },
    /// A unit that is none of the known ones.
    Unit {
        /// The text read.
        text: String,
        /// The unit found.
        unit: String,
    },
    /// More bytes than a `u64` holds, or fewer than none.
    OutOfRange {
        /// The text read.
        text: String,
    },
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::Number { text } => write!(
                f,
                "invalid size {text:?}: expected a number and a unit like 64MiB"
            ),
            SizeError::Unit { text, unit } => write!(
                f,
                "invalid size {text:?}: unknown unit {unit:?} (use B, KB, MB, GB, KiB, MiB, GiB)"
            ),
            SizeError::OutOfRange { text } => write!(f, "invalid size {text:?}: out of range"),
        }
    }
}

impl std::error::Error for SizeError {}

impl ByteSize {
    /// Parse `"64MiB"`, `"1 GB"`, `"4096"`.
    ///
    /// # Errors
    ///
    /// [`SizeError`], naming the text, when the number or the unit is
    /// invalid.
    pub fn parse(text: &str) -> Result<Self, SizeError> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let number: f64 = number.parse().map_err(|_| SizeError::Number {
            text: text.to_owned(),
        })?;
        let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "m" | "mb" => 1_000_000,
            "g" | "gb" => 1_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            other => {
                return Err(SizeError::Unit {
                    text: text.to_owned(),
                    unit: other.to_owned(),
                });
            }
        };
        let bytes = number * multiplier as f64;
        if !(0.0..=u64::MAX as f64).contains(&bytes) {
            return Err(SizeError::OutOfRange {
                text: text.to_owned(),
            });
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}B", self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) => Ok(ByteSize(n)),
            Raw::Text(t) => ByteSize::parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("64MiB"), Ok(ByteSize(64 << 20)));
        assert_eq!(ByteSize::parse("1 GB"), Ok(ByteSize(1_000_000_000)));
        assert_eq!(ByteSize::parse("1.5KiB"), Ok(ByteSize(1536)));
        let e = ByteSize::parse("12 parsecs").unwrap_err();
        assert!(
            matches!(&e, SizeError::Unit { unit, .. } if unit == "parsecs"),
            "{e:?}"
        );
        assert!(e.to_string().contains("unknown unit"), "{e}");
        assert!(matches!(
            ByteSize::parse("MiB"),
            Err(SizeError::Number { .. })
        ));
    }
}
