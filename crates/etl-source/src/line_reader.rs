//! Reading one file as lines: large chunked reads, records sliced out of
//! the read buffer, bad input turned into dead letters.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::{Buf, Bytes, BytesMut};
use etl_record::{DeadLetter, Offset, PartitionId, Position, Record, SourceId};

use crate::{EofPolicy, FileSourceConfig, LineFormat, PollBatch, SourceError};

/// Bytes of an oversized line kept in its dead letter.
const PREVIEW_BYTES: usize = 1024;

/// One file, read as lines. Offsets are byte positions of line starts.
#[derive(Debug)]
pub(crate) struct LineReader {
    path: PathBuf,
    file: File,
    source: SourceId,
    partition: PartitionId,
    /// Bytes read but not yet turned into records; `buf[0]` is at file
    /// position `buf_pos`. Records are slices of frozen prefixes of it.
    buf: BytesMut,
    buf_pos: u64,
    /// How far `buf` is known to hold no newline, so a long line is not
    /// rescanned after every read.
    scanned: usize,
    /// Discarding up to and including the next newline: after an
    /// oversized line, or to align a seek to a line start.
    skipping: bool,
    /// The last read found the end of the file.
    at_eof: bool,
    /// Records in the last batch read, to size the next one's vector.
    last_batch_records: usize,
}

/// What one call to [`LineReader::read_batch`] found.
#[derive(Debug)]
pub(crate) struct ReadOutcome {
    pub(crate) batch: PollBatch,
    /// The file's current end was reached (nothing more to read now).
    pub(crate) at_eof: bool,
    /// An unterminated last line is waiting at the end of the file.
    pub(crate) pending_tail: bool,
}

