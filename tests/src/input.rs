//! Generated inputs: NDJSON records with a unique `id`, an `amount` the
//! suites filter on, and optional padding to make records (and so sink
//! writes) larger.

use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The `amount` of record `id`.
fn amount(id: u64) -> u64 {
    id % 100
}

/// Whether record `id` passes the suites' filter (`amount >= 10`): nine
/// records in ten do.
#[must_use]
pub fn passes_filter(id: u64) -> bool {
    amount(id) >= 10
}

/// Write the records with ids in `ids` round-robin over `files` NDJSON
/// files: `path` itself when `files` is 1, else `path` with `.0`, `.1`, ...
/// before its extension. Each record is `{"id":N,"amount":N%100,"pad":"..."}`
/// with `pad` bytes of padding. Returns how many records were written.
///
/// # Errors
///
/// A file cannot be created or written.
pub fn write_records(path: &Path, ids: Range<u64>, files: u32, pad: usize) -> std::io::Result<u64> {
    let files = files.max(1);
    let paths = input_paths(path, files);
    let mut writers = Vec::with_capacity(paths.len());
    for p in &paths {
        writers.push(BufWriter::with_capacity(1 << 20, std::fs::File::create(p)?));
    }
    let padding = "x".repeat(pad);
    let mut written = 0;
    for id in ids {
        let slot = usize::try_from(id % u64::from(files)).unwrap_or(0);
        let out = &mut writers[slot];
        writeln!(
            out,
            "{{\"id\":{id},\"amount\":{},\"pad\":\"{padding}\"}}",
            amount(id)
        )?;
        written += 1;
    }
    for mut w in writers {
        w.flush()?;
        w.get_ref().sync_all()?;
    }
    Ok(written)
}

/// The files [`write_records`] writes for `path` and `files`.
pub(crate) fn input_paths(path: &Path, files: u32) -> Vec<PathBuf> {
    if files <= 1 {
        return vec![path.to_path_buf()];
    }
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(String::new, |e| format!(".{}", e.to_string_lossy()));
    (0..files)
        .map(|i| path.with_file_name(format!("{stem}.{i}{ext}")))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn records_spread_over_files_and_nine_in_ten_pass() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.ndjson");
        assert_eq!(write_records(&path, 0..1000, 3, 4).unwrap(), 1000);
        let paths = input_paths(&path, 3);
        let lines: usize = paths
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap().lines().count())
            .sum();
        assert_eq!(lines, 1000);
        assert_eq!((0..1000).filter(|id| passes_filter(*id)).count(), 900);
        let first = std::fs::read_to_string(&paths[1]).unwrap();
        assert!(first.starts_with("{\"id\":1,\"amount\":1,\"pad\":\"xxxx\"}\n"));
    }
}
