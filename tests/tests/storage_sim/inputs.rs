//! The real file source's side of the storage simulation: input files on
//! the simulated disk, what another program does to them between runs,
//! and what the model must know of them (which records exist, which
//! byte position of which partition each was read at).
//!
//! Every line is a record of its own: `<generation>:<line>:` padded with
//! `x` to [`LINE_BYTES`]. Lines written together share a generation, and
//! every change writes a new one, so no two lines ever written are the
//! same text and the output tells exactly which were delivered.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use etl_checkpoint::CheckpointHandle;
use etl_fs::{Fs, Mutation, OpenOptions, SimFs};
use etl_record::{Offset, PartitionId, PartitionOffsets};
use etl_source::{FileSource, Source, SourceError, SourceEvent};

use super::scenario::InputChange;
use super::world::{Reads, key};

/// The inputs' folder.
pub const IN_DIR: &str = "/data/in";
/// The pattern the source reads: rotated files match it too.
pub const PATTERN: &str = "/data/in/*.log";
/// Bytes of every input line, its newline included.
pub const LINE_BYTES: usize = 100;
/// Lines a rewrite in place keeps: the first KiB and more, so the file's
/// fingerprint does not change.
const KEPT: usize = 1024 / LINE_BYTES + 1;

/// What the inputs hold now, and every record they ever held.
#[derive(Clone, Debug, Default)]
pub struct Content {
    /// Each input file's lines, by path.
    pub files: BTreeMap<PathBuf, Vec<(u32, i64)>>,
    /// Every record ever written to an input.
    pub ever: BTreeSet<(u32, i64)>,
    /// Only appends changed the inputs: nothing is read twice by design.
    pub only_appends: bool,
    next_generation: u32,
    rotations: u32,
}

fn input(file: usize) -> PathBuf {
    PathBuf::from(format!("{IN_DIR}/in{file}.log"))
}

fn line((g, n): (u32, i64)) -> Vec<u8> {
    let mut text = format!("{g}:{n}:").into_bytes();
    text.resize(LINE_BYTES - 1, b'x');
    text.push(b'\n');
    text
}

fn bytes(lines: &[(u32, i64)]) -> Vec<u8> {
    lines.iter().flat_map(|l| line(*l)).collect()
}

impl Content {
    /// Write the first inputs (`lines[i]` lines in file `i`) durably, as
    /// an operator's export would be before the first run.
    pub fn create(sim: &SimFs, lines: &[u8]) -> io::Result<Content> {
        let mut content = Content {
            only_appends: true,
            ..Content::default()
        };
        sim.create_dir_all(Path::new(IN_DIR))?;
        for (i, n) in lines.iter().enumerate() {
            let records = content.generation(usize::from(*n));
            sim.apply(&Mutation::Replace {
                path: input(i),
                bytes: bytes(&records),
            })?;
            sync(sim, &input(i))?;
            content.files.insert(input(i), records);
        }
        sim.sync_dir(Path::new(IN_DIR))?;
        sim.sync_dir(Path::new("/data"))?;
        Ok(content)
    }

    fn generation(&mut self, lines: usize) -> Vec<(u32, i64)> {
        let g = self.next_generation;
        self.next_generation += 1;
        let records: Vec<(u32, i64)> = (0..lines as i64).map(|n| (g, n)).collect();
        self.ever.extend(records.iter().copied());
        records
    }

