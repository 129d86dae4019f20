//! `cargo xtask soak --minutes N [--seed S]`: the crash loop of the
//! end-to-end suite, longer and with more kills. Builds the `etl` binary
//! and the suite's programs, then runs `etl-soak`, which prints a tally
//! per round and the totals.

use crate::cmd::{Cmd, root};

/// Parse the arguments, build, run the soak.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let mut minutes = "2".to_owned();
    let mut seed = "1".to_owned();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| {
            format!("{flag} takes a value; usage: cargo xtask soak --minutes N [--seed S]")
        })?;
        match flag.as_str() {
            "--minutes" => {
                value
                    .parse::<f64>()
                    .map_err(|_| format!("--minutes takes a number, got `{value}`"))?;
                minutes.clone_from(value);
            }
            "--seed" => {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("--seed takes an integer, got `{value}`"))?;
                seed.clone_from(value);
            }
            other => {
                return Err(format!(
                    "unknown flag `{other}`; usage: cargo xtask soak --minutes N [--seed S]"
                ));
            }
        }
    }
    Cmd::cargo(&["build", "--locked", "-p", "etl-cli", "--bin", "etl"]).run()?;
    Cmd::cargo(&["build", "--locked", "-p", "etl-tests", "--bins"]).run()?;
    let soak = root().join("target").join("debug").join("etl-soak");
    eprintln!("$ {} --minutes {minutes} --seed {seed}", soak.display());
    let status = std::process::Command::new(&soak)
        .args(["--minutes", &minutes, "--seed", &seed])
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", soak.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the soak failed: {status}"))
    }
}
