//! The sink's configuration: where to connect, which table, which columns.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::{PostgresError, SslMode};

/// How a batch reaches the table. Both run in one transaction per batch
/// and upsert on the key; see `docs/postgres.md` for measurements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteMethod {
    /// `COPY` the batch into a temporary staging table, then one
    /// `INSERT ... SELECT ... ON CONFLICT` into the target (the faster one
    /// here).
    #[default]
    Copy,
    /// Multi-row `INSERT ... VALUES (...), (...) ON CONFLICT` statements
    /// with bound parameters.
    Insert,
}

/// How an exactly-once sink locks its progress (progress table and
/// progress name) for its life; see `docs/postgres.md`, "The progress
/// lock".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgressLock {
    /// One sink at a time: a second one is refused
    /// ([`PostgresError::InUse`](crate::PostgresError::InUse)).
    #[default]
    Exclusive,
    /// Any number of sinks that divide the partitions among themselves by
    /// other means (members of one Kafka consumer group), but no
    /// exclusive one.
    Shared,
}

/// One column of the target table and where its value comes from.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnConfig {
    /// Column name (quoted in SQL, so any name works).
    pub name: String,
    /// Dotted path of the JSON field in the record's value (`customer.id`,
    /// `items.0.sku`); the column name when absent; `""` for the whole
    /// document.
    #[serde(default)]
    pub path: Option<String>,
    /// PostgreSQL type of the column (`text`, `bigint`, `numeric(10,2)`,
    /// `timestamptz`, `jsonb`, ...). The server converts the field's text
    /// to it, so a value it cannot convert is rejected with its reason.
    #[serde(rename = "type")]
    pub pg_type: String,
}

impl ColumnConfig {
    /// A column `name` of type `pg_type`, filled from the JSON field at
    /// `path`.
    pub fn new(
        name: impl Into<String>,
        path: impl Into<String>,
        pg_type: impl Into<String>,
    ) -> Self {
        ColumnConfig {
            name: name.into(),
            path: Some(path.into()),
            pg_type: pg_type.into(),
        }
    }

    /// The JSON path, defaulting to the column name.
    #[must_use]
    pub fn json_path(&self) -> &str {
        self.path.as_deref().unwrap_or(&self.name)
    }
}

/// Configuration of a [`PostgresSink`](crate::PostgresSink); the body of a
/// `type = "postgres"` sink in the `etl` TOML config.
///
/// The password comes from, in order: [`password`](Self::password), the
/// URL, the `PGPASSWORD` environment variable. The URL and the password are
/// held as secrets ([`SecretString`]): neither `Debug` output, logs nor
/// error messages show them or any part of the URL; a problem in the URL
/// is named by its option and position.
///
/// TLS follows libpq: [`sslmode`](Self::sslmode),
/// [`sslrootcert`](Self::sslrootcert), [`sslcert`](Self::sslcert) and
/// [`sslkey`](Self::sslkey), each also accepted in the URL
/// (`?sslmode=verify-full&sslrootcert=/etc/ssl/pg-ca.pem`); a field set
/// here wins over the URL's.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresSinkConfig {
    /// `postgres://user@host:port/database?key=value` or a libpq
    /// `key=value` connection string. A secret: it may hold the password.
    pub url: SecretString,
    /// The password, if not in the URL or `PGPASSWORD`.
    #[serde(default)]
    pub password: Option<SecretString>,
    /// Whether and how to use TLS: `disable`, `prefer` (the default, as in
    /// libpq: TLS when the server offers it, unchecked; a fallback to
    /// plaintext is logged at WARN), `require`, `verify-ca`, `verify-full`.
    #[serde(default)]
    pub sslmode: Option<SslMode>,
    /// PEM file of the CA certificate(s) the server's certificate must
    /// chain to (needed by `verify-ca` and `verify-full`).
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// PEM file of the client certificate (chain), for servers that ask
    /// for one (`clientcert=verify-full`, `cert` authentication).
    #[serde(default)]
    pub sslcert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (unencrypted).
    #[serde(default)]
    pub sslkey: Option<PathBuf>,
    /// Target table, optionally `schema.table`.
    pub table: String,
    /// Columns filled from each record's JSON value.
    #[serde(default)]
    pub columns: Vec<ColumnConfig>,
    /// The upsert key. If it names one of [`columns`](Self::columns), that
    /// column's value is the key; otherwise it is a `text` column holding
    /// the record's idempotency key (`source/partition/offset`), so a
    /// replayed record overwrites its own row.
    #[serde(default = "default_key_column")]
    pub key_column: String,
    /// Create the target table (key as primary key) if it does not exist.
    #[serde(default)]
    pub create_table: bool,
    /// Store each partition's next offset in
    /// [`progress_table`](Self::progress_table) in the same transaction
    /// as the rows; the pipeline resumes from it.
    #[serde(default)]
    pub exactly_once: bool,
    /// Table of stored progress (created if missing).
    #[serde(default = "default_progress_table")]
    pub progress_table: String,
    /// Name under which this sink's progress is stored; the target table's
    /// name when absent. Two sinks must not share one.
    #[serde(default)]
    pub progress_name: Option<String>,
    /// How the exactly-once sink locks its progress: `exclusive` (one
    /// sink at a time) or `shared` (the members of one consumer group).
    #[serde(default)]
    pub progress_lock: ProgressLock,
    /// How batches are written.
    #[serde(default)]
    pub method: WriteMethod,
    /// Limit of one connection attempt, written as a duration (`"10s"`).
    #[serde(
        default = "default_connect_timeout",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub connect_timeout: Duration,
}

