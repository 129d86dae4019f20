//! Running commands: print each one, then run it, failing on a non-zero
//! exit.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root, found from this crate's manifest directory.
pub(crate) fn root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// A command to print and run from the workspace root.
#[derive(Debug)]
pub(crate) struct Cmd {
    program: String,
    args: Vec<String>,
    envs: Vec<(String, String)>,
}

impl Cmd {
    /// `cargo` with arguments (the cargo that runs xtask, so the pinned
    /// toolchain).
    pub(crate) fn cargo(args: &[&str]) -> Self {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        Cmd {
            program: cargo,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            envs: Vec::new(),
        }
    }

    /// `program` with arguments.
    pub(crate) fn new(program: &str, args: &[&str]) -> Self {
        Cmd {
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            envs: Vec::new(),
        }
    }

    /// Append arguments.
    pub(crate) fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Set an environment variable for the command.
    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Print, then run; an error names the command and its exit status.
    pub(crate) fn run(self) -> crate::Result {
        let shown = self.to_string();
        eprintln!("$ {shown}");
        let status = Command::new(&self.program)
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .current_dir(root())
            .status()
            .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("`{shown}` failed: {status}"))
        }
    }
}

impl std::fmt::Display for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (k, v) in &self.envs {
            write!(f, "{k}={v:?} ")?;
        }
        let program = Path::new(&self.program)
            .file_name()
            .map_or(self.program.as_str(), |n| n.to_str().unwrap_or("cargo"));
        write!(f, "{program}")?;
        for a in &self.args {
            write!(f, " {a}")?;
        }
        Ok(())
    }
}
