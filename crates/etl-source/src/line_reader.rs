//! Reading one file as lines: large chunked reads, records sliced out of
//! the read buffer, bad input turned into dead letters.

use std::io::ErrorKind;
use std::path::Path;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use etl_fs::{FileHandle, Fs};
use etl_record::{DeadLetter, Offset, PartitionId, Position, Record};

use crate::file_identity::{Tail, open_to_read, regular_file_metadata};
use crate::ndjson_check::{Verdict, check_line};
use crate::read_buf::{ChunkPool, ReadBuf};
use crate::{EofPolicy, FileSourceConfig, LineFormat, PollBatch, SourceError};

/// The UTF-8 byte order mark, which some editors write at the start of a
/// file.
const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// Bytes of an oversized line kept in its dead letter.
const PREVIEW_BYTES: usize = 1024;

/// One file, read as lines. Offsets are byte positions of line starts.
///
/// The file is open only while it is read: [`close`](LineReader::close)
/// gives back its descriptor and its read buffer, and the next
/// [`open`](LineReader::open) resumes at the same position after checking
/// that the path still names the same file. What only an open file needs
/// is boxed apart ([`OpenFile`]), so a closed file, of which a source may
/// hold a great many, keeps its position and identity and nothing else.
/// The file system is the source's, passed to each call that needs it
/// rather than held by every reader, and so is what the file is known by
/// ([`Known`]: its device, inode and tail), kept once in the record of
/// inputs' entry for the path and passed to each check.
#[derive(Debug)]
pub(crate) struct LineReader {
    /// Shared with the record of inputs' entry: one copy a file.
    path: Arc<Path>,
    /// The descriptor and read buffer, while open.
    open: Option<Box<OpenFile>>,
    partition: PartitionId,
    /// The first byte not turned into a record yet: where the read buffer
    /// starts, and where a reopened file is read from.
    buf_pos: u64,
    /// Discarding up to and including the next newline: after an
    /// oversized line, or to align a seek to a line start.
    skipping: bool,
    /// A last line that was emitted without its newline: it started at
    /// `.0` and ended at `.1`, and is cut there whenever it is read, so
    /// what was appended to it later is read as a line of its own.
    /// Boxed: rare, and a reader is kept for every input file.
    cut: Option<Box<(u64, u64)>>,
    /// Just past a cut: a newline here only ends the cut line (it was its
    /// missing terminator), so it is not read as an empty line.
    after_cut: bool,
}

/// What the file a reader's offsets belong to is known by: the record of
/// inputs' entry for its path holds it, and the source passes it to the
/// reader's checks rather than every reader keeping a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Known {
    /// Device and inode of the file.
    pub(crate) dev_ino: (u64, u64),
    /// The bytes before the furthest position the file was seen to reach:
    /// a file that no longer holds them was rewritten.
    pub(crate) tail: Tail,
}

/// What a reader holds while its file is open.
#[derive(Debug)]
struct OpenFile {
    file: Box<dyn FileHandle>,
    /// Bytes read but not yet turned into records; `buf[0]` is at file
    /// position `buf_pos`. Records are slices of the chunks it reads into.
    buf: ReadBuf,
    /// How far `buf` is known to hold no newline, so a long line is not
    /// rescanned after every read.
    scanned: usize,
    /// The last read found the end of the file.
    at_eof: bool,
    /// Records in the last batch read, to size the next one's vector.
    last_batch_records: usize,
}

/// Why the path no longer names the file being read, found at its end.
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) reason: String,
    /// The file read is still whole, under another name or none (rotated
    /// or removed): what was appended to it can still be read from its
    /// descriptor. Otherwise it was truncated or rewritten.
    pub(crate) moved_away: bool,
}

/// What one call to [`LineReader::read_batch`] found.
#[derive(Debug)]
pub(crate) struct ReadOutcome {
    pub(crate) batch: PollBatch,
    /// The file's current end was reached (nothing more to read now).
    pub(crate) at_eof: bool,
    /// An unterminated last line is waiting at the end of the file, from
    /// `.0` to `.1`.
    pub(crate) pending_tail: Option<(u64, u64)>,
}

