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
            if out.halted.is_some() {
                break;
            }
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
                Outcome::Halt(original, reason) => {
                    let name = self.stages[i].name();
                    out.halted.get_or_insert_with(|| {
                        DeadLetter::new(original, format!("transform {name}: {reason}"))
                    });
                    return;
                }
            }
        }
        out.kept.push(record);
    }
}

impl TransformChain {
    /// The chain for a configuration's `[[transforms]]`. Consecutive
    /// built-in JSON steps fuse into one stage that parses each record
    /// once; each `remap` step and each filter with a `condition` is a
    /// stage of its own.
    ///
    /// A configuration that [`parse_config`](crate::parse_config) accepted
    /// always builds; for one that did not, a program that fails to
    /// compile becomes a stage that sends every record to the dead-letter
    /// path with the compiler's message. [`try_from_config`] reports it
    /// instead.
    ///
    /// [`try_from_config`]: TransformChain::try_from_config
    #[must_use]
    pub fn from_config(transforms: &[crate::config::TransformConfig]) -> Self {
        Self::build(transforms, true).unwrap_or_default()
    }

    /// The chain for a configuration's `[[transforms]]`, as
    /// [`from_config`](TransformChain::from_config) builds it.
    ///
    /// # Errors
    ///
    /// The step and the compiler's message, for a VRL program that does
    /// not compile.
    pub fn try_from_config(transforms: &[crate::config::TransformConfig]) -> Result<Self, String> {
        Self::build(transforms, false)
    }

    /// Records reaching a stage after the first are known to be valid
    /// JSON: every stage built here keeps only records it read as JSON,
    /// and writes JSON. (The first stage checks: with transforms, the
    /// NDJSON file source leaves the check to them.)
    fn build(transforms: &[crate::config::TransformConfig], lenient: bool) -> Result<Self, String> {
        use super::{JsonOp, JsonStage};
        use crate::config::TransformConfig as T;

        let mut chain = TransformChain::new();
        let json = |v: &toml::Value| serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
        // The run of JSON steps being fused, once one is seen.
        let mut run: Option<Vec<JsonOp>> = None;
        // Whether a registered step came before: what it writes need not
        // be JSON, so later program stages check their input again.
        let mut custom_before = false;
        for (i, t) in transforms.iter().enumerate() {
            let op = match t {
                T::ParseJson => None,
                T::Custom(custom) => {
                    if let Some(ops) = run.take() {
                        chain.push(Box::new(JsonStage::new("json", ops)));
                    }
                    let name = format!("transform {}", i + 1);
                    match custom.build(&name) {
                        Ok(stage) => chain.push(stage),
                        Err(e) if lenient => chain.push(Box::new(Unbuilt { name, reason: e })),
                        Err(e) => return Err(format!("[[transforms]] #{}: {e}", i + 1)),
                    }
                    custom_before = true;
                    continue;
                }
                T::Filter {
                    field,
                    op,
                    value,
                    condition: None,
                } => Some(JsonOp::Filter {
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
                T::Filter {
                    condition: Some(condition),
                    ..
                } => {
                    if let Some(ops) = run.take() {
                        chain.push(Box::new(JsonStage::new("json", ops)));
                    }
                    let checked = !chain.is_empty() && !custom_before;
                    chain.push(program_stage(i, condition, None, lenient, checked)?);
                    continue;
                }
                T::Remap {
                    source,
                    drop_on_error,
                    ..
                } => {
                    if let Some(ops) = run.take() {
                        chain.push(Box::new(JsonStage::new("json", ops)));
                    }
                    let source = source.as_deref().unwrap_or_default();
                    let checked = !chain.is_empty() && !custom_before;
                    chain.push(program_stage(
                        i,
                        source,
                        Some(*drop_on_error),
                        lenient,
                        checked,
                    )?);
                    continue;
                }
            };
            run.get_or_insert_with(Vec::new).extend(op);
        }
        if let Some(ops) = run {
            chain.push(Box::new(JsonStage::new("json", ops)));
        }
        Ok(chain)
    }
}

/// A registered step whose factory failed, in a chain built leniently: it
/// halts the run at the first record, naming the step and the cause.
struct Unbuilt {
    name: String,
    reason: String,
}

impl Transform for Unbuilt {
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&mut self, record: Record) -> Outcome {
        Outcome::Halt(record, self.reason.clone())
    }
}

/// The stage of `[[transforms]]` entry `i`: a `remap` step (with its
/// `drop_on_error`) or a filter condition (`None`); `checked`: its records
/// are known to be valid JSON.
#[cfg(feature = "remap")]
fn program_stage(
    i: usize,
    source: &str,
    remap: Option<bool>,
    lenient: bool,
    checked: bool,
) -> Result<Box<dyn Transform>, String> {
    use super::{Remap, VrlFilter, VrlProgram};

    let (kind, compiled) = match remap {
        Some(_) => ("remap", VrlProgram::remap(source)),
        None => ("filter", VrlProgram::condition(source)),
    };
    let name = format!("{kind} #{}", i + 1);
    match compiled {
        Ok(program) => Ok(match remap {
            Some(drop_on_error) => Box::new(
                Remap::new(name, program)
                    .drop_on_error(drop_on_error)
                    .checked_input(checked),
            ),
            None => Box::new(VrlFilter::new(name, program).checked_input(checked)),
        }),
        Err(e) if lenient => Ok(Box::new(Broken(name, e.message))),
        Err(e) => Err(format!("{name}: the VRL program does not compile:\n{e}")),
    }
}

#[cfg(not(feature = "remap"))]
fn program_stage(
    i: usize,
    _source: &str,
    _remap: Option<bool>,
    lenient: bool,
    _checked: bool,
) -> Result<Box<dyn Transform>, String> {
    let name = format!("transform #{}", i + 1);
    let message = "this build of etl has no VRL support (built without the `remap` feature)";
    if lenient {
        Ok(Box::new(Broken(name, message.to_owned())))
    } else {
        Err(format!("{name}: {message}"))
    }
}

/// A step whose program could not be built: every record goes to the
/// dead-letter path with the reason.
#[derive(Debug)]
struct Broken(String, String);

impl Transform for Broken {
    fn name(&self) -> &str {
        &self.0
    }

