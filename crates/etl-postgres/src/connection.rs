//! Connections: credentials, connecting with a deadline, and a small pool
//! of idle connections.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio_postgres::{Client, NoTls, Statement};

use crate::config::redact_url;
use crate::{PostgresError, PostgresSinkConfig};

/// Idle connections kept for reuse; more may be open while writes are in
/// flight.
const MAX_IDLE: usize = 8;
/// Prepared statements cached per connection.
const MAX_STATEMENTS: usize = 64;

/// How to reach the server. `Debug` never shows the password.
pub(crate) struct Connector {
    config: tokio_postgres::Config,
    target: String,
    timeout: Duration,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("target", &self.target)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Parse the URL and pick the password: the config's field, then the
    /// URL's, then `PGPASSWORD`.
    pub(crate) fn new(config: &PostgresSinkConfig) -> Result<Connector, PostgresError> {
        let mut pg = tokio_postgres::Config::from_str(&config.url).map_err(|_| {
            // The parser's message may quote part of the URL (and so the
            // password): show only the redacted URL.
            PostgresError::Config {
                field: "url".into(),
                reason: format!(
                    "`{}` is not a PostgreSQL connection URL",
                    redact_url(&config.url)
                ),
            }
        })?;
        if let Some(password) = &config.password {
            pg.password(password.as_bytes());
        } else if pg.get_password().is_none()
            && let Ok(password) = std::env::var("PGPASSWORD")
        {
            pg.password(password.as_bytes());
        }
        if pg.get_user().is_none()
            && let Ok(user) = std::env::var("PGUSER")
        {
            pg.user(&user);
        }
        let timeout = Duration::from_secs(config.connect_timeout_secs.max(1));
        pg.connect_timeout(timeout);
        let target = target(&pg);
        Ok(Connector {
            config: pg,
            target,
            timeout,
        })
    }

    /// `user@host:port/database`, for messages.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Open a connection; its driver task runs on the current runtime.
    pub(crate) async fn connect(&self) -> Result<Conn, PostgresError> {
        let connecting = self.config.connect(NoTls);
        let (client, connection) = match tokio::time::timeout(self.timeout, connecting).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(source)) => {
                return Err(PostgresError::Connect {
                    target: self.target.clone(),
                    source,
                });
            }
            Err(_) => {
                return Err(PostgresError::ConnectTimeout {
                    target: self.target.clone(),
                    after: self.timeout,
                });
            }
        };
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "PostgreSQL connection ended");
            }
        });
        Ok(Conn {
            client,
            staged: false,
            statements: HashMap::new(),
        })
    }
}

fn target(pg: &tokio_postgres::Config) -> String {
    let user = pg.get_user().unwrap_or("");
    let host = match pg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    let db = pg.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{db}")
}

/// One connection and what this sink prepared on it.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) client: Client,
    /// Whether the staging table exists in this session.
    pub(crate) staged: bool,
    /// Prepared statements by SQL text.
    statements: HashMap<String, Statement>,
}

impl Conn {
    /// `sql` prepared on this connection, once.
    pub(crate) async fn prepare(&mut self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        // Multi-row inserts come in many sizes; keep the cache bounded.
        if self.statements.len() < MAX_STATEMENTS {
            self.statements.insert(sql.to_owned(), statement.clone());
        }
        Ok(statement)
    }
}

/// Idle connections. A connection goes back only after a successful write,
/// so a broken one is dropped rather than reused.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    idle: Mutex<Vec<Conn>>,
}

impl Pool {
    /// An idle connection, or a new one.
    pub(crate) async fn take(&self, connector: &Connector) -> Result<Conn, PostgresError> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match idle {
            Some(conn) if !conn.client.is_closed() => Ok(conn),
            _ => connector.connect().await,
        }
    }

    /// Return a healthy connection.
    pub(crate) fn give_back(&self, conn: Conn) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE && !conn.client.is_closed() {
            idle.push(conn);
        }
    }
}
