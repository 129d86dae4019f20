//! Log sequence numbers: positions in the server's write-ahead log.

use std::fmt;
use std::str::FromStr;

/// A position in the write-ahead log, as PostgreSQL writes it
/// (`16/B374D848`: the high and low 32 bits in hexadecimal).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

/// Text that is not a log sequence number ([`Lsn`]'s `FromStr`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a log sequence number (like 16/B374D848)")]
pub struct LsnError {
    /// The text read.
    pub text: String,
}

impl FromStr for Lsn {
    type Err = LsnError;

    fn from_str(text: &str) -> Result<Lsn, LsnError> {
        let bad = || LsnError {
            text: text.to_owned(),
        };
        let (high, low) = text.split_once('/').ok_or_else(bad)?;
        let high = u32::from_str_radix(high, 16).map_err(|_| bad())?;
        let low = u32::from_str_radix(low, 16).map_err(|_| bad())?;
        Ok(Lsn((u64::from(high) << 32) | u64::from(low)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_lsn_reads_and_writes_as_the_server_does() {
        let lsn: Lsn = "16/B374D848".parse().expect("lsn");
        assert_eq!(lsn, Lsn(0x16_B374_D848));
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert_eq!(
            "16B374D848".parse::<Lsn>().unwrap_err().to_string(),
            "\"16B374D848\" is not a log sequence number (like 16/B374D848)"
        );
        assert!("x/1".parse::<Lsn>().is_err());
    }
}
