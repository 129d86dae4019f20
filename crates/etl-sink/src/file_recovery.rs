//! The recovery point of an at-least-once file sink: how much of the
//! active file is known durable, and how the rest is checked on open.
//!
//! A crash that loses the page cache leaves, after the last `fsync`,
//! whatever part of the unsynced appends reached the disk: whole writes,
//! torn ones, and lost blocks between them that read back as zeros. None
//! of those bytes was acknowledged, but without progress stored with the
//! data (exactly-once mode) the sink cannot know where acknowledged bytes
//! end. So it keeps a lower bound, the recovery point
//! (`<canonical path>.recovery`, beside the file written whatever name a
//! run gives it, with the file's device and inode), and an invariant: every acknowledged byte past
//! the recovery point is free of NUL bytes and ends in a line break. On
//! open, the lines from the recovery point on are checked, and the file
//! is cut at the first line holding a NUL byte, or at a partial last line.
//!
//! The point is written only when needed: on open (when the file is not
//! already at it), at rotation (a new active file), after an `fsync` that
//! covered a NUL byte past it (before the write is acknowledged: such
//! bytes could not be told from damage), and once the file has grown
//! [`SCAN_LIMIT`] past it (to bound the check). NDJSON never holds a raw
//! NUL byte, so an NDJSON output stores its point at open, at rotation
//! and every 64 MiB; an output of raw values holding NUL bytes stores it
//! with every `fsync` that covers one.

use std::io;
use std::path::{Path, PathBuf};

use etl_fs::{FileHandle, Fs};

use crate::SinkError;
use crate::file_progress::{parent_dir, replace_atomically, suffixed, sync_dir};

/// Bytes an output may grow past its recovery point before the point is
/// stored again: what the check on open reads at most (besides the bytes
/// appended after the last `fsync`).
pub(crate) const SCAN_LIMIT: u64 = 64 << 20;

/// What `<path>.recovery` records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecoveryPoint {
    /// The active file the point is about: its device and inode. A file
    /// that is not this one (a rotation not yet recorded) has no point.
    pub(crate) dev: u64,
    pub(crate) ino: u64,
    /// Finished segments when the point was stored: numbering goes on
    /// from here even when they were all moved away.
    pub(crate) segments: u64,
    /// How much of the active file a successful `fsync` covered.
    pub(crate) length: u64,
}

/// `<path>.recovery`.
pub(crate) fn recovery_path(path: &Path) -> PathBuf {
    suffixed(path, "recovery")
}

/// Store `point` for the output at `path`, atomically and durably.
pub(crate) fn write_point(
    fs: &dyn Fs,
    path: &Path,
    point: &RecoveryPoint,
) -> Result<(), SinkError> {
    let doc = serde_json::json!({
        "version": 1,
        "dev": point.dev,
        "ino": point.ino,
        "segments": point.segments,
        "length": point.length,
    });
    replace_atomically(fs, &recovery_path(path), doc.to_string().as_bytes())
}

/// The recovery point of the output at `path`, if there is one.
pub(crate) fn read_point(fs: &dyn Fs, path: &Path) -> Result<Option<RecoveryPoint>, SinkError> {
    let target = recovery_path(path);
    let text = match fs.read(&target) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SinkError::io("read", &target, e)),
    };
    let corrupt = |reason: String| SinkError::CorruptProgress {
        path: target.clone(),
        reason: format!(
            "{reason} (it is written atomically: another program changed it; removing it makes \
             the next run keep every complete line of the output)"
        ),
    };
    let doc: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| corrupt(format!("not JSON: {e}")))?;
    if doc["version"] != 1 {
        return Err(corrupt("unknown version".to_owned()));
    }
    let field = |name: &str| {
        doc[name]
            .as_u64()
            .ok_or_else(|| corrupt(format!("missing {name}")))
    };
    Ok(Some(RecoveryPoint {
        dev: field("dev")?,
        ino: field("ino")?,
        segments: field("segments")?,
        length: field("length")?,
    }))
}

/// Remove the recovery point of `path`, if any: an exactly-once run does
/// not keep it, and a later at-least-once run must not trust it.
pub(crate) fn forget_point(fs: &dyn Fs, path: &Path) -> Result<(), SinkError> {
    let point = recovery_path(path);
    match fs.remove_file(&point) {
        Ok(()) => sync_dir(fs, parent_dir(&point)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SinkError::io("remove", &point, e)),
    }
}

/// Where the lines of `file` from `from` (the start of a line) to `len`
/// stop being whole: the start of the first line holding a NUL byte, or
/// of a last line with no line break; `len` when there is neither.
pub(crate) fn undamaged_prefix(
    file: &dyn FileHandle,
    from: u64,
    len: u64,
    path: &Path,
) -> Result<u64, SinkError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut line_start = from;
    let mut at = from;
    while at < len {
        let n = usize::try_from(len - at).map_or(buf.len(), |left| left.min(buf.len()));
        let chunk = &mut buf[..n];
        read_exact_at(file, chunk, at).map_err(|e| SinkError::io("read", path, e))?;
        let mut i = 0;
        while let Some(j) = memchr::memchr2(0, b'\n', &chunk[i..]) {
            let k = i + j;
            if chunk[k] == 0 {
                return Ok(line_start);
            }
            line_start = at + k as u64 + 1;
            i = k + 1;
        }
        at += n as u64;
    }
    Ok(line_start)
}

