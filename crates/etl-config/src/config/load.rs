//! Loading a configuration file: parse, then check every section, keeping
//! every problem with its line and column so `etl validate` can report
//! them all at once.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use toml::Spanned;
use toml_edit::ImDocument;

use super::interpolate::{Interpolated, Secrets, interpolate};
use super::schema::*;
use crate::registry::{CheckReport, Component, Factory, Registry};
use std::collections::BTreeMap;

/// A value read from a section, and the section's place.
type Placed<T> = (T, Range<usize>);

/// One problem in a configuration file, with its place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigProblem {
    /// 1-based line of the problem (or of its section).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The section, e.g. `[source]` or `[[sinks]] #2`.
    pub section: String,
    /// What is wrong.
    pub message: String,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file was read but has problems.
    #[error("{}", render(path, problems))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Every problem found, in file order.
        problems: Vec<ConfigProblem>,
    },
}

fn render(path: &Path, problems: &[ConfigProblem]) -> String {
    let mut out = format!(
        "{} has {} problem{}:",
        path.display(),
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    );
    for p in problems {
        out.push_str(&format!(
            "\n  {}:{}:{}: {}: {}",
            path.display(),
            p.line,
            p.column,
            p.section,
            p.message
        ));
    }
    out
}

/// Read and check a configuration file; relative paths in it are resolved
/// against the file's folder, and `${VAR}` in its string values is taken
/// from the environment (see [`parse_config`]).
///
/// # Errors
///
/// [`ConfigError::Read`] when the file cannot be read,
/// [`ConfigError::Invalid`] with every problem found otherwise.
pub fn load_config(path: &Path) -> Result<Config, ConfigError> {
    load_config_in(&Registry::new(), path)
}

