//! Identity and data of the records an ETL pipeline moves.
//!
//! This is the lowest layer of the workspace but one: no async, no
//! channels, small dependencies (`bytes`, `etl-fs` for the lock file, and
//! `serde` behind the `serde` feature).
//!
//! * [`PartitionId`] and [`Offset`] name a position in a partitioned,
//!   replayable source. Offsets are ordered within a partition; the
//!   committable position after a record at offset `o` is `o + 1`.
//! * [`Record`] carries an optional key, a value ([`bytes::Bytes`], so
//!   clones share the buffer), [`Headers`] (which a source may leave to
//!   be parsed when first read, see [`HeaderSource`]), an optional
//!   [`Timestamp`] and the [`Position`] it was read from.
//! * [`IdempotencyKey`] is the stable identity of a record, `(source,
//!   partition, offset)`: a sink that stores it can deduplicate replays.
//! * [`DeadLetter`] is a record set aside with the reason (bad input, a
//!   poison record, a row a sink rejected).
//! * [`OwnerLock`] makes one pipeline at a time the owner of a piece of
//!   state (an offset store, an exactly-once output): an advisory lock the
//!   kernel releases when the holder dies.
//! * [`FieldPath`] is the one reading of a dotted path into a record's
//!   JSON value, and [`Template`] the one reading of a name with
//!   `{field}` placeholders (an output path, a request URI, an object
//!   key), for every component that takes one.
//! * [`reuse`] keeps the vectors of written batches for the next batches
//!   a source reads, so a batch's large vector is not a new mapping each
//!   time.
//!
//! # Example
//!
//! ```
//! use etl_record::{IdempotencyKey, Offset, PartitionId, Position, Record, SourceId};
//!
//! let source = SourceId::new("orders");
//! let record = Record::new(
//!     Position::new(source, PartitionId(3), Offset(42)),
//!     &b"{\"id\":1}"[..],
//! )
//! .with_key(&b"customer-7"[..])
//! .with_header("content-type", &b"application/json"[..]);
//!
//! let key = record.idempotency_key();
//! assert_eq!(key.to_string(), "orders/3/42");
//! assert_eq!(key.to_string().parse::<IdempotencyKey>().unwrap(), key);
//! assert_eq!(record.position.offset.next(), Offset(43));
//! ```

mod dead_letter;
mod error;
mod field_path;
mod headers;
mod identity;
mod key;
mod lock;
mod record;
pub mod reuse;
mod template;

pub use dead_letter::DeadLetter;
pub use error::ParseKeyError;
#[cfg(feature = "json")]
pub use field_path::json_field;
pub use field_path::{FieldPath, FieldPathError, array_index};
pub use headers::{Header, HeaderSource, Headers};
pub use identity::{Offset, PartitionId, PartitionOffsets, Position, SourceId};
pub use key::IdempotencyKey;
pub use lock::{LockError, OwnerLock};
pub use record::{Record, Timestamp};
#[cfg(feature = "json")]
pub use template::scalar_text;
pub use template::{Template, TemplateError, TemplatePart};
