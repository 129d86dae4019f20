//! The router's conditions judged on one reading of each record against
//! the same conditions judged one by one, each by its own stage.

#![allow(clippy::unwrap_used)]

use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use proptest::prelude::*;

use super::route::{Route, Router};
use crate::config::{RouteMode, TransformConfig};
use crate::transform::{condition_form, try_chain_labelled};

/// A sink's condition: none, declarative or a program.
#[derive(Debug, Clone)]
enum When {
    Every,
    Field(&'static str, etl_json::CompareOp, i64),
    Program(&'static str),
}

impl When {
    fn config(&self) -> Option<TransformConfig> {
        let filter = |field: &str, op, value, condition: Option<&str>| TransformConfig::Filter {
            field: field.to_owned(),
            op,
            value,
            condition: condition.map(str::to_owned),
        };
        match self {
            When::Every => None,
            When::Field(field, op, value) => {
                Some(filter(field, *op, Some(toml::Value::Integer(*value)), None))
            }
            When::Program(source) => {
                Some(filter("", etl_json::CompareOp::Exists, None, Some(source)))
            }
        }
    }
}

fn when() -> impl Strategy<Value = When> {
    use etl_json::CompareOp as C;
    prop_oneof![
        1 => Just(When::Every),
        3 => (
            prop::sample::select(vec!["amount", "n.amount", "level"]),
            prop::sample::select(vec![C::Lt, C::Ge, C::Eq, C::Ne, C::Exists]),
            0i64..600,
        )
            .prop_map(|(f, op, v)| When::Field(f, op, v)),
        2 => prop::sample::select(vec![
            ".amount == 7",
            r#".level == "error""#,
            r#"!(.level == "info") && .n.amount != null"#,
            r#"contains(string(.level) ?? "", "err")"#,
        ])
        .prop_map(When::Program),
    ]
}

fn value() -> impl Strategy<Value = String> {
    let amount = prop_oneof![
        (0i64..600).prop_map(|a| a.to_string()),
        (0.0f64..600.0).prop_map(|a| format!("{a:.2}")),
        Just("1e400".to_owned()),
        Just(r#""12""#.to_owned()),
        Just("null".to_owned()),
    ];
    let level = prop::sample::select(vec![r#""error""#, r#""info""#, r#""\u0065rror""#, "1"]);
    prop_oneof![
        8 => (amount, level, any::<bool>()).prop_map(|(a, l, nested)| if nested {
            format!(r#"{{"level":{l},"n":{{"amount":{a}}},"amount":{a}}}"#)
        } else {
            format!(r#"{{ "amount" : {a}, "level":{l}}}"#)
        }),
        1 => prop::sample::select(vec!["not json", r#"{"amount":1"#, "[1]", r#"{"level":"\ud800"}"#])
            .prop_map(str::to_owned),
    ]
}

/// The router of these sinks' conditions, with their fast forms or
/// without (each judged by its stage alone).
fn router(
    whens: &[When],
    mode: RouteMode,
    unmatched: Option<usize>,
    fast: bool,
    after_json: bool,
) -> Router {
    let routes = whens
        .iter()
        .enumerate()
        .map(|(i, when)| match when.config() {
            Some(config) if Some(i) != unmatched => {
                let chain = try_chain_labelled(std::slice::from_ref(&config), "when ").unwrap();
                let form = fast.then(|| condition_form(&config, after_json)).flatten();
                Route::new().when_chain(chain).when_fast(form)
            }
            _ => Route::new(),
        })
        .collect();
    Router::new(mode, routes, unmatched)
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

/// What a router made of a batch, comparable.
fn show(router: &mut Router, values: &[String]) -> String {
    let routed = router.route(records(values));
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
    let rejected: Vec<(i64, &str)> = routed
        .rejected
        .iter()
        .map(|d| (d.record.position.offset.0, d.reason.as_str()))
        .collect();
    format!(
        "to {to:?}\nrejected {rejected:?}\nfiltered {} unrouted {} halted {:?}",
        routed.filtered,
        routed.unrouted,
        routed.halted.map(|d| d.reason)
    )
}

#[test]
fn exclusive_routes_by_amount_judge_each_record_on_one_reading() {
    use etl_json::CompareOp as C;
    let whens = [
        When::Field("amount", C::Lt, 100),
        When::Field("amount", C::Lt, 500),
        When::Every,
    ];
    let values: Vec<String> = [
        r#"{"amount":5}"#,
        r#"{"amount":250.5}"#,
        r#"{"amount":900}"#,
        r#"{"amount":1e400}"#,
        "not json",
    ]
    .iter()
    .map(|v| (*v).to_owned())
    .collect();
    let mut fast = router(&whens, RouteMode::Exclusive, Some(2), true, false);
    let got = show(&mut fast, &values);
    assert!(
        got.starts_with(
            r#"to [[(0, "{\"amount\":5}")], [(1, "{\"amount\":250.5}")], [(2, "{\"amount\":900}")]]"#
        ),
        "{got}"
    );
    assert!(got.contains(r#"rejected [(3, "#), "{got}");
    assert!(
        got.contains(r#"(4, "transform when json: invalid JSON"#),
        "{got}"
    );
    let mut alone = router(&whens, RouteMode::Exclusive, Some(2), false, false);
    assert_eq!(got, show(&mut alone, &values));
}

proptest! {
    #[test]
    fn prop_conditions_on_one_reading_route_as_conditions_one_by_one(
        whens in prop::collection::vec(when(), 1..5),
        values in prop::collection::vec(value(), 0..12),
        exclusive in any::<bool>(),
        unmatched in prop::option::of(0usize..4),
        after_json in any::<bool>(),
    ) {
        let mode = if exclusive { RouteMode::Exclusive } else { RouteMode::All };
        let unmatched = unmatched.filter(|u| *u < whens.len());
        let values: Vec<String> = values
            .into_iter()
            .filter(|v| {
                !after_json
                    || serde_json::from_str::<serde_json::Value>(v).is_ok_and(|v| v.is_object())
            })
            .collect();
        let mut fast = router(&whens, mode, unmatched, true, after_json);
        let mut alone = router(&whens, mode, unmatched, false, after_json);
        let mut forked = fast.fork().unwrap();
        let want = show(&mut alone, &values);
        prop_assert_eq!(show(&mut fast, &values), want.clone());
        prop_assert_eq!(show(&mut forked, &values), want);
    }
}
