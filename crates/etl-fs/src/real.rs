//! The real file system: `std::fs`, call for call.

use std::ffi::OsString;
use std::fs;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::{FileHandle, FileKind, Fs, Metadata, OpenOptions, TryLockError};

/// The operating system's file system, through `std::fs`: exactly the
/// system calls the components made before they took an [`Fs`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

fn meta(m: &fs::Metadata) -> Metadata {
    let kind = if m.is_file() {
        FileKind::File
    } else if m.is_dir() {
        FileKind::Dir
    } else if m.file_type().is_symlink() {
        FileKind::Symlink
    } else {
        special_kind(m)
    };
    #[cfg(unix)]
    let (dev, ino, links) = {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino(), m.nlink())
    };
    #[cfg(not(unix))]
    let (dev, ino, links) = (0, 0, 1);
    Metadata {
        len: m.len(),
        dev,
        ino,
        links,
        kind,
    }
}

#[cfg(unix)]
fn special_kind(m: &fs::Metadata) -> FileKind {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_fifo() {
        FileKind::Fifo
    } else if t.is_socket() {
        FileKind::Socket
    } else if t.is_char_device() || t.is_block_device() {
        FileKind::Device
    } else {
        FileKind::Other
    }
}

#[cfg(not(unix))]
fn special_kind(_: &fs::Metadata) -> FileKind {
    FileKind::Other
}

/// An open file of the real file system.
#[derive(Debug)]
struct RealFile(fs::File);

impl Read for RealFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for RealFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.0.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl FileHandle for RealFile {
    #[cfg(unix)]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.0, buf, offset)
    }

    #[cfg(windows)]
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::windows::fs::FileExt::seek_read(&self.0, buf, offset)
    }

    fn seek_to(&mut self, offset: u64) -> io::Result<()> {
        self.0.seek(SeekFrom::Start(offset)).map(|_| ())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn metadata(&self) -> io::Result<Metadata> {
        self.0.metadata().map(|m| meta(&m))
    }

    fn try_lock(&self) -> Result<(), TryLockError> {
        self.0.try_lock()
    }
}

impl Fs for RealFs {
    fn open(&self, path: &Path, o: &OpenOptions) -> io::Result<Box<dyn FileHandle>> {
        let file = fs::OpenOptions::new()
            .read(o.read)
            .write(o.write)
            .append(o.append)
            .create(o.create)
            .create_new(o.create_new)
            .truncate(o.truncate)
            .open(path)?;
        Ok(Box::new(RealFile(file)))
    }

    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        fs::metadata(path).map(|m| meta(&m))
    }

    fn symlink_metadata(&self, path: &Path) -> io::Result<Metadata> {
        fs::symlink_metadata(path).map(|m| meta(&m))
    }

    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        fs::canonicalize(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn hard_link(&self, original: &Path, link: &Path) -> io::Result<()> {
        fs::hard_link(original, link)
    }

    #[cfg(unix)]
    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        std::os::unix::fs::symlink(target, link)
    }

    #[cfg(not(unix))]
    fn symlink(&self, _target: &Path, _link: &Path) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        // An entry that cannot be read is skipped, as a listing loop over
        // `read_dir(..).flatten()` would.
        Ok(fs::read_dir(path)?
            .flatten()
            .map(|entry| entry.file_name())
            .collect())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        fs::File::open(path).and_then(|d| d.sync_all())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }
}
