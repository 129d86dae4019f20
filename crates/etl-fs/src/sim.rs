//! `SimFs`: a deterministic in-memory file system that keeps, through a
//! crash, only what was made durable.
//!
//! The model, in the manner of FoundationDB's and TigerBeetle's storage
//! simulators:
//!
//! * **File data** is volatile until an `fsync` of the file covers it:
//!   every write and length change is "dirty" until then. A crash keeps
//!   the durable bytes only, and by seed a torn or a whole unsynced write
//!   (so writes may land out of order, with zeros between).
//! * **Names** (creating, renaming, linking, removing) are durable only
//!   once their folder is synced with [`Fs::sync_dir`]; a name in a folder
//!   whose own name is not durable is lost with it.
//! * **A failed `fsync`** behaves as on Linux ("fsyncgate"): the dirty
//!   bytes are dropped from what will become durable, the error is
//!   reported once, and the next `fsync` succeeds. By seed the lost bytes
//!   read back as zeros at once (the page cache evicted them), else only
//!   after a crash. A failed write writes a prefix of its bytes, by seed.
//! * **Locks** follow `flock(2)`: one per open file (handle), released when
//!   the handle drops or its process crashes.
//! * **Processes**: [`SimFs::crash`] ends every process. A handle or a
//!   view opened before it fails every call with `EIO` afterwards, so a
//!   thread of the dead process cannot write into the next one's world;
//!   [`SimFs::process`] is a view for the processes after it.
//! * **Outside changes**: [`SimFs::apply`] runs a [`Mutation`] as another
//!   program would (rename, replace, rewrite in place, truncate, append,
//!   link, unlink), between or during steps, never failed by the faults.
//!
//! Everything random draws from one seeded generator, so a seed replays
//! the same faults for the same sequence of calls.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::{FileHandle, FileKind, Fs, Metadata, OpenOptions, TryLockError};

const ENOENT: i32 = 2;
const EIO: i32 = 5;
const EBADF: i32 = 9;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;
const EINVAL: i32 = 22;
const ENOSPC: i32 = 28;
const ENOTEMPTY: i32 = 39;
const ELOOP: i32 = 40;
const EPERM: i32 = 1;

const ROOT: u64 = 1;
/// The device every file of the simulation is on.
const DEV: u64 = 0x51;

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// What fails, and how often, in per mille of the calls concerned. The
/// default fails nothing and keeps nothing unsynced through a crash.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimFaults {
    /// File `fsync`s (`sync_data`, `sync_all`) that fail with `EIO`.
    pub sync_fail: u16,
    /// Folder `fsync`s that fail with `EIO`.
    pub dir_sync_fail: u16,
    /// Writes that fail (`EIO` or `ENOSPC`) after writing a prefix.
    pub write_fail: u16,
    /// Failed file `fsync`s whose lost bytes read back as zeros at once.
    pub zero_lost: u16,
    /// Unsynced writes a crash keeps in part (a torn write).
    pub torn: u16,
    /// Unsynced writes a crash keeps whole.
    pub kept: u16,
    /// Folders whose unsynced entries a crash keeps as they are.
    pub dirs_kept: u16,
    /// Only files and folders under this path fail (all when `None`).
    pub under: Option<PathBuf>,
}

/// An operation [`SimFs::fail_next`] can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimOp {
    /// A write to a file.
    Write,
    /// A file `fsync`.
    Sync,
    /// A folder `fsync`.
    SyncDir,
    /// A rename.
    Rename,
}

/// A change another program makes (see [`SimFs::apply`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// `mv from to`.
    Rename {
        /// The old name.
        from: PathBuf,
        /// The new name (replaced when it exists).
        to: PathBuf,
    },
    /// A new file with `bytes` renamed over `path` (a new inode).
    Replace {
        /// The name.
        path: PathBuf,
        /// The new file's content.
        bytes: Vec<u8>,
    },
    /// `cat new > path`: same inode, new content.
    RewriteInPlace {
        /// The file.
        path: PathBuf,
        /// Its new content.
        bytes: Vec<u8>,
    },
    /// `truncate -s len path`.
    Truncate {
        /// The file.
        path: PathBuf,
        /// Its new length.
        len: u64,
    },
    /// `cat more >> path`.
    Append {
        /// The file.
        path: PathBuf,
        /// What is appended.
        bytes: Vec<u8>,
    },
    /// `ln original link`.
    HardLink {
        /// The file.
        original: PathBuf,
        /// Its new name.
        link: PathBuf,
    },
    /// `ln -s target link`.
    Symlink {
        /// What the link points to.
        target: PathBuf,
        /// The link.
        link: PathBuf,
    },
    /// `rm path`.
    Unlink {
        /// The name removed.
        path: PathBuf,
    },
}

