//! The reference model of the delivery contract (ARCHITECTURE.md §2),
//! checked against the world after every run.

use std::collections::{BTreeMap, BTreeSet};

use super::run::Ended;
use etl_postgres_cdc::Lsn;

use super::scenario::{Features, Scenario, Slot};
use super::world::{State, apply_steps, hits, value};

/// The fate the transform steps give each record, as the model sees it.
struct Fates {
    /// (partition, offset) -> per sink, the values it must hold.
    kept: BTreeMap<(u32, i64), Vec<Vec<String>>>,
    /// Records that must reach the dead-letter sink (source rejects, and
    /// rejects of the shared steps or of a sink's own).
    rejected: BTreeSet<(u32, i64)>,
}

fn fates(s: &Scenario) -> Fates {
    let n = s.partitions.len() as u32;
    let source_rejects: BTreeSet<(u32, i64)> = s
        .source_rejects
        .iter()
        .map(|(p, o)| (u32::from(*p), *o))
        .filter(|(p, _)| *p < n)
        .collect();
    let mut kept = BTreeMap::new();
    let mut rejected = BTreeSet::new();
    for pi in 0..s.partitions.len() {
        let p = pi as u32;
        for o in s.offsets(pi) {
            if source_rejects.contains(&(p, o)) {
                rejected.insert((p, o));
                continue;
            }
            let out = apply_steps(&s.steps, p, o, value(p, o));
            if out.rejected {
                rejected.insert((p, o));
                continue;
            }
            let mut per_sink = vec![Vec::new(); s.sinks.len()];
            let (takes, refused) = routes(s, o);
            if refused && !out.kept.is_empty() {
                rejected.insert((p, o));
            }
            for (i, takes) in takes.into_iter().enumerate() {
                if !takes {
                    continue;
                }
                for v in &out.kept {
                    let branch = apply_steps(&s.sinks[i].branch, p, o, v.clone());
                    if branch.rejected {
                        rejected.insert((p, o));
                    }
                    per_sink[i].extend(branch.kept);
                }
            }
            kept.insert((p, o), per_sink);
        }
    }
    Fates { kept, rejected }
}

/// Which sinks take the record at `offset` (conditions depend on the
/// offset only, so every copy of a record goes the same way), and whether
/// a condition could not judge it (then it is dead-lettered).
fn routes(s: &Scenario, offset: i64) -> (Vec<bool>, bool) {
    let n = s.sinks.len();
    let unmatched = s.unmatched.map(usize::from);
    // Some(true): takes it; Some(false): does not; None: cannot judge.
    let judge = |i: usize| match s.sinks[i].when {
        None => Some(true),
        Some(w) if w.refuses.is_some_and(|r| i64::from(r) == offset) => None,
        Some(w) => Some(hits(offset, w.every, w.at)),
    };
    let mut takes = vec![false; n];
    let mut refused = false;
    if s.exclusive {
        for i in (0..n).filter(|i| Some(*i) != unmatched) {
            match judge(i) {
                Some(true) => {
                    takes[i] = true;
                    return (takes, false);
                }
                Some(false) => {}
                None => return (takes, true),
            }
        }
        if let Some(u) = unmatched {
            takes[u] = true;
        }
    } else {
        let mut matched = false;
        for i in (0..n).filter(|i| Some(*i) != unmatched) {
            match judge(i) {
                Some(true) => {
                    takes[i] = true;
                    matched |= s.sinks[i].when.is_some();
                }
                Some(false) => {}
                None => refused = true,
            }
        }
        if let Some(u) = unmatched
            && !matched
            && !refused
        {
            takes[u] = true;
        }
    }
    (takes, refused)
}

/// Whether a healed pipeline can read all its input: not when records
/// must be dead-lettered and there is no dead-letter sink (then it halts,
/// by design).
fn can_finish(s: &Scenario, fates: &Fates) -> bool {
    s.dead_letter.is_some() || fates.rejected.is_empty()
}

