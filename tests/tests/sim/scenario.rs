//! What a simulated pipeline is made of, and how scenarios are generated.
//!
//! A [`Scenario`] is plain data (partitions, source script, transform
//! steps, sinks with their faults, the runs and how each ends), so
//! proptest shrinks it field by field to a small, readable counterexample.

use proptest::collection::{btree_set, vec};
use proptest::prelude::*;

/// Generator switches. Each one that is off by default turns on a part of
/// the generator that finds a hole of issue 14 which is not closed on
/// this branch yet: switch it on once the fix is in (and make it the
/// default then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Transforms that panic on a record (once). Finds hole 1: a
    /// panicking transform lets the batches still queued for the stage
    /// resolve *Delivered*, so other partitions commit past records no
    /// sink wrote (`crates/etl/src/runtime/ordered.rs`).
    pub transform_panics: bool,
    /// Exactly-once sinks in pipelines that also dead-letter records
    /// (transform and source rejects). Finds hole 2: the exactly-once
    /// sink's stored progress moves past records whose dead letter is not
    /// durable yet.
    pub exactly_once_dead_letters: bool,
    /// Sinks that fail every write holding one given record, and the
    /// exact poison check (a record dead-lettered as poison failed a write
    /// on its own). Finds hole 3: the sink driver merges single-record
    /// probes and blames the lowest record of a failed merge.
    pub exact_poison_attribution: bool,
    /// Sinks that fail every write from some call on (an environment
    /// error: broken pipe, read-only file). Finds hole 4: such failures
    /// are treated as poison, and every healthy record is dead-lettered.
    pub environment_failures: bool,
    /// Sinks whose writes all hang for a stretch (an outage, each attempt
    /// ended by the write timeout, up to 1 s, retried up to 6 times, with
    /// up to 64 batches in flight), and a dead-letter sink
    /// whose write hangs (its driver has no write timeout), across a
    /// graceful stop. Finds hole 5: the stop waits with no deadline for a
    /// stage blocked on a full sink or dead-letter channel.
    pub sink_outages: bool,
    /// Revocations and reassignments in exactly-once pipelines. Finds
    /// hole 10: a reassigned partition is sought to the sink's progress
    /// as read when the pipeline was built, not as stored now, and
    /// records written since are written again.
    pub exactly_once_rebalances: bool,
    /// An offset store that refuses a stretch of commits (a consumer
    /// group's coordinator out of reach), across revocations,
    /// reassignments, replays and stops. Found: a revocation whose commit
    /// failed ended the run when the source driver met the failure (the
    /// group callback's path went on); the partitions' next owner reads
    /// them again from the last commit either way.
    pub store_outages: bool,
    /// Routed pipelines: sinks with conditions (`when`) and steps of their
    /// own that filter, expand, reject and panic; exclusive routes; an
    /// unmatched sink.
    pub routing: bool,
    /// Pipelines whose exactly-once sink (one in two), or whose first
    /// at-least-once sink (one in eight), is the object-store sink
    /// (`etl-object-store`), writing NDJSON or Parquet objects in one PUT
    /// or as multipart uploads, over an in-memory store that fails
    /// requests, loses their answers and answers late (`sim/lake.rs`).
    pub lake: bool,
    /// A source that behaves like a PostgreSQL replication slot (one
    /// scenario in four): transactions over one partition, offsets and
    /// confirmations by `etl-postgres-cdc`'s own rule, a stream that
    /// drops mid-transaction and a server that falls back to an older
    /// confirmed position (`sim/slot.rs`).
    pub slot: bool,
    /// Revocations that hand the partitions to another owner (as a Kafka
    /// rebalance does, `Source::hands_over_revoked`), not retire them:
    /// an exactly-once sink's write fence closes their epochs, so queued
    /// batches are dropped, retries refused, and a write still under way
    /// at the revoke deadline halts the run.
    pub exactly_once_handovers: bool,
}