/// Counts of what happened, for a simulation to see what it exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Writes done.
    pub writes: u64,
    /// File `fsync`s done (failed ones included).
    pub syncs: u64,
    /// Calls failed by the faults.
    pub failed: u64,
    /// Crashes.
    pub crashes: u64,
}

#[derive(Clone, Debug)]
enum Node {
    File,
    Dir,
    Symlink(PathBuf),
}

#[derive(Clone, Debug)]
struct Inode {
    node: Node,
    /// What reads see.
    data: Vec<u8>,
    /// What a crash keeps.
    durable: Vec<u8>,
    /// Writes (and length changes) no `fsync` covered yet.
    dirty: Vec<(u64, u64)>,
    /// The handle holding its `flock`.
    lock: Option<u64>,
}

impl Inode {
    fn new(node: Node) -> Self {
        Inode {
            node,
            data: Vec::new(),
            durable: Vec::new(),
            dirty: Vec::new(),
            lock: None,
        }
    }

    fn kind(&self) -> FileKind {
        match self.node {
            Node::File => FileKind::File,
            Node::Dir => FileKind::Dir,
            Node::Symlink(_) => FileKind::Symlink,
        }
    }
}

#[derive(Clone, Debug)]
struct Inner {
    /// Crashes so far: views and handles of an earlier epoch are dead.
    epoch: u64,
    next_ino: u64,
    next_handle: u64,
    inodes: BTreeMap<u64, Inode>,
    /// Every name but `/`, by canonical path.
    entries: BTreeMap<PathBuf, u64>,
    /// The names a crash keeps.
    durable_entries: BTreeMap<PathBuf, u64>,
    rng: u64,
    faults: SimFaults,
    /// One-shot failures: the next call of the op fails with the errno.
    next_failures: Vec<(SimOp, i32)>,
    stats: SimStats,
}

enum Step {
    Root,
    Up,
    Name(OsString),
}

fn steps_of(path: &Path) -> Vec<Step> {
    path.components()
        .filter_map(|c| match c {
            Component::RootDir | Component::Prefix(_) => Some(Step::Root),
            Component::CurDir => None,
            Component::ParentDir => Some(Step::Up),
            Component::Normal(n) => Some(Step::Name(n.to_owned())),
        })
        .collect()
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_owned)
}

impl Inner {
    fn random(&mut self) -> u64 {
        // SplitMix64.
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn chance(&mut self, per_mille: u16) -> bool {
        per_mille > 0 && self.random() % 1000 < u64::from(per_mille)
    }

    /// Whether `op` on `path` fails now: a one-shot failure first, then
    /// the random rate for paths the faults cover. Returns the errno.
    fn fault(&mut self, op: SimOp, path: &Path, outside: bool) -> Option<i32> {
        if outside {
            return None;
        }
        if let Some(i) = self.next_failures.iter().position(|(o, _)| *o == op) {
            self.stats.failed += 1;
            return Some(self.next_failures.remove(i).1);
        }
        if self
            .faults
            .under
            .as_ref()
            .is_some_and(|under| !path.starts_with(under))
        {
            return None;
        }
        let rate = match op {
            SimOp::Write => self.faults.write_fail,
            SimOp::Sync => self.faults.sync_fail,
            SimOp::SyncDir => self.faults.dir_sync_fail,
            SimOp::Rename => 0,
        };
        if self.chance(rate) {
            self.stats.failed += 1;
            let enospc = op == SimOp::Write && self.random().is_multiple_of(2);
            Some(if enospc { ENOSPC } else { EIO })
        } else {
            None
        }
    }

    fn lookup(&self, canonical: &Path) -> Option<u64> {
        if canonical == Path::new("/") {
            Some(ROOT)
        } else {
            self.entries.get(canonical).copied()
        }
    }

    fn inode(&self, ino: u64) -> io::Result<&Inode> {
        self.inodes.get(&ino).ok_or_else(|| err(ENOENT))
    }

    fn inode_mut(&mut self, ino: u64) -> io::Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or_else(|| err(ENOENT))
    }

