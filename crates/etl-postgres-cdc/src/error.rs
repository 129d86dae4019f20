//! The crate's error.

use etl_source::SourceError;

use crate::Lsn;
use crate::pgoutput::DecodeError;

/// Everything that can go wrong in the change-data-capture source. Each
/// variant names the server (`user@host:port/database`) or the position
/// it concerns; none contains the password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdcError {
    /// The configuration is invalid (found before connecting).
    #[error("postgres_cdc: {field}: {reason}")]
    Config {
        /// The field concerned.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The server could not be reached or the connection broke.
    #[error("postgres_cdc {target}: {context}: {source}")]
    Io {
        /// `user@host:port/database`.
        target: String,
        /// What was being done.
        context: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The TLS handshake failed or TLS was required and not offered.
    #[error("postgres_cdc {target}: TLS: {reason}")]
    Tls {
        /// `user@host:port/database`.
        target: String,
        /// What failed.
        reason: String,
    },
    /// The server answered with an error.
    #[error("postgres_cdc {target}: {context}: {message} (SQLSTATE {code}){hint}")]
    Server {
        /// `user@host:port/database`.
        target: String,
        /// What was being done.
        context: String,
        /// SQLSTATE.
        code: String,
        /// The server's message.
        message: String,
        /// What to do about it, when known (starts with `; `).
        hint: String,
    },
    /// The server is not set up for the source (`wal_level`, a missing
    /// publication or slot, a slot of another plugin, a missing
    /// privilege): what to do is in the message.
    #[error("postgres_cdc {target}: {reason}")]
    Setup {
        /// `user@host:port/database`.
        target: String,
        /// What is missing and how to fix it.
        reason: String,
    },
    /// The server broke the protocol.
    #[error("postgres_cdc {target}: protocol: {reason}")]
    Protocol {
        /// `user@host:port/database`.
        target: String,
        /// What was unexpected.
        reason: String,
    },
    /// A replication message that cannot be decoded, outside any change
    /// (a change that cannot be decoded is a dead letter instead).
    #[error("postgres_cdc {target}: at LSN {lsn}: {source}")]
    Decode {
        /// `user@host:port/database`.
        target: String,
        /// Where in the stream.
        lsn: Lsn,
        /// What is wrong.
        source: DecodeError,
    },
}

/// SQLSTATEs that say the setup or the credentials are wrong, not the
/// network: retrying will not help.
const SETUP_STATES: &[&str] = &[
    "28000", // invalid authorization specification
    "28P01", // invalid password
    "42501", // insufficient privilege
    "42704", // undefined object (slot, publication)
    "3D000", // invalid catalog name (database)
    "55000", // object not in prerequisite state (wal_level, slot in use)
    "53400", // configuration limit exceeded (max_replication_slots)
    "42710", // duplicate object
];

impl CdcError {
    /// Whether the error is the configuration's or the server setup's
    /// (exit 78), rather than a failure a restart may get past.
    #[must_use]
    pub fn is_configuration(&self) -> bool {
        match self {
            CdcError::Config { .. } | CdcError::Setup { .. } | CdcError::Tls { .. } => true,
            CdcError::Server { code, .. } => SETUP_STATES.contains(&code.as_str()),
            _ => false,
        }
    }

    /// Whether reconnecting may get past it (the connection broke, the
    /// server restarted or shuts down).
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            CdcError::Io { .. } => true,
            // admin_shutdown, crash_shutdown, cannot_connect_now, and the
            // slot still held by the server process of a connection that
            // died (object_in_use, until the server notices).
            CdcError::Server { code, .. } => {
                matches!(
                    code.as_str(),
                    "57P01" | "57P02" | "57P03" | "08006" | "08003" | "55006"
                )
            }
            _ => false,
        }
    }
}

impl From<CdcError> for SourceError {
    fn from(e: CdcError) -> SourceError {
        if e.is_configuration() {
            SourceError::Config(e.to_string())
        } else {
            SourceError::custom(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str) -> CdcError {
        CdcError::Server {
            target: "etl@127.0.0.1:5432/shop".to_owned(),
            context: "START_REPLICATION".to_owned(),
            code: code.to_owned(),
            message: "m".to_owned(),
            hint: String::new(),
        }
    }

    #[test]
    fn a_slot_held_by_a_dead_connection_is_retried_and_a_missing_privilege_is_not() {
        assert!(server("55006").is_transient());
        assert!(!server("55006").is_configuration());
        assert!(server("42501").is_configuration());
        assert!(!server("42501").is_transient());
        let e: SourceError = server("42704").into();
        assert!(matches!(e, SourceError::Config(_)), "{e}");
        let e: SourceError = server("XX000").into();
        assert!(matches!(e, SourceError::Custom(_)), "{e}");
    }
}
