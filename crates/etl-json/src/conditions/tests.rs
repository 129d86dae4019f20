//! The conditions judged on one reading against each condition's own
//! stage, run alone on the record.

#![allow(clippy::unwrap_used)]

use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_transform::{Outcome, Transform};
use proptest::prelude::*;
use serde_json::Value;

use super::*;
use crate::ops::CompareOp;
use crate::{JsonOp, JsonStage, VrlFilter, VrlProgram};

/// A condition as a configuration gives it: declarative or a program.
#[derive(Debug, Clone)]
enum Spec {
    Json(JsonOp),
    Vrl(&'static str),
}

/// Programs in the fast subset and out of it.
const PROGRAMS: &[&str] = &[
    ".a == 1",
    ".b.c == 2",
    r#".d != "x""#,
    "!(.a == 2) && .b != null",
    ".a == 1 || .b.c == null",
    r#"contains(string(.d) ?? "", "x")"#,
];

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        json_spec(),
        prop::sample::select(PROGRAMS).prop_map(Spec::Vrl),
    ]
}

/// A declarative condition.
fn json_spec() -> impl Strategy<Value = Spec> {
    let cmp = prop_oneof![
        Just(CompareOp::Eq),
        Just(CompareOp::Ne),
        Just(CompareOp::Lt),
        Just(CompareOp::Ge),
        Just(CompareOp::Exists),
    ];
    let constant = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..4).prop_map(Value::from),
        (-3.0f64..4.0).prop_map(Value::from),
        "[x-z]{0,2}".prop_map(Value::from),
    ];
    ("[a-d](\\.([a-d]|[0-1])){0,1}", cmp, constant).prop_map(|(f, op, value)| {
        Spec::Json(JsonOp::Filter {
            path: JsonOp::path(&f),
            op,
            value,
        })
    })
}

/// A field's value as users write it.
fn raw() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(vec![
        "1",
        "2",
        "3",
        "-0",
        "1.50",
        "2e0",
        "null",
        "true",
        r#""x""#,
        r#""xy""#,
        r#""\u0078""#,
        r#""é""#,
        "[]",
        "[1, 2]",
        "{}",
        "1e400",
        r#""\ud800""#,
    ])
    .prop_map(str::to_owned);
    leaf.prop_recursive(2, 6, 3, |inner| {
        prop::collection::vec(("[a-d]", inner), 0..3).prop_map(|fields| {
            let body: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("\"{k}\": {v}"))
                .collect();
            format!("{{{}}}", body.join(","))
        })
    })
}

/// A record's value: objects (duplicate keys and spacing included), and
/// now and then something that is not one.
fn record() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec(("[a-d]", raw()), 0..5).prop_map(|fields| {
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", body.join(", "))
        }),
        1 => prop::sample::select(vec!["not json", "[1]", r#"{"a":1"#, "", "{\"a\":1}x"])
            .prop_map(str::to_owned),
    ]
}

/// Each condition's stage, as a configuration builds it, and its fast
/// form.
fn build(specs: &[Spec], checked: bool) -> (Vec<Box<dyn Transform>>, Conditions) {
    let mut stages: Vec<Box<dyn Transform>> = Vec::new();
    let mut forms = Vec::new();
    for spec in specs {
        match spec {
            Spec::Json(op) => {
                let stage = JsonStage::new("when", vec![op.clone()]);
                forms.push(Condition::json(&stage).map(|c| c.checked_input(checked)));
                stages.push(Box::new(stage));
            }
            Spec::Vrl(source) => {
                let program = VrlProgram::condition(source).unwrap();
                forms.push(Condition::program(&program).map(|c| c.checked_input(checked)));
                stages.push(Box::new(
                    VrlFilter::new("when", program).checked_input(checked),
                ));
            }
        }
    }
    (stages, Conditions::new(forms))
}

fn rec(value: &str) -> Record {
    Record::new(
        Position::new(SourceId::new("s"), PartitionId(0), Offset(0)),
        value.as_bytes().to_vec(),
    )
}

