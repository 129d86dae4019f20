//! The checker of a configuration's text: every problem and warning
//! kept with its line and column, placed from serde's path to the field
//! (`serde_path_to_error`) and `toml_edit`'s spans of keys and values.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use toml::Spanned;
use toml_edit::ImDocument;

use super::ConfigProblem;
use super::interpolate::Secrets;
use super::schema::CheckpointOptions;
use crate::registry::{CheckReport, Component, Factory};

/// A value read from a section, and the section's place.
pub(super) type Placed<T> = (T, Range<usize>);

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

/// Units that were once part of a duration's name (`connect_timeout_secs
/// = 10`): the option is now the name without its unit, a duration
/// written with one (`connect_timeout = "10s"`).
const UNIT_SUFFIXES: &[&str] = &["_ms", "_secs"];

/// The pointer to the new name of the unknown key serde's `message`
/// names (`unknown field `old`, expected ...`), or nothing: a name listed
/// in [`RENAMED`], or a duration's old name with its unit in it when the
/// keys the message expects hold the name without the unit.
fn renamed(message: &str) -> String {
    let Some(old) = message
        .split_once("unknown field `")
        .and_then(|(_, rest)| rest.split('`').next())
    else {
        return String::new();
    };
    if let Some((_, new)) = RENAMED.iter().find(|(o, _)| *o == old) {
        return format!(" (renamed to {new})");
    }
    let expected = message.split_once("expected").map_or("", |(_, e)| e);
    UNIT_SUFFIXES
        .iter()
        .filter_map(|unit| old.strip_suffix(unit))
        .find(|new| expected.contains(&format!("`{new}`")))
        .map(|new| {
            format!(" (renamed to {new}, a duration written with its unit: {new} = \"10s\")")
        })
        .unwrap_or_default()
}

pub(super) struct Checker<'a> {
    pub(super) text: &'a str,
    pub(super) problems: Vec<ConfigProblem>,
    /// What works but is likely a mistake; never stops a run.
    pub(super) warnings: Vec<ConfigProblem>,
    /// The parsed text, for the place of a key inside a section.
    pub(super) doc: Option<ImDocument<&'a str>>,
    /// Every secret of the whole configuration, for what registered
    /// components print.
    pub(super) secrets: Secrets,
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
        // A component that reads its own table reports serde's unknown
        // field in its own words: the pointer to a new name is added here,
        // the same for every component.
        let message = message.into();
        let message = if message.contains("(renamed to ") {
            message
        } else {
            format!("{message}{}", renamed(&message))
        };
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

    /// The span of the `index`-th table of the array at `key` in the
    /// section `at` (`[[sinks.transforms]]`, or an inline array of
    /// tables), if the file writes it so.
    pub(super) fn element_span(
        &self,
        at: (&str, Option<usize>),
        key: &str,
        index: usize,
    ) -> Option<Range<usize>> {
        let doc = self.doc.as_ref()?;
        let section = doc.as_table().get(at.0)?;
        let section = match at.1 {
            Some(i) => section.as_array_of_tables()?.get(i)?,
            None => section.as_table()?,
        };
        match section.get(key)? {
            toml_edit::Item::ArrayOfTables(tables) => tables.get(index)?.span(),
            toml_edit::Item::Value(toml_edit::Value::Array(items)) => items.get(index)?.span(),
            _ => None,
        }
    }

    /// A warning (see [`Config::warnings`]) at the start of `span`.
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
    pub(super) fn serde_problem(
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
        let message = format!("{message}{}", renamed(message));
        let message = match &key {
            Some(key) if !message.contains(key.as_str()) => format!("{key}: {message}"),
            _ => message,
        };
        self.problem(at..at, section, message);
        key
    }

    /// A problem at `key` unless `value` is at least 1.
    pub(super) fn at_least_one(
        &mut self,
        span: &Range<usize>,
        section: &str,
        key: &str,
        value: u64,
    ) {
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
    pub(super) fn above_zero(
        &mut self,
        span: &Range<usize>,
        section: &str,
        key: &str,
        value: Duration,
    ) {
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
    pub(super) fn component<T>(
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
    pub(super) fn section<T: DeserializeOwned>(
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
    pub(super) fn deserialize_all<T: DeserializeOwned>(
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
    pub(super) fn path_problem(
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
        let renamed = renamed(message);
        let key = path.join(".");
        let message = match path.last() {
            Some(last) if !message.contains(last.as_str()) => format!("{key}: {message}{renamed}"),
            _ => format!("{message}{renamed}"),
        };
        self.problem(start..start, section, message);
    }

    /// [`deserialize_all`](Self::deserialize_all) with `read` in place of
    /// a type's `Deserialize`.
    pub(super) fn deserialize_all_with<T>(
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
pub(super) fn resolve(path: &mut String, base: &Path) {
    if Path::new(path.as_str()).is_relative() {
        *path = base.join(&*path).to_string_lossy().into_owned();
    }
}
