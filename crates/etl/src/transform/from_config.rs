//! A chain from a configuration's `[[transforms]]`: the built-in JSON
//! steps, `remap` steps and conditions from the engine, registered steps
//! from their factories, with the runs that can read each record once
//! fused (see `etl_json::Fuser`).

use etl_config::BuildError;
use etl_json::{Condition, Fuser};
use etl_record::Record;

use super::{JsonOp, JsonStage, Outcome, Transform, TransformChain};
use crate::config::TransformConfig;

/// The chain for a configuration's `[[transforms]]`. Consecutive built-in
/// JSON steps fuse into one stage that parses each record once; each
/// `remap` step and each filter with a `condition` is a stage of its own,
/// and a run of them with a fast form reads each record once.
///
/// A configuration that [`ConfigLoader`](crate::ConfigLoader) accepted
/// always builds; for one that did not, a program that fails to compile
/// becomes a stage that sends every record to the dead-letter path with
/// the compiler's message. [`try_chain_from_config`] reports it instead.
#[must_use]
pub fn chain_from_config(transforms: &[TransformConfig]) -> TransformChain {
    build(transforms, true, "").unwrap_or_default()
}

/// The chain for a configuration's `[[transforms]]`, as
/// [`chain_from_config`] builds it.
///
/// # Errors
///
/// A [`ChainError`]: the step and the compiler's message, for a VRL
/// program that does not compile, or the step and its factory's error,
/// for a registered step.
pub fn try_chain_from_config(transforms: &[TransformConfig]) -> Result<TransformChain, ChainError> {
    build(transforms, false, "")
}

/// Why a configuration's `[[transforms]]` (or a sink's own steps, or its
/// `when`) give no chain ([`try_chain_from_config`]). Each names the
/// step: its 1-based place, after the sink's label when it is one of a
/// sink's (`sink "errors" remap #1`).
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// A registered step's factory failed.
    #[error("{label}[[transforms]] #{step}: {source}")]
    Registered {
        /// The sink's label (`sink "errors" `), empty for the shared steps.
        label: String,
        /// The step's place, from 1.
        step: usize,
        /// The factory's error, secrets taken out.
        #[source]
        source: BuildError,
    },
    /// A `remap` step or a filter `condition` whose program does not
    /// compile.
    #[cfg(feature = "remap")]
    #[error("{name}: the VRL program does not compile:\n{source}")]
    Program {
        /// The step's name (`remap #2`, `sink "errors" filter #1`).
        name: String,
        /// The compiler's diagnostics.
        #[source]
        source: super::VrlError,
    },
    /// A `remap` step or a filter `condition` in a build without the
    /// `remap` feature.
    #[error("{name}: this build of etl has no VRL support (built without the `remap` feature)")]
    NoRemap {
        /// The step's name (`transform #2`).
        name: String,
    },
}

/// [`try_chain_from_config`] for the steps of one sink's branch (or its
/// condition): each step's name (in dead letters and errors) starts with
/// `label`, such as `sink "errors" `.
pub(crate) fn try_chain_labelled(
    transforms: &[TransformConfig],
    label: &str,
) -> Result<TransformChain, ChainError> {
    build(transforms, false, label)
}

/// The fast form of a sink's `when` (a `filter` step), judged with the
/// other sinks' conditions on one reading of each record; `after_json`:
/// the records it judges come out of shared steps built here (see
/// [`steps_write_json`]). `None` when it has none: its stage judges alone.
pub(crate) fn condition_form(when: &TransformConfig, after_json: bool) -> Option<Condition> {
    let form = match when {
        TransformConfig::Filter {
            field,
            op,
            value,
            condition: None,
        } => {
            let json = |v: &toml::Value| serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
            let filter = JsonOp::Filter {
                path: JsonOp::path(field),
                op: *op,
                value: value.as_ref().map_or(serde_json::Value::Null, json),
            };
            Condition::json(&JsonStage::new("when", vec![filter]))
        }
        #[cfg(feature = "remap")]
        TransformConfig::Filter {
            condition: Some(condition),
            ..
        } => Condition::program(&super::VrlProgram::condition(condition).ok()?),
        _ => None,
    };
    form.map(|form| form.checked_input(after_json))
}

/// Whether the records coming out of `transforms`' chain are known to be
/// valid JSON: there is a step, and none of them is a registered one.
pub(crate) fn steps_write_json(transforms: &[TransformConfig]) -> bool {
    !transforms.is_empty()
        && !transforms
            .iter()
            .any(|t| matches!(t, TransformConfig::Custom(_)))
}

