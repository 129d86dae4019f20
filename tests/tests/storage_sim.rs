//! The storage simulation: the real file sink (at-least-once and
//! exactly-once, rotation, group commit, its progress file and its cut
//! back after a failure), the real file offset store and their locks run
//! over a simulated disk (`etl_fs::SimFs`) that keeps, through a crash,
//! only what an `fsync` covered; `fsync`s and writes fail with `EIO` and
//! `ENOSPC` by seed with Linux's semantics; processes are killed (the
//! page cache survives) or the power goes (it does not) before any
//! change to the disk; second names (hard links, symlinks) are made for
//! what a run holds, and opening through them must be refused. The
//! source is a scripted one or, by seed, the real file source reading
//! input files on the same disk that another program rewrites, rotates,
//! truncates and appends to between runs (`storage_sim/inputs.rs`). After
//! every run the disk is read as the next process would read it and
//! checked against the delivery contract. See docs/reliability.md, "The
//! simulation".
//!
//! `cargo xtask sim` runs it after the pipeline simulation, with the same
//! environment variables (`SIM_CASES`, `SIM_SEED`, `SIM_KEEP_GOING`;
//! `SIM_ENABLE` switches named `storage_*` are this binary's). A failure
//! prints its seed; `SIM_SEED=<seed> SIM_CASES=1 cargo test -p etl-tests
//! --all-features --test storage_sim -- --nocapture` replays it.

#![allow(clippy::unwrap_used, missing_docs, unreachable_pub)]

mod cases;
mod storage_sim {
    pub mod inputs;
    pub mod model;
    pub mod run;
    pub mod scenario;
    pub mod world;
}

use cases::{Cases, env_u64};
use etl_fs::SimFs;

use storage_sim::inputs::Content;
use storage_sim::model::check;
use storage_sim::run::{Ended, Plan, prepare, run_once};
use storage_sim::scenario::{Features, Scenario, scenario};
use storage_sim::world::{Excused, Reads};

const DEFAULT_CASES: u64 = 48;
const DEFAULT_SEED: u64 = 0x5eed_0014;

/// Every run of `s` on one disk, checked after each.
fn simulate(s: &Scenario, seed: u64) -> Result<(), String> {
    let sim = SimFs::new(seed);
    prepare(&sim).map_err(|e| format!("cannot prepare the disk: {e}"))?;
    let reads = Reads::default();
    let excused = Excused::default();
    let plans = s
        .runs
        .iter()
        .map(|end| Plan::Scripted(*end))
        .chain(std::iter::once(Plan::Recovery));
    let mut content = match &s.inputs {
        Some(inputs) => Some(
            Content::create(&sim, &inputs.lines)
                .map_err(|e| format!("cannot write the inputs: {e}"))?,
        ),
        None => None,
    };
    for (i, plan) in plans.enumerate() {
        let change = i
            .checked_sub(1)
            .and_then(|before| s.inputs.as_ref()?.changes.get(before).copied().flatten());
        if let (Some(content), Some((file, change))) = (content.as_mut(), change) {
            content
                .change(&sim, file, change)
                .map_err(|e| format!("cannot change an input before run {i}: {e}"))?;
        }
        let recovery = matches!(plan, Plan::Recovery);
        let ended = run_once(s, &sim, &reads, &excused, plan);
        check(
            s,
            &sim,
            &reads,
            &excused,
            content.as_ref(),
            &ended,
            recovery,
        )
        .map_err(|e| format!("run {i} ({plan:?}, {}): {e}", describe(&ended)))?;
    }
    Ok(())
}

fn describe(ended: &Ended) -> String {
    match ended {
        Ended::Returned(Ok(s)) => format!("ended Ok: read {}, written {}", s.read, s.written()),
        Ended::Returned(Err(e)) => format!("ended with error: {e}"),
        Ended::OpenFailed(e) => format!("could not open: {e}"),
        Ended::Panicked(_) => "panicked".to_owned(),
        Ended::Died => "died".to_owned(),
        Ended::Hung => "hung".to_owned(),
        Ended::SecondWriter(_) => "a second writer got in".to_owned(),
        Ended::AckedNotDurable(_) => "acknowledged what was not durable".to_owned(),
    }
}

#[test]
fn storage_sim_file_components_keep_the_contract_over_a_faulty_disk() {
    let cases = env_u64("SIM_CASES", DEFAULT_CASES);
    let first = env_u64("SIM_SEED", DEFAULT_SEED);
    let keep_going = std::env::var("SIM_KEEP_GOING").is_ok_and(|v| v == "1");
    let mut features = Features::DEFAULT;
    if let Ok(list) = std::env::var("SIM_ENABLE") {
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            features.enable(name).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    if let Ok(filter) = std::env::var("SIM_TRACE") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    }
    eprintln!("storage sim: {cases} case(s) from seed {first:#x}, switches {features:?}");
    let started = std::time::Instant::now();
    let failures = run_cases(first, cases, features, keep_going);
    eprintln!(
        "storage sim: {cases} case(s) in {:.1?}, {} failed",
        started.elapsed(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Seeds whose scenarios found a hole, replayed on every run (with the
/// switches they were found with).
#[test]
fn storage_sim_regression_seeds_keep_the_contract() {
    let features = Features {
        output_changes: true,
        file_source: false,
        ..Features::DEFAULT
    };
    // An output truncated under the sink, then a failed append whose cut
    // back lengthened the file with zeros; and (the last) one whose failed
    // append landed as many bytes as were cut, so the length looked right
    // and a retry wrote over committed records.
    for seed in [
        0x9e87_c3a6_4660_f5e4,
        0x70db_d905_394d_95c1,
        0x2bf9_a0d4_d668_4679,
    ] {
        let failures = run_cases(seed, 1, features, false);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
    // An exactly-once output truncated by another program between the
    // sink's look at its length and its cut back of a failed append:
    // `set_len` filled it with zeros, and the retry appended behind them.
    // The truncation comes from another thread, so the seed found it in
    // about one run in eight under load (35 of 80, four at a time, before
    // the fix; 0 of 160 after).
    let with_file_source = Features {
        output_changes: true,
        ..Features::DEFAULT
    };
    let failures = run_cases(0x88b3_0ed4_d27d_5a16, 1, with_file_source, false);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The file source's record of inputs written into the offset store's
    // folder, whose name was not durable yet: a power loss lost both
    // while the exactly-once output kept its progress, and the input
    // rewritten in place then got the same partition id back, its first
    // records skipped as delivered.
    for seed in [0xe548_c4d5_82a8_e162, 0xb83d_80ca_dcd2_7a89] {
        let failures = run_cases(seed, 1, Features::DEFAULT, false);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}

/// Run `cases` cases from `first`; the reports of the failing ones.
fn run_cases(first: u64, cases: u64, features: Features, keep_going: bool) -> Vec<String> {
    let replay = |seed: u64| {
        let enable = features.list();
        format!(
            "SIM_SEED={seed:#x} SIM_CASES=1{} cargo test -p etl-tests --all-features \
             --test storage_sim -- --nocapture",
            if enable.is_empty() {
                String::new()
            } else {
                format!(" SIM_ENABLE={enable}")
            }
        )
    };
    Cases {
        name: "storage sim",
        first,
        cases,
        keep_going,
        replay: &replay,
    }
    .run(scenario(features), simulate)
}
