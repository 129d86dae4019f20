//! Finding the `etl` binary, and building it when it is missing or older
//! than the sources it is built from: one way for every suite that runs
//! the command. And the runs of the suites that kill it again and again:
//! each started with its output in files of its own ([`start_run`],
//! [`run_stderr`]), waited for within a bound ([`wait_exit`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use crate::{Error, workspace_root};

/// The target profile folder this process runs from (`target/debug` for a
/// test binary in `target/debug/deps`), and whether it is a release build.
#[must_use]
pub fn profile_dir() -> (PathBuf, bool) {
    let fallback = (workspace_root().join("target").join("debug"), false);
    let Ok(exe) = std::env::current_exe() else {
        return fallback;
    };
    let mut dir = exe.parent().map(Path::to_path_buf);
    if dir.as_deref().and_then(Path::file_name) == Some("deps".as_ref()) {
        dir = dir.and_then(|d| d.parent().map(Path::to_path_buf));
    }
    match dir {
        Some(d) => {
            let release = d.file_name() == Some("release".as_ref());
            (d, release)
        }
        None => fallback,
    }
}

/// What the `etl` binary is built from: every crate under `crates/`
/// (its `src/` and `Cargo.toml`), the workspace manifest and the lock
/// file. Every crate rather than a list of the binary's own: a crate added
/// to the binary's dependencies (or a connector built into it) is watched
/// without anyone remembering to add it here; a crate the binary does not
/// use only costs a `cargo build` that finds nothing to do.
fn watched() -> Vec<PathBuf> {
    let root = workspace_root();
    let mut paths = vec![root.join("Cargo.toml"), root.join("Cargo.lock")];
    let mut crates: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    crates.sort();
    for dir in crates {
        paths.push(dir.join("src"));
        paths.push(dir.join("Cargo.toml"));
    }
    paths
}

/// The newest modification time of what the `etl` binary is built from.
fn newest_source() -> Option<SystemTime> {
    fn walk(path: &Path, newest: &mut Option<SystemTime>) {
        if path.is_dir() {
            let Ok(entries) = std::fs::read_dir(path) else {
                return;
            };
            for entry in entries.flatten() {
                walk(&entry.path(), newest);
            }
        } else if let Ok(modified) = std::fs::metadata(path).and_then(|m| m.modified()) {
            *newest = Some(newest.map_or(modified, |n| n.max(modified)));
        }
    }
    let mut newest = None;
    for path in watched() {
        walk(&path, &mut newest);
    }
    newest
}

/// The `etl` binary of the profile this process was built with.
///
/// `cargo test --workspace` builds it already. When it is missing, or older
/// than what it is built from (every crate under `crates/`: a run of only
/// this package), it is built first with `cargo build -p etl-cli` (`$CARGO`
/// if set).
///
/// # Panics
///
/// When the build fails: no suite can run without the binary.
#[must_use]
pub fn etl_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let (dir, release) = profile_dir();
            let binary = dir.join(format!("etl{}", std::env::consts::EXE_SUFFIX));
            let built = std::fs::metadata(&binary).and_then(|m| m.modified()).ok();
            let stale = match (built, newest_source()) {
                (Some(built), Some(source)) => source > built,
                (None, _) => true,
                (Some(_), None) => false,
            };
            if stale {
                let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
                let mut cmd = Command::new(cargo);
                cmd.args(["build", "-p", "etl-cli", "--bin", "etl"])
                    .current_dir(workspace_root());
                if release {
                    cmd.arg("--release");
                }
                let status = cmd.status();
                assert!(
                    status.as_ref().is_ok_and(std::process::ExitStatus::success),
                    "building the etl binary failed: {status:?}"
                );
            }
            binary
        })
        .clone()
}

/// The file run `run` in `dir` writes its standard output (`out`) or
/// error (`err`) to.
fn run_file(dir: &Path, run: u32, stream: &str) -> PathBuf {
    dir.join(format!("run-{run}.{stream}"))
}