impl Features {
    /// What this branch runs by default: every generator part whose hole
    /// is closed here.
    pub const DEFAULT: Features = Features {
        transform_panics: true,
        exactly_once_dead_letters: true,
        exact_poison_attribution: true,
        environment_failures: true,
        sink_outages: true,
        exactly_once_rebalances: true,
        store_outages: true,
        routing: true,
        lake: true,
        slot: true,
        exactly_once_handovers: true,
    };

    /// The switch names, as `--enable` and `SIM_ENABLE` take them.
    pub const NAMES: [&'static str; 11] = [
        "transform_panics",
        "exactly_once_dead_letters",
        "exact_poison_attribution",
        "environment_failures",
        "sink_outages",
        "exactly_once_rebalances",
        "store_outages",
        "routing",
        "lake",
        "slot",
        "exactly_once_handovers",
    ];

    /// The switches that are on, comma-separated, as `--enable` takes
    /// them.
    pub fn list(self) -> String {
        let on = [
            self.transform_panics,
            self.exactly_once_dead_letters,
            self.exact_poison_attribution,
            self.environment_failures,
            self.sink_outages,
            self.exactly_once_rebalances,
            self.store_outages,
            self.routing,
            self.lake,
            self.slot,
            self.exactly_once_handovers,
        ];
        Self::NAMES
            .iter()
            .zip(on)
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Turn on the named switch (or every switch for `all`).
    pub fn enable(&mut self, name: &str) -> Result<(), String> {
        match name {
            "transform_panics" => self.transform_panics = true,
            "exactly_once_dead_letters" => self.exactly_once_dead_letters = true,
            "exact_poison_attribution" => self.exact_poison_attribution = true,
            "environment_failures" => self.environment_failures = true,
            "sink_outages" => self.sink_outages = true,
            "exactly_once_rebalances" => self.exactly_once_rebalances = true,
            "store_outages" => self.store_outages = true,
            "routing" => self.routing = true,
            "lake" => self.lake = true,
            "slot" => self.slot = true,
            "exactly_once_handovers" => self.exactly_once_handovers = true,
            "all" => {
                for n in Self::NAMES {
                    self.enable(n)?;
                }
            }
            other => {
                return Err(format!(
                    "unknown simulation switch {other:?}; known: {}, all",
                    Self::NAMES.join(", ")
                ));
            }
        }
        Ok(())
    }
}

/// One generated pipeline and the life it lives: several runs on the same
/// stores, then a recovery run with every fault healed.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Records per partition (offsets 0..n); 1 to 8 partitions. A slot
    /// scenario has one partition, whose records `slot` makes.
    pub partitions: Vec<u8>,
    /// Records per source batch.
    pub source_batch: u8,
    /// Input the source rejects as bad (partition, offset): dead letters.
    pub source_rejects: Vec<(u8, i64)>,
    /// Revocations (and later reassignments) the source announces.
    pub rebalances: Vec<Rebalance>,
    /// The source asks the checkpointer to commit every this many batches
    /// (the checkpointer's own interval runs on the wall clock, so it is
    /// set out of reach).
    pub commit_every: Option<u8>,
    /// Transform steps, in order.
    pub steps: Vec<Step>,
    /// The steps run on two worker threads (the parallel, ordered stage)
    /// instead of the runtime's thread.
    pub parallel_transforms: bool,
    /// The sinks (one only when exactly-once).
    pub sinks: Vec<SinkSpec>,
    /// The single sink stores its progress with its data (exactly-once).
    pub exactly_once: bool,
    /// The dead-letter sink, with its faults.
    pub dead_letter: Option<Vec<Fault>>,
    /// Failures of a range before narrowing, and of a record alone before
    /// it is poison.
    pub max_replays: u8,
    /// A poison record halts the run instead of being dead-lettered.
    pub poison_halts: bool,
    /// A failed batch halts the run instead of replaying.
    pub halt_on_failure: bool,
    /// In-flight batches allowed (per partition and in total).
    pub max_in_flight: u8,
    /// The pipeline's shutdown timeout, in virtual milliseconds.
    pub shutdown_timeout_ms: u16,
    /// How each run before the recovery run ends.
    pub runs: Vec<RunEnd>,
    /// Commit calls `from..from + calls` of the offset store (counted over
    /// all runs but the recovery run) fail.
    pub store_outage: Option<(u16, u16)>,
    /// The object-store sink, over the world's in-memory store with these
    /// faults: the exactly-once sink, or sink 0 of an at-least-once
    /// pipeline.
    pub lake: Option<Lake>,
    /// Each record goes to the first sink whose condition it matches
    /// (rather than to every one).
    pub exclusive: bool,
    /// The sink (index) that takes what no condition matched; it has no
    /// condition of its own.
    pub unmatched: Option<u8>,
    /// The source is a simulated replication slot over this WAL.
    pub slot: Option<Slot>,
    /// The source's revocations hand the partitions to another owner
    /// (the write fence closes their epochs) rather than retire them.
    pub hands_over: bool,
}

