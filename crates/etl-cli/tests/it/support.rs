//! What the suites share: the `etl` binary cargo built for this test run,
//! and the usual ways of running it.

use std::path::Path;
use std::process::{Command, Output};

/// The `etl` binary cargo built for this test run (always up to date with
/// the sources: cargo builds a package's binaries before its tests).
pub(crate) const BINARY: &str = env!("CARGO_BIN_EXE_etl");

/// `etl` logging JSON lines, which the suites read from standard error.
pub(crate) fn etl() -> Command {
    let mut cmd = Command::new(BINARY);
    cmd.arg("--log-format").arg("json");
    cmd
}

/// `etl run <config>` to its end.
pub(crate) fn run(config: &Path) -> Output {
    etl().arg("run").arg(config).output().expect("etl runs")
}
