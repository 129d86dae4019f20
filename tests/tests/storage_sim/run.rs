//! Running a storage scenario: each run a process on a fresh
//! current-thread tokio runtime with a paused clock, on the disk the
//! machine keeps. The file sink, the file offset store and their locks
//! are the real ones, over the simulated disk; the disk's calls return at
//! once (`Fs::blocks` is false), so they run inline on the runtime's
//! thread. The checkpointer's thread runs on the wall clock, as in the
//! pipeline simulation (see `sim/run.rs`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use etl::{FailurePolicy, Pipeline, PipelineError, Summary};
use etl_checkpoint::{CheckpointConfig, FileStore, InFlightLimits};
use etl_fs::{Fs, Mutation, SimFaults, SimFs};
use etl_sink::{
    FileSink, FileSinkConfig, FsyncPolicy, PermanentErrorPolicy, RawLinesEncoder, RetryPolicy,
    SinkDriver, SinkDriverConfig,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use etl_record::SourceId;
use etl_source::{FileSource, FileSourceConfig, LineFormat, ReplacedPolicy};

use super::inputs::{CountingSource, LINE_BYTES, PATTERN};
use super::scenario::{Alias, DiskFaults, Inputs, OutputChange, RunEnd, Scenario};
use super::world::{Excused, OUT_DIR, OUTPUT, ProcessFs, Reads, STORE_DIR, ScriptedSource, Trip};

const TICK: Duration = Duration::from_millis(5);
const PAUSE: Duration = Duration::from_micros(20);
/// The shutdown timeout of every run.
const SHUTDOWN: Duration = Duration::from_secs(2);
/// Any run must end within this (virtual time).
pub const BOUND: Duration = Duration::from_secs(600);

/// How a run ended.
#[derive(Debug)]
pub enum Ended {
    /// `Pipeline::run` returned.
    Returned(Result<Summary, PipelineError>),
    /// The sink or the store could not be opened.
    OpenFailed(String),
    /// A panic escaped `Pipeline::run`.
    Panicked(String),
    /// The process died as scripted (killed, or the power went).
    Died,
    /// It did not end within [`BOUND`] (virtual time).
    Hung,
    /// A second writer opened what the run holds through another name.
    SecondWriter(String),
    /// A record was acknowledged (below a watermark) while a power loss
    /// would have lost it.
    AckedNotDurable(String),
}

/// What one run was asked to do.
#[derive(Clone, Copy, Debug)]
pub enum Plan {
    /// Stop or die as scripted.
    Scripted(RunEnd),
    /// Heal every fault and run to the end of the input.
    Recovery,
}

/// The disk's faults for the scenario.
pub fn sim_faults(f: &DiskFaults) -> SimFaults {
    SimFaults {
        sync_fail: f.sync_fail,
        dir_sync_fail: f.dir_sync_fail,
        write_fail: f.write_fail,
        zero_lost: f.zero_lost,
        torn: f.torn,
        kept: f.kept,
        dirs_kept: f.dirs_kept,
        under: Some(PathBuf::from(if f.store_too { "/data" } else { OUT_DIR })),
    }
}

fn sink_config(s: &Scenario) -> FileSinkConfig {
    FileSinkConfig {
        fsync: s.group_commit_ms.map_or(FsyncPolicy::EveryBatch, |ms| {
            FsyncPolicy::Interval(Duration::from_millis(u64::from(ms)))
        }),
        rotate_bytes: s.rotate_bytes.map(u64::from),
        rotate_after: None,
        exactly_once: s.exactly_once,
    }
}

/// The file source's settings: every input file, raw lines, its record
/// of inputs in the offset store's folder.
fn file_config(s: &Scenario, inputs: &Inputs) -> FileSourceConfig {
    FileSourceConfig {
        name: SourceId::new("sim"),
        paths: vec![PATTERN.to_owned()],
        format: LineFormat::Lines,
        max_line_bytes: LINE_BYTES * 2,
        read_chunk_bytes: 4096,
        max_batch_records: usize::from(s.source_batch.max(1)),
        state_dir: Some(PathBuf::from(STORE_DIR)),
        on_replaced: ReplacedPolicy::ReadFromStart,
        max_open_files: usize::from(inputs.max_open_files.max(1)),
        ..FileSourceConfig::default()
    }
}

/// Open what the run holds through `alias`, a second name made for it
/// now by another program: `Some` (what opened) when that was not
/// refused.
async fn second_name(
    sim: &SimFs,
    fs: &Arc<dyn Fs>,
    alias: Alias,
    s: &Scenario,
    sink_file: &Option<(u64, u64)>,
) -> Option<String> {
    let (link, mutation, opened): (PathBuf, Mutation, PathBuf) = match alias {
        Alias::HardLink => {
            let link = PathBuf::from("/data/out/alias.ndjson");
            (
                link.clone(),
                Mutation::HardLink {
                    original: OUTPUT.into(),
                    link: link.clone(),
                },
                link,
            )
        }
        Alias::Symlink => {
            let link = PathBuf::from("/data/alias.ndjson");
            (
                link.clone(),
                Mutation::Symlink {
                    target: OUTPUT.into(),
                    link: link.clone(),
                },
                link,
            )
        }
        Alias::FolderSymlink => {
            let link = PathBuf::from("/data/out-alias");
            (
                link.clone(),
                Mutation::Symlink {
                    target: OUT_DIR.into(),
                    link: link.clone(),
                },
                link.join("records.ndjson"),
            )
        }
        Alias::StoreSymlink => {
            let link = PathBuf::from("/data/offsets-alias");
            (
                link.clone(),
                Mutation::Symlink {
                    target: STORE_DIR.into(),
                    link: link.clone(),
                },
                link,
            )
        }
    };
    // Only a second name for the file the run holds: another program may
    // have put a new file at the output's name.
    let held = fs.metadata(Path::new(OUTPUT)).ok()?.dev_ino();
    if alias != Alias::StoreSymlink && Some(held) != *sink_file {
        return None;
    }
    sim.apply(&mutation).ok()?;
    let proceeded = if alias == Alias::StoreSymlink {
        FileStore::open_in(Arc::clone(fs), &opened)
            .ok()
            .map(|_| format!("a second offset store opened {}", opened.display()))
    } else {
        FileSink::open_in(Arc::clone(fs), &opened, sink_config(s))
            .await
            .ok()
            .map(|_| {
                format!(
                    "a second file sink opened the output as {}",
                    opened.display()
                )
            })
    };
    let _ = sim.apply(&Mutation::Unlink { path: link });
    proceeded
}

async fn build(
    s: &Scenario,
    sim: &SimFs,
    fs: &Arc<dyn Fs>,
    trip: &Trip,
    reads: &Reads,
) -> Result<Pipeline, Ended> {
    let store = FileStore::open_in(Arc::clone(fs), STORE_DIR)
        .map_err(|e| Ended::OpenFailed(format!("offset store: {e}")))?;
    let sink = FileSink::open_in(Arc::clone(fs), OUTPUT, sink_config(s))
        .await
        .map_err(|e| Ended::OpenFailed(format!("file sink: {e}")))?;
    let sink_file = fs.metadata(Path::new(OUTPUT)).ok().map(|m| m.dev_ino());
    // Once another program put a new file at the output's name, that file
    // is not the one the run holds.
    for alias in s.aliases.iter().filter(|_| !trip.changed_output()) {
        if let Some(what) = second_name(sim, fs, *alias, s, &sink_file).await {
            return Err(Ended::SecondWriter(what));
        }
    }
    let driver_config = SinkDriverConfig {
        batch_max_records: usize::from(s.max_records.max(1)),
        batch_max_bytes: 1 << 20,
        linger: Duration::from_millis(u64::from(s.linger_ms)),
        concurrency: usize::from(s.in_flight.max(1)),
        channel_capacity: 8,
        retry: RetryPolicy {
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            max_elapsed: Duration::from_secs(3600),
            max_retries: Some(u32::from(s.retries)),
        },
        write_timeout: None,
        on_permanent_error: PermanentErrorPolicy::Fail,
    };
    let source_scenario = s.clone();
    let reads = reads.clone();
    let source_fs = Arc::clone(fs);
    let acked = trip.watch_acks();
    let mut builder = Pipeline::builder()
        .checkpoint(CheckpointConfig {
            commit_interval: Duration::from_secs(3600),
            revoke_deadline: Duration::from_secs(1),
            shutdown_timeout: SHUTDOWN,
            limits: InFlightLimits::default(),
        })
        .on_failure(FailurePolicy::Replay)
        .offset_store(store)
        .source_factory(move |checkpoint| {
            *acked.lock().unwrap_or_else(PoisonError::into_inner) = Some(checkpoint.clone());
            match &source_scenario.inputs {
                None => Ok(Box::new(ScriptedSource::new(
                    &source_scenario,
                    checkpoint.clone(),
                    reads.clone(),
                ))),
                Some(inputs) => Ok(Box::new(CountingSource {
                    inner: FileSource::open_in(source_fs, file_config(&source_scenario, inputs))?,
                    reads: reads.clone(),
                    checkpoint: checkpoint.clone(),
                    commit_every: source_scenario.commit_every.map(u64::from),
                    batches: 0,
                })),
            }
        });
    builder = if s.exactly_once {
        let (driver, progress) = SinkDriver::exactly_once(sink, RawLinesEncoder::new());
        builder.exactly_once_sink("file", driver.config(driver_config), progress)
    } else {
        builder.sink(
            "file",
            SinkDriver::new(sink, RawLinesEncoder::new()).config(driver_config),
        )
    };
    builder.build().map_err(|e| Ended::Returned(Err(e)))
}

async fn heartbeat() {
    loop {
        tokio::time::sleep(TICK).await;
        std::thread::sleep(PAUSE);
    }
}

/// Run the scenario's pipeline once as a new process on `sim`.
pub fn run_once(s: &Scenario, sim: &SimFs, reads: &Reads, excused: &Excused, plan: Plan) -> Ended {
    let (after, power_loss) = match plan {
        Plan::Scripted(RunEnd::Kill(n)) => (Some(n), false),
        Plan::Scripted(RunEnd::PowerLoss(n)) => (Some(n), true),
        _ => (None, false),
    };
    sim.set_faults(match plan {
        Plan::Recovery => SimFaults::default(),
        Plan::Scripted(_) => sim_faults(&s.faults),
    });
    let outside = match plan {
        Plan::Recovery => None,
        Plan::Scripted(_) => s.output_change.map(|(n, change)| (n, mutation(change))),
    };
    let trip = Trip::new(
        sim.clone(),
        after,
        power_loss,
        outside,
        excused.clone(),
        reads.clone(),
        s.inputs.is_some(),
    );
    let fs: Arc<dyn Fs> = Arc::new(ProcessFs {
        sim: sim.process(),
        trip: Arc::clone(&trip),
    });
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Ended::Panicked(format!("cannot start a runtime: {e}")),
    };
    let ended = runtime.block_on(async {
        let pipeline = match build(s, sim, &fs, &trip, reads).await {
            Ok(p) => p,
            Err(ended) => return ended,
        };
        let started = Instant::now();
        let beat = tokio::spawn(heartbeat());
        let shutdown = CancellationToken::new();
        let mut run = tokio::spawn(pipeline.run(shutdown.clone()));
        if let Plan::Scripted(RunEnd::Stop(at)) = plan {
            let token = shutdown.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(u64::from(at))).await;
                token.cancel();
            });
        }
        let ended = tokio::select! {
            joined = &mut run => match joined {
                Ok(result) => Ended::Returned(result),
                Err(e) if e.is_panic() => Ended::Panicked(panic_text(e.into_panic())),
                Err(e) => Ended::Panicked(e.to_string()),
            },
            () = trip.notify.notified() => Ended::Died,
            () = tokio::time::sleep_until(started + BOUND) => Ended::Hung,
        };
        beat.abort();
        ended
    });
    let ended = if trip.fired() && !matches!(ended, Ended::Panicked(_)) {
        Ended::Died
    } else {
        ended
    };
    let ended = match trip.violation() {
        Some(what) => Ended::AckedNotDurable(what),
        None => ended,
    };
    if !trip.fired() {
        // The process ends: what it left in the page cache stays, and
        // no thread of it touches the disk any more.
        sim.kill();
    }
    drop(runtime);
    ended
}

/// Another program's change to the active output.
fn mutation(change: OutputChange) -> Mutation {
    let path = PathBuf::from(OUTPUT);
    match change {
        OutputChange::Truncate => Mutation::Truncate { path, len: 0 },
        OutputChange::Unlink => Mutation::Unlink { path },
        OutputChange::Replace => Mutation::Replace {
            path,
            bytes: Vec::new(),
        },
        OutputChange::RenameAway => Mutation::Rename {
            from: path,
            to: PathBuf::from(format!("{OUTPUT}.moved")),
        },
    }
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The folders the operator made before the first run, durably.
pub fn prepare(sim: &SimFs) -> std::io::Result<()> {
    sim.create_dir_all(Path::new(OUT_DIR))?;
    sim.sync_dir(Path::new("/data"))?;
    sim.sync_dir(Path::new("/"))
}