impl Scenario {
    /// The offsets of partition `p`'s records, in order.
    pub fn offsets(&self, p: usize) -> Vec<i64> {
        match &self.slot {
            Some(slot) => self.offsets_of_slot(slot),
            None => (0..self.partitions.get(p).map_or(0, |c| i64::from(*c))).collect(),
        }
    }

    /// The offsets of a slot's changes, in order.
    fn offsets_of_slot(&self, slot: &Slot) -> Vec<i64> {
        slot.layout()
            .iter()
            .flat_map(|t| t.first..t.first + t.changes)
            .collect()
    }

    /// The offset after partition `p`'s last record (0 without records):
    /// what it has committed once everything is delivered.
    pub fn end_offset(&self, p: usize) -> i64 {
        self.offsets(p).last().map_or(0, |o| o + 1)
    }
}

/// A replication slot's server: its WAL (transactions in commit order)
/// and where its stream drops.
#[derive(Clone, Debug)]
pub struct Slot {
    /// The transactions, in commit order.
    pub wal: Vec<SlotTxn>,
    /// The stream drops when the server is about to send message `at`
    /// (counted over the scenario's runs, so each drop comes once); the
    /// server then restarted too when `back > 0`, and came back at the
    /// position it was confirmed at `back` confirmations before the last.
    pub drops: Vec<(u16, u8)>,
}

/// One transaction of a slot's WAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotTxn {
    /// Bytes of WAL between the previous commit record's end and its
    /// commit record.
    pub gap: u8,
    /// Its commit record's length.
    pub len: u8,
    /// Its first change lies this many bytes before its commit record
    /// (it ran beside the transactions committing before it).
    pub began_before: u8,
    /// Its changes in the publication (0: PostgreSQL 14 and older send
    /// its `BEGIN` and `COMMIT` all the same).
    pub changes: u8,
    /// After its commit the server sends a keepalive, its end of WAL this
    /// many bytes past the commit record's end (never past the next
    /// commit).
    pub keepalive: Option<u8>,
    /// The next transaction is already buffered at its commit, so the
    /// batch being filled goes on (only a full batch is handed over).
    pub buffered_after: bool,
}

/// Where a slot transaction lies in the WAL and the offsets its changes
/// take: what the model expects, by the rule docs/postgres-cdc.md states
/// ("Offsets"), computed here independently of the source's own code.
#[derive(Clone, Copy, Debug)]
pub struct TxnAt {
    /// Its commit LSN (where its commit record starts).
    pub commit: u64,
    /// Where its commit record ends.
    pub end: u64,
    /// Where its first change is.
    pub first_lsn: u64,
    /// Its first change's offset: its commit LSN, or right after the
    /// previous transaction's last offset when that is higher.
    pub first: i64,
    /// Its changes.
    pub changes: i64,
    /// The end of WAL of the keepalive the server sends after it.
    pub keepalive: Option<u64>,
    /// See [`SlotTxn::buffered_after`].
    pub buffered_after: bool,
}