    /// The canonical path `path` names (its last part a symlink followed
    /// when `follow_last`); the last part need not exist, every part
    /// before it must be a folder.
    fn resolve(&self, path: &Path, follow_last: bool) -> io::Result<PathBuf> {
        let mut pending: Vec<Step> = steps_of(path);
        pending.reverse();
        let mut cur = PathBuf::from("/");
        let mut hops = 0;
        while let Some(step) = pending.pop() {
            let name = match step {
                Step::Root => {
                    cur = PathBuf::from("/");
                    continue;
                }
                Step::Up => {
                    cur.pop();
                    continue;
                }
                Step::Name(n) => n,
            };
            let next = cur.join(&name);
            let last = pending.iter().all(|s| !matches!(s, Step::Name(_)));
            match self.lookup(&next).and_then(|i| self.inodes.get(&i)) {
                Some(Inode {
                    node: Node::Symlink(target),
                    ..
                }) if !last || follow_last => {
                    hops += 1;
                    if hops > 40 {
                        return Err(err(ELOOP));
                    }
                    let mut more = steps_of(target);
                    more.reverse();
                    pending.extend(more);
                }
                Some(Inode {
                    node: Node::Dir, ..
                }) => cur = next,
                Some(_) if !last => return Err(err(ENOTDIR)),
                None if !last => return Err(err(ENOENT)),
                _ => cur = next,
            }
        }
        Ok(cur)
    }