/// Length of the longest prefix of `file` that ends with a line break.
pub(crate) fn complete_prefix(
    file: &dyn FileHandle,
    len: u64,
    path: &Path,
) -> Result<u64, SinkError> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = usize::try_from(end - start).unwrap_or(buf.len());
        read_exact_at(file, &mut buf[..n], start).map_err(|e| SinkError::io("read", path, e))?;
        if let Some(i) = buf[..n].iter().rposition(|&b| b == b'\n') {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Cut `file` back to `to` bytes, never lengthening it. `set_len` fills
/// a file shorter than `to` with zeros, and another program may truncate
/// the file between any look at its length and the cut (no call cuts
/// only a longer file). So the byte before `to` is read before the cut
/// and again after it: a file that was already shorter, or whose byte
/// turned to zero, was truncated under the sink. Then the zeros the cut
/// filled in are taken back off (down to the last byte that is not
/// zero), so the file is never longer than what it holds, and `false` is
/// returned. A truncation is missed only when the byte before `to` was a
/// zero already (raw output ending in a NUL byte).
pub(crate) fn cut_back(file: &dyn FileHandle, to: u64) -> io::Result<bool> {
    if to == 0 {
        file.set_len(0)?;
        return Ok(true);
    }
    let mut before = [0u8];
    if file.read_at(&mut before, to - 1)? == 0 {
        return Ok(false);
    }
    file.set_len(to)?;
    let mut after = [0u8];
    if file.read_at(&mut after, to - 1)? == 1 && after == before {
        return Ok(true);
    }
    let mut end = file.metadata()?.len().min(to);
    let mut buf = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let n = usize::try_from(end - start).unwrap_or(buf.len());
        read_exact_at(file, &mut buf[..n], start)?;
        match buf[..n].iter().rposition(|&b| b != 0) {
            Some(i) => {
                end = start + i as u64 + 1;
                break;
            }
            None => end = start,
        }
    }
    file.set_len(end)?;
    Ok(false)
}

/// Cut `file` (at `path`) back to `len` on open, durably; never lengthen
/// it (see [`cut_back`]): a file another program truncated meanwhile is
/// lost output.
pub(crate) fn truncate(file: &dyn FileHandle, len: u64, path: &Path) -> Result<(), SinkError> {
    let cut = cut_back(file, len).map_err(|e| SinkError::io("truncate", path, e))?;
    file.sync_all()
        .map_err(|e| SinkError::io("truncate", path, e))?;
    if cut {
        Ok(())
    } else {
        Err(SinkError::OutputLost {
            path: path.to_owned(),
            what: format!(
                "was truncated by another program while the sink cut it back to {len} bytes"
            ),
        })
    }
}

/// Fill `buf` from `at`.
fn read_exact_at(file: &dyn FileHandle, mut buf: &mut [u8], mut at: u64) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(buf, at) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                buf = &mut buf[n..];
                at += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_fs::{OpenOptions, SimFs};
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> (SimFs, Box<dyn FileHandle>) {
        let sim = SimFs::new(0);
        let path = Path::new("/f");
        let options = OpenOptions::new().read(true).append(true).create(true);
        let mut file = sim.open(path, &options).unwrap();
        file.write_all(bytes).unwrap();
        (sim, file)
    }

    #[test]
    fn the_check_stops_at_the_first_line_with_a_nul_byte_or_a_partial_last_line() {
        let cases: [(&[u8], u64, u64); 7] = [
            (b"", 0, 0),
            (b"a\nb\n", 0, 4),
            (b"a\nb", 0, 2),
            (b"a\n\0\0\0b\n", 0, 2),
            (b"a\nb\0\0\nc\n", 0, 2),
            // Below the recovery point, nothing is checked.
            (b"a\0\nb\n", 3, 5),
            (b"a\0\nb\nc\0", 3, 5),
        ];
        for (bytes, from, expected) in cases {
            let (_sim, file) = file_with(bytes);
            let len = bytes.len() as u64;
            assert_eq!(
                undamaged_prefix(&*file, from, len, Path::new("/f")).unwrap(),
                expected,
                "{:?} from {from}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn the_check_reads_past_its_buffer() {
        let mut bytes = b"{\"a\":1}\n".repeat(20_000);
        let good = bytes.len() as u64;
        bytes.extend_from_slice(b"{\"a\":");
        bytes.extend_from_slice(&[0; 9000]);
        bytes.extend_from_slice(b"1}\n{\"a\":2}\n");
        let (_sim, file) = file_with(&bytes);
        let len = bytes.len() as u64;
        assert_eq!(
            undamaged_prefix(&*file, 0, len, Path::new("/f")).unwrap(),
            good
        );
    }

    #[test]
    fn a_point_round_trips_and_a_changed_one_is_refused() {
        let sim = SimFs::new(0);
        let path = Path::new("/out.ndjson");
        assert_eq!(read_point(&sim, path).unwrap(), None);
        let point = RecoveryPoint {
            dev: 1,
            ino: 2,
            segments: 3,
            length: 4,
        };
        write_point(&sim, path, &point).unwrap();
        assert_eq!(read_point(&sim, path).unwrap(), Some(point));
        let mut f = sim
            .open(
                &recovery_path(path),
                &OpenOptions::new().write(true).truncate(true),
            )
            .unwrap();
        f.write_all(b"{\"version\":1,\"dev\":1}").unwrap();
        let err = read_point(&sim, path).unwrap_err();
        assert!(matches!(err, SinkError::CorruptProgress { .. }), "{err}");
    }
}