impl Slot {
    /// Each transaction's place and offsets (see [`TxnAt`]).
    pub fn layout(&self) -> Vec<TxnAt> {
        let mut lsn = 0u64;
        let mut next_free = 0i64;
        let mut out: Vec<TxnAt> = Vec::with_capacity(self.wal.len());
        for t in &self.wal {
            let commit = lsn + u64::from(t.gap);
            let end = commit + u64::from(t.len.max(1));
            lsn = end;
            let first = (commit as i64).max(next_free);
            let changes = i64::from(t.changes);
            if changes > 0 {
                next_free = first + changes;
            }
            out.push(TxnAt {
                commit,
                end,
                first_lsn: commit.saturating_sub(u64::from(t.began_before)),
                first,
                changes,
                keepalive: t.keepalive.map(|k| end + u64::from(k)),
                buffered_after: t.buffered_after,
            });
        }
        // A keepalive's end of WAL is never past the next commit: the
        // server has not decoded that commit yet.
        for i in 1..out.len() {
            let next = out[i].commit;
            if let Some(k) = out[i - 1].keepalive.as_mut() {
                *k = (*k).min(next);
            }
        }
        out
    }
}

fn slot() -> impl Strategy<Value = Slot> {
    // One transaction in four is empty; a large one closely followed by
    // others runs the offsets past their commit LSNs (not anchored).
    let changes = prop_oneof![1 => Just(0u8), 3 => 1u8..=24];
    let txn = (
        0u8..=24,
        8u8..=24,
        0u8..=64,
        changes,
        prop::option::weighted(0.4, 0u8..=24),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(gap, len, began_before, changes, keepalive, buffered_after)| SlotTxn {
                gap,
                len,
                began_before,
                changes,
                keepalive,
                buffered_after,
            },
        );
    (vec(txn, 1..=10), vec((0u16..120, 0u8..=3), 0..=3))
        .prop_map(|(wal, drops)| Slot { wal, drops })
}

/// The object-store sink of a scenario: its exactly-once sink, or (in an
/// at-least-once scenario) its sink 0.
#[derive(Clone, Debug)]
pub struct Lake {
    /// How records become an object's bytes.
    pub format: LakeFormat,
    /// The store's scripted faults.
    pub faults: Vec<StoreFault>,
    /// Offsets an object covers at most (`max_object_offsets`).
    pub max_object_offsets: Option<u8>,
    /// Objects go up as multipart uploads (a part, then the completion).
    pub multipart: bool,
}

/// How the object-store sink encodes its objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LakeFormat {
    /// One JSON document per line: each record's value as a JSON string.
    Ndjson,
    /// Parquet with a declared schema: one non-nullable string column `v`
    /// holding each record's value.
    Parquet,
}

/// A fault of the object store (requests are counted over the whole
/// scenario, so a fault at request `n` fires once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFault {
    /// Request `n` fails, and is not done.
    Fail(u16),
    /// Request `n` is done, but its answer is an error.
    Lose(u16),
    /// Request `n` is done, and answered this many virtual ms later.
    Late(u16, u16),
}

fn lake() -> impl Strategy<Value = Lake> {
    let fault = prop_oneof![
        (0u16..80).prop_map(StoreFault::Fail),
        (0u16..80).prop_map(StoreFault::Lose),
        (0u16..80, 1u16..=1500).prop_map(|(n, ms)| StoreFault::Late(n, ms)),
    ];
    // NDJSON first: a counterexample shrinks towards it.
    let format = prop_oneof![Just(LakeFormat::Ndjson), Just(LakeFormat::Parquet)];
    (
        format,
        vec(fault, 0..=4),
        prop::option::weighted(0.3, 1u8..=8),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(format, faults, max_object_offsets, multipart)| Lake {
            format,
            faults,
            max_object_offsets,
            multipart,
        })
}

/// A revocation announced after `after` source events, and the
/// reassignment `back_after` events later.
#[derive(Clone, Debug)]
pub struct Rebalance {
    /// Source events before the revocation.
    pub after: u8,
    /// Partitions revoked (indices, taken modulo the partition count).
    pub partitions: Vec<u8>,
    /// Source events between the revocation and the reassignment.
    pub back_after: u8,
}