fn default_key_column() -> String {
    "etl_key".to_owned()
}

fn default_progress_table() -> String {
    "etl_progress".to_owned()
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(10)
}

impl PostgresSinkConfig {
    /// A configuration for `table` at `url`, with no columns, the
    /// idempotency key in `etl_key`, at-least-once, `COPY` writes.
    pub fn new(url: impl Into<String>, table: impl Into<String>) -> Self {
        PostgresSinkConfig {
            url: SecretString::from(url.into()),
            password: None,
            sslmode: None,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            table: table.into(),
            columns: Vec::new(),
            key_column: default_key_column(),
            create_table: false,
            exactly_once: false,
            progress_table: default_progress_table(),
            progress_name: None,
            progress_lock: ProgressLock::default(),
            method: WriteMethod::default(),
            connect_timeout: default_connect_timeout(),
        }
    }

    /// Add a column.
    #[must_use]
    pub fn column(mut self, name: &str, path: &str, pg_type: &str) -> Self {
        self.columns.push(ColumnConfig::new(name, path, pg_type));
        self
    }

    /// Set the upsert key column.
    #[must_use]
    pub fn key_column(mut self, name: impl Into<String>) -> Self {
        self.key_column = name.into();
        self
    }

    /// Create the table if missing.
    #[must_use]
    pub fn create_table(mut self, yes: bool) -> Self {
        self.create_table = yes;
        self
    }

    /// Exactly-once mode.
    #[must_use]
    pub fn exactly_once(mut self, yes: bool) -> Self {
        self.exactly_once = yes;
        self
    }

    /// Set how the progress is locked.
    #[must_use]
    pub fn progress_lock(mut self, lock: ProgressLock) -> Self {
        self.progress_lock = lock;
        self
    }

    /// Set the write method.
    #[must_use]
    pub fn method(mut self, method: WriteMethod) -> Self {
        self.method = method;
        self
    }

    /// Set the password.
    #[must_use]
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(SecretString::from(password.into()));
        self
    }

    /// Set the TLS mode.
    #[must_use]
    pub fn sslmode(mut self, mode: SslMode) -> Self {
        self.sslmode = Some(mode);
        self
    }

    /// Set the CA certificate file the server's certificate is checked
    /// against.
    #[must_use]
    pub fn sslrootcert(mut self, path: impl Into<PathBuf>) -> Self {
        self.sslrootcert = Some(path.into());
        self
    }

    /// Set the client certificate and its key.
    #[must_use]
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.sslcert = Some(cert.into());
        self.sslkey = Some(key.into());
        self
    }

    /// The name progress is stored under.
    #[must_use]
    pub fn progress_key(&self) -> &str {
        self.progress_name.as_deref().unwrap_or(&self.table)
    }

    /// Check everything that can be checked without connecting: names
    /// and types, the URL (its syntax, unknown options, ports, `sslmode`),
    /// and the certificate files (present, readable, PEM). `etl validate`
    /// and `etl run` call it before anything connects.
    ///
    /// # Errors
    ///
    /// [`PostgresError::Config`] naming the offending field; a message
    /// about the URL names the option and its position in the URL, never
    /// any of the URL's text (any part of it may be a secret, whatever its
    /// key is called).
    pub fn validate(&self) -> Result<(), PostgresError> {
        self.validate_names()?;
        crate::connection::Connector::new(self).map(drop)
    }

    pub(crate) fn validate_names(&self) -> Result<(), PostgresError> {
        let bad = |field: &str, reason: String| {
            Err(PostgresError::Config {
                field: field.to_owned(),
                reason,
            })
        };
        if self.table.trim().is_empty() {
            return bad("table", "is empty".into());
        }
        if self.key_column.is_empty() {
            return bad("key_column", "is empty".into());
        }
        if self.progress_table.trim().is_empty() {
            return bad("progress_table", "is empty".into());
        }
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout", "must be above zero".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, c) in self.columns.iter().enumerate() {
            let field = format!("columns[{i}]");
            if c.name.is_empty() {
                return bad(&field, "the column name is empty".into());
            }
            if !seen.insert(c.name.as_str()) {
                return bad(&field, format!("column `{}` appears twice", c.name));
            }
            if let Err(reason) = check_type(&c.pg_type) {
                return bad(&format!("{field}.type"), reason);
            }
        }
        Ok(())
    }
}

