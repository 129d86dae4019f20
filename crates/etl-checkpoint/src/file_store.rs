//! The crash-safe file store.
//!
//! Two slot files, `offsets.0` and `offsets.1`, hold alternate
//! generations: a commit writes generation `g` to slot `g % 2` through a
//! temporary file (write, fsync, rename, fsync the folder), so the other
//! slot still holds generation `g - 1`. A file is text:
//!
//! ```text
//! etl-offsets 1
//! generation 42
//! 0 1337
//! 3 -1
//! crc32 0a1b2c3d
//! ```
//!
//! The checksum covers every byte before its line. Loading takes the newest
//! valid generation; an invalid newer file (torn, corrupted) is skipped with
//! a warning. Files that exist but none valid is an error naming the
//! folder: the store never silently restarts from zero.
//!
//! Any failed write, rename or fsync makes the store lost for good
//! ([`Disk`]): the commit fails with [`CheckpointError::Io`], and so does
//! every later commit and load of this store, without touching the disk.
//! A failed fsync is never retried and later trusted: Linux marks the
//! pages it could not write clean, and a second fsync reports success
//! though the data never reached the disk (PostgreSQL stops on any fsync
//! failure for the same reason). The files keep the last durable commit,
//! which a restart reads.
//!
//! One store at a time owns a folder: opening takes an exclusive advisory
//! lock on `lock` in it (see [`OwnerLock`]) and holds it until the store is
//! dropped, so a second pipeline on the same folder, in this process or
//! another, is refused with [`CheckpointError::Lock`] instead of
//! committing over the first one's offsets.
//!
//! Opening makes the folder's name durable up to the root (see
//! [`etl_fs::sync_folders_above`]), whoever created it: a commit in a
//! folder that a crash can take with it would not be durable.
//!
//! Every file operation goes through an [`etl_fs::Fs`]: the real file
//! system with [`FileStore::open`], any other (a simulated one that loses
//! what was not synced in a crash) with [`FileStore::open_in`].

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use etl_fs::{Fs, OpenOptions};
use etl_record::{Offset, OwnerLock, PartitionId};

use crate::CheckpointError;
use crate::store::{OffsetStore, PartitionOffsets};

const MAGIC: &str = "etl-offsets 1";
const SLOTS: [&str; 2] = ["offsets.0", "offsets.1"];
const TEMP: &str = "offsets.tmp";
const LOCK: &str = "lock";

/// Offsets in a local folder, crash-safe (see the module docs).
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
    generation: u64,
    offsets: PartitionOffsets,
    /// Held for the store's life: this store is the folder's only writer.
    lock: OwnerLock,
    /// Every write and sync goes through it.
    disk: Disk,
    /// The file system the folder is on.
    fs: Arc<dyn Fs>,
}

/// The one way the store writes and syncs: a step that fails makes the
/// store lost, and a lost store runs no step again.
#[derive(Debug, Default)]
struct Disk {
    /// The first failure: the file or folder, the step, and the error.
    lost: Option<(PathBuf, &'static str, io::ErrorKind, String)>,
    /// The step that fails next with EIO, instead of running: the private
    /// seam through which tests inject a failed write or fsync.
    #[cfg(test)]
    fail: Option<&'static str>,
}

impl Disk {
    /// Run `step` (`op` on `path`), unless the store is lost; a failure
    /// makes it lost.
    fn run<T>(
        &mut self,
        path: &Path,
        op: &'static str,
        step: impl FnOnce() -> io::Result<T>,
    ) -> Result<T, CheckpointError> {
        self.check()?;
        #[cfg(test)]
        let step = {
            let inject = self.fail.take_if(|f| *f == op).is_some();
            move || {
                if inject {
                    Err(io::Error::from_raw_os_error(5))
                } else {
                    step()
                }
            }
        };
        step().map_err(|source| {
            self.lost = Some((path.to_owned(), op, source.kind(), source.to_string()));
            CheckpointError::Io {
                path: path.to_owned(),
                op,
                source,
            }
        })
    }

