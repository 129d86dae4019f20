//! The life of one batch: write with retries, route failures, resolve.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use etl_ack::{AckRef, AckSet};
use etl_record::{DeadLetter, Offset, PartitionId};
use tokio::time::Instant;

use crate::batch::{SpareBuffer, SpareRecords, kept_at_most};
use crate::dead_letter::dead_letter_batch;
use crate::metrics::{MetricsCell, add};
use crate::{
    EncodedBatch, FailureKind, PermanentErrorPolicy, Progress, Sink, SinkDriverConfig,
    SinkDriverError, SinkError,
};

/// What every write of one driver shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) sink: Arc<dyn Sink>,
    pub(crate) dead_letters: Option<Arc<dyn Sink>>,
    pub(crate) config: SinkDriverConfig,
    pub(crate) metrics: Arc<MetricsCell>,
    /// An exactly-once driver writes nothing after a failed part of a
    /// batch: its stored progress would move past the failed records.
    pub(crate) exactly_once: bool,
    /// The byte buffer of the last batch written, for the next one.
    pub(crate) spare: SpareBuffer,
    /// The record vector of the last batch written, for the next one.
    pub(crate) spare_records: SpareRecords,
}

/// One batch on its way to the sink, with the handles it covers and the
/// records already refused by the encoder.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) batch: EncodedBatch,
    pub(crate) acks: AckSet,
    /// `ends[i]` is the end (exclusive) of the records of handle `i` of
    /// `acks` in `batch` (the source batches the write merges), and of its
    /// records in `refused`.
    pub(crate) ends: Vec<(usize, usize)>,
    pub(crate) refused: Vec<DeadLetter>,
}

/// How a job ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    Delivered,
    /// Some of the job's batches failed. Those of an exactly-once driver,
    /// which halts on the failure, come back unresolved (as with `Halt`)
    /// to fail after it said it halts; an at-least-once driver's have
    /// failed already (their partitions replay), and none come back.
    Failed(String, Vec<AckSet>),
    /// The sink failed whatever the records (an error of the environment,
    /// after the retry policy): the driver stops with this error. The
    /// job's handles come back unresolved: the driver closes its input
    /// before they fail, so no failure is seen upstream while this sink
    /// still looks alive (it would be taken for a record's fault).
    Halt(SinkDriverError, Vec<AckSet>),
}

/// How the write of one part (one source batch, or the whole job) ended.
enum Part {
    /// Not written: its partition is being revoked (an exactly-once
    /// driver). Its handles fail, which replays nothing (the epoch is
    /// over), and the driver goes on.
    Fenced,
    /// Durable, once `letters` are.
    Written,
    /// Failed because of its records: its handles fail and it replays.
    Failed(String),
    /// The sink cannot write, whatever the records.
    Halt(SinkError),
}

impl Shared {
    /// Whether a part refused for its data is dead-lettered by this
    /// driver. Never for an exactly-once sink: the writes that find the
    /// records at fault store progress past them before their dead
    /// letters exist, so a lost letter would be a lost record. There the
    /// batch fails instead (and the driver halts).
    fn dead_letters_failures(&self) -> bool {
        !self.exactly_once && self.config.on_permanent_error == PermanentErrorPolicy::DeadLetter
    }

    /// One write, retried by the policy, each attempt bounded by the
    /// configured timeout.
    async fn write_to(&self, sink: &dyn Sink, batch: &EncodedBatch) -> Result<(), SinkError> {
        let timeout = self.config.write_timeout;
        self.config
            .retry
            .run(
                || attempt(sink, batch, timeout),
                |_| add(&self.metrics.retries, 1),
            )
            .await
    }

