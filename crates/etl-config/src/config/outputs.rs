//! Where the file sinks write, checked against each other and against the
//! file source's inputs: an output that is a folder, a file two outputs
//! share, or an output the source reads back (which would grow on every
//! run) is a configuration problem at the output's `path`, found by
//! `etl validate` and `etl run` alike.
//!
//! Files are told apart by what they are where they exist (device and
//! inode, so a link to an input is that input) and by their canonical
//! path otherwise, which is matched against the source's globs the way
//! the source would match it.

use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use super::checker::Checker;

/// A file output of the configuration: a `[[sinks]]` entry or the
/// `[dead_letter]` sink of `type = "file"`.
pub(super) struct FileOutput {
    /// The section it is in, for the problem.
    pub(super) section: String,
    /// The section's place in the file.
    pub(super) span: Range<usize>,
    /// The path as written (relative to the configuration's folder).
    pub(super) path: PathBuf,
    /// Whether it rotates, writing `<path>.1`, `<path>.2`... as well.
    pub(super) rotates: bool,
}

/// Report every output that cannot be written as configured; `inputs`
/// are the file source's paths and globs as written, `base` the folder
/// relative paths start from.
pub(super) fn check(ck: &mut Checker<'_>, inputs: &[String], outputs: &[FileOutput], base: &Path) {
    let mut usable: Vec<(&FileOutput, PathBuf)> = Vec::new();
    for output in outputs {
        let shown = output.path.display();
        let written = output.path.as_os_str().to_string_lossy();
        if written.is_empty() {
            ck.problem_at(
                output.span.clone(),
                "path",
                &output.section,
                "path is empty: name the output file",
            );
            continue;
        }
        let full = base.join(&output.path);
        if written.ends_with('/') || output.path.file_name().is_none() || full.is_dir() {
            ck.problem_at(
                output.span.clone(),
                "path",
                &output.section,
                format!("path {shown:?} is a folder: name the output file in it"),
            );
            continue;
        }
        if let Some((earlier, _)) = usable.iter().find(|(_, other)| same_file(&full, other)) {
            ck.problem_at(
                output.span.clone(),
                "path",
                &output.section,
                format!(
                    "path {shown:?} is also the output of {}: two sinks cannot write one file",
                    earlier.section
                ),
            );
            continue;
        }
        if let Some(input) = inputs
            .iter()
            .find(|input| reads_back(&full, output.rotates, &base.join(input)))
        {
            ck.problem_at(
                output.span.clone(),
                "path",
                &output.section,
                format!(
                    "path {shown:?} is an input of the file source (paths entry {input:?}): \
                     the sink would write into what the source reads, and the file would \
                     grow on every run"
                ),
            );
            continue;
        }
        usable.push((output, full));
    }
}

/// Whether the file source would read the output at `output` (or, when
/// it rotates, one of its rotated files) through `input`, a path or glob.
fn reads_back(output: &Path, rotates: bool, input: &Path) -> bool {
    let input_text = input.to_string_lossy();
    if !input_text.contains(['*', '?', '[']) {
        return same_file(output, input);
    }
    // A name the glob matches, whether the file exists yet or not.
    let options = glob::MatchOptions {
        // The source's glob matches one folder level per `*`, never across `/`.
        require_literal_separator: true,
        ..glob::MatchOptions::new()
    };
    let matches = |pattern: &glob::Pattern, path: &Path| {
        pattern.matches_path_with(path, options)
            || (rotates && pattern.matches_path_with(&rotated(path), options))
    };
    let canonical_glob = glob::Pattern::new(&canonical_pattern(input).to_string_lossy());
    if canonical_glob.is_ok_and(|pattern| matches(&pattern, &canonical(output))) {
        return true;
    }
    if glob::Pattern::new(&input_text).is_ok_and(|pattern| matches(&pattern, output)) {
        return true;
    }
    // A file the glob matches now that is the output under another name
    // (a link).
    std::fs::metadata(output).is_ok()
        && glob::glob(&input_text)
            .into_iter()
            .flatten()
            .flatten()
            .any(|found| same_file(output, &found))
}

/// The first rotated file of `path`.
fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// Whether `a` and `b` are one file: the same device and inode when both
/// are regular files, the same canonical path when either does not exist
/// yet. A device (`/dev/null`) is no file a run owns: two outputs may
/// share it.
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.is_file() && b.is_file() && same_inode(&a, &b),
        (Ok(existing), Err(_)) | (Err(_), Ok(existing)) if !existing.is_file() => false,
        _ => canonical(a) == canonical(b),
    }
}

#[cfg(unix)]
fn same_inode(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[cfg(not(unix))]
fn same_inode(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    false
}

/// `path` with its links and `.`/`..` resolved as far as it exists: the
/// file itself, or its folder and its name.
fn canonical(path: &Path) -> PathBuf {
    if let Ok(found) = path.canonicalize() {
        return found;
    }
    match (path.parent(), path.file_name()) {
        // A bare name is in the current folder.
        (Some(parent), Some(name)) if parent.as_os_str().is_empty() => {
            canonical(Path::new(".")).join(name)
        }
        (Some(parent), Some(name)) => canonical(parent).join(name),
        _ => lexical(path),
    }
}

/// A glob with the folders before its first pattern resolved as
/// [`canonical`] resolves a path, so that it matches canonical paths.
fn canonical_pattern(pattern: &Path) -> PathBuf {
    let literal: PathBuf = pattern
        .components()
        .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
        .collect();
    let rest: PathBuf = pattern
        .components()
        .skip(literal.components().count())
        .collect();
    if literal.as_os_str().is_empty() {
        return canonical(Path::new(".")).join(rest);
    }
    canonical(&literal).join(rest)
}

/// `path` absolute, with `.` and `..` taken out by their names alone.
fn lexical(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
    let mut out = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_matches_a_name_that_does_not_exist_yet_one_level_per_star() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let glob = dir.path().join("data/*.ndjson");
        assert!(reads_back(
            &dir.path().join("data/out.ndjson"),
            false,
            &glob
        ));
        assert!(!reads_back(
            &dir.path().join("data/x/out.ndjson"),
            false,
            &glob
        ));
        assert!(!reads_back(&dir.path().join("out.ndjson"), false, &glob));
        let rotated_only = dir.path().join("data/out.ndjson.*");
        assert!(!reads_back(
            &dir.path().join("data/out.ndjson"),
            false,
            &rotated_only
        ));
        assert!(reads_back(
            &dir.path().join("data/out.ndjson"),
            true,
            &rotated_only
        ));
    }

    #[test]
    fn spellings_of_one_missing_file_are_one_file() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let a = dir.path().join("x/../out.ndjson");
        let b = dir.path().join("./out.ndjson");
        assert!(same_file(&a, &b));
        assert!(!same_file(&a, &dir.path().join("other.ndjson")));
        // A device is shared, not owned.
        assert!(!same_file(Path::new("/dev/null"), Path::new("/dev/null")));
    }
}