/// [`load_config`] with `registry`'s components.
pub(crate) fn load_config_in(registry: &Registry, path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse_config_in(registry, &text, base).map_err(|problems| ConfigError::Invalid {
        path: path.to_owned(),
        problems,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoc {
    source: Option<Spanned<toml::Value>>,
    #[serde(default)]
    transforms: Vec<Spanned<toml::Value>>,
    #[serde(default)]
    sinks: Vec<Spanned<toml::Value>>,
    dead_letter: Option<Spanned<toml::Value>>,
    delivery: Option<Spanned<toml::Value>>,
    limits: Option<Spanned<toml::Value>>,
    checkpoint: Option<Spanned<toml::Value>>,
}

/// Fields of a `[[sinks]]` entry that drive the sink rather than configure it.
const SINK_OPTION_KEYS: &[&str] = &[
    "batch_max_records",
    "batch_max_bytes",
    "linger",
    "concurrency",
    "retry",
    "write_timeout",
    "on_permanent_error",
];

/// The shortest `[checkpoint] shutdown_timeout` a file may set.
const MIN_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// Options that were renamed so that the file and the Rust types use one
/// name each: an old name gets a pointer to the new one.
const RENAMED: &[(&str, &str)] = &[
    ("batch_records", "max_batch_records"),
    ("timeout", "write_timeout"),
    (
        "retry_max_elapsed",
        "retry.max_elapsed (a [sinks.retry] table)",
    ),
];

pub(super) struct Checker<'a> {
    pub(super) text: &'a str,
    problems: Vec<ConfigProblem>,
    /// What works but is likely a mistake; never stops a run.
    warnings: Vec<ConfigProblem>,
    /// The parsed text, for the place of a key inside a section.
    doc: Option<ImDocument<&'a str>>,
    /// Every secret of the whole configuration, for what registered
    /// components print.
    secrets: Secrets,
}

impl Checker<'_> {
    /// A problem at the key `path` (a key of the section, then keys inside
    /// it) of the section `at` (`source`, or `sinks` and an index), or at
    /// the section's first line when it is not written there.
    pub(super) fn problem_at_path(
        &mut self,
        at: (&str, Option<usize>),
        path: &[String],
        span: Range<usize>,
        section: &str,
        message: impl Into<String>,
    ) {
        let found = self
            .doc
            .as_ref()
            .and_then(|doc| key_span(doc.as_table(), at, path));
        let start = found.map_or(span.start, |s| s.start);
        self.problem(start..start, section, message);
    }

    pub(super) fn problem(
        &mut self,
        span: Range<usize>,
        section: &str,
        message: impl Into<String>,
    ) {
        let problem = self.placed(span, section, message.into());
        self.problems.push(problem);
    }

    /// A warning (see [`Config::warnings`]) at the start of `span`.
    #[cfg_attr(
        not(feature = "remap"),
        allow(dead_code, reason = "only VRL programs have warnings")
    )]
    pub(super) fn warning(
        &mut self,
        span: Range<usize>,
        section: &str,
        message: impl Into<String>,
    ) {
        let warning = self.placed(span, section, message.into());
        self.warnings.push(warning);
    }

    fn placed(&self, span: Range<usize>, section: &str, message: String) -> ConfigProblem {
        let (line, column) = line_col(self.text, span.start);
        ConfigProblem {
            line,
            column,
            section: section.to_owned(),
            message,
        }
    }

    /// A problem at the line of `key` inside the section at `span`, or at
    /// the section itself when the key is not written there.
    pub(super) fn problem_at(
        &mut self,
        span: Range<usize>,
        key: &str,
        section: &str,
        message: impl Into<String>,
    ) {
        let at = find_key(self.text, &span, key).unwrap_or(span.start);
        self.problem(at..at, section, message);
    }

    /// A deserialization error: point at the field or value it names, and
    /// name the key of that line when the message does not.
    /// Returns the key the problem is at, when there is one.
    fn serde_problem(
        &mut self,
        span: Range<usize>,
        section: &str,
        message: &str,
    ) -> Option<String> {
        let token = quoted_token(message, '`').or_else(|| quoted_token(message, '"'));
        let at = token
            .and_then(|t| find_key(self.text, &span, t).or_else(|| find_text(self.text, &span, t)))
            .unwrap_or(span.start);
        let key = key_of_line(self.text, at).map(|key| {
            // A value inside an inline table (`retry = { max_elapsed =
            // "..." }`) is named by its full path.
            match inline_key_before(self.text, at) {
                Some(inner) if inner != key => format!("{key}.{inner}"),
                _ => key.to_owned(),
            }
        });
        let renamed = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next())
            .and_then(|old| RENAMED.iter().find(|(o, _)| *o == old))
            .map(|(_, new)| format!(" (renamed to {new})"))
            .unwrap_or_default();
        let message = format!("{message}{renamed}");
        let message = match &key {
            Some(key) if !message.contains(key.as_str()) => format!("{key}: {message}"),
            _ => message,
        };
        self.problem(at..at, section, message);
        key
    }

    /// A problem at `key` unless `value` is at least 1.
    fn at_least_one(&mut self, span: &Range<usize>, section: &str, key: &str, value: u64) {
        if value == 0 {
            self.problem_at(
                span.clone(),
                key,
                section,
                format!("{key} must be at least 1"),
            );
        }
    }

    /// A problem at `key` unless `value` is above zero.
    fn above_zero(&mut self, span: &Range<usize>, section: &str, key: &str, value: Duration) {
        if value.is_zero() {
            self.problem_at(
                span.clone(),
                key,
                section,
                format!("{key} must be above zero"),
            );
        }
    }

    /// A table whose `type` is registered in `factories`, read into its
    /// type's config struct (every field that does not fit reported,
    /// string values of secret-looking keys kept out of the messages),
    /// then checked by its type, each problem at its key; `at` is the
    /// section in the document (`("sinks", Some(index))`), `checkpoint`
    /// what its type checks against. Its path keys are resolved against
    /// `base` once checked.
    #[allow(clippy::too_many_arguments, reason = "one call per kind of section")]
    fn component<T>(
        &mut self,
        factories: &BTreeMap<String, Factory<T>>,
        kind: &str,
        name: &str,
        value: Spanned<toml::Value>,
        at: (&str, Option<usize>),
        section: &str,
        base: &Path,
        checkpoint: (&CheckpointOptions, &Range<usize>),
    ) -> Option<Placed<Component<T>>> {
        let span = value.span();
        let toml::Value::Table(mut table) = value.into_inner() else {
            self.problem(span, section, format!("a {kind} must be a table"));
            return None;
        };
        let type_name = match table.remove("type") {
            Some(toml::Value::String(t)) => t,
            Some(other) => {
                self.problem_at(
                    span,
                    "type",
                    section,
                    format!("type must be a string, not {}", other.type_str()),
                );
                return None;
            }
            None => {
                self.problem(span, section, "missing field `type`");
                return None;
            }
        };
        let Some(factory) = factories.get(&type_name) else {
            let known: Vec<String> = factories.keys().map(|k| format!("`{k}`")).collect();
            let start = self
                .doc
                .as_ref()
                .and_then(|doc| value_span(doc.as_table(), at, &["type".to_owned()], self.text))
                .map_or(span.start, |s| s.start);
            self.problem(
                start..start,
                section,
                format!(
                    "unknown {kind} type `{type_name}`, expected one of {}",
                    known.join(", ")
                ),
            );
            return None;
        };
        let before = self.problems.len();
        let read = self.deserialize_all_with(
            toml::Value::Table(table.clone()),
            &span,
            section,
            at,
            &|v| factory.read(v),
        );
        let mut report = CheckReport::new(name, checkpoint.0, base);
        if let Some(config) = &read {
            factory.check(config.as_ref(), &mut report);
        }
        for p in std::mem::take(&mut report.problems) {
            if p.in_checkpoint {
                let key = p.path.first().map_or("", String::as_str);
                self.problem_at(checkpoint.1.clone(), key, "[checkpoint]", p.message);
            } else {
                self.problem_at_path(at, &p.path, span.clone(), section, p.message);
            }
        }
        for problem in &mut self.problems[before..] {
            problem.message = self.secrets.redact(&problem.message);
        }
        read?;
        for key in factory.paths.iter() {
            match table.get_mut(key) {
                Some(toml::Value::String(path)) => resolve(path, base),
                Some(toml::Value::Array(paths)) => {
                    for path in paths {
                        if let toml::Value::String(path) = path {
                            resolve(path, base);
                        }
                    }
                }
                _ => {}
            }
        }
        Some((
            Component::new(
                type_name,
                table,
                base.to_owned(),
                factory.clone(),
                self.secrets.clone(),
                report.facts,
            ),
            span,
        ))
    }

    /// A section (`at` in the document) read into `T`, every field that
    /// does not fit reported at its place.
    fn section<T: DeserializeOwned>(
        &mut self,
        value: Spanned<toml::Value>,
        section: &str,
        at: (&str, Option<usize>),
    ) -> Option<(T, Range<usize>)> {
        let span = value.span();
        let value = self.deserialize_all(value.into_inner(), &span, section, at)?;
        Some((value, span))
    }

    /// Deserialize `value` (a section at `span`, `at` in the document),
    /// reporting every field that does not deserialize.
    fn deserialize_all<T: DeserializeOwned>(
        &mut self,
        value: toml::Value,
        span: &Range<usize>,
        section: &str,
        at: (&str, Option<usize>),
    ) -> Option<T> {
        self.deserialize_all_with(value, span, section, at, &|v| {
            serde_path_to_error::deserialize(v)
        })
    }

    /// A problem serde found at the key `path` of the section `at`: placed
    /// at the deepest key of the path written in the file, named by its
    /// dotted path when the message does not name it, and with a pointer
    /// to the new name of a renamed option.
    fn path_problem(
        &mut self,
        at: (&str, Option<usize>),
        path: &[String],
        span: &Range<usize>,
        section: &str,
        message: &str,
    ) {
        // An unknown key is shown at the key; a value that does not fit,
        // at the value.
        let value = (!message.starts_with("unknown field"))
            .then(|| {
                self.doc
                    .as_ref()
                    .and_then(|doc| value_span(doc.as_table(), at, path, self.text))
            })
            .flatten();
        let start = value
            .or_else(|| {
                (1..=path.len()).rev().find_map(|len| {
                    self.doc
                        .as_ref()
                        .and_then(|doc| key_span(doc.as_table(), at, &path[..len]))
                })
            })
            .map_or(span.start, |s| s.start);
        let renamed = message
            .strip_prefix("unknown field `")
            .and(path.last())
            .and_then(|old| RENAMED.iter().find(|(o, _)| o == old))
            .map(|(_, new)| format!(" (renamed to {new})"))
            .unwrap_or_default();
        let key = path.join(".");
        let message = match path.last() {
            Some(last) if !message.contains(last.as_str()) => format!("{key}: {message}{renamed}"),
            _ => format!("{message}{renamed}"),
        };
        self.problem(start..start, section, message);
    }

    /// [`deserialize_all`](Self::deserialize_all) with `read` in place of
    /// a type's `Deserialize`.
    fn deserialize_all_with<T>(
        &mut self,
        mut value: toml::Value,
        span: &Range<usize>,
        section: &str,
        at: (&str, Option<usize>),
        read: &dyn Fn(toml::Value) -> Result<T, serde_path_to_error::Error<toml::de::Error>>,
    ) -> Option<T> {
        // A field that does not deserialize is reported and taken out, and
        // the section is read again without it: the problems of its other
        // fields (range checks included, on what did deserialize) are
        // reported in the same run, not one per run. A field taken out
        // comes back as its default, which is never a problem of its own.
        let mut removed: Vec<String> = Vec::new();
        loop {
            match read(value.clone()) {
                Ok(v) => return Some(v),
                Err(e) => {
                    let path: Vec<String> = e
                        .path()
                        .iter()
                        .filter_map(|segment| match segment {
                            serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                            serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                            _ => None,
                        })
                        .collect();
                    let message = e.inner().message();
                    if message.starts_with("missing field")
                        && removed
                            .iter()
                            .any(|k| quoted_token(message, '`') == Some(k.as_str()))
                    {
                        // Only missing because it was taken out above.
                        return None;
                    }
                    // Placed from serde's path to the field. A field of an
                    // internally tagged enum has none (serde reads such a
                    // table through a buffer that hides its keys): that
                    // problem is placed from the key its message names.
                    let key = if path.is_empty() {
                        self.serde_problem(span.clone(), section, message)
                    } else {
                        self.path_problem(at, &path, span, section, message);
                        Some(path.join("."))
                    };
                    let table = value.as_table_mut()?;
                    // A nested key (`retry.max_elapsed`) takes its table out.
                    let key = key
                        .map(|k| k.split('.').next().unwrap_or_default().to_owned())
                        .filter(|k| table.contains_key(k))?;
                    table.remove(&key);
                    removed.push(key);
                }
            }
        }
    }
}

