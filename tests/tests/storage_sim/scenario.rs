//! What a storage scenario is made of, and how scenarios are generated.
//!
//! A [`Scenario`] is plain data (the input, the file sink's settings, the
//! disk's fault rates, the runs and how each ends), so proptest shrinks it
//! field by field to a small, readable counterexample.

use proptest::collection::vec;
use proptest::prelude::*;

/// Generator switches. One that finds a behaviour not fixed yet is off
/// by default (`--enable storage_<name>` turns it on) until the fix is
/// in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// A power loss keeps some unsynced writes, torn or whole (so out of
    /// order, with zeros between). Watches the at-least-once file sink's
    /// recovery: after such a crash it must not keep NUL bytes or a
    /// partial line that lost unsynced pages left, and append after them.
    pub torn_writes: bool,
    /// Another program truncates, unlinks, replaces or renames away the
    /// active output while a run writes it. Records it destroyed are
    /// excused; the sink must count nothing written after it delivered.
    /// Found: the file sink cut a failed append back with `set_len` to
    /// the length it wrote, which lengthened a file another program had
    /// truncated with zeros, and wrote on (fixed; seeds
    /// `0x9e87c3a64660f5e4`, `0x88b30ed4d27d5a16`); and a failed append
    /// that landed as many bytes as were cut left the length the sink
    /// expected, so its retry wrote over committed records (fixed by a
    /// length check before every append; seed `0x2bf9a0d4d6684679`).
    /// Seed `0x88b30ed4d27d5a16` left zeros at the start of an
    /// exactly-once output in about one run in eight under load: another
    /// program's truncation, from another thread, landed between the
    /// sink's look at the length and its `set_len` (fixed: a cut back
    /// never lengthens the output). On by default.
    pub output_changes: bool,
    /// Half the scenarios read input files on the simulated disk with the
    /// real file source (else the scripted source), changed between runs
    /// by another program (see [`Inputs`]).
    pub file_source: bool,
}

impl Features {
    /// What runs by default.
    pub const DEFAULT: Features = Features {
        torn_writes: true,
        output_changes: true,
        file_source: true,
    };

    /// The switch names, as `--enable` and `SIM_ENABLE` take them.
    pub const NAMES: [&'static str; 3] = [
        "storage_torn_writes",
        "storage_output_changes",
        "storage_file_source",
    ];

