//! Connections: credentials, connecting with a deadline, and a small pool
//! of idle connections.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::{Client, NoTls, Statement};

use crate::conninfo;
use crate::error::describe;
use crate::tls::{self, SslMode, SslModeError, TlsSettings, Tracked};
use crate::{PostgresError, PostgresSinkConfig};

/// Idle connections kept for reuse; more may be open while writes are in
/// flight.
const MAX_IDLE: usize = 8;
/// Prepared statements cached per connection.
const MAX_STATEMENTS: usize = 64;

/// How to reach the server. `Debug` never shows the password.
pub(crate) struct Connector {
    config: tokio_postgres::Config,
    tls: Option<Tracked>,
    mode: SslMode,
    target: String,
    timeout: Duration,
    /// Whether a `prefer` connection fell back to plaintext already (said
    /// once per sink).
    warned_plaintext: AtomicBool,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("target", &self.target)
            .field("sslmode", &self.mode)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// `e` with a certificate path the URL gave replaced by the option's
/// name: the path is the URL's text.
fn hide_url_paths(e: PostgresError, from_url: &[(&str, String)]) -> PostgresError {
    match e {
        PostgresError::Config { field, reason } => {
            match from_url.iter().find(|(key, _)| *key == field) {
                Some((key, path)) => url_error(format!(
                    "option `{key}`: {}",
                    reason.replace(path.as_str(), "the file it names")
                )),
                None => PostgresError::Config { field, reason },
            }
        }
        e => e,
    }
}

fn url_error(reason: String) -> PostgresError {
    PostgresError::Config {
        field: "url".into(),
        reason,
    }
}

impl Connector {
    /// Parse the URL, pick the password (the config's field, then the
    /// URL's, then `PGPASSWORD`) and the TLS settings (the config's fields,
    /// then the URL's), and load the certificate files. Connects nowhere.
    pub(crate) fn new(config: &PostgresSinkConfig) -> Result<Connector, PostgresError> {
        // The parser's errors and the checks below name options and
        // positions only: any part of the URL may be a secret, whatever its
        // key is called.
        let mut info =
            conninfo::parse(config.url.expose_secret()).map_err(|e| url_error(e.to_string()))?;
        info.check_options().map_err(|e| url_error(e.to_string()))?;
        let url_password = info.take("password").map(SecretString::from);
        if info.take("sslpassword").is_some() {
            return Err(url_error(
                "sslpassword (an encrypted sslkey) is not supported; decrypt the key".to_owned(),
            ));
        }
        let url_mode = info.take("sslmode");
        // Certificate files the URL names, by option: a problem with one
        // names the option, not the URL's text.
        let mut from_url: Vec<(&'static str, String)> = Vec::new();
        let mut url_tls = |key: &'static str, info: &mut conninfo::ConnInfo| {
            let path = info.take(key)?;
            from_url.push((key, path.clone()));
            Some(PathBuf::from(path))
        };
        let settings = TlsSettings {
            mode: match (config.sslmode, url_mode) {
                (Some(mode), _) => mode,
                // The value is the URL's text, so it is not quoted back.
                (None, Some(text)) => SslMode::parse(&text).map_err(|e| {
                    url_error(match e {
                        SslModeError::Allow => format!("option `sslmode`: {e}"),
                        _ => "option `sslmode` is not one of disable, prefer, require, \
                              verify-ca, verify-full"
                            .to_owned(),
                    })
                })?,
                (None, None) => SslMode::default(),
            },
            rootcert: config
                .sslrootcert
                .clone()
                .or_else(|| url_tls("sslrootcert", &mut info)),
            cert: config
                .sslcert
                .clone()
                .or_else(|| url_tls("sslcert", &mut info)),
            key: config
                .sslkey
                .clone()
                .or_else(|| url_tls("sslkey", &mut info)),
        };
        for key in ["sslrootcert", "sslcert", "sslkey"] {
            info.take(key);
        }
        // No password in this string, and only options tokio-postgres
        // knows (checked above): its messages name an option at most.
        let mut pg = tokio_postgres::Config::from_str(&info.to_key_value())
            .map_err(|e| url_error(describe(&e)))?;
        let password = config
            .password
            .clone()
            .or(url_password)
            .or_else(|| std::env::var("PGPASSWORD").ok().map(SecretString::from));
        if let Some(password) = &password {
            pg.password(password.expose_secret().as_bytes());
        }
        if pg.get_user().is_none()
            && let Ok(user) = std::env::var("PGUSER")
        {
            pg.user(&user);
        }
        if pg.get_hosts().is_empty() && pg.get_hostaddrs().is_empty() {
            pg.host("localhost");
        }
        pg.connect_timeout(config.connect_timeout);
        pg.ssl_mode(match settings.mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
        });
        let tls = tls::connector(&settings)
            .map_err(|e| hide_url_paths(e, &from_url))?
            .map(Tracked::new);
        let target = target(&pg);
        Ok(Connector {
            config: pg,
            tls,
            mode: settings.mode,
            target,
            timeout: config.connect_timeout,
            warned_plaintext: AtomicBool::new(false),
        })
    }

    /// What this connector connects with, for other connectors.
    pub(crate) fn settings(&self) -> crate::ClientSettings {
        crate::ClientSettings {
            config: self.config.clone(),
            tls: self.tls.as_ref().map(Tracked::inner),
            sslmode: self.mode,
            target: self.target.clone(),
        }
    }

    /// `user@host:port/database`, for messages.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Open a connection; its driver task runs on the current runtime.
    pub(crate) async fn connect(&self) -> Result<Conn, PostgresError> {
        let client = match &self.tls {
            Some(tls) => {
                let tls = Tracked::new_sharing(tls);
                let used = tls.used.clone();
                let (client, connection) = self.finish(self.config.connect(tls)).await?;
                tokio::spawn(watch(connection, self.target.clone()));
                if self.mode == SslMode::Prefer
                    && !used.load(Ordering::Relaxed)
                    && !self.warned_plaintext.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(
                        target = %self.target,
                        "sslmode = \"prefer\": the server does not offer TLS, so this sink's \
                         connections are NOT encrypted; set sslmode = \"require\" (or \
                         \"verify-full\") to refuse plaintext, or \"disable\" to say it is intended"
                    );
                }
                client
            }
            None => {
                let (client, connection) = self.finish(self.config.connect(NoTls)).await?;
                tokio::spawn(watch(connection, self.target.clone()));
                client
            }
        };
        Ok(Conn {
            client,
            staged: false,
            statements: HashMap::new(),
        })
    }

    /// Await a connection attempt within the timeout.
    async fn finish<T>(
        &self,
        connecting: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, PostgresError> {
        match tokio::time::timeout(self.timeout, connecting).await {
            Ok(Ok(pair)) => Ok(pair),
            Ok(Err(source)) => Err(PostgresError::Connect {
                target: self.target.clone(),
                source,
            }),
            Err(_) => Err(PostgresError::ConnectTimeout {
                target: self.target.clone(),
                after: self.timeout,
            }),
        }
    }
}

/// Drive a connection; say why it ended if it failed.
async fn watch<S, T>(connection: tokio_postgres::Connection<S, T>, target: String)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(error) = connection.await {
        crate::error::connection_lost(&target, &error);
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
