//! Connectors with heavy dependencies, each behind its own feature.

#[cfg(feature = "kafka")]
pub(crate) mod kafka;
