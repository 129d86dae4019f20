//! The file system as the pipeline's file components see it: one small
//! interface, [`Fs`], with the real file system behind it ([`RealFs`],
//! the default everywhere) and, behind the `sim` feature, a simulated one
//! (`SimFs`) that keeps only what an `fsync` made durable.
//!
//! The file sink, the file source and its identity registry, the file
//! offset store and the owner locks read and write through an
//! `Arc<dyn Fs>`. With [`RealFs`] they make exactly the system calls they
//! would make on `std::fs`; nothing changes for users. With `SimFs` a test
//! can crash the machine (the page cache is lost), fail a write or an
//! `fsync` the way Linux does (a failed `fsync` drops the dirty pages and
//! the next one succeeds), and rename, rewrite, truncate, link or unlink
//! files under a running pipeline, deterministically by seed.
//!
//! The interface is what the components need and no more:
//!
//! * [`Fs::open`] with [`OpenOptions`] gives a [`FileHandle`]: sequential
//!   and positioned reads, writes (appends when opened to append),
//!   `set_len`, `sync_data`/`sync_all`, `metadata` and an exclusive
//!   [`try_lock`](FileHandle::try_lock) with `flock(2)` semantics (it
//!   belongs to the open file, and is released when the handle drops);
//! * names: [`metadata`](Fs::metadata) (device, inode, length, kind),
//!   [`canonicalize`](Fs::canonicalize), [`rename`](Fs::rename),
//!   [`hard_link`](Fs::hard_link), [`symlink`](Fs::symlink),
//!   [`remove_file`](Fs::remove_file), [`read_dir`](Fs::read_dir),
//!   [`create_dir_all`](Fs::create_dir_all), and
//!   [`sync_dir`](Fs::sync_dir), which makes the entries of a folder
//!   (creations, renames, links, removals) durable; [`folders_above`]
//!   lists the folders whose syncs make a name durable all the way up.
//!
//! Calls are per buffer (a batch, a 64 KiB read), never per record, so
//! the dynamic dispatch costs nothing that shows.
//!
//! # Example
//!
//! ```
//! use std::io::{Read as _, Write as _};
//! use std::path::Path;
//! use std::sync::Arc;
//!
//! use etl_fs::{Fs, OpenOptions, RealFs};
//!
//! fn append_durably(fs: &dyn Fs, path: &Path, line: &str) -> std::io::Result<()> {
//!     let mut file = fs.open(path, &OpenOptions::new().append(true).create(true))?;
//!     file.write_all(line.as_bytes())?;
//!     file.sync_data()?;
//!     // A new file's name is durable only once its folder is synced.
//!     fs.sync_dir(path.parent().unwrap_or(Path::new(".")))
//! }
//!
//! let dir = tempfile::tempdir()?;
//! let fs: Arc<dyn Fs> = Arc::new(RealFs);
//! let path = dir.path().join("out.ndjson");
//! append_durably(&*fs, &path, "{}\n")?;
//! assert_eq!(fs.read(&path)?, b"{}\n");
//! assert_eq!(fs.metadata(&path)?.len(), 3);
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! With the `sim` feature, the same function over `SimFs` loses the line
//! when the machine crashes before the folder's `fsync`:
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use std::io::Write as _;
//! use std::path::Path;
//!
//! use etl_fs::{Fs, OpenOptions, SimFs};
//!
//! let fs = SimFs::new(7);
//! fs.create_dir_all(Path::new("/out")).unwrap();
//! fs.sync_dir(Path::new("/")).unwrap();
//! let path = Path::new("/out/a.ndjson");
//! let mut file = fs.open(path, &OpenOptions::new().append(true).create(true)).unwrap();
//! file.write_all(b"{}\n").unwrap();
//! file.sync_data().unwrap();
//! fs.crash();
//! // The data was synced, the name was not: the file is gone.
//! assert!(fs.metadata(path).is_err());
//! # }
//! ```

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

mod real;
#[cfg(feature = "sim")]
mod sim;

pub use real::RealFs;
#[cfg(feature = "sim")]
pub use sim::{Mutation, SimFaults, SimFs, SimOp, SimStats};
pub use std::fs::TryLockError;

/// How to open a file: the subset of [`std::fs::OpenOptions`] the
/// components use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(clippy::struct_excessive_bools)]
pub struct OpenOptions {
    /// Open for reading.
    pub read: bool,
    /// Open for writing (at the handle's position).
    pub write: bool,
    /// Every write goes to the end of the file (implies `write`).
    pub append: bool,
    /// Create the file when it does not exist.
    pub create: bool,
    /// Fail when the file exists (implies `create`).
    pub create_new: bool,
    /// Cut the file to 0 bytes on open (needs `write`).
    pub truncate: bool,
}

impl OpenOptions {
    /// Nothing set: set what the open needs.
    #[must_use]
    pub fn new() -> Self {
        OpenOptions::default()
    }

    /// Open to read only.
    #[must_use]
    pub fn reading() -> Self {
        OpenOptions::new().read(true)
    }

