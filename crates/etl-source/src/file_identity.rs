//! Which file a partition reads: identities (device, inode, fingerprint of
//! the first bytes, checksum of the bytes before the last position seen)
//! and the registry that gives each identity of a path its own partition
//! id.
//!
//! A committed offset is a byte position in one particular file. When the
//! file at a path is replaced (a new inode) or rewritten (the same inode
//! with other bytes), the offset means nothing for the new content, so the
//! new content gets a new partition id: it has no committed offset and is
//! read from its start. Ids are allocated, not hashed, so two files never
//! share one however many there are: the first candidate is
//! [`file_partition_id`] of the path (what every version before the
//! registry used, so old offsets stay readable), then hashes of the path
//! with a counter, skipping every id the registry has ever handed out.
//!
//! A rewrite in place can keep the first bytes (an export regenerated
//! with the same first lines), so each entry also holds a [`Tail`]: a
//! checksum of the KiB before a position the source has seen the file
//! reach, which appending to the file never changes. It is taken at the
//! file's length when a run starts and moved forward as the file is read;
//! a file that no longer holds those bytes was rewritten.
//!
//! The registry lives in the state folder as `file-inputs`, written like
//! the offset store (temporary file, fsync, rename, fsync of the folder;
//! a folder it creates is fsynced into its parent) through the source's
//! [`Fs`], and checksummed. It is written before any record of a new id is
//! emitted, so an id can only have a committed offset once its identity is
//! on disk. Without a state folder it is kept in memory for the run. Every
//! write goes through one function, and the first error of any write or
//! fsync makes the registry lost: Linux drops the pages of a failed
//! write-back, so a later fsync that succeeds proves nothing, and every
//! later write (and so the source) fails.
//!
//! ```text
//! etl-file-inputs 2
//! file 3735928559 2049 1311 1024 8a3f01c2 - - 52311 5c1e09aa /data/in.ndjson
//! file 17 2049 1377 210 0b1c2d3e 6300 6342 - - /data/tail.ndjson
//! retired 3021
//! crc32 0a1b2c3d
//! ```
//!
//! A `file` line holds the id, device, inode, fingerprint length and
//! checksum, the cut of a last line emitted without its newline (start and
//! end, or `-`), the tail (its end and checksum, or `-`), and the path
//! (with `\` and newlines escaped) to the end of the line. Version 1 files
//! (written before tails existed) have no tail fields and are read as
//! entries without a tail: such a file is checked by its inode and first
//! bytes only, and gets its tail on the first run that reads it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{self, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use etl_checkpoint::CheckpointError;
use etl_fs::{FileHandle, FileKind, Fs, Metadata, OpenOptions};
use etl_record::PartitionId;

use crate::SourceError;
use crate::file_config::file_partition_id;
pub(crate) use crate::file_tail::Tail;
use crate::file_tail::read_at_most;
use crate::line_reader::Known;
use crate::packed::extend_packed;

/// Bytes of a file's start covered by its fingerprint.
pub(crate) const FINGERPRINT_BYTES: u64 = 1024;

const MAGIC: &str = "etl-file-inputs 2";
/// The format before tails: the same lines without the two tail fields.
const MAGIC_V1: &str = "etl-file-inputs 1";
const NAME: &str = "file-inputs";
const TEMP: &str = "file-inputs.tmp";

/// What makes a file the same file: where it lives on disk and how it
/// starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileIdentity {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// How many leading bytes the checksum covers: the file's length when
    /// it was taken, up to [`FINGERPRINT_BYTES`].
    pub(crate) fp_len: u64,
    pub(crate) fp_crc: u32,
}

