//! Your own sources, sinks and transforms, configured from the TOML file
//! like the built-ins.
//!
//! A [`Registry`] maps a `type` name to a factory and the config struct it
//! takes (any `serde::Deserialize`). A configuration read through the
//! registry ([`Registry::load_config`], [`Registry::parse_config`]) reads
//! a `[source]`, `[[transforms]]`, `[[sinks]]` or `[dead_letter]` table
//! whose `type` the registry knows into that struct, with every problem
//! reported at its line like a built-in's; [`pipeline_from_config`] then
//! builds the component with its factory. `etl_cli::main_with` (crate
//! `etl-cli`) is the `etl` command with a registry, so `etl validate` and `etl run` know your
//! components.
//!
//! [`pipeline_from_config`]: crate::pipeline_from_config

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use etl_sink::Sink;
use etl_source::Source;
use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;

use crate::Transform;
use crate::config::{Config, ConfigError, ConfigProblem, ConnectorTable, Secrets};

/// An error a factory returns, for any cause.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a factory knows besides its config struct.
#[derive(Debug)]
pub struct ComponentContext<'a> {
    name: &'a str,
    base: &'a Path,
}

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
}

/// Reads a component's table into its config struct: `Err` with serde's
/// message when it does not fit.
type CheckFn = dyn Fn(toml::Value) -> Result<(), toml::de::Error> + Send + Sync;
/// Builds a component from its table.
type BuildFn<T> = dyn Fn(toml::Value, &ComponentContext<'_>) -> Result<T, BoxError> + Send + Sync;

/// One registered component type.
pub(crate) struct Factory<T> {
    pub(crate) check: Arc<CheckFn>,
    build: Arc<BuildFn<T>>,
}

impl<T> Clone for Factory<T> {
    fn clone(&self) -> Self {
        Factory {
            check: self.check.clone(),
            build: self.build.clone(),
        }
    }
}

impl<T> Factory<T> {
    fn new<C, F>(factory: F) -> Self
    where
        C: DeserializeOwned + 'static,
        F: Fn(C, &ComponentContext<'_>) -> Result<T, BoxError> + Send + Sync + 'static,
    {
        Factory {
            check: Arc::new(|value: toml::Value| C::deserialize(value).map(drop)),
            build: Arc::new(move |value, context| {
                let config = C::deserialize(value).map_err(|e| e.message().to_owned())?;
                factory(config, context)
            }),
        }
    }
}

/// A component of a registered type as a configuration names it: its
/// `type`, the rest of its table, and its factory. The table may hold
/// secrets: it is kept as the connectors' tables are (a secret box,
/// zeroed when dropped), and `Debug` shows the type only.
pub struct Custom<T> {
    type_name: String,
    table: ConnectorTable,
    base: PathBuf,
    factory: Factory<T>,
    /// Every secret of the configuration it came from (of its own table
    /// and of every other), kept out of its factory's errors.
    secrets: Secrets,
}

impl<T> Custom<T> {
    pub(crate) fn new(
        type_name: String,
        table: toml::Table,
        base: PathBuf,
        factory: Factory<T>,
        secrets: Secrets,
    ) -> Self {
        Custom {
            type_name,
            table: ConnectorTable::new(table),
            base,
            factory,
            secrets,
        }
    }

    /// The `type` it was registered under.
    #[must_use]
    pub fn type_name(&self) -> &str {
        &self.type_name
    }

    /// Build it with its factory, as `name`.
    pub(crate) fn build(&self, name: &str) -> Result<T, String> {
        let context = ComponentContext {
            name,
            base: &self.base,
        };
        (self.factory.build)(
            toml::Value::Table(self.table.expose_secret().clone()),
            &context,
        )
        // A factory may quote its configuration in its error: any secret
        // of the configuration, in this table or another, is taken out.
        .map_err(|e| {
            self.secrets
                .redact(&format!("{} {name:?}: {e}", self.type_name))
        })
    }
}

impl<T> Clone for Custom<T> {
    fn clone(&self) -> Self {
        Custom {
            type_name: self.type_name.clone(),
            table: self.table.clone(),
            base: self.base.clone(),
            factory: self.factory.clone(),
            secrets: self.secrets.clone(),
        }
    }
}

impl<T> PartialEq for Custom<T> {
    fn eq(&self, other: &Self) -> bool {
        self.type_name == other.type_name && self.table == other.table && self.base == other.base
    }
}

impl<T> fmt::Debug for Custom<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Custom")
            .field("type", &self.type_name)
            .finish_non_exhaustive()
    }
}

