//! The delivery contract (ARCHITECTURE.md §2) checked against what the
//! simulated disk holds after every run: what a crash left of the offset
//! store and the output, read as the next process would read them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use etl_checkpoint::{FileStore, OffsetStore};
use etl_fs::{Fs, SimFaults, SimFs};
use etl_sink::FileSink;

use super::inputs::Content;
use super::run::Ended;
use super::scenario::Scenario;
use super::world::{Excused, OUTPUT, Reads, STORE_DIR, key, output_files};

/// What the disk holds now.
struct Disk {
    /// Committed offsets, per partition.
    committed: BTreeMap<u32, i64>,
    /// The exactly-once sink's stored progress, per partition.
    progress: BTreeMap<u32, i64>,
    /// How often each record is in the output (complete lines).
    held: BTreeMap<(u32, i64), u32>,
}

/// The record an output line stands for, if the source could have read
/// it: one of the scripted partitions' offsets, or a line ever written to
/// an input file.
fn parse(line: &[u8], s: &Scenario, content: Option<&Content>) -> Option<(u32, i64)> {
    let (p, o) = key(line)?;
    if let Some(content) = content {
        return content.ever.contains(&(p, o)).then_some((p, o));
    }
    let count = *s.partitions.get(p as usize)?;
    (o >= 0 && o < i64::from(count)).then_some((p, o))
}

/// `settled`: the last run ended with everything synced (the recovery
/// run); until then an exactly-once output's bytes past its recorded
/// length are cut by the next open, whatever they hold.
fn read_disk(
    s: &Scenario,
    sim: &SimFs,
    content: Option<&Content>,
    settled: bool,
) -> Result<Disk, String> {
    // Read as an operator's tool would, after the run: nothing fails (the
    // next run sets its faults again).
    sim.set_faults(SimFaults::default());
    let fs = sim.process();
    let mut committed = BTreeMap::new();
    if fs.exists(Path::new(STORE_DIR)) {
        let mut store = FileStore::open_in(Arc::new(fs.clone()), STORE_DIR)
            .map_err(|e| format!("the offset store cannot be opened after the run: {e}"))?;
        let offsets = store
            .load()
            .map_err(|e| format!("the offset store cannot be read after the run: {e}"))?;
        committed.extend(offsets.iter().map(|(p, o)| (p.0, o.0)));
    }
    let progress = FileSink::stored_progress_in(&fs, OUTPUT)
        .map_err(|e| format!("the output's progress cannot be read after the run: {e}"))?
        .map(|p| p.iter().map(|(p, o)| (p.0, o.0)).collect())
        .unwrap_or_default();
    let mut held: BTreeMap<(u32, i64), u32> = BTreeMap::new();
    for file in output_files(&fs) {
        let bytes = fs
            .read(&file)
            .map_err(|e| format!("{} cannot be read: {e}", file.display()))?;
        let mut at = 0;
        // A last line without its line break is a cut-off append: the
        // next open cuts it.
        for line in bytes.split_inclusive(|b| *b == b'\n') {
            if let Some(line) = line.strip_suffix(b"\n") {
                let record = parse(line, s, content);
                if record.is_none() && s.exactly_once && !settled {
                    at += line.len() + 1;
                    continue;
                }
                let record = record.ok_or_else(|| {
                    format!(
                        "{} holds a line that is no record the source read, at byte {at}: {:?}",
                        file.display(),
                        String::from_utf8_lossy(line)
                    )
                })?;
                *held.entry(record).or_default() += 1;
            }
            at += line.len();
        }
    }
    Ok(Disk {
        committed,
        progress,
        held,
    })
}

