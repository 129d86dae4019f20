//! Running a scenario: each run on a fresh current-thread tokio runtime
//! with a paused clock, on the stores the world keeps.
//!
//! Determinism: every task of the pipeline runs on the one runtime
//! thread, transforms included (`transform_workers(1)`, unless the
//! scenario asks for the parallel stage: then two worker threads run
//! them, and their timing is not fixed either), retries have no
//! jitter (no backoff), and the checkpointer's own commit interval is out
//! of reach (the source asks for commits at scripted points instead). The
//! checkpointer still runs on its own thread with the wall clock: how far
//! virtual time moves while it answers is not fixed, so a seed gives the
//! same scenario every time and, usually, the same interleaving. A
//! heartbeat task lets virtual time advance by at most [`TICK`] at once,
//! with a short real pause at each, so a wait for that thread never jumps
//! straight to a far timer, and every bound has [`SLACK`].

use std::time::Duration;

use etl::{FailurePolicy, Pipeline, PipelineError, Route, RouteMode, Summary};
use etl_checkpoint::{CheckpointConfig, InFlightLimits};
use etl_sink::{PermanentErrorPolicy, RawLinesEncoder, RetryPolicy, SinkDriver, SinkDriverConfig};
use etl_source::{PoisonPolicy, SourceDriverConfig};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lake::{JsonValues, LakeSink};
use super::scenario::{RunEnd, Scenario, When};
use super::slot::SlotSource;
use super::world::{Life, SimSink, SimSource, SimStore, SimTransform, World, hits};

/// Largest step of virtual time while the runtime waits.
const TICK: Duration = Duration::from_millis(5);
/// Real time given to the checkpointer's thread at each tick.
const PAUSE: Duration = Duration::from_micros(20);
/// Slack on every bound, for the final commit and the checkpointer's
/// thread (whose waits the virtual clock does not see).
const SLACK: Duration = Duration::from_secs(10);
/// The recovery run (every fault healed) must end within this.
pub const RECOVERY_BOUND: Duration = Duration::from_secs(600);

/// How a run ended.
#[derive(Debug)]
pub enum Ended {
    /// `Pipeline::run` returned.
    Returned(Result<Summary, PipelineError>),
    /// A panic escaped `Pipeline::run`.
    Panicked(String),
    /// The scripted crash came first.
    Crashed,
    /// It did not end within its bound (virtual time).
    Hung {
        /// The bound.
        bound: Duration,
    },
}

/// What one run was asked to do.
#[derive(Clone, Copy, Debug)]
pub enum Plan {
    /// Stop or crash as scripted.
    Scripted(RunEnd),
    /// Heal every fault and run to the end of the input.
    Recovery,
}

impl Plan {
    /// The latest virtual time the run may end at.
    pub fn bound(self, s: &Scenario) -> Duration {
        match self {
            Plan::Scripted(RunEnd::Stop(at)) => {
                // Each sink and the dead-letter sink may take the shutdown
                // timeout to drain, plus one write timeout (an attempt in
                // flight), plus slack for the last commit.
                let shutdown = Duration::from_millis(u64::from(s.shutdown_timeout_ms));
                let write = s
                    .sinks
                    .iter()
                    .map(|k| u64::from(k.timeout_ms))
                    .max()
                    .unwrap_or(0);
                Duration::from_millis(u64::from(at))
                    + shutdown * (s.sinks.len() as u32 + 1)
                    + Duration::from_millis(write)
                    + SLACK
            }
            Plan::Scripted(RunEnd::Crash(at)) => {
                Duration::from_millis(u64::from(at)) + RECOVERY_BOUND
            }
            Plan::Recovery => RECOVERY_BOUND,
        }
    }
}

