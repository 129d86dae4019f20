//! The simulated machine: one `SimFs` disk kept across runs, the view of
//! it each process gets (ending the process after a scripted number of
//! changes to the disk), the scripted source, and what the disk holds.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etl_checkpoint::CheckpointHandle;
use etl_fs::{FileHandle, Fs, Metadata, Mutation, OpenOptions, SimFs, TryLockError};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};
use tokio::sync::Notify;

use super::scenario::Scenario;

/// The output's folder.
pub const OUT_DIR: &str = "/data/out";
/// The active output file.
pub const OUTPUT: &str = "/data/out/records.ndjson";
/// The offset store's folder.
pub const STORE_DIR: &str = "/data/offsets";

/// When a process ends: before the disk's next change after `left - 1`
/// more, by power loss or `kill -9`.
#[derive(Debug)]
pub struct Trip {
    sim: SimFs,
    /// Changes still allowed plus one; 0 once fired, `u64::MAX`: never.
    left: AtomicU64,
    power_loss: bool,
    fired: AtomicBool,
    /// Wakes the run once fired.
    pub notify: Notify,
    /// Changes made so far.
    changes: AtomicU64,
    /// Another program's change to the output, before change number `n`.
    outside: Mutex<Option<(u64, Mutation)>>,
    /// What the output held when another program changed it.
    excused: Excused,
    /// Another program changed the output in this run.
    changed: AtomicBool,
    /// Held by every change the process makes to the disk and by another
    /// program's change: what the output held when another program changed
    /// it is read and changed in one step, with no write of the process's
    /// other threads (the checkpointer's, the blocking pool's) in between.
    gate: Mutex<()>,
    /// The run's checkpointer, once the pipeline is built: before every
    /// change to the disk, every record below a watermark it shows (every
    /// acknowledged batch, group commit's waiters included) must be
    /// durable in the output, as a power loss at that instant would
    /// leave it.
    acked: Arc<Mutex<Option<CheckpointHandle>>>,
    /// Which record each watermark covers.
    reads: Reads,
    /// The watermarks are input files' byte positions.
    file_source: bool,
    /// The first acknowledged record found not durable.
    violation: Mutex<Option<String>>,
}

/// Records in the output when another program changed it: it may have
/// destroyed them.
#[derive(Clone, Debug, Default)]
pub struct Excused(Arc<Mutex<BTreeSet<(u32, i64)>>>);

impl Excused {
    pub fn contains(&self, p: u32, o: i64) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&(p, o))
    }

    pub fn any(&self) -> bool {
        !self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}

impl Trip {
    pub fn new(
        sim: SimFs,
        after: Option<u16>,
        power_loss: bool,
        outside: Option<(u16, Mutation)>,
        excused: Excused,
        reads: Reads,
        file_source: bool,
    ) -> Arc<Self> {
        Arc::new(Trip {
            sim,
            left: AtomicU64::new(after.map_or(u64::MAX, |n| u64::from(n) + 1)),
            power_loss,
            fired: AtomicBool::new(false),
            notify: Notify::new(),
            changes: AtomicU64::new(0),
            outside: Mutex::new(outside.map(|(n, m)| (u64::from(n), m))),
            excused,
            changed: AtomicBool::new(false),
            gate: Mutex::new(()),
            acked: Arc::default(),
            reads,
            file_source,
            violation: Mutex::new(None),
        })
    }

    /// Where the pipeline's builder puts the run's checkpointer, so that
    /// acknowledgements are checked from then on.
    pub fn watch_acks(&self) -> Arc<Mutex<Option<CheckpointHandle>>> {
        Arc::clone(&self.acked)
    }

