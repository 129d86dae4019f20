//! A registered type's factory, and a component of that type as a
//! configuration names it.

use std::any::Any;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;

use super::BoxError;
use super::plugin::{CheckFn, CheckReport, Facts};
use crate::config::{CheckpointOptions, ConnectorTable, Secrets, StoreConfig};

/// What a factory knows besides its config struct.
#[derive(Debug)]
pub struct ComponentContext<'a> {
    name: &'a str,
    base: &'a Path,
    parts: &'a ContextParts<'a>,
}

/// What the pipeline being built tells its components (given by the
/// runtime to [`Component::build`]).
#[derive(Debug)]
pub struct ContextParts<'a> {
    /// The configuration's `[checkpoint]` section.
    pub checkpoint: &'a CheckpointOptions,
    /// The source: every record is parsed as JSON after it (by the
    /// first step, or by the only sink of a pipeline without steps).
    pub steps_check_json: bool,
    /// A sink: every value reaching it is known to be JSON.
    pub values_are_json: bool,
    /// A sink: several processes of this pipeline share its progress.
    pub progress_is_shared: bool,
}

static DEFAULT_CHECKPOINT: LazyLock<CheckpointOptions> = LazyLock::new(CheckpointOptions::default);
static NO_PARTS: LazyLock<ContextParts<'static>> = LazyLock::new(|| ContextParts {
    checkpoint: &DEFAULT_CHECKPOINT,
    steps_check_json: false,
    values_are_json: false,
    progress_is_shared: false,
});

impl ComponentContext<'_> {
    /// The component's name: a sink's `name`, `dead_letter`, `source`, or
    /// `transform N` (1-based) for the Nth `[[transforms]]` entry.
    #[must_use]
    pub fn name(&self) -> &str {
        self.name
    }

    /// The configuration file's folder, against which the built-ins
    /// resolve relative paths.
    #[must_use]
    pub fn base_dir(&self) -> &Path {
        self.base
    }

    /// `path` resolved as the built-ins resolve theirs: against the
    /// configuration file's folder unless it is absolute.
    #[must_use]
    pub fn resolve(&self, path: impl AsRef<Path>) -> PathBuf {
        self.base.join(path)
    }

    /// The configuration's `[checkpoint]` section.
    #[must_use]
    pub fn checkpoint(&self) -> &CheckpointOptions {
        self.parts.checkpoint
    }

    /// The folder of the file offset store, if that is the store: where
    /// a source keeps what gives its offsets meaning (which file each
    /// partition is).
    #[must_use]
    pub fn state_dir(&self) -> Option<&Path> {
        match &self.parts.checkpoint.store {
            StoreConfig::File { path } => Some(path),
            StoreConfig::Memory | StoreConfig::Source => None,
        }
    }

    /// For a source: every record is parsed as JSON before it is
    /// delivered, and what is not JSON goes to the dead-letter path with
    /// the parser's reason (the first step reads JSON; or the only sink
    /// of a pipeline without steps, built from its configuration alone,
    /// reads every value as JSON and a `[dead_letter]` sink takes what it
    /// refuses), so the source need not check it too.
    #[must_use]
    pub fn steps_check_json(&self) -> bool {
        self.parts.steps_check_json
    }

    /// For a sink: every value reaching it is known to be JSON, so an
    /// NDJSON encoder may skip its check.
    #[must_use]
    pub fn values_are_json(&self) -> bool {
        self.parts.values_are_json
    }

    /// For a sink: several processes run this pipeline, each with its
    /// own partitions (the source's consumer group), and share the
    /// progress an exactly-once sink stores.
    #[must_use]
    pub fn progress_is_shared(&self) -> bool {
        self.parts.progress_is_shared
    }
}

