//! PostgreSQL change data capture: a logical replication slot as a
//! partitioned, replayable [`Source`](etl_source::Source).
//!
//! * [`PostgresCdcSource`] streams a publication's changes through a
//!   `pgoutput` slot (created if absent, by
//!   [`create_slot`](PostgresCdcConfig::create_slot)) over the streaming
//!   replication protocol, and turns each inserted, updated, deleted or
//!   truncated row into one JSON record: operation, schema, table, commit
//!   LSN and time, transaction id, key, the row after and, where the
//!   replica identity gives it, before. Values are faithful JSON
//!   (numeric as its exact text, timestamps ISO-8601, bytea base64,
//!   arrays, json and jsonb as themselves); an unchanged TOAST column is
//!   listed in `unchanged_toast`, never written as null.
//! * The initial snapshot ([`Snapshot::Initial`], the default): when the
//!   source creates the slot, the published tables' rows as of its
//!   creation come first (one `"read"` record each, read in bounded
//!   memory from an exported snapshot), then the changes from the slot's
//!   consistent point. The slot is made only once every row was
//!   delivered, so a snapshot interrupted by a crash is taken again.
//! * Offsets: the slot is partition 0; a transaction's changes take
//!   consecutive offsets from its commit LSN (or right after the previous
//!   transaction's). The slot is confirmed (`flush_lsn` in standby
//!   status updates) never past a change the checkpointer has not
//!   committed ([`Source::commit`](etl_source::Source::commit)), and only
//!   where the first transaction the server sends again takes its commit
//!   LSN as its first offset: after any restart every change sent again
//!   takes the offset it had, so an exactly-once sink stores each change
//!   once. Keepalives are answered from a task of their own, and with
//!   everything delivered a keepalive moves the slot on (a quiet
//!   publication does not pin WAL).
//! * The replication connection is this crate's own, on
//!   `postgres-protocol` (tokio-postgres has no replication protocol):
//!   startup with `replication=database`, cleartext, MD5 and
//!   SCRAM-SHA-256 passwords, TLS through rustls as the PostgreSQL sink
//!   does it (the same settings, resolved by
//!   [`etl_postgres::ClientSettings`]).
//! * [`decode`] reads `pgoutput` messages and never panics on any bytes;
//!   a change that cannot be decoded or does not fit its relation is a
//!   dead letter with its LSN.
//! * [`CdcError`] is the crate's error: a server not set up for logical
//!   decoding, a missing publication, slot or privilege is a
//!   configuration error (exit 78) naming what to do.
//!
//! See `docs/postgres-cdc.md` for the server's setup, the record format,
//! offsets and WAL retention.
//!
//! # Example
//!
//! ```
//! use etl_postgres_cdc::{PostgresCdcConfig, PostgresCdcSource};
//! use etl_source::Source;
//!
//! let config: PostgresCdcConfig = toml_like(r#"{
//!     "url": "postgres://etl@127.0.0.1:5432/shop",
//!     "publication": "etl",
//!     "slot": "etl_shop"
//! }"#);
//! // Connects nowhere until the source driver seeks the slot's partition
//! // to its committed offset.
//! let source = PostgresCdcSource::new(config)?;
//! let _boxed: Box<dyn Source> = Box::new(source);
//!
//! // A slot name the server would refuse is refused now.
//! let bad = PostgresCdcConfig::new("postgres://etl@127.0.0.1/shop", "etl", "Not-A-Slot");
//! assert!(PostgresCdcSource::new(bad).is_err());
//! # fn toml_like(json: &str) -> PostgresCdcConfig { serde_json::from_str(json).unwrap() }
//! # Ok::<(), etl_postgres_cdc::CdcError>(())
//! ```

mod change;
mod config;
mod error;
mod lsn;
mod pgoutput;
mod progress;
mod session;
mod snapshot;
mod source;
mod value;
mod wire;

#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;

pub use config::{PostgresCdcConfig, Snapshot};
pub use error::CdcError;
pub use lsn::{Lsn, LsnError};
pub use pgoutput::{
    Begin, Column, Commit, DecodeError, Message, OldTuple, Relation, Tuple, Value, decode,
};
pub use source::PostgresCdcSource;

/// Register the `postgres_cdc` source type in `registry`, as a user's
/// connector crate registers its own: the `etl` command's one line for
/// this crate.
///
/// The source is built once the checkpointer runs and follows its
/// commits ([`PostgresCdcSource::following`]), so the slot moves past
/// delivered transactions while the pipeline runs. Its table is checked
/// when the configuration is loaded (a slot name the server would refuse,
/// an empty publication); an exactly-once sink's stored progress is
/// passed to it ([`PostgresCdcSource::stored_progress`]) so that the
/// initial snapshot's rows are never skipped by it (docs/postgres-cdc.md,
/// "Offsets"); and a
/// [`CdcError`] of the configuration or the
/// server's setup is [`ErrorKind::Config`](etl_config::ErrorKind::Config)
/// (exit 78).
///
/// ```
/// let registry = etl_postgres_cdc::register(etl_config::Registry::new());
/// assert!(registry.has_source("postgres_cdc"));
/// ```
#[must_use]
pub fn register(registry: etl_config::Registry) -> etl_config::Registry {
    use etl_config::{BuiltSource, ErrorKind, SourcePlugin};

    let plugin = SourcePlugin::new(|config: PostgresCdcConfig, _context| {
        let source = PostgresCdcSource::new(config)?;
        let stored = source.progress_keeper();
        Ok(BuiltSource::with_handle(move |handle| {
            let source: Box<dyn etl_source::Source> = Box::new(source.following(handle.clone()));
            Ok(source)
        })
        // Offsets given again after a restart are those given before, so
        // an exactly-once sink skips exactly what it holds; the snapshot's
        // rows, a new read, take offsets at or above its progress.
        .check_stored_progress(move |progress| {
            if let Some(offset) = progress.get(session::PARTITION) {
                stored.stored_progress(offset.0);
            }
            Ok(())
        }))
    })
    .check(|config, report| {
        for (field, reason) in config.problems() {
            report.problem(field, reason);
        }
    });
    registry
        .source_plugin("postgres_cdc", plugin)
        .error_kind(|error| {
            error
                .downcast_ref::<CdcError>()
                .filter(|e| e.is_configuration())
                .map(|_| ErrorKind::Config)
        })
}
