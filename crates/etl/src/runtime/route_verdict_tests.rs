//! Routes after shared steps that judge the routes' conditions while
//! they write each record (a fused run handing its verdicts on), against
//! the same routes with each condition judged by its own stage.

#![allow(clippy::unwrap_used)]

use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use proptest::prelude::*;

use super::fanout::{StageOutput, Steps};
use super::route::{Route, Router};
use crate::config::{RouteMode, TransformConfig};
use crate::transform::{condition_form, steps_write_json, try_chain_labelled};

/// The shared steps: a filter, then a `remap` program that leaves the
/// routes' field alone, changes it, deletes it, or aborts.
fn shared(remap: &str) -> Vec<TransformConfig> {
    vec![
        TransformConfig::Filter {
            field: "amount".to_owned(),
            op: etl_json::CompareOp::Ne,
            value: Some(toml::Value::Integer(13)),
            condition: None,
        },
        TransformConfig::Remap {
            source: Some(remap.to_owned()),
            file: None,
            drop_on_error: true,
        },
    ]
}

const REMAPS: &[&str] = &[
    ".amount_cents = to_int(round(to_float!(.amount) * 100))",
    ".amount = 7",
    "del(.amount)",
    ".n.amount = 450",
    "if .amount == 5 { abort }\n.x = 1",
    ".x = .amount",
    r#".level = "error""#,
    ".a.b = .d",
];

/// A record with an array `d` nested `n` deep and an empty object `a` to
/// write it into (`.a.b = .d` makes the record one level deeper).
fn deep(amount: &str, n: usize) -> String {
    format!(
        r#"{{"amount":{amount},"a":{{}},"d":{}{}}}"#,
        "[".repeat(n),
        "]".repeat(n)
    )
}

