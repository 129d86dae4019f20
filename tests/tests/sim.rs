//! The whole-pipeline simulation: generated pipelines (partitions,
//! replays, assignments and revocations, transforms that keep, filter,
//! expand, reject and panic, sinks that fail, hang, time out and merge
//! batches, routes (conditions, exclusive routes, an unmatched sink, each
//! sink's own steps), dead-letter sinks that fail, exactly-once and
//! at-least-once sinks, the object-store sink over an in-memory store that
//! fails, loses and delays requests, graceful stops and crashes) run on
//! the real runtime under a paused clock, each checked after every run
//! against a model of the delivery contract. See docs/reliability.md, "The simulation".
//!
//! `cargo xtask sim --cases N --seed S` runs more cases or replays one;
//! the environment variables it sets are read here:
//!
//! * `SIM_CASES`: how many scenarios (default 48, so `cargo test` stays
//!   quick);
//! * `SIM_SEED`: the seed of the first case (default: a fixed one); case
//!   `i` runs with the seed printed for it, so a failure replays with
//!   `SIM_SEED=<that seed> SIM_CASES=1`;
//! * `SIM_ENABLE`: generator switches to turn on, comma-separated (see
//!   `Features`), or `all` (`storage_*` switches are the storage
//!   simulation's, `tests/storage_sim.rs`);
//! * `SIM_KEEP_GOING=1`: report every failing case rather than stopping
//!   at the first (each still shrunk).

#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

mod sim {
    pub mod lake;
    pub mod model;
    pub mod run;
    pub mod scenario;
    pub mod world;
}

use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

use sim::model::check;
use sim::run::{Ended, Plan, run_once};
use sim::scenario::{Features, Scenario, scenario};
use sim::world::World;

const DEFAULT_CASES: u64 = 48;
const DEFAULT_SEED: u64 = 0x5eed_0014;
/// Runs of each shrinking candidate before it counts as passing.
const SHRINK_TRIES: usize = 3;

/// Run every run of `s` on one world, checking after each.
fn simulate(s: &Scenario, features: Features) -> Result<(), String> {
    let world = World::new(s.sinks.len());
    let plans = s
        .runs
        .iter()
        .map(|end| Plan::Scripted(*end))
        .chain(std::iter::once(Plan::Recovery));
    for (i, plan) in plans.enumerate() {
        let recovery = matches!(plan, Plan::Recovery);
        {
            let mut state = world.lock();
            state.healed = recovery;
            state.panics_this_run = 0;
        }
        let ended = run_once(s, &world, plan);
        if let Some(lake) = &s.lake {
            sim::lake::observe(lake, &world);
        }
        let state = world.lock();
        check(s, &state, &ended, recovery, features)
            .map_err(|e| format!("run {i} ({plan:?}, {}): {e}", describe(&ended)))?;
    }
    Ok(())
}

fn describe(ended: &Ended) -> String {
    match ended {
        Ended::Returned(Ok(s)) => format!(
            "ended Ok: read {}, written {}, dead-lettered {}",
            s.read,
            s.written(),
            s.dead_lettered
        ),
        Ended::Returned(Err(e)) => format!("ended with error: {e}"),
        Ended::Panicked(_) => "panicked".to_owned(),
        Ended::Crashed => "crashed".to_owned(),
        Ended::Hung { .. } => "hung".to_owned(),
    }
}

/// SplitMix64: the seed of case `i` from the first seed.
fn case_seed(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&case_seed(seed, i as u64).to_le_bytes());
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
        }
        Err(_) => default,
    }
}

/// Silence the panics the scenarios script; keep every other.
fn quiet_scripted_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let scripted = info
            .payload()
            .downcast_ref::<String>()
            .is_some_and(|m| m.starts_with("sim: scripted panic"));
        if !scripted {
            default(info);
        }
    }));
}

#[test]
fn sim_generated_pipelines_keep_the_delivery_contract() {
    let cases = env_u64("SIM_CASES", DEFAULT_CASES);
    let first = env_u64("SIM_SEED", DEFAULT_SEED);
    let keep_going = std::env::var("SIM_KEEP_GOING").is_ok_and(|v| v == "1");
    let mut features = Features::DEFAULT;
    if let Ok(list) = std::env::var("SIM_ENABLE") {
        // `storage_*` switches are the storage simulation's.
        for name in list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty() && !n.starts_with("storage_"))
        {
            features.enable(name).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    quiet_scripted_panics();
    if let Ok(filter) = std::env::var("SIM_TRACE") {
        // The runtime's own log, to see how a failing case unfolds.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    eprintln!("sim: {cases} case(s) from seed {first:#x}, switches {features:?}");
    let started = std::time::Instant::now();
    let mut failures = Vec::new();
    for i in 0..cases {
        // Case 0 runs with the given seed itself, so a printed seed
        // replays with one case.
        let seed = if i == 0 { first } else { case_seed(first, i) };
        let mut runner = TestRunner::new_with_rng(
            Config {
                cases: 1,
                failure_persistence: None,
                max_shrink_iters: 256,
                // A hang costs real time per try: shrinking stops in time.
                max_shrink_time: 60_000,
                ..Config::default()
            },
            rng(seed),
        );
        // Once the case failed, each smaller candidate gets a few tries:
        // the checkpointer's thread makes some failures come and go, and
        // shrinking should not stop at the first candidate that got lucky.
        let failed = std::cell::Cell::new(false);
        let result = runner.run(&scenario(features), |s| {
            let tries = if failed.get() { SHRINK_TRIES } else { 1 };
            for _ in 0..tries {
                if let Err(e) = simulate(&s, features) {
                    failed.set(true);
                    return Err(TestCaseError::fail(e));
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => {}
            Err(TestError::Fail(reason, shrunk)) => {
                let report = format!(
                    "sim: case {i} failed (seed {seed:#x}): {reason}\n\
                     shrunk scenario:\n{shrunk:#?}\n\
                     replay: cargo xtask sim --seed {seed:#x} --cases 1{}",
                    if list_enabled(features).is_empty() {
                        String::new()
                    } else {
                        format!(" --enable {}", list_enabled(features))
                    }
                );
                eprintln!("{report}");
                failures.push(report);
                if !keep_going {
                    break;
                }
            }
            Err(TestError::Abort(reason)) => {
                panic!("sim: case {i} (seed {seed:#x}) aborted: {reason}")
            }
        }
    }
    eprintln!(
        "sim: {cases} case(s) in {:.1?}, {} failed",
        started.elapsed(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn list_enabled(f: Features) -> String {
    let on = [
        f.transform_panics,
        f.exactly_once_dead_letters,
        f.exact_poison_attribution,
        f.environment_failures,
        f.sink_outages,
        f.exactly_once_rebalances,
        f.store_outages,
    ];
    Features::NAMES
        .iter()
        .zip(on)
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(",")
}
