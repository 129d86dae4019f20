//! Human-friendly units in the configuration: sizes ("64MiB") and
//! durations ("1s", "250ms", read by `etl-units` as in every crate).

use std::fmt;

use serde::{Deserialize, Deserializer};

/// A size in bytes, written as an integer or as text with a unit: `B`,
/// `KB`/`MB`/`GB` (powers of 1000), `KiB`/`MiB`/`GiB` (powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    /// Parse `"64MiB"`, `"1 GB"`, `"4096"`.
    ///
    /// # Errors
    ///
    /// A message naming the text when the number or the unit is invalid.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let number: f64 = number.parse().map_err(|_| {
            format!("invalid size {text:?}: expected a number and a unit like 64MiB")
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
                return Err(format!(
                    "invalid size {text:?}: unknown unit {other:?} (use B, KB, MB, GB, KiB, MiB, GiB)"
                ));
            }
        };
        let bytes = number * multiplier as f64;
        if !(0.0..=u64::MAX as f64).contains(&bytes) {
            return Err(format!("invalid size {text:?}: out of range"));
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

/// Durations, read as every crate reads them (`"1s"`, `"250ms"`, `"2m
/// 30s"`, at most a year): see [`etl_units::duration`].
pub(crate) use etl_units::duration::{deserialize as duration, deserialize_option as opt_duration};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(ByteSize::parse("4096"), Ok(ByteSize(4096)));
        assert_eq!(ByteSize::parse("64MiB"), Ok(ByteSize(64 << 20)));
        assert_eq!(ByteSize::parse("1 GB"), Ok(ByteSize(1_000_000_000)));
        assert_eq!(ByteSize::parse("1.5KiB"), Ok(ByteSize(1536)));
        assert!(
            ByteSize::parse("12 parsecs")
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!(ByteSize::parse("MiB").is_err());
    }
}