impl LineReader {
    /// A reader of the file at `path`, positioned at its start. Nothing
    /// is opened yet.
    pub(crate) fn new(path: Arc<Path>, partition: PartitionId, cut: Option<(u64, u64)>) -> Self {
        LineReader {
            path,
            open: None,
            partition,
            buf_pos: 0,
            skipping: false,
            cut: cut.map(Box::new),
            after_cut: false,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Whether the last read reached the end of the file with nothing
    /// buffered: the reader is idle.
    pub(crate) fn is_idle(&self) -> bool {
        self.open
            .as_ref()
            .is_some_and(|o| o.at_eof && o.buf.is_empty())
    }

    /// Whether the last read found the end of the file.
    pub(crate) fn at_eof(&self) -> bool {
        self.open.as_ref().is_some_and(|o| o.at_eof)
    }

    pub(crate) fn set_cut(&mut self, cut: (u64, u64)) {
        self.cut = Some(Box::new(cut));
    }

    /// Open the file at the reader's position. `Ok(Some(reason))` when
    /// the path no longer names the file this reader's offsets belong to,
    /// `known` (then nothing is opened).
    pub(crate) fn open(
        &mut self,
        fs: &dyn Fs,
        known: Known,
        chunks: &Arc<ChunkPool>,
    ) -> Result<Option<String>, SourceError> {
        if self.open.is_some() {
            return Ok(None);
        }
        let meta = match regular_file_metadata(fs, &self.path) {
            Ok(meta) => meta,
            Err(SourceError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
                return Ok(Some("the file was removed".to_owned()));
            }
            Err(SourceError::NotAFile { kind, .. }) => {
                return Ok(Some(format!("the path now names {kind}")));
            }
            Err(e) => return Err(e),
        };
        if meta.dev_ino() != known.dev_ino {
            return Ok(Some("another file now has this name".to_owned()));
        }
        let mut file = open_to_read(fs, &self.path)?;
        let meta = file
            .metadata()
            .map_err(|e| SourceError::io(&*self.path, e))?;
        if meta.dev_ino() != known.dev_ino {
            return Ok(Some("another file now has this name".to_owned()));
        }
        if meta.len() < self.buf_pos {
            return Ok(Some(format!(
                "the file is {} bytes long, shorter than the position {} read up to",
                meta.len(),
                self.buf_pos
            )));
        }
        if let Some(reason) = known
            .tail
            .differs(&*file, meta.len())
            .map_err(|e| SourceError::io(&*self.path, e))?
        {
            return Ok(Some(reason));
        }
        file.seek_to(self.buf_pos)
            .map_err(|e| SourceError::io(&*self.path, e))?;
        self.open = Some(Box::new(OpenFile {
            file,
            buf: ReadBuf::new(Arc::clone(chunks)),
            scanned: 0,
            at_eof: false,
            last_batch_records: 0,
        }));
        Ok(None)
    }

    /// Take `file`, the file this reader's identity was taken of, as its
    /// open file, read from the reader's position (its start): what is in
    /// it stays readable whatever happens to its name.
    pub(crate) fn adopt(&mut self, mut file: Box<dyn FileHandle>, chunks: &Arc<ChunkPool>) {
        if file.seek_to(self.buf_pos).is_err() {
            // Opened again by path when it is read.
            return;
        }
        self.open = Some(Box::new(OpenFile {
            file,
            buf: ReadBuf::new(Arc::clone(chunks)),
            scanned: 0,
            at_eof: false,
            last_batch_records: 0,
        }));
    }

    /// Give back the file descriptor and the read buffer; the next
    /// [`open`](Self::open) resumes at the first byte not turned into a
    /// record yet.
    pub(crate) fn close(&mut self) {
        // Dropping the buffer gives its chunk back to the pool.
        self.open = None;
    }

    /// Why the path no longer names the file being read, or why that file
    /// cannot hold the position read so far (it was truncated or
    /// rewritten in place), if so; `known` is what the file read is known
    /// by.
    pub(crate) fn changed_on_disk(
        &self,
        fs: &dyn Fs,
        known: Known,
    ) -> Result<Option<Change>, SourceError> {
        let moved = |reason: &str| {
            Ok(Some(Change {
                reason: reason.to_owned(),
                moved_away: true,
            }))
        };
        let meta = match fs.metadata(&self.path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => return moved("the file was removed"),
            Err(e) => return Err(SourceError::io(&*self.path, e)),
        };
        if meta.dev_ino() != known.dev_ino {
            return moved("another file now has this name (rotated?)");
        }
        let rewritten = |reason: String| {
            Ok(Some(Change {
                reason,
                moved_away: false,
            }))
        };
        let read_to = self.read_to();
        if meta.len() < read_to {
            return rewritten(format!(
                "the file is {} bytes long, shorter than the {read_to} bytes read (truncated)",
                meta.len()
            ));
        }
        // The same inode at least as long: written over in place (`cat
        // new > file`) unless the bytes before the tail are still there.
        let differs = match &self.open {
            Some(o) => known.tail.differs(&*o.file, meta.len()),
            None => known
                .tail
                .differs(&*open_to_read(fs, &self.path)?, meta.len()),
        };
        match differs.map_err(|e| SourceError::io(&*self.path, e))? {
            Some(reason) => rewritten(reason),
            None => Ok(None),
        }
    }

    /// The position up to which the file was read (buffered bytes
    /// included).
    fn read_to(&self) -> u64 {
        self.buf_pos + self.open.as_ref().map_or(0, |o| o.buf.len() as u64)
    }

    /// Whether the open descriptor holds bytes not read yet (the file grew
    /// after the last read found its end).
    pub(crate) fn unread_on_descriptor(&self) -> Result<bool, SourceError> {
        let Some(o) = &self.open else {
            return Ok(false);
        };
        let len = o
            .file
            .metadata()
            .map_err(|e| SourceError::io(&*self.path, e))?
            .len();
        Ok(len > self.read_to())
    }

    /// The tail at the position read up to, if that is further than
    /// `known`'s, from the open descriptor: to be recorded.
    pub(crate) fn advance_tail(&self, known: Tail) -> Result<Option<Tail>, SourceError> {
        let read_to = self.read_to();
        let Some(o) = &self.open else {
            return Ok(None);
        };
        if read_to <= known.end {
            return Ok(None);
        }
        match Tail::of(&*o.file, read_to) {
            Ok(tail) => Ok(Some(tail)),
            // Truncated since it was read: the next check finds it so.
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(SourceError::io(&*self.path, e)),
        }
    }

    /// The file's length now.
    pub(crate) fn len(&self, fs: &dyn Fs) -> Result<u64, SourceError> {
        let meta = match &self.open {
            Some(o) => o.file.metadata(),
            None => fs.metadata(&self.path),
        };
        meta.map(|m| m.len())
            .map_err(|e| SourceError::io(&*self.path, e))
    }

    /// Position at the first line starting at or after `offset`: the byte
    /// before it is read and skipped through its newline, so an offset in
    /// the middle of a line (a committed "last offset + 1") lands on the
    /// next line start. An offset just after the start of a cut line
    /// lands on the cut, where the rest of that line begins.
    pub(crate) fn seek(&mut self, offset: Offset) -> Result<(), SourceError> {
        let (pos, skipping) = match self.cut.as_deref().copied() {
            _ if offset.0 <= 0 => (0, false),
            Some((start, end)) if offset.0 as u64 == start + 1 => (end, false),
            _ => (offset.0 as u64 - 1, true),
        };
        self.after_cut = self.cut.as_deref().is_some_and(|&(_, end)| end == pos);
        if let Some(o) = &mut self.open {
            o.file
                .seek_to(pos)
                .map_err(|e| SourceError::io(&*self.path, e))?;
            o.buf.clear();
            o.scanned = 0;
            o.at_eof = false;
        }
        self.buf_pos = pos;
        self.skipping = skipping;
        Ok(())
    }

    /// Read up to the configured batch size. An unterminated last line is
    /// left in place and reported in [`ReadOutcome::pending_tail`]; the
    /// caller decides what to do with it (and may [cut](Self::set_cut) it).
    pub(crate) fn read_batch(
        &mut self,
        config: &FileSourceConfig,
    ) -> Result<ReadOutcome, SourceError> {
        // Taken out while reading, so the buffer and the position can be
        // borrowed apart.
        let Some(mut open) = self.open.take() else {
            // Closed readers are opened by the source before reading.
            return Ok(ReadOutcome {
                batch: PollBatch::new(self.partition),
                at_eof: false,
                pending_tail: None,
            });
        };
        let outcome = self.read_open(&mut open, config);
        self.open = Some(open);
        outcome
    }

    fn read_open(
        &mut self,
        o: &mut OpenFile,
        config: &FileSourceConfig,
    ) -> Result<ReadOutcome, SourceError> {
        let mut batch = PollBatch::new(self.partition);
        // A batch is mostly as long as the one before: size the vector
        // once rather than growing it (and moving the records) step by
        // step, reusing one a sink gave back.
        batch.records =
            etl_record::reuse::records(o.last_batch_records.min(config.max_batch_records));
        let mut bytes = 0usize;
        o.at_eof = false;
        while batch.len() < config.max_batch_records && bytes < config.max_batch_bytes {
            if self.after_cut && !o.buf.is_empty() {
                self.after_cut = false;
                if o.buf.bytes()[0] == b'\n' {
                    self.consume(o, 1);
                    continue;
                }
            }
            let newline = memchr::memchr(b'\n', &o.buf.bytes()[o.scanned..]).map(|i| o.scanned + i);
            // Bytes to the cut, when a cut line starts here.
            let cut = self
                .cut
                .as_deref()
                .copied()
                .filter(|&(start, _)| !self.skipping && self.buf_pos == start)
                .map(|(start, end)| (end - start) as usize);
            match (newline, cut) {
                (Some(end), Some(n)) if end >= n => {
                    bytes += self.push_cut(o, &mut batch, n, config);
                }
                (None, Some(n)) if o.buf.len() >= n => {
                    bytes += self.push_cut(o, &mut batch, n, config);
                }
                (Some(end), _) if self.skipping => {
                    self.consume(o, end + 1);
                    self.skipping = false;
                }
                (Some(end), _) => {
                    let start = self.buf_pos;
                    let mut line = self.take(o, end + 1);
                    bytes += line.len();
                    // In place: a slice would cost a reference count.
                    line.truncate(end);
                    self.push_line(&mut batch, start, line, config);
                }
                (None, _) if self.skipping && !o.buf.is_empty() => {
                    let all = o.buf.len();
                    self.consume(o, all);
                }
                (None, _) if o.buf.len() > config.max_line_bytes => {
                    let start = self.buf_pos;
                    let len = o.buf.len();
                    // A copy, so the dead letter does not pin the whole buffer.
                    let preview = Bytes::copy_from_slice(&o.buf.bytes()[..PREVIEW_BYTES.min(len)]);
                    self.consume(o, len);
                    bytes += preview.len();
                    let reason = format!(
                        "line longer than the maximum of {} bytes (skipped to its newline)",
                        config.max_line_bytes
                    );
                    batch
                        .rejected
                        .push(self.dead_letter(start, preview, reason, config));
                    self.skipping = true;
                }
                (None, _) => {
                    o.scanned = o.buf.len();
                    if self.fill(o)? == 0 {
                        o.at_eof = true;
                        break;
                    }
                }
            }
        }
        let pending_tail = (o.at_eof && !self.skipping && !o.buf.is_empty())
            .then(|| (self.buf_pos, self.buf_pos + o.buf.len() as u64));
        if o.at_eof && o.buf.is_empty() {
            // Nothing to keep: give the read buffer back rather than hold
            // it for every idle file.
            o.buf.release();
            o.scanned = 0;
        }
        o.last_batch_records = batch.records.len();
        Ok(ReadOutcome {
            batch,
            at_eof: o.at_eof,
            pending_tail,
        })
    }

    /// Add the first `n` buffered bytes, a line cut at the end of the file
    /// where it once had no newline, to the batch. Returns its size.
    fn push_cut(
        &mut self,
        o: &mut OpenFile,
        batch: &mut PollBatch,
        n: usize,
        config: &FileSourceConfig,
    ) -> usize {
        let start = self.buf_pos;
        let line = self.take(o, n);
        self.after_cut = true;
        if config.eof == EofPolicy::DeadLetter {
            let preview = line.slice(..PREVIEW_BYTES.min(n));
            let reason = "truncated last line: no newline at the end of the file";
            batch
                .rejected
                .push(self.dead_letter(start, preview, reason.into(), config));
        } else {
            self.push_line(batch, start, line, config);
        }
        n
    }

    /// Check one line (without its newline) and add it to the batch as a
    /// record or a dead letter. A UTF-8 byte order mark at the start of
    /// the file is not part of the first line's value; the line's offset
    /// (0) still counts it, as every later offset does.
    fn push_line(
        &self,
        batch: &mut PollBatch,
        start: u64,
        mut line: Bytes,
        config: &FileSourceConfig,
    ) {
        if line.last() == Some(&b'\r') {
            line.truncate(line.len() - 1);
        }
        if start == 0 && line.starts_with(UTF8_BOM) {
            line.advance(UTF8_BOM.len());
        }
        match line_problem(&line, config) {
            None => batch
                .records
                .push(Record::new(self.position(start, config), line)),
            Some(reason) => {
                let value = line.slice(..PREVIEW_BYTES.min(line.len()));
                batch
                    .rejected
                    .push(self.dead_letter(start, value, reason, config));
            }
        }
    }

    fn dead_letter(
        &self,
        start: u64,
        value: Bytes,
        reason: String,
        config: &FileSourceConfig,
    ) -> DeadLetter {
        let reason = format!("{} at byte {start}: {reason}", self.path.display());
        DeadLetter::new(Record::new(self.position(start, config), value), reason)
    }

    /// Where the line starting at `start` is: the source is named by its
    /// configuration rather than by every reader (one per input file).
    fn position(&self, start: u64, config: &FileSourceConfig) -> Position {
        Position::new(config.name.clone(), self.partition, Offset(start as i64))
    }

    /// Split the first `n` buffered bytes off as a shared, frozen slice.
    fn take(&mut self, o: &mut OpenFile, n: usize) -> Bytes {
        self.buf_pos += n as u64;
        o.scanned = 0;
        o.buf.take(n)
    }

    fn consume(&mut self, o: &mut OpenFile, n: usize) {
        self.buf_pos += n as u64;
        o.scanned = 0;
        o.buf.advance(n);
    }

    /// One read appended to the buffer; 0 at the end of the file.
    fn fill(&self, o: &mut OpenFile) -> Result<usize, SourceError> {
        o.buf
            .fill(&mut o.file)
            .map_err(|e| SourceError::io(&*self.path, e))
    }
}

/// Why one line (without its newline) cannot be a record, if it cannot:
/// too long, not UTF-8, or in NDJSON not one JSON value.
fn line_problem(line: &[u8], config: &FileSourceConfig) -> Option<String> {
    if line.len() > config.max_line_bytes {
        return Some(format!(
            "line of {} bytes is longer than the maximum of {} bytes",
            line.len(),
            config.max_line_bytes
        ));
    }
    let quick = match config.format {
        LineFormat::Ndjson => check_line(line),
        LineFormat::Lines => Verdict::NotSure,
    };
    // A line of ASCII is UTF-8: the decoder runs only on the others.
    if quick != Verdict::AsciiValue
        && let Err(e) = simdutf8::compat::from_utf8(line)
    {
        return Some(format!(
            "invalid UTF-8 at byte {} of the line",
            e.valid_up_to()
        ));
    }
    if config.format == LineFormat::Lines || quick != Verdict::NotSure {
        return None;
    }
    // Not sure: serde_json decides, and words the reason.
    match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
        Ok(_) => None,
        Err(_) if line.iter().all(u8::is_ascii_whitespace) => {
            Some("empty line is not a JSON value".to_owned())
        }
        Err(e) => Some(format!("invalid JSON: {e}")),
    }
}