/// A transform step. Which records it touches depends only on the offset
/// (`offset % every == at`), so the model knows each record's fate.
#[derive(Clone, Debug)]
pub enum Step {
    /// Drop the record on purpose.
    Filter {
        /// Period.
        every: u8,
        /// Residue.
        at: u8,
    },
    /// Replace the record with `copies` copies (0: dropped).
    Expand {
        /// Period.
        every: u8,
        /// Residue.
        at: u8,
        /// Copies made.
        copies: u8,
    },
    /// Reject the record to the dead-letter path.
    Reject {
        /// Period.
        every: u8,
        /// Residue.
        at: u8,
    },
    /// Panic on this record, the first time it is seen.
    Panic {
        /// Partition index.
        partition: u8,
        /// Offset.
        offset: u8,
    },
}

/// One sink and how its driver is configured.
#[derive(Clone, Debug)]
pub struct SinkSpec {
    /// Records per write (above the source batch: batches merge).
    pub max_records: u8,
    /// Linger before a partial batch is written, virtual ms.
    pub linger_ms: u8,
    /// Writes in flight.
    pub in_flight: u8,
    /// Retries of a retryable failure (no backoff: retry timing stays
    /// deterministic).
    pub retries: u8,
    /// Write timeout, virtual ms.
    pub timeout_ms: u16,
    /// A batch that failed for good goes to the dead-letter sink.
    pub dead_letter_failures: bool,
    /// Its faults.
    pub faults: Vec<Fault>,
    /// Its condition.
    pub when: Option<When>,
    /// Steps of its own, run on its copy after the shared ones.
    pub branch: Vec<Step>,
}

/// A fault of a sink (write calls are counted over the whole scenario, so
/// a fault at call `n` fires once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Write call `n` fails, retryably.
    Transient(u16),
    /// Write call `n` fails for good.
    Permanent(u16),
    /// Write call `n` never completes (the write timeout ends it).
    Hang(u16),
    /// Every write takes this long (virtual ms).
    Slow(u8),
    /// Every write holding this record (partition index, offset) fails for
    /// good.
    Poison(u8, u8),
    /// Every write from call `n` on fails (retryably): the environment is
    /// broken until the recovery run.
    Broken(u16),
    /// Writes from call `from` hang, for `calls` calls.
    Outage {
        /// First hanging call.
        from: u16,
        /// Calls that hang.
        calls: u16,
    },
}

/// How a run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// A graceful stop (SIGTERM) at this virtual time (ms).
    Stop(u16),
    /// The process dies at this virtual time (ms): nothing more becomes
    /// durable, the stores keep what they held.
    Crash(u16),
}

fn step(features: Features) -> BoxedStrategy<Step> {
    let period = (1u8..=7).prop_flat_map(|every| (Just(every), 0..every));
    let mut options = vec![
        period
            .clone()
            .prop_map(|(every, at)| Step::Filter { every, at })
            .boxed(),
        (period.clone(), 0u8..=3)
            .prop_map(|((every, at), copies)| Step::Expand { every, at, copies })
            .boxed(),
        ((3u8..=9).prop_flat_map(|every| (Just(every), 0..every)))
            .prop_map(|(every, at)| Step::Reject { every, at })
            .boxed(),
    ];
    if features.transform_panics {
        options.push(
            (0u8..8, 0u8..40)
                .prop_map(|(partition, offset)| Step::Panic { partition, offset })
                .boxed(),
        );
    }
    proptest::strategy::Union::new(options).boxed()
}

fn fault(features: Features, dead_letter: bool) -> BoxedStrategy<Fault> {
    let mut options = vec![
        (0u16..60).prop_map(Fault::Transient).boxed(),
        (0u16..60).prop_map(Fault::Permanent).boxed(),
        (1u8..=30).prop_map(Fault::Slow).boxed(),
    ];
    // The dead-letter sink's driver has no write timeout: a hang there
    // lasts, so it belongs with the outages (hole 5).
    if !dead_letter || features.sink_outages {
        options.push((0u16..60).prop_map(Fault::Hang).boxed());
    }
    if !dead_letter && features.exact_poison_attribution {
        options.push(
            (0u8..8, 0u8..40)
                .prop_map(|(p, o)| Fault::Poison(p, o))
                .boxed(),
        );
    }
    if features.environment_failures {
        options.push((0u16..40).prop_map(Fault::Broken).boxed());
    }
    if !dead_letter && features.sink_outages {
        options.push(
            (0u16..40, 1u16..400)
                .prop_map(|(from, calls)| Fault::Outage { from, calls })
                .boxed(),
        );
    }
    proptest::strategy::Union::new(options).boxed()
}

