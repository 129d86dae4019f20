//! The SIGKILL crash loop: run a pipeline, kill it at seeded random
//! moments, restart it until it finishes, then compare output with input.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng};

use crate::input::input_paths;
use crate::{Etl, PipelineToml, SinkMode, Tally, passes_filter, read_dead_letter_ids};
use etl_test_support::profile_dir;

/// A crash loop over a generated input. Build one with [`CrashLoop::new`]
/// and adjust the public fields.
#[derive(Clone, Debug)]
pub struct CrashLoop {
    /// Name in the tally.
    pub name: String,
    /// Records in the input.
    pub records: u64,
    /// Input files (partitions).
    pub files: u32,
    /// Padding bytes per record (bigger records, longer writes).
    pub pad: usize,
    /// SIGKILLs to deliver before letting a run finish.
    pub kills: u32,
    /// Each run is killed after a delay drawn from this range, in
    /// milliseconds.
    pub kill_after_ms: (u64, u64),
    /// Seeds the kill delays (and the fault injectors).
    pub seed: u64,
    /// Which sink and program.
    pub mode: SinkMode,
    /// After every kill, note whether the output ends in a torn line and
    /// check that the offset store loads (`etl offsets show`).
    pub inspect_after_kill: bool,
    /// After every kill, also leave what a crash in the middle of a write
    /// leaves on a machine that loses power: half a record at the end of
    /// the output and a half-written temporary file in the offset store.
    /// The restart must cut the one and ignore the other.
    pub tear_after_kill: bool,
    /// The pipeline (batch sizes, limits, commit interval); its paths are
    /// set by [`run`](Self::run).
    pub pipeline: PipelineToml,
}

impl CrashLoop {
    /// A loop of `records` records in one file, with `kills` kills.
    #[must_use]
    pub fn new(name: &str, mode: SinkMode, records: u64, kills: u32, seed: u64) -> Self {
        CrashLoop {
            name: name.to_owned(),
            records,
            files: 1,
            pad: 0,
            kills,
            kill_after_ms: (5, 120),
            seed,
            mode,
            inspect_after_kill: false,
            tear_after_kill: false,
            pipeline: PipelineToml::new(Path::new("."), Vec::new()),
        }
    }

