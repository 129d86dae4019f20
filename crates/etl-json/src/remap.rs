//! `type = "remap"` and `type = "filter"` with a `condition`: programs in
//! the Vector Remap Language (VRL), run as Vector's `remap` transform runs
//! them.
//!
//! `.` is the record's value, parsed from JSON; `%` is the record's
//! metadata: `%source`, `%partition`, `%offset`, `%topic` (the Kafka
//! topic, or null; all four read-only), `%key` (bytes
//! or null), `%headers` (an object of bytes or null; the last of repeated
//! keys), `%timestamp` (a timestamp or null). A `remap` program may assign
//! or delete `%key`, `%headers` and `%timestamp`, and the record leaves
//! with them; other metadata cannot be assigned. The standard library is
//! built without its network, environment, system and crypto groups, so
//! `http_request`, `dns_lookup`, `get_env_var`, `get_hostname` and the
//! like do not compile: a program cannot reach the network or read the
//! environment. Timestamps are parsed and formatted in UTC.
//!
//! Invariant: a compiled [`Program`] is immutable and shared by every fork;
//! each fork has its own [`Runtime`] (the program's local variables).

use std::sync::Arc;

use bytes::Bytes;
use etl_record::Record;
use vrl::compiler::runtime::{Runtime, Terminate};
use vrl::compiler::state::{ExternalEnv, RuntimeState};
use vrl::compiler::{CompileConfig, Program, TargetValue, TimeZone};
use vrl::path::{OwnedSegment, OwnedTargetPath, PathPrefix};
use vrl::value::{ObjectMap, Secrets, Value};

use etl_transform::{Outcome, Transform};

use crate::faithful;
use crate::remap_fast::{Arena, Lite, LiteProgram};

/// A VRL program that compiled, ready to run on records.
///
/// A program that only reads fields, compares, does arithmetic, assigns
/// and deletes runs on the record's text without building a document
/// tree (the fast path; docs/operations.md lists what it covers); any
/// record it cannot decide, and every other program, runs on VRL's
/// runtime, with the same results.
#[derive(Clone, Debug)]
pub struct VrlProgram {
    program: Arc<Program>,
    /// Whether the program reads or writes `%`: the metadata object is
    /// built (and read back) only then.
    uses_metadata: bool,
    /// The program's fast form, when it has one.
    lite: Option<Arc<LiteProgram>>,
    /// VRL's compiler warnings, each as VRL prints it.
    warnings: Arc<[String]>,
}

/// Why a VRL program did not compile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct VrlError {
    /// VRL's diagnostic as text, quoting the program with its line and
    /// column.
    pub message: String,
    /// Byte offset in the program of the first error, when VRL names one.
    pub offset: Option<usize>,
}

impl VrlProgram {
    /// Compile a `remap` program.
    ///
    /// # Errors
    ///
    /// VRL's diagnostic when the program does not compile (syntax, an
    /// unknown or excluded function, an unhandled error, an assignment
    /// to `%`).
    pub fn remap(source: &str) -> Result<Self, VrlError> {
        let mut config = CompileConfig::default();
        for name in ["source", "partition", "offset", "topic"] {
            config.set_read_only_path(
                OwnedTargetPath::metadata(vrl::owned_value_path!(name)),
                true,
            );
        }
        let program = Self::compile(source, config)?;
        let assigned = program
            .program
            .info()
            .target_assignments
            .iter()
            .find(|p| {
                p.prefix == PathPrefix::Metadata
                    && !matches!(
                        p.path.segments.first(),
                        Some(OwnedSegment::Field(f)) if WRITABLE.contains(&f.as_str())
                    )
            })
            .cloned();
        if let Some(path) = assigned {
            return Err(VrlError {
                message: format!(
                    "cannot assign {path}: of the metadata, a program assigns only %key, \
                     %headers and %timestamp (%source, %partition and %offset are read-only)"
                ),
                offset: None,
            });
        }
        Ok(program)
    }

