//! [`ConfigLoader`]: the one way a configuration is read.

use std::fmt;
use std::path::Path;

use super::Registry;
use crate::config::{Config, ConfigError, ConfigProblem};

/// The one way to read a configuration: from a file or from text, each
/// table checked against a [`Registry`]'s components, `${VAR}` taken from
/// the process environment or from the variables [`env`](Self::env)
/// gives. Made by [`Registry::loader`].
///
/// ```
/// let registry = etl_config::Registry::new();
/// let config = registry
///     .loader()
///     .env(|name| (name == "OUT").then(|| "out.ndjson".to_owned()))
///     .text(
///         r#"
///         [source]
///         type = "generator"
///         records_per_partition = 10
///
///         [[sinks]]
///         type = "file"
///         path = "${OUT}"
///         "#,
///         "/srv/etl".as_ref(),
///     )
///     .unwrap();
/// assert_eq!(config.sinks.len(), 1);
/// ```
pub struct ConfigLoader<'r> {
    registry: &'r Registry,
    /// The variables `${VAR}` reads; `None`: the process environment's.
    env: Option<Variables<'r>>,
}

/// Where `${VAR}` is looked up: `None` for a variable that is not set.
type Variables<'r> = Box<dyn Fn(&str) -> Option<String> + 'r>;

impl fmt::Debug for ConfigLoader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfigLoader")
            .field("registry", &self.registry)
            .field("own_variables", &self.env.is_some())
            .finish()
    }
}

impl<'r> ConfigLoader<'r> {
    pub(super) fn new(registry: &'r Registry) -> Self {
        ConfigLoader {
            registry,
            env: None,
        }
    }

    /// Take `${VAR}` from `env` (`None`: not set) instead of the process
    /// environment.
    ///
    /// Only string values are interpolated, once, after the text is
    /// parsed: comments, keys and other values never are, and a
    /// variable's value is never read as TOML. `${NAME}` is the variable's
    /// value, `${NAME:-default}` the default when it is unset or empty,
    /// `${NAME-default}` when it is unset; `$$` is a literal `$`, and any
    /// other `$` stays as it is. An unset variable without a default is a
    /// problem at the line of its string. A value a variable gives to a
    /// secret (a key or variable whose name says password, secret, key,
    /// token, url...) appears in no problem.
    #[must_use]
    pub fn env(mut self, env: impl Fn(&str) -> Option<String> + 'r) -> Self {
        self.env = Some(Box::new(env));
        self
    }

    /// Read and check the configuration file at `path`; relative paths in
    /// it are resolved against the file's folder.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Read`] when the file cannot be read,
    /// [`ConfigError::Invalid`] with every problem found otherwise.
    pub fn file(&self, path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        self.text(&text, base)
            .map_err(|problems| ConfigError::Invalid {
                path: path.to_owned(),
                problems,
            })
    }

    /// Read and check configuration text; `base` resolves relative paths
    /// in it.
    ///
    /// # Errors
    ///
    /// Every problem found, in file order, each at its line and column.
    pub fn text(&self, text: &str, base: &Path) -> Result<Config, Vec<ConfigProblem>> {
        match &self.env {
            Some(env) => {
                crate::config::parse_with_env(self.registry, text, base, &|name| env(name).map(Ok))
            }
            None => crate::config::parse_with_process_env(self.registry, text, base),
        }
    }
}
