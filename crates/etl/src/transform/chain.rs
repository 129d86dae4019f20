//! Running a batch of records through the transforms in order.

use etl_record::{DeadLetter, Record};

use super::{Outcome, Transform};

/// The transforms of a pipeline, applied in order.
#[derive(Debug, Default)]
pub struct TransformChain {
    stages: Vec<Box<dyn Transform>>,
    /// Runs of stages that read each record once between them, when the
    /// fast path decides it (built from a configuration only).
    #[cfg(feature = "remap")]
    runs: Vec<super::fused::Run>,
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
        Some(TransformChain {
            stages,
            #[cfg(feature = "remap")]
            runs: self.runs.iter().map(super::fused::Run::fork).collect(),
        })
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
            #[cfg(feature = "remap")]
            if let Some(run) = self.runs.iter_mut().find(|r| r.start == i) {
                use super::remap_fast::Steps;
                match run.apply(&record.value) {
                    Steps::Keep(value) => {
                        if let Some(value) = value {
                            record.value = value;
                        }
                        i += run.len;
                        continue;
                    }
                    Steps::Filtered => {
                        out.filtered += 1;
                        return;
                    }
                    Steps::Fallback => {}
                }
            }
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
        use super::JsonOp;
        use crate::config::TransformConfig as T;

        let mut chain = Built::default();
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
                        chain.json(ops, custom_before);
                    }
                    let name = format!("transform {}", i + 1);
                    match custom.build(&name) {
                        Ok(stage) => chain.push(stage, None, false),
                        Err(e) if lenient => {
                            chain.push(Box::new(Unbuilt { name, reason: e }), None, false);
                        }
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
                        chain.json(ops, custom_before);
                    }
                    let checked = chain.checked(custom_before);
                    let (stage, step) = program_stage(i, condition, None, lenient, checked)?;
                    chain.push(stage, step, checked);
                    continue;
                }
                T::Remap {
                    source,
                    drop_on_error,
                    ..
                } => {
                    if let Some(ops) = run.take() {
                        chain.json(ops, custom_before);
                    }
                    let source = source.as_deref().unwrap_or_default();
                    let checked = chain.checked(custom_before);
                    let (stage, step) =
                        program_stage(i, source, Some(*drop_on_error), lenient, checked)?;
                    chain.push(stage, step, checked);
                    continue;
                }
            };
            run.get_or_insert_with(Vec::new).extend(op);
        }
        if let Some(ops) = run {
            chain.json(ops, custom_before);
        }
        Ok(chain.finish())
    }
}

/// The fast form of a stage, for reading each record once in a run of
/// stages (see [`TransformChain::run`]).
#[cfg(feature = "remap")]
type Step = super::remap_fast::Step;
#[cfg(not(feature = "remap"))]
type Step = ();

/// A chain being built from a configuration: its stages, and for each the
/// fast form it can run in with its neighbours and whether its records
/// are known to be valid JSON.
#[derive(Default)]
struct Built {
    chain: TransformChain,
    #[cfg_attr(not(feature = "remap"), allow(dead_code))]
    steps: Vec<(Option<Step>, bool)>,
}

impl Built {
    fn push(&mut self, stage: Box<dyn Transform>, step: Option<Step>, checked: bool) {
        self.chain.push(stage);
        self.steps.push((step, checked));
    }

    /// Whether records reaching the next stage are known to be valid JSON:
    /// every stage built here keeps only records it read as JSON, and
    /// writes JSON, unless a registered step came before.
    fn checked(&self, custom_before: bool) -> bool {
        !self.chain.is_empty() && !custom_before
    }

    /// A fused run of JSON steps.
    fn json(&mut self, ops: Vec<super::JsonOp>, custom_before: bool) {
        let checked = self.checked(custom_before);
        let stage = super::JsonStage::new("json", ops);
        #[cfg(feature = "remap")]
        let step = stage.filters().map(Step::Filters);
        #[cfg(not(feature = "remap"))]
        let step = None;
        self.push(Box::new(stage), step, checked);
    }

    #[cfg(not(feature = "remap"))]
    fn finish(self) -> TransformChain {
        self.chain
    }