impl LineReader {
    pub(crate) fn open(
        path: &Path,
        source: SourceId,
        partition: PartitionId,
    ) -> Result<Self, SourceError> {
        let file = File::open(path).map_err(|e| SourceError::io(path, e))?;
        let meta = file.metadata().map_err(|e| SourceError::io(path, e))?;
        if meta.is_dir() {
            let e = std::io::Error::new(ErrorKind::InvalidInput, "is a directory, not a file");
            return Err(SourceError::io(path, e));
        }
        Ok(LineReader {
            path: path.to_path_buf(),
            file,
            source,
            partition,
            buf: BytesMut::new(),
            buf_pos: 0,
            scanned: 0,
            skipping: false,
            at_eof: false,
            last_batch_records: 0,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Position at the first line starting at or after `offset`: the byte
    /// before it is read and skipped through its newline, so an offset in
    /// the middle of a line (a committed "last offset + 1") lands on the
    /// next line start.
    pub(crate) fn seek(&mut self, offset: Offset) -> Result<(), SourceError> {
        let (pos, skipping) = if offset.0 <= 0 {
            (0, false)
        } else {
            (offset.0 as u64 - 1, true)
        };
        self.file
            .seek(SeekFrom::Start(pos))
            .map_err(|e| SourceError::io(&self.path, e))?;
        self.buf.clear();
        self.buf_pos = pos;
        self.scanned = 0;
        self.skipping = skipping;
        self.at_eof = false;
        Ok(())
    }

    /// Read up to the configured batch size. `final_eof` says the end of
    /// the file is final (not followed), so the end-of-file policy applies
    /// to an unterminated last line.
    pub(crate) fn read_batch(
        &mut self,
        config: &FileSourceConfig,
        final_eof: bool,
    ) -> Result<ReadOutcome, SourceError> {
        let mut batch = PollBatch::new(self.partition);
        // A batch is mostly as long as the one before: size the vector
        // once rather than growing it (and moving the records) step by step.
        batch
            .records
            .reserve(self.last_batch_records.min(config.max_batch_records));
        let mut bytes = 0usize;
        self.at_eof = false;
        while batch.len() < config.max_batch_records && bytes < config.max_batch_bytes {
            let newline =
                memchr::memchr(b'\n', &self.buf[self.scanned..]).map(|i| self.scanned + i);
            match newline {
                Some(end) if self.skipping => {
                    self.consume(end + 1);
                    self.skipping = false;
                }
                Some(end) => {
                    let start = self.buf_pos;
                    let line = self.take(end + 1);
                    bytes += line.len();
                    self.push_line(&mut batch, start, line.slice(..end), config);
                }
                None if self.skipping && !self.buf.is_empty() => {
                    let all = self.buf.len();
                    self.consume(all);
                }
                None if self.buf.len() > config.max_line_bytes => {
                    let start = self.buf_pos;
                    let len = self.buf.len();
                    // A copy, so the dead letter does not pin the whole buffer.
                    let preview = Bytes::copy_from_slice(&self.buf[..PREVIEW_BYTES.min(len)]);
                    self.consume(len);
                    bytes += preview.len();
                    let reason = format!(
                        "line longer than the maximum of {} bytes (skipped to its newline)",
                        config.max_line_bytes
                    );
                    batch
                        .rejected
                        .push(self.dead_letter(start, preview, reason));
                    self.skipping = true;
                }
                None => {
                    self.scanned = self.buf.len();
                    if self.fill(config.read_chunk_bytes)? == 0 {
                        self.at_eof = true;
                        break;
                    }
                }
            }
        }
        let mut pending_tail = self.at_eof && !self.skipping && !self.buf.is_empty();
        if pending_tail && final_eof && config.eof != EofPolicy::Wait {
            let start = self.buf_pos;
            let len = self.buf.len();
            let line = self.take(len);
            match config.eof {
                EofPolicy::Emit => self.push_line(&mut batch, start, line, config),
                _ => {
                    let preview = line.slice(..PREVIEW_BYTES.min(len));
                    let reason = "truncated last line: no newline at the end of the file";
                    batch
                        .rejected
                        .push(self.dead_letter(start, preview, reason.into()));
                }
            }
            pending_tail = false;
        }
        self.last_batch_records = batch.records.len();
        Ok(ReadOutcome {
            batch,
            at_eof: self.at_eof,
            pending_tail,
        })
    }

    /// Check one line (without its newline) and add it to the batch as a
    /// record or a dead letter.
    fn push_line(&self, batch: &mut PollBatch, start: u64, line: Bytes, config: &FileSourceConfig) {
        let line = match line.last() {
            Some(b'\r') => line.slice(..line.len() - 1),
            _ => line,
        };
        let problem = if line.len() > config.max_line_bytes {
            Some(format!(
                "line of {} bytes is longer than the maximum of {} bytes",
                line.len(),
                config.max_line_bytes
            ))
        } else if let Err(e) = std::str::from_utf8(&line) {
            Some(format!(
                "invalid UTF-8 at byte {} of the line",
                e.valid_up_to()
            ))
        } else if config.format == LineFormat::Ndjson {
            match serde_json::from_slice::<serde::de::IgnoredAny>(&line) {
                Ok(_) => None,
                Err(_) if line.iter().all(u8::is_ascii_whitespace) => {
                    Some("empty line is not a JSON value".to_owned())
                }
                Err(e) => Some(format!("invalid JSON: {e}")),
            }
        } else {
            None
        };
        match problem {
            None => batch.records.push(Record::new(self.position(start), line)),
            Some(reason) => {
                let value = line.slice(..PREVIEW_BYTES.min(line.len()));
                batch.rejected.push(self.dead_letter(start, value, reason));
            }
        }
    }

    fn dead_letter(&self, start: u64, value: Bytes, reason: String) -> DeadLetter {
        let reason = format!("{} at byte {start}: {reason}", self.path.display());
        DeadLetter::new(Record::new(self.position(start), value), reason)
    }

    fn position(&self, start: u64) -> Position {
        Position::new(self.source.clone(), self.partition, Offset(start as i64))
    }

    /// Split the first `n` buffered bytes off as a shared, frozen slice.
    fn take(&mut self, n: usize) -> Bytes {
        self.buf_pos += n as u64;
        self.scanned = 0;
        self.buf.split_to(n).freeze()
    }

    fn consume(&mut self, n: usize) {
        self.buf_pos += n as u64;
        self.scanned = 0;
        self.buf.advance(n);
    }

    /// One read of up to `chunk` bytes appended to the buffer; 0 at the end
    /// of the file.
    fn fill(&mut self, chunk: usize) -> Result<usize, SourceError> {
        let len = self.buf.len();
        self.buf.resize(len + chunk, 0);
        loop {
            match self.file.read(&mut self.buf[len..]) {
                Ok(n) => {
                    self.buf.truncate(len + n);
                    return Ok(n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.buf.truncate(len);
                    return Err(SourceError::io(&self.path, e));
                }
            }
        }
    }
}