    fn apply(&mut self, record: Record) -> Outcome {
        Outcome::Reject(record, self.1.clone())
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(Broken(self.0.clone(), self.1.clone())))
    }
}

#[cfg(test)]
mod tests {
    use etl_record::{Offset, PartitionId, Position, SourceId};

    use super::*;
    use crate::transform::{Refused, filter, flat_map, map};

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

    #[cfg(feature = "remap")]
    #[test]
    fn programs_split_the_json_run_and_every_stage_forks() {
        let config = crate::parse_config(
            r#"
            [source]
            type = "generator"
            records_per_partition = 1
            [[transforms]]
            type = "filter"
            field = "n"
            op = "<"
            value = 3
            [[transforms]]
            type = "remap"
            source = '.m = to_int!(.n) * 10'
            [[transforms]]
            type = "filter"
            condition = '.m != 10'
            [[transforms]]
            type = "drop_field"
            field = "n"
            [[sinks]]
            type = "blackhole"
            "#,
            std::path::Path::new("."),
        )
        .unwrap();
        let chain = TransformChain::try_from_config(&config.transforms).unwrap();
        assert_eq!(chain.len(), 4);
        let mut fork = chain.fork().expect("every stage forks");
        let mut out = ChainOutput::default();
        fork.apply(
            vec![
                rec(0, r#"{"n":0}"#),
                rec(1, r#"{"n":1}"#),
                rec(2, r#"{"n":2}"#),
                rec(3, r#"{"n":3}"#),
                rec(4, r#"{"n":"x"}"#),
            ],
            &mut out,
        );
        let kept: Vec<&[u8]> = out.kept.iter().map(|r| &r.value[..]).collect();
        assert_eq!(kept, vec![&br#"{"m":0}"#[..], br#"{"m":20}"#]);
        assert_eq!(
            out.filtered, 3,
            "n = 3, n = 1 (m = 10), and \"x\" < 3 is false"
        );
        assert!(out.rejected.is_empty());
    }
}