/// A sink's condition: on a field, or a program.
fn when() -> impl Strategy<Value = Option<TransformConfig>> {
    use etl_json::CompareOp as C;
    prop_oneof![
        1 => Just(None),
        4 => (
            prop::sample::select(vec!["amount", "n.amount", "level", "x"]),
            prop::sample::select(vec![C::Lt, C::Ge, C::Eq, C::Ne, C::Exists]),
            prop_oneof![
                (0i64..600).prop_map(toml::Value::Integer),
                Just(toml::Value::String("12".to_owned())),
                Just(toml::Value::Float(99.5)),
            ],
        )
            .prop_map(|(field, op, value)| Some(TransformConfig::Filter {
                field: field.to_owned(),
                op,
                value: Some(value),
                condition: None,
            })),
        1 => prop::sample::select(vec![".amount == 7", r#".level == "error""#])
            .prop_map(|source| Some(TransformConfig::Filter {
                field: String::new(),
                op: etl_json::CompareOp::Exists,
                value: None,
                condition: Some(source.to_owned()),
            })),
    ]
}

/// Records the fused run judges and ones it leaves to its stages:
/// duplicate keys, escaped keys, non-numbers, numbers past an `f64`,
/// surrogate escapes, and text that is not JSON.
fn value() -> impl Strategy<Value = String> {
    let amount = prop_oneof![
        (0i64..600).prop_map(|a| a.to_string()),
        (0.0f64..600.0).prop_map(|a| format!("{a:.2}")),
        Just("1e400".to_owned()),
        Just(r#""12""#.to_owned()),
        Just("null".to_owned()),
        Just("[1]".to_owned()),
    ];
    let level = prop::sample::select(vec![r#""error""#, r#""info""#, r#""\u0065rror""#, "1"]);
    prop_oneof![
        8 => (amount.clone(), level, 0..4u8, amount).prop_map(|(a, l, shape, b)| match shape {
            0 => format!(r#"{{"level":{l},"n":{{"amount":{a}}},"amount":{a}}}"#),
            1 => format!(r#"{{ "amount" : {a}, "level":{l}}}"#),
            2 => format!(r#"{{"amount":{a},"level":{l},"amount":{b}}}"#),
            _ => format!(r#"{{"\u0061mount":{a},"x":{b}}}"#),
        }),
        1 => ((0i64..600), 124usize..127).prop_map(|(a, n)| deep(&a.to_string(), n)),
        1 => prop::sample::select(vec![
            "not json",
            r#"{"amount":1"#,
            "[1]",
            r#"{"amount":5,"level":"\ud800"}"#,
        ])
        .prop_map(str::to_owned),
    ]
}

/// The shared steps and the routes of these sinks, each condition with
/// its fast form (`fast`) or judged by its stage alone.
fn steps(
    remap: &str,
    whens: &[Option<TransformConfig>],
    mode: RouteMode,
    unmatched: Option<usize>,
    fast: bool,
) -> Steps {
    let shared = shared(remap);
    let after_json = steps_write_json(&shared);
    let routes = whens
        .iter()
        .enumerate()
        .map(|(i, when)| match when {
            Some(config) if Some(i) != unmatched => {
                let chain = try_chain_labelled(std::slice::from_ref(config), "when ").unwrap();
                let form = fast.then(|| condition_form(config, after_json)).flatten();
                Route::new().when_chain(chain).when_fast(form)
            }
            _ => Route::new(),
        })
        .collect();
    Steps {
        chain: try_chain_labelled(&shared, "").unwrap(),
        router: Some(Box::new(Router::new(mode, routes, unmatched))),
    }
}

fn records(values: &[String]) -> Vec<Record> {
    (0..)
        .zip(values)
        .map(|(offset, v)| {
            Record::new(
                Position::new(SourceId::new("s"), PartitionId(0), Offset(offset)),
                v.as_bytes().to_vec(),
            )
        })
        .collect()
}

/// What the steps made of a batch, comparable.
fn show(steps: &mut Steps, values: &[String]) -> String {
    let StageOutput { out, routed } = steps.run(records(values));
    let routed = routed.unwrap_or_default();
    let to: Vec<Vec<(i64, String)>> = routed
        .to
        .iter()
        .map(|list| {
            list.iter()
                .map(|r| {
                    (
                        r.position.offset.0,
                        String::from_utf8_lossy(&r.value).into_owned(),
                    )
                })
                .collect()
        })
        .collect();
    let rejected: Vec<(i64, &str)> = out
        .rejected
        .iter()
        .chain(&routed.rejected)
        .map(|d| (d.record.position.offset.0, d.reason.as_str()))
        .collect();
    format!(
        "to {to:?}\nrejected {rejected:?}\nfiltered {} {} unrouted {} halted {:?} {:?}",
        out.filtered,
        routed.filtered,
        routed.unrouted,
        out.halted.map(|d| d.reason),
        routed.halted.map(|d| d.reason)
    )
}

#[test]
fn routes_by_amount_after_a_remap_take_the_verdicts_the_run_gave() {
    use etl_json::CompareOp as C;
    let below = |limit: i64| {
        Some(TransformConfig::Filter {
            field: "amount".to_owned(),
            op: C::Lt,
            value: Some(toml::Value::Integer(limit)),
            condition: None,
        })
    };
    let whens = [below(100), below(500), None];
    let values: Vec<String> = [
        r#"{"amount":5}"#,
        r#"{"amount":250.5}"#,
        r#"{"amount":900,"amount":50}"#,
        r#"{"amount":1e400}"#,
        r#"{"amount":"12"}"#,
        "not json",
        r#"{"amount":700}"#,
    ]
    .iter()
    .map(|v| (*v).to_owned())
    .collect();
    let remap = REMAPS[0];
    // The shared steps are one fused run, which judges the conditions.
    let mut probe = try_chain_labelled(&shared(remap), "").unwrap();
    assert_eq!(probe.len(), 1);
    let conditions = etl_json::Conditions::new([condition_form(whens[0].as_ref().unwrap(), true)]);
    assert!(conditions.judge_in(probe.last_mut().unwrap()));
    let mut fast = steps(remap, &whens, RouteMode::Exclusive, Some(2), true);
    let got = show(&mut fast, &values);
    assert!(
        got.starts_with(
            r#"to [[(0, "{\"amount\":5,\"amount_cents\":500}"), (2, "{\"amount\":50,\"amount_cents\":5000}")], [(1, "{\"amount\":250.5,\"amount_cents\":25050}")], [(4, "{\"amount\":\"12\",\"amount_cents\":1200}"), (6, "{\"amount\":700,\"amount_cents\":70000}")]]"#
        ),
        "{got}"
    );
    // Records 0, 1, 2 and 6 are routed by the verdicts handed on (the
    // string and the number past an `f64` are left to the stages).
    assert_eq!(fast.router.as_ref().unwrap().by_verdict(), 4);
    let mut alone = steps(remap, &whens, RouteMode::Exclusive, Some(2), false);
    assert_eq!(got, show(&mut alone, &values));
    assert_eq!(alone.router.as_ref().unwrap().by_verdict(), 0);
    let mut forked = fast.fork().unwrap();
    assert_eq!(got, show(&mut forked, &values));
    assert_eq!(forked.router.as_ref().unwrap().by_verdict(), 4);
}

#[test]
fn a_record_written_past_the_nesting_limit_is_dead_lettered_as_by_its_condition() {
    let whens = [Some(TransformConfig::Filter {
        field: "amount".to_owned(),
        op: etl_json::CompareOp::Lt,
        value: Some(toml::Value::Integer(100)),
        condition: None,
    })];
    // 127 levels read, 128 written: the condition's stage refuses it.
    let values = vec![deep("5", 126), deep("6", 125)];
    let mut fast = steps(".a.b = .d", &whens, RouteMode::All, None, true);
    let got = show(&mut fast, &values);
    let mut alone = steps(".a.b = .d", &whens, RouteMode::All, None, false);
    let want = show(&mut alone, &values);
    assert!(want.contains("rejected [(0, "), "{want}");
    assert_eq!(got, want);
    // The record within the limit is still routed by its verdict.
    assert_eq!(fast.router.as_ref().unwrap().by_verdict(), 1);
}

proptest! {
    #[test]
    fn prop_verdicts_handed_on_route_as_conditions_one_by_one(
        remap in prop::sample::select(REMAPS),
        whens in prop::collection::vec(when(), 1..5),
        batches in prop::collection::vec(prop::collection::vec(value(), 0..10), 1..3),
        exclusive in any::<bool>(),
        unmatched in prop::option::of(0usize..4),
    ) {
        let mode = if exclusive { RouteMode::Exclusive } else { RouteMode::All };
        let unmatched = unmatched.filter(|u| *u < whens.len());
        let mut fast = steps(remap, &whens, mode, unmatched, true);
        let mut forked = fast.fork().unwrap();
        let mut alone = steps(remap, &whens, mode, unmatched, false);
        for values in &batches {
            let want = show(&mut alone, values);
            prop_assert_eq!(show(&mut fast, values), want.clone());
            prop_assert_eq!(show(&mut forked, values), want);
        }
    }
}