    /// The chain, with its runs: declarative filters, then conditions,
    /// then at most one `remap` step, two stages or more, all with a fast
    /// form.
    #[cfg(feature = "remap")]
    fn finish(self) -> TransformChain {
        let mut chain = self.chain;
        let mut i = 0;
        while i < self.steps.len() {
            let mut steps = Vec::new();
            let mut j = i;
            while let Some((Some(step), _)) = self.steps.get(j) {
                let fits = match step {
                    Step::Filters(_) => j == i,
                    Step::Condition(_) => true,
                    Step::Remap(_) => {
                        steps.push(step.clone());
                        j += 1;
                        break;
                    }
                };
                if !fits {
                    break;
                }
                steps.push(step.clone());
                j += 1;
            }
            if steps.len() >= 2 {
                chain
                    .runs
                    .push(super::fused::Run::new(i, steps, self.steps[i].1));
                i = j;
            } else {
                i += 1;
            }
        }
        chain
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
) -> Result<(Box<dyn Transform>, Option<Step>), String> {
    use super::{Remap, VrlFilter, VrlProgram};

    let (kind, compiled) = match remap {
        Some(_) => ("remap", VrlProgram::remap(source)),
        None => ("filter", VrlProgram::condition(source)),
    };
    let name = format!("{kind} #{}", i + 1);
    match compiled {
        Ok(program) => {
            let step = program.lite().map(|lite| match remap {
                Some(_) => Step::Remap(lite),
                None => Step::Condition(lite),
            });
            let stage: Box<dyn Transform> = match remap {
                Some(drop_on_error) => Box::new(
                    Remap::new(name, program)
                        .drop_on_error(drop_on_error)
                        .checked_input(checked),
                ),
                None => Box::new(VrlFilter::new(name, program).checked_input(checked)),
            };
            Ok((stage, step))
        }
        Err(e) if lenient => Ok((Box::new(Broken(name, e.message)), None)),
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
) -> Result<(Box<dyn Transform>, Option<Step>), String> {
    let name = format!("transform #{}", i + 1);
    let message = "this build of etl has no VRL support (built without the `remap` feature)";
    if lenient {
        Ok((Box::new(Broken(name, message.to_owned())), None))
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

    #[cfg(feature = "remap")]
    #[test]
    fn a_run_of_stages_decides_what_the_stages_decide_one_by_one() {
        let config = crate::parse_config(
            r#"
            [source]
            type = "generator"
            records_per_partition = 1
            [[transforms]]
            type = "filter"
            field = "o.n"
            op = ">="
            value = 1
            [[transforms]]
            type = "filter"
            condition = '.o.s != "skip"'
            [[transforms]]
            type = "filter"
            condition = '.o.n != 7'
            [[transforms]]
            type = "remap"
            source = '''
            if .o.n == 5 { abort }
            del(.o.e)
            .c = to_int(round(to_float!(.o.n) * 100))
            '''
            [[transforms]]
            type = "filter"
            condition = '.c != 300'
            [[sinks]]
            type = "blackhole"
            "#,
            std::path::Path::new("."),
        )
        .expect("the configuration parses");
        let mut chain = TransformChain::try_from_config(&config.transforms).expect("it builds");
        assert_eq!(chain.len(), 5);
        assert_eq!(
            chain
                .runs
                .iter()
                .map(|r| (r.start, r.len))
                .collect::<Vec<_>>(),
            vec![(0, 4)],
            "the filters and the remap step, not the condition after it"
        );
        let mut forked = chain.fork().expect("every stage forks");
        assert_eq!(forked.runs.len(), 1);
        let mut alone = TransformChain::try_from_config(&config.transforms).expect("it builds");
        alone.runs.clear();
        let inputs = [
            r#"{"o":{"n":2,"s":"x","e":"a@b"},"z":1.50}"#,
            r#"{"o":{"n":0}}"#,
            r#"{"o":{"n":2,"s":"skip"}}"#,
            r#"{"o":{"n":7}}"#,
            r#"{"o":{"n":5}}"#,
            r#"{"o":{"n":3}}"#,
            r#"{ "o" : { "e" : 1 , "n" : 1.25e0 } , "k\u00e9" : [1, 2] }"#,
            r#"{"o":{"n":"4"}}"#,
            r#"{"o":{"n":2,"s":"\ud800"}}"#,
            r#"{"o":{"n":2},"big":1e400}"#,
            r#"{"o":{"n":2}"#,
            r#"[{"o":{"n":2}}]"#,
            "not json",
            r#"{"o":[1],"o":{"n":2,"e":0,"e":1}}"#,
        ];
        let show = |out: &ChainOutput| {
            let kept: Vec<String> = out
                .kept
                .iter()
                .map(|r| String::from_utf8_lossy(&r.value).into_owned())
                .collect();
            let rejected: Vec<String> = out
                .rejected
                .iter()
                .map(|d| format!("{} {}", String::from_utf8_lossy(&d.record.value), d.reason))
                .collect();
            format!(
                "kept {kept:?} rejected {rejected:?} filtered {}",
                out.filtered
            )
        };
        for (i, input) in inputs.iter().enumerate() {
            let offset = i64::try_from(i).expect("a small index");
            let mut want = ChainOutput::default();
            alone.apply(vec![rec(offset, input)], &mut want);
            for chain in [&mut chain, &mut forked] {
                let mut got = ChainOutput::default();
                chain.apply(vec![rec(offset, input)], &mut got);
                assert_eq!(show(&got), show(&want), "{input}");
            }
        }
        let mut out = ChainOutput::default();
        chain.apply(vec![rec(0, inputs[0])], &mut out);
        assert_eq!(
            &out.kept[0].value[..],
            br#"{"o":{"n":2,"s":"x"},"z":1.50,"c":200}"#
        );
    }
}
