//! Checks of `[routing]` against the sinks' `when`: the unmatched sink
//! exists and has no condition of its own; warnings where a route can
//! never match.

use std::ops::Range;

use super::checker::Checker;
use super::schema::{RouteMode, RoutingConfig, SinkConfig, TransformConfig};

/// Check `routing` (at `span`; `0..0` when the file has no `[routing]`)
/// against `sinks`, each with its section and span.
pub(super) fn check(
    ck: &mut Checker<'_>,
    routing: &RoutingConfig,
    span: &Range<usize>,
    sinks: &[SinkConfig],
    spans: &[(String, Range<usize>)],
) {
    let unmatched = routing.unmatched.as_deref().and_then(|name| {
        let found = sinks.iter().position(|s| s.name == name);
        match found {
            None => ck.problem_at(
                span.clone(),
                "unmatched",
                "[routing]",
                format!("unmatched = {name:?} names no sink"),
            ),
            Some(i) if sinks[i].route.when.is_some() => ck.problem_at(
                spans[i].1.clone(),
                "when",
                &spans[i].0,
                format!(
                    "sink {name:?} is [routing]'s unmatched sink: it takes what no condition \
                     matched, so it cannot have a `when` of its own"
                ),
            ),
            Some(_) => {}
        }
        found
    });
    let conditional = sinks.iter().filter(|s| s.route.when.is_some()).count();
    if let Some(u) = unmatched
        && conditional == 0
    {
        ck.warning(
            span.clone(),
            "[routing]",
            format!(
                "no sink has a `when`: the unmatched sink {:?} takes every record",
                sinks[u].name
            ),
        );
    }
    if routing.mode != RouteMode::Exclusive {
        return;
    }
    // The first sink, in order, whose condition matches takes a record:
    // a sink after one without a condition, or after one with the same
    // condition, never matches.
    let mut seen: Vec<(&str, &TransformConfig)> = Vec::new();
    let mut takes_all: Option<&str> = None;
    for (i, sink) in sinks.iter().enumerate() {
        if Some(i) == unmatched {
            continue;
        }
        let (section, at) = &spans[i];
        if let Some(before) = takes_all {
            ck.warning(
                at.clone(),
                section,
                format!(
                    "with [routing] mode = \"exclusive\", sink {before:?} before this one takes \
                     every record (it has no `when`): sink {:?} never gets one",
                    sink.name
                ),
            );
            continue;
        }
        match &sink.route.when {
            None => takes_all = Some(&sink.name),
            Some(when) => {
                if let Some((before, _)) = seen.iter().find(|(_, w)| same_condition(w, when)) {
                    ck.warning(
                        at.clone(),
                        section,
                        format!(
                            "with [routing] mode = \"exclusive\", sink {before:?} before this \
                             one has the same `when`: sink {:?} never gets a record",
                            sink.name
                        ),
                    );
                }
                seen.push((&sink.name, when));
            }
        }
    }
}

/// Whether two conditions are written the same way.
fn same_condition(a: &TransformConfig, b: &TransformConfig) -> bool {
    match (a, b) {
        (
            TransformConfig::Filter {
                field: fa,
                op: oa,
                value: va,
                condition: ca,
            },
            TransformConfig::Filter {
                field: fb,
                op: ob,
                value: vb,
                condition: cb,
            },
        ) => match (ca, cb) {
            (Some(ca), Some(cb)) => ca.trim() == cb.trim(),
            (None, None) => fa == fb && oa == ob && va == vb,
            _ => false,
        },
        _ => false,
    }
}
