//! Connectors with heavy dependencies, each behind its own feature.

#[cfg(feature = "kafka")]
pub(crate) mod kafka;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub(crate) use postgres::open_postgres;
