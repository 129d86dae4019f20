//! Configuration of the file source, and how its inputs become partitions.

use std::path::{Path, PathBuf};
use std::time::Duration;

use etl_fs::Fs;
use etl_record::{PartitionId, SourceId};

use crate::SourceError;
use crate::file_glob::{expand_each, is_pattern};

/// How a line becomes a record (`format` of a file source in a
/// configuration file: `"ndjson"` or `"lines"`), and, for a sink that
/// writes lines, how a record becomes one (its `encoding`: the value as
/// one JSON document, or its bytes as they are).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineFormat {
    /// Each line must be one JSON value; any other line (including an
    /// empty one) becomes a dead letter with the parser's reason.
    #[default]
    Ndjson,
    /// Each line is a record as it is (it must still be valid UTF-8).
    Lines,
}

/// What to do with a last line that has no trailing newline when a file
/// that is not followed reaches its end (`eof` in a configuration file:
/// `"wait"`, `"emit"` or `"dead_letter"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EofPolicy {
    /// Leave it unread: it is not emitted and the partition's committed
    /// offset stays before it, so a later run reads it once it is complete.
    #[default]
    Wait,
    /// Emit it as a record (after the usual checks).
    Emit,
    /// Send it to the dead-letter path as truncated.
    DeadLetter,
}

/// What to do with an input whose identity changed since its offsets were
/// committed: another file now has its name (a new inode), its first
/// bytes changed, or it is shorter than its committed offset
/// (`on_replaced` in a configuration file: `"read_from_start"` or
/// `"fail"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplacedPolicy {
    /// Read it as a new file, from its start, under a new partition id
    /// (with a warning naming the file and what changed).
    #[default]
    ReadFromStart,
    /// Stop with [`SourceError::InputReplaced`].
    Fail,
}

/// Configuration of a [`FileSource`](crate::FileSource).
///
/// A `type = "file"` source in a configuration file sets the same options
/// under the same names, with the same defaults (sizes and durations
/// written as `"1MiB"` and `"100ms"`); `read_chunk_bytes`,
/// `max_batch_bytes`, `follow_interval` and `state_dir` are Rust-only,
/// the last taken from the offset store's folder.
#[derive(Clone, Debug)]
pub struct FileSourceConfig {
    /// The source's name, part of every record's idempotency key.
    pub name: SourceId,
    /// Paths or glob patterns (`logs/*.ndjson`). A pattern must match at
    /// least one file; a plain path must exist.
    pub paths: Vec<String>,
    /// NDJSON or raw lines.
    pub format: LineFormat,
    /// Longest accepted line in bytes, without its newline. Longer lines
    /// become dead letters (with a 1 KiB preview) and are never buffered
    /// whole.
    pub max_line_bytes: usize,
    /// Bytes per read call.
    pub read_chunk_bytes: usize,
    /// Most records (and dead letters) per batch.
    pub max_batch_records: usize,
    /// Most payload bytes per batch (a batch holds at least one line).
    pub max_batch_bytes: usize,
    /// Policy for an unterminated last line at the end of a file.
    pub eof: EofPolicy,
    /// Keep reading files as they grow instead of ending at their end. An
    /// unterminated last line then always waits for its newline.
    pub follow: bool,
    /// In follow mode, how long [`next`](crate::Source::next) waits before
    /// reporting idleness when no file has grown.
    pub follow_interval: Duration,
    /// The state folder (the offset store's), where the source records
    /// which file each partition id stands for (`file-inputs`). Without
    /// it the record lives in memory for the run only, and a file replaced
    /// between runs cannot be told from the one whose offsets are stored.
    pub state_dir: Option<PathBuf>,
    /// What to do with an input that was replaced, rewritten or truncated.
    pub on_replaced: ReplacedPolicy,
    /// Most input files open at once (at least 1). Files beyond it wait
    /// for one to be read to its end (or, in follow mode, to go idle); a
    /// file is reopened at its position, and checked to be the same file.
    pub max_open_files: usize,
}

impl Default for FileSourceConfig {
    fn default() -> Self {
        FileSourceConfig {
            name: SourceId::new("file"),
            paths: Vec::new(),
            format: LineFormat::Ndjson,
            max_line_bytes: 1 << 20,
            read_chunk_bytes: 256 << 10,
            max_batch_records: 4096,
            max_batch_bytes: 1 << 20,
            eof: EofPolicy::Wait,
            follow: false,
            follow_interval: Duration::from_millis(100),
            state_dir: None,
            on_replaced: ReplacedPolicy::ReadFromStart,
            max_open_files: 16,
        }
    }
}