    /// Compile a filter `condition`: a read-only program that must
    /// resolve to a boolean.
    ///
    /// # Errors
    ///
    /// VRL's diagnostic, or a note that the expression is not boolean.
    pub fn condition(source: &str) -> Result<Self, VrlError> {
        let mut config = CompileConfig::default();
        config.set_read_only();
        let program = Self::compile(source, config)?;
        let kind = program.program.final_type_info().result.kind().clone();
        if !kind.is_boolean() {
            return Err(VrlError {
                message: format!(
                    "a condition must resolve to a boolean, but this one resolves to {kind}"
                ),
                offset: None,
            });
        }
        Ok(program)
    }

    fn compile(source: &str, config: CompileConfig) -> Result<Self, VrlError> {
        let functions = vrl::stdlib::all();
        match vrl::compiler::compile_with_external(
            source,
            &functions,
            &ExternalEnv::default(),
            config,
        ) {
            Ok(compiled) => {
                let info = compiled.program.info();
                let uses_metadata = info
                    .target_queries
                    .iter()
                    .chain(&info.target_assignments)
                    .any(|p| p.prefix == PathPrefix::Metadata);
                let warnings = compiled
                    .warnings
                    .into_iter()
                    .map(|w| {
                        vrl::diagnostic::Formatter::new(source, w)
                            .to_string()
                            .trim()
                            .to_owned()
                    })
                    .collect();
                Ok(VrlProgram {
                    program: Arc::new(compiled.program),
                    uses_metadata,
                    lite: LiteProgram::new(source).map(Arc::new),
                    warnings,
                })
            }
            Err(diagnostics) => {
                let offset = diagnostics
                    .errors()
                    .iter()
                    .flat_map(|d| d.labels.iter())
                    .find(|l| l.primary)
                    .map(|l| l.span.start());
                let message = vrl::diagnostic::Formatter::new(source, diagnostics)
                    .to_string()
                    .trim()
                    .to_owned();
                Err(VrlError { message, offset })
            }
        }
    }

    /// VRL's compiler warnings about the program (an unused expression or
    /// variable, a `!` on a call that cannot fail, a deprecated function),
    /// each as VRL prints it, quoting the program with its line and
    /// column. They do not stop it compiling.
    #[must_use]
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether the program takes the fast path (see [`VrlProgram`]).
    #[must_use]
    pub fn is_fast(&self) -> bool {
        self.lite.is_some()
    }

    /// The program's fast form, when it has one.
    pub(crate) fn lite(&self) -> Option<Arc<LiteProgram>> {
        self.lite.clone()
    }

    /// The same program, run on VRL's runtime for every record: what the
    /// fast path is checked against.
    #[must_use]
    pub fn runtime_only(mut self) -> Self {
        self.lite = None;
        self
    }

    fn metadata(&self, record: &Record) -> Value {
        if !self.uses_metadata {
            return Value::Object(ObjectMap::new());
        }
        let bytes = |b: &Option<Bytes>| b.clone().map_or(Value::Null, Value::Bytes);
        let mut headers = ObjectMap::new();
        for h in &record.headers {
            headers.insert(h.key.as_str().into(), bytes(&h.value));
        }
        let timestamp = record
            .timestamp
            .and_then(|t| chrono::DateTime::from_timestamp_millis(t.0))
            .map_or(Value::Null, Value::Timestamp);
        let mut meta = ObjectMap::new();
        meta.insert("source".into(), record.position.source.as_str().into());
        meta.insert(
            "partition".into(),
            Value::Integer(i64::from(record.position.partition.0)),
        );
        meta.insert("offset".into(), Value::Integer(record.position.offset.0));
        meta.insert(
            "topic".into(),
            record.topic.as_deref().map_or(Value::Null, Into::into),
        );
        meta.insert("key".into(), bytes(&record.key));
        meta.insert("headers".into(), Value::Object(headers));
        meta.insert("timestamp".into(), timestamp);
        Value::Object(meta)
    }
}