    fn new_inode(&mut self, node: Node) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, Inode::new(node));
        ino
    }

    /// Add the name `canonical` (which must not exist) for `ino`.
    fn link(&mut self, canonical: PathBuf, ino: u64) -> io::Result<()> {
        if self.lookup(&canonical).is_some() {
            return Err(err(EEXIST));
        }
        match self.lookup(&parent_of(&canonical)).map(|p| self.inode(p)) {
            Some(Ok(Inode {
                node: Node::Dir, ..
            })) => {}
            Some(_) => return Err(err(ENOTDIR)),
            None => return Err(err(ENOENT)),
        }
        self.entries.insert(canonical, ino);
        Ok(())
    }

    fn metadata_of(&self, ino: u64) -> io::Result<Metadata> {
        let inode = self.inode(ino)?;
        let len = match &inode.node {
            Node::Symlink(t) => t.as_os_str().len() as u64,
            _ => inode.data.len() as u64,
        };
        // Names are few in a simulation: counting them is cheap.
        let links = self.entries.values().filter(|&&i| i == ino).count() as u64;
        Ok(Metadata {
            len,
            dev: DEV,
            ino,
            links,
            kind: inode.kind(),
        })
    }

    fn children(&self, dir: &Path) -> Vec<PathBuf> {
        self.entries
            .range(dir.to_owned()..)
            .take_while(|(p, _)| p.starts_with(dir))
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn write_at(&mut self, ino: u64, at: u64, buf: &[u8]) -> io::Result<()> {
        let inode = self.inode_mut(ino)?;
        let start = usize::try_from(at).map_err(|_| err(EINVAL))?;
        let end = start + buf.len();
        if inode.data.len() < end {
            inode.data.resize(end, 0);
        }
        inode.data[start..end].copy_from_slice(buf);
        inode.dirty.push((at, end as u64));
        self.stats.writes += 1;
        Ok(())
    }

    fn set_len(&mut self, ino: u64, len: u64) -> io::Result<()> {
        let inode = self.inode_mut(ino)?;
        let new = usize::try_from(len).map_err(|_| err(EINVAL))?;
        let old = inode.data.len();
        inode.data.resize(new, 0);
        // A length change is dirty like a write; a cut needs nothing
        // copied, only the length synced.
        inode.dirty.push((old.min(new) as u64, new as u64));
        Ok(())
    }

    fn sync_file(&mut self, ino: u64, path: &Path, outside: bool) -> io::Result<()> {
        self.stats.syncs += 1;
        let failed = self.fault(SimOp::Sync, path, outside);
        let zero = failed.is_some() && {
            let rate = self.faults.zero_lost;
            self.chance(rate)
        };
        let inode = self.inode_mut(ino)?;
        let len = inode.data.len();
        // The length reaches the disk either way: the bytes a failed
        // writeback lost read back as zeros after a crash.
        inode.durable.resize(len, 0);
        for (start, end) in std::mem::take(&mut inode.dirty) {
            let start = usize::try_from(start).unwrap_or(usize::MAX).min(len);
            let end = usize::try_from(end).unwrap_or(usize::MAX).min(len);
            if start >= end {
                continue;
            }
            if failed.is_none() {
                inode.durable[start..end].copy_from_slice(&inode.data[start..end]);
            } else if zero {
                // The pages are gone: reads see what the disk holds.
                inode.data[start..end].copy_from_slice(&inode.durable[start..end]);
            }
        }
        match failed {
            Some(code) => Err(err(code)),
            None => Ok(()),
        }
    }

    fn sync_dir(&mut self, canonical: &Path) {
        let stale: Vec<PathBuf> = self
            .durable_entries
            .range(canonical.to_owned()..)
            .take_while(|(p, _)| p.starts_with(canonical))
            .filter(|(p, _)| p.parent() == Some(canonical))
            .map(|(p, _)| p.clone())
            .collect();
        for p in stale {
            self.durable_entries.remove(&p);
        }
        for p in self.children(canonical) {
            if let Some(ino) = self.entries.get(&p) {
                self.durable_entries.insert(p, *ino);
            }
        }
    }

    fn crash(&mut self) {
        self.epoch += 1;
        self.stats.crashes += 1;
        // Folders whose unsynced entries happen to survive.
        let mut dirs: Vec<PathBuf> = self
            .entries
            .iter()
            .filter(|(_, i)| matches!(self.inodes.get(i).map(|n| &n.node), Some(Node::Dir)))
            .map(|(p, _)| p.clone())
            .collect();
        dirs.push(PathBuf::from("/"));
        for dir in dirs {
            let rate = self.faults.dirs_kept;
            if self.chance(rate) {
                self.sync_dir(&dir);
            }
        }
        // A name survives only under folders that survive.
        let mut kept: BTreeMap<PathBuf, u64> = BTreeMap::new();
        for (p, ino) in &self.durable_entries {
            let parent = parent_of(p);
            let parent_ok = parent == Path::new("/")
                || kept.get(&parent).is_some_and(|i| {
                    matches!(self.inodes.get(i).map(|n| &n.node), Some(Node::Dir))
                });
            if parent_ok {
                kept.insert(p.clone(), *ino);
            }
        }
        self.entries = kept.clone();
        self.durable_entries = kept;
        let live: std::collections::BTreeSet<u64> = self
            .entries
            .values()
            .copied()
            .chain(std::iter::once(ROOT))
            .collect();
        self.inodes.retain(|ino, _| live.contains(ino));
        let (torn, whole) = (self.faults.torn, self.faults.kept);
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            let Some(inode) = self.inodes.get_mut(&ino) else {
                continue;
            };
            inode.lock = None;
            let dirty = std::mem::take(&mut inode.dirty);
            let data = std::mem::take(&mut inode.data);
            let mut disk = inode.durable.clone();
            for (start, end) in dirty {
                let keep = if self.chance(whole) {
                    end
                } else if self.chance(torn) {
                    start + (end - start) / 2
                } else {
                    continue;
                };
                let s = usize::try_from(start).unwrap_or(usize::MAX).min(data.len());
                let e = usize::try_from(keep).unwrap_or(usize::MAX).min(data.len());
                if s >= e {
                    continue;
                }
                if disk.len() < e {
                    disk.resize(e, 0);
                }
                disk[s..e].copy_from_slice(&data[s..e]);
            }
            if let Some(inode) = self.inodes.get_mut(&ino) {
                inode.durable.clone_from(&disk);
                inode.data = disk;
            }
        }
    }
}

/// A simulated file system (see the module docs). Cloning gives another
/// view of the same file system in the same process epoch.
#[derive(Clone, Debug)]
pub struct SimFs {
    inner: Arc<Mutex<Inner>>,
    epoch: u64,
    /// What [`Fs::blocks`] says (see [`SimFs::blocking`]).
    blocks: bool,
}