/// Refuse anything but a regular file: opening a FIFO blocks until a
/// writer appears, and neither a FIFO nor a device can be read again from
/// a committed offset.
pub(crate) fn regular_file_metadata(fs: &dyn Fs, path: &Path) -> Result<Metadata, SourceError> {
    let meta = fs.metadata(path).map_err(|e| SourceError::io(path, e))?;
    let kind = match meta.kind {
        FileKind::File => return Ok(meta),
        FileKind::Dir => "a directory",
        FileKind::Fifo => "a FIFO (named pipe)",
        FileKind::Socket => "a socket",
        FileKind::Device => "a device",
        FileKind::Symlink | FileKind::Other => "not a regular file",
    };
    Err(SourceError::NotAFile {
        path: path.to_owned(),
        kind,
    })
}

/// Open the file at `path` to read.
pub(crate) fn open_to_read(fs: &dyn Fs, path: &Path) -> Result<Box<dyn FileHandle>, SourceError> {
    fs.open(path, &OpenOptions::reading())
        .map_err(|e| SourceError::io(path, e))
}

impl FileIdentity {
    /// Take the identity of the regular file at `path`, and its tail at
    /// its length now.
    pub(crate) fn of_path(fs: &dyn Fs, path: &Path) -> Result<(Self, Tail), SourceError> {
        Self::open_path(fs, path).map(|(identity, tail, _)| (identity, tail))
    }

    /// [`of_path`](Self::of_path), and the file it was taken of, open to
    /// read at its start.
    pub(crate) fn open_path(
        fs: &dyn Fs,
        path: &Path,
    ) -> Result<(Self, Tail, Box<dyn FileHandle>), SourceError> {
        regular_file_metadata(fs, path)?;
        let file = open_to_read(fs, path)?;
        // The metadata of what was opened, not of what the path named a
        // moment before.
        let meta = file.metadata().map_err(|e| SourceError::io(path, e))?;
        let (dev, ino) = meta.dev_ino();
        let tail = Tail::of(&*file, meta.len()).map_err(|e| SourceError::io(path, e))?;
        let (fp_len, fp_crc) =
            checksum_prefix(&*file, FINGERPRINT_BYTES).map_err(|e| SourceError::io(path, e))?;
        Ok((
            FileIdentity {
                dev,
                ino,
                fp_len,
                fp_crc,
            },
            tail,
            file,
        ))
    }

    /// Why `now` is not the file `self` was taken from, if it is not.
    /// A file that grew since is the same file; `now` is taken over as
    /// many bytes as `self` covers, or more.
    pub(crate) fn differs(
        &self,
        fs: &dyn Fs,
        now: &FileIdentity,
        path: &Path,
    ) -> Result<Option<String>, SourceError> {
        if (self.dev, self.ino) != (now.dev, now.ino) {
            return Ok(Some(format!(
                "another file now has this name (inode {} on device {}, was inode {} on device {})",
                now.ino, now.dev, self.ino, self.dev
            )));
        }
        if now.fp_len < self.fp_len {
            return Ok(Some(format!(
                "the file is shorter ({} bytes) than when it was first read",
                now.fp_len
            )));
        }
        let crc = if now.fp_len == self.fp_len {
            now.fp_crc
        } else {
            let file = open_to_read(fs, path)?;
            let (len, crc) =
                checksum_prefix(&*file, self.fp_len).map_err(|e| SourceError::io(path, e))?;
            if len < self.fp_len {
                return Ok(Some("the file was truncated".to_owned()));
            }
            crc
        };
        if crc != self.fp_crc {
            return Ok(Some(format!(
                "its first {} bytes changed (the file was rewritten)",
                self.fp_len
            )));
        }
        Ok(None)
    }
}

/// Length and CRC-32 of the first `limit` bytes (fewer if the file is
/// shorter).
fn checksum_prefix(file: &dyn FileHandle, limit: u64) -> io::Result<(u64, u32)> {
    let mut buf = vec![0; usize::try_from(limit).unwrap_or(usize::MAX)];
    let n = read_at_most(file, &mut buf, 0)?;
    Ok((n as u64, crc32fast::hash(&buf[..n])))
}