    /// A write to the sink of `batch`, whose handles are `acks`, as
    /// [`write_to`](Self::write_to). An exactly-once driver first asks
    /// the handles' write fence, before the first attempt and before each
    /// retry: once a batch's partition is being revoked, no attempt
    /// starts ([`Attempted::Fenced`]), and an attempt under way is
    /// registered, so the revocation knows it may still land.
    async fn write_fenced(&self, batch: &EncodedBatch, acks: &AckSet) -> Attempted {
        if !self.exactly_once {
            return Attempted::Done(self.write_to(&*self.sink, batch).await);
        }
        let fenced = AtomicBool::new(false);
        let timeout = self.config.write_timeout;
        let sink = &*self.sink;
        let fenced_ref = &fenced;
        let result = self
            .config
            .retry
            .run(
                || {
                    // Registered now, before the attempt starts; released
                    // when it ends.
                    let guard = acks.begin_write();
                    async move {
                        let Some(_guard) = guard else {
                            fenced_ref.store(true, Ordering::Relaxed);
                            return Err(SinkError::Permanent(
                                "a partition of the batch is being revoked".into(),
                            ));
                        };
                        attempt(sink, batch, timeout).await
                    }
                },
                |_| add(&self.metrics.retries, 1),
            )
            .await;
        if fenced.load(Ordering::Relaxed) {
            Attempted::Fenced
        } else {
            Attempted::Done(result)
        }
    }

    /// Write dead letters durably; `Err` says why they are not.
    async fn write_dead_letters(&self, letters: Vec<DeadLetter>) -> Result<(), LetterFailure> {
        let Some(sink) = &self.dead_letters else {
            return Err(LetterFailure::Failed(format!(
                "{} record(s) need the dead-letter sink and there is none; first: {}",
                letters.len(),
                letters.first().map_or("", |l| l.reason.as_str())
            )));
        };
        let count = letters.len() as u64;
        let batch = dead_letter_batch(letters);
        match self.write_to(&**sink, &batch).await {
            Ok(()) => {
                add(&self.metrics.dead_lettered, count);
                Ok(())
            }
            Err(err) if err.kind() == FailureKind::Environment => Err(LetterFailure::Halt(err)),
            Err(err) => Err(LetterFailure::Failed(format!(
                "dead-letter write failed: {err}"
            ))),
        }
    }
}

/// One attempt of a write, bounded by `timeout`.
async fn attempt(
    sink: &dyn Sink,
    batch: &EncodedBatch,
    timeout: Option<std::time::Duration>,
) -> Result<(), SinkError> {
    match timeout {
        Some(limit) => tokio::time::timeout(limit, sink.write(batch))
            .await
            .unwrap_or(Err(SinkError::Timeout(limit))),
        None => sink.write(batch).await,
    }
}

/// How a fenced write ended.
enum Attempted {
    /// With this result, after the retry policy.
    Done(Result<(), SinkError>),
    /// Not started (or not retried): a batch's partition is being revoked.
    Fenced,
}

/// The records, handles and encoder refusals of a job, less those of
/// batches whose partition is being revoked (an exactly-once driver):
/// their handles fail now, which replays nothing (their epoch is over:
/// the next owner reads them from the stored progress). `false` when the
/// handles and `ends` do not match (never, as the driver builds jobs): the
/// job cannot be split, and fails whole.
fn drop_fenced(
    shared: &Shared,
    batch: &mut EncodedBatch,
    acks: &mut AckSet,
    ends: &mut Vec<(usize, usize)>,
    refused: &mut Vec<DeadLetter>,
) -> bool {
    let fenced: Vec<bool> = acks.iter().map(AckRef::is_fenced).collect();
    if !fenced.contains(&true) {
        return true;
    }
    if ends.len() != fenced.len() {
        return false;
    }
    let taken = acks.take_where(|i, _| fenced[i]);
    for ack in taken.iter() {
        let id = ack.batch_id();
        tracing::info!(
            partition = %id.partition, epoch = id.epoch, seq = id.seq,
            "the partition is being revoked: its batch is not written (its next owner writes it)"
        );
    }
    add(&shared.metrics.batches_fenced, taken.len() as u64);
    taken.fail();
    let mut keep = vec![false; batch.len()];
    let old_refused = std::mem::take(refused);
    let mut kept_ends = Vec::with_capacity(ends.len());
    let (mut start, mut refused_start, mut kept_records) = (0, 0, 0);
    for (&(end, refused_end), &fenced) in ends.iter().zip(&fenced) {
        let (end, refused_end) = (end.min(keep.len()), refused_end.min(old_refused.len()));
        if !fenced {
            for k in keep.iter_mut().take(end).skip(start) {
                *k = true;
            }
            kept_records += end.saturating_sub(start);
            refused.extend(
                old_refused
                    .get(refused_start.min(refused_end)..refused_end)
                    .unwrap_or_default()
                    .iter()
                    .cloned(),
            );
            kept_ends.push((kept_records, refused.len()));
        }
        start = end;
        refused_start = refused_end;
    }
    *batch = batch.select(|i| keep.get(i).copied().unwrap_or(false));
    *ends = kept_ends;
    true
}