fn quoted_token(message: &str, quote: char) -> Option<&str> {
    let start = message.find(quote)? + 1;
    let len = message[start..].find(quote)?;
    Some(&message[start..start + len]).filter(|t| !t.is_empty())
}

/// Byte offset of the line inside `span` that assigns `key`.
pub(super) fn find_key(text: &str, span: &Range<usize>, key: &str) -> Option<usize> {
    let body = text.get(span.clone())?;
    let mut offset = span.start;
    for line in body.split_inclusive('\n') {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return Some(offset + (line.len() - trimmed.len()));
        }
        offset += line.len();
    }
    None
}

/// The key assigned on the line holding byte `at`, if it is `key = ...`.
fn key_of_line(text: &str, at: usize) -> Option<&str> {
    let start = text.get(..at)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?.trim_start();
    let (key, _) = line.split_once('=')?;
    let key = key.trim_end();
    (!key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')).then_some(key)
}

/// The key assigned just before byte `at` on its line (`max_elapsed` in
/// `retry = { max_elapsed = "1y" }` with `at` on `1y`).
fn inline_key_before(text: &str, at: usize) -> Option<&str> {
    let start = text.get(..at)?.rfind('\n').map_or(0, |i| i + 1);
    let before = text
        .get(start..at)?
        .trim_end_matches(['"', '\''])
        .trim_end();
    let before = before.strip_suffix('=')?.trim_end();
    let from = before
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    Some(&before[from..]).filter(|k| !k.is_empty())
}

pub(super) fn find_text(text: &str, span: &Range<usize>, needle: &str) -> Option<usize> {
    text.get(span.clone())?.find(needle).map(|i| span.start + i)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, column)
}