/// One path's entry: its partition id and the identity the id stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) id: PartitionId,
    pub(crate) identity: FileIdentity,
    /// A last line emitted (or dead-lettered) without its newline: it
    /// started at `.0` and ended at `.1`. Read again, that line is cut at
    /// the same place, and what was appended to it is a line of its own.
    /// Boxed: rare, and an entry is kept for every input file.
    pub(crate) cut: Option<Box<(u64, u64)>>,
    /// The end of the furthest tail recorded, [`NO_TAIL`] in an entry of
    /// a version 1 registry until it is taken. The tail's two fields are
    /// kept apart, not as an `Option<Tail>`, which costs 8 bytes more an
    /// entry (an entry is kept for every input file).
    tail_end: u64,
    tail_crc: u32,
}

/// [`Entry::tail_end`] of an entry without a tail. No file reaches it:
/// offsets are `i64`.
const NO_TAIL: u64 = u64::MAX;

impl Entry {
    /// An entry of `id` for `identity`, with its cut and tail if any.
    pub(crate) fn new(
        id: PartitionId,
        identity: FileIdentity,
        cut: Option<Box<(u64, u64)>>,
        tail: Option<Tail>,
    ) -> Self {
        Entry {
            id,
            identity,
            cut,
            tail_end: tail.map_or(NO_TAIL, |t| t.end),
            tail_crc: tail.map_or(0, |t| t.crc),
        }
    }

    /// The furthest tail recorded; `None` in an entry of a version 1
    /// registry until it is taken.
    pub(crate) fn tail(&self) -> Option<Tail> {
        (self.tail_end != NO_TAIL).then_some(Tail {
            end: self.tail_end,
            crc: self.tail_crc,
        })
    }

    fn set_tail(&mut self, tail: Tail) {
        self.tail_end = tail.end;
        self.tail_crc = tail.crc;
    }

    /// Why the file at `path` (identity `now`) is not the one this entry
    /// stands for, if it is not: another inode, other first bytes, or
    /// other bytes before the recorded tail.
    pub(crate) fn differs(
        &self,
        fs: &dyn Fs,
        now: &FileIdentity,
        path: &Path,
    ) -> Result<Option<String>, SourceError> {
        if let Some(reason) = self.identity.differs(fs, now, path)? {
            return Ok(Some(reason));
        }
        let Some(tail) = self.tail() else {
            return Ok(None);
        };
        let file = open_to_read(fs, path)?;
        let len = file.metadata().map_err(|e| SourceError::io(path, e))?.len();
        tail.differs(&*file, len)
            .map_err(|e| SourceError::io(path, e))
    }
}

/// Why the registry is lost: the first write or fsync that failed.
#[derive(Debug)]
struct Lost {
    path: PathBuf,
    op: &'static str,
    kind: ErrorKind,
    message: String,
}

impl Lost {
    /// The error every write after the failed one returns.
    fn error(&self) -> SourceError {
        SourceError::Checkpoint(CheckpointError::Io {
            path: self.path.clone(),
            op: self.op,
            source: io::Error::new(
                self.kind,
                format!(
                    "{}; the record of the input files is lost since, and nothing more is \
                     read until a restart",
                    self.message
                ),
            ),
        })
    }
}

/// Partition ids by path, each with its identity; ids handed out before
/// and given up (see the module docs).
#[derive(Debug)]
pub(crate) struct Registry {
    /// The file system of the state folder and of the inputs.
    fs: Arc<dyn Fs>,
    /// Where it is kept, if anywhere.
    dir: Option<PathBuf>,
    /// Keyed by a path shared with the file's reader: one copy a file.
    entries: BTreeMap<Arc<Path>, Entry>,
    retired: BTreeSet<u32>,
    /// Ids in use, entries and retired together.
    used: BTreeSet<u32>,
    /// There was no registry file: the state may come from a version that
    /// kept no identities.
    fresh: bool,
    dirty: bool,
    /// A write or fsync failed: nothing is written again (see the module
    /// docs).
    lost: Option<Lost>,
}

