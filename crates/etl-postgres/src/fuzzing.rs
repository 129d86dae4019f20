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

/// Why [`parse_conninfo`] cannot read a connection string: the sink's own
/// reason, which holds positions and option names only, never the
/// input's text (in `Debug` too).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct ConnInfoError(conninfo::ConnInfoError);

/// Parse a URL or a `key=value` string and check its options, as the
/// sink does.
///
/// # Errors
///
/// Why it cannot be read, a [`ConnInfoError`] (never quoting the input).
pub fn parse_conninfo(input: &str) -> Result<Parsed, ConnInfoError> {
    // As the sink reads it: unknown options are refused before anything
    // is handed to tokio-postgres.
    let info = conninfo::parse(input).map_err(ConnInfoError)?;
    info.check_options().map_err(ConnInfoError)?;
    Ok(Parsed {
        key_value: info.to_key_value(),
        debug: format!("{info:?}"),
        params: info.pairs(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_string_refused_is_a_typed_error_that_quotes_none_of_it() {
        let err = parse_conninfo("mysql://etl:hunter22@db/orders").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the URL's scheme is neither postgres:// nor postgresql://"
        );
        assert!(!format!("{err:?}").contains("hunter22"), "{err:?}");
        let err = parse_conninfo("host=db password='hunter22").unwrap_err();
        assert!(err.to_string().contains("no closing quote"), "{err}");
        assert!(!format!("{err:?}").contains("hunter22"), "{err:?}");
        assert!(parse_conninfo("host=db dbname=orders").is_ok());
    }
}
