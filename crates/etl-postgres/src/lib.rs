//! A PostgreSQL sink: each batch upserted in one transaction, bad rows
//! rejected with the database's reason, and an exactly-once mode that
//! commits each partition's progress with the rows.
//!
//! * [`PostgresSinkConfig`] says where to connect, which table, and how a
//!   record's JSON value maps to columns ([`ColumnConfig`]: column name,
//!   JSON field path, PostgreSQL type). It deserializes from the `etl`
//!   TOML config.
//! * [`PostgresSink`] implements [`etl_sink::Sink`]: a batch is written
//!   with `COPY` into a staging table and one `INSERT ... ON CONFLICT`
//!   (or multi-row `INSERT`s, [`WriteMethod`]), upserting on a key — by
//!   default the record's idempotency key — so replays never duplicate
//!   rows. Rows the database refuses come back as
//!   [`SinkError::Rejected`](etl_sink::SinkError::Rejected); connection
//!   loss is retryable.
//! * With [`exactly_once`](PostgresSinkConfig::exactly_once) it is an
//!   [`etl_sink::ProgressSink`]: each partition's next offset is stored in a
//!   progress table in the same transaction as the rows, and
//!   [`SinkDriver::exactly_once`](etl_sink::SinkDriver::exactly_once)
//!   resumes the pipeline from it.
//! * An exactly-once sink holds a PostgreSQL advisory lock on its
//!   progress (table and name) for its life: a second sink on the same
//!   progress is refused with [`PostgresError::InUse`].
//! * [`PostgresError`] is the crate's error; none of its messages, and no
//!   `Debug` output, contains the password.
//!
//! See `docs/postgres.md` for configuration, modes and their costs.
//!
//! # Example
//!
//! ```no_run
//! use etl_postgres::{PostgresSink, PostgresSinkConfig};
//! use etl_sink::{NdjsonEncoder, SinkDriver};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The password comes from PGPASSWORD (or `password` in the config).
//! let config = PostgresSinkConfig::new("postgres://etl@127.0.0.1:5432/shop", "orders")
//!     .column("order_id", "id", "bigint")
//!     .column("customer", "customer.name", "text")
//!     .column("total", "total", "numeric(12,2)")
//!     .create_table(true)
//!     .exactly_once(true);
//! let sink = PostgresSink::connect(config).await?;
//!
//! // Start each partition's source at `resume` (the stored progress).
//! let (driver, resume) = SinkDriver::exactly_once(sink, NdjsonEncoder::new());
//! let handle = driver.spawn();
//! # let _ = resume;
//! // ... handle.send(records).await? ...
//! handle.close().await?;
//! # Ok(())
//! # }
//! ```

mod client_settings;
mod config;
mod connection;
mod conninfo;
mod error;
mod lock;
mod mapping;
mod sink;
mod sql;
mod tls;
mod write;

#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;

pub use client_settings::ClientSettings;
pub use config::{ColumnConfig, PostgresSinkConfig, ProgressLock, WriteMethod};
pub use error::PostgresError;
pub use sink::PostgresSink;
pub use tls::{SslMode, SslModeError};