    /// Generate the input in `dir`, run the loop there and tally the
    /// output. The tally is returned whether or not it keeps the contract
    /// (see [`Tally::check`]).
    ///
    /// # Errors
    ///
    /// A run failed (a non-zero exit other than by the kill), something
    /// panicked, the offset store did not load after a kill, or the output
    /// holds a torn line.
    pub fn run(&self, dir: &Path) -> Result<Tally, String> {
        let started = Instant::now();
        let input = dir.join("in.ndjson");
        crate::write_records(&input, 0..self.records, self.files, self.pad)
            .map_err(|e| format!("cannot write the input: {e}"))?;
        let fresh = PipelineToml::new(dir, input_paths(&input, self.files));
        let pipeline = PipelineToml {
            inputs: fresh.inputs,
            output: fresh.output,
            dead_letter: fresh.dead_letter,
            store: fresh.store,
            exactly_once: self.mode == SinkMode::ExactlyOnce,
            ..self.pipeline.clone()
        };
        let config = dir.join("pipeline.toml");
        pipeline
            .write(&config)
            .map_err(|e| format!("cannot write {}: {e}", config.display()))?;

        let logs = dir.join("logs");
        let config_arg = config.display().to_string();
        let (mut runner, args): (Etl, Vec<String>) = match self.mode {
            SinkMode::Faulty => (
                Etl::program(&faulty_binary(), &logs),
                vec![config_arg.clone(), self.seed.to_string()],
            ),
            SinkMode::AtLeastOnce | SinkMode::ExactlyOnce => (
                Etl::binary(&logs),
                vec!["run".to_owned(), config_arg.clone()],
            ),
        };
        let mut inspector = Etl::binary(&logs.join("offsets"));
        let mut rng = SmallRng::seed_from_u64(self.seed);
        let mut tally = Tally {
            name: self.name.clone(),
            records: self.records,
            expected: (0..self.records).filter(|id| passes_filter(*id)).count() as u64,
            kills_wanted: self.kills,
            bound_per_event: pipeline.duplicate_bound_per_event(),
            exactly_once: self.mode == SinkMode::ExactlyOnce,
            ..Tally::default()
        };
        let (lo, hi) = (
            self.kill_after_ms.0,
            self.kill_after_ms.1.max(self.kill_after_ms.0),
        );
        loop {
            let kill_after = (tally.kills < self.kills)
                .then(|| Duration::from_millis(rng.random_range(lo..=hi)));
            let end = runner
                .run_until(&args, kill_after)
                .map_err(|e| format!("run {}: {e}", runner.runs()))?;
            tally.replays += end.log.count("batch failed; replaying the partition");
            if end.log.panicked() {
                return Err(format!(
                    "run {} panicked:\n{}",
                    runner.runs(),
                    end.log.stderr
                ));
            }
            if end.killed {
                tally.kills += 1;
                if self.inspect_after_kill {
                    if ends_torn(&pipeline.output) {
                        tally.torn_tails += 1;
                    }
                    let shown = inspector
                        .run(&["offsets", "show", "--json", config_arg.as_str()])
                        .map_err(|e| e.to_string())?;
                    if shown.code != Some(0) || shown.panicked() {
                        return Err(format!(
                            "the offset store did not load after kill {}: {}",
                            tally.kills, shown.stderr
                        ));
                    }
                    tally.store_loads += 1;
                }
                if self.tear_after_kill {
                    tear(&pipeline)?;
                    tally.torn_tails += 1;
                }
                continue;
            }
            if end.log.code != Some(0) {
                return Err(format!(
                    "run {} exited with {:?}:\n{}",
                    runner.runs(),
                    end.log.code,
                    end.log.stderr
                ));
            }
            break;
        }
        tally.runs = runner.runs();

        let out = crate::read_output(&pipeline.output)?;
        let dead: HashSet<u64> = read_dead_letter_ids(&pipeline.dead_letter)?
            .into_iter()
            .collect();
        tally.lines = out.lines;
        tally.distinct = out.distinct();
        tally.duplicates = out.duplicates();
        tally.dead_lettered = dead.len() as u64;
        tally.missing = (0..self.records)
            .filter(|id| passes_filter(*id) && out.count(*id) == 0 && !dead.contains(id))
            .count() as u64;
        tally.unexpected = out
            .by_id
            .keys()
            .filter(|id| **id >= self.records || !passes_filter(**id))
            .count() as u64;
        if self.mode != SinkMode::Faulty && !dead.is_empty() {
            // Well-formed input through a healthy sink has no reason to
            // dead-letter anything.
            tally.unexpected += dead.len() as u64;
        }
        tally.elapsed = started.elapsed();
        Ok(tally)
    }
}

/// The `etl-faulty` program of this package, beside the running program
/// (tests and `etl-soak` alike live in the same profile folder).
fn faulty_binary() -> PathBuf {
    profile_dir()
        .0
        .join(format!("etl-faulty{}", std::env::consts::EXE_SUFFIX))
}

/// Leave half a record at the end of the output and a torn temporary
/// file in the offset store.
fn tear(pipeline: &PipelineToml) -> Result<(), String> {
    use std::io::Write;
    let torn = |e: std::io::Error| format!("cannot tear the output: {e}");
    // A kill can land before the run created the output's folder.
    if let Some(parent) = pipeline.output.parent() {
        std::fs::create_dir_all(parent).map_err(torn)?;
    }
    let mut out = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&pipeline.output)
        .map_err(torn)?;
    out.write_all(b"{\"id\":424242424,\"amou").map_err(torn)?;
    std::fs::create_dir_all(&pipeline.store).map_err(torn)?;
    std::fs::write(pipeline.store.join("offsets.tmp"), "etl-offsets 1\ngenera").map_err(torn)?;
    Ok(())
}

/// Whether the file ends in a partial line.
fn ends_torn(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    if f.seek(SeekFrom::End(-1)).is_err() {
        return false;
    }
    let mut last = [0u8; 1];
    f.read_exact(&mut last).is_ok() && last[0] != b'\n'
}
