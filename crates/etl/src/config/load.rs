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
use crate::registry::{Custom, Factory, Registry};

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
    #[cfg_attr(
        not(feature = "kafka"),
        allow(dead_code, reason = "for connector problems")
    )]
    doc: Option<ImDocument<&'a str>>,
    /// Every secret of the whole configuration, for what registered
    /// components print.
    secrets: Secrets,
}

impl Checker<'_> {
    /// A problem at the key `path` (a key of the section, then keys inside
    /// it) of the section `at` (`source`, or `sinks` and an index), or at
    /// the section's first line when it is not written there.
    #[cfg_attr(
        not(feature = "kafka"),
        allow(dead_code, reason = "for connector problems")
    )]
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

    /// A table whose `type` is registered in `factories`: checked against
    /// its config struct (every field that does not fit reported, string
    /// values of secret-looking keys kept out of the messages). `Err`
    /// gives the value back when its type is not registered.
    fn custom<T>(
        &mut self,
        factories: &std::collections::BTreeMap<String, Factory<T>>,
        value: Spanned<toml::Value>,
        section: &str,
        base: &Path,
    ) -> Result<Option<Placed<Custom<T>>>, Spanned<toml::Value>> {
        let factory = match value.get_ref().get("type").and_then(toml::Value::as_str) {
            Some(type_name) => match factories.get(type_name) {
                Some(factory) => factory.clone(),
                None => return Err(value),
            },
            None => return Err(value),
        };
        let span = value.span();
        let toml::Value::Table(mut table) = value.into_inner() else {
            unreachable!("a value with a `type` key is a table")
        };
        let type_name = match table.remove("type") {
            Some(toml::Value::String(t)) => t,
            _ => unreachable!("checked above"),
        };
        let before = self.problems.len();
        let check = factory.check.clone();
        let fits = self
            .deserialize_all_with(toml::Value::Table(table.clone()), &span, section, &|v| {
                check(v)
            })
            .is_some();
        for problem in &mut self.problems[before..] {
            problem.message = self.secrets.redact(&problem.message);
        }
        Ok(fits.then(|| {
            (
                Custom::new(
                    type_name,
                    table,
                    base.to_owned(),
                    factory,
                    self.secrets.clone(),
                ),
                span,
            )
        }))
    }

    fn section<T: DeserializeOwned>(
        &mut self,
        value: Spanned<toml::Value>,
        section: &str,
    ) -> Option<(T, Range<usize>)> {
        let span = value.span();
        let value = self.deserialize_all(value.into_inner(), &span, section)?;
        Some((value, span))
    }

    /// Deserialize `value` (a section at `span`), reporting every field
    /// that does not deserialize.
    fn deserialize_all<T: DeserializeOwned>(
        &mut self,
        value: toml::Value,
        span: &Range<usize>,
        section: &str,
    ) -> Option<T> {
        self.deserialize_all_with(value, span, section, &|v| T::deserialize(v))
    }

    /// [`deserialize_all`](Self::deserialize_all) with `read` in place of
    /// a type's `Deserialize`.
    fn deserialize_all_with<T>(
        &mut self,
        mut value: toml::Value,
        span: &Range<usize>,
        section: &str,
        read: &dyn Fn(toml::Value) -> Result<T, toml::de::Error>,
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
                    let message = e.message();
                    if message.starts_with("missing field")
                        && removed
                            .iter()
                            .any(|k| quoted_token(message, '`') == Some(k.as_str()))
                    {
                        // Only missing because it was taken out above.
                        return None;
                    }
                    let key = self.serde_problem(span.clone(), section, message);
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

    let source = match raw.source {
        Some(v) => match ck.custom(&registry.sources, v, "[source]", base) {
            Ok(custom) => custom.map(|(c, span)| (SourceConfig::Custom(c), span)),
            Err(v) => ck.section::<SourceConfig>(v, "[source]"),
        },
        None => {
            ck.problem(0..0, "file", "missing [source] section");
            None
        }
    };
    if let Some((source, span)) = &source {
        check_source(&mut ck, source, span.clone());
    }

    let mut transforms = Vec::new();
    for (i, t) in raw.transforms.into_iter().enumerate() {
        let section = format!("[[transforms]] #{}", i + 1);
        let keys: Vec<String> = t
            .get_ref()
            .as_table()
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        let parsed = match ck.custom(&registry.transforms, t, &section, base) {
            Ok(custom) => custom.map(|(c, span)| (TransformConfig::Custom(c), span)),
            Err(t) => ck.section::<TransformConfig>(t, &section),
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
        if let Some(sink) = sink_entry(&mut ck, registry, s, i, &section, base) {
            file_outputs.extend(file_output(&sink.kind, &section, span));
            sinks.push(sink);
        }
    }
    let mut names: Vec<&str> = sinks.iter().map(|s: &SinkConfig| s.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        ck.problem(0..0, "[[sinks]]", format!("two sinks are named {:?}", w[0]));
    }
    let exactly_once = sinks
        .iter()
        .any(|s| matches!(&s.kind, SinkKind::File(f) if f.exactly_once));
    if exactly_once && sinks.len() > 1 {
        ck.problem(
            0..0,
            "[[sinks]]",
            "exactly_once needs a single sink: with several, each would hold its own progress",
        );
    }

    let dead_letter = raw
        .dead_letter
        .and_then(
            |v| match ck.custom(&registry.sinks, v, "[dead_letter]", base) {
                Ok(custom) => custom.map(|(c, span)| (SinkKind::Custom(c), span)),
                Err(v) => ck.section::<SinkKind>(v, "[dead_letter]"),
            },
        )
        .map(|(k, span)| {
            check_sink_kind(&mut ck, &k, &span, "[dead_letter]");
            check_kafka_sink(&mut ck, &k, ("dead_letter", None), &span, "[dead_letter]");
            file_outputs.extend(file_output(&k, "[dead_letter]", span));
            k
        });
    let inputs = match &source {
        Some((SourceConfig::File(f), _)) => f.paths.as_slice(),
        _ => &[],
    };
    super::outputs::check(&mut ck, inputs, &file_outputs, base);
    let delivery = raw
        .delivery
        .and_then(|v| ck.section::<DeliveryConfig>(v, "[delivery]"))
        .map(|(d, span)| {
            ck.at_least_one(&span, "[delivery]", "max_replays", u64::from(d.max_replays));
            d
        })
        .unwrap_or_default();
    let limits = match raw.limits {
        Some(v) => ck.section::<LimitsConfig>(v, "[limits]"),
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
    let checkpoint = match raw.checkpoint {
        Some(v) => ck.section::<CheckpointOptions>(v, "[checkpoint]"),
        None => Some((CheckpointOptions::default(), 0..0)),
    };
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

    if let Some((source, span)) = &source {
        // A `[checkpoint]` with problems of its own: the source is still
        // checked, against the default revoke deadline.
        let fallback = (CheckpointOptions::default(), 0..0);
        let (c, c_span) = checkpoint.as_ref().unwrap_or(&fallback);
        check_kafka_source(&mut ck, source, span, c, c_span);
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

fn check_source(ck: &mut Checker<'_>, source: &SourceConfig, span: Range<usize>) {
    match source {
        SourceConfig::File(f) => {
            if f.paths.is_empty() {
                ck.problem_at(
                    span.clone(),
                    "paths",
                    "[source]",
                    "paths is empty: name at least one file or glob",
                );
            }
            ck.at_least_one(
                &span,
                "[source]",
                "max_batch_records",
                f.max_batch_records as u64,
            );
            ck.at_least_one(&span, "[source]", "max_line_bytes", f.max_line_bytes.0);
            ck.at_least_one(&span, "[source]", "max_open_files", f.max_open_files as u64);
            // The same check as the source's when it opens them.
            for path in &f.paths {
                if path.contains(['*', '?', '['])
                    && let Err(e) = glob::glob(path)
                {
                    ck.problem_at(
                        span.clone(),
                        "paths",
                        "[source]",
                        format!("paths: {path:?} is not a valid glob: {e}"),
                    );
                }
            }
        }
        SourceConfig::Generator(g) => {
            ck.at_least_one(&span, "[source]", "partitions", u64::from(g.partitions));
            ck.at_least_one(
                &span,
                "[source]",
                "max_batch_records",
                g.max_batch_records as u64,
            );
            if g.rate == Some(0) {
                ck.problem_at(
                    span,
                    "rate",
                    "[source]",
                    "rate must be above zero (omit it for no limit)",
                );
            }
        }
        SourceConfig::Kafka(_) | SourceConfig::Custom(_) => {}
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
    let options: Option<SinkOptions> =
        ck.deserialize_all(toml::Value::Table(options), &span, section);
    let kind: Option<SinkKind> = match ck.custom(
        &registry.sinks,
        Spanned::new(span.clone(), toml::Value::Table(table)),
        section,
        base,
    ) {
        Ok(custom) => custom.map(|(c, _)| SinkKind::Custom(c)),
        Err(v) => ck.deserialize_all(v.into_inner(), &span, section),
    };
    if let Some(kind) = &kind {
        check_sink_kind(ck, kind, &span, section);
        check_kafka_sink(ck, kind, ("sinks", Some(index)), &span, section);
    }
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
        kind: kind?,
        options,
    })
}

/// The file a `type = "file"` sink writes, for the checks of
/// [`outputs`](super::outputs).
fn file_output(
    kind: &SinkKind,
    section: &str,
    span: Range<usize>,
) -> Option<super::outputs::FileOutput> {
    let SinkKind::File(f) = kind else {
        return None;
    };
    Some(super::outputs::FileOutput {
        section: section.to_owned(),
        span,
        path: f.path.clone(),
        rotates: f.rotate_bytes.is_some() || f.rotate_interval.is_some(),
    })
}

/// Ranges of a sink's own settings (of `[[sinks]]` or `[dead_letter]`).
fn check_sink_kind(ck: &mut Checker<'_>, kind: &SinkKind, span: &Range<usize>, section: &str) {
    let SinkKind::File(f) = kind else {
        return;
    };
    if f.fsync == FsyncMode::Interval && f.fsync_interval.is_none() {
        ck.problem_at(
            span.clone(),
            "fsync",
            section,
            "fsync = \"interval\" needs fsync_interval",
        );
    }
    if let Some(every) = f.fsync_interval {
        ck.above_zero(span, section, "fsync_interval", every);
    }
    if let Some(bytes) = f.rotate_bytes {
        ck.at_least_one(span, section, "rotate_bytes", bytes.0);
    }
    if let Some(age) = f.rotate_interval {
        ck.above_zero(span, section, "rotate_interval", age);
    }
}

/// The span of the key `path` inside the section `at` of the document:
/// `("source", None)`, or `("sinks", Some(index))`.
#[cfg_attr(
    not(feature = "kafka"),
    allow(dead_code, reason = "for connector problems")
)]
fn key_span(
    doc: &toml_edit::Table,
    at: (&str, Option<usize>),
    path: &[String],
) -> Option<Range<usize>> {
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
    table.key(last).and_then(toml_edit::Key::span)
}

/// The key path a connector's problem names: `properties."name"` (the
/// form the Kafka connector uses), or the first name in backquotes (the
/// form of a deserialization error).
#[cfg_attr(
    not(feature = "kafka"),
    allow(dead_code, reason = "for connector problems")
)]
fn problem_key(key: Option<&str>, message: &str) -> Vec<String> {
    let property = message.find("properties.\"").and_then(|at| {
        message[at..]
            .split_once("\":")
            .map(|(k, _)| &message[at..at + k.len() + 1])
    });
    let key = key.or(property).or_else(|| quoted_token(message, '`'));
    match key {
        Some(k) => match k.strip_prefix("properties.\"") {
            Some(name) => vec![
                "properties".to_owned(),
                name.trim_end_matches('"').to_owned(),
            ],
            None => vec![k.to_owned()],
        },
        None => Vec::new(),
    }
}

