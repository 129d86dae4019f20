//! [`ScriptedSource`]: a source that plays a script.
//!
//! Its partitions are dense logs of `len` records each, record `o` of
//! partition `p` being `{"p":P,"o":O}`. The script says what the source
//! announces and reads, step by step: events (assignments, revocations,
//! anything a [`Source`] returns), reads of `n` records of one partition
//! from its cursor, and a final drain. Every seek the driver asks for is
//! logged, so a test can check where a partition was resumed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};

/// One step of a [`ScriptedSource`]'s script.
#[derive(Debug)]
pub enum Step {
    /// Return this event. An assignment puts the partitions' cursors at
    /// 0; a revocation forgets them.
    Event(SourceEvent),
    /// A batch of up to `n` records of a partition from its cursor on
    /// (skipped when the partition is not assigned or at its end).
    Read(PartitionId, usize),
    /// Read every assigned partition to its end in batches of `n`, then
    /// [`SourceEvent::End`].
    Drain(usize),
}

/// Every seek a source received, in order.
pub type SeekLog = Arc<Mutex<Vec<(PartitionId, Offset)>>>;

/// A source that follows a script over dense partitions of `len` records,
/// and logs every seek. When the script is done it returns
/// [`SourceEvent::End`].
#[derive(Debug)]
pub struct ScriptedSource {
    id: SourceId,
    len: i64,
    cursors: BTreeMap<PartitionId, i64>,
    script: VecDeque<Step>,
    seeks: SeekLog,
}

impl ScriptedSource {
    /// A source of partitions of `len` records following `script`, and
    /// the log of the seeks it will receive.
    pub fn new(len: i64, script: Vec<Step>) -> (Self, SeekLog) {
        let seeks = Arc::new(Mutex::new(Vec::new()));
        let source = ScriptedSource {
            id: SourceId::new("scripted"),
            len,
            cursors: BTreeMap::new(),
            script: script.into(),
            seeks: seeks.clone(),
        };
        (source, seeks)
    }

    fn read(&mut self, p: PartitionId, n: usize) -> Option<PollBatch> {
        let cursor = self.cursors.get_mut(&p)?;
        let end = cursor
            .saturating_add(i64::try_from(n).unwrap_or(i64::MAX))
            .min(self.len);
        let records: Vec<Record> = (*cursor..end)
            .map(|o| {
                let pos = Position::new(self.id.clone(), p, Offset(o));
                Record::new(pos, format!("{{\"p\":{},\"o\":{o}}}", p.0))
            })
            .collect();
        *cursor = end.max(*cursor);
        (!records.is_empty()).then(|| PollBatch::from_records(p, records))
    }
}

#[async_trait]
impl Source for ScriptedSource {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        loop {
            if let Some(Step::Drain(n)) = self.script.front() {
                let n = *n;
                let partitions: Vec<PartitionId> = self.cursors.keys().copied().collect();
                for p in partitions {
                    if let Some(batch) = self.read(p, n) {
                        return Ok(SourceEvent::Batch(batch));
                    }
                }
                return Ok(SourceEvent::End);
            }
            match self.script.pop_front() {
                None => return Ok(SourceEvent::End),
                Some(Step::Event(event)) => {
                    match &event {
                        SourceEvent::Assigned(ps) => {
                            for p in ps {
                                self.cursors.insert(*p, 0);
                            }
                        }
                        SourceEvent::Revoked(ps) => {
                            for p in ps {
                                self.cursors.remove(p);
                            }
                        }
                        _ => {}
                    }
                    return Ok(event);
                }
                Some(Step::Read(p, n)) => {
                    if let Some(batch) = self.read(p, n) {
                        return Ok(SourceEvent::Batch(batch));
                    }
                }
                Some(Step::Drain(_)) => {}
            }
        }
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        self.seeks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((partition, offset));
        let cursor = self
            .cursors
            .get_mut(&partition)
            .ok_or(SourceError::UnknownPartition { partition })?;
        *cursor = offset.0;
        Ok(())
    }
}
