//! The connection-string parser, reachable by the fuzz targets in
//! `fuzz/` (feature `fuzzing`; not a stable interface).

use crate::conninfo;

/// What [`parse_conninfo`] read from a connection string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The parameters in the order given.
    pub params: Vec<(String, String)>,
    /// The parsed string's `Debug`, which names parameters, never their
    /// values.
    pub debug: String,
    /// The parameters as the `key='value'` string handed to
    /// tokio-postgres.
    pub key_value: String,
}

/// Parse a URL or a `key=value` string and check its options, as the
/// sink does.
///
/// # Errors
///
/// Why it cannot be read (never quoting the input).
pub fn parse_conninfo(input: &str) -> Result<Parsed, String> {
    // As the sink reads it: unknown options are refused before anything
    // is handed to tokio-postgres.
    let info = conninfo::parse(input).map_err(|e| e.to_string())?;
    info.check_options().map_err(|e| e.to_string())?;
    Ok(Parsed {
        key_value: info.to_key_value(),
        debug: format!("{info:?}"),
        params: info.pairs(),
    })
}
