//! Running a batch of records through the transforms in order.

use etl_record::{DeadLetter, Record};

use crate::{Outcome, Transform};

/// The transforms of a pipeline, applied in order.
#[derive(Debug, Default)]
pub struct TransformChain {
    stages: Vec<Box<dyn Transform>>,
}

/// What a batch became.
#[derive(Debug, Default)]
pub struct ChainOutput {
    /// Records to send to the sinks, in order.
    pub kept: Vec<Record>,
    /// Records set aside, with the stage and reason.
    pub rejected: Vec<DeadLetter>,
    /// Records dropped on purpose.
    pub filtered: u64,
    /// A record a stage halted on ([`Outcome::Halt`]), with the stage and
    /// reason; the records after it in the batch were not run.
    pub halted: Option<DeadLetter>,
}

impl ChainOutput {
    /// Empty the output for reuse, keeping its allocations.
    pub fn clear(&mut self) {
        self.kept.clear();
        self.rejected.clear();
        self.filtered = 0;
        self.halted = None;
    }
}

impl TransformChain {
    /// No transforms: every record passes unchanged.
    #[must_use]
    pub fn new() -> Self {
        TransformChain::default()
    }

    /// Append a stage.
    pub fn push(&mut self, stage: Box<dyn Transform>) {
        self.stages.push(stage);
    }

    /// Number of stages.
    #[must_use]
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// Whether there are no stages.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The last stage, whose output is the chain's.
    pub fn last_mut(&mut self) -> Option<&mut (dyn Transform + 'static)> {
        self.stages.last_mut().map(|s| &mut **s)
    }

    /// An independent copy of the chain for another worker, when every
    /// stage can [`fork`](Transform::fork); `None` otherwise.
    #[must_use]
    pub fn fork(&self) -> Option<TransformChain> {
        let stages = self
            .stages
            .iter()
            .map(|s| s.fork())
            .collect::<Option<Vec<_>>>()?;
        Some(TransformChain { stages })
    }

    /// Run `records` through every stage, appending to `out`.
    ///
    /// The records kept are written back into `records`' own allocation,
    /// in order (a batch's vector is large: a new one per batch costs a
    /// mapping and its page faults). From the first record a stage turns
    /// into several, the rest go to a vector of their own. If a stage
    /// panics, what this call kept so far is dropped with the batch;
    /// what `out` held before stays.
    pub fn apply(&mut self, records: Vec<Record>, out: &mut ChainOutput) {
        let kept = if self.stages.is_empty() {
            records
        } else {
            // Each record's output lands at the end of `out.kept`, past
            // `base`, and is taken back from there: one record is written
            // in place, several spill.
            let base = out.kept.len();
            let mut left = records.len();
            let mut spill: Option<Vec<Record>> = None;
            let mut kept: Vec<Record> = records
                .into_iter()
                .filter_map(|record| {
                    left -= 1;
                    if out.halted.is_some() {
                        return None;
                    }
                    self.run(0, record, out);
                    match (&mut spill, out.kept.len() - base) {
                        (None, 0) => None,
                        (None, 1) => out.kept.pop(),
                        (None, n) => {
                            let mut more = Vec::with_capacity(n + left);
                            more.extend(out.kept.drain(base..));
                            spill = Some(more);
                            None
                        }
                        (Some(spill), _) => {
                            spill.extend(out.kept.drain(base..));
                            None
                        }
                    }
                })
                .collect();
            if let Some(mut spill) = spill {
                kept.append(&mut spill);
            }
            kept
        };
        if out.kept.is_empty() {
            out.kept = kept;
        } else {
            out.kept.extend(kept);
        }
    }

    fn run(&mut self, from: usize, mut record: Record, out: &mut ChainOutput) {
        let mut i = from;
        while i < self.stages.len() {
            match self.stages[i].apply(record) {
                Outcome::Keep(r) => record = r,
                Outcome::Filtered => {
                    out.filtered += 1;
                    return;
                }
                Outcome::Many(records) => {
                    if records.is_empty() {
                        out.filtered += 1;
                    }
                    for r in records {
                        self.run(i + 1, r, out);
                    }
                    return;
                }
                Outcome::Reject(original, reason) => {
                    let name = self.stages[i].name();
                    out.rejected.push(DeadLetter::new(
                        original,
                        format!("transform {name}: {reason}"),
                    ));
                    return;
                }
                Outcome::Halt(original, reason) => {
                    let name = self.stages[i].name();
                    out.halted.get_or_insert_with(|| {
                        DeadLetter::new(original, format!("transform {name}: {reason}"))
                    });
                    return;
                }
            }
            i += 1;
        }
        out.kept.push(record);
    }
}

