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
    /// Each record is run where it lies in `records`' own allocation
    /// ([`Transform::apply_in_place`]), and the records kept stay there,
    /// in order (a batch's vector is large: a new one per batch costs a
    /// mapping and its page faults; and a record moved out and back at
    /// every stage costs a copy of it each way). From the first record a
    /// stage turns into several, the rest go to a vector of their own.
    /// If a stage panics, what this call kept so far is dropped with the
    /// batch; what `out` held before stays.
    pub fn apply(&mut self, mut records: Vec<Record>, out: &mut ChainOutput) {
        if !self.stages.is_empty() {
            // A record that becomes several lands at the end of
            // `out.kept`, past `base`, and is taken from there.
            let base = out.kept.len();
            let mut spill: Option<Vec<Record>> = None;
            let mut left = records.len();
            records.retain_mut(|record| {
                left -= 1;
                if out.halted.is_some() {
                    return false;
                }
                if let Some(spill) = &mut spill {
                    // Past an expansion every record goes after it.
                    self.run(0, std::mem::take(record), out);
                    spill.extend(out.kept.drain(base..));
                    return false;
                }
                match self.run_in_place(record, out) {
                    InPlace::Kept => true,
                    InPlace::Gone => false,
                    InPlace::Expanded => {
                        let n = out.kept.len() - base;
                        let mut more = Vec::with_capacity(n + left);
                        more.extend(out.kept.drain(base..));
                        spill = Some(more);
                        false
                    }
                }
            });
            if let Some(mut spill) = spill {
                records.append(&mut spill);
            }
        }
        if out.kept.is_empty() {
            out.kept = records;
        } else {
            out.kept.append(&mut records);
        }
    }

    /// Run `record` through every stage where it lies.
    fn run_in_place(&mut self, record: &mut Record, out: &mut ChainOutput) -> InPlace {
        for i in 0..self.stages.len() {
            let Some(outcome) = self.stages[i].apply_in_place(record) else {
                continue;
            };
            let before = out.kept.len();
            self.settle(i, outcome, out);
            return match out.kept.len() - before {
                0 => InPlace::Gone,
                1 => {
                    // One record came out: back into the place.
                    if let Some(one) = out.kept.pop() {
                        *record = one;
                    }
                    InPlace::Kept
                }
                _ => InPlace::Expanded,
            };
        }
        InPlace::Kept
    }

    fn run(&mut self, from: usize, mut record: Record, out: &mut ChainOutput) {
        let mut i = from;
        while i < self.stages.len() {
            match self.stages[i].apply(record) {
                Outcome::Keep(r) => record = r,
                other => return self.settle(i, other, out),
            }
            i += 1;
        }
        out.kept.push(record);
    }

    /// What stage `i` decided for a record taken out of its place: the
    /// records it kept or became run through the stages after it.
    fn settle(&mut self, i: usize, outcome: Outcome, out: &mut ChainOutput) {
        match outcome {
            Outcome::Keep(record) => self.run(i + 1, record, out),
            Outcome::Filtered => out.filtered += 1,
            Outcome::Many(records) => {
                if records.is_empty() {
                    out.filtered += 1;
                }
                for r in records {
                    self.run(i + 1, r, out);
                }
            }
            Outcome::Reject(original, reason) => {
                let name = self.stages[i].name();
                out.rejected.push(DeadLetter::new(
                    original,
                    format!("transform {name}: {reason}"),
                ));
            }
            Outcome::Halt(original, reason) => {
                let name = self.stages[i].name();
                out.halted.get_or_insert_with(|| {
                    DeadLetter::new(original, format!("transform {name}: {reason}"))
                });
            }
        }
    }
}

/// Where a record run in place ended.
enum InPlace {
    /// In its place, to be kept.
    Kept,
    /// Filtered, set aside or halted on.
    Gone,
    /// Turned into records now at the end of the output's kept ones.
    Expanded,
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

    /// Upper-cases in place, drops `drop` (in any case), and decides the
    /// other words it knows through `apply` as a plain transform would.
    struct InPlaceUpper;

    impl Transform for InPlaceUpper {
        fn name(&self) -> &str {
            "in-place"
        }

        fn apply(&mut self, mut record: Record) -> Outcome {
            match &record.value.to_ascii_lowercase()[..] {
                b"drop" => Outcome::Filtered,
                b"bad" => Outcome::Reject(record, "bad value".into()),
                b"stop" => Outcome::Halt(record, "stopped".into()),
                b"twice" => Outcome::Many(vec![record.clone(), record]),
                b"moved" => Outcome::Keep(Record::new(record.position, &b"MOVED"[..])),
                _ => {
                    record.value = record.value.to_ascii_uppercase().into();
                    Outcome::Keep(record)
                }
            }
        }

