//! Glob patterns of the file source's inputs, expanded against an
//! [`Fs`]: each component of a pattern is matched with
//! [`glob::Pattern`] against the names [`Fs::read_dir`] lists, so a
//! simulated disk sees the same files the real one would.
//!
//! The matching is the `glob` crate's with its default options (`*`
//! matches a leading dot, case matters, `**` alone in a component matches
//! any number of folders); a component without wildcards is looked up
//! rather than listed.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use etl_fs::Fs;
use glob::{MatchOptions, Pattern};

use crate::SourceError;

/// Whether `input` is a pattern rather than a plain path.
pub(crate) fn is_pattern(input: &str) -> bool {
    input.contains(['*', '?', '['])
}

/// One component of a pattern.
enum Part {
    /// A name, looked up as it is.
    Literal(OsString),
    /// `**`: this folder and every folder below it.
    Recursive,
    /// A pattern matched against a folder's names.
    Wild(Pattern),
}

/// The paths on `fs` that `pattern` matches (files, folders and others),
/// in no particular order.
///
/// # Errors
///
/// As [`expand_each`].
#[cfg(test)]
pub(crate) fn expand(fs: &dyn Fs, pattern: &str) -> Result<Vec<PathBuf>, SourceError> {
    let mut found = Vec::new();
    expand_each(fs, pattern, |path| {
        found.push(path);
        Ok(())
    })?;
    Ok(found)
}

/// Hand each path on `fs` that `pattern` matches (files, folders and
/// others) to `each`, in no particular order, as its last component is
/// matched: the full paths of a folder of many files are never all held
/// at once (`each` keeps what it needs of each, and the path it was given
/// is freed before the next one is made; a folder's entry names are
/// listed whole first).
///
/// # Errors
///
/// [`SourceError::Pattern`] for a bad pattern, [`SourceError::Io`] for a
/// folder the pattern reaches that cannot be listed, and the first error
/// `each` returns.
pub(crate) fn expand_each(
    fs: &dyn Fs,
    pattern: &str,
    mut each: impl FnMut(PathBuf) -> Result<(), SourceError>,
) -> Result<(), SourceError> {
    let bad = |e: glob::PatternError| SourceError::Pattern {
        pattern: pattern.to_owned(),
        reason: e.to_string(),
    };
    Pattern::new(pattern).map_err(bad)?;
    let absolute = Path::new(pattern).has_root();
    let mut parts = Vec::new();
    for component in pattern.split(std::path::is_separator) {
        if component.is_empty() {
            continue;
        }
        parts.push(if component == "**" {
            Part::Recursive
        } else if is_pattern(component) {
            Part::Wild(Pattern::new(component).map_err(bad)?)
        } else {
            Part::Literal(component.into())
        });
    }
    let mut found = vec![if absolute {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    }];
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let mut next = Vec::new();
        // The last component's matches go to `each` as they are found;
        // the folders of the others are kept for the next component.
        let mut emit = |path: PathBuf| {
            if last {
                each(path)
            } else {
                next.push(path);
                Ok(())
            }
        };
        for at in &found {
            match part {
                Part::Literal(name) => {
                    let path = at.join(name);
                    if fs.symlink_metadata(&path).is_ok() {
                        emit(path)?;
                    }
                }
                Part::Recursive => {
                    let mut folders = Vec::new();
                    folders_below(fs, at, &mut folders)?;
                    for folder in folders {
                        emit(folder)?;
                    }
                }
                Part::Wild(pattern) => {
                    for name in list(fs, at)? {
                        if name
                            .to_str()
                            .is_some_and(|n| pattern.matches_with(n, MatchOptions::new()))
                        {
                            emit(at.join(name))?;
                        }
                    }
                }
            }
        }
        if last {
            return Ok(());
        }
        next.retain(|p| is_dir(fs, p));
        found = next;
    }
    // A pattern of no components (`/`): the root, or the current folder.
    found.into_iter().try_for_each(each)
}

fn dir_or_cwd(at: &Path) -> &Path {
    if at.as_os_str().is_empty() {
        Path::new(".")
    } else {
        at
    }
}

