//! Every source, sink and transform type, built-in or yours, configured
//! from the TOML file the same way.
//!
//! A [`Registry`] maps a `type` name to a factory and the config struct it
//! takes (any `serde::Deserialize`). [`Registry::new`] holds the built-ins
//! (`file`, `generator`, `stdout`, `blackhole`, `kafka`, `postgres`, the
//! JSON steps), registered through the methods below like any other. A
//! configuration read through the registry ([`Registry::loader`], one
//! [`ConfigLoader`] for a file or for text) reads a `[source]`, `[[transforms]]`,
//! `[[sinks]]` or `[dead_letter]` table whose `type` the registry knows
//! into that struct, with every problem reported at its line and column;
//! [`pipeline_from_config`] then builds the component with its factory.
//! `etl_cli::main_with` (crate `etl-cli`) is the `etl` command with a
//! registry, so `etl validate` and `etl run` know your components.
//!
//! * [`Registry::source`], [`Registry::sink`], [`Registry::transform`]:
//!   a factory of a boxed component from its config struct.
//! * [`Registry::source_plugin`], [`Registry::sink_plugin`]: what a
//!   built-in has too. A [`SourcePlugin`] or [`SinkPlugin`] adds a check
//!   of the config struct at load time ([`CheckReport`]: problems at their
//!   key, the files read and written, exactly-once) and the table's path
//!   keys; its factory returns a [`BuiltSource`] (started with the
//!   checkpointer's handle, keeping its own offsets) or a [`BuiltSink`]
//!   (exactly-once through a `ProgressSink`, its encoder), and a sink's
//!   factory may connect ([`SinkPlugin::new_async`]).
//! * [`Registry::error_kind`]: the [`ErrorKind`] of a connector's errors,
//!   which the command line maps to an exit code.
//!
//! A connector crate ships a `register(Registry) -> Registry` function;
//! a program adds it with one line, `etl_cli::main_with(my_connector::
//! register(etl::Registry::new()))`.
//!
//! [`pipeline_from_config`]: https://docs.rs/etl/latest/etl/fn.pipeline_from_config.html

mod component;
mod loader;
mod plugin;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use etl_sink::Sink;
use etl_source::Source;
use serde::de::DeserializeOwned;

pub(crate) use component::Factory;
pub use component::{BuildError, Component, ComponentContext, ContextParts, RedactedError};
pub use plugin::{
    BoxFuture, BoxedProgressSink, BuiltSink, BuiltSource, CheckReport, ProgressCheck, SinkHold,
    SinkPlugin, SourcePlugin, SourceStart, StartWithHandle,
};

use crate::Transform;
pub use loader::ConfigLoader;

/// An error a factory returns, for any cause.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a failure is, whichever component met it: the command line maps
/// it to an exit code without knowing the component. A connector gives
/// its errors a kind with [`Registry::error_kind`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The configuration is wrong, whatever the state of the world:
    /// refused credentials, a failed TLS handshake, a setting the client
    /// refuses (exit 78).
    Config,
    /// Another run holds what this one needs: an offset store, an
    /// exactly-once output, a sink's progress (exit 75).
    InUse,
}