        fn apply_in_place(&mut self, record: &mut Record) -> Option<Outcome> {
            match &record.value.to_ascii_lowercase()[..] {
                b"drop" => Some(Outcome::Filtered),
                b"bad" | b"stop" | b"twice" | b"moved" => Some(self.apply(std::mem::take(record))),
                _ => {
                    record.value = record.value.to_ascii_uppercase().into();
                    None
                }
            }
        }
    }

    /// What the chain must give: each record through `apply`, stage after
    /// stage, as the trait documents it.
    fn reference(stages: &mut [Box<dyn Transform>], records: Vec<Record>) -> ChainOutput {
        fn one(stages: &mut [Box<dyn Transform>], i: usize, r: Record, out: &mut ChainOutput) {
            let Some(stage) = stages.get_mut(i) else {
                out.kept.push(r);
                return;
            };
            let name = stage.name().to_owned();
            match stage.apply(r) {
                Outcome::Keep(r) => one(stages, i + 1, r, out),
                Outcome::Filtered => out.filtered += 1,
                Outcome::Many(rs) => {
                    if rs.is_empty() {
                        out.filtered += 1;
                    }
                    for r in rs {
                        one(stages, i + 1, r, out);
                    }
                }
                Outcome::Reject(r, why) => out
                    .rejected
                    .push(DeadLetter::new(r, format!("transform {name}: {why}"))),
                Outcome::Halt(r, why) => {
                    out.halted.get_or_insert_with(|| {
                        DeadLetter::new(r, format!("transform {name}: {why}"))
                    });
                }
            }
        }
        let mut out = ChainOutput {
            kept: vec![rec(-1, "before")],
            ..ChainOutput::default()
        };
        for r in records {
            if out.halted.is_some() {
                break;
            }
            one(stages, 0, r, &mut out);
        }
        out
    }

    #[test]
    fn records_run_in_place_end_as_records_moved_through_apply_do() {
        let stages = || -> Vec<Box<dyn Transform>> {
            vec![
                Box::new(InPlaceUpper),
                Box::new(flat_map("split", |r: Record| {
                    Ok(r.value
                        .split(|b| *b == b',')
                        .filter(|p| !p.is_empty())
                        .map(|p| Record::new(r.position.clone(), p.to_vec()))
                        .collect())
                })),
                Box::new(InPlaceUpper),
            ]
        };
        // Words the first stage decides, and pairs split into words the
        // last stage decides (a halt, a reject or a drop inside an
        // expansion; two halts in one).
        let words = [
            "a",
            "drop",
            "bad",
            "twice",
            "moved",
            "b,c",
            ",",
            "d",
            "stop",
            "e",
            "x,drop",
            "bad,y",
            "z,stop",
            "stop,stop",
            "twice,moved",
        ];
        // Every batch of up to six of the words, by a fixed walk.
        let mut seed = 7u64;
        for batch in 0..400 {
            let len = batch % 7;
            let values: Vec<&str> = (0..len)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    words[(seed >> 33) as usize % words.len()]
                })
                .collect();
            let input: Vec<Record> = (0..).zip(&values).map(|(i, v)| rec(i, v)).collect();
            let mut chain = TransformChain::new();
            for stage in stages() {
                chain.push(stage);
            }
            // What the output held before stays, first.
            let mut out = ChainOutput {
                kept: vec![rec(-1, "before")],
                ..ChainOutput::default()
            };
            chain.apply(input.clone(), &mut out);
            let want = reference(&mut stages(), input);
            let show = |o: &ChainOutput| {
                (
                    o.kept
                        .iter()
                        .map(|r| (r.position.offset, r.value.clone()))
                        .collect::<Vec<_>>(),
                    o.rejected
                        .iter()
                        .map(|d| {
                            (
                                d.record.position.offset,
                                d.record.value.clone(),
                                d.reason.clone(),
                            )
                        })
                        .collect::<Vec<_>>(),
                    o.filtered,
                    o.halted.as_ref().map(|d| {
                        (
                            d.record.position.offset,
                            d.record.value.clone(),
                            d.reason.clone(),
                        )
                    }),
                )
            };
            assert_eq!(show(&out), show(&want), "batch {values:?}");
        }
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

        // Without an expansion the batch's own vector comes back (kept
        // records stay where they were, `retain_mut` closing the gaps).
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
