//! What both simulations (`sim.rs`, `storage_sim.rs`) share: reading
//! their environment variables, the seed of each case, and running cases
//! under proptest with retried shrinking and a report that replays.

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

/// Runs of each shrinking candidate before it counts as passing: some
/// failures come and go (the checkpointer's thread, a truncation from
/// another thread), and shrinking should not stop at the first
/// candidate that got lucky.
const SHRINK_TRIES: usize = 3;

/// A `u64` from the environment variable `name` (decimal or `0x` hex),
/// or `default` when it is unset. Panics on a value that is no number.
pub fn env_u64(name: &str, default: u64) -> u64 {
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

/// SplitMix64: the seed of case `i` from the first seed.
pub fn case_seed(seed: u64, i: u64) -> u64 {
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

/// How a simulation's cases run and are reported.
pub struct Cases<'a> {
    /// The simulation's name at the start of every report line.
    pub name: &'a str,
    /// The seed of case 0; case `i` runs with [`case_seed`]`(first, i)`.
    pub first: u64,
    /// How many cases.
    pub cases: u64,
    /// Report every failing case rather than stop at the first.
    pub keep_going: bool,
    /// The command that replays a case from its seed.
    pub replay: &'a dyn Fn(u64) -> String,
}

impl Cases<'_> {
    /// Run the cases of `scenarios`, each checked by `simulate` (given
    /// the scenario and the case's seed); the reports of the failing
    /// ones, each with its shrunk scenario and how to replay it.
    pub fn run<S: Strategy>(
        &self,
        scenarios: S,
        simulate: impl Fn(&S::Value, u64) -> Result<(), String>,
    ) -> Vec<String> {
        let mut failures = Vec::new();
        for i in 0..self.cases {
            // Case 0 runs with the given seed itself, so a printed seed
            // replays with one case.
            let seed = if i == 0 {
                self.first
            } else {
                case_seed(self.first, i)
            };
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
            let failed = std::cell::Cell::new(false);
            let result = runner.run(&scenarios, |s| {
                let tries = if failed.get() { SHRINK_TRIES } else { 1 };
                for _ in 0..tries {
                    if let Err(e) = simulate(&s, seed) {
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
                        "{}: case {i} failed (seed {seed:#x}): {reason}\n\
                         shrunk scenario:\n{shrunk:#?}\n\
                         replay: {}",
                        self.name,
                        (self.replay)(seed)
                    );
                    eprintln!("{report}");
                    failures.push(report);
                    if !self.keep_going {
                        break;
                    }
                }
                Err(TestError::Abort(reason)) => {
                    panic!("{}: case {i} (seed {seed:#x}) aborted: {reason}", self.name)
                }
            }
        }
        failures
    }
}