    /// `Err` once a step failed: what failed first, and why nothing is
    /// written any more.
    fn check(&self) -> Result<(), CheckpointError> {
        match &self.lost {
            None => Ok(()),
            Some((path, op, kind, reason)) => Err(CheckpointError::Io {
                path: path.clone(),
                op: "commit",
                source: io::Error::new(
                    *kind,
                    format!(
                        "the store is lost since an earlier {op} failed ({reason}); a failed \
                         write or fsync is never retried (the kernel may have dropped the data \
                         and report the next fsync as a success), so nothing is committed \
                         until a restart resumes from the last durable commit"
                    ),
                ),
            }),
        }
    }
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io {
        path: path.to_owned(),
        op,
        source,
    }
}

impl FileStore {
    /// Open (creating the folder if needed), lock and load the store in
    /// `dir`.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Lock`] when another store (another pipeline, in
    /// this process or another) holds the folder; the folder cannot be
    /// created or read, or files exist and none is a valid generation.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        Self::open_in(etl_fs::real(), dir)
    }

    /// Open the store in `dir` on the file system `fs`, as
    /// [`open`](Self::open) does on the real one.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open).
    pub fn open_in(fs: Arc<dyn Fs>, dir: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let mut store = Self::lock(fs, dir.as_ref())?;
        store.reload()?;
        Ok(store)
    }

    /// Open the store in `dir` like [`open`](Self::open), but when every
    /// stored generation is unreadable, start from no offsets instead of
    /// failing with [`CheckpointError::Corrupt`]. For an explicit reset
    /// only: the next commit writes a new generation (holding only what
    /// it commits), and the unreadable files stay for inspection until
    /// commits overwrite them.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), except [`CheckpointError::Corrupt`].
    pub fn open_discarding_corrupt(dir: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let mut store = Self::lock(etl_fs::real(), dir.as_ref())?;
        match store.reload() {
            Ok(()) | Err(CheckpointError::Corrupt { .. }) => Ok(store),
            Err(e) => Err(e),
        }
    }

    /// Create the folder if needed and take its lock; nothing loaded yet.
    /// The folder's name is made durable up to the root, whoever created
    /// it: commits in a folder a crash can take with it are not durable.
    fn lock(fs: Arc<dyn Fs>, dir: &Path) -> Result<Self, CheckpointError> {
        fs.create_dir_all(dir).map_err(io(dir, "create folder"))?;
        let lock = OwnerLock::acquire_in(&*fs, dir.join(LOCK))?;
        let canonical = fs.canonicalize(dir).map_err(io(dir, "resolve"))?;
        etl_fs::sync_folders_above(&*fs, &canonical).map_err(|e| CheckpointError::Io {
            path: e.dir,
            op: "fsync folder",
            source: e.source,
        })?;
        Ok(FileStore {
            dir: dir.to_owned(),
            generation: 0,
            offsets: PartitionOffsets::new(),
            lock,
            disk: Disk::default(),
            fs,
        })
    }

    /// The store's folder.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The lock file this store holds.
    #[must_use]
    pub fn lock_path(&self) -> &Path {
        self.lock.path()
    }

    /// The generation last loaded or committed (0: nothing committed yet).
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The offsets last committed in `dir`, read without taking the
    /// folder's lock: for inspecting a store a running pipeline owns. A
    /// missing folder reads as empty.
    ///
    /// # Errors
    ///
    /// The folder cannot be read, or files exist and none is a valid
    /// generation.
    pub fn peek(dir: impl AsRef<Path>) -> Result<PartitionOffsets, CheckpointError> {
        Ok(read_newest(&etl_fs::RealFs, dir.as_ref())?
            .map(|(_, o)| o)
            .unwrap_or_default())
    }

    fn reload(&mut self) -> Result<(), CheckpointError> {
        // A lost store's files may hold what was never made durable.
        self.disk.check()?;
        if let Some((generation, offsets)) = read_newest(&*self.fs, &self.dir)? {
            self.generation = generation;
            self.offsets = offsets;
        }
        Ok(())
    }

