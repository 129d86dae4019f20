//! The tail of a file: a checksum of the bytes just before a position the
//! file was seen to reach. Appending never changes those bytes, so a file
//! that no longer holds them was rewritten or truncated (see
//! [`file_identity`](crate::file_identity)).

use std::fs::File;
use std::io::{self, ErrorKind};

/// Bytes before a position covered by a [`Tail`].
pub(crate) const TAIL_BYTES: u64 = 1024;

/// A checksum of the bytes just before `end`, a position the file was
/// seen to reach (up to [`TAIL_BYTES`] of them). Appending never changes
/// those bytes, so a file that no longer holds them (shorter than `end`,
/// or other bytes there) was rewritten or truncated since, and a position
/// read in it before means nothing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tail {
    pub(crate) end: u64,
    pub(crate) crc: u32,
}

impl Tail {
    /// The tail of the open `file` at `end` (at most its length). Read
    /// without moving the descriptor's position, so a reader of the same
    /// descriptor is not disturbed.
    pub(crate) fn of(file: &File, end: u64) -> io::Result<Tail> {
        match checksum_range(file, end)? {
            Some(crc) => Ok(Tail { end, crc }),
            None => Err(io::Error::new(
                ErrorKind::UnexpectedEof,
                format!("the file ended before byte {end}"),
            )),
        }
    }

    /// Why the open `file`, `len` bytes long, no longer holds the bytes
    /// this tail was taken of, if it does not.
    pub(crate) fn differs(&self, file: &File, len: u64) -> io::Result<Option<String>> {
        if len < self.end {
            return Ok(Some(format!(
                "the file is {len} bytes long, shorter than the {} bytes it was seen to hold \
                 (truncated or rewritten)",
                self.end
            )));
        }
        match checksum_range(file, self.end)? {
            Some(crc) if crc == self.crc => Ok(None),
            _ => Ok(Some(format!(
                "the bytes before offset {} changed (the file was rewritten in place)",
                self.end
            ))),
        }
    }
}

/// CRC-32 of the [`TAIL_BYTES`] (or fewer, from the start) before `end`;
/// `None` if the file ends before `end`.
fn checksum_range(file: &File, end: u64) -> io::Result<Option<u32>> {
    let start = end.saturating_sub(TAIL_BYTES);
    let mut buf = [0u8; TAIL_BYTES as usize];
    let buf = &mut buf[..(end - start) as usize];
    match read_exact_at(file, buf, start) {
        Ok(()) => Ok(Some(crc32fast::hash(buf))),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, at)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut at: u64) -> io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !buf.is_empty() {
        match file.seek_read(buf, at) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn appending_keeps_a_tail_and_writing_over_the_bytes_before_it_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let first: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &first).unwrap();
        let tail = Tail::of(&File::open(&path).unwrap(), 3000).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"more")
            .unwrap();
        let file = File::open(&path).unwrap();
        assert_eq!(tail.differs(&file, 3004).unwrap(), None);
        // The same first 1900 bytes, then others, and longer.
        let mut next = first[..1900].to_vec();
        next.extend(std::iter::repeat_n(7u8, 2000));
        std::fs::write(&path, &next).unwrap();
        let file = File::open(&path).unwrap();
        let reason = tail.differs(&file, 3900).unwrap().unwrap();
        assert!(reason.contains("rewritten in place"), "{reason}");
        let reason = tail.differs(&file, 2000).unwrap().unwrap();
        assert!(reason.contains("shorter"), "{reason}");
    }
}