    /// Set [`read`](Self::read).
    #[must_use]
    pub fn read(mut self, on: bool) -> Self {
        self.read = on;
        self
    }

    /// Set [`write`](Self::write).
    #[must_use]
    pub fn write(mut self, on: bool) -> Self {
        self.write = on;
        self
    }

    /// Set [`append`](Self::append).
    #[must_use]
    pub fn append(mut self, on: bool) -> Self {
        self.append = on;
        self
    }

    /// Set [`create`](Self::create).
    #[must_use]
    pub fn create(mut self, on: bool) -> Self {
        self.create = on;
        self
    }

    /// Set [`create_new`](Self::create_new).
    #[must_use]
    pub fn create_new(mut self, on: bool) -> Self {
        self.create_new = on;
        self
    }

    /// Set [`truncate`](Self::truncate).
    #[must_use]
    pub fn truncate(mut self, on: bool) -> Self {
        self.truncate = on;
        self
    }

    #[cfg(feature = "sim")]
    fn writes(&self) -> bool {
        self.write || self.append
    }
}

/// What a name is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    /// A regular file.
    File,
    /// A folder.
    Dir,
    /// A symbolic link (only from [`Fs::symlink_metadata`]).
    Symlink,
    /// A FIFO (named pipe): opening it to read waits for a writer.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character or block device.
    Device,
    /// Anything else the platform has.
    Other,
}

/// What [`Fs::metadata`] and [`FileHandle::metadata`] say about a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Length in bytes.
    pub len: u64,
    /// Device the file lives on (0 where the platform has none).
    pub dev: u64,
    /// Inode number (0 where the platform has none).
    pub ino: u64,
    /// Names the file has (hard links; 1 where the platform does not
    /// count them).
    pub links: u64,
    /// What it is.
    pub kind: FileKind,
}

impl Metadata {
    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it holds no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it is a regular file.
    #[must_use]
    pub fn is_file(&self) -> bool {
        self.kind == FileKind::File
    }

    /// Whether it is a folder.
    #[must_use]
    pub fn is_dir(&self) -> bool {
        self.kind == FileKind::Dir
    }

    /// Device and inode: which file this is, whatever its name.
    #[must_use]
    pub fn dev_ino(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// An open file. Reads and writes go through [`Read`] and [`Write`] at
/// the handle's position (writes at the end when opened to append);
/// [`read_at`](Self::read_at) reads at a position without moving it.
pub trait FileHandle: Read + Write + Send + Sync + fmt::Debug {
    /// Read into `buf` from `offset`, without moving the position; 0 at
    /// the end of the file.
    ///
    /// # Errors
    ///
    /// The read fails.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Move the position to `offset` from the start.
    ///
    /// # Errors
    ///
    /// The seek fails.
    fn seek_to(&mut self, offset: u64) -> io::Result<()>;

    /// Cut (or extend with zeros) the file to `len` bytes.
    ///
    /// # Errors
    ///
    /// The file is not open to write, or the call fails.
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Make the file's data (and its length) durable: `fdatasync(2)`.
    ///
    /// # Errors
    ///
    /// The data may not be durable. On Linux the kernel then drops the
    /// dirty pages and reports the next `fsync` a success: never retry
    /// and trust it.
    fn sync_data(&self) -> io::Result<()>;

    /// Make the file's data and metadata durable: `fsync(2)`.
    ///
    /// # Errors
    ///
    /// As [`sync_data`](Self::sync_data).
    fn sync_all(&self) -> io::Result<()>;

    /// What the open file is now (whatever name it has).
    ///
    /// # Errors
    ///
    /// The call fails.
    fn metadata(&self) -> io::Result<Metadata>;

    /// Take an exclusive lock on the open file without waiting
    /// (`flock(2)`): it belongs to this open file (another handle of the
    /// same file, in this process or another, is refused) and is released
    /// when this handle drops.
    ///
    /// # Errors
    ///
    /// [`TryLockError::WouldBlock`] when another handle holds it.
    fn try_lock(&self) -> Result<(), TryLockError>;
}

/// The file system: names, folders and [`FileHandle`]s. Object safe:
/// components hold an `Arc<dyn Fs>`.
pub trait Fs: Send + Sync + fmt::Debug {
    /// Open `path` as `options` say.
    ///
    /// # Errors
    ///
    /// As `open(2)`: `NotFound`, `AlreadyExists` (`create_new`),
    /// `PermissionDenied`, ...
    fn open(&self, path: &Path, options: &OpenOptions) -> io::Result<Box<dyn FileHandle>>;

    /// What `path` names, symlinks followed.
    ///
    /// # Errors
    ///
    /// `NotFound` when it names nothing.
    fn metadata(&self, path: &Path) -> io::Result<Metadata>;

    /// What `path` is itself, a symlink not followed.
    ///
    /// # Errors
    ///
    /// `NotFound` when it names nothing.
    fn symlink_metadata(&self, path: &Path) -> io::Result<Metadata>;

    /// The absolute path of what `path` names, with every symlink, `.`
    /// and `..` resolved.
    ///
    /// # Errors
    ///
    /// `NotFound` when it names nothing.
    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf>;

    /// Rename `from` to `to`, replacing a file there.
    ///
    /// # Errors
    ///
    /// As `rename(2)`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// A second name `link` for the file `original` names.
    ///
    /// # Errors
    ///
    /// As `link(2)`.
    fn hard_link(&self, original: &Path, link: &Path) -> io::Result<()>;

    /// A symlink at `link` pointing to `target`.
    ///
    /// # Errors
    ///
    /// As `symlink(2)`.
    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()>;

    /// Remove the name `path` (the file lives on while open or linked).
    ///
    /// # Errors
    ///
    /// As `unlink(2)`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;

    /// The names in folder `path`, without `.` and `..`, in no
    /// particular order.
    ///
    /// # Errors
    ///
    /// `path` is not a readable folder.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>>;

    /// Create folder `path` and every missing folder above it.
    ///
    /// # Errors
    ///
    /// A part of `path` is not a folder, or cannot be created.
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Make the entries of folder `path` durable: what was created,
    /// renamed, linked or removed in it survives a crash only after this.
    ///
    /// # Errors
    ///
    /// The entries may not be durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// The whole content of `path`.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open) and reading.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut file = self.open(path, &OpenOptions::reading())?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// Replace the content of `path` with `bytes` (created if missing),
    /// not durably.
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open) and writing.
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut file = self.open(
            path,
            &OpenOptions::new().write(true).create(true).truncate(true),
        )?;
        file.write_all(bytes)
    }