fn is_dir(fs: &dyn Fs, at: &Path) -> bool {
    fs.metadata(dir_or_cwd(at)).is_ok_and(|m| m.is_dir())
}

/// The names in folder `at`; none when it is not a folder (any more).
fn list(fs: &dyn Fs, at: &Path) -> Result<Vec<OsString>, SourceError> {
    match fs.read_dir(dir_or_cwd(at)) {
        Ok(names) => Ok(names),
        // Removed or replaced since it was found: nothing to match.
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            Ok(Vec::new())
        }
        Err(e) => Err(SourceError::io(dir_or_cwd(at), e)),
    }
}

/// `at` and every folder below it, symlinks to folders followed, each
/// folder (by device and inode) once, so a link back up ends the walk.
fn folders_below(fs: &dyn Fs, at: &Path, out: &mut Vec<PathBuf>) -> Result<(), SourceError> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![at.to_owned()];
    while let Some(dir) = todo.pop() {
        let Ok(meta) = fs.metadata(dir_or_cwd(&dir)) else {
            continue;
        };
        if !meta.is_dir() || !seen.insert(meta.dev_ino()) {
            continue;
        }
        for name in list(fs, &dir)? {
            todo.push(dir.join(name));
        }
        out.push(dir);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use etl_fs::SimFs;

    use super::*;

    fn disk(files: &[&str]) -> SimFs {
        let sim = SimFs::new(1);
        for f in files {
            let path = Path::new(f);
            sim.create_dir_all(path.parent().unwrap()).unwrap();
            sim.write(path, b"{}\n").unwrap();
        }
        sim
    }

    fn sorted(fs: &dyn Fs, pattern: &str) -> Vec<String> {
        let mut found: Vec<String> = expand(fs, pattern)
            .unwrap()
            .into_iter()
            .map(|p| p.display().to_string())
            .collect();
        found.sort();
        found
    }

    #[test]
    fn patterns_match_the_names_the_file_system_lists() {
        let sim = disk(&[
            "/logs/a.ndjson",
            "/logs/b.ndjson",
            "/logs/.hidden.ndjson",
            "/logs/c.txt",
            "/logs/2024/d.ndjson",
            "/logs/2024/01/e.ndjson",
            "/other/f.ndjson",
        ]);
        assert_eq!(
            sorted(&sim, "/logs/*.ndjson"),
            ["/logs/.hidden.ndjson", "/logs/a.ndjson", "/logs/b.ndjson"]
        );
        assert_eq!(
            sorted(&sim, "/logs/[ab].ndjson"),
            ["/logs/a.ndjson", "/logs/b.ndjson"]
        );
        assert_eq!(
            sorted(&sim, "/*/?.ndjson"),
            ["/logs/a.ndjson", "/logs/b.ndjson", "/other/f.ndjson"]
        );
        assert_eq!(
            sorted(&sim, "/logs/**/?.ndjson"),
            [
                "/logs/2024/01/e.ndjson",
                "/logs/2024/d.ndjson",
                "/logs/a.ndjson",
                "/logs/b.ndjson"
            ]
        );
        assert_eq!(
            sorted(&sim, "/logs/2024/*"),
            ["/logs/2024/01", "/logs/2024/d.ndjson"]
        );
        assert!(sorted(&sim, "/missing/*.ndjson").is_empty());
        assert!(sorted(&sim, "/logs/a.ndjson/*").is_empty());
    }

    #[test]
    fn a_symlink_loop_under_a_recursive_pattern_ends() {
        let sim = disk(&["/d/x.log"]);
        sim.symlink(Path::new("/d"), Path::new("/d/up")).unwrap();
        assert_eq!(sorted(&sim, "/d/**/*.log"), ["/d/x.log"]);
    }

    #[test]
    fn a_bad_pattern_is_refused_as_the_glob_crate_refuses_it() {
        let sim = SimFs::new(1);
        for pattern in ["[", "/a/**b/*"] {
            let ours = expand(&sim, pattern).unwrap_err();
            let theirs = glob::glob(pattern).unwrap_err();
            assert!(
                matches!(&ours, SourceError::Pattern { reason, .. } if *reason == theirs.to_string()),
                "{ours}"
            );
        }
    }
}