/// Build the scenario's pipeline on the world's stores, for one process
/// `life`.
fn build(
    s: &Scenario,
    world: &World,
    life: &Life,
    mut lake: Option<(LakeSink, JsonValues)>,
) -> Result<Pipeline, PipelineError> {
    let parts = s.partitions.len() as u32;
    let mut builder = Pipeline::builder()
        .transform_workers(if s.parallel_transforms { 2 } else { 1 })
        .transform(SimTransform::new(s, world.clone()))
        .checkpoint(CheckpointConfig {
            // Out of reach: the source asks for commits instead.
            commit_interval: Duration::from_secs(3600),
            // The revoke deadline is wall-clock (the checkpointer's
            // thread): short, as the virtual clock runs far faster than
            // the wall clock. The stop is bounded on the virtual clock by
            // the pipeline, on the wall clock by the checkpointer.
            revoke_deadline: Duration::from_secs(1),
            shutdown_timeout: Duration::from_millis(u64::from(s.shutdown_timeout_ms)),
            limits: InFlightLimits {
                max_in_flight_batches_per_partition: u32::from(s.max_in_flight.max(1)),
                max_in_flight_bytes_per_partition: 1 << 30,
                max_in_flight_batches: u32::from(s.max_in_flight.max(1)),
                max_in_flight_bytes: 1 << 30,
            },
        })
        .source_driver(SourceDriverConfig {
            max_replays: u32::from(s.max_replays.max(1)),
            poison: if s.poison_halts {
                PoisonPolicy::Halt
            } else {
                PoisonPolicy::DeadLetter
            },
            ..SourceDriverConfig::default()
        })
        .on_failure(if s.halt_on_failure {
            FailurePolicy::Halt
        } else {
            FailurePolicy::Replay
        })
        .offset_store(SimStore {
            world: world.clone(),
            life: life.clone(),
            outage: s.store_outage,
        });
    let source_scenario = s.clone();
    let (source_world, source_life) = (world.clone(), life.clone());
    builder = builder.source_factory(move |checkpoint| {
        if source_scenario.slot.is_some() {
            return Ok(Box::new(SlotSource::new(
                &source_scenario,
                source_world.clone(),
                source_life.clone(),
                checkpoint.clone(),
            )));
        }
        Ok(Box::new(SimSource::new(
            &source_scenario,
            checkpoint.clone(),
        )))
    });
    for (index, spec) in s.sinks.iter().enumerate() {
        let sink = SimSink {
            world: world.clone(),
            life: life.clone(),
            index,
            faults: spec.faults.clone(),
            partitions: parts,
            exactly_once: s.exactly_once,
        };
        let config = SinkDriverConfig {
            batch_max_records: usize::from(spec.max_records.max(1)),
            batch_max_bytes: 1 << 20,
            linger: Duration::from_millis(u64::from(spec.linger_ms)),
            concurrency: usize::from(spec.in_flight.max(1)),
            channel_capacity: 8,
            retry: RetryPolicy {
                initial_backoff: Duration::ZERO,
                max_backoff: Duration::ZERO,
                max_elapsed: Duration::from_secs(3600),
                max_retries: Some(u32::from(spec.retries)),
            },
            write_timeout: Some(Duration::from_millis(u64::from(spec.timeout_ms.max(1)))),
            on_permanent_error: if spec.dead_letter_failures {
                PermanentErrorPolicy::DeadLetter
            } else {
                PermanentErrorPolicy::Fail
            },
        };
        let name = format!("sink{index}");
        if spec.when.is_some() || !spec.branch.is_empty() {
            let mut route = Route::new();
            if let Some(when) = spec.when {
                route = route.when(SimCondition(when));
            }
            if !spec.branch.is_empty() {
                route = route.transform(SimTransform::of(&spec.branch, parts, world.clone()));
            }
            builder = builder.route(name.clone(), route);
        }
        builder = if let Some((sink, encoder)) = lake.take() {
            // The object-store sink is sink 0, exactly-once or not.
            if s.exactly_once {
                let (driver, progress) = SinkDriver::exactly_once(sink, encoder);
                builder.exactly_once_sink(name, driver.config(config), progress)
            } else {
                builder.sink(name, SinkDriver::new(sink, encoder).config(config))
            }
        } else if s.exactly_once {
            let (driver, progress) = SinkDriver::exactly_once(sink, RawLinesEncoder::new());
            builder.exactly_once_sink(name, driver.config(config), progress)
        } else {
            builder.sink(
                name,
                SinkDriver::new(sink, RawLinesEncoder::new()).config(config),
            )
        };
    }
    if s.exclusive {
        builder = builder.route_mode(RouteMode::Exclusive);
    }
    if let Some(u) = s.unmatched {
        builder = builder.unmatched(format!("sink{u}"));
    }
    if let Some(faults) = &s.dead_letter {
        builder = builder.dead_letter(SimSink {
            world: world.clone(),
            life: life.clone(),
            index: s.sinks.len(),
            faults: faults.clone(),
            partitions: parts,
            exactly_once: false,
        });
    }
    builder.build()
}

