//! The tail of a file: a checksum of the bytes just before a position the
//! file was seen to reach. Appending never changes those bytes, so a file
//! that no longer holds them was rewritten or truncated (see
//! [`file_identity`](crate::file_identity)).

use std::io::{self, ErrorKind};

use etl_fs::FileHandle;

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
    pub(crate) fn of(file: &dyn FileHandle, end: u64) -> io::Result<Tail> {
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
    pub(crate) fn differs(&self, file: &dyn FileHandle, len: u64) -> io::Result<Option<String>> {
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
fn checksum_range(file: &dyn FileHandle, end: u64) -> io::Result<Option<u32>> {
    let start = end.saturating_sub(TAIL_BYTES);
    let mut buf = [0u8; TAIL_BYTES as usize];
    let buf = &mut buf[..(end - start) as usize];
    match read_exact_at(file, buf, start) {
        Ok(()) => Ok(Some(crc32fast::hash(buf))),
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Read `buf.len()` bytes at `at` without moving the handle's position;
/// `UnexpectedEof` if the file ends before.
fn read_exact_at(file: &dyn FileHandle, buf: &mut [u8], at: u64) -> io::Result<()> {
    if read_at_most(file, buf, at)? < buf.len() {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Fill `buf` from `at` as far as the file goes, without moving the
/// handle's position: the bytes read (fewer only at the end of the file).
pub(crate) fn read_at_most(file: &dyn FileHandle, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::Path;

    use etl_fs::{Fs, OpenOptions, SimFs};

    use super::*;

    #[test]
    fn appending_keeps_a_tail_and_writing_over_the_bytes_before_it_does_not() {
        let fs = SimFs::new(1);
        let path = Path::new("/f");
        let open = || fs.open(path, &OpenOptions::reading()).unwrap();
        let first: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        fs.write(path, &first).unwrap();
        let tail = Tail::of(&*open(), 3000).unwrap();
        fs.open(path, &OpenOptions::new().append(true))
            .unwrap()
            .write_all(b"more")
            .unwrap();
        assert_eq!(tail.differs(&*open(), 3004).unwrap(), None);
        // The same first 1900 bytes, then others, and longer.
        let mut next = first[..1900].to_vec();
        next.extend(std::iter::repeat_n(7u8, 2000));
        fs.write(path, &next).unwrap();
        let file = open();
        let reason = tail.differs(&*file, 3900).unwrap().unwrap();
        assert!(reason.contains("rewritten in place"), "{reason}");
        let reason = tail.differs(&*file, 2000).unwrap().unwrap();
        assert!(reason.contains("shorter"), "{reason}");
    }
}