/// Why dead letters are not durable.
enum LetterFailure {
    /// There is no dead-letter sink, or it refused the letters.
    Failed(String),
    /// The dead-letter sink cannot write, whatever the letters.
    Halt(SinkError),
}

/// Take the batches of partitions being handed over out of a job
/// ([`drop_fenced`]); the job's outcome when that ends it: failed if its
/// handles do not match its records, delivered if every batch was fenced
/// (and has failed).
fn fence_out(
    shared: &Shared,
    batch: &mut EncodedBatch,
    acks: &mut AckSet,
    ends: &mut Vec<(usize, usize)>,
    refused: &mut Vec<DeadLetter>,
) -> Option<Outcome> {
    if !drop_fenced(shared, batch, acks, ends, refused) {
        add(&shared.metrics.batches_failed, 1);
        return Some(Outcome::Failed(
            "a write's handles do not match its records".into(),
            vec![std::mem::take(acks)],
        ));
    }
    acks.is_empty().then_some(Outcome::Delivered)
}

/// Each record of an exactly-once job once: a replay that came while the
/// job's batch was being built repeats records an earlier handle of it
/// holds (its copies are the same records). A handle's records below the
/// next offset of its partition after the earlier handles' records go
/// (the rule by which `Driver::accept` skips what the sink's progress
/// covers); a handle's own records never do, as records a transform made
/// from one share its offset. The handles stay in the job, delivered when
/// the records they repeat are written. Run after the fenced handles'
/// records are gone, so a copy read again after a reassignment is kept
/// where the one it repeats was fenced.
fn drop_repeats(shared: &Shared, batch: &mut EncodedBatch, ends: &mut [(usize, usize)]) {
    if ends.len() < 2 {
        return;
    }
    let records = batch.records();
    let mut before = Progress::new();
    let mut keep = vec![true; records.len()];
    let mut start = 0;
    for &(end, _) in ends.iter() {
        let end = end.min(records.len()).max(start);
        // A handle's records are mostly of one partition: its entry is
        // looked up once a run, not once a record.
        let mut run: Option<(PartitionId, Option<Offset>)> = None;
        for (k, record) in keep[start..end].iter_mut().zip(&records[start..end]) {
            let partition = record.position.partition;
            let next = match run {
                Some((p, next)) if p == partition => next,
                _ => {
                    let next = before.get(partition);
                    run = Some((partition, next));
                    next
                }
            };
            *k = next.is_none_or(|next| record.position.offset >= next);
        }
        // Then past them, once a run of one partition.
        let mut run: Option<(PartitionId, Offset)> = None;
        for record in &records[start..end] {
            let (partition, next) = (record.position.partition, record.position.offset.next());
            match &mut run {
                Some((p, at)) if *p == partition => *at = (*at).max(next),
                _ => {
                    if let Some((p, at)) = run.replace((partition, next)) {
                        before.advance(p, at);
                    }
                }
            }
        }
        if let Some((p, at)) = run {
            before.advance(p, at);
        }
        start = end;
    }
    let repeats = keep.iter().filter(|&&k| !k).count();
    if repeats == 0 {
        return;
    }
    tracing::debug!(
        repeats,
        "a replay repeated records of the batch being built: each is written once"
    );
    add(&shared.metrics.skipped, repeats as u64);
    let mut kept = 0;
    let mut start = 0;
    for (end, _) in ends.iter_mut() {
        let stop = (*end).min(keep.len());
        kept += keep
            .get(start.min(stop)..stop)
            .unwrap_or_default()
            .iter()
            .filter(|&&k| k)
            .count();
        start = stop;
        *end = kept;
    }
    *batch = batch.select(|i| keep.get(i).copied().unwrap_or(false));
}