/// The file each partition id stands for, from the registry in the state
/// folder `dir` (for tools that show offsets). Empty when there is no
/// registry (no file source has run there, or one of a version that kept
/// none); ids given up because their file was replaced are not listed.
///
/// # Errors
///
/// The registry cannot be read, or is corrupt ([`SourceError::State`]).
pub fn registered_inputs(dir: &Path) -> Result<BTreeMap<PartitionId, PathBuf>, SourceError> {
    registered_inputs_in(&etl_fs::RealFs, dir)
}

/// [`registered_inputs`] of a state folder on the file system `fs`.
///
/// # Errors
///
/// As [`registered_inputs`].
pub fn registered_inputs_in(
    fs: &dyn Fs,
    dir: &Path,
) -> Result<BTreeMap<PartitionId, PathBuf>, SourceError> {
    let (entries, _) = read_registry(fs, dir)?.unwrap_or_default();
    Ok(entries
        .iter()
        .map(|(path, entry)| (entry.id, path.to_path_buf()))
        .collect())
}

/// The entries and retired ids of the registry in `dir`; `None` when there
/// is no registry file.
fn read_registry(fs: &dyn Fs, dir: &Path) -> Result<Option<Parsed>, SourceError> {
    let path = dir.join(NAME);
    let bytes = match fs.read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SourceError::io(path, e)),
    };
    parse(&bytes)
        .map(Some)
        .map_err(|detail| SourceError::State { path, detail })
}

impl Registry {
    /// Load the registry of `dir` on `fs`, or start an empty one (in
    /// memory only when `dir` is `None`).
    pub(crate) fn load(fs: Arc<dyn Fs>, dir: Option<&Path>) -> Result<Self, SourceError> {
        let found = match dir {
            Some(dir) => read_registry(&*fs, dir)?,
            None => None,
        };
        let fresh = found.is_none();
        let (entries, retired) = found.unwrap_or_default();
        let used = entries
            .values()
            .map(|e| e.id.0)
            .chain(retired.iter().copied())
            .collect();
        Ok(Registry {
            fs,
            dir: dir.map(Path::to_owned),
            entries,
            retired,
            used,
            fresh,
            dirty: false,
            lost: None,
        })
    }

    /// Whether no registry file existed (old state, or none).
    pub(crate) fn is_fresh(&self) -> bool {
        self.fresh
    }

    pub(crate) fn get(&self, path: &Path) -> Option<&Entry> {
        self.entries.get(path)
    }

    /// What the file recorded at `path` is known by (device, inode and
    /// tail), for the checks of its reader: `None` when the registry holds
    /// no entry for `path`, or one without a tail (a version 1 entry not
    /// yet taken; the source takes every input's at open).
    pub(crate) fn known(&self, path: &Path) -> Option<Known> {
        let entry = self.entries.get(path)?;
        Some(Known {
            dev_ino: (entry.identity.dev, entry.identity.ino),
            tail: entry.tail()?,
        })
    }

    /// `path` as the registry holds it, shared (a new copy when it holds
    /// none): a file's reader keeps this one rather than a copy of its
    /// own.
    pub(crate) fn shared(&self, path: &Path) -> Arc<Path> {
        self.entries
            .get_key_value(path)
            .map_or_else(|| Arc::from(path), |(k, _)| Arc::clone(k))
    }

    /// Register `path` with a new id for `identity`, retiring the id it
    /// had. The first id of a path is [`file_partition_id`] when free.
    pub(crate) fn assign_new(
        &mut self,
        path: &Path,
        identity: FileIdentity,
        tail: Tail,
    ) -> PartitionId {
        if let Some(old) = self.entries.get(path) {
            self.retired.insert(old.id.0);
        }
        let id = self.allocate(path);
        self.used.insert(id.0);
        let shared = self.shared(path);
        self.entries
            .insert(shared, Entry::new(id, identity, None, Some(tail)));
        self.dirty = true;
        id
    }