/// Gives an error of a component its [`ErrorKind`], if it knows it.
pub type ErrorKindFn =
    dyn Fn(&(dyn std::error::Error + 'static)) -> Option<ErrorKind> + Send + Sync;

/// Sources, sinks and transforms by `type` name, with their factories.
///
/// ```
/// use etl_config::Registry;
/// use etl_record::Record;
/// use etl_transform::map;
///
/// #[derive(serde::Deserialize)]
/// #[serde(deny_unknown_fields)]
/// struct Suffix {
///     suffix: String,
/// }
///
/// let registry = Registry::new().transform("suffix", |config: Suffix, _context| {
///     let suffix = config.suffix.into_bytes();
///     Ok(Box::new(map("suffix", move |mut record: Record| {
///         let mut value = record.value.to_vec();
///         value.extend_from_slice(&suffix);
///         record.value = value.into();
///         Ok(record)
///     })))
/// });
///
/// let config = registry
///     .loader()
///     .text(
///         r#"
///         [source]
///         type = "generator"
///         records_per_partition = 3
///
///         [[transforms]]
///         type = "suffix"
///         suffix = "!"
///
///         [[sinks]]
///         type = "blackhole"
///         "#,
///         ".".as_ref(),
///     )
///     .unwrap();
/// assert_eq!(config.transforms.len(), 1);
///
/// // A problem in the table is reported at its line, like a built-in's.
/// let problems = registry
///     .loader()
///     .text(
///         "[source]\ntype = \"generator\"\n[[transforms]]\ntype = \"suffix\"\nsufix = \"!\"\n[[sinks]]\ntype = \"blackhole\"\n",
///         ".".as_ref(),
///     )
///     .unwrap_err();
/// assert!(problems.iter().any(|p| p.line == 5 && p.message.contains("unknown field `sufix`")));
/// ```
#[derive(Clone)]
pub struct Registry {
    pub(crate) sources: BTreeMap<String, Factory<BuiltSource>>,
    pub(crate) sinks: BTreeMap<String, Factory<BoxFuture<Result<BuiltSink, BoxError>>>>,
    pub(crate) transforms: BTreeMap<String, Factory<Box<dyn Transform>>>,
    /// `(kind, type)` of the built-ins, which a registered type may not
    /// shadow.
    built_in: BTreeSet<(&'static str, String)>,
    error_kinds: Vec<Arc<ErrorKindFn>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("sources", &self.sources.keys().collect::<Vec<_>>())
            .field("sinks", &self.sinks.keys().collect::<Vec<_>>())
            .field("transforms", &self.transforms.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

/// The built-in transforms, read by the engine's own schema
/// ([`TransformConfig`](crate::config::TransformConfig)) so that runs of
/// them fuse into one pass over each record.
const BUILT_IN_TRANSFORMS: &[&str] = &[
    "parse_json",
    "filter",
    "remap",
    "add_field",
    "rename_field",
    "drop_field",
];

impl Registry {
    /// The built-in sources, sinks and transforms of the configuration
    /// language (`file`, `generator`, `stdout`, `blackhole`, the JSON
    /// steps), registered through the same methods as yours. The
    /// connectors with heavy dependencies (`kafka`, `postgres`) register
    /// from their own crates: `etl::registry()` has them too.
    #[must_use]
    pub fn new() -> Self {
        crate::connectors::register(Registry::empty()).sealed()
    }

    /// Every type registered so far made one a later registration may not
    /// replace (as the built-ins are).
    #[must_use]
    pub fn sealed(mut self) -> Self {
        let sources = self.sources.keys().map(|k| ("source", k.clone()));
        let sinks = self.sinks.keys().map(|k| ("sink", k.clone()));
        let transforms = BUILT_IN_TRANSFORMS
            .iter()
            .map(|k| ("transform", (*k).to_owned()));
        let sealed: Vec<_> = sources.chain(sinks).chain(transforms).collect();
        self.built_in.extend(sealed);
        self
    }

    /// Whether a source type of this name is registered.
    #[must_use]
    pub fn has_source(&self, type_name: &str) -> bool {
        self.sources.contains_key(type_name)
    }

    /// Whether a sink type of this name is registered.
    #[must_use]
    pub fn has_sink(&self, type_name: &str) -> bool {
        self.sinks.contains_key(type_name)
    }

    /// No components at all, not even the built-ins: for a program that
    /// registers only its own.
    #[must_use]
    pub fn empty() -> Self {
        Registry {
            sources: BTreeMap::new(),
            sinks: BTreeMap::new(),
            transforms: BTreeMap::new(),
            built_in: BTreeSet::new(),
            error_kinds: Vec::new(),
        }
    }

    fn check_free(&self, kind: &'static str, type_name: &str) {
        assert!(
            !self.built_in.contains(&(kind, type_name.to_owned())),
            "`{type_name}` is a built-in {kind} type and cannot be registered again"
        );
    }

    /// Register a source type: a `[source]` with `type = "<type_name>"` is
    /// read into `C` (without its `type`) and built by `factory`.
    ///
    /// # Panics
    ///
    /// When `type_name` is a built-in source type (`file`, `generator`,
    /// `kafka`).
    #[must_use]
    pub fn source<C, F>(self, type_name: &str, factory: F) -> Self
    where
        C: DeserializeOwned + 'static,
        F: Fn(C, &ComponentContext<'_>) -> Result<Box<dyn Source>, BoxError>
            + Send
            + Sync
            + 'static,
    {
        self.source_plugin(
            type_name,
            SourcePlugin::new(move |config: C, context| {
                factory(config, context).map(BuiltSource::boxed)
            }),
        )
    }

    /// Register a source type with everything a built-in has: a factory
    /// returning a [`BuiltSource`] (a source started with the
    /// checkpointer's handle, one that keeps its own offsets), a check of
    /// its table at load time, and its path keys.
    ///
    /// # Panics
    ///
    /// When `type_name` is a built-in source type.
    #[must_use]
    pub fn source_plugin<C: DeserializeOwned + 'static>(
        mut self,
        type_name: &str,
        plugin: SourcePlugin<C>,
    ) -> Self {
        self.check_free("source", type_name);
        let SourcePlugin {
            build,
            check,
            paths,
        } = plugin;
        self.sources.insert(
            type_name.to_owned(),
            Factory::new(move |config, context| build(config, context), check, paths),
        );
        self
    }

    /// Register a sink type, for `[[sinks]]` and `[dead_letter]`: the
    /// table without its `type`, `name` and driver options
    /// (`batch_max_records`, `linger`, `retry`, ...) is read into `C`. The
    /// sink gets its batches encoded as NDJSON (and each record, for a
    /// sink that writes rows).
    ///
    /// # Panics
    ///
    /// When `type_name` is a built-in sink type.
    #[must_use]
    pub fn sink<C, F>(self, type_name: &str, factory: F) -> Self
    where
        C: DeserializeOwned + 'static,
        F: Fn(C, &ComponentContext<'_>) -> Result<Box<dyn Sink>, BoxError> + Send + Sync + 'static,
    {
        self.sink_plugin(
            type_name,
            SinkPlugin::new(move |config: C, context| {
                factory(config, context).map(BuiltSink::boxed)
            }),
        )
    }

    /// Register a sink type with everything a built-in has: a factory
    /// (which may connect: [`SinkPlugin::new_async`]) returning a
    /// [`BuiltSink`] (an exactly-once sink, its encoder), a check of its
    /// table at load time, and its path keys. The driver options every
    /// sink shares are read by the loader as for [`sink`](Self::sink).
    ///
    /// # Panics
    ///
    /// When `type_name` is a built-in sink type.
    #[must_use]
    pub fn sink_plugin<C: DeserializeOwned + 'static>(
        mut self,
        type_name: &str,
        plugin: SinkPlugin<C>,
    ) -> Self {
        self.check_free("sink", type_name);
        let SinkPlugin {
            build,
            check,
            paths,
        } = plugin;
        self.sinks.insert(
            type_name.to_owned(),
            Factory::new(
                move |config, context| Ok(build(config, context)),
                check,
                paths,
            ),
        );
        self
    }

    /// Register a transform type for `[[transforms]]`: the table without
    /// its `type` is read into `C`.
    ///
    /// # Panics
    ///
    /// When `type_name` is a built-in transform type.
    #[must_use]
    pub fn transform<C, F>(mut self, type_name: &str, factory: F) -> Self
    where
        C: DeserializeOwned + 'static,
        F: Fn(C, &ComponentContext<'_>) -> Result<Box<dyn Transform>, BoxError>
            + Send
            + Sync
            + 'static,
    {
        self.check_free("transform", type_name);
        assert!(
            !BUILT_IN_TRANSFORMS.contains(&type_name),
            "`{type_name}` is a built-in transform type and cannot be registered again"
        );
        self.transforms.insert(
            type_name.to_owned(),
            Factory::new(factory, None, Vec::new()),
        );
        self
    }

    /// Give the errors of a component an [`ErrorKind`]: `classify` is
    /// asked of every error in a failure's `source()` chain, and the
    /// command line exits with the code of the first kind given.
    #[must_use]
    pub fn error_kind(
        mut self,
        classify: impl Fn(&(dyn std::error::Error + 'static)) -> Option<ErrorKind>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.error_kinds.push(Arc::new(classify));
        self
    }

    /// The [`ErrorKind`] of `error` or of an error under it, as the
    /// registered components classify them.
    #[must_use]
    pub fn classify(&self, error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
        std::iter::successors(Some(error), |e| e.source())
            .find_map(|e| self.error_kinds.iter().find_map(|classify| classify(e)))
    }

    /// The one way to read a configuration with this registry's
    /// components: [`ConfigLoader::file`] or [`ConfigLoader::text`],
    /// `${VAR}` from the process environment unless
    /// [`ConfigLoader::env`] gives the variables.
    #[must_use]
    pub fn loader(&self) -> ConfigLoader<'_> {
        ConfigLoader::new(self)
    }
}
