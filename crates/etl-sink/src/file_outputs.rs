//! One output file per value of a record's field: a file sink whose path
//! is a template (`out/{level}/events.ndjson`).
//!
//! Each distinct path is a [`FileSink`] of its own: its own lock, rotation
//! and recovery point. A batch is split by path and each part written to
//! its file, one after another; the write returns once every part is
//! durable, so a record is acknowledged only when the file it belongs in
//! holds it. A write that fails part-way remembers the parts it wrote, and
//! its retry (the same batch) writes only the others. At most `max_open`
//! outputs are open at once (the least recently written one is flushed and
//! closed to make room), and an output nothing was written to for
//! `close_idle_after` is closed when a new output opens or the sink
//! flushes. Writes go one at a time: with several writes in flight, an
//! `fsync = "interval"` output syncs every batch.
//!
//! Exactly once (`FileSinkConfig::exactly_once`), each output is an
//! exactly-once file sink with its own progress, and the sink stores the
//! progress all of them hold (see [`ProgressSink`]) after each batch.
//!
//! A value a path cannot be made of refuses the record, which the driver
//! sends to the dead-letter path: a field that is missing, null, an
//! object or an array, empty, `.` or `..`, holding `/` or a NUL byte, a
//! file name longer than 255 bytes, or a name another output keeps beside
//! its file (ending `.lock`, `.progress`, `.recovery`, `.tmp` or `.` and
//! digits, as a rotated file does). So does an output that cannot be
//! opened because of its name (a folder on the way is a file, the path is
//! a folder, another sink or run holds it). A record's data never chooses
//! a folder outside the template's, nor another output's files. An
//! output closed and then deleted or replaced by another program is
//! opened anew (not watched once closed, unlike a plain file sink's
//! single output).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etl_fs::Fs;
use etl_record::{FieldPath, Position, Record, Template, TemplateError, TemplatePart};

use crate::{
    EncodedBatch, FileSink, FileSinkConfig, Progress, ProgressSink, Reject, Sink, SinkError,
};

/// A path with `{field}` placeholders: [`FieldPath`](etl_record::FieldPath)s
/// into the record's JSON value (`{user.region}`, `{items.0.sku}`), as an
/// [`etl_record::Template`]. In a path with a placeholder, `{{` and `}}`
/// are literal braces; a path without one is used as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathTemplate {
    template: Template,
    /// The template as written (with the folder it was put under).
    text: String,
}

impl PathTemplate {
    /// The template `path` stands for, or `None` when it has no
    /// placeholder (a plain path).
    ///
    /// # Errors
    ///
    /// An unclosed placeholder, a stray `}`, or a placeholder that is not
    /// a field path.
    pub fn parse(path: &str) -> Result<Option<PathTemplate>, TemplateError> {
        let template = Template::parse(path)?;
        Ok(template.has_fields().then(|| PathTemplate {
            template,
            text: path.to_owned(),
        }))
    }

    /// The template `relative` (with placeholders) under the folder
    /// `base`, whose name is taken as it is (braces in it are no
    /// placeholders): a configuration file's relative path, resolved
    /// against the file's folder. `None` when `relative` has no
    /// placeholder.
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse), for `relative`.
    pub fn parse_under(base: &Path, relative: &str) -> Result<Option<PathTemplate>, TemplateError> {
        let Some(mut template) = PathTemplate::parse(relative)? else {
            return Ok(None);
        };
        if !base.as_os_str().is_empty() {
            let mut prefix = base.to_string_lossy().into_owned();
            if !prefix.ends_with('/') {
                prefix.push('/');
            }
            template.text.insert_str(0, &prefix);
            template.template.prepend(&prefix);
        }
        Ok(Some(template))
    }

    /// The folder every output is under: the template's text before its
    /// first placeholder, up to its last `/`.
    #[must_use]
    pub fn base(&self) -> PathBuf {
        match self.template.parts().first() {
            Some(TemplatePart::Text(t)) => t
                .rfind('/')
                .map_or_else(PathBuf::new, |end| PathBuf::from(&t[..end.max(1)])),
            _ => PathBuf::new(),
        }
    }

    /// The path for `record`.
    ///
    /// # Errors
    ///
    /// Why no path can be made for it (see the module's docs): an
    /// [`OutputPathError`].
    pub fn render(&self, record: &Record) -> Result<PathBuf, OutputPathError> {
        let value: serde_json::Value =
            serde_json::from_slice(&record.value).map_err(OutputPathError::NotJson)?;
        let path = PathBuf::from(
            self.template
                .render(|field, out| segment(&value, field).map(|text| out.push_str(&text)))?,
        );
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.as_deref().unwrap_or_default();
        if name.len() > 255 {
            return Err(OutputPathError::NameTooLong { bytes: name.len() });
        }
        if let Some(kept) = side_file(name) {
            return Err(OutputPathError::SideFile { path, kept });
        }
        Ok(path)
    }
}

