//! Loading a configuration file: parse, then check every section, keeping
//! every problem with its line and column so `etl validate` can report
//! them all at once.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;
use toml_edit::ImDocument;

use super::checker::Checker;
use super::interpolate::{Interpolated, Secrets, interpolate};
use super::schema::*;
use crate::registry::Registry;

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoc {
    source: Option<Spanned<toml::Value>>,
    #[serde(default)]
    transforms: Vec<Spanned<toml::Value>>,
    #[serde(default)]
    sinks: Vec<Spanned<toml::Value>>,
    dead_letter: Option<Spanned<toml::Value>>,
    routing: Option<Spanned<toml::Value>>,
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

/// Parse and check `text` with `registry`'s components, `${VAR}` from
/// the process environment (see [`crate::ConfigLoader`]).
pub(crate) fn parse_with_process_env(
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

/// Parse and check `text` with `registry`'s components, `${VAR}` from
/// `env` (`Some(Err(()))`: set, but not text).
pub(crate) fn parse_with_env(
    registry: &Registry,
    text: &str,
    base: &Path,
    env: &dyn Fn(&str) -> Option<Result<String, ()>>,
) -> Result<Config, Vec<ConfigProblem>> {
    parse_interpolated(registry, text, base, env)
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
        let step = Step {
            name: format!("transform {}", i + 1),
            section: &section,
            at: ("transforms", Some(i)),
        };
        if let Some(t) = transform_entry(&mut ck, registry, t, &step, base, against) {
            transforms.push(t);
        }
    }

    let routing = raw
        .routing
        .and_then(|v| ck.section::<RoutingConfig>(v, "[routing]", ("routing", None)));
    if raw.sinks.is_empty() {
        ck.problem(
            0..0,
            "file",
            "no [[sinks]]: a pipeline needs at least one sink",
        );
    }
    let mut sinks = Vec::new();
    let mut sink_spans = Vec::new();
    let mut file_outputs = Vec::new();
    for (i, s) in raw.sinks.into_iter().enumerate() {
        let section = format!("[[sinks]] #{}", i + 1);
        let span = s.span();
        if let Some(sink) = sink_entry(&mut ck, registry, s, i, &section, base, against) {
            file_outputs.extend(file_outputs_of(&sink.kind, &section, &span));
            sinks.push(sink);
            sink_spans.push((section, span));
        }
    }
    let mut names: Vec<&str> = sinks.iter().map(|s: &SinkConfig| s.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        ck.problem(0..0, "[[sinks]]", format!("two sinks are named {:?}", w[0]));
    }
    let routing = match routing {
        Some((routing, span)) => {
            super::routes::check(&mut ck, &routing, &span, &sinks, &sink_spans);
            routing
        }
        None => {
            super::routes::check(
                &mut ck,
                &RoutingConfig::default(),
                &(0..0),
                &sinks,
                &sink_spans,
            );
            RoutingConfig::default()
        }
    };
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
                routing,
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
    let route = sink_route(
        ck,
        registry,
        (table.remove("when"), table.remove("transforms")),
        (&name, index, section, &span),
        base,
        checkpoint,
    );
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
        route: route?,
    })
}

/// Where a step is in the file: its name in metrics and dead letters, its
/// section in problems, its place in the document.
struct Step<'a> {
    name: String,
    section: &'a str,
    at: (&'a str, Option<usize>),
}

/// One step of `[[transforms]]` or of a sink's `transforms`: a registered
/// component or a built-in, checked (its program compiled) at its place.
fn transform_entry(
    ck: &mut Checker<'_>,
    registry: &Registry,
    t: Spanned<toml::Value>,
    step: &Step<'_>,
    base: &Path,
    against: (&CheckpointOptions, &Range<usize>),
) -> Option<TransformConfig> {
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
            &step.name,
            t,
            step.at,
            step.section,
            base,
            against,
        )
        .map(|(c, span)| (TransformConfig::Custom(c), span))
    } else {
        ck.section::<TransformConfig>(t, step.section, step.at)
    };
    let (mut t, span) = parsed?;
    check_transform(ck, &t, span.clone(), step.section);
    super::programs::check(ck, &mut t, &keys, span, step.section, base);
    Some(t)
}

/// A sink's `when` and `transforms`, read and checked; `None` after a
/// problem.
fn sink_route(
    ck: &mut Checker<'_>,
    registry: &Registry,
    (when, steps): (Option<toml::Value>, Option<toml::Value>),
    (name, index, section, span): (&str, usize, &str, &Range<usize>),
    base: &Path,
    against: (&CheckpointOptions, &Range<usize>),
) -> Option<SinkRoute> {
    let mut ok = true;
    let when = match when {
        None => None,
        Some(toml::Value::String(condition)) => {
            super::programs::condition(ck, &condition, span.clone(), section, "when");
            Some(TransformConfig::Filter {
                field: String::new(),
                op: CompareOp::Exists,
                value: None,
                condition: Some(condition),
            })
        }
        Some(toml::Value::Table(table)) => {
            let mut wrapped = toml::Table::new();
            wrapped.insert("when".to_owned(), toml::Value::Table(table));
            let read: Option<WhenTable> = ck.deserialize_all(
                toml::Value::Table(wrapped),
                span,
                section,
                ("sinks", Some(index)),
            );
            if let Some(WhenTable { when }) = read {
                let t = TransformConfig::Filter {
                    field: when.field,
                    op: when.op,
                    value: when.value,
                    condition: None,
                };
                check_transform(ck, &t, span.clone(), section);
                Some(t)
            } else {
                ok = false;
                None
            }
        }
        Some(_) => {
            ck.problem_at(
                span.clone(),
                "when",
                section,
                "when must be a VRL condition (a string) or a table of `field`, `op` and `value`",
            );
            ok = false;
            None
        }
    };
    let mut transforms = Vec::new();
    match steps {
        None => {}
        Some(toml::Value::Array(steps)) => {
            for (j, t) in steps.into_iter().enumerate() {
                let step_section = format!("{section} transforms #{}", j + 1);
                let step = Step {
                    name: format!("sink {name:?} transform {}", j + 1),
                    section: &step_section,
                    at: ("sinks", Some(index)),
                };
                // Its own lines, so a problem is placed in this step,
                // not at the first key of that name in the sink.
                let at = ck
                    .element_span(("sinks", Some(index)), "transforms", j)
                    .unwrap_or_else(|| span.clone());
                let t = Spanned::new(at, t);
                match transform_entry(ck, registry, t, &step, base, against) {
                    Some(t) => transforms.push(t),
                    None => ok = false,
                }
            }
        }
        Some(_) => {
            ck.problem_at(
                span.clone(),
                "transforms",
                section,
                "a sink's transforms are an array of tables, as [[transforms]] are \
                 (`[[sinks.transforms]]`)",
            );
            ok = false;
        }
    }
    ok.then_some(SinkRoute { when, transforms })
}

/// A `when` written as a table, under its key (so that a problem is
/// placed at `when.<field>`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WhenTable {
    when: WhenFields,
}

/// The declarative filter's fields.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WhenFields {
    field: String,
    #[serde(default = "when_op")]
    op: CompareOp,
    #[serde(default)]
    value: Option<toml::Value>,
}

fn when_op() -> CompareOp {
    CompareOp::Exists
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