    /// Register files new to the record (paths it does not hold) in path
    /// order, each with a new id as [`assign_new`](Self::assign_new) gives
    /// one; their ids, in the same order. The entries join in sorted runs
    /// through `append`, which builds packed nodes: inserted one by one in
    /// order (a first run registers every input, in path order), a
    /// B-tree's nodes stay about half full, some 90 bytes a file more.
    pub(crate) fn assign_all_new(
        &mut self,
        files: impl IntoIterator<Item = (Arc<Path>, FileIdentity, Tail)>,
    ) -> Vec<PartitionId> {
        /// New entries merged at a time: the run is the only copy.
        const RUN: usize = 4096;
        let mut ids = Vec::new();
        let mut run = BTreeMap::new();
        for (path, identity, tail) in files {
            if let Some(old) = self.entries.get(&*path) {
                self.retired.insert(old.id.0);
            }
            let id = self.allocate(&path);
            self.used.insert(id.0);
            let entry = Entry::new(id, identity, None, Some(tail));
            // The caller's copy of the path, shared: not another one.
            run.insert(path, entry);
            ids.push(id);
            if run.len() == RUN {
                self.entries.append(&mut run);
            }
        }
        self.entries.append(&mut run);
        self.dirty |= !ids.is_empty();
        ids
    }

    /// The entry of a file that was renamed to `path`: recorded under
    /// another path that is not in `kept` (paths still holding their
    /// recorded file), with the same device and inode, and the same first
    /// bytes. It moves to `path`, keeping its id; the entry `path` had is
    /// retired.
    pub(crate) fn take_moved(
        &mut self,
        path: &Path,
        identity: &FileIdentity,
        kept: &BTreeSet<&Path>,
    ) -> Result<Option<Entry>, SourceError> {
        let mut candidate = None;
        for (other, entry) in &self.entries {
            if **other != *path
                && !kept.contains(&**other)
                && (entry.identity.dev, entry.identity.ino) == (identity.dev, identity.ino)
                && entry.differs(&*self.fs, identity, path)?.is_none()
            {
                candidate = Some(other.clone());
                break;
            }
        }
        let Some(other) = candidate else {
            return Ok(None);
        };
        let Some(mut entry) = self.entries.remove(&other) else {
            return Ok(None);
        };
        if let Some(old) = self.entries.remove(path) {
            self.retired.insert(old.id.0);
        }
        if entry.identity.fp_len < identity.fp_len {
            entry.identity = *identity;
        }
        self.entries.insert(Arc::from(path), entry.clone());
        self.dirty = true;
        Ok(Some(entry))
    }

    /// Record a longer fingerprint of the same file.
    pub(crate) fn refresh(&mut self, path: &Path, identity: FileIdentity) {
        if let Some(entry) = self.entries.get_mut(path)
            && entry.identity.fp_len < identity.fp_len
        {
            entry.identity = identity;
            self.dirty = true;
        }
    }

    /// Record a tail of `path` further on than the one recorded (the file
    /// was seen to reach `tail.end`). It is written with the next save.
    pub(crate) fn set_tail(&mut self, path: &Path, tail: Tail) {
        if let Some(entry) = self.entries.get_mut(path)
            && entry.tail().is_none_or(|t| t.end < tail.end)
        {
            entry.set_tail(tail);
            self.dirty = true;
        }
    }

    /// Whether something changed since the last save.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether a write failed: the registry is lost, and
    /// [`save`](Self::save) fails from now on.
    pub(crate) fn lost(&self) -> Option<SourceError> {
        self.lost.as_ref().map(Lost::error)
    }

    /// Record that the last line of `path` was emitted unterminated.
    pub(crate) fn set_cut(&mut self, path: &Path, cut: (u64, u64)) {
        if let Some(entry) = self.entries.get_mut(path)
            && entry.cut.as_deref() != Some(&cut)
        {
            entry.cut = Some(Box::new(cut));
            self.dirty = true;
        }
    }