    /// Another program changes input `file` (modulo the inputs there
    /// are), durably, between two runs.
    pub fn change(&mut self, sim: &SimFs, file: u8, change: InputChange) -> io::Result<()> {
        // Another program: a process of its own.
        let sim = &sim.process();
        let count = self.files.keys().filter(|p| !is_rotated(p)).count().max(1);
        let path = input(usize::from(file) % count);
        let old = self.files.get(&path).cloned().unwrap_or_default();
        if change != InputChange::Append {
            self.only_appends = false;
        }
        match change {
            InputChange::Rewrite => {
                // `cat next > in.log`: the same inode, at least as long,
                // the same first KiB when the file held that much.
                let kept = if old.len() >= KEPT { KEPT } else { 0 };
                let mut new = old[..kept].to_vec();
                new.extend(self.generation(old.len() - kept + 3));
                sim.apply(&Mutation::RewriteInPlace {
                    path: path.clone(),
                    bytes: bytes(&new),
                })?;
                self.files.insert(path.clone(), new);
            }
            InputChange::Rotate => {
                self.rotations += 1;
                let rotated = PathBuf::from(format!("{IN_DIR}/rotated{}.log", self.rotations));
                sim.apply(&Mutation::Rename {
                    from: path.clone(),
                    to: rotated.clone(),
                })?;
                sync(sim, &rotated)?;
                self.files.insert(rotated, old);
                let new = self.generation(KEPT + 1);
                sim.apply(&Mutation::Replace {
                    path: path.clone(),
                    bytes: bytes(&new),
                })?;
                self.files.insert(path.clone(), new);
            }
            InputChange::Truncate => {
                let keep = old.len() / 2;
                sim.apply(&Mutation::Truncate {
                    path: path.clone(),
                    len: (keep * LINE_BYTES) as u64,
                })?;
                self.files.insert(path.clone(), old[..keep].to_vec());
            }
            InputChange::Append => {
                let more = self.generation(4);
                sim.apply(&Mutation::Append {
                    path: path.clone(),
                    bytes: bytes(&more),
                })?;
                let mut new = old;
                new.extend(more);
                self.files.insert(path.clone(), new);
            }
        }
        sync(sim, &path)?;
        sim.sync_dir(Path::new(IN_DIR))
    }

    /// Every record the inputs hold now.
    pub fn existing(&self) -> BTreeSet<(u32, i64)> {
        self.files.values().flatten().copied().collect()
    }

    /// The offset a partition that delivered the whole input at `path`
    /// commits (its last line's start, plus one); 0 for an empty one.
    pub fn end_offset(&self, path: &Path) -> Option<i64> {
        self.files.get(path).map(|lines| {
            (lines.len().saturating_sub(1) * LINE_BYTES) as i64 + i64::from(!lines.is_empty())
        })
    }
}

fn is_rotated(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("rotated"))
}

fn sync(sim: &SimFs, path: &Path) -> io::Result<()> {
    sim.open(path, &OpenOptions::new().read(true))?.sync_all()
}

/// The real file source, counting what it reads and where, and asking
/// for commits every few batches as the scripted source does.
pub struct CountingSource {
    pub inner: FileSource,
    pub reads: Reads,
    pub checkpoint: CheckpointHandle,
    pub commit_every: Option<u64>,
    pub batches: u64,
}

impl std::fmt::Debug for CountingSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingSource")
            .field("batches", &self.batches)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Source for CountingSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        let event = self.inner.next().await?;
        if let SourceEvent::Batch(batch) = &event {
            for record in &batch.records {
                if let Some(k) = key(&record.value) {
                    self.reads
                        .add_at(k, record.position.partition.0, record.position.offset.0);
                }
            }
            self.batches += 1;
            if self
                .commit_every
                .is_some_and(|every| self.batches.is_multiple_of(every))
            {
                // A failed commit is the checkpointer's to report.
                let _ = self.checkpoint.commit().await;
            }
        }
        Ok(event)
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        self.inner.seek(partition, offset).await
    }

    async fn pause(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        self.inner.pause(partitions).await
    }

    async fn resume(&mut self, partitions: &[PartitionId]) -> Result<(), SourceError> {
        self.inner.resume(partitions).await
    }

    async fn commit(&mut self, offsets: &PartitionOffsets) -> Result<(), SourceError> {
        self.inner.commit(offsets).await
    }

    fn high_watermark(&self, partition: PartitionId) -> Option<Offset> {
        self.inner.high_watermark(partition)
    }
}
