//! `cargo xtask sim`: the whole-pipeline simulation
//! (`tests/tests/sim.rs`) and the storage simulation
//! (`tests/tests/storage_sim.rs`), each with a chosen case count,
//! seed and generator switches.

use crate::Result;
use crate::cmd::Cmd;

/// Cases in `cargo xtask ci`, of each simulation.
pub(crate) const CI_CASES: u64 = 2000;
/// The seed CI starts from, so a CI run is reproducible.
pub(crate) const CI_SEED: u64 = 0x5eed_0014;
const DEFAULT_CASES: u64 = 1000;

/// What to run.
#[derive(Debug)]
pub(crate) struct Options {
    cases: u64,
    seed: Option<String>,
    enable: Option<String>,
    keep_going: bool,
}

impl Options {
    pub(crate) fn ci() -> Self {
        Options {
            cases: CI_CASES,
            seed: Some(format!("{CI_SEED:#x}")),
            enable: None,
            keep_going: false,
        }
    }

    /// `--cases N`, `--seed S` (decimal or 0x hex), `--enable a,b|all`,
    /// `--keep-going`.
    pub(crate) fn parse(args: &[String]) -> Result<Self> {
        let usage = "usage: cargo xtask sim [--cases N] [--seed S] [--enable SWITCH,...|all] [--keep-going]";
        let mut options = Options {
            cases: DEFAULT_CASES,
            seed: None,
            enable: None,
            keep_going: false,
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--cases" => {
                    let n = it.next().ok_or(usage)?;
                    options.cases = n
                        .parse()
                        .map_err(|_| format!("--cases takes a positive integer, got `{n}`"))?;
                }
                "--seed" => options.seed = Some(it.next().ok_or(usage)?.clone()),
                "--enable" => options.enable = Some(it.next().ok_or(usage)?.clone()),
                "--keep-going" => options.keep_going = true,
                other => return Err(format!("unknown argument `{other}`\n{usage}")),
            }
        }
        Ok(options)
    }
}

/// A fresh seed when none is given, from the clock.
fn fresh_seed() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:#x}", nanos as u64)
}

/// Run the simulation. The debug build `cargo xtask test` already made is
/// used (same flags), so this compiles nothing more; the cases are cheap
/// enough that release mode would not pay for its build.
pub(crate) fn run(options: &Options) -> Result {
    let seed = options.seed.clone().unwrap_or_else(fresh_seed);
    let mut cmd = Cmd::cargo(&[
        "test",
        "--workspace",
        "--all-features",
        "--locked",
        "--test",
        "sim",
        "--test",
        "storage_sim",
        "--",
        "--nocapture",
    ])
    .env("SIM_CASES", &options.cases.to_string())
    .env("SIM_SEED", &seed);
    if let Some(enable) = &options.enable {
        cmd = cmd.env("SIM_ENABLE", enable);
    }
    if options.keep_going {
        cmd = cmd.env("SIM_KEEP_GOING", "1");
    }
    cmd.run()
}