impl SimFs {
    /// An empty file system (only `/`), its randomness seeded by `seed`,
    /// with no faults.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT, Inode::new(Node::Dir));
        SimFs {
            inner: Arc::new(Mutex::new(Inner {
                epoch: 0,
                next_ino: ROOT + 1,
                next_handle: 1,
                inodes,
                entries: BTreeMap::new(),
                durable_entries: BTreeMap::new(),
                rng: seed,
                faults: SimFaults::default(),
                next_failures: Vec::new(),
                stats: SimStats::default(),
            })),
            epoch: 0,
            blocks: false,
        }
    }

    /// This view, but saying its calls block ([`Fs::blocks`]), as a real
    /// disk's do: components then run them on blocking threads. For tests
    /// of what happens while a call is under way on another thread; a
    /// simulation keeps the default (inline, deterministic).
    #[must_use]
    pub fn blocking(mut self) -> SimFs {
        self.blocks = true;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock, for a live view: a view of a crashed epoch fails.
    fn live(&self) -> io::Result<MutexGuard<'_, Inner>> {
        let inner = self.lock();
        if inner.epoch == self.epoch {
            Ok(inner)
        } else {
            Err(io::Error::other("sim: this process died in a crash"))
        }
    }

    /// Set the faults from now on.
    pub fn set_faults(&self, faults: SimFaults) {
        self.lock().faults = faults;
    }

    /// Fail the next `op` (on any path) with the OS error `errno` (5 is
    /// `EIO`, 28 `ENOSPC`), whatever the faults say.
    pub fn fail_next(&self, op: SimOp, errno: i32) {
        self.lock().next_failures.push((op, errno));
    }

    /// What happened so far.
    #[must_use]
    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// The machine loses power: only durable bytes and names survive (and,
    /// by seed, some unsynced ones, see [`SimFaults`]); every lock is
    /// released; every view and handle opened before fails from now on.
    pub fn crash(&self) {
        self.lock().crash();
    }

    /// Every process is killed (`kill -9`), the machine stays up: the
    /// page cache is kept (unsynced bytes and names read on as they were),
    /// every lock is released, and every view and handle opened before
    /// fails from now on, as after [`crash`](Self::crash).
    pub fn kill(&self) {
        let mut inner = self.lock();
        inner.epoch += 1;
        for inode in inner.inodes.values_mut() {
            inode.lock = None;
        }
    }

    /// A view for a process started after the last crash.
    #[must_use]
    pub fn process(&self) -> SimFs {
        SimFs {
            inner: Arc::clone(&self.inner),
            epoch: self.lock().epoch,
            blocks: self.blocks,
        }
    }

    /// Run `mutation` as another program would: never failed by the
    /// faults, durable only as far as it syncs (it syncs nothing).
    ///
    /// # Errors
    ///
    /// The paths do not allow it (a missing file, say).
    pub fn apply(&self, mutation: &Mutation) -> io::Result<()> {
        let outside = self.process();
        match mutation {
            Mutation::Rename { from, to } => outside.rename_as(from, to, true),
            Mutation::Replace { path, bytes } => {
                let mut tmp = path.as_os_str().to_owned();
                tmp.push(".sim-replace");
                let tmp = PathBuf::from(tmp);
                outside
                    .open_as(
                        &tmp,
                        &OpenOptions::new().write(true).create(true).truncate(true),
                        true,
                    )?
                    .write_all(bytes)?;
                outside.rename_as(&tmp, path, true)
            }
            Mutation::RewriteInPlace { path, bytes } => {
                let mut f =
                    outside.open_as(path, &OpenOptions::new().write(true).truncate(true), true)?;
                f.write_all(bytes)
            }
            Mutation::Truncate { path, len } => outside
                .open_as(path, &OpenOptions::new().write(true), true)?
                .set_len(*len),
            Mutation::Append { path, bytes } => outside
                .open_as(path, &OpenOptions::new().append(true), true)?
                .write_all(bytes),
            Mutation::HardLink { original, link } => outside.hard_link(original, link),
            Mutation::Symlink { target, link } => outside.symlink(target, link),
            Mutation::Unlink { path } => outside.remove_file(path),
        }
    }

    fn open_as(
        &self,
        path: &Path,
        o: &OpenOptions,
        outside: bool,
    ) -> io::Result<Box<dyn FileHandle>> {
        let mut inner = self.live()?;
        let canonical = inner.resolve(path, true)?;
        let ino = match inner.lookup(&canonical) {
            Some(_) if o.create_new => return Err(err(EEXIST)),
            Some(ino) => {
                let inode = inner.inode(ino)?;
                if matches!(inode.node, Node::Dir) && o.writes() {
                    return Err(err(EISDIR));
                }
                if o.truncate && o.writes() && !inode.data.is_empty() {
                    inner.set_len(ino, 0)?;
                }
                ino
            }
            None if o.create || o.create_new => {
                if !o.writes() {
                    return Err(err(EINVAL));
                }
                let ino = inner.new_inode(Node::File);
                inner.link(canonical.clone(), ino)?;
                ino
            }
            None => return Err(err(ENOENT)),
        };
        let id = inner.next_handle;
        inner.next_handle += 1;
        Ok(Box::new(SimFile {
            fs: self.clone(),
            ino,
            id,
            path: canonical,
            read: o.read,
            write: o.writes(),
            append: o.append,
            pos: 0,
            outside,
        }))
    }

    fn rename_as(&self, from: &Path, to: &Path, outside: bool) -> io::Result<()> {
        let mut inner = self.live()?;
        let from = inner.resolve(from, false)?;
        let to = inner.resolve(to, false)?;
        if let Some(code) = inner.fault(SimOp::Rename, &from, outside) {
            return Err(err(code));
        }
        let ino = inner.lookup(&from).ok_or_else(|| err(ENOENT))?;
        if from == to {
            return Ok(());
        }
        let is_dir = matches!(inner.inode(ino)?.node, Node::Dir);
        if let Some(there) = inner.lookup(&to) {
            match (&inner.inode(there)?.node, is_dir) {
                (Node::Dir, false) => return Err(err(EISDIR)),
                (Node::Dir, true) if !inner.children(&to).is_empty() => {
                    return Err(err(ENOTEMPTY));
                }
                (Node::Dir, true) => {}
                (_, true) => return Err(err(ENOTDIR)),
                _ => {}
            }
            inner.entries.remove(&to);
        }
        if is_dir && to.starts_with(&from) {
            return Err(err(EINVAL));
        }
        match inner.lookup(&parent_of(&to)).map(|p| inner.inode(p)) {
            Some(Ok(Inode {
                node: Node::Dir, ..
            })) => {}
            _ => return Err(err(ENOENT)),
        }
        let moved: Vec<(PathBuf, u64)> = inner
            .entries
            .range(from.clone()..)
            .take_while(|(p, _)| p.starts_with(&from))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, i) in moved {
            inner.entries.remove(&p);
            let rest = p
                .strip_prefix(&from)
                .map_or_else(|_| PathBuf::new(), Path::to_owned);
            let dest = if rest.as_os_str().is_empty() {
                to.clone()
            } else {
                to.join(rest)
            };
            inner.entries.insert(dest, i);
        }
        Ok(())
    }
}

