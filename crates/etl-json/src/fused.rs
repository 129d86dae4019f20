//! Runs of stages that read each record once between them.
//!
//! A chain built from a configuration with declarative filters, filter
//! conditions and a `remap` step in a row (W1's `filter` then `remap`,
//! the nested job's `condition` then `remap`) would read each record once
//! per stage: check it, find its top-level entries, find the same nested
//! objects again. When every stage of such a run has a fast form, the run
//! reads the record once and evaluates the stages in order on that one
//! reading, each seeing the changes of the ones before.
//!
//! A [`Fuser`] takes the stages in chain order and gives them back with
//! each such run made one [`FusedRun`]: an ordinary [`Transform`], so the
//! chain that runs it knows nothing of the engine.
//!
//! Invariant: a run decides a record only when every stage of it would
//! have been decided by its own fast path; anything else runs the stages
//! one by one, as if there were no run, so outcomes, dead-letter reasons
//! and stage names are the stages' own.

#[cfg(feature = "remap")]
use std::sync::Arc;

#[cfg(feature = "remap")]
use bytes::Bytes;
#[cfg(feature = "remap")]
use etl_record::Record;

#[cfg(feature = "remap")]
use etl_transform::Outcome;
use etl_transform::Transform;

use crate::JsonStage;
#[cfg(feature = "remap")]
use crate::{
    Remap, VrlFilter,
    conditions::{Verdict, Verdicts},
    remap_fast::{Arena, Step, Steps, judge::Plan, run_steps},
};

/// Stages in chain order, gathered to be put in a chain with their runs
/// fused.
#[derive(Debug, Default)]
pub struct Fuser {
    stages: Vec<Pending>,
}

/// A stage waiting for [`Fuser::finish`].
#[derive(Debug)]
enum Pending {
    #[cfg(feature = "remap")]
    /// A stage with a fast form: the form, and whether the records
    /// reaching it are known to be valid JSON.
    Fusable(Box<Fusable>, Step, bool),
    /// A stage that runs on its own.
    Alone(Box<dyn Transform>),
}

/// A stage that can be part of a run.
#[cfg(feature = "remap")]
#[derive(Debug)]
enum Fusable {
    Json(JsonStage),
    Condition(VrlFilter),
    Remap(Remap),
}

#[cfg(feature = "remap")]
impl Fusable {
    fn stage(&mut self) -> &mut dyn Transform {
        match self {
            Fusable::Json(s) => s,
            Fusable::Condition(s) => s,
            Fusable::Remap(s) => s,
        }
    }

    fn name(&self) -> &str {
        match self {
            Fusable::Json(s) => s.name(),
            Fusable::Condition(s) => s.name(),
            Fusable::Remap(s) => s.name(),
        }
    }

    fn fork(&self) -> Self {
        match self {
            Fusable::Json(s) => Fusable::Json(s.forked()),
            Fusable::Condition(s) => Fusable::Condition(s.forked()),
            Fusable::Remap(s) => Fusable::Remap(s.forked()),
        }
    }

    fn boxed(self) -> Box<dyn Transform> {
        match self {
            Fusable::Json(s) => Box::new(s),
            Fusable::Condition(s) => Box::new(s),
            Fusable::Remap(s) => Box::new(s),
        }
    }
}

impl Pending {
    fn boxed(self) -> Box<dyn Transform> {
        match self {
            #[cfg(feature = "remap")]
            Pending::Fusable(stage, ..) => (*stage).boxed(),
            Pending::Alone(stage) => stage,
        }
    }
}

impl Fuser {
    /// No stages yet.
    #[must_use]
    pub fn new() -> Self {
        Fuser::default()
    }

    /// Add a JSON stage; `checked`: the records reaching it are known to
    /// be valid JSON (as `Remap::checked_input`). A stage of filters
    /// only, on fields the fast path reads, can start a run.
    #[cfg_attr(not(feature = "remap"), allow(unused_variables))]
    pub fn json(&mut self, stage: JsonStage, checked: bool) {
        #[cfg(feature = "remap")]
        if let Some(filters) = stage.filters() {
            self.stages.push(Pending::Fusable(
                Box::new(Fusable::Json(stage)),
                Step::Filters(filters),
                checked,
            ));
            return;
        }
        self.stages.push(Pending::Alone(Box::new(stage)));
    }

    /// Add a filter condition; one whose program has a fast form can be
    /// part of a run.
    #[cfg(feature = "remap")]
    pub fn condition(&mut self, stage: VrlFilter) {
        let checked = stage.is_checked_input();
        match stage.lite() {
            Some(lite) => self.stages.push(Pending::Fusable(
                Box::new(Fusable::Condition(stage)),
                Step::Condition(lite),
                checked,
            )),
            None => self.stages.push(Pending::Alone(Box::new(stage))),
        }
    }

