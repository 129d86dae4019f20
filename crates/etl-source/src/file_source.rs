//! The file source: every input file is a partition of lines.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etl_fs::Fs;
use etl_record::{Offset, PartitionId};
use tokio::time::Instant;

use crate::file_config::resolve_inputs_as;
use crate::file_identity::{FileIdentity, Registry};
use crate::line_reader::{Known, LineReader};
use crate::read_buf::ChunkPool;
use crate::{EofPolicy, FileSourceConfig, ReplacedPolicy, Source, SourceError, SourceEvent};

/// Reads lines from files: one partition per file, offsets are the byte
/// positions of line starts.
///
/// * **Partitions.** Each input file is a partition. Its id is
///   [`file_partition_id`](crate::file_partition_id) of its canonical path
///   the first time the path is read, and stays the same across restarts
///   while the same file is found there. The source records each id with
///   the file's identity (device, inode, a checksum of its first KiB, and
///   one of the KiB before the furthest position it was seen to reach) in
///   the state folder ([`state_dir`](FileSourceConfig::state_dir)). A
///   failed write of that record fails the source for good with an I/O
///   error ([`SourceError::Checkpoint`]).
/// * **Replaced inputs.** A file whose identity changed since its id was
///   recorded (another inode under the name, other first bytes, other
///   bytes before the recorded position), or that is shorter than that
///   position or its committed offset, is never resumed at that
///   offset: by [`on_replaced`](FileSourceConfig::on_replaced) it is read
///   from its start under a new id (the old id is revoked) or the source
///   fails with [`SourceError::InputReplaced`]. An id is never handed out
///   twice, so a new file cannot inherit another file's offsets.
/// * **Reads.** Each file is read in chunks of
///   [`read_chunk_bytes`](FileSourceConfig::read_chunk_bytes); newlines are
///   found with `memchr` and record values are slices of the chunk they
///   were read into, not copies. A chunk goes back to a pool of the
///   source's (up to 8 MiB of spare chunks) when its last record is
///   dropped, and is read into again from there. A trailing `\r` is
///   removed. Reads are plain blocking
///   reads of local regular files (FIFOs, sockets and devices are
///   refused with [`SourceError::NotAFile`]), made without an `.await` in
///   between: the source never waits on anything but the disk, and
///   [`next`](Source::next) is cancel safe because it cannot be
///   interrupted half-way.
/// * **File system.** Every call (finding the inputs, reading them,
///   checking their identity, the record of inputs) goes through one
///   [`Fs`](etl_fs::Fs): the real file system with
///   [`open`](Self::open), any other (a simulated disk) with
///   [`open_in`](Self::open_in).
/// * **Open files.** At most
///   [`max_open_files`](FileSourceConfig::max_open_files) files are open
///   at once, and only an open file holds a read buffer. A file is closed
///   once read to its end (or, when a slot is needed, while paused or
///   idle in follow mode) and reopened at its position, after checking
///   that its path still names the same file.
/// * **Bad input** becomes dead letters in
///   [`PollBatch::rejected`](crate::PollBatch::rejected), never a panic:
///   invalid UTF-8, invalid JSON (in NDJSON mode), lines longer than
///   [`max_line_bytes`](FileSourceConfig::max_line_bytes) (skipped to
///   their newline without being buffered whole). An unterminated last
///   line follows [`EofPolicy`]; one that is emitted or dead-lettered is
///   recorded as cut there, so whatever is appended to it later is read
///   as a line of its own rather than skipped.
/// * **End.** Without [`follow`](FileSourceConfig::follow), the source
///   returns [`SourceEvent::End`] once every file is read to its end; with
///   it, it keeps polling for appended lines, and a file that was rotated
///   (renamed away, another file created under its name), truncated or
///   written over in place, once read to its end (a rotated file through
///   its open descriptor), continues as a new partition.
#[derive(Debug)]
pub struct FileSource {
    config: FileSourceConfig,
    /// The file system of the inputs and the state folder.
    fs: Arc<dyn Fs>,
    files: Vec<FileState>,
    /// Index in `files` of each partition.
    by_partition: BTreeMap<PartitionId, usize>,
    /// Indices of the files open now (at most `max_open_files`).
    open: Vec<usize>,
    registry: Registry,
    announced: bool,
    turn: usize,
    /// Events owed to the driver before any batch: revocations of
    /// replaced files' old partitions and assignments of their new ones.
    events: VecDeque<SourceEvent>,
    /// Partitions of files that were replaced: calls about them are
    /// no-ops, and none of their batches follows.
    retired: BTreeSet<PartitionId>,
    /// Read chunks given back by records already written, read into next.
    chunks: Arc<ChunkPool>,
    /// When the registry was last written: tails that moved are written
    /// at most every [`TAIL_SAVE_INTERVAL`].
    saved_at: Instant,
}

