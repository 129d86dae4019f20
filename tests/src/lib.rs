//! Support code shared by the workspace's end-to-end suites in `tests/`.
//!
//! The suites themselves live in this package's `tests/` folder; they run
//! with `cargo xtask test` (part of `cargo xtask ci`), which also starts the
//! services they need.
//!
//! ```
//! assert!(etl_tests::workspace_root().join("Cargo.toml").exists());
//! ```

use std::path::{Path, PathBuf};

/// The workspace root (this package lives in its `tests/` folder).
#[must_use]
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}