    /// Add a `remap` step; one whose program has a fast form can end a
    /// run.
    #[cfg(feature = "remap")]
    pub fn remap(&mut self, stage: Remap) {
        let checked = stage.is_checked_input();
        match stage.lite() {
            Some(lite) => self.stages.push(Pending::Fusable(
                Box::new(Fusable::Remap(stage)),
                Step::Remap(lite),
                checked,
            )),
            None => self.stages.push(Pending::Alone(Box::new(stage))),
        }
    }

    /// Add any other stage: it runs on its own and ends a run.
    pub fn push(&mut self, stage: Box<dyn Transform>) {
        self.stages.push(Pending::Alone(stage));
    }

    /// Whether no stage was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The stages in order (without the `remap` feature no run forms).
    #[must_use]
    #[cfg(not(feature = "remap"))]
    pub fn finish(self) -> Vec<Box<dyn Transform>> {
        self.stages.into_iter().map(Pending::boxed).collect()
    }

    /// The stages in order, each run made one [`FusedRun`]: declarative
    /// filters, then conditions, then at most one `remap` step, two stages
    /// or more, all with a fast form.
    #[must_use]
    #[cfg(feature = "remap")]
    pub fn finish(self) -> Vec<Box<dyn Transform>> {
        let mut out: Vec<Box<dyn Transform>> = Vec::with_capacity(self.stages.len());
        let mut rest = self.stages.into_iter().peekable();
        while let Some(first) = rest.next() {
            let Pending::Fusable(stage, step, checked) = first else {
                out.push(first.boxed());
                continue;
            };
            // A `remap` step ends a run; filters only start one.
            let mut open = !matches!(step, Step::Remap(_));
            let mut run = vec![(*stage, step)];
            while open {
                let next = match rest.peek() {
                    Some(Pending::Fusable(_, Step::Condition(_) | Step::Remap(_), _)) => {
                        rest.next()
                    }
                    _ => None,
                };
                let Some(Pending::Fusable(stage, step, _)) = next else {
                    break;
                };
                open = !matches!(step, Step::Remap(_));
                run.push((*stage, step));
            }
            if run.len() >= 2 {
                out.push(Box::new(FusedRun::new(run, checked)));
            } else {
                out.extend(run.into_iter().map(|(stage, _)| stage.boxed()));
            }
        }
        out
    }
}

/// Stages run together on one reading of each record: declarative
/// filters, conditions and a `remap` step, in chain order.
///
/// Its name is that of the stage that decided the last record (the first
/// stage's before any), so a dead letter names the stage it would name
/// without the run.
#[cfg(feature = "remap")]
#[derive(Debug)]
pub struct FusedRun {
    /// The stages one by one, for the records the run does not decide.
    /// Only the last can be a `remap` step, the one kind of stage that
    /// turns a record into several.
    stages: Vec<Fusable>,
    steps: Arc<[Step]>,
    /// Whether records reaching the first stage are known to be valid
    /// JSON.
    checked: bool,
    arena: Arena,
    /// The stage that decided the last record.
    decided: usize,
    /// The conditions judged on each record kept, when asked (see
    /// [`Conditions::judge_in`](crate::Conditions::judge_in)); none
    /// otherwise.
    judged: Option<Plan>,
    /// The records kept since the verdicts were last handed on, as
    /// written, with their verdicts: at most [`Verdicts::MAX_HELD`].
    verdicts: Vec<(Bytes, Verdict)>,
}

/// The fused run `stage` is, if it is one.
#[cfg(feature = "remap")]
pub(crate) fn as_fused(stage: &mut dyn Transform) -> Option<&mut FusedRun> {
    stage.as_any_mut()?.downcast_mut::<FusedRun>()
}

#[cfg(feature = "remap")]
impl FusedRun {
    fn new(run: Vec<(Fusable, Step)>, checked: bool) -> Self {
        let (stages, steps): (Vec<_>, Vec<_>) = run.into_iter().unzip();
        FusedRun {
            stages,
            steps: steps.into(),
            checked,
            arena: Arena::default(),
            decided: 0,
            judged: None,
            verdicts: Vec::new(),
        }
    }

    /// Judge the conditions of `plan` on each record kept, as written,
    /// from now on.
    pub(crate) fn judge(&mut self, plan: Plan) {
        self.judged = Some(plan);
        self.verdicts.clear();
    }

    /// Hand the verdicts given since the last call on: swapped with
    /// `into`, which must be empty (its allocation is reused).
    pub(crate) fn hand_verdicts(&mut self, into: &mut Vec<(Bytes, Verdict)>) {
        into.clear();
        std::mem::swap(into, &mut self.verdicts);
    }
}