/// Sources, sinks and transforms by `type` name, with their factories.
///
/// ```
/// use etl::{Registry, map};
/// use etl_record::Record;
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
///     .parse_config(
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
///     .parse_config(
///         "[source]\ntype = \"generator\"\n[[transforms]]\ntype = \"suffix\"\nsufix = \"!\"\n[[sinks]]\ntype = \"blackhole\"\n",
///         ".".as_ref(),
///     )
///     .unwrap_err();
/// assert!(problems.iter().any(|p| p.line == 5 && p.message.contains("unknown field `sufix`")));
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    pub(crate) sources: BTreeMap<String, Factory<Box<dyn Source>>>,
    pub(crate) sinks: BTreeMap<String, Factory<Box<dyn Sink>>>,
    pub(crate) transforms: BTreeMap<String, Factory<Box<dyn Transform>>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("sources", &self.sources.keys().collect::<Vec<_>>())
            .field("sinks", &self.sinks.keys().collect::<Vec<_>>())
            .field("transforms", &self.transforms.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The built-in `type`s, which a registered one may not shadow.
const BUILT_IN_SOURCES: &[&str] = &["file", "generator", "kafka"];
const BUILT_IN_SINKS: &[&str] = &["file", "stdout", "blackhole", "kafka", "postgres"];
const BUILT_IN_TRANSFORMS: &[&str] = &[
    "parse_json",
    "filter",
    "remap",
    "add_field",
    "rename_field",
    "drop_field",
];

fn register<T>(
    map: &mut BTreeMap<String, Factory<T>>,
    built_in: &[&str],
    kind: &str,
    type_name: &str,
    factory: Factory<T>,
) {
    assert!(
        !built_in.contains(&type_name),
        "`{type_name}` is a built-in {kind} type and cannot be registered again"
    );
    map.insert(type_name.to_owned(), factory);
}

impl Registry {
    /// No components beyond the built-ins.
    #[must_use]
    pub fn new() -> Self {
        Registry::default()
    }

    /// Register a source type: a `[source]` with `type = "<type_name>"` is
    /// read into `C` (without its `type`) and built by `factory`.
    ///
    /// # Panics
    ///
    /// When `type_name` is a built-in source type (`file`, `generator`,
    /// `kafka`).
    #[must_use]
    pub fn source<C, F>(mut self, type_name: &str, factory: F) -> Self
    where
        C: DeserializeOwned + 'static,
        F: Fn(C, &ComponentContext<'_>) -> Result<Box<dyn Source>, BoxError>
            + Send
            + Sync
            + 'static,
    {
        register(
            &mut self.sources,
            BUILT_IN_SOURCES,
            "source",
            type_name,
            Factory::new(factory),
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
    pub fn sink<C, F>(mut self, type_name: &str, factory: F) -> Self
    where
        C: DeserializeOwned + 'static,
        F: Fn(C, &ComponentContext<'_>) -> Result<Box<dyn Sink>, BoxError> + Send + Sync + 'static,
    {
        register(
            &mut self.sinks,
            BUILT_IN_SINKS,
            "sink",
            type_name,
            Factory::new(factory),
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
        register(
            &mut self.transforms,
            BUILT_IN_TRANSFORMS,
            "transform",
            type_name,
            Factory::new(factory),
        );
        self
    }

    /// [`crate::parse_config`] with this registry's components.
    ///
    /// # Errors
    ///
    /// Every problem found, in file order.
    pub fn parse_config(&self, text: &str, base: &Path) -> Result<Config, Vec<ConfigProblem>> {
        crate::config::parse_config_in(self, text, base)
    }

    /// [`crate::parse_config_with_env`] with this registry's components:
    /// `${VAR}` references read from `env` instead of the process
    /// environment.
    ///
    /// # Errors
    ///
    /// Every problem found, in file order.
    pub fn parse_config_with_env(
        &self,
        text: &str,
        base: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, Vec<ConfigProblem>> {
        crate::config::parse_config_with_env_in(self, text, base, env)
    }

    /// [`crate::load_config`] with this registry's components.
    ///
    /// # Errors
    ///
    /// As [`crate::load_config`].
    pub fn load_config(&self, path: &Path) -> Result<Config, ConfigError> {
        crate::config::load_config_in(self, path)
    }
}
