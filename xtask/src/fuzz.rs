//! `cargo xtask fuzz`: the fuzz targets in `fuzz/` (cargo-fuzz and
//! libFuzzer), built once and each run for a while.
//!
//! cargo-fuzz is installed under the target directory, at a pinned
//! version, when it is not there: a fresh machine needs nothing else.
//! The targets are built without a sanitizer: the project's own unsafe
//! code is a few listed files (docs/architecture.md, "Unsafe code"), of
//! which the targets run one, `etl-json`'s SSE2 block classifier (in
//! `json_check` and `fast_paths`: a 16-byte load of a `&[u8; 16]`, whose
//! bounds its type proves, and intrinsics on registers), and the
//! instrumented build of VRL is the step's main cost, which
//! AddressSanitizer would about double; the targets' assertions and
//! panics are what is looked for, the classifier's results among them
//! (`json_check` holds the checking pass to serde_json). Without a
//! sanitizer cargo-fuzz passes only stable `-C` flags for libFuzzer's
//! coverage instrumentation; `RUSTC_BOOTSTRAP=1` is set for its commands
//! alone all the same, so that a sanitizer or another `-Z` option it
//! adds works on the stable toolchain.
//!
//! The corpus each run grows is kept under the target directory and
//! starts from the seeds in `fuzz/seeds/<target>/`; an input that fails
//! is written to `fuzz/artifacts/<target>/` and named in the output (add
//! it as a test where the failing code lives).

use std::path::{Path, PathBuf};

use crate::Result;
use crate::cmd::{Cmd, root};

/// The cargo-fuzz release installed and used.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Every target in `fuzz/fuzz_targets/`.
const TARGETS: &[&str] = &[
    "json_check",
    "ndjson_line",
    "fast_paths",
    "toml_config",
    "conninfo",
];

/// Seconds per target of a `--repeatable` run, at most.
const CI_SECONDS: u32 = 30;
/// Inputs per target of a `--repeatable` run, from a fixed seed and a
/// fresh corpus: the same inputs on every run, so a run that passed on
/// one machine passes on another, and a finding is a test that fails,
/// not a coin tossed. Longer, random runs are the default.
const CI_RUNS: u32 = 20_000;
const CI_SEED: u32 = 1;
const DEFAULT_SECONDS: u32 = 60;

/// What `cargo xtask fuzz` runs.
#[derive(Debug)]
pub(crate) struct Options {
    seconds: u32,
    only: Option<String>,
    /// A fixed number of inputs from a fixed seed, with a fresh corpus
    /// (ci); otherwise random, growing the kept corpus, for `seconds`.
    repeatable: Option<(u32, u32)>,
}

impl Options {
    /// `--repeatable`: every target, briefly, the same inputs every time.
    pub(crate) fn repeatable() -> Self {
        Options {
            seconds: CI_SECONDS,
            only: None,
            repeatable: Some((CI_RUNS, CI_SEED)),
        }
    }

    /// `--repeatable`, or `[--seconds N] [--target NAME]`.
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        if let [flag] = args
            && flag == "--repeatable"
        {
            return Ok(Options::repeatable());
        }
        let mut options = Options {
            seconds: DEFAULT_SECONDS,
            only: None,
            repeatable: None,
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(usage)?;
            match flag.as_str() {
                "--seconds" => {
                    options.seconds = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                        format!("--seconds takes a positive integer, got `{value}`")
                    })?;
                }
                "--target" if TARGETS.contains(&value.as_str()) => {
                    options.only = Some(value.clone());
                }
                "--target" => {
                    return Err(format!(
                        "no fuzz target `{value}`; the targets are {}",
                        TARGETS.join(", ")
                    ));
                }
                _ => return Err(usage()),
            }
        }
        Ok(options)
    }
}

fn usage() -> String {
    format!(
        "usage: cargo xtask fuzz --repeatable | [--seconds N] [--target {}]",
        TARGETS.join("|")
    )
}

/// The target directory cargo uses for the workspace.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from)
}

/// Where the fuzz step keeps its tools, builds and corpora.
struct Paths {
    /// `target/fuzz`.
    target: PathBuf,
    /// The pinned `cargo-fuzz`, under `target/fuzz/tools`.
    cargo_fuzz: PathBuf,
    /// cargo-fuzz's target directory.
    build_dir: String,
}