    /// Write `self.offsets` as generation `generation`.
    fn write(&mut self, generation: u64) -> Result<(), CheckpointError> {
        let temp = self.dir.join(TEMP);
        let target = self.dir.join(SLOTS[(generation % 2) as usize]);
        let disk = &mut self.disk;
        let fs = &*self.fs;
        let offsets = &self.offsets;
        let mut file = disk.run(&temp, "create", || {
            fs.open(
                &temp,
                &OpenOptions::new().write(true).create(true).truncate(true),
            )
        })?;
        // Streamed through a buffer rather than rendered whole: a store
        // of many partitions (a file source's, one per input file) would
        // hold a second copy of every offset as text at each commit.
        disk.run(&temp, "write", || {
            let mut out = io::BufWriter::with_capacity(64 * 1024, &mut file);
            render_to(&mut out, generation, offsets)?;
            out.flush()
        })?;
        disk.run(&temp, "fsync", || file.sync_all())?;
        drop(file);
        disk.run(&target, "rename", || fs.rename(&temp, &target))?;
        // The rename is durable only once the folder is synced.
        disk.run(&self.dir, "fsync folder", || fs.sync_dir(&self.dir))?;
        Ok(())
    }
}

impl OffsetStore for FileStore {
    fn load(&mut self) -> Result<PartitionOffsets, CheckpointError> {
        self.reload()?;
        Ok(self.offsets.clone())
    }

    fn load_with(
        &mut self,
        read: &mut dyn FnMut(&PartitionOffsets),
    ) -> Result<(), CheckpointError> {
        self.reload()?;
        read(&self.offsets);
        Ok(())
    }

    fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), CheckpointError> {
        // Merged in place, not into a copy of every partition's offset: a
        // failed write makes the store lost, and a lost store is never
        // read or written again, so offsets it failed to write are never
        // taken for committed.
        self.disk.check()?;
        self.offsets.extend(offsets.iter().map(|(p, o)| (*p, *o)));
        let generation = self.generation + 1;
        self.write(generation)?;
        self.generation = generation;
        Ok(())
    }
}

/// The newest valid generation in `dir`, if any file exists.
fn read_newest(
    fs: &dyn Fs,
    dir: &Path,
) -> Result<Option<(u64, PartitionOffsets)>, CheckpointError> {
    let mut best: Option<(u64, PartitionOffsets)> = None;
    let mut problems = Vec::new();
    let mut present = 0;
    // Each file's checksum and generation first; then the offsets of the
    // newest valid one only: a map of every offset is built once, not
    // once per file (a file source has a partition per input file).
    let mut sealed = Vec::with_capacity(SLOTS.len());
    for slot in SLOTS {
        let path = dir.join(slot);
        let bytes = match fs.read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&path, "read")(e)),
        };
        present += 1;
        match generation_of(&bytes) {
            Ok(generation) => sealed.push((generation, path, bytes)),
            Err(why) => problems.push(format!("{}: {why}", path.display())),
        }
    }
    sealed.sort_by_key(|(generation, _, _)| std::cmp::Reverse(*generation));
    for (_, path, bytes) in sealed {
        match parse(&bytes) {
            Ok(found) => {
                best = Some(found);
                break;
            }
            Err(why) => problems.push(format!("{}: {why}", path.display())),
        }
    }
    match best {
        Some(best) => {
            for p in &problems {
                tracing::warn!(store = %dir.display(), problem = %p, "ignoring an invalid offset store file; using the newest valid generation");
            }
            Ok(Some(best))
        }
        None if present == 0 => Ok(None),
        None => Err(CheckpointError::Corrupt {
            path: dir.to_owned(),
            detail: problems.join("; "),
        }),
    }
}