/// Start `etl ARGS run CONFIG` ([`etl_binary`]) in `dir`, run number
/// `run` of a suite: standard input closed, standard output into
/// `dir/run-N.out`, standard error into `dir/run-N.err` (see
/// [`run_stderr`]).
///
/// # Errors
///
/// When the output files cannot be created or the command cannot start.
pub fn start_run(dir: &Path, args: &[&str], config: &Path, run: u32) -> Result<Child, Error> {
    let file = |stream: &str| {
        let path = run_file(dir, run, stream);
        std::fs::File::create(&path)
            .map_err(|e| Error(format!("cannot create {}: {e}", path.display())))
    };
    let binary = etl_binary();
    Command::new(&binary)
        .args(args)
        .arg("run")
        .arg(config)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(file("out")?)
        .stderr(file("err")?)
        .spawn()
        .map_err(|e| Error(format!("cannot start {}: {e}", binary.display())))
}

/// What run `run` of [`start_run`] in `dir` wrote to its standard error
/// so far (nothing before it exists).
#[must_use]
pub fn run_stderr(dir: &Path, run: u32) -> String {
    std::fs::read_to_string(run_file(dir, run, "err")).unwrap_or_default()
}

/// Wait for `child` to exit, at most `limit`.
///
/// # Errors
///
/// When it still runs after `limit` (it is then killed), or its state
/// cannot be read.
pub fn wait_exit(child: &mut Child, limit: Duration) -> Result<ExitStatus, Error> {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => {
                return Err(Error(format!(
                    "cannot wait for process {}: {e}",
                    child.id()
                )));
            }
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error(format!(
                "process {} still ran after {limit:?}: killed",
                child.id()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every crate under `crates/` the `etl` binary depends on, directly
    /// or not: the normal dependencies named in each manifest's
    /// `[dependencies]` tables (workspace crates are named as their
    /// folders), followed from `etl-cli`.
    fn crates_of_the_binary() -> Vec<PathBuf> {
        let crates = workspace_root().join("crates");
        let mut seen = vec![crates.join("etl-cli").join("Cargo.toml")];
        let mut next = 0;
        while next < seen.len() {
            let manifest = std::fs::read_to_string(&seen[next]).expect("a manifest reads");
            next += 1;
            let mut normal = false;
            for line in manifest.lines().map(str::trim) {
                if line.starts_with('[') {
                    normal = line == "[dependencies]"
                        || (line.starts_with("[target.") && line.ends_with(".dependencies]"));
                    continue;
                }
                let Some(name) = line.split(['=', ' ', '.']).next().filter(|_| normal) else {
                    continue;
                };
                let dep = crates.join(name).join("Cargo.toml");
                if !name.is_empty() && dep.is_file() && !seen.contains(&dep) {
                    seen.push(dep);
                }
            }
        }
        seen
    }

    #[test]
    fn a_process_past_its_bound_is_killed_and_the_wait_says_so() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let started = Instant::now();
        let waited = wait_exit(&mut child, Duration::from_millis(200));
        assert!(waited.is_err(), "{waited:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        // Killed: it has exited.
        assert!(child.try_wait().unwrap().is_some());
        let mut quick = Command::new("true").spawn().unwrap();
        assert!(
            wait_exit(&mut quick, Duration::from_secs(10))
                .unwrap()
                .success()
        );
    }

    #[test]
    fn every_crate_the_binary_is_built_from_is_watched_for_changes() {
        let watched = watched();
        let crates = crates_of_the_binary();
        assert!(crates.len() > 5, "{crates:?}");
        for manifest in crates {
            let dir = manifest.parent().expect("a manifest has a folder");
            assert!(
                watched.contains(&manifest) && watched.contains(&dir.join("src")),
                "{} is not watched: a change to it would not rebuild the etl binary",
                dir.display()
            );
        }
    }
}
