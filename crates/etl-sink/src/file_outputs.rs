//! One output file per value of a record's field: a file sink whose path
//! is a template (`out/{level}/events.ndjson`).
//!
//! Each distinct path is a [`FileSink`] of its own: its own lock, rotation
//! and recovery point. A batch is split by path and each part written to
//! its file; the write returns once every part is durable, so a record is
//! acknowledged only when the file it belongs in holds it. At most
//! `max_open` outputs are open at once (the least recently written one is
//! flushed and closed to make room), and an output nothing was written to
//! for `close_idle_after` is closed at the next write or flush.
//!
//! A value a path cannot be made of (a field that is missing, null, an
//! object or an array, not UTF-8, empty, `.` or `..`, or holding `/` or a
//! NUL byte) refuses the record, which the driver sends to the
//! dead-letter path: a record's data never chooses a folder outside the
//! template's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etl_fs::Fs;
use etl_record::Record;

use crate::{EncodedBatch, FileSink, FileSinkConfig, Reject, Sink, SinkError};

/// A path with `{field}` placeholders: dotted paths into the record's
/// JSON value (`{user.region}`, `{items.0.sku}`). In a path with a
/// placeholder, `{{` and `}}` are literal braces; a path without one is
/// used as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathTemplate {
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Vec<String>),
}

impl PathTemplate {
    /// The template `path` stands for, or `None` when it has no
    /// placeholder (a plain path).
    ///
    /// # Errors
    ///
    /// An unclosed or empty placeholder, or a stray `}`.
    pub fn parse(path: &str) -> Result<Option<PathTemplate>, String> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut chars = path.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    text.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    text.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => return Err(format!("{path:?}: a `{{` is not closed")),
                        }
                    }
                    let field: Vec<String> = name.trim().split('.').map(str::to_owned).collect();
                    if field.iter().any(String::is_empty) {
                        return Err(format!(
                            "{path:?}: {{{name}}} is not a field path (names separated by dots)"
                        ));
                    }
                    parts.push(Part::Text(std::mem::take(&mut text)));
                    parts.push(Part::Field(field));
                }
                '}' => return Err(format!("{path:?}: a `}}` without its `{{` (write `}}}}`)")),
                c => text.push(c),
            }
        }
        if parts.is_empty() {
            return Ok(None);
        }
        parts.push(Part::Text(text));
        parts.retain(|p| !matches!(p, Part::Text(t) if t.is_empty()));
        Ok(Some(PathTemplate { parts }))
    }

    /// The folder every output is under: the template's text before its
    /// first placeholder, up to its last `/`.
    #[must_use]
    pub fn base(&self) -> PathBuf {
        match self.parts.first() {
            Some(Part::Text(t)) => t
                .rfind('/')
                .map_or_else(PathBuf::new, |end| PathBuf::from(&t[..end.max(1)])),
            _ => PathBuf::new(),
        }
    }

    /// The path for `record`.
    ///
    /// # Errors
    ///
    /// Why no path can be made for it (see the module's docs).
    pub fn render(&self, record: &Record) -> Result<PathBuf, String> {
        let value: serde_json::Value = serde_json::from_slice(&record.value)
            .map_err(|e| format!("the value is not JSON ({e}): no output path"))?;
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Field(path) => out.push_str(&segment(&value, path)?),
            }
        }
        Ok(PathBuf::from(out))
    }
}

/// The text of the field at `path` of `value`, fit to be (part of) one
/// path component.
fn segment(value: &serde_json::Value, path: &[String]) -> Result<String, String> {
    let name = path.join(".");
    let at = etl_record::json_field(value, path)
        .ok_or_else(|| format!("field {name:?} of the output path is missing"))?;
    let text = match at {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::Bool(b) => b.to_string(),
        _ => {
            return Err(format!(
                "field {name:?} of the output path is not a string, number or boolean"
            ));
        }
    };
    if text.is_empty() || text == "." || text == ".." || text.contains(['/', '\0']) {
        return Err(format!(
            "field {name:?} of the output path is {text:?}: not a file name part \
             (empty, `.`, `..`, or holding `/` or NUL)"
        ));
    }
    Ok(text)
}

/// How a [`FileOutputs`] keeps its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOutputsConfig {
    /// Each file's own configuration (not exactly once: an output per
    /// value has no single progress to store).
    pub file: FileSinkConfig,
    /// Files open at once, at least 1.
    pub max_open: usize,
    /// An output nothing was written to for this long is closed.
    pub close_idle_after: Duration,
}

impl Default for FileOutputsConfig {
    fn default() -> Self {
        FileOutputsConfig {
            file: FileSinkConfig::default(),
            max_open: 64,
            close_idle_after: Duration::from_secs(60),
        }
    }
}

/// The file sink of a templated path: each record to the file its fields
/// name. See the module's docs.
pub struct FileOutputs {
    template: PathTemplate,
    config: FileOutputsConfig,
    fs: Arc<dyn Fs>,
    open: tokio::sync::Mutex<HashMap<PathBuf, Output>>,
}