/// Write generation `generation` of `offsets` to `out`, sealed as
/// [`crate::seal`] seals a body (a `crc32` line over it).
fn render_to(out: &mut impl Write, generation: u64, offsets: &PartitionOffsets) -> io::Result<()> {
    let mut crc = crc32fast::Hasher::new();
    let mut line = format!("{MAGIC}\ngeneration {generation}\n");
    crc.update(line.as_bytes());
    out.write_all(line.as_bytes())?;
    for (p, o) in offsets {
        line.clear();
        let _ = writeln!(line, "{} {}", p.0, o.0);
        crc.update(line.as_bytes());
        out.write_all(line.as_bytes())?;
    }
    let sum = crc.finalize();
    writeln!(out, "crc32 {sum:08x}")
}

/// [`render_to`] into a string.
#[cfg(test)]
fn render(generation: u64, offsets: &PartitionOffsets) -> String {
    let mut bytes = Vec::new();
    let _ = render_to(&mut bytes, generation, offsets);
    String::from_utf8(bytes).unwrap_or_default()
}

fn parse(bytes: &[u8]) -> Result<(u64, PartitionOffsets), String> {
    let (generation, lines) = header(bytes)?;
    // Collected, not inserted one by one: the lines are in partition
    // order, and a B-tree filled by inserts in order keeps its nodes about
    // half full, where one collected is built packed.
    let offsets = lines
        .map(|line| {
            let (p, o) = line.split_once(' ').ok_or("malformed line")?;
            let p = p.parse().map_err(|_| format!("bad partition {p:?}"))?;
            let o = o.parse().map_err(|_| format!("bad offset {o:?}"))?;
            Ok((PartitionId(p), Offset(o)))
        })
        .collect::<Result<PartitionOffsets, String>>()?;
    Ok((generation, offsets))
}

/// The generation of a sealed store file whose checksum holds, without
/// reading its offsets.
fn generation_of(bytes: &[u8]) -> Result<u64, String> {
    header(bytes).map(|(generation, _)| generation)
}