fn sink(features: Features) -> impl Strategy<Value = SinkSpec> {
    // Without outages, writes stay short, so a stop drains quickly.
    let (timeout, retries) = if features.sink_outages {
        (50u16..=1000, 0u8..=6)
    } else {
        (20u16..=200, 0u8..=2)
    };
    (
        1u8..=32,
        0u8..=20,
        1u8..=4,
        retries,
        timeout,
        prop::bool::weighted(0.15),
        vec(fault(features, false), 0..=3),
        route(features),
    )
        .prop_map(
            |(
                max_records,
                linger_ms,
                in_flight,
                retries,
                timeout_ms,
                dlf,
                faults,
                (when, branch),
            )| {
                SinkSpec {
                    max_records,
                    linger_ms,
                    in_flight,
                    retries,
                    timeout_ms,
                    dead_letter_failures: dlf,
                    faults,
                    when,
                    branch,
                }
            },
        )
}

/// A sink's condition: it takes the records with `offset % every == at`,
/// and cannot judge the one at offset `refuses` (a value a VRL condition
/// fails on): that record goes to the dead-letter path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct When {
    /// Period.
    pub every: u8,
    /// Residue.
    pub at: u8,
    /// The offset it cannot judge, if any.
    pub refuses: Option<u8>,
}

/// A sink's condition and steps of its own.
type SinkRoute = (Option<When>, Vec<Step>);

/// A sink's route.
fn route(features: Features) -> BoxedStrategy<SinkRoute> {
    if !features.routing {
        return Just((None, Vec::new())).boxed();
    }
    let when = (1u8..=5)
        .prop_flat_map(|every| (Just(every), 0..every, prop::option::weighted(0.2, 0u8..40)))
        .prop_map(|(every, at, refuses)| When { every, at, refuses });
    (
        prop::option::weighted(0.5, when),
        prop::collection::vec(step(features), 0..=2),
    )
        .boxed()
}

fn rebalance() -> impl Strategy<Value = Rebalance> {
    (0u8..30, vec(0u8..8, 1..=3), 0u8..10).prop_map(|(after, partitions, back_after)| Rebalance {
        after,
        partitions,
        back_after,
    })
}

fn run_end() -> impl Strategy<Value = RunEnd> {
    prop_oneof![
        (0u16..1500).prop_map(RunEnd::Stop),
        (0u16..1500).prop_map(RunEnd::Crash),
    ]
}