/// Reads a component's table into its config struct: `Err` with serde's
/// error when it does not fit.
type ReadFn = dyn Fn(toml::Value) -> Result<Box<dyn Any>, PathError> + Send + Sync;
/// A deserialization error with the path of the field it is about.
pub(crate) type PathError = serde_path_to_error::Error<toml::de::Error>;
/// Checks what [`ReadFn`] read.
type CheckAnyFn = dyn Fn(&dyn Any, &mut CheckReport<'_>) + Send + Sync;
/// Builds a component from its table.
type BuildFn<T> = dyn Fn(toml::Value, &ComponentContext<'_>) -> Result<T, BoxError> + Send + Sync;

/// One registered component type.
pub(crate) struct Factory<T> {
    read: Arc<ReadFn>,
    check: Arc<CheckAnyFn>,
    build: Arc<BuildFn<T>>,
    /// Keys of its table that are paths, resolved when it is loaded.
    pub(crate) paths: Arc<Vec<String>>,
}

impl<T> Clone for Factory<T> {
    fn clone(&self) -> Self {
        Factory {
            read: self.read.clone(),
            check: self.check.clone(),
            build: self.build.clone(),
            paths: self.paths.clone(),
        }
    }
}

impl<T> Factory<T> {
    pub(crate) fn new<C, F>(factory: F, check: Option<Arc<CheckFn<C>>>, paths: Vec<String>) -> Self
    where
        C: DeserializeOwned + 'static,
        F: Fn(C, &ComponentContext<'_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        Factory {
            read: Arc::new(|value: toml::Value| {
                serde_path_to_error::deserialize::<_, C>(value).map(|c| Box::new(c) as Box<dyn Any>)
            }),
            check: Arc::new(move |config: &dyn Any, report: &mut CheckReport<'_>| {
                if let (Some(check), Some(config)) = (&check, config.downcast_ref::<C>()) {
                    check(config, report);
                }
            }),
            build: Arc::new(move |value, context| {
                let config = C::deserialize(value).map_err(|e| e.message().to_owned())?;
                factory(config, context)
            }),
            paths: Arc::new(paths),
        }
    }

    /// Read `value` into the type's config struct.
    pub(crate) fn read(&self, value: toml::Value) -> Result<Box<dyn Any>, PathError> {
        (self.read)(value)
    }

    /// The type's own checks of what [`read`](Self::read) gave.
    pub(crate) fn check(&self, config: &dyn Any, report: &mut CheckReport<'_>) {
        (self.check)(config, report);
    }
}

/// A component as a configuration names it: its `type`, the rest of its
/// table, and its type's factory. The table may hold secrets: it is kept
/// as a secret box, zeroed when dropped, and `Debug` shows the type only.
pub struct Component<T> {
    type_name: String,
    table: ConnectorTable,
    base: PathBuf,
    factory: Factory<T>,
    /// Every secret of the configuration it came from (of its own table
    /// and of every other), kept out of its factory's errors.
    secrets: Secrets,
    pub(crate) facts: Facts,
}

impl<T> Component<T> {
    pub(crate) fn new(
        type_name: String,
        table: toml::Table,
        base: PathBuf,
        factory: Factory<T>,
        secrets: Secrets,
        facts: Facts,
    ) -> Self {
        Component {
            type_name,
            table: ConnectorTable::new(table),
            base,
            factory,
            secrets,
            facts,
        }
    }

    /// The `type` it was registered under.
    #[must_use]
    pub fn type_name(&self) -> &str {
        &self.type_name
    }

    /// Its table, without `type` (and, for a sink, without `name` and the
    /// driver options), paths resolved: a secret, read with
    /// [`ExposeSecret::expose_secret`].
    #[must_use]
    pub fn table(&self) -> &ConnectorTable {
        &self.table
    }

    /// Its table read into `C` (the struct of its type, say
    /// [`FileSourceOptions`](crate::config::FileSourceOptions)); `None`
    /// when it does not fit.
    #[must_use]
    pub fn options<C: DeserializeOwned>(&self) -> Option<C> {
        C::deserialize(toml::Value::Table(self.table.expose_secret().clone())).ok()
    }

    /// Its table read into `C` when its type is `type_name`: the options
    /// of a built-in, say `options_of::<FileSourceOptions>("file")`.
    #[must_use]
    pub fn options_of<C: DeserializeOwned>(&self, type_name: &str) -> Option<C> {
        (self.type_name == type_name)
            .then(|| self.options())
            .flatten()
    }

    /// Whether it is a source that keeps its own offsets (a consumer
    /// group), so that no offset store of the pipeline holds them.
    #[must_use]
    pub fn keeps_offsets(&self) -> bool {
        self.facts.keeps_offsets
    }

    /// Whether it is a sink that stores its progress with its data.
    #[must_use]
    pub fn is_exactly_once(&self) -> bool {
        self.facts.exactly_once
    }

    /// Whether it is a sink that reads every value as JSON and refuses
    /// what is not (see [`CheckReport::reads_values_as_json`](crate::CheckReport::reads_values_as_json)).
    #[must_use]
    pub fn reads_values_as_json(&self) -> bool {
        self.facts.reads_json
    }

    /// Build it with its factory, as `name`: the factory's error as it
    /// gave it (see [`redacted`](Self::redacted) before showing it).
    ///
    /// # Errors
    ///
    /// Whatever its factory returns, or its table not fitting its type.
    pub fn build(&self, name: &str, parts: &ContextParts<'_>) -> Result<T, BoxError> {
        let context = ComponentContext {
            name,
            base: &self.base,
            parts,
        };
        (self.factory.build)(
            toml::Value::Table(self.table.expose_secret().clone()),
            &context,
        )
    }