/// The generation of a sealed store file, and its lines after the header.
fn header(bytes: &[u8]) -> Result<(u64, std::str::Lines<'_>), String> {
    let body = crate::sealed::unseal(bytes).map_err(|e| e.to_string())?;
    let mut lines = body.lines();
    if lines.next() != Some(MAGIC) {
        return Err(format!("not an offset store file (expected {MAGIC:?})"));
    }
    let generation = lines
        .next()
        .and_then(|l| l.strip_prefix("generation "))
        .and_then(|g| g.parse().ok())
        .ok_or("missing generation")?;
    Ok((generation, lines))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn offsets(pairs: &[(u32, i64)]) -> PartitionOffsets {
        pairs
            .iter()
            .map(|(p, o)| (PartitionId(*p), Offset(*o)))
            .collect()
    }

    #[test]
    fn commits_merge_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = FileStore::open(dir.path()).unwrap();
        assert!(s.load().unwrap().is_empty());
        s.commit(&offsets(&[(0, 10), (1, 5)])).unwrap();
        s.commit(&offsets(&[(1, 7)])).unwrap();
        drop(s);
        let mut again = FileStore::open(dir.path()).unwrap();
        assert_eq!(again.load().unwrap(), offsets(&[(0, 10), (1, 7)]));
        assert_eq!(again.generation(), 2);
    }

    #[test]
    fn a_torn_newest_falls_back_to_the_previous_generation() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = FileStore::open(dir.path()).unwrap();
        s.commit(&offsets(&[(0, 1)])).unwrap();
        s.commit(&offsets(&[(0, 2)])).unwrap();
        drop(s);
        // Generation 2 lives in slot 0: tear it.
        let newest = dir.path().join("offsets.0");
        let text = fs::read(&newest).unwrap();
        fs::write(&newest, &text[..text.len() / 2]).unwrap();
        let mut s = FileStore::open(dir.path()).unwrap();
        assert_eq!(s.load().unwrap(), offsets(&[(0, 1)]));
        // The next commit overwrites the torn slot, not the good one.
        s.commit(&offsets(&[(0, 3)])).unwrap();
        drop(s);
        assert_eq!(
            FileStore::open(dir.path()).unwrap().load().unwrap(),
            offsets(&[(0, 3)])
        );
    }

    #[test]
    fn a_newest_file_sealed_whole_whose_lines_do_not_read_falls_back_to_the_previous() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = FileStore::open(dir.path()).unwrap();
        s.commit(&offsets(&[(0, 1)])).unwrap();
        drop(s);
        // Generation 1 lives in slot 1; slot 0 gets a newer generation
        // whose checksum holds but whose offsets do not read.
        let mut bad = format!("{MAGIC}\ngeneration 9\nnot a line\n");
        crate::seal(&mut bad);
        fs::write(dir.path().join("offsets.0"), &bad).unwrap();
        let mut s = FileStore::open(dir.path()).unwrap();
        assert_eq!(s.load().unwrap(), offsets(&[(0, 1)]));
        assert_eq!(s.generation(), 1);
        // The next commit overwrites the unreadable slot, not the good one.
        s.commit(&offsets(&[(0, 3)])).unwrap();
        drop(s);
        assert_eq!(
            FileStore::open(dir.path()).unwrap().load().unwrap(),
            offsets(&[(0, 3)])
        );
        // Both slots sealed whole and unreadable: an error naming both.
        fs::write(dir.path().join("offsets.0"), &bad).unwrap();
        fs::write(dir.path().join("offsets.1"), &bad).unwrap();
        let err = FileStore::open(dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{text}");
        assert!(
            text.contains("offsets.0") && text.contains("offsets.1"),
            "{text}"
        );
    }

    #[test]
    fn no_valid_generation_is_an_error_naming_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("offsets.1"), b"garbage\x00\xff").unwrap();
        let err = FileStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }));
        let text = err.to_string();
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(text.contains("offsets.1"), "{text}");
    }

    #[test]
    fn a_second_store_on_the_same_folder_is_refused_while_the_first_lives() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = FileStore::open(dir.path()).unwrap();
        let err = FileStore::open(dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, CheckpointError::Lock(e) if e.is_in_use()),
            "{text}"
        );
        assert!(text.contains(&dir.path().display().to_string()), "{text}");
        assert!(text.contains(&std::process::id().to_string()), "{text}");
        first.commit(&offsets(&[(0, 1)])).unwrap();
        // Inspecting needs no ownership.
        assert_eq!(FileStore::peek(dir.path()).unwrap(), offsets(&[(0, 1)]));
        drop(first);
        let mut second = FileStore::open(dir.path()).unwrap();
        assert_eq!(second.load().unwrap(), offsets(&[(0, 1)]));
    }

    #[test]
    fn flipped_bits_are_caught_by_the_checksum() {
        let body = render(3, &offsets(&[(0, 100)]));
        assert_eq!(parse(body.as_bytes()).unwrap(), (3, offsets(&[(0, 100)])));
        let flipped = body.replace("0 100", "0 900");
        assert_eq!(parse(flipped.as_bytes()).unwrap_err(), "checksum mismatch");
    }

    /// Every step a commit takes, each failed once in its own store.
    const STEPS: [&str; 5] = ["create", "write", "fsync", "rename", "fsync folder"];

    #[test]
    fn a_failed_write_or_fsync_makes_the_store_lost_and_every_later_commit_fail() {
        for step in STEPS {
            let dir = tempfile::tempdir().unwrap();
            let mut s = FileStore::open(dir.path()).unwrap();
            s.commit(&offsets(&[(0, 1)])).unwrap();
            s.disk.fail = Some(step);
            let err = s.commit(&offsets(&[(0, 2)])).unwrap_err();
            assert!(
                matches!(&err, CheckpointError::Io { op, .. } if *op == step),
                "{step}: {err}"
            );
            // Retrying would succeed on this disk: a lost store does not
            // retry, and what it reports says why.
            for _ in 0..2 {
                let later = s.commit(&offsets(&[(0, 3)])).unwrap_err();
                let text = later.to_string();
                assert!(
                    matches!(later, CheckpointError::Io { .. }),
                    "{step}: {text}"
                );
                assert!(
                    text.contains("lost") && text.contains(step),
                    "{step}: {text}"
                );
                assert!(s.load().is_err(), "{step}: a lost store is not read either");
            }
            assert_eq!(s.generation(), 1, "{step}");
            drop(s);
            // A restart reads the last durable commit (or, when only the
            // folder's fsync failed, the one whose data was synced).
            let mut again = FileStore::open(dir.path()).unwrap();
            let expected = if step == "fsync folder" { 2 } else { 1 };
            assert_eq!(again.load().unwrap(), offsets(&[(0, expected)]), "{step}");
            again.commit(&offsets(&[(0, 4)])).unwrap();
        }
    }

    #[test]
    fn a_second_store_reaching_the_folder_by_another_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("store");
        let mut first = FileStore::open(&folder).unwrap();
        std::os::unix::fs::symlink(&folder, dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("parent-link")).unwrap();
        fs::create_dir(dir.path().join("a")).unwrap();
        for other in [
            dir.path().join("link"),
            dir.path().join("a/../store"),
            dir.path().join("./store/"),
            dir.path().join("parent-link/store"),
            dir.path().join("parent-link/a/../link"),
        ] {
            let err = FileStore::open(&other).unwrap_err();
            assert!(
                matches!(&err, CheckpointError::Lock(e) if e.is_in_use()),
                "{}: {err}",
                other.display()
            );
        }
        first.commit(&offsets(&[(0, 1)])).unwrap();
        drop(first);
        let mut by_link = FileStore::open(dir.path().join("link")).unwrap();
        assert_eq!(by_link.load().unwrap(), offsets(&[(0, 1)]));
        assert!(FileStore::open(&folder).is_err(), "and the other way round");
    }

    #[test]
    fn a_store_folder_created_on_open_survives_a_crash_with_its_commits() {
        // The folder and the one above it are new: a commit is durable
        // only once their names are, up to a folder that already was.
        use etl_fs::SimFs;
        for dir in ["/state/offsets", "/var/lib/etl/offsets"] {
            let sim = SimFs::new(11);
            let dir = Path::new(dir);
            let mut s = FileStore::open_in(Arc::new(sim.process()), dir).unwrap();
            s.commit(&offsets(&[(0, 7)])).unwrap();
            sim.crash();
            drop(s);
            let mut again = FileStore::open_in(Arc::new(sim.process()), dir).unwrap();
            assert_eq!(
                again.load().unwrap(),
                offsets(&[(0, 7)]),
                "{}: a commit that returned is gone with its folder",
                dir.display()
            );
        }
    }

    #[test]
    fn a_crash_that_loses_the_page_cache_keeps_the_last_commit_and_a_failed_fsync_loses_the_store()
    {
        use etl_fs::{SimFs, SimOp};
        let sim = SimFs::new(9);
        let dir = Path::new("/state/offsets");
        sim.create_dir_all(dir).unwrap();
        sim.sync_dir(Path::new("/")).unwrap();
        sim.sync_dir(Path::new("/state")).unwrap();
        let mut s = FileStore::open_in(Arc::new(sim.process()), dir).unwrap();
        s.commit(&offsets(&[(0, 1)])).unwrap();
        s.commit(&offsets(&[(0, 2)])).unwrap();
        // Linux reports a failed fsync once; the next one would succeed.
        sim.fail_next(SimOp::Sync, 5);
        assert!(s.commit(&offsets(&[(0, 3)])).is_err());
        assert!(s.commit(&offsets(&[(0, 4)])).is_err(), "never retried");
        sim.crash();
        drop(s);
        let mut again = FileStore::open_in(Arc::new(sim.process()), dir).unwrap();
        assert_eq!(again.load().unwrap(), offsets(&[(0, 2)]));
    }
}