    /// Whether `path` names something (symlinks followed).
    fn exists(&self, path: &Path) -> bool {
        self.metadata(path).is_ok()
    }

    /// Whether a call may hold the calling thread for long, as a real
    /// disk's may (an `fsync` can take seconds). A component on an async
    /// runtime moves such calls to a blocking thread; calls of a file
    /// system that answers at once (an in-memory one) are made inline,
    /// which also keeps a simulation deterministic. `true` unless the
    /// implementation says otherwise.
    fn blocks(&self) -> bool {
        true
    }
}

/// The folders whose entries hold the name of `path`, nearest first: its
/// parent, the parent's parent, and so on up to the root. A name (a
/// file's or a folder's) survives a crash only once the folder holding
/// it is synced ([`Fs::sync_dir`]), and that folder's own name only once
/// its parent is: a component that keeps durable state in a folder it did
/// not see created durably syncs every one of these. `path` should be
/// canonical ([`Fs::canonicalize`]): the folders of a relative path stop
/// at `.`, whose own name is not covered.
///
/// ```
/// use std::path::Path;
///
/// let above: Vec<&Path> = etl_fs::folders_above(Path::new("/var/etl/state")).collect();
/// assert_eq!(above, [Path::new("/var/etl"), Path::new("/var"), Path::new("/")]);
/// let above: Vec<&Path> = etl_fs::folders_above(Path::new("state/offsets")).collect();
/// assert_eq!(above, [Path::new("state"), Path::new(".")]);
/// ```
pub fn folders_above(path: &Path) -> impl Iterator<Item = &Path> {
    let mut next = Some(path);
    std::iter::from_fn(move || {
        let at = next?;
        match at.parent() {
            Some(p) if !p.as_os_str().is_empty() => {
                next = Some(p);
                Some(p)
            }
            // A relative path's last folder is the working one.
            Some(_) => {
                next = None;
                Some(Path::new("."))
            }
            None => {
                next = None;
                None
            }
        }
    })
}

/// Make the name of `path` durable all the way up: sync every folder of
/// [`folders_above`] (`path` should be canonical). A component keeping
/// durable state in a folder calls it before trusting that state: the
/// folder may have been created by anyone (itself, another component,
/// the runtime) without its name ever being synced, and a crash would
/// then take the folder and everything in it. A folder this process may
/// not open ([`io::ErrorKind::PermissionDenied`]) ends the walk: it was
/// not created by this user just now, and neither were those above it.
///
/// # Errors
///
/// A folder could not be synced: the names below it may not be durable.
pub fn sync_folders_above(fs: &dyn Fs, path: &Path) -> Result<(), SyncDirError> {
    for dir in folders_above(path) {
        match fs.sync_dir(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => break,
            Err(source) => {
                return Err(SyncDirError {
                    dir: dir.to_owned(),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// A folder [`sync_folders_above`] could not sync.
#[derive(Debug)]
pub struct SyncDirError {
    /// The folder.
    pub dir: PathBuf,
    /// Why its `fsync` failed.
    pub source: io::Error,
}

impl fmt::Display for SyncDirError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot fsync the folder {}", self.dir.display())
    }
}

impl std::error::Error for SyncDirError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// The shared real file system, for components built without one.
#[must_use]
pub fn real() -> std::sync::Arc<dyn Fs> {
    std::sync::Arc::new(RealFs)
}