impl Fs for SimFs {
    fn open(&self, path: &Path, options: &OpenOptions) -> io::Result<Box<dyn FileHandle>> {
        self.open_as(path, options, false)
    }

    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        let inner = self.live()?;
        let canonical = inner.resolve(path, true)?;
        let ino = inner.lookup(&canonical).ok_or_else(|| err(ENOENT))?;
        inner.metadata_of(ino)
    }

    fn symlink_metadata(&self, path: &Path) -> io::Result<Metadata> {
        let inner = self.live()?;
        let canonical = inner.resolve(path, false)?;
        let ino = inner.lookup(&canonical).ok_or_else(|| err(ENOENT))?;
        inner.metadata_of(ino)
    }

    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        let inner = self.live()?;
        let canonical = inner.resolve(path, true)?;
        inner.lookup(&canonical).ok_or_else(|| err(ENOENT))?;
        Ok(canonical)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.rename_as(from, to, false)
    }

    fn hard_link(&self, original: &Path, link: &Path) -> io::Result<()> {
        let mut inner = self.live()?;
        let original = inner.resolve(original, false)?;
        let ino = inner.lookup(&original).ok_or_else(|| err(ENOENT))?;
        if matches!(inner.inode(ino)?.node, Node::Dir) {
            return Err(err(EPERM));
        }
        let link = inner.resolve(link, false)?;
        inner.link(link, ino)
    }

    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        let mut inner = self.live()?;
        let link = inner.resolve(link, false)?;
        if inner.lookup(&link).is_some() {
            return Err(err(EEXIST));
        }
        let ino = inner.new_inode(Node::Symlink(target.to_owned()));
        inner.link(link, ino)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut inner = self.live()?;
        let canonical = inner.resolve(path, false)?;
        let ino = inner.lookup(&canonical).ok_or_else(|| err(ENOENT))?;
        if matches!(inner.inode(ino)?.node, Node::Dir) {
            return Err(err(EISDIR));
        }
        inner.entries.remove(&canonical);
        Ok(())
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        let inner = self.live()?;
        let canonical = inner.resolve(path, true)?;
        let ino = inner.lookup(&canonical).ok_or_else(|| err(ENOENT))?;
        if !matches!(inner.inode(ino)?.node, Node::Dir) {
            return Err(err(ENOTDIR));
        }
        Ok(inner
            .children(&canonical)
            .iter()
            .filter_map(|p| p.file_name().map(ToOwned::to_owned))
            .collect())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut inner = self.live()?;
        let mut prefix = PathBuf::new();
        for component in path.components() {
            prefix.push(component);
            let canonical = inner.resolve(&prefix, true)?;
            match inner.lookup(&canonical).map(|i| inner.inode(i)) {
                Some(Ok(Inode {
                    node: Node::Dir, ..
                })) => {}
                Some(_) => return Err(err(EEXIST)),
                None => {
                    let ino = inner.new_inode(Node::Dir);
                    inner.link(canonical, ino)?;
                }
            }
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut inner = self.live()?;
        let canonical = inner.resolve(path, true)?;
        let ino = inner.lookup(&canonical).ok_or_else(|| err(ENOENT))?;
        if !matches!(inner.inode(ino)?.node, Node::Dir) {
            return Err(err(ENOTDIR));
        }
        if let Some(code) = inner.fault(SimOp::SyncDir, &canonical, false) {
            return Err(err(code));
        }
        inner.sync_dir(&canonical);
        Ok(())
    }

    fn blocks(&self) -> bool {
        self.blocks
    }
}