/// What running a program on one record gave.
enum Run {
    /// The value before (null when not kept) and after, and what the
    /// program resolved to.
    Done {
        old: Value,
        new: Value,
        result: Value,
        /// `%` after the program (an empty object when it does not use it).
        metadata: Value,
    },
    Aborted,
    Failed(String),
    Rejected(String),
}

/// One copy of a program with its own runtime state.
#[derive(Debug)]
struct Runner {
    program: VrlProgram,
    runtime: Runtime,
    timezone: TimeZone,
}

impl Runner {
    fn new(program: VrlProgram) -> Self {
        Runner {
            program,
            runtime: Runtime::new(RuntimeState::default()),
            timezone: TimeZone::parse("UTC").unwrap_or_default(),
        }
    }

    /// Run the program on `record`; `keep_old` keeps a copy of the value
    /// read (a condition, which cannot change it, needs none).
    fn run(&mut self, record: &Record, keep_old: bool) -> Run {
        let old: Value = match serde_json::from_slice(&record.value) {
            Ok(v @ Value::Object(_)) => v,
            Ok(other) => {
                return Run::Rejected(format!(
                    "expected a JSON object, found {}",
                    other.kind_str()
                ));
            }
            Err(e) => return Run::Rejected(format!("invalid JSON: {e}")),
        };
        let (old, value) = if keep_old {
            (old.clone(), old)
        } else {
            (Value::Null, old)
        };
        let mut target = TargetValue {
            value,
            metadata: self.program.metadata(record),
            secrets: Secrets::default(),
        };
        let result = self
            .runtime
            .resolve(&mut target, &self.program.program, &self.timezone);
        self.runtime.clear();
        match result {
            Ok(result) => Run::Done {
                old,
                new: target.value,
                result,
                metadata: target.metadata,
            },
            Err(Terminate::Abort(_)) => Run::Aborted,
            Err(e @ (Terminate::Error(_) | Terminate::Interrupted)) => Run::Failed(e.to_string()),
        }
    }
}

/// The `remap` step: runs a VRL program on each record.
///
/// An `abort` drops the record (counted as filtered); a runtime error
/// sends the record, as it came, to the dead-letter path with VRL's
/// message. A `.` that ends as an array becomes one record per element,
/// as in Vector. The result keeps the text and key order of every value
/// the program did not change; new keys come after the original ones
/// (docs/operations.md, "What comes out").
#[derive(Debug)]
pub struct Remap {
    name: String,
    runner: Runner,
    drop_on_error: bool,
    checked_input: bool,
    arena: Arena,
}

impl Remap {
    /// A step named `name` running `program`.
    #[must_use]
    pub fn new(name: impl Into<String>, program: VrlProgram) -> Self {
        Remap {
            name: name.into(),
            runner: Runner::new(program),
            drop_on_error: true,
            checked_input: false,
            arena: Arena::default(),
        }
    }

    /// Whether every record reaching this step is known to be valid JSON
    /// (default `false`): the NDJSON file source checks every line, and
    /// every step of a configured chain writes valid JSON. The fast path
    /// then does not check it again. Records that are not valid JSON
    /// must not reach a step told otherwise: what it makes of them is not
    /// specified (it does not panic).
    #[must_use]
    pub fn checked_input(mut self, checked: bool) -> Self {
        self.checked_input = checked;
        self
    }

    /// What a runtime error does: send the record to the dead-letter path
    /// (`true`, the default) or halt the run (`false`).
    #[must_use]
    pub fn drop_on_error(mut self, drop: bool) -> Self {
        self.drop_on_error = drop;
        self
    }
}

impl Remap {
    /// A copy for another worker, with its own runtime and buffers.
    pub(crate) fn forked(&self) -> Self {
        Remap::new(self.name.clone(), self.runner.program.clone())
            .drop_on_error(self.drop_on_error)
            .checked_input(self.checked_input)
    }

    /// Whether the records reaching it are known to be valid JSON.
    pub(crate) fn is_checked_input(&self) -> bool {
        self.checked_input
    }