    /// The first acknowledged record found not durable, if any.
    pub fn violation(&self) -> Option<String> {
        self.violation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every record below a watermark the checkpointer shows is durable
    /// in the output now, unless another program's change destroyed it.
    fn check_acked(&self) {
        let Some(checkpoint) = self
            .acked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return;
        };
        if self.violation().is_some() {
            return;
        }
        // Not beside another program's change: what it destroyed is
        // excused in the same step.
        let _gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
        let watermarks: Vec<(u32, i64)> = checkpoint
            .with_metrics(|m| m.partitions().map(|(p, m)| (p.0, m.watermark.0)).collect());
        let durable = durable_lines(&self.sim.durable_copy());
        for (p, w) in watermarks {
            let below: Vec<(u32, i64)> = if self.file_source {
                self.reads.read_before(p, w).into_iter().collect()
            } else {
                (0..w).map(|o| (p, o)).collect()
            };
            if let Some((g, n)) = below
                .into_iter()
                .find(|&(g, n)| !durable.contains(&(g, n)) && !self.excused.contains(g, n))
            {
                *self
                    .violation
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(format!(
                    "partition {p}'s watermark is {w} (acknowledged), but record {g}:{n} below \
                     it is not durable in the output (a power loss now would lose it)"
                ));
                return;
            }
        }
    }

    /// Another program's change, when its time has come.
    fn outside(&self) {
        let n = self.changes.fetch_add(1, Ordering::SeqCst);
        let due = {
            let mut outside = self.outside.lock().unwrap_or_else(PoisonError::into_inner);
            if outside.as_ref().is_some_and(|(at, _)| *at == n) {
                outside.take()
            } else {
                None
            }
        };
        if let Some((_, mutation)) = due {
            let _gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
            self.changed.store(true, Ordering::SeqCst);
            let held = held_now(&self.sim.process());
            if self.sim.apply(&mutation).is_ok() {
                self.excused
                    .0
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .extend(held);
            }
        }
    }

    /// A change to the disk is about to be made: end the process first
    /// when its time has come (the change then fails, as every later
    /// call of the process does).
    fn tick(&self) {
        self.outside();
        self.check_acked();
        if self.left.load(Ordering::SeqCst) == u64::MAX {
            return;
        }
        if self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            == Ok(1)
        {
            if self.power_loss {
                self.sim.crash();
            } else {
                self.sim.kill();
            }
            self.fired.store(true, Ordering::SeqCst);
            self.notify.notify_one();
        }
    }

    /// A change to the disk by the process: the scripted end first when
    /// its time has come, then `change`, never beside another program's
    /// change.
    fn change<T>(&self, change: impl FnOnce() -> T) -> T {
        self.tick();
        let _gate = self.gate.lock().unwrap_or_else(PoisonError::into_inner);
        change()
    }

    /// Whether another program changed the output in this run.
    pub fn changed_output(&self) -> bool {
        self.changed.load(Ordering::SeqCst)
    }

    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }
}

/// One process's view of the disk.
#[derive(Debug)]
pub struct ProcessFs {
    pub sim: SimFs,
    pub trip: Arc<Trip>,
}

impl Fs for ProcessFs {
    fn open(&self, path: &Path, options: &OpenOptions) -> io::Result<Box<dyn FileHandle>> {
        let inner = if options.create || options.create_new || options.truncate {
            self.trip.change(|| self.sim.open(path, options))?
        } else {
            self.sim.open(path, options)?
        };
        Ok(Box::new(ProcessFile {
            inner,
            trip: Arc::clone(&self.trip),
        }))
    }

    fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        self.sim.metadata(path)
    }

    fn symlink_metadata(&self, path: &Path) -> io::Result<Metadata> {
        self.sim.symlink_metadata(path)
    }

    fn canonicalize(&self, path: &Path) -> io::Result<PathBuf> {
        self.sim.canonicalize(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.trip.change(|| self.sim.rename(from, to))
    }

    fn hard_link(&self, original: &Path, link: &Path) -> io::Result<()> {
        self.trip.change(|| self.sim.hard_link(original, link))
    }

    fn symlink(&self, target: &Path, link: &Path) -> io::Result<()> {
        self.trip.change(|| self.sim.symlink(target, link))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.trip.change(|| self.sim.remove_file(path))
    }

    fn read_dir(&self, path: &Path) -> io::Result<Vec<OsString>> {
        self.sim.read_dir(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.trip.change(|| self.sim.create_dir_all(path))
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.trip.change(|| self.sim.sync_dir(path))
    }

    fn blocks(&self) -> bool {
        false
    }
}

#[derive(Debug)]
struct ProcessFile {
    inner: Box<dyn FileHandle>,
    trip: Arc<Trip>,
}

impl Read for ProcessFile {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl Write for ProcessFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.trip.change(|| self.inner.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl FileHandle for ProcessFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn seek_to(&mut self, offset: u64) -> io::Result<()> {
        self.inner.seek_to(offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.trip.change(|| self.inner.set_len(len))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.trip.change(|| self.inner.sync_data())
    }

    fn sync_all(&self) -> io::Result<()> {
        self.trip.change(|| self.inner.sync_all())
    }

    fn metadata(&self) -> io::Result<Metadata> {
        self.inner.metadata()
    }

    fn try_lock(&self) -> Result<(), TryLockError> {
        self.inner.try_lock()
    }
}

/// Every read of every record by any run: (partition, offset) -> reads;
/// and, for the file source, which record each (partition, byte
/// position) was last read as. A position read again as another record
/// only happens when the source's record of inputs lost the partition
/// (a crash before it was durable, so nothing of it was committed) and
/// the id went to the file's new content: the latest read is what a
/// commit of that partition covers.
#[derive(Clone, Debug, Default)]
pub struct Reads(Arc<Mutex<ReadLog>>);

#[derive(Debug, Default)]
struct ReadLog {
    counts: BTreeMap<(u32, i64), u32>,
    at: BTreeMap<(u32, i64), (u32, i64)>,
}

impl Reads {
    fn add(&self, p: u32, o: i64) {
        *self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .counts
            .entry((p, o))
            .or_default() += 1;
    }

    /// Record `record` read at byte `offset` of `partition`.
    pub fn add_at(&self, record: (u32, i64), partition: u32, offset: i64) {
        let mut log = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *log.counts.entry(record).or_default() += 1;
        log.at.insert((partition, offset), record);
    }

    pub fn get(&self, p: u32, o: i64) -> u32 {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .counts
            .get(&(p, o))
            .copied()
            .unwrap_or(0)
    }

    /// Every record read in `partition` at a byte position before `end`.
    pub fn read_before(&self, partition: u32, end: i64) -> BTreeSet<(u32, i64)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .at
            .range((partition, i64::MIN)..(partition, end))
            .map(|(_, record)| *record)
            .collect()
    }
}

/// The record a line of the output stands for: `<p>:<o>` (the scripted
/// source's) or `<p>:<o>:<padding>` (an input file's).
pub fn key(line: &[u8]) -> Option<(u32, i64)> {
    let text = std::str::from_utf8(line).ok()?;
    let mut fields = text.splitn(3, ':');
    let p = fields.next()?.parse().ok()?;
    let o = fields.next()?.parse().ok()?;
    match fields.next() {
        Some(pad) if !pad.bytes().all(|b| b == b'x') => None,
        _ => Some((p, o)),
    }
}

/// The value of record `offset` of `partition`, one line of the output.
pub fn value(partition: u32, offset: i64) -> String {
    format!("{partition}:{offset}")
}

/// A replayable source of dense offsets, batches taken round-robin at a
/// scripted pace, commits requested every few batches. Batch vectors come
/// from `etl_record::reuse`, as the real sources' do.
pub struct ScriptedSource {
    counts: Vec<i64>,
    positions: Vec<i64>,
    batch: i64,
    pace: Duration,
    announced: bool,
    next_partition: usize,
    batches: u64,
    commit_every: Option<u64>,
    checkpoint: CheckpointHandle,
    reads: Reads,
}

impl std::fmt::Debug for ScriptedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedSource")
            .field("positions", &self.positions)
            .finish_non_exhaustive()
    }
}