impl Paths {
    fn new() -> Self {
        let target = target_dir().join("fuzz");
        let cargo_fuzz = target.join("tools").join("bin").join("cargo-fuzz");
        let build_dir = target.join("build").to_string_lossy().into_owned();
        Paths {
            target,
            cargo_fuzz,
            build_dir,
        }
    }

    /// `cargo fuzz ARGS` with the options every command shares.
    fn fuzz(&self, command: &str, args: &[&str]) -> Cmd {
        let common = [
            "fuzz",
            command,
            "--fuzz-dir",
            "fuzz",
            "--sanitizer",
            "none",
            "--target-dir",
            &self.build_dir,
        ];
        Cmd::new(&self.cargo_fuzz.to_string_lossy(), &common)
            .args(args)
            .env("RUSTC_BOOTSTRAP", "1")
    }

    /// The install of cargo-fuzz when it is missing or another version,
    /// then the one build of every target (they share every dependency).
    fn build_commands(&self) -> Vec<Cmd> {
        let mut commands = Vec::new();
        if let Some(install) = install_command(&self.target.join("tools")) {
            commands.push(install);
        }
        commands.push(self.fuzz("build", &[]));
        commands
    }
}

/// `cargo check` of the fuzz crate and its targets, without libFuzzer's
/// instrumentation, in the workspace's target directory (the
/// dependencies it shares with the workspace are checked already): what
/// `ci` runs so that a change that breaks the targets, their manifest or
/// their lock file fails there rather than at the next fuzzing run.
pub(crate) fn check_command() -> Cmd {
    Cmd::cargo(&[
        "check",
        "--manifest-path",
        "fuzz/Cargo.toml",
        "--locked",
        "--all-targets",
    ])
    .env("CARGO_TARGET_DIR", &target_dir().to_string_lossy())
}

/// Build every target, then run each (or the one chosen) for the
/// options' seconds.
pub(crate) fn run(options: &Options) -> Result {
    let paths = Paths::new();
    for command in paths.build_commands() {
        command.run()?;
    }
    let target = &paths.target;
    let max_time = format!("-max_total_time={}", options.seconds);
    for name in TARGETS {
        if options.only.as_deref().is_some_and(|only| only != *name) {
            continue;
        }
        let corpus = target.join("corpus").join(name);
        if options.repeatable.is_some() && corpus.exists() {
            std::fs::remove_dir_all(&corpus)
                .map_err(|e| format!("cannot empty {}: {e}", corpus.display()))?;
        }
        std::fs::create_dir_all(&corpus)
            .map_err(|e| format!("cannot create {}: {e}", corpus.display()))?;
        let corpus = corpus.to_string_lossy().into_owned();
        let seeds = root().join("fuzz").join("seeds").join(name);
        let seeds = seeds.to_string_lossy().into_owned();
        let mut args = vec![*name, corpus.as_str()];
        if Path::new(&seeds).is_dir() {
            args.push(&seeds);
        }
        // A slow input (10 s) or a large heap (2 GiB) is a failure too.
        args.extend(["--", &max_time, "-timeout=10", "-rss_limit_mb=2048"]);
        let repeatable = options
            .repeatable
            .map(|(runs, seed)| [format!("-runs={runs}"), format!("-seed={seed}")]);
        if let Some(flags) = &repeatable {
            args.extend(flags.iter().map(String::as_str));
        }
        paths.fuzz("run", &args).run()?;
    }
    Ok(())
}

/// The install of `cargo-fuzz` at the pinned version under `root_dir`,
/// or `None` when it is there already.
fn install_command(root_dir: &Path) -> Option<Cmd> {
    let binary = root_dir.join("bin").join("cargo-fuzz");
    let installed = std::process::Command::new(&binary)
        .arg("--version")
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout)
                    .trim_end()
                    .ends_with(CARGO_FUZZ_VERSION)
        });
    if installed {
        return None;
    }
    let root_arg = root_dir.to_string_lossy();
    let build = root_dir.join("build");
    Some(Cmd::cargo(&[
        "install",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
        "--locked",
        "--root",
        &root_arg,
        "--target-dir",
        &build.to_string_lossy(),
    ]))
}
