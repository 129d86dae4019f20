//! The connectors with heavy dependencies, each behind its feature,
//! registered in the [`Registry`] like any component; and the registry of
//! every built-in of this build.

#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "postgres")]
mod postgres;

use crate::Registry;

/// Every built-in source, sink and transform of this build: the
/// configuration language's ([`Registry::new`]) and the connectors'
/// (`kafka`, `postgres`, with their features).
#[must_use]
pub fn registry() -> Registry {
    with_connectors(Registry::new())
}

/// `registry` with this build's connectors (`kafka`, `postgres`) where it
/// has no type of their name, made built-ins: a program's own registry
/// becomes the `etl` command's.
#[must_use]
pub fn with_connectors(registry: Registry) -> Registry {
    #[cfg(feature = "kafka")]
    let registry = if registry.has_source("kafka") || registry.has_sink("kafka") {
        registry
    } else {
        kafka::register(registry)
    };
    #[cfg(feature = "postgres")]
    let registry = if registry.has_sink("postgres") {
        registry
    } else {
        postgres::register(registry)
    };
    registry.sealed()
}