/// Run one job to its end. The handles are delivered only after every
/// record of the batch is durable in the sink or the dead-letter sink;
/// otherwise they fail. Dropping this future mid-way drops the set, which
/// fails it.
///
/// A write of several source batches that fails because of its data is
/// split: each source batch is written again on its own, so only the one
/// holding the bad record fails. The source side counts failures per
/// batch to find poison records; a merged write would blame (and replay,
/// and in the end dead-letter) every batch it merged.
pub(crate) async fn run_job(shared: Arc<Shared>, job: Job) -> Outcome {
    let started = Instant::now();
    let Job {
        mut batch,
        mut acks,
        mut ends,
        mut refused,
    } = job;
    if shared.exactly_once
        && let Some(over) = fence_out(&shared, &mut batch, &mut acks, &mut ends, &mut refused)
    {
        return over;
    }
    if shared.exactly_once {
        drop_repeats(&shared, &mut batch, &mut ends);
    }
    if shared.exactly_once && !refused.is_empty() {
        // The write stores progress past these records: their dead
        // letters must be durable first, or a crash or a failed letter
        // would lose them for good. (A replay writes them again.)
        match shared
            .write_dead_letters(std::mem::take(&mut refused))
            .await
        {
            Ok(()) => {}
            Err(LetterFailure::Halt(err)) => {
                add(&shared.metrics.batches_failed, 1);
                return Outcome::Halt(SinkDriverError::DeadLetter(err), vec![acks]);
            }
            Err(LetterFailure::Failed(reason)) => {
                // Only an exactly-once driver comes here, and it halts.
                add(&shared.metrics.batches_failed, 1);
                return Outcome::Failed(reason, vec![acks]);
            }
        }
    }
    let written = loop {
        if batch.is_empty() {
            break Ok(());
        }
        match shared.write_fenced(&batch, &acks).await {
            Attempted::Done(result) => break result,
            // A partition's revocation began before an attempt: write the
            // others' records afresh, without it.
            Attempted::Fenced => {
                if let Some(over) =
                    fence_out(&shared, &mut batch, &mut acks, &mut ends, &mut refused)
                {
                    return over;
                }
            }
        }
    };
    // Each part's handles with its outcome, in batch order, and the dead
    // letters of the parts written.
    let mut parts: Vec<(AckSet, Part)> = Vec::new();
    let letters = match written {
        Err(err)
            if err.kind() == FailureKind::Data && acks.len() > 1 && ends.len() == acks.len() =>
        {
            tracing::debug!(error = %err, batches = acks.len(), "a merged write failed on its data; writing its batches one by one");
            let mut sets = Vec::with_capacity(acks.len());
            while acks.len() > 1 {
                sets.push(acks.split_off(acks.len() - 1));
            }
            sets.push(acks);
            sets.reverse();
            let mut letters = Vec::new();
            let mut refused = refused.into_iter();
            let (mut start, mut refused_start) = (0, 0);
            let mut stop = false;
            for (set, (end, refused_end)) in sets.into_iter().zip(ends) {
                let range = start..end;
                start = end;
                // The batch's own encoder refusals: dead-lettered only if
                // the batch is written (a failed one is refused again when
                // it replays).
                let mut own: Vec<DeadLetter> = refused
                    .by_ref()
                    .take(refused_end.saturating_sub(refused_start))
                    .collect();
                refused_start = refused_start.max(refused_end);
                if stop {
                    // Not written: failing it is what dropping it does.
                    parts.push((
                        set,
                        Part::Failed("an earlier batch of the write failed".into()),
                    ));
                    continue;
                }
                let part = batch.select(|i| range.contains(&i));
                let result = if part.is_empty() {
                    Ok(())
                } else {
                    match shared.write_fenced(&part, &set).await {
                        Attempted::Done(result) => result,
                        Attempted::Fenced => {
                            parts.push((set, Part::Fenced));
                            continue;
                        }
                    }
                };
                let outcome = finish_part(&shared, result, part, &mut own).await;
                stop = match &outcome {
                    Part::Fenced => false,
                    Part::Halt(_) => true,
                    Part::Failed(_) => shared.exactly_once,
                    Part::Written => {
                        letters.append(&mut own);
                        false
                    }
                };
                parts.push((set, outcome));
            }
            letters
        }
        result => {
            let outcome = finish_part(&shared, result, batch, &mut refused).await;
            parts.push((acks, outcome));
            refused
        }
    };
    let outcome = resolve(&shared, parts, letters).await;
    shared.metrics.record_latency(started.elapsed());
    outcome
}