/// Parse and check configuration text; `base` resolves relative paths.
///
/// `${VAR}` and `${VAR:-default}` in string values are taken from the
/// environment first (`$$` is a literal `$`); see
/// [`parse_config_with_env`].
///
/// # Errors
///
/// Every problem found, in file order.
pub fn parse_config(text: &str, base: &Path) -> Result<Config, Vec<ConfigProblem>> {
    parse_config_in(&Registry::new(), text, base)
}

/// [`parse_config`] with `registry`'s components.
pub(crate) fn parse_config_in(
    registry: &Registry,
    text: &str,
    base: &Path,
) -> Result<Config, Vec<ConfigProblem>> {
    let env = |name: &str| match std::env::var(name) {
        Ok(value) => Some(Ok(value)),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => Some(Err(())),
    };
    parse_interpolated(registry, text, base, &env)
}

/// [`parse_config`] with the variables of `env` instead of the
/// environment's (`None`: not set).
///
/// Only string values are interpolated, once, after the text is parsed:
/// comments, keys and other values never are, and a variable's value is
/// never read as TOML. `${NAME}` is the variable's value, `${NAME:-default}`
/// the default when it is unset or empty, `${NAME-default}` when it is
/// unset; `$$` is a literal `$`, and any other `$` stays as it is. An
/// unset variable without a default is a problem at the line of its
/// string. A value a variable gives to a secret (a key or variable whose
/// name says password, secret, key, token, url...) appears in no problem.
///
/// # Errors
///
/// Every problem found, in file order.
pub fn parse_config_with_env(
    text: &str,
    base: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, Vec<ConfigProblem>> {
    parse_config_with_env_in(&Registry::new(), text, base, env)
}

/// [`parse_config_with_env`] with `registry`'s components.
pub(crate) fn parse_config_with_env_in(
    registry: &Registry,
    text: &str,
    base: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, Vec<ConfigProblem>> {
    parse_interpolated(registry, text, base, &|name: &str| env(name).map(Ok))
}

fn parse_interpolated(
    registry: &Registry,
    text: &str,
    base: &Path,
    env: &dyn Fn(&str) -> Option<Result<String, ()>>,
) -> Result<Config, Vec<ConfigProblem>> {
    let Interpolated {
        text: interpolated,
        secrets,
    } = interpolate(text, env).map_err(|unresolved| {
        let mut ck = Checker {
            text,
            problems: Vec::new(),
            warnings: Vec::new(),
            doc: None,
            secrets: Secrets::default(),
        };
        for u in unresolved {
            ck.problem(u.span, &u.section, u.message);
        }
        ck.problems
    })?;
    // Every value a key anywhere names as secret, with what variables gave
    // to secrets, is kept out of every problem and warning, whichever table
    // it is in.
    let secrets = match toml::from_str::<toml::Table>(&interpolated) {
        Ok(doc) => Secrets::of_document(&doc, &secrets),
        Err(_) => Secrets::of_document(&toml::Table::new(), &secrets),
    };
    let redact = |items: &mut Vec<ConfigProblem>| {
        for p in items {
            p.message = secrets.redact(&p.message);
        }
    };
    match parse_text(registry, &interpolated, base, &secrets) {
        Ok(mut config) => {
            // A warning quotes the program, which a variable may have
            // filled in.
            redact(&mut config.warnings);
            Ok(config)
        }
        Err(mut problems) => {
            redact(&mut problems);
            Err(problems)
        }
    }
}

fn parse_text(
    registry: &Registry,
    text: &str,
    base: &Path,
    secrets: &Secrets,
) -> Result<Config, Vec<ConfigProblem>> {
    let mut ck = Checker {
        text,
        problems: Vec::new(),
        warnings: Vec::new(),
        doc: ImDocument::parse(text).ok(),
        secrets: secrets.clone(),
    };
    let raw: RawDoc = match toml::from_str(text) {
        Ok(raw) => raw,
        Err(e) => {
            ck.problem(e.span().unwrap_or(0..0), "file", e.message().to_owned());
            return Err(ck.problems);
        }
    };

    let checkpoint = match raw.checkpoint {
        Some(v) => ck.section::<CheckpointOptions>(v, "[checkpoint]", ("checkpoint", None)),
        None => Some((CheckpointOptions::default(), 0..0)),
    };
    // A `[checkpoint]` with problems of its own: the components are still
    // checked, against its defaults.
    let fallback = (CheckpointOptions::default(), 0..0);
    let (c, c_span) = checkpoint.as_ref().unwrap_or(&fallback);
    let against = (c, c_span);

    let source = match raw.source {
        Some(v) => ck.component(
            &registry.sources,
            "source",
            "source",
            v,
            ("source", None),
            "[source]",
            base,
            against,
        ),
        None => {
            ck.problem(0..0, "file", "missing [source] section");
            None
        }
    };

    let mut transforms = Vec::new();
    for (i, t) in raw.transforms.into_iter().enumerate() {
        let section = format!("[[transforms]] #{}", i + 1);
        let keys: Vec<String> = t
            .get_ref()
            .as_table()
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        let registered = t
            .get_ref()
            .get("type")
            .and_then(toml::Value::as_str)
            .is_some_and(|name| registry.transforms.contains_key(name));
        let parsed = if registered {
            ck.component(
                &registry.transforms,
                "transform",
                &format!("transform {}", i + 1),
                t,
                ("transforms", Some(i)),
                &section,
                base,
                against,
            )
            .map(|(c, span)| (TransformConfig::Custom(c), span))
        } else {
            ck.section::<TransformConfig>(t, &section, ("transforms", Some(i)))
        };
        if let Some((mut t, span)) = parsed {
            check_transform(&mut ck, &t, span.clone(), &section);
            super::programs::check(&mut ck, &mut t, &keys, span, &section, base);
            transforms.push(t);
        }
    }

    if raw.sinks.is_empty() {
        ck.problem(
            0..0,
            "file",
            "no [[sinks]]: a pipeline needs at least one sink",
        );
    }
    let mut sinks = Vec::new();
    let mut file_outputs = Vec::new();
    for (i, s) in raw.sinks.into_iter().enumerate() {
        let section = format!("[[sinks]] #{}", i + 1);
        let span = s.span();
        if let Some(sink) = sink_entry(&mut ck, registry, s, i, &section, base, against) {
            file_outputs.extend(file_outputs_of(&sink.kind, &section, &span));
            sinks.push(sink);
        }
    }
    let mut names: Vec<&str> = sinks.iter().map(|s: &SinkConfig| s.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        ck.problem(0..0, "[[sinks]]", format!("two sinks are named {:?}", w[0]));
    }
    let exactly_once = sinks.iter().any(|s| s.kind.is_exactly_once());
    if exactly_once && sinks.len() > 1 {
        ck.problem(
            0..0,
            "[[sinks]]",
            "exactly_once needs a single sink: with several, each would hold its own progress",
        );
    }

    let dead_letter = raw.dead_letter.and_then(|v| {
        let (kind, span) = ck.component(
            &registry.sinks,
            "sink",
            "dead_letter",
            v,
            ("dead_letter", None),
            "[dead_letter]",
            base,
            against,
        )?;
        file_outputs.extend(file_outputs_of(&kind, "[dead_letter]", &span));
        Some(kind)
    });
    let inputs = match &source {
        Some((source, _)) => source.facts.reads.as_slice(),
        None => &[],
    };
    super::outputs::check(&mut ck, inputs, &file_outputs, base);
    let delivery = raw
        .delivery
        .and_then(|v| ck.section::<DeliveryConfig>(v, "[delivery]", ("delivery", None)))
        .map(|(d, span)| {
            ck.at_least_one(&span, "[delivery]", "max_replays", u64::from(d.max_replays));
            d
        })
        .unwrap_or_default();
    let limits = match raw.limits {
        Some(v) => ck.section::<LimitsConfig>(v, "[limits]", ("limits", None)),
        None => Some((LimitsConfig::default(), 0..0)),
    };
    if let Some((l, span)) = &limits {
        for (key, value) in [
            ("max_in_flight_batches", u64::from(l.max_in_flight_batches)),
            ("max_in_flight_bytes", l.max_in_flight_bytes.0),
            (
                "max_in_flight_batches_per_partition",
                u64::from(l.max_in_flight_batches_per_partition),
            ),
            (
                "max_in_flight_bytes_per_partition",
                l.max_in_flight_bytes_per_partition.0,
            ),
        ] {
            ck.at_least_one(span, "[limits]", key, value);
        }
    }
    if let Some((c, span)) = &checkpoint {
        for (key, value) in [
            ("commit_interval", c.commit_interval),
            ("revoke_deadline", c.revoke_deadline),
            ("shutdown_timeout", c.shutdown_timeout),
        ] {
            ck.above_zero(span, "[checkpoint]", key, value);
        }
        // The stop's last tenth is the final commit's: below a second it
        // has no time for an fsync, and the run would end uncommitted.
        if !c.shutdown_timeout.is_zero() && c.shutdown_timeout < MIN_SHUTDOWN_TIMEOUT {
            ck.problem_at(
                span.clone(),
                "shutdown_timeout",
                "[checkpoint]",
                format!(
                    "shutdown_timeout must be at least {}: the final commit gets the last \
                     tenth of it",
                    humantime::format_duration(MIN_SHUTDOWN_TIMEOUT)
                ),
            );
        }
    }

    match (source, limits, checkpoint) {
        (Some((source, _)), Some((limits, _)), Some((checkpoint, _))) if ck.problems.is_empty() => {
            ck.warnings.sort_by_key(|p| (p.line, p.column));
            let mut config = Config {
                source,
                transforms,
                sinks,
                dead_letter,
                delivery,
                limits,
                checkpoint,
                warnings: ck.warnings,
            };
            resolve_paths(&mut config, base);
            Ok(config)
        }
        _ => {
            ck.problems.sort_by_key(|p| (p.line, p.column));
            Err(ck.problems)
        }
    }
}

const PATH_HINT: &str =
    " (names separated by dots; an array index is a name of digits: items.0.qty)";

fn check_transform(ck: &mut Checker<'_>, t: &TransformConfig, span: Range<usize>, section: &str) {
    // A path is dotted names; an array index is a segment of its own
    // (`items.0.qty`, not `items[0].qty`, which would match nothing).
    let empty =
        |p: &str| p.is_empty() || p.split('.').any(|s| s.is_empty() || s.contains(['[', ']']));
    match t {
        TransformConfig::Filter {
            field,
            op,
            value,
            condition: None,
        } => {
            if !field.is_empty() && empty(field) {
                ck.problem(
                    span.clone(),
                    section,
                    format!("invalid field path {field:?}{PATH_HINT}"),
                );
            }
            match (op, value) {
                (CompareOp::Exists, _) => {}
                (_, None) => ck.problem_at(span, "op", section, format!("op {op:?} needs a value")),
                (_, Some(v))
                    if !matches!(
                        v,
                        toml::Value::String(_)
                            | toml::Value::Integer(_)
                            | toml::Value::Float(_)
                            | toml::Value::Boolean(_)
                    ) =>
                {
                    ck.problem_at(
                        span,
                        "value",
                        section,
                        "value must be a string, number or boolean",
                    )
                }
                _ => {}
            }
        }
        TransformConfig::AddField { field, .. } | TransformConfig::DropField { field } => {
            if empty(field) {
                ck.problem(
                    span,
                    section,
                    format!("invalid field path {field:?}{PATH_HINT}"),
                );
            }
        }
        TransformConfig::RenameField { from, to } => {
            if empty(from) || empty(to) {
                ck.problem(
                    span,
                    section,
                    format!("invalid field path in {from:?} -> {to:?}{PATH_HINT}"),
                );
            }
        }
        // Checked with the programs.
        TransformConfig::Filter {
            condition: Some(_), ..
        }
        | TransformConfig::Remap { .. } => {}
        TransformConfig::ParseJson | TransformConfig::Custom(_) => {}
    }
}

fn sink_entry(
    ck: &mut Checker<'_>,
    registry: &Registry,
    value: Spanned<toml::Value>,
    index: usize,
    section: &str,
    base: &Path,
    checkpoint: (&CheckpointOptions, &Range<usize>),
) -> Option<SinkConfig> {
    let span = value.span();
    let toml::Value::Table(mut table) = value.into_inner() else {
        ck.problem(span, section, "a sink must be a table");
        return None;
    };
    let name = match table.remove("name") {
        Some(toml::Value::String(s)) if !s.is_empty() => s,
        Some(_) => {
            ck.problem(span.clone(), section, "name must be a non-empty string");
            return None;
        }
        None => format!("sink{}", index + 1),
    };
    let mut options = toml::Table::new();
    for key in SINK_OPTION_KEYS {
        if let Some(v) = table.remove(*key) {
            options.insert((*key).to_owned(), v);
        }
    }
    let options: Option<SinkOptions> = ck.deserialize_all(
        toml::Value::Table(options),
        &span,
        section,
        ("sinks", Some(index)),
    );
    let kind = ck.component(
        &registry.sinks,
        "sink",
        &name,
        Spanned::new(span.clone(), toml::Value::Table(table)),
        ("sinks", Some(index)),
        section,
        base,
        checkpoint,
    );
    let options = options?;
    ck.at_least_one(
        &span,
        section,
        "batch_max_records",
        options.batch_max_records as u64,
    );
    ck.at_least_one(&span, section, "batch_max_bytes", options.batch_max_bytes.0);
    ck.at_least_one(&span, section, "concurrency", options.concurrency as u64);
    ck.above_zero(&span, section, "write_timeout", options.write_timeout);
    Some(SinkConfig {
        name,
        kind: kind?.0,
        options,
    })
}

/// The files a sink writes, for the checks of
/// [`outputs`](super::outputs).
fn file_outputs_of(
    kind: &SinkKind,
    section: &str,
    span: &Range<usize>,
) -> Vec<super::outputs::FileOutput> {
    kind.facts
        .writes
        .iter()
        .map(|(path, rotates)| super::outputs::FileOutput {
            section: section.to_owned(),
            span: span.clone(),
            path: path.clone(),
            rotates: *rotates,
        })
        .collect()
}

/// The span of the key `path` inside the section `at` of the document:
/// `("source", None)`, or `("sinks", Some(index))`.
fn key_span(
    doc: &toml_edit::Table,
    at: (&str, Option<usize>),
    path: &[String],
) -> Option<Range<usize>> {
    let (table, last) = parent_table(doc, at, path)?;
    table.key(last).and_then(toml_edit::Key::span)
}

/// The span of the value at the key `path` of the section `at`, inside
/// its quotes when it is a string: where a value that does not fit is
/// shown.
fn value_span(
    doc: &toml_edit::Table,
    at: (&str, Option<usize>),
    path: &[String],
    text: &str,
) -> Option<Range<usize>> {
    let (table, last) = parent_table(doc, at, path)?;
    let value = table.get(last)?.as_value()?;
    let span = value.span()?;
    let quotes = match text.get(span.clone()) {
        Some(t) if t.starts_with("\"\"\"") || t.starts_with("'''") => 3,
        Some(t) if t.starts_with(['"', '\'']) => 1,
        _ => 0,
    };
    Some(span.start + quotes..span.end)
}

/// The table holding the key `path` of the section `at`, and that key.
fn parent_table<'d, 'p>(
    doc: &'d toml_edit::Table,
    at: (&str, Option<usize>),
    path: &'p [String],
) -> Option<(&'d dyn toml_edit::TableLike, &'p String)> {
    let section = doc.get(at.0)?;
    let section = match at.1 {
        Some(i) => section.as_array_of_tables()?.get(i)?,
        None => section.as_table()?,
    };
    let mut table: &dyn toml_edit::TableLike = section;
    let (last, parents) = path.split_last()?;
    for key in parents {
        table = table.get(key)?.as_table_like()?;
    }
    Some((table, last))
}

/// `path` resolved against `base` unless it is absolute.
fn resolve(path: &mut String, base: &Path) {
    if Path::new(path.as_str()).is_relative() {
        *path = base.join(&*path).to_string_lossy().into_owned();
    }
}

fn resolve_paths(config: &mut Config, base: &Path) {
    let join = |p: &mut PathBuf| {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    };
    for t in &mut config.transforms {
        if let TransformConfig::Remap {
            file: Some(file), ..
        } = t
        {
            join(file);
        }
    }
    if let StoreConfig::File { path } = &mut config.checkpoint.store {
        join(path);
    }
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.line, self.column, self.section, self.message
        )
    }
}
