//! The file source: every input file is a partition of lines.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use etl_record::{Offset, PartitionId};

use crate::file_config::resolve_inputs;
use crate::line_reader::LineReader;
use crate::{FileSourceConfig, Source, SourceError, SourceEvent};

/// Reads lines from files: one partition per file, offsets are the byte
/// positions of line starts.
///
/// * **Partitions.** Each input file's partition id is
///   [`file_partition_id`](crate::file_partition_id) of its canonical path,
///   stable across restarts while the file stays where it is. Two files
///   with the same id are refused with
///   [`SourceError::PartitionCollision`].
/// * **Reads.** Each file is read in chunks of
///   [`read_chunk_bytes`](FileSourceConfig::read_chunk_bytes); newlines are
///   found with `memchr` and record values are slices of the read buffer,
///   not copies. A trailing `\r` is removed. Reads are plain blocking
///   reads of local files, made without an `.await` in between: the
///   source never waits on anything but the disk, and
///   [`next`](Source::next) is cancel safe because it cannot be
///   interrupted half-way.
/// * **Bad input** becomes dead letters in
///   [`PollBatch::rejected`](crate::PollBatch::rejected), never a panic:
///   invalid UTF-8, invalid JSON (in NDJSON mode), lines longer than
///   [`max_line_bytes`](FileSourceConfig::max_line_bytes) (skipped to
///   their newline without being buffered whole). An unterminated last
///   line follows [`EofPolicy`](crate::EofPolicy).
/// * **End.** Without [`follow`](FileSourceConfig::follow), the source
///   returns [`SourceEvent::End`] once every file is read to its end; with
///   it, it keeps polling for appended lines. Truncated or rotated files
///   are not detected in follow mode.
#[derive(Debug)]
pub struct FileSource {
    config: FileSourceConfig,
    files: Vec<FileState>,
    announced: bool,
    turn: usize,
}

#[derive(Debug)]
struct FileState {
    partition: PartitionId,
    reader: LineReader,
    /// Read to the end, and not followed.
    done: bool,
    paused: bool,
    /// An unterminated last line was reported once already.
    warned_tail: bool,
}

impl FileSource {
    /// Resolve the inputs and open every file.
    ///
    /// # Errors
    ///
    /// [`SourceError::Config`] for an invalid configuration; for each
    /// input, [`SourceError::Io`] naming a path that is missing or
    /// unreadable, [`SourceError::Pattern`] or [`SourceError::NoMatch`]
    /// for a bad or empty glob, [`SourceError::PartitionCollision`].
    pub fn open(config: FileSourceConfig) -> Result<Self, SourceError> {
        config.validate()?;
        let files = resolve_inputs(&config.inputs)?
            .into_iter()
            .map(|(partition, path)| {
                // Offsets, progress lines and dead-letter keys name the
                // partition; this says which file it is.
                tracing::info!(
                    source = %config.name,
                    partition = partition.0,
                    path = %path.display(),
                    "reading file"
                );
                Ok(FileState {
                    partition,
                    reader: LineReader::open(&path, config.name.clone(), partition)?,
                    done: false,
                    paused: false,
                    warned_tail: false,
                })
            })
            .collect::<Result<Vec<_>, SourceError>>()?;
        Ok(FileSource {
            config,
            files,
            announced: false,
            turn: 0,
        })
    }

    /// Each partition with the file it reads, in partition order.
    #[must_use]
    pub fn partitions(&self) -> Vec<(PartitionId, PathBuf)> {
        self.files
            .iter()
            .map(|f| (f.partition, f.reader.path().to_path_buf()))
            .collect()
    }

    /// The file a partition reads.
    #[must_use]
    pub fn path_of(&self, partition: PartitionId) -> Option<&Path> {
        self.file(partition).map(|f| f.reader.path())
    }

    fn file(&self, partition: PartitionId) -> Option<&FileState> {
        self.files.iter().find(|f| f.partition == partition)
    }

    fn file_mut(&mut self, partition: PartitionId) -> Result<&mut FileState, SourceError> {
        self.files
            .iter_mut()
            .find(|f| f.partition == partition)
            .ok_or(SourceError::UnknownPartition { partition })
    }

    /// One pass over the files, starting after the last one served.
    fn poll_files(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        let n = self.files.len();
        for k in 0..n {
            let index = (self.turn + k) % n;
            let file = &mut self.files[index];
            if file.done || file.paused {
                continue;
            }
            let outcome = file.reader.read_batch(&self.config, !self.config.follow)?;
            if outcome.pending_tail && !file.warned_tail && !self.config.follow {
                file.warned_tail = true;
                tracing::warn!(
                    path = %file.reader.path().display(),
                    "last line has no newline; it is left unread until it is complete"
                );
            }
            if outcome.at_eof && !self.config.follow && outcome.batch.is_empty() {
                file.done = true;
            }
            if !outcome.batch.is_empty() {
                self.turn = (index + 1) % n;
                return Ok(Some(SourceEvent::Batch(outcome.batch)));
            }
        }
        if self.files.iter().all(|f| f.done) {
            return Ok(Some(SourceEvent::End));
        }
        Ok(None)
    }
}

#[async_trait]
impl Source for FileSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if !self.announced {
            self.announced = true;
            return Ok(SourceEvent::Assigned(
                self.files.iter().map(|f| f.partition).collect(),
            ));
        }
        if let Some(event) = self.poll_files()? {
            return Ok(event);
        }
        if self.config.follow {
            // Nothing was appended: wait a little before the next look, so
            // a caller polling in a loop does not spin. Nothing is read
            // during the sleep, so dropping the future here loses nothing.
            tokio::time::sleep(self.config.follow_interval).await;
        }
        Ok(SourceEvent::Idle)
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        let file = self.file_mut(partition)?;
        file.reader.seek(offset)?;
        file.done = false;
        file.warned_tail = false;
        Ok(())
    }

    async fn pause(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        for &p in partitions {
            self.file_mut(p)?.paused = true;
        }
        Ok(())
    }

    async fn resume(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        for &p in partitions {
            self.file_mut(p)?.paused = false;
        }
        Ok(())
    }
}