/// Records reaching a stage after the first are known to be valid JSON:
/// every stage built here keeps only records it read as JSON, and writes
/// JSON. (The first stage checks: with transforms, the NDJSON file source
/// leaves the check to them.)
fn build(
    transforms: &[TransformConfig],
    lenient: bool,
    label: &str,
) -> Result<TransformChain, ChainError> {
    use TransformConfig as T;

    let mut chain = Fuser::new();
    let json = |v: &toml::Value| serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
    // The run of JSON steps being fused, once one is seen.
    let mut run: Option<Vec<JsonOp>> = None;
    // Whether a registered step came before: what it writes need not be
    // JSON, so later program stages check their input again.
    let mut custom_before = false;
    let checked = |chain: &Fuser, custom_before: bool| !chain.is_empty() && !custom_before;
    let json_stage = |chain: &mut Fuser, ops: Vec<JsonOp>, custom_before: bool| {
        let checked = checked(chain, custom_before);
        chain.json(JsonStage::new(format!("{label}json"), ops), checked);
    };
    for (i, t) in transforms.iter().enumerate() {
        let op = match t {
            T::ParseJson => None,
            T::Custom(custom) => {
                if let Some(ops) = run.take() {
                    json_stage(&mut chain, ops, custom_before);
                }
                let name = format!("{label}transform {}", i + 1);
                match custom.build_alone(&name) {
                    Ok(stage) => chain.push(stage),
                    Err(e) if lenient => chain.push(Box::new(Unbuilt {
                        name,
                        reason: e.to_string(),
                    })),
                    Err(source) => {
                        return Err(ChainError::Registered {
                            label: label.to_owned(),
                            step: i + 1,
                            source,
                        });
                    }
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
                    json_stage(&mut chain, ops, custom_before);
                }
                let checked = checked(&chain, custom_before);
                program_stage(&mut chain, (label, i), condition, None, lenient, checked)?;
                continue;
            }
            T::Remap {
                source,
                drop_on_error,
                ..
            } => {
                if let Some(ops) = run.take() {
                    json_stage(&mut chain, ops, custom_before);
                }
                let source = source.as_deref().unwrap_or_default();
                let checked = checked(&chain, custom_before);
                program_stage(
                    &mut chain,
                    (label, i),
                    source,
                    Some(*drop_on_error),
                    lenient,
                    checked,
                )?;
                continue;
            }
        };
        run.get_or_insert_with(Vec::new).extend(op);
    }
    if let Some(ops) = run {
        json_stage(&mut chain, ops, custom_before);
    }
    let mut built = TransformChain::new();
    for stage in chain.finish() {
        built.push(stage);
    }
    Ok(built)
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

/// Add the stage of `[[transforms]]` entry `i`: a `remap` step (with its
/// `drop_on_error`) or a filter condition (`None`); `checked`: its records
/// are known to be valid JSON.
#[cfg(feature = "remap")]
fn program_stage(
    chain: &mut Fuser,
    (label, i): (&str, usize),
    source: &str,
    remap: Option<bool>,
    lenient: bool,
    checked: bool,
) -> Result<(), ChainError> {
    use super::{Remap, VrlFilter, VrlProgram};

    let (kind, compiled) = match remap {
        Some(_) => ("remap", VrlProgram::remap(source)),
        None => ("filter", VrlProgram::condition(source)),
    };
    let name = format!("{label}{kind} #{}", i + 1);
    match compiled {
        Ok(program) => match remap {
            Some(drop_on_error) => chain.remap(
                Remap::new(name, program)
                    .drop_on_error(drop_on_error)
                    .checked_input(checked),
            ),
            None => chain.condition(VrlFilter::new(name, program).checked_input(checked)),
        },
        Err(e) if lenient => chain.push(Box::new(Broken(name, e.message))),
        Err(source) => return Err(ChainError::Program { name, source }),
    }
    Ok(())
}

#[cfg(not(feature = "remap"))]
fn program_stage(
    chain: &mut Fuser,
    (label, i): (&str, usize),
    _source: &str,
    _remap: Option<bool>,
    lenient: bool,
    _checked: bool,
) -> Result<(), ChainError> {
    let name = format!("{label}transform #{}", i + 1);
    if lenient {
        let message = "this build of etl has no VRL support (built without the `remap` feature)";
        chain.push(Box::new(Broken(name, message.to_owned())));
        Ok(())
    } else {
        Err(ChainError::NoRemap { name })
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
    use crate::transform::ChainOutput;

    fn rec(offset: i64, value: &str) -> Record {
        Record::new(
            Position::new(SourceId::new("s"), PartitionId(0), Offset(offset)),
            value.as_bytes().to_vec(),
        )
    }

    #[test]
    fn config_transforms_fuse_into_one_stage() {
        let config = etl_config::Registry::new()
            .loader()
            .text(
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
        let mut chain = chain_from_config(&config.transforms);
        assert_eq!(chain.len(), 1);
        let mut out = ChainOutput::default();
        chain.apply(vec![rec(0, r#"{"n":1}"#), rec(1, r#"{"n":2}"#)], &mut out);
        assert_eq!(&out.kept[0].value[..], br#"{"n":1,"ok":true}"#);
        assert_eq!(out.filtered, 1);
    }

    #[cfg(feature = "remap")]
    #[test]
    fn programs_split_the_json_run_and_every_stage_forks() {
        let config = etl_config::Registry::new()
            .loader()
            .text(
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
        let chain = try_chain_from_config(&config.transforms).unwrap();
        assert_eq!(
            chain.len(),
            3,
            "the filter and the remap step (one run), the condition, the drop_field"
        );
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
    fn a_run_of_filters_conditions_and_remap_is_one_stage() {
        let config = etl_config::Registry::new()
            .loader()
            .text(
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
        let mut chain = try_chain_from_config(&config.transforms).expect("it builds");
        assert_eq!(
            chain.len(),
            2,
            "the filters and the remap step as one run, not the condition after it"
        );
        let mut out = ChainOutput::default();
        chain.apply(
            vec![
                rec(0, r#"{"o":{"n":2,"s":"x","e":"a@b"},"z":1.50}"#),
                rec(1, r#"{"o":{"n":3}}"#),
                rec(2, r#"{"o":{"n":"4"}}"#),
                rec(3, r#"{"o":{"n":2}"#),
            ],
            &mut out,
        );
        let kept: Vec<&[u8]> = out.kept.iter().map(|r| &r.value[..]).collect();
        assert_eq!(
            kept,
            vec![&br#"{"o":{"n":2,"s":"x"},"z":1.50,"c":200}"#[..]]
        );
        assert_eq!(out.filtered, 2, "c = 300, and \"4\" >= 1 is false");
        assert_eq!(out.rejected.len(), 1);
        assert!(
            out.rejected[0]
                .reason
                .starts_with("transform json: invalid JSON"),
            "the stage that failed is named: {}",
            out.rejected[0].reason
        );
    }

    #[cfg(feature = "remap")]
    #[test]
    fn a_program_that_does_not_compile_names_its_step_and_keeps_the_diagnostic() {
        let config = etl_config::Registry::new()
            .loader()
            .text(
                "[source]\ntype = \"generator\"\n[[transforms]]\ntype = \"parse_json\"\n\
                 [[sinks]]\ntype = \"blackhole\"\n",
                std::path::Path::new("."),
            )
            .expect("it loads");
        let mut transforms = config.transforms;
        transforms.push(TransformConfig::Remap {
            source: Some(".a = ".to_owned()),
            drop_on_error: false,
            file: None,
        });
        let Err(err) = try_chain_from_config(&transforms) else {
            panic!("the program does not compile");
        };
        let ChainError::Program { name, source } = &err else {
            panic!("{err:?}");
        };
        assert_eq!(name, "remap #2");
        let shown = err.to_string();
        assert!(
            shown.starts_with("remap #2: the VRL program does not compile:\n"),
            "{shown}"
        );
        let cause = std::error::Error::source(&err).expect("a source");
        assert_eq!(cause.to_string(), source.message);
    }

    #[test]
    fn a_registered_step_that_fails_names_its_place_and_its_factory_s_error() {
        #[derive(Debug, thiserror::Error)]
        #[error("no such table")]
        struct Missing;
        let registry = etl_config::Registry::new()
            .transform("lookup", |_: toml::Table, _| Err(Missing.into()));
        let config = registry
            .loader()
            .text(
                "[source]\ntype = \"generator\"\n[[transforms]]\ntype = \"parse_json\"\n\
                 [[transforms]]\ntype = \"lookup\"\n[[sinks]]\ntype = \"blackhole\"\n",
                std::path::Path::new("."),
            )
            .expect("it loads");
        let Err(err) = try_chain_from_config(&config.transforms) else {
            panic!("the factory fails");
        };
        assert_eq!(
            err.to_string(),
            "[[transforms]] #2: lookup \"transform 2\": no such table"
        );
        assert!(
            matches!(err, ChainError::Registered { step: 2, .. }),
            "{err:?}"
        );
        let chain: Vec<String> =
            std::iter::successors(std::error::Error::source(&err), |e| (*e).source())
                .map(ToString::to_string)
                .collect();
        assert_eq!(
            chain,
            ["lookup \"transform 2\": no such table", "no such table"]
        );
    }
}