impl ScriptedSource {
    pub fn new(s: &Scenario, checkpoint: CheckpointHandle, reads: Reads) -> Self {
        ScriptedSource {
            counts: s.partitions.iter().map(|c| i64::from(*c)).collect(),
            positions: vec![0; s.partitions.len()],
            batch: i64::from(s.source_batch.max(1)),
            pace: Duration::from_millis(u64::from(s.pace_ms)),
            announced: false,
            next_partition: 0,
            batches: 0,
            commit_every: s.commit_every.map(u64::from),
            checkpoint,
            reads,
        }
    }
}

#[async_trait]
impl Source for ScriptedSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if !self.announced {
            self.announced = true;
            return Ok(SourceEvent::Assigned(
                (0..self.counts.len() as u32).map(PartitionId).collect(),
            ));
        }
        let n = self.counts.len();
        for i in 0..n {
            let p = (self.next_partition + i) % n;
            if self.positions[p] >= self.counts[p] {
                continue;
            }
            if !self.pace.is_zero() {
                tokio::time::sleep(self.pace).await;
            }
            self.next_partition = (p + 1) % n;
            let from = self.positions[p];
            let to = (from + self.batch).min(self.counts[p]);
            self.positions[p] = to;
            let mut batch = PollBatch::new(PartitionId(p as u32));
            batch.records = etl_record::reuse::records((to - from) as usize);
            for o in from..to {
                self.reads.add(p as u32, o);
                batch.records.push(Record::new(
                    Position::new(SourceId::new("sim"), PartitionId(p as u32), Offset(o)),
                    value(p as u32, o),
                ));
            }
            self.batches += 1;
            if self
                .commit_every
                .is_some_and(|every| self.batches.is_multiple_of(every))
            {
                // A failed commit is the checkpointer's to report.
                let _ = self.checkpoint.commit().await;
            }
            return Ok(SourceEvent::Batch(batch));
        }
        Ok(SourceEvent::End)
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        if let Some(pos) = self.positions.get_mut(partition.0 as usize) {
            *pos = offset.0.max(0);
        }
        Ok(())
    }
}

/// The output files on the disk now, in order: finished segments
/// (`<output>.1`, ...), then the active file.
pub fn output_files(fs: &dyn Fs) -> Vec<PathBuf> {
    let Ok(names) = fs.read_dir(Path::new(OUT_DIR)) else {
        return Vec::new();
    };
    let mut segments: Vec<u64> = names
        .iter()
        .filter_map(|n| n.to_str()?.strip_prefix("records.ndjson.")?.parse().ok())
        .collect();
    segments.sort_unstable();
    let mut files: Vec<PathBuf> = segments
        .into_iter()
        .map(|n| PathBuf::from(format!("{OUTPUT}.{n}")))
        .collect();
    if fs.exists(Path::new(OUTPUT)) {
        files.push(PathBuf::from(OUTPUT));
    }
    files
}

/// Every record a complete line of the output files on `disk` holds.
fn durable_lines(disk: &SimFs) -> BTreeSet<(u32, i64)> {
    let fs = disk.process();
    let mut held = BTreeSet::new();
    for file in output_files(&fs) {
        let Ok(bytes) = fs.read(&file) else { continue };
        for line in bytes.split_inclusive(|b| *b == b'\n') {
            if let Some(record) = line.strip_suffix(b"\n").and_then(key) {
                held.insert(record);
            }
        }
    }
    held
}

/// Every record a complete line of the output holds now.
fn held_now(fs: &dyn Fs) -> BTreeSet<(u32, i64)> {
    let mut held = BTreeSet::new();
    for file in output_files(fs) {
        let Ok(bytes) = fs.read(&file) else { continue };
        for line in bytes.split(|b| *b == b'\n') {
            if let Some(record) = key(line) {
                held.insert(record);
            }
        }
    }
    held
}