#[cfg(feature = "remap")]
impl Transform for FusedRun {
    fn name(&self) -> &str {
        self.stages.get(self.decided).map_or("", Fusable::name)
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(FusedRun {
            stages: self.stages.iter().map(Fusable::fork).collect(),
            steps: Arc::clone(&self.steps),
            checked: self.checked,
            arena: Arena::default(),
            decided: 0,
            // A copy judges what it is asked to.
            judged: None,
            verdicts: Vec::new(),
        }))
    }

    fn as_any_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        Some(self)
    }

    fn apply(&mut self, mut record: Record) -> Outcome {
        match self.apply_in_place(&mut record) {
            None => Outcome::Keep(record),
            Some(outcome) => outcome,
        }
    }

    /// The run's steps decide most records where they lie: a kept one's
    /// value is replaced in place; only a record the steps leave to the
    /// stages is taken out.
    fn apply_in_place(&mut self, slot: &mut Record) -> Option<Outcome> {
        let (steps, verdict) = run_steps(
            &self.steps,
            &slot.value,
            &mut self.arena,
            self.checked,
            self.judged.as_ref(),
        );
        match steps {
            Steps::Keep(value) => {
                if let Some(value) = value {
                    slot.value = value;
                }
                // Past the cap, a record is read again by whoever judges
                // it: the list held never grows without bound.
                if !verdict.is_empty() && self.verdicts.len() < Verdicts::MAX_HELD {
                    self.verdicts.push((slot.value.clone(), verdict));
                }
                self.decided = self.stages.len().saturating_sub(1);
                return None;
            }
            Steps::Filtered => return Some(Outcome::Filtered),
            Steps::Fallback => {}
        }
        let mut record = std::mem::take(slot);
        for (i, stage) in self.stages.iter_mut().enumerate() {
            self.decided = i;
            match stage.stage().apply(record) {
                Outcome::Keep(kept) => record = kept,
                other => return Some(other),
            }
        }
        *slot = record;
        None
    }
}

#[cfg(all(test, feature = "remap"))]
mod tests {
    use etl_record::{Offset, PartitionId, Position, SourceId};
    use etl_transform::{ChainOutput, TransformChain};

    use super::*;
    use crate::ops::CompareOp;
    use crate::{JsonOp, VrlProgram};

    fn rec(offset: i64, value: &str) -> Record {
        Record::new(
            Position::new(SourceId::new("s"), PartitionId(0), Offset(offset)),
            value.as_bytes().to_vec(),
        )
    }

    /// The stages of a configuration with declarative filters, two
    /// conditions, a `remap` step and a condition after it, each built
    /// as the configuration builds it.
    fn stages() -> Fuser {
        let condition = |name: &str, source: &str| {
            let program = VrlProgram::condition(source).expect("it compiles");
            VrlFilter::new(name, program).checked_input(true)
        };
        let mut stages = Fuser::new();
        let filter = JsonOp::Filter {
            path: JsonOp::path("o.n"),
            op: CompareOp::Ge,
            value: 1.into(),
        };
        stages.json(JsonStage::new("json", vec![filter]), false);
        stages.condition(condition("filter #2", r#".o.s != "skip""#));
        stages.condition(condition("filter #3", ".o.n != 7"));
        let program = VrlProgram::remap(
            "if .o.n == 5 { abort }\ndel(.o.e)\n.c = to_int(round(to_float!(.o.n) * 100))",
        )
        .expect("it compiles");
        stages.remap(Remap::new("remap #4", program).checked_input(true));
        stages.condition(condition("filter #5", ".c != 300"));
        stages
    }

    fn chain(stages: Vec<Box<dyn Transform>>) -> TransformChain {
        let mut chain = TransformChain::new();
        for stage in stages {
            chain.push(stage);
        }
        chain
    }

    #[test]
    fn a_run_of_stages_decides_what_the_stages_decide_one_by_one() {
        let mut fused = chain(stages().finish());
        assert_eq!(
            fused.len(),
            2,
            "the filters and the remap step as one run, not the condition after it"
        );
        let mut forked = fused.fork().expect("every stage forks");
        let mut alone = chain(stages().stages.into_iter().map(Pending::boxed).collect());
        assert_eq!(alone.len(), 5);
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
            for chain in [&mut fused, &mut forked] {
                let mut got = ChainOutput::default();
                chain.apply(vec![rec(offset, input)], &mut got);
                assert_eq!(show(&got), show(&want), "{input}");
            }
        }
        let mut out = ChainOutput::default();
        fused.apply(vec![rec(0, inputs[0])], &mut out);
        assert_eq!(
            &out.kept[0].value[..],
            br#"{"o":{"n":2,"s":"x"},"z":1.50,"c":200}"#
        );
    }
}
