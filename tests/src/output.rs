//! Reading a sink's output back, by record `id`: every line must parse
//! (a torn line is a failure), and every record is counted.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

/// One output line: only the `id` is kept, but the whole line must be
/// valid JSON to parse.
#[derive(Deserialize)]
struct Line {
    id: u64,
}

/// Output lines counted by record `id`.
#[derive(Clone, Debug, Default)]
pub struct OutputCount {
    /// Lines in the output.
    pub lines: u64,
    /// How often each `id` was written.
    pub by_id: HashMap<u64, u32>,
}

impl OutputCount {
    /// Distinct ids written.
    #[must_use]
    pub fn distinct(&self) -> u64 {
        self.by_id.len() as u64
    }

    /// Lines beyond the first of each id.
    #[must_use]
    pub fn duplicates(&self) -> u64 {
        self.lines - self.distinct()
    }

    /// How often `id` was written.
    #[must_use]
    pub fn count(&self, id: u64) -> u32 {
        self.by_id.get(&id).copied().unwrap_or(0)
    }
}

/// Count the NDJSON output at `path` by `id` (a missing file is empty).
///
/// # Errors
///
/// A line is not a JSON object with a numeric `id` (a torn or foreign
/// record), or the file ends without a newline; the error names the line.
pub fn read_output(path: &Path) -> Result<OutputCount, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if bytes.last().is_some_and(|b| *b != b'\n') {
        return Err(format!("{} ends in a torn line", path.display()));
    }
    let mut count = OutputCount::default();
    for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let parsed: Line = serde_json::from_slice(line).map_err(|e| {
            format!(
                "{} line {}: not a record ({e}): {}",
                path.display(),
                n + 1,
                String::from_utf8_lossy(&line[..line.len().min(120)])
            )
        })?;
        count.lines += 1;
        *count.by_id.entry(parsed.id).or_default() += 1;
    }
    Ok(count)
}

/// The `id`s of the records in a dead-letter file (whose lines carry the
/// record's original value as a string); values that are not records
/// with an `id` (bad input) are skipped.
///
/// # Errors
///
/// A line of the dead-letter file itself does not parse.
pub fn read_dead_letter_ids(path: &Path) -> Result<Vec<u64>, String> {
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut ids = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let letter: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| format!("{} line {}: {e}", path.display(), n + 1))?;
        let id = letter["value"]
            .as_str()
            .and_then(|v| serde_json::from_str::<Line>(v).ok())
            .map(|l| l.id);
        ids.extend(id);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn counts_by_id_and_rejects_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.ndjson");
        std::fs::write(&path, "{\"id\":1}\n{\"id\":2,\"x\":[1]}\n{\"id\":1}\n").unwrap();
        let count = read_output(&path).unwrap();
        assert_eq!(
            (count.lines, count.distinct(), count.duplicates()),
            (3, 2, 1)
        );
        assert_eq!(count.count(1), 2);

        std::fs::write(&path, "{\"id\":1}\n{\"id\":2,\"x\n").unwrap();
        assert!(read_output(&path).unwrap_err().contains("line 2"));
        std::fs::write(&path, "{\"id\":1}\n{\"id\"").unwrap();
        assert!(read_output(&path).unwrap_err().contains("torn"));
    }

    #[test]
    fn dead_letters_give_back_their_record_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.ndjson");
        std::fs::write(
            &path,
            "{\"key\":\"f/1/0\",\"value\":\"{\\\"id\\\":7}\"}\n{\"key\":\"f/1/9\",\"value\":\"oops\"}\n",
        )
        .unwrap();
        assert_eq!(read_dead_letter_ids(&path).unwrap(), vec![7]);
    }
}