impl FileSourceConfig {
    pub(crate) fn validate(&self) -> Result<(), SourceError> {
        if self.paths.is_empty() {
            return Err(SourceError::Config(
                "the file source needs at least one input".into(),
            ));
        }
        if self.max_line_bytes == 0 || self.max_batch_records == 0 || self.max_batch_bytes == 0 {
            return Err(SourceError::Config(
                "max_line_bytes, max_batch_records and max_batch_bytes must be positive".into(),
            ));
        }
        if self.max_open_files == 0 {
            return Err(SourceError::Config(
                "max_open_files must be at least 1".into(),
            ));
        }
        if self.read_chunk_bytes < 4096 {
            return Err(SourceError::Config(format!(
                "read_chunk_bytes must be at least 4096, got {}",
                self.read_chunk_bytes
            )));
        }
        Ok(())
    }
}

/// The first partition id a file's path is given: the 32-bit FNV-1a hash
/// of its canonical (absolute, symlink-free) path. A path keeps its id
/// across restarts as long as the same file is found there; a file that
/// replaced it, or an id already taken, gets another one (the source
/// records which in its state folder; see
/// [`FileSource`](crate::FileSource)).
#[must_use]
pub fn file_partition_id(canonical_path: &Path) -> PartitionId {
    let mut hash: u32 = 0x811c_9dc5;
    for &byte in canonical_path.as_os_str().as_encoded_bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    PartitionId(hash)
}

/// Expand the inputs (paths and glob patterns, as in
/// [`FileSourceConfig::paths`]) into canonical paths, sorted, as the file
/// source does. A file named twice (by two patterns) is read once. A
/// pattern's matches that are not regular files are left out; a plain path
/// must be a regular file.
///
/// # Errors
///
/// A bad or empty pattern, or a path that cannot be resolved.
pub fn resolve_inputs(inputs: &[String]) -> Result<Vec<PathBuf>, SourceError> {
    resolve_inputs_in(&etl_fs::RealFs, inputs)
}

/// [`resolve_inputs`] on the file system `fs`: patterns are matched
/// against the names its [`read_dir`](Fs::read_dir) lists, and paths made
/// canonical by its [`canonicalize`](Fs::canonicalize).
///
/// # Errors
///
/// As [`resolve_inputs`].
pub fn resolve_inputs_in(fs: &dyn Fs, inputs: &[String]) -> Result<Vec<PathBuf>, SourceError> {
    resolve_inputs_as(fs, inputs, |path| path)
}

/// [`resolve_inputs_in`], keeping `keep` of each canonical path (the
/// file source keeps the one shared copy of it its record of inputs
/// holds): the paths are made canonical as they are matched, one at a
/// time, so neither a copy of every match nor of every canonical path is
/// held at once besides what `keep` returns.
pub(crate) fn resolve_inputs_as<T: Ord>(
    fs: &dyn Fs,
    inputs: &[String],
    mut keep: impl FnMut(PathBuf) -> T,
) -> Result<Vec<T>, SourceError> {
    let mut files: Vec<T> = Vec::new();
    for input in inputs {
        if is_pattern(input) {
            let before = files.len();
            expand_each(fs, input, |path| {
                if fs.metadata(&path).is_ok_and(|m| m.is_file()) {
                    let canonical = fs
                        .canonicalize(&path)
                        .map_err(|e| SourceError::io(&path, e))?;
                    drop(path);
                    files.push(keep(canonical));
                }
                Ok(())
            })?;
            if files.len() == before {
                return Err(SourceError::NoMatch {
                    pattern: input.clone(),
                });
            }
        } else {
            let path = Path::new(input);
            let canonical = fs
                .canonicalize(path)
                .map_err(|e| SourceError::io(path, e))?;
            files.push(keep(canonical));
        }
    }
    files.sort();
    files.dedup();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_ids_are_fnv1a_of_the_path() {
        // Reference values of 32-bit FNV-1a.
        assert_eq!(file_partition_id(Path::new("")), PartitionId(0x811c_9dc5));
        assert_eq!(file_partition_id(Path::new("a")), PartitionId(0xe40c_292c));
        assert_ne!(
            file_partition_id(Path::new("/data/a.ndjson")),
            file_partition_id(Path::new("/data/b.ndjson"))
        );
    }

    #[test]
    fn globs_and_paths_resolve_once_each() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.ndjson", "b.ndjson", "c.txt"] {
            std::fs::write(dir.path().join(name), "{}\n").unwrap();
        }
        let pattern = format!("{}/*.ndjson", dir.path().display());
        let plain = dir.path().join("a.ndjson").display().to_string();
        let files = resolve_inputs(&[pattern, plain]).unwrap();
        assert_eq!(files.len(), 2);
        assert!(files.windows(2).all(|w| w[0] < w[1]));

        let none = format!("{}/*.csv", dir.path().display());
        let err = resolve_inputs(std::slice::from_ref(&none)).unwrap_err();
        assert!(matches!(err, SourceError::NoMatch { ref pattern } if *pattern == none));
        assert!(err.to_string().contains("*.csv"));

        let err = resolve_inputs(&["[".to_owned()]).unwrap_err();
        assert!(matches!(err, SourceError::Pattern { .. }), "{err}");
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let err = resolve_inputs(&["/nonexistent/dir/in.ndjson".to_owned()]).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/dir/in.ndjson"),
            "{err}"
        );
    }
}