/// A sink's condition: keeps the records it takes, filters the others,
/// rejects the one it cannot judge.
#[derive(Clone, Debug)]
struct SimCondition(When);

impl etl::Transform for SimCondition {
    fn name(&self) -> &str {
        "when"
    }

    fn apply(&mut self, record: etl_record::Record) -> etl::Outcome {
        let o = record.position.offset.0;
        if self.0.refuses.is_some_and(|r| i64::from(r) == o) {
            etl::Outcome::Reject(record, "sim: the condition cannot judge it".to_owned())
        } else if hits(o, self.0.every, self.0.at) {
            etl::Outcome::Keep(record)
        } else {
            etl::Outcome::Filtered
        }
    }

    fn fork(&self) -> Option<Box<dyn etl::Transform>> {
        Some(Box::new(self.clone()))
    }
}

/// Let virtual time move in steps of at most [`TICK`], giving the
/// checkpointer's thread a moment at each.
async fn heartbeat() {
    loop {
        tokio::time::sleep(TICK).await;
        // A short real pause per tick: virtual time cannot race ahead of
        // a checkpointer thread the machine has not scheduled yet.
        std::thread::sleep(PAUSE);
    }
}

/// Run the scenario's pipeline once, as `plan` says.
pub fn run_once(s: &Scenario, world: &World, plan: Plan) -> Ended {
    let life = Life::new();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Ended::Panicked(format!("cannot start a runtime: {e}")),
    };
    let bound = plan.bound(s);
    let ended = runtime.block_on(async {
        let lake = match &s.lake {
            // A starting process reads the sink's progress from the store.
            Some(lake) => match super::lake::open(lake, s.exactly_once, world, &life).await {
                Ok(opened) => Some(opened),
                Err(e) => {
                    return Ended::Returned(Err(PipelineError::Invalid(format!(
                        "sim: the object-store sink cannot start: {e}"
                    ))));
                }
            },
            None => None,
        };
        let pipeline = match build(s, world, &life, lake) {
            Ok(p) => p,
            Err(e) => return Ended::Returned(Err(e)),
        };
        let started = Instant::now();
        let beat = tokio::spawn(heartbeat());
        let shutdown = CancellationToken::new();
        let mut run = tokio::spawn(pipeline.run(shutdown.clone()));
        let crash_at = match plan {
            Plan::Scripted(RunEnd::Stop(at)) => {
                let token = shutdown.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(u64::from(at))).await;
                    token.cancel();
                });
                None
            }
            Plan::Scripted(RunEnd::Crash(at)) => Some(Duration::from_millis(u64::from(at))),
            Plan::Recovery => None,
        };
        let crash = async {
            match crash_at {
                Some(at) => tokio::time::sleep_until(started + at).await,
                None => std::future::pending().await,
            }
        };
        let ended = tokio::select! {
            joined = &mut run => match joined {
                Ok(result) => Ended::Returned(result),
                Err(e) if e.is_panic() => Ended::Panicked(panic_text(e.into_panic())),
                Err(e) => Ended::Panicked(e.to_string()),
            },
            () = crash => Ended::Crashed,
            () = tokio::time::sleep_until(started + bound) => Ended::Hung { bound },
        };
        beat.abort();
        ended
    });
    // Whatever did not finish dies with the process: stop the stores
    // first, then drop every task.
    life.kill();
    drop(runtime);
    ended
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
