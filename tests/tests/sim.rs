//! The whole-pipeline simulation: generated pipelines (partitions,
//! replays, assignments and revocations, transforms that keep, filter,
//! expand, reject and panic, sinks that fail, hang, time out and merge
//! batches, routes (conditions, exclusive routes, an unmatched sink, each
//! sink's own steps), dead-letter sinks that fail, exactly-once and
//! at-least-once sinks, the object-store sink (NDJSON or Parquet,
//! exactly-once or at-least-once) over an in-memory store that fails,
//! loses and delays requests, a source that behaves like a
//! PostgreSQL replication slot, graceful stops and crashes) run on
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

mod cases;
mod sim {
    pub mod lake;
    pub mod model;
    pub mod run;
    pub mod scenario;
    pub mod slot;
    pub mod world;
}

use cases::{Cases, env_u64};
use sim::model::check;
use sim::run::{Ended, Plan, run_once};
use sim::scenario::{Features, Scenario, scenario};
use sim::world::World;

const DEFAULT_CASES: u64 = 48;
const DEFAULT_SEED: u64 = 0x5eed_0014;

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
            sim::lake::observe(lake, s.exactly_once, &world);
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
    let replay = |seed: u64| {
        let enable = features.list();
        format!(
            "cargo xtask sim --seed {seed:#x} --cases 1{}",
            if enable.is_empty() {
                String::new()
            } else {
                format!(" --enable {enable}")
            }
        )
    };
    let failures = Cases {
        name: "sim",
        first,
        cases,
        keep_going,
        replay: &replay,
    }
    .run(scenario(features), |s, _| simulate(s, features));
    eprintln!(
        "sim: {cases} case(s) in {:.1?}, {} failed",
        started.elapsed(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