#[cfg(test)]
mod tests {
    use etl_record::{Offset, PartitionId, Position, SourceId};

    use super::*;
    use crate::{Refused, filter, flat_map, map};

    fn rec(offset: i64, value: &str) -> Record {
        Record::new(
            Position::new(SourceId::new("s"), PartitionId(0), Offset(offset)),
            value.as_bytes().to_vec(),
        )
    }

    #[test]
    fn every_record_has_an_explicit_outcome() {
        let mut chain = TransformChain::new();
        chain.push(Box::new(filter("no-skip", |r: &Record| {
            &r.value[..] != b"skip"
        })));
        chain.push(Box::new(map("upper", |mut r: Record| {
            if &r.value[..] == b"bad" {
                return Err(Refused::new(r, "bad value"));
            }
            r.value = r.value.to_ascii_uppercase().into();
            Ok(r)
        })));
        chain.push(Box::new(flat_map("split", |r: Record| {
            Ok(r.value
                .split(|b| *b == b',')
                .filter(|p| !p.is_empty())
                .map(|p| Record::new(r.position.clone(), p.to_vec()))
                .collect())
        })));
        let mut out = ChainOutput::default();
        let input = vec![
            rec(0, "a,b"),
            rec(1, "skip"),
            rec(2, "bad"),
            rec(3, ","),
            rec(4, "c"),
        ];
        chain.apply(input, &mut out);
        let kept: Vec<&[u8]> = out.kept.iter().map(|r| &r.value[..]).collect();
        assert_eq!(kept, vec![&b"A"[..], b"B", b"C"]);
        assert_eq!(out.filtered, 2, "skip, and the empty expansion of ','");
        assert_eq!(out.rejected.len(), 1);
        assert_eq!(out.rejected[0].record.position.offset, Offset(2));
        assert_eq!(out.rejected[0].reason, "transform upper: bad value");
        out.clear();
        assert!(out.kept.is_empty() && out.rejected.is_empty() && out.filtered == 0);
    }

    #[test]
    fn records_keep_their_order_in_place_across_expansions_and_calls() {
        let mut chain = TransformChain::new();
        chain.push(Box::new(filter("no-skip", |r: &Record| {
            &r.value[..] != b"skip"
        })));
        chain.push(Box::new(flat_map("split", |r: Record| {
            Ok(r.value
                .split(|b| *b == b',')
                .map(|p| Record::new(r.position.clone(), p.to_vec()))
                .collect())
        })));
        let values = ["x", "skip", "y", "a,b", "z", "skip", "c,d,e", "w"];
        let input: Vec<Record> = (0..).zip(values).map(|(i, v)| rec(i, v)).collect();
        let mut out = ChainOutput::default();
        chain.apply(input.clone(), &mut out);
        chain.apply(input, &mut out);
        let kept: Vec<&[u8]> = out.kept.iter().map(|r| &r.value[..]).collect();
        let once = ["x", "y", "a", "b", "z", "c", "d", "e", "w"];
        let twice: Vec<&[u8]> = once.iter().chain(&once).map(|v| v.as_bytes()).collect();
        assert_eq!(kept, twice);
        assert_eq!(out.filtered, 4);

        // Without an expansion the batch's own vector comes back (std
        // collects a vector's `filter_map` into its own allocation).
        let mut out = ChainOutput::default();
        let input: Vec<Record> = (0..)
            .zip(["p", "skip", "q"])
            .map(|(i, v)| rec(i, v))
            .collect();
        let at = input.as_ptr();
        chain.apply(input, &mut out);
        assert_eq!(out.kept.as_ptr(), at);
        assert_eq!(out.kept.len(), 2);
    }
}