/// What a condition's stage says of a record: kept (`Some(true)`),
/// filtered (`Some(false)`), or neither (`None`: refused).
fn alone(stage: &mut dyn Transform, value: &str) -> Option<bool> {
    match stage.apply(rec(value)) {
        Outcome::Keep(_) => Some(true),
        Outcome::Filtered => Some(false),
        _ => None,
    }
}

#[test]
fn conditions_are_judged_on_one_reading_as_their_stages_judge_them() {
    let specs = [
        Spec::Json(JsonOp::Filter {
            path: JsonOp::path("amount"),
            op: CompareOp::Lt,
            value: 100.into(),
        }),
        Spec::Vrl(r#".user == "u7""#),
        Spec::Vrl(r#"contains(string(.user) ?? "", "u")"#),
        Spec::Json(JsonOp::Filter {
            path: JsonOp::path("amount"),
            op: CompareOp::Lt,
            value: 500.into(),
        }),
        Spec::Vrl(r#".user != "u7""#),
    ];
    let (_, mut conditions) = build(&specs, true);
    assert!(conditions.any_fast());
    let mut judging = conditions.read(br#"{"user":"u7","amount":250.0}"#);
    assert_eq!(judging.holds(0), Some(false));
    assert_eq!(judging.holds(1), Some(true));
    assert_eq!(judging.holds(2), None, "outside the fast subset");
    assert_eq!(judging.holds(3), Some(true));
    assert_eq!(judging.holds(4), Some(false));
    assert_eq!(judging.holds(5), None, "no such condition");
    drop(judging);
    let mut forked = conditions.fork();
    assert_eq!(forked.read(br#"{"amount":7}"#).holds(0), Some(true));
    // A number past an f64 is left to the stages, which refuse it.
    assert_eq!(conditions.read(br#"{"amount":1e400}"#).holds(3), None);
}

proptest! {
    #[test]
    fn prop_one_reading_judges_each_condition_as_its_stage_alone(
        specs in prop::collection::vec(spec(), 1..5),
        inputs in prop::collection::vec(record(), 1..6),
        order in Just((0..5usize).collect::<Vec<_>>()).prop_shuffle(),
    ) {
        for checked in [false, true] {
            let (mut stages, mut conditions) = build(&specs, checked);
            for input in &inputs {
                // Checked input is known to be JSON.
                if checked && serde_json::from_str::<Value>(input).is_err() {
                    continue;
                }
                let mut judging = conditions.read(input.as_bytes());
                for &i in order.iter().filter(|i| **i < specs.len()) {
                    if let Some(held) = judging.holds(i) {
                        let want = alone(stages[i].as_mut(), input);
                        prop_assert_eq!(
                            Some(held), want,
                            "condition {:?} on {} (checked: {})", specs[i], input, checked
                        );
                    }
                }
            }
        }
    }
}

/// Objects of numbers of every shape under keys written plainly or
/// escaped (`\u0061` is `a`), duplicates included.
fn numbers() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (-1e6f64..1e6).prop_map(|f| f.to_string()),
        "-?(0|[1-9][0-9]{0,19})(\\.[0-9]{1,18})?([eE][-+]?[0-9]{1,3})?",
        Just("-0".to_owned()),
    ];
    prop::collection::vec(("[a-d]|\\\\u006[1-4]", number), 0..5).prop_map(|fields| {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", body.join(","))
    })
}

proptest! {
    /// Declarative conditions alone, on checked input, are judged on a
    /// reading of the fields they name only: as their stages judge them.
    #[test]
    fn prop_declarative_conditions_alone_judge_as_their_stages(
        specs in prop::collection::vec(json_spec(), 1..5),
        inputs in prop::collection::vec(prop_oneof![record(), numbers()], 1..6),
    ) {
        for checked in [false, true] {
            let (mut stages, mut conditions) = build(&specs, checked);
            for input in &inputs {
                if checked && serde_json::from_str::<Value>(input).is_err() {
                    continue;
                }
                let mut judging = conditions.read(input.as_bytes());
                for (i, stage) in stages.iter_mut().enumerate() {
                    if let Some(held) = judging.holds(i) {
                        let want = alone(stage.as_mut(), input);
                        prop_assert_eq!(
                            Some(held), want,
                            "condition {:?} on {} (checked: {})", specs[i], input, checked
                        );
                    }
                }
            }
        }
    }
}

/// A threshold as users write one: integers and decimals of every size,
/// and now and then something that is not a number.
fn threshold() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (-1_000i64..1_000).prop_map(Value::from),
        2 => (-1e3f64..1e3).prop_map(Value::from),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        1 => (-1e6f64..1e6).prop_map(|f| Value::from(f.trunc())),
        1 => Just(Value::from(-0.0)),
        1 => Just(Value::Null),
        1 => Just(Value::from("5")),
    ]
}

/// Amounts near the thresholds, as integers and decimals.
fn amounts() -> impl Strategy<Value = String> {
    let amount = prop_oneof![
        (-1_000i64..1_000).prop_map(|n| n.to_string()),
        (-100_000i64..100_000).prop_map(|c| format!(
            "{}{}.{:02}",
            if c < 0 { "-" } else { "" },
            c.abs() / 100,
            c.abs() % 100
        )),
        (-1e3f64..1e3).prop_map(|f| f.to_string()),
        "-?(0|[1-9][0-9]{0,19})(\\.[0-9]{1,18})?([eE][-+]?[0-9]{1,3})?",
        Just("-0".to_owned()),
        Just("null".to_owned()),
        Just(r#""7""#.to_owned()),
    ];
    prop::collection::vec(
        (prop_oneof![Just("a"), Just("b"), Just("\\u0061")], amount),
        0..4,
    )
    .prop_map(|fields| {
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", body.join(","))
    })
}

proptest! {
    /// Thresholds on one field, as a router's routes by amount have them,
    /// compare the field's number read once per record: each as its
    /// stage, run alone, judges it.
    #[test]
    fn prop_thresholds_on_one_field_judge_as_their_stages(
        thresholds in prop::collection::vec((threshold(), prop_oneof![
            Just(CompareOp::Lt),
            Just(CompareOp::Le),
            Just(CompareOp::Gt),
            Just(CompareOp::Ge),
            Just(CompareOp::Eq),
            Just(CompareOp::Ne),
            Just(CompareOp::Exists),
        ]), 1..5),
        inputs in prop::collection::vec(amounts(), 1..6),
    ) {
        let specs: Vec<Spec> = thresholds
            .into_iter()
            .map(|(value, op)| Spec::Json(JsonOp::Filter { path: JsonOp::path("a"), op, value }))
            .collect();
        for checked in [false, true] {
            let (mut stages, mut conditions) = build(&specs, checked);
            for input in &inputs {
                let mut judging = conditions.read(input.as_bytes());
                for (i, stage) in stages.iter_mut().enumerate() {
                    if let Some(held) = judging.holds(i) {
                        let want = alone(stage.as_mut(), input);
                        prop_assert_eq!(
                            Some(held), want,
                            "condition {:?} on {} (checked: {})", specs[i], input, checked
                        );
                    }
                }
            }
        }
    }
}

/// `remap` programs a fused run ends with: leaving the conditions'
/// fields alone, assigning, deleting or changing inside them, aborting,
/// and one outside the fast subset.
const REMAPS: &[&str] = &[
    ".e = 1",
    ".a = 7",
    "del(.a)",
    ".b.c = 2",
    r#".d = "x""#,
    ".a = .a",
    ".e = .a",
    r#".b = {"c": 3}"#,
    "if .a == 3 { abort }\n.e = 2",
    ".e = to_int(round(to_float!(.a) * 100))",
    r#".e = upcase(string!(.d))"#,
    ".b.c = .d",
];

/// A record nested as deep as the fast path reads (127 levels) or near
/// it, with an empty object `b` to write its deep `d` into (`.b.c = .d`
/// makes it one level deeper than it was read).
fn deep() -> impl Strategy<Value = String> {
    (-3i64..4, 123usize..127).prop_map(|(a, n)| {
        format!(
            r#"{{"a":{a},"b":{{}},"d":{}{}}}"#,
            "[".repeat(n),
            "]".repeat(n)
        )
    })
}

/// A record every fast path keeps and judges: what a fused run that
/// leaves the conditions' fields alone gives a verdict on.
const PLAIN: &str = r#"{"a":1,"b":2}"#;

/// A fused run of a condition and `remap` (the shared steps before a
/// router), asked to judge `conditions`; `None` when the stages did not
/// make one run (a program outside the fast subset).
fn judging_run(remap: &str, conditions: &Conditions) -> Option<Box<dyn Transform>> {
    let mut fuser = crate::Fuser::new();
    let condition = VrlProgram::condition(r#".d != "skip""#).unwrap();
    fuser.condition(VrlFilter::new("filter", condition));
    let program = VrlProgram::remap(remap).unwrap();
    fuser.remap(crate::Remap::new("remap", program).checked_input(true));
    let mut stages = fuser.finish();
    if stages.len() != 1 {
        return None;
    }
    let mut run = stages.pop()?;
    conditions.judge_in(run.as_mut()).then_some(run)
}

/// What a condition's stage says of a record's bytes: kept
/// (`Some(true)`), filtered (`Some(false)`), or neither (`None`).
fn alone_on(stage: &mut dyn Transform, value: &bytes::Bytes) -> Option<bool> {
    let mut record = rec("");
    record.value = value.clone();
    match stage.apply(record) {
        Outcome::Keep(_) => Some(true),
        Outcome::Filtered => Some(false),
        _ => None,
    }
}

#[test]
fn a_fused_run_hands_on_verdicts_on_fields_it_left_alone_only() {
    let below = |limit: i64| {
        Spec::Json(JsonOp::Filter {
            path: JsonOp::path("a"),
            op: CompareOp::Lt,
            value: limit.into(),
        })
    };
    let specs = [below(100), Spec::Vrl(".a == 1"), below(500)];
    let (mut stages, conditions) = build(&specs, false);
    let mut run = judging_run(".e = to_int(round(to_float!(.a) * 100))", &conditions)
        .expect("the filter and the remap step fuse");
    let mut verdicts = Verdicts::new();
    let Outcome::Keep(kept) = run.apply(rec(r#"{"a":250.5,"d":"y"}"#)) else {
        panic!("kept");
    };
    assert_eq!(&kept.value[..], br#"{"a":250.5,"d":"y","e":25050}"#);
    verdicts.take_from(run.as_mut());
    assert_eq!(verdicts.len(), 1);
    let verdict = verdicts.of(&kept.value).expect("the bytes judged");
    assert_eq!(verdict.holds(0), Some(false));
    assert_eq!(verdict.holds(1), None, "a program: judged by its stage");
    assert_eq!(verdict.holds(2), Some(true));
    assert_eq!(alone_on(stages[2].as_mut(), &kept.value), Some(true));
    // The same text elsewhere is not the bytes judged.
    assert_eq!(
        verdicts.of(&bytes::Bytes::copy_from_slice(&kept.value)),
        None
    );
    // Handed on once.
    verdicts.take_from(run.as_mut());
    assert!(verdicts.is_empty());
    // A program that assigns the field leaves its conditions unjudged.
    let mut run = judging_run(".a = 7", &conditions).expect("fused");
    let Outcome::Keep(kept) = run.apply(rec(r#"{"a":250.5}"#)) else {
        panic!("kept");
    };
    verdicts.take_from(run.as_mut());
    assert!(verdicts.of(&kept.value).is_none());
    // Not JSON: left to the stages, no verdict.
    assert!(!matches!(run.apply(rec("not json")), Outcome::Keep(_)));
    verdicts.take_from(run.as_mut());
    assert!(verdicts.is_empty());
}

#[test]
fn a_run_never_drained_holds_at_most_the_cap_of_verdicts() {
    let specs = [Spec::Json(JsonOp::Filter {
        path: JsonOp::path("a"),
        op: CompareOp::Lt,
        value: 100.into(),
    })];
    let (_, conditions) = build(&specs, false);
    let mut run = judging_run(".e = 1", &conditions).expect("fused");
    let mut last = None;
    for _ in 0..=Verdicts::MAX_HELD {
        let Outcome::Keep(kept) = run.apply(rec(r#"{"a":5}"#)) else {
            panic!("kept");
        };
        last = Some(kept.value);
    }
    let mut verdicts = Verdicts::new();
    verdicts.take_from(run.as_mut());
    assert_eq!(verdicts.len(), Verdicts::MAX_HELD);
    // The record past the cap has none: it is read.
    for _ in 0..Verdicts::MAX_HELD {
        verdicts.next += 1;
    }
    assert_eq!(verdicts.of(&last.unwrap()), None);
    // Drained, the run gives verdicts again.
    let Outcome::Keep(kept) = run.apply(rec(r#"{"a":5}"#)) else {
        panic!("kept");
    };
    verdicts.take_from(run.as_mut());
    assert_eq!(verdicts.len(), 1);
    assert!(verdicts.of(&kept.value).is_some());
}

#[test]
fn a_record_written_past_the_nesting_limit_gets_no_verdict() {
    let specs = [Spec::Json(JsonOp::Filter {
        path: JsonOp::path("a"),
        op: CompareOp::Lt,
        value: 100.into(),
    })];
    let (mut stages, conditions) = build(&specs, false);
    let mut run = judging_run(".b.c = .d", &conditions).expect("fused");
    // 127 levels read; `d` written one level deeper makes 128.
    let input = format!(
        r#"{{"a":5,"b":{{}},"d":{}{}}}"#,
        "[".repeat(126),
        "]".repeat(126)
    );
    let Outcome::Keep(kept) = run.apply(rec(&input)) else {
        panic!("kept");
    };
    assert!(kept.value.starts_with(br#"{"a":5,"b":{"c":[[["#));
    // The condition's stage refuses the record written.
    assert_eq!(alone_on(stages[0].as_mut(), &kept.value), None);
    let mut verdicts = Verdicts::new();
    verdicts.take_from(run.as_mut());
    assert_eq!(verdicts.of(&kept.value), None);
}

proptest! {
    /// The verdicts a fused run hands on, for the records it keeps, are
    /// what each condition's own stage says of the record as written:
    /// on records the run cannot judge, duplicate keys, non-numbers, and
    /// programs that change the conditions' fields.
    #[test]
    fn prop_verdicts_handed_on_are_the_stages_on_the_record_written(
        specs in prop::collection::vec(prop_oneof![spec(), json_spec()], 1..5),
        thresholds in prop::collection::vec(threshold(), 0..3),
        remap in prop::sample::select(REMAPS),
        inputs in prop::collection::vec(prop_oneof![
            4 => record(), 4 => numbers(), 4 => amounts(), 1 => deep()
        ], 1..8),
    ) {
        let mut specs = specs;
        let mut inputs = inputs;
        inputs.push(PLAIN.to_owned());
        specs.extend(thresholds.into_iter().map(|value| Spec::Json(JsonOp::Filter {
            path: JsonOp::path("a"),
            op: CompareOp::Lt,
            value,
        })));
        let (mut stages, conditions) = build(&specs, false);
        let Some(mut run) = judging_run(remap, &conditions) else {
            return Ok(());
        };
        let mut verdicts = Verdicts::new();
        for input in &inputs {
            let Outcome::Keep(kept) = run.apply(rec(input)) else {
                verdicts.take_from(run.as_mut());
                prop_assert!(verdicts.is_empty(), "a verdict on {} not kept", input);
                continue;
            };
            verdicts.take_from(run.as_mut());
            let Some(verdict) = verdicts.of(&kept.value) else {
                // A program that leaves every condition's field alone
                // leaves a plain record's declarative conditions judged.
                prop_assert!(
                    input != PLAIN || remap != ".e = 1",
                    "no verdict on {} after {:?}", input, remap
                );
                continue;
            };
            if input == PLAIN && remap == ".e = 1" {
                for (i, spec) in specs.iter().enumerate() {
                    prop_assert!(
                        !matches!(spec, Spec::Json(_)) || verdict.holds(i).is_some(),
                        "condition {:?} unjudged on {}", spec, input
                    );
                }
            }
            for (i, stage) in stages.iter_mut().enumerate() {
                if let Some(held) = verdict.holds(i) {
                    prop_assert_eq!(
                        Some(held), alone_on(stage.as_mut(), &kept.value),
                        "condition {:?} after {:?} on {} written {:?}",
                        specs[i], remap, input, String::from_utf8_lossy(&kept.value)
                    );
                }
            }
        }
    }
}