/// Scenarios with the given switches.
pub fn scenario(features: Features) -> impl Strategy<Value = Scenario> {
    let shape = (
        vec(0u8..=40, 1..=8),
        1u8..=8,
        btree_set((0u8..8, 0u8..40), 0..=3),
        vec(rebalance(), 0..=2),
        prop::option::weighted(0.7, 1u8..=6),
    );
    let pipeline = (
        (vec(step(features), 0..=3), prop::bool::weighted(0.25)),
        prop::bool::weighted(0.35),
        vec(sink(features), 1..=3),
        prop::option::weighted(0.75, vec(fault(features, true), 0..=2)),
    );
    let in_flight = if features.sink_outages {
        1u8..=64
    } else {
        1u8..=16
    };
    let policy = (
        1u8..=3,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        in_flight,
        200u16..=3000,
        vec(run_end(), 0..=3),
    );
    let store_outage = if features.store_outages {
        prop::option::weighted(0.3, (0u16..20, 1u16..20)).boxed()
    } else {
        Just(None).boxed()
    };
    let routing = if features.routing {
        (
            prop::bool::weighted(0.4),
            prop::option::weighted(0.4, 0u8..3),
        )
            .boxed()
    } else {
        Just((false, None)).boxed()
    };
    // The object-store sink: in one exactly-once scenario in two, and in
    // one at-least-once scenario in eight (they are the more numerous:
    // that keeps the count of Parquet scenarios, the slow ones, down).
    let lake = if features.lake {
        (
            prop::option::weighted(0.5, lake()),
            prop::option::weighted(0.125, lake()),
        )
            .boxed()
    } else {
        Just((None, None)).boxed()
    };
    let slot = if features.slot {
        prop::option::weighted(0.25, slot()).boxed()
    } else {
        Just(None).boxed()
    };
    let hands_over = if features.exactly_once_handovers {
        prop::bool::weighted(0.5).boxed()
    } else {
        Just(false).boxed()
    };
    (
        shape,
        pipeline,
        policy,
        store_outage,
        routing,
        (lake, slot, hands_over),
    )
        .prop_map(
            move |(
                shape,
                pipeline,
                policy,
                store_outage,
                (exclusive, unmatched),
                (lake, slot, hands_over),
            )| {
                let (partitions, source_batch, rejects, rebalances, commit_every) = shape;
                let ((steps, parallel_transforms), exactly_once, mut sinks, dead_letter) = pipeline;
                let (max_replays, poison_halts, halt_on_failure, max_in_flight, shutdown, runs) =
                    policy;
                let mut s = Scenario {
                    partitions,
                    source_batch,
                    source_rejects: rejects
                        .into_iter()
                        .map(|(p, o)| (p, i64::from(o)))
                        .collect(),
                    rebalances,
                    commit_every,
                    steps,
                    parallel_transforms,
                    sinks: Vec::new(),
                    exactly_once,
                    dead_letter,
                    max_replays,
                    poison_halts,
                    halt_on_failure,
                    max_in_flight,
                    shutdown_timeout_ms: shutdown,
                    runs,
                    store_outage,
                    exclusive,
                    unmatched: None,
                    lake: None,
                    slot: None,
                    hands_over,
                };
                if let Some(slot) = slot {
                    // A slot is one partition, announced once: no rebalance.
                    s.partitions = vec![0];
                    s.rebalances.clear();
                    // The drawn rejects pick changes by their place in the
                    // WAL: a slot's offsets follow its positions, most far
                    // past the drawn numbers.
                    let changes = s.offsets_of_slot(&slot);
                    s.source_rejects = s
                        .source_rejects
                        .iter()
                        .filter_map(|(_, o)| {
                            let at = usize::try_from(*o).ok()? % changes.len().max(1);
                            Some((0, *changes.get(at)?))
                        })
                        .collect();
                    s.slot = Some(slot);
                }
                let (exactly_once_lake, at_least_once_lake) = lake;
                let lake = if s.exactly_once {
                    exactly_once_lake
                } else {
                    at_least_once_lake
                };
                if let Some(lake) = lake {
                    // The store's faults stand for the sink's.
                    if let Some(sink) = sinks.first_mut() {
                        sink.faults.clear();
                    }
                    s.lake = Some(lake);
                }
                if s.exactly_once {
                    sinks.truncate(1);
                    if !features.exactly_once_rebalances {
                        // Hole 10: no rebalance in an exactly-once pipeline until
                        // that hole is closed.
                        s.rebalances.clear();
                    }
                    if !features.exactly_once_dead_letters {
                        // Hole 2: no record of an exactly-once pipeline may take
                        // the dead-letter path until that hole is closed.
                        s.source_rejects.clear();
                        s.steps.retain(|st| !matches!(st, Step::Reject { .. }));
                        for sink in &mut sinks {
                            sink.dead_letter_failures = false;
                            sink.faults.retain(|f| !matches!(f, Fault::Poison(..)));
                            sink.branch.retain(|st| !matches!(st, Step::Reject { .. }));
                        }
                        s.poison_halts = true;
                    }
                }
                // The unmatched sink, if any, is one of the sinks, without a
                // condition of its own.
                if let Some(u) = unmatched.filter(|u| usize::from(*u) < sinks.len()) {
                    sinks[usize::from(u)].when = None;
                    s.unmatched = Some(u);
                }
                s.sinks = sinks;
                s
            },
        )
}