/// Why a record gives no output path ([`PathTemplate::render`]); the
/// driver sends the record to the dead-letter path with this reason.
#[derive(Debug, thiserror::Error)]
pub enum OutputPathError {
    /// The record's value is not JSON.
    #[error("the value is not JSON ({0}): no output path")]
    NotJson(#[source] serde_json::Error),
    /// The value has no field at a placeholder's path.
    #[error("field \"{field}\" of the output path is missing")]
    Missing {
        /// The placeholder's field.
        field: FieldPath,
    },
    /// The field is null, an object or an array.
    #[error("field \"{field}\" of the output path is not a string, number or boolean")]
    NotScalar {
        /// The placeholder's field.
        field: FieldPath,
    },
    /// The field's text cannot be part of a file name.
    #[error(
        "field \"{field}\" of the output path is {text:?}: not a file name part \
         (empty, `.`, `..`, or holding `/` or NUL)"
    )]
    NotAName {
        /// The placeholder's field.
        field: FieldPath,
        /// Its text.
        text: String,
    },
    /// The output's file name is longer than a file system takes.
    #[error("the output file name is {bytes} bytes long, more than 255")]
    NameTooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// The output's name is one another output keeps beside its file.
    #[error(
        "the output {:?} ends like a file another output keeps beside it ({kept}): \
         the record would write into it",
        .path.display().to_string()
    )]
    SideFile {
        /// The output's path.
        path: PathBuf,
        /// What such a file is (`a lock`, `a rotated file`).
        kept: &'static str,
    },
}

/// What `name` would be beside another output's file, if anything: its
/// lock, progress, recovery point, their temporary copies, or a rotated
/// file (`.1`).
fn side_file(name: &str) -> Option<&'static str> {
    for (suffix, what) in [
        (".lock", "a lock"),
        (".progress", "a progress file"),
        (".recovery", "a recovery point"),
        (".tmp", "a file being replaced"),
    ] {
        if name.ends_with(suffix) {
            return Some(what);
        }
    }
    let (_, last) = name.rsplit_once('.')?;
    (!last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())).then_some("a rotated file")
}

/// The text of the field at `path` of `value`, fit to be (part of) one
/// path component.
fn segment<'v>(
    value: &'v serde_json::Value,
    path: &FieldPath,
) -> Result<Cow<'v, str>, OutputPathError> {
    let at = path.get(value).ok_or_else(|| OutputPathError::Missing {
        field: path.clone(),
    })?;
    let text = etl_record::scalar_text(at).ok_or_else(|| OutputPathError::NotScalar {
        field: path.clone(),
    })?;
    if text.is_empty() || text == "." || text == ".." || text.contains(['/', '\0']) {
        return Err(OutputPathError::NotAName {
            field: path.clone(),
            text: text.into_owned(),
        });
    }
    Ok(text)
}

/// What creating an output's folders is called in errors.
const CREATE_FOLDER: &str = "create the output folder";

/// How a [`FileOutputs`] keeps its files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOutputsConfig {
    /// Each file's own configuration. Exactly once, each output stores its
    /// own progress, and the sink the progress they all hold.
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
    /// The last write that failed part-way: which batch (its records'
    /// positions) and the outputs it wrote durably.
    partial: std::sync::Mutex<Option<(Vec<Position>, HashSet<PathBuf>)>>,
    /// Exactly once: the progress every output holds.
    combined: Option<Combined>,
}

/// An exactly-once templated sink's progress: the source offsets below
/// which every record is durably in the output it belongs to. Each output
/// is an exactly-once file sink of its own (its own progress, so a record
/// sent again is skipped by the output that holds it); this file, beside
/// them in the template's folder, is replaced only after every output a
/// batch went to holds its part, so it never runs ahead of any of them.
#[derive(Debug)]
struct Combined {
    /// `<folder>/.etl-outputs-<hash of the template>`, `.progress` beside.
    path: PathBuf,
    progress: std::sync::Mutex<Progress>,
}

