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

impl FromStr for Lsn {
    type Err = String;

    fn from_str(text: &str) -> Result<Lsn, String> {
        let bad = || format!("{text:?} is not a log sequence number (like 16/B374D848)");
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
        assert!("16B374D848".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
    }
}
