//! The connection-string parser, reachable by the fuzz targets in
//! `fuzz/` (feature `fuzzing`; not a stable interface).

use crate::conninfo;

/// What [`parse_conninfo`] read from a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The parameters in the order given.
    pub params: Vec<(String, String)>,
    /// The input with every secret value replaced by `***`.
    pub redacted: String,
    /// The parameters as the `key='value'` string handed to
    /// tokio-postgres.
    pub key_value: String,
}

/// The keys whose values are secrets.
pub const SECRET_KEYS: &[&str] = &conninfo::SECRET_KEYS;

/// Parse a URL or a `key=value` string as the sink does.
///
/// # Errors
///
/// Why it cannot be read (never quoting a value).
pub fn parse_conninfo(input: &str) -> Result<Parsed, String> {
    let info = conninfo::parse(input)?;
    Ok(Parsed {
        key_value: info.to_key_value(),
        params: info.params,
        redacted: info.redacted,
    })
}