    /// The program's fast form, when it has one.
    pub(crate) fn lite(&self) -> Option<Arc<LiteProgram>> {
        self.runner.program.lite()
    }
}

impl Transform for Remap {
    fn name(&self) -> &str {
        &self.name
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(self.forked()))
    }

    fn apply(&mut self, mut record: Record) -> Outcome {
        if let Some(lite) = &self.runner.program.lite {
            match lite.run(&record.value, &mut self.arena, true, self.checked_input) {
                Lite::Done(None, _) => return Outcome::Keep(record),
                Lite::Done(Some(value), _) => {
                    record.value = value;
                    return Outcome::Keep(record);
                }
                Lite::Aborted => return Outcome::Filtered,
                Lite::Fallback => {}
            }
        }
        let run = match self.runner.run(&record, true) {
            Run::Done {
                old, new, metadata, ..
            } if self.runner.program.uses_metadata => {
                match written_metadata(&self.runner.program.metadata(&record), metadata) {
                    Ok(written) => Ok((old, new, written)),
                    Err(reason) => Err(Run::Failed(reason)),
                }
            }
            Run::Done { old, new, .. } => Ok((old, new, None)),
            other => Err(other),
        };
        let (old, new) = match run {
            Ok((old, new, written)) => {
                if let Some(written) = written {
                    written.apply(&mut record);
                }
                (old, new)
            }
            Err(Run::Aborted) => return Outcome::Filtered,
            Err(Run::Failed(reason)) if !self.drop_on_error => {
                return Outcome::Halt(record, reason);
            }
            Err(Run::Failed(reason) | Run::Rejected(reason)) => {
                return Outcome::Reject(record, reason);
            }
            Err(Run::Done { .. }) => return Outcome::Keep(record),
        };
        if new == old {
            return Outcome::Keep(record);
        }
        if let Value::Array(items) = new {
            let mut records = Vec::with_capacity(items.len());
            for item in items {
                match serde_json::to_vec(&item) {
                    Ok(bytes) => {
                        let mut r = record.clone();
                        r.value = bytes.into();
                        records.push(r);
                    }
                    Err(e) => return Outcome::Reject(record, format!("cannot serialize: {e}")),
                }
            }
            return Outcome::Many(records);
        }
        let original = record.value.clone();
        let Ok(text) = std::str::from_utf8(&original) else {
            return Outcome::Reject(record, "invalid JSON: not UTF-8".to_owned());
        };
        let mut out = Vec::with_capacity(text.len() + 32);
        match faithful::write(text, &old, &new, &mut out) {
            Ok(()) => {
                record.value = out.into();
                Outcome::Keep(record)
            }
            Err(e) => Outcome::Reject(record, format!("cannot serialize: {e}")),
        }
    }
}

/// The metadata a program may write, by name under `%`.
const WRITABLE: [&str; 3] = ["key", "headers", "timestamp"];

/// What a program wrote to a record's metadata.
struct WrittenMetadata {
    key: Option<Option<Bytes>>,
    headers: Option<etl_record::Headers>,
    timestamp: Option<Option<etl_record::Timestamp>>,
}

impl WrittenMetadata {
    fn apply(self, record: &mut Record) {
        if let Some(key) = self.key {
            record.key = key;
        }
        if let Some(headers) = self.headers {
            record.headers = headers;
        }
        if let Some(timestamp) = self.timestamp {
            record.timestamp = timestamp;
        }
    }
}