/// Whether `err` says the batch failed because of records it holds,
/// without saying which.
fn refused_for_its_data(err: &SinkError) -> bool {
    err.kind() == FailureKind::Data && !matches!(err, SinkError::Rejected(_))
}

/// Account for one part's write. Under [`PermanentErrorPolicy::DeadLetter`]
/// a part of several records refused for its data is narrowed down
/// first ([`isolate`]), so that only the records at fault are set aside.
async fn finish_part(
    shared: &Shared,
    written: Result<(), SinkError>,
    part: EncodedBatch,
    letters: &mut Vec<DeadLetter>,
) -> Part {
    match written {
        Err(err)
            if refused_for_its_data(&err) && part.len() > 1 && shared.dead_letters_failures() =>
        {
            tracing::debug!(error = %err, records = part.len(), "a write failed on its data; narrowing it down to the records at fault");
            isolate(shared, &part, letters).await
        }
        written => settle(shared, written, part, letters),
    }
}

/// Write `part`, known to fail on its data, in halves, each half that
/// fails on its data in halves again, in order: records written, records
/// that fail alone become dead letters. Costs about `2 * log2(len)`
/// writes per bad record, and only once a write failed.
async fn isolate(shared: &Shared, part: &EncodedBatch, letters: &mut Vec<DeadLetter>) -> Part {
    let halves = |r: std::ops::Range<usize>| {
        let mid = r.start + r.len() / 2;
        [mid..r.end, r.start..mid]
    };
    // Ranges still to write, the next one last.
    let mut todo: Vec<std::ops::Range<usize>> = halves(0..part.len()).to_vec();
    while let Some(range) = todo.pop() {
        let sub = part.select(|i| range.contains(&i));
        let written = shared.write_to(&*shared.sink, &sub).await;
        match written {
            Err(err) if refused_for_its_data(&err) && range.len() > 1 => {
                todo.extend(halves(range));
            }
            written => match settle(shared, written, sub, letters) {
                Part::Written => {}
                // The environment failed: the job halts. (A malformed
                // reject: the part fails and replays.)
                other => return other,
            },
        }
    }
    Part::Written
}