/// Check the disk after a run; the first violation found, if any.
pub fn check(
    s: &Scenario,
    sim: &SimFs,
    reads: &Reads,
    excused: &Excused,
    content: Option<&Content>,
    ended: &Ended,
    recovery: bool,
) -> Result<(), String> {
    // An exactly-once output another program truncated or replaced is
    // refused from then on (shorter than its progress records): lost
    // output, for an operator to restore.
    let refused = s.exactly_once && excused.any();
    match ended {
        Ended::Panicked(text) => return Err(format!("a panic escaped the run: {text}")),
        Ended::Hung => return Err("the run did not end within its bound".to_owned()),
        Ended::SecondWriter(what) => {
            return Err(format!(
                "{what} while the run held it: a second name for a locked file must be refused"
            ));
        }
        Ended::AckedNotDurable(what) => return Err(what.clone()),
        Ended::Returned(Ok(_)) => {}
        other if recovery && !refused => {
            return Err(format!(
                "the recovery run (every fault healed) did not finish: {other:?}"
            ));
        }
        _ => {}
    }
    let disk = read_disk(s, sim, content, recovery)?;
    // No record is written more often than it was read: a write follows a
    // read (a replay reads again).
    for (&(p, o), &n) in &disk.held {
        let read = reads.get(p, o);
        if n > read {
            return Err(format!(
                "record {p}:{o} is in the output {n} times but was read {read} times"
            ));
        }
    }
    // Committed (or covered by the exactly-once sink's stored progress)
    // means durably in the output.
    let covered = |what: &str, offsets: &BTreeMap<u32, i64>| -> Result<(), String> {
        for (&p, &c) in offsets {
            if content.is_some() {
                // A byte position: every record read before it.
                for (g, n) in reads.read_before(p, c) {
                    if !disk.held.contains_key(&(g, n)) && !excused.contains(g, n) {
                        return Err(format!(
                            "input partition {p} {what} byte {c}, but record {g}:{n}, read \
                             before it, is not in the output"
                        ));
                    }
                }
                continue;
            }
            for o in 0..c {
                if !disk.held.contains_key(&(p, o)) && !excused.contains(p, o) {
                    return Err(format!(
                        "partition {p} {what} {c}, but record {p}:{o} is not in the output"
                    ));
                }
            }
        }
        Ok(())
    };
    covered("committed", &disk.committed)?;
    if s.exactly_once {
        covered("has stored progress", &disk.progress)?;
    }
    if let Some(content) = content {
        if recovery && !refused {
            return inputs_recovered(s, sim, content, excused, &disk);
        }
        return Ok(());
    }
    if recovery && !refused {
        for (p, count) in s.partitions.iter().enumerate() {
            let p = p as u32;
            let want = i64::from(*count);
            let mut got = disk.committed.get(&p).copied().unwrap_or(0);
            if s.exactly_once {
                got = got.max(disk.progress.get(&p).copied().unwrap_or(0));
            }
            if want > 0 && got < want {
                return Err(format!(
                    "after the recovery run partition {p} committed {got} of {want} records"
                ));
            }
            for o in 0..want {
                let n = disk.held.get(&(p, o)).copied().unwrap_or(0);
                if n == 0 && !excused.contains(p, o) {
                    return Err(format!(
                        "after the recovery run record {p}:{o} is not in the output"
                    ));
                }
                if s.exactly_once && n > 1 && !excused.any() {
                    return Err(format!(
                        "the exactly-once output holds record {p}:{o} {n} times"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// After the recovery run over input files: every record the inputs hold
/// now is in the output, every input's partition committed its whole
/// length, and (exactly-once, when nothing was meant to be read twice)
/// no record is in the output twice.
fn inputs_recovered(
    s: &Scenario,
    sim: &SimFs,
    content: &Content,
    excused: &Excused,
    disk: &Disk,
) -> Result<(), String> {
    for (g, n) in content.existing() {
        if !disk.held.contains_key(&(g, n)) && !excused.contains(g, n) {
            return Err(format!(
                "after the recovery run record {g}:{n}, in an input now, is not in the output"
            ));
        }
    }
    let registered = etl_source::registered_inputs_in(&sim.process(), Path::new(STORE_DIR))
        .map_err(|e| format!("the record of inputs cannot be read after the run: {e}"))?;
    for (p, path) in registered {
        let Some(want) = content.end_offset(&path) else {
            continue;
        };
        let mut got = disk.committed.get(&p.0).copied().unwrap_or(0);
        if s.exactly_once {
            got = got.max(disk.progress.get(&p.0).copied().unwrap_or(0));
        }
        if want > 0 && got < want {
            return Err(format!(
                "after the recovery run input partition {} ({}) committed offset {got} of {want}",
                p.0,
                path.display()
            ));
        }
    }
    if s.exactly_once
        && content.only_appends
        && !excused.any()
        && let Some(((g, n), times)) = disk.held.iter().find(|(_, n)| **n > 1)
    {
        return Err(format!(
            "the exactly-once output holds record {g}:{n} {times} times"
        ));
    }
    Ok(())
}
