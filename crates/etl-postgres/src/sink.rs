//! The PostgreSQL sink: opening it, and its `Sink` and `ProgressSink`
//! sides.

use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use etl_record::{Offset, PartitionId};
use etl_sink::{EncodedBatch, Progress, ProgressSink, Sink, SinkError};

use crate::connection::{Connector, Pool};
use crate::lock::{Holder, Lease};
use crate::mapping::Mapping;
use crate::sql::Statements;
use crate::{PostgresError, PostgresSinkConfig};

/// A [`Sink`] that upserts each batch into a table in one transaction.
///
/// * Each record's JSON value becomes a row by the configured columns;
///   the row is upserted on the key column (by default the record's
///   idempotency key), so a replayed record overwrites its own row.
/// * A batch that fails on some rows' data (a value its column's type
///   does not accept, a constraint) is written again row by row inside
///   savepoints: good rows commit, bad ones come back as
///   [`SinkError::Rejected`] with the database's reason, for the
///   dead-letter path.
/// * A lost connection or a restarting server is a retryable error; the
///   driver retries with backoff on a fresh connection.
/// * In exactly-once mode ([`PostgresSinkConfig::exactly_once`]) each
///   partition's next offset is stored in a progress table in the same
///   transaction as the rows, and the sink is a [`ProgressSink`]: run it
///   with [`SinkDriver::exactly_once`](etl_sink::SinkDriver::exactly_once).
///
/// Use it with [`NdjsonEncoder`](etl_sink::NdjsonEncoder), which sends
/// values that are not JSON to the dead-letter path before they reach the
/// sink.
#[derive(Debug)]
pub struct PostgresSink {
    pub(crate) config: PostgresSinkConfig,
    pub(crate) connector: Connector,
    pub(crate) mapping: Mapping,
    pub(crate) sql: Statements,
    pub(crate) pool: Pool,
    /// In exactly-once mode, the connection holding the progress lock; all
    /// writes go through it.
    holder: Option<Holder>,
    /// What to say while the server is unavailable.
    pub(crate) outage: crate::error::Outage,
    progress: Mutex<Progress>,
}

impl PostgresSink {
    /// Validate `config`, connect, create the tables it asks for, and (in
    /// exactly-once mode) read the stored progress.
    ///
    /// # Errors
    ///
    /// An invalid config, a failed connection or statement.
    /// [`PostgresError::is_retryable`] tells whether trying again later
    /// may help.
    pub async fn connect(config: PostgresSinkConfig) -> Result<PostgresSink, PostgresError> {
        config.validate_names()?;
        let connector = Connector::new(&config)?;
        let mapping = Mapping::new(&config);
        let sql = Statements::new(&config, &mapping);
        let mut sink = PostgresSink {
            connector,
            mapping,
            sql,
            pool: Pool::default(),
            holder: None,
            outage: crate::error::Outage::default(),
            progress: Mutex::new(Progress::new()),
            config,
        };
        let conn = sink.connector.connect().await?;
        if sink.config.create_table {
            create_missing(
                &conn,
                &sink.config.table,
                &sink.sql.create_target,
                "create the table",
            )
            .await?;
        }
        if sink.config.exactly_once {
            create_missing(
                &conn,
                &sink.config.progress_table,
                &sink.sql.create_progress,
                "create the progress table",
            )
            .await?;
            let holder = Holder::take(
                conn,
                &sink.config.progress_table,
                sink.config.progress_key(),
                sink.config.progress_lock,
            )
            .await?;
            sink.holder = Some(holder);
            let stored = sink.read_progress().await?;
            *sink.progress_lock() = stored;
        } else {
            sink.pool.give_back(conn);
        }
        tracing::debug!(target = sink.connector.target(), table = %sink.config.table, "PostgreSQL sink open");
        Ok(sink)
    }

    /// The configuration (its `Debug` hides the password).
    #[must_use]
    pub fn config(&self) -> &PostgresSinkConfig {
        &self.config
    }

    /// Read this sink's stored progress from the database (what
    /// [`ProgressSink::progress`] caches).
    ///
    /// # Errors
    ///
    /// The query failed, or a row holds a partition out of range.
    pub async fn read_progress(&self) -> Result<Progress, PostgresError> {
        let lease = self.lease().await?;
        let rows = lease
            .conn
            .client
            .query(&self.sql.read_progress, &[&self.config.progress_key()])
            .await
            .map_err(|source| PostgresError::Query {
                during: "read progress",
                table: self.progress_table().to_owned(),
                source,
            })?;
        lease.release();
        let mut progress = Progress::new();
        for row in rows {
            let partition: i64 = row.get(0);
            let next: i64 = row.get(1);
            let partition =
                u32::try_from(partition).map_err(|_| PostgresError::CorruptProgress {
                    table: self.progress_table().to_owned(),
                    reason: format!("partition {partition} is out of range"),
                })?;
            progress.advance(PartitionId(partition), Offset(next));
        }
        Ok(progress)
    }

    /// A connection for one operation: the locking one in exactly-once
    /// mode, else a pooled one.
    pub(crate) async fn lease(&self) -> Result<Lease<'_>, PostgresError> {
        Lease::take(self.holder.as_ref(), &self.pool, &self.connector).await
    }

    /// The progress table, schema-qualified once the sink holds it.
    pub(crate) fn progress_table(&self) -> &str {
        self.holder
            .as_ref()
            .map_or(&self.config.progress_table, Holder::table)
    }

    pub(crate) fn exactly_once(&self) -> bool {
        self.config.exactly_once
    }

    pub(crate) fn progress_lock(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn query_error(
        &self,
        during: &'static str,
        source: tokio_postgres::Error,
    ) -> PostgresError {
        PostgresError::Query {
            during,
            table: self.config.table.clone(),
            source,
        }
    }
}

/// Run `create` unless `table` exists already: `CREATE TABLE IF NOT
/// EXISTS` needs the CREATE privilege on the schema even when the table is
/// there, and a writer role often has none. Errors name `table`.
async fn create_missing(
    conn: &crate::connection::Conn,
    table: &str,
    create: &str,
    during: &'static str,
) -> Result<(), PostgresError> {
    let error = |source| PostgresError::Query {
        during,
        table: table.to_owned(),
        source,
    };
    let exists = conn
        .client
        .query_one(
            "SELECT pg_catalog.to_regclass($1) IS NOT NULL",
            &[&crate::mapping::quote_table(table)],
        )
        .await
        .map_err(error)?
        .get::<_, bool>(0);
    if !exists {
        conn.client.batch_execute(create).await.map_err(error)?;
    }
    Ok(())
}

#[async_trait]
impl Sink for PostgresSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        self.write_batch(batch).await
    }
}

#[async_trait]
impl ProgressSink for PostgresSink {
    /// The progress stored by this sink's committed transactions (read on
    /// connect and on every reload, advanced after each commit). Empty
    /// unless exactly-once.
    fn progress(&self) -> Progress {
        self.progress_lock().clone()
    }

    /// Query the progress table: other processes writing under the same
    /// progress name (members of one consumer group) advance it too, and
    /// a partition assigned to this one must resume where they left it.
    async fn reload_progress(&self) -> Result<Progress, SinkError> {
        if !self.exactly_once() {
            return Ok(Progress::new());
        }
        let stored = self.read_progress().await?;
        let mut progress = self.progress_lock();
        for (partition, next) in stored.iter() {
            progress.advance(partition, next);
        }
        Ok(progress.clone())
    }
}