/// The changes to `%key`, `%headers` and `%timestamp` between `before`
/// (as [`VrlProgram::metadata`] built it) and `after`;
/// `None` when there are none. A value of the wrong type is an error
/// naming it: the record goes where a runtime error sends it.
fn written_metadata(before: &Value, after: Value) -> Result<Option<WrittenMetadata>, String> {
    if *before == after {
        return Ok(None);
    }
    let field = |v: &Value, name: &str| match v {
        Value::Object(map) => map.get(name).cloned().unwrap_or(Value::Null),
        _ => Value::Null,
    };
    let changed = |name: &str| {
        let new = field(&after, name);
        (new != field(before, name)).then_some(new)
    };
    let bytes = |name: &str, v: Value| match v {
        Value::Bytes(b) => Ok(Some(b)),
        Value::String(s) => Ok(Some(Bytes::copy_from_slice(s.as_bytes()))),
        Value::Null => Ok(None),
        other => Err(format!(
            "%{name} must be a string (bytes) or null, not {}",
            other.kind_str()
        )),
    };
    let key = changed("key").map(|v| bytes("key", v)).transpose()?;
    let headers = match changed("headers") {
        None => None,
        Some(Value::Object(map)) => {
            let mut headers = etl_record::Headers::default();
            for (k, v) in map {
                let value = bytes(&format!("headers.{k}"), v)?;
                headers.push(k.as_str(), value);
            }
            Some(headers)
        }
        Some(Value::Null) => Some(etl_record::Headers::default()),
        Some(other) => {
            return Err(format!(
                "%headers must be an object, not {}",
                other.kind_str()
            ));
        }
    };
    let timestamp = match changed("timestamp") {
        None => None,
        Some(Value::Timestamp(t)) => Some(Some(etl_record::Timestamp(t.timestamp_millis()))),
        Some(Value::Null) => Some(None),
        Some(other) => {
            return Err(format!(
                "%timestamp must be a timestamp or null, not {}",
                other.kind_str()
            ));
        }
    };
    Ok(Some(WrittenMetadata {
        key,
        headers,
        timestamp,
    }))
}

/// A `filter` step with a VRL `condition`: keeps the records for which it
/// is true, unchanged. `false` or an `abort` drops the record (counted as
/// filtered); a runtime error sends it to the dead-letter path.
#[derive(Debug)]
pub struct VrlFilter {
    name: String,
    runner: Runner,
    checked_input: bool,
    arena: Arena,
}

impl VrlFilter {
    /// A step named `name` keeping the records `condition` holds for.
    #[must_use]
    pub fn new(name: impl Into<String>, condition: VrlProgram) -> Self {
        VrlFilter {
            name: name.into(),
            runner: Runner::new(condition),
            checked_input: false,
            arena: Arena::default(),
        }
    }

    /// Whether every record reaching this step is known to be valid JSON,
    /// as [`Remap::checked_input`].
    #[must_use]
    pub fn checked_input(mut self, checked: bool) -> Self {
        self.checked_input = checked;
        self
    }
}

impl VrlFilter {
    /// A copy for another worker, with its own runtime and buffers.
    pub(crate) fn forked(&self) -> Self {
        VrlFilter::new(self.name.clone(), self.runner.program.clone())
            .checked_input(self.checked_input)
    }

    /// Whether the records reaching it are known to be valid JSON.
    pub(crate) fn is_checked_input(&self) -> bool {
        self.checked_input
    }

    /// The condition's fast form, when it has one.
    pub(crate) fn lite(&self) -> Option<Arc<LiteProgram>> {
        self.runner.program.lite()
    }
}

impl Transform for VrlFilter {
    fn name(&self) -> &str {
        &self.name
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(self.forked()))
    }

    fn apply(&mut self, record: Record) -> Outcome {
        if let Some(lite) = &self.runner.program.lite {
            match lite.run(&record.value, &mut self.arena, false, self.checked_input) {
                Lite::Done(_, Value::Boolean(true)) => return Outcome::Keep(record),
                Lite::Done(..) | Lite::Aborted => return Outcome::Filtered,
                Lite::Fallback => {}
            }
        }
        match self.runner.run(&record, false) {
            Run::Done {
                result: Value::Boolean(true),
                ..
            } => Outcome::Keep(record),
            Run::Done { .. } | Run::Aborted => Outcome::Filtered,
            Run::Failed(reason) | Run::Rejected(reason) => Outcome::Reject(record, reason),
        }
    }
}