    fn allocate(&self, path: &Path) -> PartitionId {
        let first = file_partition_id(path);
        if !self.used.contains(&first.0) {
            return first;
        }
        let mut salted = path.as_os_str().as_encoded_bytes().to_vec();
        salted.push(0);
        let base = salted.len();
        for n in 1u64.. {
            salted.truncate(base);
            salted.extend_from_slice(n.to_string().as_bytes());
            let id = fnv1a(&salted);
            if !self.used.contains(&id) {
                return PartitionId(id);
            }
        }
        unreachable!("fewer than 2^32 ids are in use")
    }

    /// Write the registry if it changed (see the module docs). Once a
    /// write failed, fails every time.
    pub(crate) fn save(&mut self) -> Result<(), SourceError> {
        if let Some(lost) = &self.lost {
            return Err(lost.error());
        }
        if !self.dirty {
            return Ok(());
        }
        if let Some(dir) = self.dir.clone()
            && let Err((path, op, e)) = self.write_durably(&dir)
        {
            let lost = Lost {
                path: path.clone(),
                op,
                kind: e.kind(),
                message: e.to_string(),
            };
            tracing::error!(
                path = %path.display(),
                op,
                error = %e,
                "the record of the input files could not be written; it is lost, and the \
                 source stops"
            );
            self.lost = Some(lost);
            return Err(SourceError::Checkpoint(CheckpointError::Io {
                path,
                op,
                source: e,
            }));
        }
        self.fresh = false;
        self.dirty = false;
        Ok(())
    }

    /// The one place the registry reaches the disk: temporary file,
    /// fsync, rename, fsync of the folder. An error names the file and
    /// the step; the caller makes the registry lost.
    fn write_durably(&self, dir: &Path) -> Result<(), (PathBuf, &'static str, io::Error)> {
        let fs = &*self.fs;
        fs.create_dir_all(dir)
            .map_err(|e| (dir.to_owned(), "create the folder", e))?;
        if self.fresh {
            // The first record in this folder: whoever created the folder
            // and those above it (the offset store, the runtime, this
            // save) may not have made their names durable, and a crash
            // that loses them loses the record while the output keeps
            // what was read under the ids it gave.
            let canonical = fs
                .canonicalize(dir)
                .map_err(|e| (dir.to_owned(), "resolve the folder", e))?;
            etl_fs::sync_folders_above(fs, &canonical)
                .map_err(|e| (e.dir, "fsync the folder", e.source))?;
        }
        let temp = dir.join(TEMP);
        let target = dir.join(NAME);
        let mut file = fs
            .open(
                &temp,
                &OpenOptions::new().write(true).create(true).truncate(true),
            )
            .map_err(|e| (temp.clone(), "create", e))?;
        // Streamed through a buffer rather than rendered whole: with many
        // input files the text is ~100 bytes a file, a peak of memory the
        // source would otherwise take at every save.
        let mut out = io::BufWriter::with_capacity(64 * 1024, &mut file);
        render(&mut out, &self.entries, &self.retired)
            .and_then(|()| out.flush())
            .map_err(|e| (temp.clone(), "write", e))?;
        drop(out);
        file.sync_all().map_err(|e| (temp.clone(), "fsync", e))?;
        drop(file);
        fs.rename(&temp, &target)
            .map_err(|e| (target.clone(), "rename", e))?;
        fs.sync_dir(dir)
            .map_err(|e| (dir.to_owned(), "fsync the folder", e))
    }
}

fn fnv1a(bytes: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for &byte in bytes {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

fn escape(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(text: &str) -> Result<PathBuf, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            other => return Err(format!("bad escape \\{other:?} in a path")),
        }
    }
    Ok(PathBuf::from(out))
}