    /// Turn on the named switch (`all`: every one). Names of the other
    /// simulation's switches are not this binary's: `Ok(false)`.
    pub fn enable(&mut self, name: &str) -> Result<bool, String> {
        match name {
            "storage_torn_writes" => self.torn_writes = true,
            "storage_output_changes" => self.output_changes = true,
            "storage_file_source" => self.file_source = true,
            "all" => {
                for n in Self::NAMES {
                    self.enable(n)?;
                }
            }
            other if other.starts_with("storage_") => {
                return Err(format!(
                    "unknown storage simulation switch {other:?}; known: {}, all",
                    Self::NAMES.join(", ")
                ));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The switches on, comma-separated.
    pub fn list(self) -> String {
        let on = [self.torn_writes, self.output_changes, self.file_source];
        Self::NAMES
            .iter()
            .zip(on)
            .filter(|(_, on)| *on)
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// One generated pipeline over the simulated disk and the life it lives:
/// several runs on the same disk, then a recovery run with every fault
/// healed.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Records per partition (offsets 0..n); 1 to 4 partitions.
    pub partitions: Vec<u8>,
    /// Records per source batch.
    pub source_batch: u8,
    /// Virtual milliseconds the source takes per batch.
    pub pace_ms: u8,
    /// The source asks the checkpointer to commit every this many batches.
    pub commit_every: Option<u8>,
    /// The file sink stores its progress with its data.
    pub exactly_once: bool,
    /// Group commit: `fsync` at most every this many virtual ms (else
    /// after every batch).
    pub group_commit_ms: Option<u8>,
    /// Rotate before a write would take the file past this many bytes.
    pub rotate_bytes: Option<u16>,
    /// Records per sink write (above the source batch: batches merge).
    pub max_records: u8,
    /// Linger before a partial batch is written, virtual ms.
    pub linger_ms: u8,
    /// Writes in flight (1 when exactly-once).
    pub in_flight: u8,
    /// Retries of a retryable failure.
    pub retries: u8,
    /// The disk's faults, until the recovery run.
    pub faults: DiskFaults,
    /// How each run before the recovery run ends.
    pub runs: Vec<RunEnd>,
    /// Second names for what a run writes, made while it runs: opening
    /// the output or the store through one must be refused.
    pub aliases: Vec<Alias>,
    /// Before the disk's change number `n` of each run but the recovery
    /// run, another program changes the active output.
    pub output_change: Option<(u16, OutputChange)>,
    /// Input files read by the real file source (`None`: the scripted
    /// source reads `partitions`).
    pub inputs: Option<Inputs>,
}

/// Input files on the simulated disk, written durably before the first
/// run; the file source keeps its record of inputs in the offset store's
/// folder.
#[derive(Clone, Debug)]
pub struct Inputs {
    /// Lines (of 100 bytes) in each input file at first; 1 to 3 files.
    pub lines: Vec<u8>,
    /// Input files open at once.
    pub max_open_files: u8,
    /// Before the run after run `i` (the recovery run included), another
    /// program changes an input file: `changes[i]`, durably.
    pub changes: Vec<Option<(u8, InputChange)>>,
}

/// What another program does to an input file between runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputChange {
    /// `cat next > in.log`: the same inode, the same first KiB (when the
    /// file holds that much), other bytes after it, at least as long.
    Rewrite,
    /// `mv in.log rotated<n>.log` (still matched by the pattern), then a
    /// new file at the old name.
    Rotate,
    /// `truncate` to half its lines.
    Truncate,
    /// `cat more >> in.log`.
    Append,
}

/// What another program does to the active output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputChange {
    /// `truncate -s 0`.
    Truncate,
    /// `rm`.
    Unlink,
    /// An empty file renamed over it.
    Replace,
    /// `mv` to another name.
    RenameAway,
}

/// Fault rates, per mille of the calls concerned (see `etl_fs::SimFaults`).
#[derive(Clone, Debug, Default)]
pub struct DiskFaults {
    /// File `fsync`s that fail with `EIO`.
    pub sync_fail: u16,
    /// Folder `fsync`s that fail with `EIO`.
    pub dir_sync_fail: u16,
    /// Writes that fail (`EIO`, `ENOSPC`) after writing a prefix.
    pub write_fail: u16,
    /// Failed `fsync`s whose lost bytes read back as zeros at once.
    pub zero_lost: u16,
    /// Unsynced writes a power loss keeps in part.
    pub torn: u16,
    /// Unsynced writes a power loss keeps whole.
    pub kept: u16,
    /// Folders whose unsynced entries a power loss keeps.
    pub dirs_kept: u16,
    /// The offset store's folder fails too (else only the output's).
    pub store_too: bool,
}

/// A second name for what a run writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alias {
    /// A hard link to the active output file.
    HardLink,
    /// A symlink to the active output file.
    Symlink,
    /// A symlink to the output's folder.
    FolderSymlink,
    /// A symlink to the offset store's folder.
    StoreSymlink,
}

/// How a run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// A graceful stop (SIGTERM) at this virtual time (ms).
    Stop(u16),
    /// `kill -9` before the disk's next change after this many: the page
    /// cache survives.
    Kill(u16),
    /// Power loss before the disk's next change after this many: only
    /// what an `fsync` covered survives (and, by seed, some unsynced
    /// writes, see [`Features::torn_writes`]).
    PowerLoss(u16),
}

fn per_mille(max: u16) -> BoxedStrategy<u16> {
    prop_oneof![3 => Just(0u16), 2 => 1..=max].boxed()
}