/// The Kafka source's table as `etl run` reads it (the connector's
/// settings, librdkafka's checks of every property, the client created
/// without a broker), and `[checkpoint] revoke_deadline` against its
/// session timeout: each problem at its key's line.
#[cfg(feature = "kafka")]
fn check_kafka_source(
    ck: &mut Checker<'_>,
    source: &SourceConfig,
    span: &Range<usize>,
    checkpoint: &CheckpointOptions,
    checkpoint_span: &Range<usize>,
) {
    let SourceConfig::Kafka(table) = source else {
        return;
    };
    for p in crate::connectors::kafka::check_source(table, checkpoint) {
        let path = problem_key(p.key.as_deref(), &p.message);
        if p.key.as_deref() == Some("revoke_deadline") {
            ck.problem_at(
                checkpoint_span.clone(),
                "revoke_deadline",
                "[checkpoint]",
                p.message,
            );
        } else {
            ck.problem_at_path(("source", None), &path, span.clone(), "[source]", p.message);
        }
    }
}

#[cfg(not(feature = "kafka"))]
fn check_kafka_source(
    _: &mut Checker<'_>,
    _: &SourceConfig,
    _: &Range<usize>,
    _: &CheckpointOptions,
    _: &Range<usize>,
) {
}

/// A Kafka sink's table as `etl run` reads it, each problem at its key's
/// line.
#[cfg(feature = "kafka")]
fn check_kafka_sink(
    ck: &mut Checker<'_>,
    kind: &SinkKind,
    at: (&str, Option<usize>),
    span: &Range<usize>,
    section: &str,
) {
    let SinkKind::Kafka(table) = kind else {
        return;
    };
    for p in crate::connectors::kafka::check_sink(table) {
        let path = problem_key(p.key.as_deref(), &p.message);
        ck.problem_at_path(at, &path, span.clone(), section, p.message);
    }
}

#[cfg(not(feature = "kafka"))]
fn check_kafka_sink(
    _: &mut Checker<'_>,
    _: &SinkKind,
    _: (&str, Option<usize>),
    _: &Range<usize>,
    _: &str,
) {
}

fn resolve_paths(config: &mut Config, base: &Path) {
    let join = |p: &mut PathBuf| {
        if p.is_relative() {
            *p = base.join(&*p);
        }
    };
    if let SourceConfig::File(f) = &mut config.source {
        for p in &mut f.paths {
            if Path::new(p).is_relative() {
                *p = base.join(&*p).to_string_lossy().into_owned();
            }
        }
    }
    for sink in &mut config.sinks {
        if let SinkKind::File(f) = &mut sink.kind {
            join(&mut f.path);
        }
    }
    if let Some(SinkKind::File(f)) = &mut config.dead_letter {
        join(&mut f.path);
    }
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