/// Write the registry's text to `out`, sealed as
/// [`etl_checkpoint::seal`] seals it (a `crc32` line over the body).
fn render(
    out: &mut impl Write,
    entries: &BTreeMap<Arc<Path>, Entry>,
    retired: &BTreeSet<u32>,
) -> io::Result<()> {
    let mut crc = crc32fast::Hasher::new();
    let mut line = String::with_capacity(256);
    let mut emit = |line: &str| {
        crc.update(line.as_bytes());
        out.write_all(line.as_bytes())
    };
    emit(&format!("{MAGIC}\n"))?;
    for (path, e) in entries {
        let i = &e.identity;
        line.clear();
        let _ = write!(
            line,
            "file {} {} {} {} {:08x} ",
            e.id.0, i.dev, i.ino, i.fp_len, i.fp_crc
        );
        let _ = match e.cut.as_deref().copied() {
            Some((s, end)) => write!(line, "{s} {end} "),
            None => write!(line, "- - "),
        };
        let _ = match e.tail() {
            Some(t) => write!(line, "{} {:08x} ", t.end, t.crc),
            None => write!(line, "- - "),
        };
        line.push_str(&escape(path));
        line.push('\n');
        emit(&line)?;
    }
    for id in retired {
        emit(&format!("retired {id}\n"))?;
    }
    let sum = crc.finalize();
    out.write_all(format!("crc32 {sum:08x}\n").as_bytes())
}

type Parsed = (BTreeMap<Arc<Path>, Entry>, BTreeSet<u32>);

/// Entries parsed before they join the map.
const RUN: usize = 4096;

fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let body = etl_checkpoint::unseal(bytes).map_err(|e| e.to_string())?;
    let mut lines = body.lines();
    let with_tails = match lines.next() {
        Some(MAGIC) => true,
        Some(MAGIC_V1) => false,
        _ => return Err(format!("not a file-input registry (expected {MAGIC:?})")),
    };
    let mut entries = BTreeMap::new();
    let mut retired = BTreeSet::new();
    // Written in path order, so read back in order: gathered in runs
    // and appended, which keeps the map's nodes full (see `packed`).
    let mut run = Vec::new();
    for line in lines {
        if let Some(id) = line.strip_prefix("retired ") {
            retired.insert(id.parse().map_err(|_| format!("bad id {id:?}"))?);
            continue;
        }
        let rest = line
            .strip_prefix("file ")
            .ok_or_else(|| format!("malformed line {line:?}"))?;
        let mut fields = rest.splitn(if with_tails { 10 } else { 8 }, ' ');
        let mut next = |what: &str| {
            fields
                .next()
                .ok_or_else(|| format!("missing {what} in {line:?}"))
        };
        let num = |s: &str| s.parse::<u64>().map_err(|_| format!("bad number {s:?}"));
        let id = next("id")?.parse().map_err(|_| "bad id".to_owned())?;
        let dev = num(next("device")?)?;
        let ino = num(next("inode")?)?;
        let fp_len = num(next("fingerprint length")?)?;
        let fp_crc = u32::from_str_radix(next("fingerprint")?, 16)
            .map_err(|_| "bad fingerprint".to_owned())?;
        let (cs, ce) = (next("cut start")?, next("cut end")?);
        let cut = match (cs, ce) {
            ("-", "-") => None,
            (s, e) => Some(Box::new((num(s)?, num(e)?))),
        };
        let tail = if with_tails {
            match (next("tail end")?, next("tail")?) {
                ("-", "-") => None,
                (end, crc) => Some(Tail {
                    end: num(end)?,
                    crc: u32::from_str_radix(crc, 16).map_err(|_| "bad tail".to_owned())?,
                }),
            }
        } else {
            None
        };
        let path = unescape(next("path")?)?;
        run.push((
            Arc::<Path>::from(path),
            Entry::new(
                PartitionId(id),
                FileIdentity {
                    dev,
                    ino,
                    fp_len,
                    fp_crc,
                },
                cut,
                tail,
            ),
        ));
        if run.len() == RUN {
            extend_packed(&mut entries, run.drain(..));
        }
    }
    extend_packed(&mut entries, run);
    Ok((entries, retired))
}

#[cfg(test)]
mod tests;