fn faults(features: Features) -> impl Strategy<Value = DiskFaults> {
    let (torn, kept) = if features.torn_writes {
        (per_mille(500), per_mille(500))
    } else {
        (Just(0u16).boxed(), Just(0u16).boxed())
    };
    (
        per_mille(150),
        per_mille(100),
        per_mille(100),
        per_mille(1000),
        torn,
        kept,
        per_mille(500),
        prop::bool::weighted(0.3),
    )
        .prop_map(
            |(
                sync_fail,
                dir_sync_fail,
                write_fail,
                zero_lost,
                torn,
                kept,
                dirs_kept,
                store_too,
            )| {
                DiskFaults {
                    sync_fail,
                    dir_sync_fail,
                    write_fail,
                    zero_lost,
                    torn,
                    kept,
                    dirs_kept,
                    store_too,
                }
            },
        )
}

fn run_end() -> impl Strategy<Value = RunEnd> {
    prop_oneof![
        (0u16..300).prop_map(RunEnd::Stop),
        (0u16..200).prop_map(RunEnd::Kill),
        (0u16..200).prop_map(RunEnd::PowerLoss),
    ]
}

fn alias() -> impl Strategy<Value = Alias> {
    prop_oneof![
        Just(Alias::HardLink),
        Just(Alias::Symlink),
        Just(Alias::FolderSymlink),
        Just(Alias::StoreSymlink),
    ]
}

fn output_change(features: Features) -> BoxedStrategy<Option<(u16, OutputChange)>> {
    if !features.output_changes {
        return Just(None).boxed();
    }
    let change = prop_oneof![
        Just(OutputChange::Truncate),
        Just(OutputChange::Unlink),
        Just(OutputChange::Replace),
        Just(OutputChange::RenameAway),
    ];
    prop::option::weighted(0.2, (0u16..150, change)).boxed()
}

fn inputs(features: Features) -> BoxedStrategy<Option<Inputs>> {
    if !features.file_source {
        return Just(None).boxed();
    }
    let change = prop_oneof![
        Just(InputChange::Rewrite),
        Just(InputChange::Rotate),
        Just(InputChange::Truncate),
        Just(InputChange::Append),
    ];
    let inputs = (
        vec(1u8..=30, 1..=3),
        1u8..=2,
        vec(prop::option::weighted(0.6, (0u8..3, change)), 0..=5),
    )
        .prop_map(|(lines, max_open_files, changes)| Inputs {
            lines,
            max_open_files,
            changes,
        });
    prop::option::weighted(0.5, inputs).boxed()
}

/// Scenarios with the given switches.
pub fn scenario(features: Features) -> impl Strategy<Value = Scenario> {
    let input = (
        vec(0u8..=40, 1..=4),
        1u8..=8,
        0u8..=3,
        prop::option::weighted(0.7, 1u8..=6),
    );
    let sink = (
        prop::bool::weighted(0.5),
        prop::option::weighted(0.4, 1u8..=20),
        prop::option::weighted(0.4, 16u16..=400),
        1u8..=16,
        0u8..=10,
        1u8..=4,
        0u8..=3,
    );
    let life = (
        faults(features),
        vec(run_end(), 0..=4),
        vec(alias(), 0..=2),
        output_change(features),
    );
    // Drawn last, so the scripted parts of a seed's scenario are the
    // same with the file source switched off.
    (input, sink, life, inputs(features)).prop_map(|(input, sink, life, inputs)| {
        let (partitions, source_batch, pace_ms, commit_every) = input;
        let (
            exactly_once,
            group_commit_ms,
            rotate_bytes,
            max_records,
            linger_ms,
            in_flight,
            retries,
        ) = sink;
        let (faults, runs, aliases, output_change) = life;
        Scenario {
            partitions,
            source_batch,
            pace_ms,
            commit_every,
            exactly_once,
            group_commit_ms,
            rotate_bytes,
            max_records,
            linger_ms,
            in_flight: if exactly_once { 1 } else { in_flight },
            retries,
            faults,
            runs,
            aliases,
            output_change,
            inputs,
        }
    })
}
