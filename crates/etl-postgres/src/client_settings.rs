//! The connection settings the sink makes, for other connectors of the
//! same server (the change-data-capture source) to connect the same way.

use std::fmt;

use tokio_postgres_rustls::MakeRustlsConnect;

use crate::connection::Connector;
use crate::{PostgresError, PostgresSinkConfig, SslMode};

/// Where and how to connect, as the sink resolves it from a
/// [`PostgresSinkConfig`]'s `url`, `password` (then the URL's, then
/// `PGPASSWORD`), `sslmode` and certificate files. `Debug` never shows
/// the password.
#[derive(Clone)]
pub struct ClientSettings {
    /// Host, port, user, database and password.
    pub config: tokio_postgres::Config,
    /// The rustls connector; `None` for `sslmode = "disable"`.
    pub tls: Option<MakeRustlsConnect>,
    /// The `sslmode` in force.
    pub sslmode: SslMode,
    /// `user@host:port/database`, for messages.
    pub target: String,
}

impl fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSettings")
            .field("target", &self.target)
            .field("sslmode", &self.sslmode)
            .finish_non_exhaustive()
    }
}

impl ClientSettings {
    /// Resolve `config`'s connection settings as the sink does (its table
    /// and columns are not looked at). Connects nowhere; the certificate
    /// files are read now.
    ///
    /// # Errors
    ///
    /// [`PostgresError::Config`] naming the field (never quoting the URL).
    pub fn resolve(config: &PostgresSinkConfig) -> Result<ClientSettings, PostgresError> {
        let connector = Connector::new(config)?;
        Ok(connector.settings())
    }
}