    /// A factory's error `e` for `name`, as shown: a factory may quote its
    /// configuration in its error, so any secret of the configuration, in
    /// this table or another, is taken out.
    #[must_use]
    pub fn redacted(&self, name: &str, e: &dyn fmt::Display) -> String {
        self.secrets
            .redact(&format!("{} {name:?}: {e}", self.type_name))
    }

    /// Build it with a context that knows nothing of the pipeline (a
    /// transform's); the error as shown.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build): a [`BuildError`] naming the type and
    /// `name`, the factory's error and its sources with every secret of
    /// the configuration taken out (its text is what
    /// [`redacted`](Self::redacted) shows).
    pub fn build_alone(&self, name: &str) -> Result<T, BuildError> {
        self.build(name, &NO_PARTS).map_err(|e| BuildError {
            type_name: self.type_name.clone(),
            name: name.to_owned(),
            source: RedactedError::new(&*e, &self.secrets),
        })
    }
}

/// A component its factory could not build
/// ([`Component::build_alone`]): its type, its name, and the factory's
/// error as shown. Shown as `<type> "<name>": <the factory's error>`.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{type_name} {name:?}: {source}")]
pub struct BuildError {
    /// The type the component was registered under.
    pub type_name: String,
    /// The name it was built as (`transform 2`, a sink's name).
    pub name: String,
    /// The factory's error, secrets taken out.
    #[source]
    pub source: RedactedError,
}

/// An error as it may be shown: the text of an error and of each of its
/// sources, in their order, with every secret of the configuration it
/// came from replaced by `***`. The error itself is not kept (its text or
/// `Debug` could quote a password); [`source`](std::error::Error::source)
/// walks the same chain, redacted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedactedError {
    message: String,
    source: Option<Box<RedactedError>>,
}

impl RedactedError {
    fn new(error: &(dyn std::error::Error + 'static), secrets: &Secrets) -> Self {
        RedactedError {
            message: secrets.redact(&error.to_string()),
            source: error
                .source()
                .map(|source| Box::new(RedactedError::new(source, secrets))),
        }
    }
}

impl fmt::Display for RedactedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RedactedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|source| source as &(dyn std::error::Error + 'static))
    }
}

impl<T> Clone for Component<T> {
    fn clone(&self) -> Self {
        Component {
            type_name: self.type_name.clone(),
            table: self.table.clone(),
            base: self.base.clone(),
            factory: self.factory.clone(),
            secrets: self.secrets.clone(),
            facts: self.facts.clone(),
        }
    }
}

impl<T> PartialEq for Component<T> {
    fn eq(&self, other: &Self) -> bool {
        self.type_name == other.type_name && self.table == other.table && self.base == other.base
    }
}

impl<T> fmt::Debug for Component<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Component")
            .field("type", &self.type_name)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::path::Path;

    use crate::Registry;
    use crate::config::TransformConfig;

    /// What a factory may fail with: a cause that quotes its table.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot reach {0}")]
    struct Unreachable(String, #[source] std::io::Error);

    #[test]
    fn a_factory_s_error_keeps_its_sources_with_the_secrets_taken_out() {
        #[derive(serde::Deserialize)]
        struct Options {
            host: String,
            token: String,
        }
        let registry = Registry::new().transform("lookup", |o: Options, _| {
            let cause = std::io::Error::other(format!("refused with token {}", o.token));
            Err(Unreachable(o.host, cause).into())
        });
        let config = registry
            .loader()
            .text(
                "[source]\ntype = \"generator\"\n\n[[transforms]]\ntype = \"lookup\"\n\
                 host = \"svc\"\ntoken = \"hunter22\"\n\n[[sinks]]\ntype = \"blackhole\"\n",
                Path::new("."),
            )
            .expect("it loads");
        let TransformConfig::Custom(lookup) = &config.transforms[0] else {
            panic!("a registered step: {:?}", config.transforms[0]);
        };
        let Err(err) = lookup.build_alone("transform 1") else {
            panic!("the factory fails");
        };
        assert_eq!(err.to_string(), "lookup \"transform 1\": cannot reach svc");
        assert_eq!(
            (err.type_name.as_str(), err.name.as_str()),
            ("lookup", "transform 1")
        );
        let chain: Vec<String> = std::iter::successors(err.source(), |e| (*e).source())
            .map(ToString::to_string)
            .collect();
        assert_eq!(chain, ["cannot reach svc", "refused with token ***"]);
        assert!(!format!("{err:?}").contains("hunter22"), "{err:?}");
    }
}
