//! Finding the `etl` binary, and building it when it is missing or older
//! than the sources it is built from.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

/// The workspace root (this package lives in its `tests/` folder).
#[must_use]
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// The target profile folder this process runs from (`target/debug` for a
/// test binary in `target/debug/deps`), and whether it is a release build.
pub(crate) fn profile_dir() -> (PathBuf, bool) {
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

/// The newest modification time of the `etl` crates' sources.
fn newest_source() -> Option<SystemTime> {
    fn walk(path: &Path, newest: &mut Option<SystemTime>) {
        if path.is_dir() {
            let Ok(entries) = std::fs::read_dir(path) else {
                return;
            };
            for entry in entries.flatten() {
                walk(&entry.path(), newest);
            }
        } else if path.extension().is_some_and(|e| e == "rs" || e == "toml")
            && let Ok(modified) = std::fs::metadata(path).and_then(|m| m.modified())
        {
            *newest = Some(newest.map_or(modified, |n| n.max(modified)));
        }
    }
    let mut newest = None;
    let crates = workspace_root().join("crates");
    for name in [
        "etl-cli",
        "etl",
        "etl-record",
        "etl-ack",
        "etl-checkpoint",
        "etl-source",
        "etl-sink",
        "etl-kafka",
        "etl-postgres",
        "etl-postgres-cdc",
    ] {
        walk(&crates.join(name).join("src"), &mut newest);
        walk(&crates.join(name).join("Cargo.toml"), &mut newest);
    }
    newest
}

/// The `etl` binary of the profile this process was built with.
///
/// `cargo test --workspace` builds it already. When it is missing, or older
/// than the sources of the crates it is built from (a run of only this
/// package), it is built first with `cargo build -p etl-cli` (`$CARGO` if set).
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