/// How often at most the registry is written only because files were
/// read further (their tails moved). A tail recorded late is only older:
/// the file is then checked against the bytes before an earlier position.
const TAIL_SAVE_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct FileState {
    partition: PartitionId,
    reader: LineReader,
    /// Read to the end, and not followed.
    done: bool,
    paused: bool,
    /// A new partition for a replaced file: nothing is read before the
    /// driver seeks it.
    awaiting_seek: bool,
    /// An unterminated last line was reported once already.
    warned_tail: bool,
}

impl FileSource {
    /// Resolve the inputs, and identify every file against the record in
    /// the state folder. Files are opened as they are read.
    ///
    /// # Errors
    ///
    /// [`SourceError::Config`] for an invalid configuration; for each
    /// input, [`SourceError::Io`] naming a path that is missing or
    /// unreadable, [`SourceError::NotAFile`] for a FIFO, socket, device or
    /// folder, [`SourceError::Pattern`] or [`SourceError::NoMatch`] for a
    /// bad or empty glob; [`SourceError::State`] for an unreadable record
    /// in the state folder; [`SourceError::InputReplaced`] for a replaced
    /// file under [`ReplacedPolicy::Fail`].
    pub fn open(config: FileSourceConfig) -> Result<Self, SourceError> {
        Self::open_in(etl_fs::real(), config)
    }