/// A type name goes into SQL as written, so only the characters type names
/// use are allowed (no quotes, semicolons or comments).
fn check_type(ty: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || " _,()[]".contains(c);
    if ty.trim().is_empty() {
        Err("the type is empty".into())
    } else if let Some(c) = ty.chars().find(|&c| !ok(c)) {
        Err(format!("`{ty}` is not a type name (character {c:?})"))
    } else {
        Ok(())
    }
}

impl fmt::Debug for PostgresSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSinkConfig")
            // Any part of the URL may be a secret, whatever its key is
            // called, so none of it is shown.
            .field("url", &"***")
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("sslcert", &self.sslcert)
            .field("sslkey", &self.sslkey)
            .field("table", &self.table)
            .field("columns", &self.columns)
            .field("key_column", &self.key_column)
            .field("create_table", &self.create_table)
            .field("exactly_once", &self.exactly_once)
            .field("progress_table", &self.progress_table)
            .field("progress_name", &self.progress_name)
            .field("progress_lock", &self.progress_lock)
            .field("method", &self.method)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_in_debug() {
        let config = PostgresSinkConfig::new("postgres://u:s3cret@h/db", "t").password("hunter2");
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("hunter2"),
            "{debug}"
        );
    }

    #[test]
    fn validation_names_the_field() {
        let ok = PostgresSinkConfig::new("postgres://h/db", "t").column("n", "n", "numeric(10,2)");
        assert!(ok.validate().is_ok());
        let injected =
            PostgresSinkConfig::new("postgres://h/db", "t").column("n", "n", "int; drop");
        let err = injected.validate().unwrap_err().to_string();
        assert!(err.contains("columns[0].type"), "{err}");
        let twice = PostgresSinkConfig::new("postgres://h/db", "t")
            .column("a", "a", "text")
            .column("a", "b", "text");
        assert!(twice.validate().unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn validation_reads_the_url_and_files_without_connecting() {
        // Nothing listens on port 1: validation never tries.
        let ok = PostgresSinkConfig::new(
            "postgres://etl:pw@127.0.0.1:1/db?sslmode=require&application_name=x",
            "t",
        );
        assert!(ok.validate().is_ok());
        for (url, expected) in [
            (
                "postgres://etl@127.0.0.1:1/db?bogus_opt=1",
                "unknown option `bogus_opt`",
            ),
            ("postgres://etl@127.0.0.1:notaport/db", "option `port`"),
            ("host=h port=99999", "option `port`"),
            (
                "postgres://etl@h/db?sslmode=allow",
                "`allow` is not supported",
            ),
            (
                "postgres://etl@h/db?sslmode=verify-full",
                "needs sslrootcert",
            ),
            (
                "postgres://etl@h/db?sslmode=verify-ca&sslrootcert=/no/such/ca.pem",
                "url: option `sslrootcert`: cannot read the file it names",
            ),
            (
                "postgres://etl@h/db?sslkey=/k.pem",
                "sslkey is set but sslcert is not",
            ),
            ("host=h password='unterminated", "no closing quote"),
            ("http://h/db", "scheme"),
        ] {
            let err = PostgresSinkConfig::new(url, "t").validate().unwrap_err();
            assert!(err.to_string().contains(expected), "{url}: {err}");
        }
        // A file named in the TOML is named in the message; one the URL
        // names is not (it is the URL's text).
        let mut field = PostgresSinkConfig::new("postgres://etl@h/db?sslmode=verify-ca", "t");
        field.sslrootcert = Some("/no/such/ca.pem".into());
        let err = field.validate().unwrap_err().to_string();
        assert!(
            err.contains("sslrootcert: cannot read /no/such/ca.pem"),
            "{err}"
        );
        let err = PostgresSinkConfig::new(
            "postgres://etl@h/db?sslmode=verify-ca&sslrootcert=/no/Zq9SecretPw.pem",
            "t",
        )
        .validate()
        .unwrap_err()
        .to_string();
        assert!(!err.contains("Zq9"), "{err}");
        // A TOML field wins over the URL's.
        let mut fixed = PostgresSinkConfig::new("postgres://etl@h/db?sslmode=verify-full", "t");
        fixed.sslmode = Some(SslMode::Require);
        assert!(fixed.validate().is_ok());
    }

    #[test]
    fn deserializes_with_defaults() {
        let config: PostgresSinkConfig = serde_json::from_str(
            r#"{"url": "postgres://h/db", "table": "t",
                "columns": [{"name": "id", "type": "bigint"}]}"#,
        )
        .unwrap();
        assert_eq!(config.key_column, "etl_key");
        assert_eq!(config.columns[0].json_path(), "id");
        assert_eq!(config.method, WriteMethod::Copy);
        assert_eq!(config.progress_key(), "t");
    }
}