struct Output {
    sink: Arc<FileSink>,
    last: Instant,
}

impl std::fmt::Debug for FileOutputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileOutputs")
            .field("template", &self.template)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl FileOutputs {
    /// The sink of `template` on the local file system.
    ///
    /// # Errors
    ///
    /// [`SinkError::Permanent`] for an exactly-once file configuration or
    /// `max_open` of 0 (the configuration file's checks refuse both first).
    pub fn new(template: PathTemplate, config: FileOutputsConfig) -> Result<Self, SinkError> {
        Self::new_in(Arc::new(etl_fs::RealFs), template, config)
    }

    /// [`new`](Self::new) on the file system `fs`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn new_in(
        fs: Arc<dyn Fs>,
        template: PathTemplate,
        config: FileOutputsConfig,
    ) -> Result<Self, SinkError> {
        if config.file.exactly_once {
            return Err(SinkError::permanent(
                "exactly_once needs a single output file: a templated path writes one per value",
            ));
        }
        if config.max_open == 0 {
            return Err(SinkError::permanent("max_open_outputs must be at least 1"));
        }
        Ok(FileOutputs {
            template,
            config,
            fs,
            open: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Outputs open now.
    pub async fn open_outputs(&self) -> usize {
        self.open.lock().await.len()
    }

    /// The open output for `path`, opened (its folder created) if it is
    /// not, closing the idle ones and, past the bound, the least recently
    /// written.
    async fn output(
        &self,
        open: &mut HashMap<PathBuf, Output>,
        path: &Path,
    ) -> Result<Arc<FileSink>, SinkError> {
        let now = Instant::now();
        if let Some(out) = open.get_mut(path) {
            out.last = now;
            return Ok(out.sink.clone());
        }
        close_idle(open, now, self.config.close_idle_after).await;
        while open.len() >= self.config.max_open {
            let Some(oldest) = open
                .iter()
                .min_by_key(|(_, o)| o.last)
                .map(|(p, _)| p.clone())
            else {
                break;
            };
            if let Some(out) = open.remove(&oldest) {
                close(&oldest, out).await;
            }
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // The file sink's open makes the new folders durable, up to
            // the root, before anything is reported written there.
            self.fs
                .create_dir_all(dir)
                .map_err(|e| SinkError::io("create the output folder", dir, e))?;
        }
        let sink = Arc::new(FileSink::open_in(self.fs.clone(), path, self.config.file).await?);
        open.insert(
            path.to_owned(),
            Output {
                sink: sink.clone(),
                last: now,
            },
        );
        Ok(sink)
    }
}

/// Close the outputs nothing was written to for `idle`.
async fn close_idle(open: &mut HashMap<PathBuf, Output>, now: Instant, idle: Duration) {
    let stale: Vec<PathBuf> = open
        .iter()
        .filter(|(_, o)| now.duration_since(o.last) >= idle)
        .map(|(p, _)| p.clone())
        .collect();
    for path in stale {
        if let Some(out) = open.remove(&path) {
            close(&path, out).await;
        }
    }
}

/// Flush and close one output. What was written to it is durable already
/// (a write returns once it is); the flush records the recovery point, so
/// a failure costs the next open a scan, nothing more.
async fn close(path: &Path, out: Output) {
    if let Err(e) = out.sink.flush().await {
        tracing::warn!(path = %path.display(), error = %e, "closing an output: its flush failed");
    }
}

#[async_trait]
impl Sink for FileOutputs {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut groups: Vec<(PathBuf, Vec<usize>)> = Vec::new();
        let mut index: HashMap<PathBuf, usize> = HashMap::new();
        let mut rejects = Vec::new();
        for (i, record) in batch.records().iter().enumerate() {
            match self.template.render(record) {
                Ok(path) => {
                    let at = *index.entry(path.clone()).or_insert_with(|| {
                        groups.push((path, Vec::new()));
                        groups.len() - 1
                    });
                    groups[at].1.push(i);
                }
                Err(reason) => rejects.push(Reject::new(i, reason)),
            }
        }
        // One output at a time, in the order first seen: the lock keeps
        // the bound on open files while a write waits on one.
        let mut open = self.open.lock().await;
        for (path, indices) in groups {
            let sink = self.output(&mut open, &path).await?;
            let mut wanted = indices.iter().copied().peekable();
            let part = batch.select(|i| {
                if wanted.peek() == Some(&i) {
                    wanted.next();
                    true
                } else {
                    false
                }
            });
            sink.write(&part).await?;
        }
        if rejects.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejects))
        }
    }

    async fn flush(&self) -> Result<(), SinkError> {
        let mut open = self.open.lock().await;
        close_idle(&mut open, Instant::now(), self.config.close_idle_after).await;
        for out in open.values() {
            out.sink.flush().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "file_outputs_tests.rs"]
mod tests;
