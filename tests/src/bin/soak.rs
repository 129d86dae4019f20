//! `etl-soak --minutes N [--seed S]`: the crash loop, longer and with more
//! kills. Rounds cycle through the at-least-once file sink, the
//! exactly-once file sink and the fault-injecting sink, each on two million
//! records with forty SIGKILLs, until N minutes have passed; every round's
//! tally and the totals are printed. Exit code 1 when a round breaks the
//! delivery contract. Run it with `cargo xtask soak --minutes N`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use etl_tests::{CrashLoop, SinkMode, Tally};

const RECORDS: u64 = 2_000_000;
const KILLS: u32 = 40;

fn parse(args: &[String]) -> Result<(f64, u64), String> {
    let mut minutes = 2.0;
    let mut seed = 1;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} takes a value"))?;
        match flag.as_str() {
            "--minutes" => {
                minutes = value
                    .parse()
                    .map_err(|_| format!("--minutes takes a number, got `{value}`"))?;
            }
            "--seed" => {
                seed = value
                    .parse()
                    .map_err(|_| format!("--seed takes an integer, got `{value}`"))?;
            }
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    Ok((minutes, seed))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (minutes, seed) = match parse(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}\nusage: etl-soak --minutes N [--seed S]");
            return ExitCode::from(2);
        }
    };
    let budget = Duration::from_secs_f64(minutes.max(0.0) * 60.0);
    let started = Instant::now();
    let modes = [
        ("at-least-once", SinkMode::AtLeastOnce),
        ("exactly-once", SinkMode::ExactlyOnce),
        ("faulty sink", SinkMode::Faulty),
    ];
    let mut totals: Vec<Tally> = modes
        .iter()
        .map(|(name, mode)| Tally {
            name: format!("total {name}"),
            exactly_once: *mode == SinkMode::ExactlyOnce,
            ..Tally::default()
        })
        .collect();
    let mut round: u64 = 0;
    while round == 0 || started.elapsed() < budget {
        let slot = usize::try_from(round % modes.len() as u64).unwrap_or(0);
        let (name, mode) = modes[slot];
        let round_seed = seed.wrapping_mul(1_000_003).wrapping_add(round);
        let mut crash = CrashLoop::new(
            &format!("round {round} {name} (seed {round_seed})"),
            mode,
            RECORDS,
            KILLS,
            round_seed,
        );
        crash.inspect_after_kill = true;
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => {
                eprintln!("error: cannot make a folder: {e}");
                return ExitCode::FAILURE;
            }
        };
        let tally = match crash.run(dir.path()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: round {round}: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("{tally}");
        if let Err(e) = tally.check() {
            eprintln!("error: round {round} broke the contract:\n{e}");
            return ExitCode::FAILURE;
        }
        let total = &mut totals[slot];
        let bound = total.bound_per_event.max(tally.bound_per_event);
        total.add(&tally);
        total.bound_per_event = bound;
        round += 1;
    }
    println!(
        "--- soak of {minutes} minutes (seed {seed}): {round} rounds in {:.0?}",
        started.elapsed()
    );
    for total in &totals {
        println!("{total}");
    }
    ExitCode::SUCCESS
}