    /// Open the source as [`open`](Self::open) does, with every file-system
    /// call (resolving and expanding the inputs, reading them, checking
    /// their identity, loading and saving the record of inputs in the
    /// state folder) made through `fs` instead of the real file system.
    /// Glob patterns are matched against the names
    /// [`Fs::read_dir`](etl_fs::Fs::read_dir) lists. Calls are made inline,
    /// never on another thread, as with the real file system: over an
    /// in-memory `Fs` a run is deterministic.
    ///
    /// With a simulated file system (`etl_fs::SimFs`, behind etl-fs's
    /// `sim` feature), a test can crash the machine, fail an `fsync`, or
    /// rotate and rewrite inputs under the source:
    ///
    /// ```
    /// use std::path::Path;
    /// use std::sync::Arc;
    ///
    /// use etl_fs::{Fs, SimFs};
    /// use etl_source::{FileSource, FileSourceConfig, LineFormat, Source, SourceEvent};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let sim = SimFs::new(7);
    /// sim.create_dir_all(Path::new("/logs")).unwrap();
    /// sim.write(Path::new("/logs/a.log"), b"one\ntwo\n").unwrap();
    /// let mut source = FileSource::open_in(
    ///     Arc::new(sim.clone()),
    ///     FileSourceConfig {
    ///         paths: vec!["/logs/*.log".into()],
    ///         format: LineFormat::Lines,
    ///         state_dir: Some("/state".into()),
    ///         ..FileSourceConfig::default()
    ///     },
    /// )?;
    /// assert!(matches!(source.next().await?, SourceEvent::Assigned(_)));
    /// let SourceEvent::Batch(batch) = source.next().await? else { unreachable!() };
    /// assert_eq!(&batch.records[1].value[..], b"two");
    /// // The record of which file each partition reads is on the simulated disk.
    /// assert!(sim.exists(Path::new("/state/file-inputs")));
    /// # Ok::<(), etl_source::SourceError>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_in(fs: Arc<dyn Fs>, config: FileSourceConfig) -> Result<Self, SourceError> {
        config.validate()?;
        let mut registry = Registry::load(Arc::clone(&fs), config.state_dir.as_deref())?;
        if registry.is_fresh()
            && let Some(dir) = &config.state_dir
            && fs.read_dir(dir).is_ok_and(|entries| !entries.is_empty())
        {
            tracing::info!(
                state = %dir.display(),
                "no record of the input files yet: offsets stored by an earlier version are \
                 taken to belong to the files now at their paths (checked against their length)"
            );
        }
        // Each path as the one copy the file keeps (its record's, when it
        // has one), made as it is matched: with many files, a copy of every
        // path held beside it while the source opens is a peak of memory,
        // and the copies freed after it are holes in the heap of the
        // thread that opened the source, which other threads do not fill.
        let mut found = Vec::new();
        let mut tails = Vec::new();
        for path in resolve_inputs_as(&*fs, &config.paths, |path| registry.shared(&path))? {
            let (identity, tail) = FileIdentity::of_path(&*fs, &path)?;
            found.push((path, identity));
            tails.push(tail);
        }
        // Three passes, so an id follows its file: paths that still hold
        // their recorded file keep their id; a file found under another
        // path (renamed by a rotation) takes its id along; the rest get
        // new ids.
        // Per file, only what every file needs (its id, once known): the
        // cut is read back from the registry, and the few changed files
        // are kept apart, so the bookkeeping of a large open stays small.
        let mut ids: Vec<Option<PartitionId>> = vec![None; found.len()];
        let mut changed: BTreeMap<usize, (PartitionId, String)> = BTreeMap::new();
        for (i, (path, identity)) in found.iter().enumerate() {
            if let Some(entry) = registry.get(path).cloned() {
                match entry.differs(&*fs, identity, path)? {
                    None => {
                        registry.refresh(path, *identity);
                        registry.set_tail(path, tails[i]);
                        ids[i] = Some(entry.id);
                    }
                    Some(reason) => {
                        changed.insert(i, (entry.id, reason));
                    }
                }
            }
        }
        // Borrowed, not copied: with many files a copy of every path is a
        // peak of memory at open. Only made when a file has no id yet (a
        // rerun over the same files needs none).
        let kept: BTreeSet<&Path> = if ids.iter().any(Option::is_none) {
            found
                .iter()
                .zip(&ids)
                .filter(|(_, id)| id.is_some())
                .map(|((path, _), _)| &**path)
                .collect()
        } else {
            BTreeSet::new()
        };
        for (i, (path, identity)) in found.iter().enumerate() {
            if ids[i].is_none()
                && let Some(entry) = registry.take_moved(path, identity, &kept)?
            {
                tracing::info!(
                    path = %path.display(),
                    partition = entry.id.0,
                    "input file was renamed; it keeps its partition and offsets"
                );
                registry.set_tail(path, tails[i]);
                ids[i] = Some(entry.id);
                changed.remove(&i);
            }
        }
        drop(kept);
        // Files new to the record (every file, on a first run), at once.
        let new: Vec<usize> = (0..found.len())
            .filter(|&i| ids[i].is_none() && registry.get(&found[i].0).is_none())
            .collect();
        let assigned = registry.assign_all_new(
            new.iter()
                .map(|&i| (Arc::clone(&found[i].0), found[i].1, tails[i])),
        );
        for (i, id) in new.into_iter().zip(assigned) {
            ids[i] = Some(id);
            changed.remove(&i);
        }
        let chunks = ChunkPool::new(config.read_chunk_bytes);
        // Sized once: a vector grown by doubling holds up to twice the
        // states it needs, and both copies while it moves.
        let mut files = Vec::with_capacity(found.len());
        for (i, (path, identity)) in found.into_iter().enumerate() {
            let tail = tails[i];
            let (partition, cut) = match ids[i] {
                Some(known) => (
                    known,
                    registry.get(&path).and_then(|e| e.cut.as_deref().copied()),
                ),
                None => {
                    // A path whose file was renamed away (its entry moved
                    // with it) simply holds a new file.
                    if let Some((id, reason)) = changed.remove(&i)
                        && registry.get(&path).is_some()
                    {
                        if config.on_replaced == ReplacedPolicy::Fail {
                            return Err(SourceError::InputReplaced {
                                path: path.to_path_buf(),
                                partition: id,
                                reason,
                            });
                        }
                        let new = registry.assign_new(&path, identity, tail);
                        tracing::warn!(
                            path = %path.display(),
                            old_partition = id.0,
                            partition = new.0,
                            %reason,
                            "input file changed since its offsets were committed; reading it \
                             from its start as a new partition"
                        );
                        (new, None)
                    } else {
                        (registry.assign_new(&path, identity, tail), None)
                    }
                }
            };
            // PartitionOffsets, progress lines and dead-letter keys name the
            // partition; this says which file it is.
            tracing::info!(
                source = %config.name,
                partition = partition.0,
                path = %path.display(),
                "reading file"
            );
            files.push(FileState {
                partition,
                reader: LineReader::new(registry.shared(&path), partition, cut),
                done: false,
                paused: false,
                awaiting_seek: false,
                warned_tail: false,
            });
        }
        files.sort_by_key(|f| f.partition);
        let by_partition = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.partition, i))
            .collect();
        Ok(FileSource {
            config,
            fs,
            files,
            by_partition,
            open: Vec::new(),
            registry,
            announced: false,
            turn: 0,
            events: VecDeque::new(),
            retired: BTreeSet::new(),
            chunks,
            saved_at: Instant::now(),
        })
    }

    fn save_registry(&mut self) -> Result<(), SourceError> {
        self.registry.save()?;
        self.saved_at = Instant::now();
        Ok(())
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
        self.index_of(partition)
            .map(|i| self.files[i].reader.path())
    }

    /// How many input files are open now (at most
    /// [`max_open_files`](FileSourceConfig::max_open_files)).
    #[must_use]
    pub fn open_files(&self) -> usize {
        self.open.len()
    }

    fn index_of(&self, partition: PartitionId) -> Option<usize> {
        self.by_partition.get(&partition).copied()
    }

    /// The file of a partition; `None` for a retired partition.
    fn file_mut(&mut self, partition: PartitionId) -> Result<Option<&mut FileState>, SourceError> {
        match self.index_of(partition) {
            Some(i) => Ok(Some(&mut self.files[i])),
            None if self.retired.contains(&partition) => Ok(None),
            None => Err(SourceError::UnknownPartition { partition }),
        }
    }

    fn close(&mut self, index: usize) {
        let reader = &mut self.files[index].reader;
        if reader.is_open() {
            reader.close();
            self.open.retain(|&i| i != index);
        }
    }

    /// Close an open file that is not being read (paused, or idle at its
    /// end) to free a slot for `index`. Whether one was found.
    fn evict_one(&mut self, index: usize) -> bool {
        let victim = self.open.iter().copied().find(|&i| {
            let f = &self.files[i];
            i != index && (f.paused || f.awaiting_seek || f.reader.is_idle())
        });
        match victim {
            Some(v) => {
                self.close(v);
                true
            }
            None => false,
        }
    }

    /// The file at `index` is not the one its partition's offsets belong
    /// to: fail, or read it from its start as a new partition (after the
    /// old one is revoked). Returns whether it was replaced.
    fn replace(&mut self, index: usize, reason: String) -> Result<bool, SourceError> {
        let old = self.files[index].partition;
        let path = self.files[index].reader.path().to_path_buf();
        if self.config.on_replaced == ReplacedPolicy::Fail {
            return Err(SourceError::InputReplaced {
                path,
                partition: old,
                reason,
            });
        }
        self.close(index);
        let (identity, tail, handle) = match FileIdentity::open_path(&*self.fs, &path) {
            Ok(found) => found,
            Err(SourceError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                // Rotated away and not yet recreated: look again later; a
                // file that is not followed is over.
                let file = &mut self.files[index];
                if !self.config.follow && !file.done {
                    file.done = true;
                    tracing::warn!(
                        path = %path.display(),
                        partition = old.0,
                        "input file was removed before it was read to its end"
                    );
                }
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let new = self.registry.assign_new(&path, identity, tail);
        // On disk before any record of the new partition can be committed.
        self.save_registry()?;
        tracing::warn!(
            path = %path.display(),
            old_partition = old.0,
            partition = new.0,
            %reason,
            "input file changed; reading it from its start as a new partition"
        );
        self.by_partition.remove(&old);
        self.by_partition.insert(new, index);
        let file = &mut self.files[index];
        file.partition = new;
        file.reader = LineReader::new(self.registry.shared(&path), new, None);
        file.done = false;
        file.paused = false;
        file.awaiting_seek = true;
        file.warned_tail = false;
        // Kept open from now (its slot was just freed): renamed away again
        // before the driver seeks the new partition, the file is still
        // read through its descriptor.
        if self.open.len() < self.config.max_open_files {
            file.reader.adopt(handle, &self.chunks);
            if file.reader.is_open() {
                self.open.push(index);
            }
        }
        self.retired.insert(old);
        self.events.push_back(SourceEvent::Revoked(vec![old]));
        self.events.push_back(SourceEvent::Assigned(vec![new]));
        Ok(true)
    }

    /// One pass over the files, starting after the last one served.
    fn poll_files(&mut self) -> Result<Option<SourceEvent>, SourceError> {
        let n = self.files.len();
        // Whether a closed file can be opened in this pass.
        let mut can_open = true;
        for k in 0..n {
            let index = (self.turn + k) % n;
            let file = &self.files[index];
            if file.done || file.paused || file.awaiting_seek {
                continue;
            }
            if !file.reader.is_open() {
                if !can_open {
                    continue;
                }
                if self.open.len() >= self.config.max_open_files && !self.evict_one(index) {
                    can_open = false;
                    continue;
                }
                let known = self.known(index)?;
                if let Some(reason) =
                    self.files[index]
                        .reader
                        .open(&*self.fs, known, &self.chunks)?
                {
                    if self.replace(index, reason)? {
                        return Ok(self.events.pop_front());
                    }
                    continue;
                }
                self.open.push(index);
            }
            if let Some(batch) = self.read(index)? {
                self.turn = (index + 1) % n;
                return Ok(Some(batch));
            }
            if !self.events.is_empty() {
                return Ok(self.events.pop_front());
            }
        }
        if self.files.iter().all(|f| f.done) {
            return Ok(Some(SourceEvent::End));
        }
        Ok(None)
    }

    /// Read a batch of the open file at `index`, if it has one.
    fn read(&mut self, index: usize) -> Result<Option<SourceEvent>, SourceError> {
        let follow = self.config.follow;
        // The last read found the end: what follows it is only read on
        // once the file is known to be the one read so far.
        if follow && self.files[index].reader.at_eof() && self.check_at_end(index)? {
            return Ok(None);
        }
        let file = &mut self.files[index];
        let mut outcome = file.reader.read_batch(&self.config)?;
        if let Some(cut) = outcome.pending_tail
            && !follow
        {
            if self.config.eof == EofPolicy::Wait {
                if !file.warned_tail {
                    file.warned_tail = true;
                    tracing::warn!(
                        path = %file.reader.path().display(),
                        "last line has no newline; it is left unread until it is complete"
                    );
                }
            } else {
                // The line ends here for good, whatever is appended to it
                // later: recorded before it can be emitted and committed,
                // so a later run reads the rest as a line of its own.
                let path = file.reader.path().to_path_buf();
                self.registry.set_cut(&path, cut);
                self.save_registry()?;
                let file = &mut self.files[index];
                file.reader.set_cut(cut);
                if !outcome.batch.is_empty() {
                    return Ok(Some(SourceEvent::Batch(outcome.batch)));
                }
                outcome = file.reader.read_batch(&self.config)?;
            }
        }
        if !outcome.batch.is_empty() {
            return Ok(Some(SourceEvent::Batch(outcome.batch)));
        }
        if outcome.at_eof && !follow {
            self.record_tail(index)?;
            self.files[index].done = true;
            self.close(index);
        }
        Ok(None)
    }

    /// In follow mode, before reading on from the end of the file at
    /// `index`: whether its path still names it and it still holds what
    /// was read. A rotated or removed file is read to the end of its
    /// descriptor first (what was appended before the rotation is still
    /// there), then it continues as a new partition; so does one
    /// truncated or written over in place, at once. Whether it was
    /// replaced (its events are queued): then nothing is read now.
    fn check_at_end(&mut self, index: usize) -> Result<bool, SourceError> {
        let known = self.known(index)?;
        let reader = &self.files[index].reader;
        match reader.changed_on_disk(&*self.fs, known)? {
            Some(change) if change.moved_away && reader.unread_on_descriptor()? => Ok(false),
            Some(change) => self.replace(index, change.reason),
            None => {
                self.record_tail(index)?;
                Ok(false)
            }
        }
    }

    /// Note how far the file at `index` was seen to reach, for the next
    /// save of the registry.
    fn record_tail(&mut self, index: usize) -> Result<(), SourceError> {
        let known = self.known(index)?;
        let reader = &self.files[index].reader;
        if let Some(tail) = reader.advance_tail(known.tail)? {
            self.registry.set_tail(reader.path(), tail);
        }
        Ok(())
    }

    /// What the file at `index` is known by, from its path's entry in the
    /// record of inputs (the one copy of it: its reader keeps none).
    fn known(&self, index: usize) -> Result<Known, SourceError> {
        let file = &self.files[index];
        let path = file.reader.path();
        self.registry
            .known(path)
            .ok_or_else(|| SourceError::Contract {
                partition: file.partition,
                reason: format!(
                    "the record of the input files holds no identity for {}",
                    path.display()
                ),
            })
    }
}

#[async_trait]
impl Source for FileSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        // A registry that could not be written stays lost: nothing more
        // is read, whatever the caller does after the error.
        if let Some(lost) = self.registry.lost() {
            return Err(lost);
        }
        if self.registry.is_dirty() && self.saved_at.elapsed() >= TAIL_SAVE_INTERVAL {
            self.save_registry()?;
        }
        if !self.announced {
            // The record of which file each id stands for is on disk
            // before anything of them is read.
            self.save_registry()?;
            self.announced = true;
            return Ok(SourceEvent::Assigned(
                self.files.iter().map(|f| f.partition).collect(),
            ));
        }
        if let Some(event) = self.events.pop_front() {
            return Ok(event);
        }
        if let Some(event) = self.poll_files()? {
            if matches!(event, SourceEvent::End) {
                // How far each file was read, for the next run's check.
                self.save_registry()?;
            }
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
        let fs = Arc::clone(&self.fs);
        let Some(file) = self.file_mut(partition)? else {
            return Ok(());
        };
        // A committed offset is at most the length of the file it was
        // committed in: beyond this file's end, it belongs to another one.
        let len = file.reader.len(&*fs)?;
        if offset.0 > 0 && offset.0 as u64 > len {
            let reason =
                format!("the file is {len} bytes long, shorter than its committed offset {offset}");
            let index = self.index_of(partition).unwrap_or_default();
            self.replace(index, reason)?;
            return Ok(());
        }
        file.reader.seek(offset)?;
        file.done = false;
        file.awaiting_seek = false;
        file.warned_tail = false;
        Ok(())
    }

    async fn pause(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        for &p in partitions {
            if let Some(file) = self.file_mut(p)? {
                file.paused = true;
            }
        }
        Ok(())
    }

    async fn resume(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        for &p in partitions {
            if let Some(file) = self.file_mut(p)? {
                file.paused = false;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