/// Check the world after a run; the first violation found, if any.
pub fn check(
    s: &Scenario,
    state: &State,
    ended: &Ended,
    recovery: bool,
    features: Features,
) -> Result<(), String> {
    let features_exact = features.exact_poison_attribution;
    let environment = features.environment_failures;
    let fates = fates(s);
    let dlq_index = s.sinks.len();
    let dead: BTreeSet<(u32, i64)> = state.sinks[dlq_index]
        .contents
        .iter()
        .map(|(p, o, _)| (*p, *o))
        .collect();

    // How the run ended.
    match ended {
        Ended::Panicked(text) => return Err(format!("a panic escaped Pipeline::run: {text}")),
        Ended::Hung { bound } => {
            return Err(format!(
                "the run did not end within its bound of {bound:?} (virtual time)"
            ));
        }
        Ended::Returned(Err(etl::PipelineError::Internal(text))) if state.panics_this_run == 0 => {
            return Err(format!("internal error without a scripted panic: {text}"));
        }
        // A failed commit is retried by the next one, and a revoked
        // partition's next owner reads on from the last commit: it ends no
        // run (only the final commit's failure is the run's).
        Ended::Returned(Err(
            e @ etl::PipelineError::Source(etl_source::SourceError::Checkpoint(
                etl_checkpoint::CheckpointError::Commit { .. },
            )),
        )) => {
            return Err(format!("a failed commit ended the run: {e}"));
        }
        Ended::Returned(Err(e)) if recovery && can_finish(s, &fates) => {
            return Err(format!("the recovery run (every fault healed) failed: {e}"));
        }
        _ => {}
    }

    if let Some(slot) = &s.slot {
        check_slot_offsets(slot, state)?;
    }

    // A sink holds only what its route sends it: no record routed
    // elsewhere, filtered, or set aside by the steps.
    for (i, sink) in state.sinks[..dlq_index].iter().enumerate() {
        for (p, o, v) in &sink.contents {
            let sent = fates
                .kept
                .get(&(*p, *o))
                .and_then(|per_sink| per_sink.get(i))
                .is_some_and(|values| values.contains(v));
            if !sent {
                return Err(format!(
                    "sink{i} holds record {p}:{o} (value {v:?}), which its route does not send it"
                ));
            }
        }
    }

    // Committed c => every record below c is in every sink it was routed
    // to, filtered, or dead-lettered.
    let committed = &state.committed;
    let mut sink_values: Vec<BTreeMap<(u32, i64), Vec<&str>>> = Vec::new();
    for sink in &state.sinks[..dlq_index] {
        let mut held: BTreeMap<(u32, i64), Vec<&str>> = BTreeMap::new();
        for (p, o, v) in &sink.contents {
            held.entry((*p, *o)).or_default().push(v.as_str());
        }
        sink_values.push(held);
    }
    let delivered = |p: u32,
                     o: i64,
                     sinks: &mut dyn Iterator<Item = usize>|
     -> Result<(), String> {
        if fates.rejected.contains(&(p, o)) {
            return if dead.contains(&(p, o)) {
                Ok(())
            } else {
                Err(format!(
                    "record {p}:{o} was rejected but is not in the dead-letter sink"
                ))
            };
        }
        if dead.contains(&(p, o)) {
            return Ok(());
        }
        let per_sink = fates.kept.get(&(p, o));
        for i in sinks {
            let want = per_sink
                .and_then(|w| w.get(i))
                .map_or(&[][..], Vec::as_slice);
            let held = sink_values[i].get(&(p, o)).map_or(&[][..], Vec::as_slice);
            if let Some(missing) = want.iter().find(|v| !held.contains(&v.as_str())) {
                return Err(format!(
                    "record {p}:{o} (value {missing:?}) is not in sink{i} and was not dead-lettered"
                ));
            }
        }
        Ok(())
    };
    for (partition, c) in committed {
        let p = partition.0;
        for o in 0..c.0 {
            delivered(p, o, &mut (0..dlq_index))
                .map_err(|e| format!("partition {p} committed {}: {e}", c.0))?;
        }
    }

    if let Some(slot) = &s.slot {
        // No position the server was ever confirmed at (a restarted
        // server comes back at one of them) passes a change that is not
        // delivered.
        let server = &state.slot;
        for at in server.history.iter().chain([&server.confirmed]) {
            for t in slot.layout().iter().filter(|t| t.commit < at.0) {
                for o in t.first..t.first + t.changes {
                    delivered(0, o, &mut (0..dlq_index)).map_err(|e| {
                        format!(
                            "slot confirmed at {at}, past the transaction committing at {}: {e}",
                            etl_postgres_cdc::Lsn(t.commit)
                        )
                    })?;
                }
            }
        }
    }

    if s.exactly_once {
        let sink = &state.sinks[0];
        // The position a run resumes from (the lower of the commit and the
        // sink's progress: the sink's progress alone may pass a record whose
        // dead letter is not written yet, the sink skips what it covers)
        // covers only records delivered everywhere.
        for (partition, next) in sink.progress.iter() {
            let p = partition.0;
            let resume = committed.get(&partition).map_or(0, |c| c.0).min(next.0);
            for o in 0..resume {
                delivered(p, o, &mut std::iter::once(0)).map_err(|e| {
                    format!("exactly-once resume position of partition {p} is {resume}: {e}")
                })?;
            }
        }
        // No record twice.
        let mut seen = BTreeSet::new();
        for (p, o, v) in &sink.contents {
            if !seen.insert((p, o, v)) {
                return Err(format!(
                    "exactly-once sink holds record {p}:{o} (value {v:?}) twice"
                ));
            }
        }
    }

    // Dead letters: only records that had to go there.
    for (p, o, line) in &state.sinks[dlq_index].contents {
        let key = (*p, *o);
        if fates.rejected.contains(&key) {
            continue;
        }
        let mut failed_alone = false;
        let mut failed_in_any = false;
        let mut on_broken_sink = false;
        for (i, spec) in s.sinks.iter().enumerate() {
            let writes = &state.sinks[i].writes;
            // Only a failure of the records' own (not of the environment)
            // can justify a dead letter.
            let alone = writes.iter().any(|w| {
                !w.ok
                    && !w.environment
                    && !w.records.is_empty()
                    && w.records.iter().all(|r| *r == key)
            });
            let any = writes
                .iter()
                .any(|w| !w.ok && !w.environment && w.records.contains(&key));
            let broken = writes
                .iter()
                .any(|w| !w.ok && w.environment && w.records.contains(&key));
            failed_alone |= alone;
            failed_in_any |= any;
            if broken && !spec.dead_letter_failures {
                on_broken_sink = true;
            }
        }
        // Failed only where the environment was at fault, on whatever sink.
        if environment && on_broken_sink && !failed_in_any {
            return Err(format!(
                "record {p}:{o} was dead-lettered because a sink's environment is broken \
                 (it fails whatever the record): that must halt, not isolate; letter {line}"
            ));
        }
        let sink_dead_letters = s.sinks.iter().any(|k| k.dead_letter_failures);
        let justified = if features_exact && !sink_dead_letters {
            failed_alone
        } else {
            failed_in_any
        };
        if !justified {
            return Err(format!(
                "record {p}:{o} was dead-lettered although no write {} failed; letter {line}",
                if features_exact && !sink_dead_letters {
                    "of it alone"
                } else {
                    "holding it"
                }
            ));
        }
    }

    // After the recovery run, everything is committed.
    if recovery && can_finish(s, &fates) {
        for p in 0..s.partitions.len() {
            let want = s.end_offset(p);
            if want == 0 {
                continue;
            }
            let partition = etl_record::PartitionId(p as u32);
            let mut got = committed.get(&partition).map_or(0, |c| c.0);
            if s.exactly_once {
                // The sink's progress is where the source resumes.
                let progress = state.sinks[0].progress.get(partition);
                got = got.max(progress.map_or(0, |o| o.0));
            }
            if got < want {
                return Err(format!(
                    "after the recovery run partition {p} committed {got} of {want} records"
                ));
            }
        }
    }
    Ok(())
}

/// A slot's offsets and confirmations: every change took the offset the
/// rule gives it from the WAL alone (its commit LSN, or right after the
/// previous transaction's last offset), whenever it was sent; and each
/// position confirmed lay below every change not committed by then.
fn check_slot_offsets(slot: &Slot, state: &State) -> Result<(), String> {
    let layout = slot.layout();
    let server = &state.slot;
    if let Some(v) = server.violations.first() {
        return Err(v.clone());
    }
    for (&(i, j), &offset) in &server.given {
        let want = layout[i].first + j;
        if offset != want {
            return Err(format!(
                "slot: change {j} of transaction {i} (commit {}) took offset {offset}, not {want}",
                Lsn(layout[i].commit)
            ));
        }
    }
    for &(at, committed) in &server.confirmations {
        let passed = layout
            .iter()
            .enumerate()
            .find(|(_, t)| t.commit < at.0 && t.changes > 0 && t.first + t.changes > committed);
        if let Some((i, t)) = passed {
            return Err(format!(
                "slot confirmed at {at} with offset {committed} committed: past transaction {i} \
                 (commit {}, offsets {}..{})",
                Lsn(t.commit),
                t.first,
                t.first + t.changes
            ));
        }
    }
    Ok(())
}