/// An open file of a [`SimFs`].
#[derive(Debug)]
struct SimFile {
    fs: SimFs,
    ino: u64,
    id: u64,
    /// The name it was opened by (for the faults' `under`).
    path: PathBuf,
    read: bool,
    write: bool,
    append: bool,
    pos: u64,
    /// Opened by [`SimFs::apply`]: never failed by the faults.
    outside: bool,
}

impl SimFile {
    fn read_into(&self, inner: &Inner, buf: &mut [u8], at: u64) -> io::Result<usize> {
        if !self.read {
            return Err(err(EBADF));
        }
        let data = &inner.inode(self.ino)?.data;
        let start = usize::try_from(at).unwrap_or(usize::MAX).min(data.len());
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }
}

impl Read for SimFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = {
            let inner = self.fs.live()?;
            self.read_into(&inner, buf, self.pos)?
        };
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for SimFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.write {
            return Err(err(EBADF));
        }
        let mut inner = self.fs.live()?;
        let at = if self.append {
            inner.inode(self.ino)?.data.len() as u64
        } else {
            self.pos
        };
        if let Some(code) = inner.fault(SimOp::Write, &self.path, self.outside) {
            // A prefix of the bytes may land before the error.
            let part = usize::try_from(inner.random() % (buf.len() as u64 + 1)).unwrap_or(0);
            if part > 0 {
                inner.write_at(self.ino, at, &buf[..part])?;
            }
            return Err(err(code));
        }
        inner.write_at(self.ino, at, buf)?;
        self.pos = at + buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl FileHandle for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let inner = self.fs.live()?;
        self.read_into(&inner, buf, offset)
    }

    fn seek_to(&mut self, offset: u64) -> io::Result<()> {
        drop(self.fs.live()?);
        self.pos = offset;
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if !self.write {
            return Err(err(EINVAL));
        }
        self.fs.live()?.set_len(self.ino, len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.fs
            .live()?
            .sync_file(self.ino, &self.path, self.outside)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }

    fn metadata(&self) -> io::Result<Metadata> {
        self.fs.live()?.metadata_of(self.ino)
    }

    fn try_lock(&self) -> Result<(), TryLockError> {
        let mut inner = self.fs.live().map_err(TryLockError::Error)?;
        let inode = inner.inode_mut(self.ino).map_err(TryLockError::Error)?;
        match inode.lock {
            Some(holder) if holder != self.id => Err(TryLockError::WouldBlock),
            _ => {
                inode.lock = Some(self.id);
                Ok(())
            }
        }
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let mut inner = self.fs.lock();
        if let Some(inode) = inner.inodes.get_mut(&self.ino)
            && inode.lock == Some(self.id)
        {
            inode.lock = None;
        }
    }
}

mod durable;
#[cfg(test)]
mod tests;