impl Combined {
    fn open(fs: &dyn Fs, template: &PathTemplate) -> Result<Combined, SinkError> {
        let base = template.base();
        let dir = if base.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base
        };
        fs.create_dir_all(&dir)
            .map_err(|e| SinkError::io(CREATE_FOLDER, &dir, e))?;
        // FNV-1a of the template: two templates in one folder keep apart.
        let hash = template
            .text
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            });
        let path = dir.join(format!(".etl-outputs-{hash:016x}"));
        let progress = crate::file_progress::read_stored(fs, &path)?
            .map(|stored| stored.progress)
            .unwrap_or_default();
        Ok(Combined {
            path,
            progress: std::sync::Mutex::new(progress),
        })
    }

    fn get(&self) -> Progress {
        self.progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Every record of `batch` is durable in its output: store it.
    fn advance(&self, fs: &dyn Fs, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut progress = self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = progress.clone();
        next.advance_past(batch.records());
        if next == *progress {
            return Ok(());
        }
        let stored = crate::file_progress::Stored {
            progress: next.clone(),
            ..crate::file_progress::Stored::default()
        };
        crate::file_progress::write_stored(fs, &self.path, &stored)?;
        *progress = next;
        Ok(())
    }
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
    /// [`SinkError::Permanent`] for `max_open` of 0 (the configuration
    /// file's checks refuse it first); an I/O error or
    /// [`SinkError::CorruptProgress`] reading an exactly-once sink's
    /// progress.
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
        if config.max_open == 0 {
            return Err(SinkError::permanent("max_open_outputs must be at least 1"));
        }
        let combined = if config.file.exactly_once {
            Some(Combined::open(&*fs, &template)?)
        } else {
            None
        };
        Ok(FileOutputs {
            template,
            config,
            fs,
            open: tokio::sync::Mutex::new(HashMap::new()),
            partial: std::sync::Mutex::new(None),
            combined,
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
                .map_err(|e| SinkError::io(CREATE_FOLDER, dir, e))?;
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

/// Why an output cannot be opened because of its name (not because of
/// the disk or the machine), as a record's fault: a folder on the way is
/// a file, the path is a folder or its name too long, or another sink or
/// run holds it. `None` for every other error, which stays the sink's.
fn named_badly(e: &SinkError) -> Option<String> {
    use std::io::ErrorKind;
    match e {
        SinkError::Io { source, op, .. } => {
            let why = match source.kind() {
                ErrorKind::NotADirectory => "a folder on the output's path is a file",
                // Creating a folder where a file is.
                ErrorKind::AlreadyExists if *op == CREATE_FOLDER => {
                    "a folder on the output's path is a file"
                }
                ErrorKind::IsADirectory => "the output's path is a folder",
                ErrorKind::InvalidFilename => "the output's path is too long",
                _ => return None,
            };
            Some(format!("{why}: {e}"))
        }
        SinkError::Permanent(inner)
            if inner
                .downcast_ref::<crate::file_state::OutputInUse>()
                .is_some() =>
        {
            Some(format!("the output is held elsewhere: {e}"))
        }
        _ => None,
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
                Err(reason) => rejects.push(Reject::new(i, reason.to_string())),
            }
        }
        // A retry of a write that failed part-way: the outputs it wrote
        // hold their part already.
        // (Only a write after a failed one compares positions: the usual
        // write copies none.)
        let mut done = {
            let mut partial = self
                .partial
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match partial.take() {
                Some((last, done))
                    if last.len() == batch.len()
                        && last
                            .iter()
                            .zip(batch.records())
                            .all(|(p, r)| *p == r.position) =>
                {
                    done
                }
                _ => HashSet::new(),
            }
        };
        // One output at a time, in the order first seen: the lock keeps
        // the bound on open files while a write waits on one.
        let mut open = self.open.lock().await;
        for (path, indices) in groups {
            if done.contains(&path) {
                continue;
            }
            let written = match self.output(&mut open, &path).await {
                Ok(sink) => {
                    let mut wanted = indices.iter().copied().peekable();
                    let part = batch.select(|i| {
                        if wanted.peek() == Some(&i) {
                            wanted.next();
                            true
                        } else {
                            false
                        }
                    });
                    sink.write(&part).await
                }
                Err(e) => match named_badly(&e) {
                    Some(reason) => {
                        rejects.extend(indices.iter().map(|&i| Reject::new(i, reason.clone())));
                        Ok(())
                    }
                    None => Err(e),
                },
            };
            match written {
                Ok(()) => {
                    done.insert(path);
                }
                Err(e) => {
                    *self
                        .partial
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((
                        batch.records().iter().map(|r| r.position.clone()).collect(),
                        done,
                    ));
                    return Err(e);
                }
            }
        }
        // Every output holds its part (or refused it): the progress may
        // move past the whole batch.
        if let Some(combined) = &self.combined {
            combined.advance(&*self.fs, batch)?;
        }
        if rejects.is_empty() {
            Ok(())
        } else {
            rejects.sort_by_key(|r| r.index);
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

#[async_trait]
impl ProgressSink for FileOutputs {
    /// The offsets below which every record is durably in its output
    /// (nothing when not exactly once).
    fn progress(&self) -> Progress {
        self.combined
            .as_ref()
            .map(Combined::get)
            .unwrap_or_default()
    }

    async fn reload_progress(&self) -> Result<Progress, SinkError> {
        let Some(combined) = &self.combined else {
            return Ok(Progress::default());
        };
        let stored = crate::file_progress::read_stored(&*self.fs, &combined.path)?
            .map(|s| s.progress)
            .unwrap_or_default();
        *combined
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = stored.clone();
        Ok(stored)
    }
}

#[cfg(test)]
#[path = "file_outputs_tests.rs"]
mod tests;