/// Account for one write's result; the records it sets aside (rejected,
/// or the whole part under [`PermanentErrorPolicy::DeadLetter`]) join
/// `letters`.
fn settle(
    shared: &Shared,
    written: Result<(), SinkError>,
    batch: EncodedBatch,
    letters: &mut Vec<DeadLetter>,
) -> Part {
    let m = &shared.metrics;
    match written {
        Ok(()) => {
            if !batch.is_empty() {
                add(&m.records_written, batch.len() as u64);
                add(&m.bytes_written, batch.bytes().len() as u64);
                add(&m.batches_written, 1);
            }
            // Its vector and its buffer, for this driver's next batch.
            let (records, bytes) = batch.into_parts();
            // At most what the driver's largest batch takes (a batch
            // reaches `batch_max_records` with the upstream batch that
            // crossed it).
            let at_most = kept_at_most(shared.config.batch_max_records);
            shared.spare_records.keep(records, at_most);
            shared
                .spare
                .keep(bytes, shared.config.batch_max_bytes.saturating_mul(2));
            Part::Written
        }
        Err(SinkError::Rejected(rejects)) => {
            let indices: BTreeSet<usize> = rejects.iter().map(|r| r.index).collect();
            if let Some(bad) = indices.iter().find(|&&i| i >= batch.len()) {
                return Part::Failed(format!(
                    "sink rejected record {bad} of a batch of {}",
                    batch.len()
                ));
            }
            let accepted_bytes: usize = (0..batch.len())
                .filter(|i| !indices.contains(i))
                .filter_map(|i| batch.range(i).map(|r| r.len()))
                .sum();
            add(&m.records_written, (batch.len() - indices.len()) as u64);
            add(&m.bytes_written, accepted_bytes as u64);
            add(&m.batches_written, 1);
            for reject in rejects {
                if let Some(record) = batch.records().get(reject.index) {
                    letters.push(DeadLetter::new(
                        record.clone(),
                        format!("rejected by the sink: {}", reject.reason),
                    ));
                }
            }
            Part::Written
        }
        Err(err) if err.kind() == FailureKind::Environment => Part::Halt(err),
        Err(err) => match shared.dead_letters_failures() {
            false => Part::Failed(err.to_string()),
            true => {
                let reason = format!("sink write failed: {err}");
                for record in batch.into_records() {
                    letters.push(DeadLetter::new(record, reason.clone()));
                }
                Part::Written
            }
        },
    }
}

/// Write the letters, then deliver or fail every part's handles.
async fn resolve(shared: &Shared, parts: Vec<(AckSet, Part)>, letters: Vec<DeadLetter>) -> Outcome {
    let m = &shared.metrics;
    let mut halt = None;
    let mut failure = None;
    for (_, part) in &parts {
        match part {
            Part::Fenced | Part::Halt(_) | Part::Written => {}
            Part::Failed(reason) => {
                failure.get_or_insert_with(|| reason.clone());
            }
        }
    }
    let mut parts: Vec<(AckSet, bool)> = parts
        .into_iter()
        .filter_map(|(acks, part)| match part {
            // Their partition is being revoked: they fail now, which
            // replays nothing, and halt nothing.
            Part::Fenced => {
                acks.fail();
                None
            }
            part => Some((acks, part)),
        })
        .map(|(acks, part)| match part {
            Part::Fenced => (acks, false),
            Part::Written => (acks, true),
            Part::Failed(_) => (acks, false),
            Part::Halt(err) => {
                halt.get_or_insert(err);
                (acks, false)
            }
        })
        .collect();
    if let Some(err) = halt {
        // Nothing of this job is delivered: the pipeline stops, and what
        // was written will be written again after the cause is fixed.
        add(&m.batches_failed, 1);
        return Outcome::Halt(
            err.into(),
            parts.into_iter().map(|(acks, _)| acks).collect(),
        );
    }
    if !letters.is_empty() && parts.iter().any(|(_, written)| *written) {
        match shared.write_dead_letters(letters).await {
            Ok(()) => {}
            Err(LetterFailure::Halt(err)) => {
                add(&m.batches_failed, 1);
                return Outcome::Halt(
                    SinkDriverError::DeadLetter(err),
                    parts.into_iter().map(|(acks, _)| acks).collect(),
                );
            }
            Err(LetterFailure::Failed(reason)) => {
                for (_, written) in &mut parts {
                    *written = false;
                }
                failure.get_or_insert(reason);
            }
        }
    }
    // An exactly-once driver halts on a failure: it hands the failed
    // batches back unresolved, to fail once it said it halts.
    let mut held = Vec::new();
    for (acks, written) in parts {
        if written {
            acks.deliver();
        } else if shared.exactly_once {
            held.push(acks);
        } else {
            acks.fail();
        }
    }
    match failure {
        None => Outcome::Delivered,
        Some(reason) => {
            if !shared.exactly_once {
                tracing::warn!(%reason, "sink batch failed; its partitions will replay");
            }
            add(&m.batches_failed, 1);
            Outcome::Failed(reason, held)
        }
    }
}
