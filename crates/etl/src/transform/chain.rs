//! Running a batch of records through the transforms in order.

use etl_record::{DeadLetter, Record};

use super::{Outcome, Transform};

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
}

impl ChainOutput {
    /// Empty the output for reuse, keeping its allocations.
    pub fn clear(&mut self) {
        self.kept.clear();
        self.rejected.clear();
        self.filtered = 0;
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
    pub fn apply(&mut self, records: Vec<Record>, out: &mut ChainOutput) {
        if self.stages.is_empty() {
            out.kept.extend(records);
            return;
        }
        out.kept.reserve(records.len());
        for record in records {
            self.run(0, record, out);
        }
    }

    fn run(&mut self, from: usize, mut record: Record, out: &mut ChainOutput) {
        for i in from..self.stages.len() {
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
            }
        }
        out.kept.push(record);
    }
}

impl TransformChain {
    /// The chain for a configuration's `[[transforms]]`. The built-ins are
    /// all JSON steps, so they fuse into one stage that parses each record
    /// once.
    #[must_use]
    pub fn from_config(transforms: &[crate::config::TransformConfig]) -> Self {
        use super::{JsonOp, JsonStage};
        use crate::config::TransformConfig as T;

        let mut chain = TransformChain::new();
        if transforms.is_empty() {
            return chain;
        }
        let json = |v: &toml::Value| serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
        let ops = transforms
            .iter()
            .filter_map(|t| match t {
                T::ParseJson => None,
                T::Filter { field, op, value } => Some(JsonOp::Filter {
                    path: JsonOp::path(field),
                    op: *op,
                    value: value.as_ref().map_or(serde_json::Value::Null, json),
                }),
                T::AddField { field, value } => Some(JsonOp::Add {
                    path: JsonOp::path(field),
                    value: json(value),
                }),
                T::RenameField { from, to } => Some(JsonOp::Rename {
                    from: JsonOp::path(from),
                    to: JsonOp::path(to),
                }),
                T::DropField { field } => Some(JsonOp::Drop {
                    path: JsonOp::path(field),
                }),
            })
            .collect();
        chain.push(Box::new(JsonStage::new("json", ops)));
        chain
    }
}

#[cfg(test)]
mod tests {
    use etl_record::{Offset, PartitionId, Position, SourceId};

    use super::*;
    use crate::transform::{filter, flat_map, map};

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
        chain.push(Box::new(map("upper", |r: &Record| {
            if &r.value[..] == b"bad" {
                return Err("bad value".to_owned());
            }
            let mut r = r.clone();
            r.value = r.value.to_ascii_uppercase().into();
            Ok(r)
        })));
        chain.push(Box::new(flat_map("split", |r: &Record| {
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
    fn config_transforms_fuse_into_one_stage() {
        let config = crate::parse_config(
            r#"
            [source]
            type = "generator"
            records_per_partition = 1
            [[transforms]]
            type = "parse_json"
            [[transforms]]
            type = "filter"
            field = "n"
            op = "<"
            value = 2
            [[transforms]]
            type = "add_field"
            field = "ok"
            value = true
            [[sinks]]
            type = "blackhole"
            "#,
            std::path::Path::new("."),
        )
        .unwrap();
        let mut chain = TransformChain::from_config(&config.transforms);
        assert_eq!(chain.len(), 1);
        let mut out = ChainOutput::default();
        chain.apply(vec![rec(0, r#"{"n":1}"#), rec(1, r#"{"n":2}"#)], &mut out);
        assert_eq!(&out.kept[0].value[..], br#"{"n":1,"ok":true}"#);
        assert_eq!(out.filtered, 1);
    }
}
