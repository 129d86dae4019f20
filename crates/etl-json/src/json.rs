//! The built-in JSON transforms, fused: a run of consecutive JSON steps
//! parses each record once and serializes it once (only if it changed),
//! writing what the steps did not change from the original text (see
//! [`faithful`](crate::faithful)).

use etl_record::Record;
use etl_transform::{Outcome, Transform};
use serde_json::{Map, Value};

use crate::faithful;
use crate::json_fast::{Fast, FastStage};
use crate::ops::{JsonOp, compare, get, remove, set};

/// A fused run of JSON steps. Records whose value is not a JSON object are
/// rejected to the dead-letter path with the parser's message.
#[derive(Debug)]
pub struct JsonStage {
    name: String,
    ops: Vec<JsonOp>,
    mutates: bool,
    /// Steps on top-level fields run without a document tree.
    pub(crate) fast: Option<FastStage>,
}

impl JsonStage {
    /// A stage running `ops` in order.
    #[must_use]
    pub fn new(name: impl Into<String>, ops: Vec<JsonOp>) -> Self {
        let mutates = ops.iter().any(JsonOp::mutates);
        JsonStage {
            name: name.into(),
            fast: FastStage::new(&ops),
            ops,
            mutates,
        }
    }
}

impl JsonStage {
    /// A copy for another worker, with its own buffers.
    pub(crate) fn forked(&self) -> Self {
        JsonStage::new(self.name.clone(), self.ops.clone())
    }

    /// The stage's steps as filters for a run of stages read once
    /// (see [`Fuser`](crate::Fuser)), when it has only
    /// filters and they take the fast path.
    #[cfg(feature = "remap")]
    pub(crate) fn filters(&self) -> Option<Vec<crate::remap_fast::JsonFilter>> {
        self.fast.as_ref()?;
        self.ops
            .iter()
            .map(|op| match op {
                JsonOp::Filter { path, op, value } => Some(crate::remap_fast::JsonFilter {
                    path: path.clone(),
                    op: *op,
                    value: value.clone(),
                    constant: crate::number::Constant::of(value),
                }),
                _ => None,
            })
            .collect()
    }
}

impl Transform for JsonStage {
    fn name(&self) -> &str {
        &self.name
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(self.forked()))
    }

    fn apply(&mut self, mut record: Record) -> Outcome {
        match self.apply_in_place(&mut record) {
            None => Outcome::Keep(record),
            Some(outcome) => outcome,
        }
    }

    /// The fast path decides most records where they lie; only a record
    /// it leaves to the tree path is taken out.
    fn apply_in_place(&mut self, record: &mut Record) -> Option<Outcome> {
        if let Some(fast) = &mut self.fast {
            match fast.apply(&record.value) {
                Fast::Keep(None) => return None,
                Fast::Keep(Some(value)) => {
                    record.value = value;
                    return None;
                }
                Fast::Filtered => return Some(Outcome::Filtered),
                // The tree path below says what is wrong with it.
                Fast::Fallback => {}
            }
        }
        match self.apply_tree(std::mem::take(record)) {
            Outcome::Keep(kept) => {
                *record = kept;
                None
            }
            other => Some(other),
        }
    }
}

impl JsonStage {
    /// The general path: parse into a document tree, run the steps,
    /// serialize.
    fn apply_tree(&mut self, mut record: Record) -> Outcome {
        let mut doc: Map<String, Value> = match serde_json::from_slice(&record.value) {
            Ok(Value::Object(map)) => map,
            Ok(other) => {
                let kind = kind_of(&other);
                return Outcome::Reject(record, format!("expected a JSON object, found {kind}"));
            }
            Err(e) => return Outcome::Reject(record, format!("invalid JSON: {e}")),
        };
        // What was read, to write unchanged values from the original text.
        let old = self.mutates.then(|| doc.clone());
        for op in &self.ops {
            match op {
                JsonOp::Filter { path, op, value } => {
                    if !compare(get(&doc, path), *op, value) {
                        return Outcome::Filtered;
                    }
                }
                JsonOp::Add { path, value } => {
                    if let Err(reason) = set(&mut doc, path, value.clone()) {
                        return Outcome::Reject(record, format!("add_field: {reason}"));
                    }
                }
                JsonOp::Rename { from, to } => {
                    if let Some(v) = remove(&mut doc, from)
                        && let Err(reason) = set(&mut doc, to, v)
                    {
                        return Outcome::Reject(record, format!("rename_field: {reason}"));
                    }
                }
                JsonOp::Drop { path } => {
                    remove(&mut doc, path);
                }
            }
        }
        let Some(old) = old else {
            return Outcome::Keep(record);
        };
        let (old, new) = (Value::Object(old), Value::Object(doc));
        if old == new {
            return Outcome::Keep(record);
        }
        // Parsed above, so the text is UTF-8.
        let text = std::str::from_utf8(&record.value).unwrap_or_default();
        let mut out = Vec::with_capacity(text.len() + 32);
        match faithful::write(text, &old, &new, &mut out) {
            Ok(()) => record.value = out.into(),
            Err(e) => return Outcome::Reject(record, format!("cannot serialize: {e}")),
        }
        Outcome::Keep(record)
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use etl_record::Position;

    use etl_transform::{ChainOutput, TransformChain};

    use super::*;
    use crate::ops::CompareOp;

    fn rec(json: &str) -> Record {
        Record::new(Position::default(), json.as_bytes().to_vec())
    }

    fn run(ops: Vec<JsonOp>, inputs: &[&str]) -> ChainOutput {
        let mut chain = TransformChain::new();
        chain.push(Box::new(JsonStage::new("json", ops)));
        let mut out = ChainOutput::default();
        chain.apply(inputs.iter().map(|j| rec(j)).collect(), &mut out);
        out
    }

    #[test]
    fn filter_add_rename_drop_in_one_pass() {
        let out = run(
            vec![
                JsonOp::Filter {
                    path: JsonOp::path("amount"),
                    op: CompareOp::Ge,
                    value: Value::from(10),
                },
                JsonOp::Add {
                    path: JsonOp::path("meta.seen"),
                    value: Value::Bool(true),
                },
                JsonOp::Rename {
                    from: JsonOp::path("user"),
                    to: JsonOp::path("customer"),
                },
                JsonOp::Drop {
                    path: JsonOp::path("tags"),
                },
            ],
            &[
                r#"{"amount":12.5,"user":"u1","tags":[1]}"#,
                r#"{"amount":3,"user":"u2"}"#,
                r#"{"user":"u3"}"#,
                r#"not json"#,
                r#"[1,2]"#,
            ],
        );
        assert_eq!(out.kept.len(), 1);
        let v: Value = serde_json::from_slice(&out.kept[0].value).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"amount":12.5,"customer":"u1","meta":{"seen":true}})
        );
        assert_eq!(out.filtered, 2, "amount 3 and a missing amount");
        assert_eq!(out.rejected.len(), 2);
        assert!(out.rejected[0].reason.contains("invalid JSON"));
        assert_eq!(
            &out.rejected[0].record.value[..],
            b"not json",
            "original kept"
        );
        assert!(out.rejected[1].reason.contains("found an array"));
    }

    #[test]
    fn comparisons_follow_types() {
        let n = Value::from(5);
        assert!(compare(Some(&Value::from(5.0)), CompareOp::Eq, &n));
        assert!(compare(Some(&Value::from(6)), CompareOp::Gt, &n));
        assert!(!compare(Some(&Value::from("5")), CompareOp::Eq, &n));
        assert!(compare(Some(&Value::from("5")), CompareOp::Ne, &n));
        assert!(compare(None, CompareOp::Ne, &n));
        assert!(!compare(None, CompareOp::Exists, &n));
        assert!(compare(
            Some(&Value::from("b")),
            CompareOp::Gt,
            &Value::from("a")
        ));
    }

    #[test]
    fn array_indexes_work_in_every_step() {
        let out = run(
            vec![
                JsonOp::Filter {
                    path: JsonOp::path("order.items.0.qty"),
                    op: CompareOp::Ge,
                    value: Value::from(2),
                },
                JsonOp::Add {
                    path: JsonOp::path("order.items.1.seen"),
                    value: Value::Bool(true),
                },
                JsonOp::Rename {
                    from: JsonOp::path("order.items.0.sku"),
                    to: JsonOp::path("first_sku"),
                },
                JsonOp::Drop {
                    path: JsonOp::path("order.items.2"),
                },
            ],
            &[
                r#"{"order":{"items":[{"sku":"a","qty":2},{"sku":"b"},{"sku":"c"}]}}"#,
                r#"{"order":{"items":[{"sku":"a","qty":1}]}}"#,
                r#"{"order":{"items":[]}}"#,
                r#"{"order":{"items":{"0":{"qty":5,"sku":"k"},"1":{}}}}"#,
            ],
        );
        assert_eq!(out.filtered, 2, "qty 1, and no item 0");
        let kept: Vec<Value> = out
            .kept
            .iter()
            .map(|r| serde_json::from_slice(&r.value).unwrap())
            .collect();
        assert_eq!(
            kept,
            vec![
                serde_json::json!({"first_sku":"a","order":{"items":[{"qty":2},{"sku":"b","seen":true}]}}),
                serde_json::json!({"first_sku":"k","order":{"items":{"0":{"qty":5},"1":{"seen":true}}}}),
            ],
            "on an object, a segment of digits is a key"
        );
    }

    #[test]
    fn writing_through_an_array_needs_an_index_that_exists() {
        let out = run(
            vec![JsonOp::Add {
                path: JsonOp::path("items.sku"),
                value: Value::from("x"),
            }],
            &[r#"{"items":[1,2,3]}"#],
        );
        assert_eq!(out.rejected.len(), 1);
        assert!(
            out.rejected[0].reason.contains("it is an array of 3"),
            "{}",
            out.rejected[0].reason
        );
        assert_eq!(&out.rejected[0].record.value[..], br#"{"items":[1,2,3]}"#);
        let out = run(
            vec![JsonOp::Add {
                path: JsonOp::path("items.5"),
                value: Value::from("x"),
            }],
            &[r#"{"items":[1]}"#],
        );
        assert_eq!(out.rejected.len(), 1, "index past the end");
    }

    #[test]
    fn rewritten_records_keep_key_order_and_the_text_of_untouched_values() {
        let input = r#"{"z":123456789012345678901234567890,"m":-0,"a":1.5e3,"gone":1,"o":{"y":"caf\u00e9","x":[1, 2]}}"#;
        // Top-level steps (the fast path) and a nested one (the tree).
        let top = run(
            vec![
                JsonOp::Add {
                    path: JsonOp::path("tag"),
                    value: Value::from("t"),
                },
                JsonOp::Drop {
                    path: JsonOp::path("gone"),
                },
            ],
            &[input],
        );
        assert_eq!(
            String::from_utf8_lossy(&top.kept[0].value),
            r#"{"z":123456789012345678901234567890,"m":-0,"a":1.5e3,"o":{"y":"caf\u00e9","x":[1, 2]},"tag":"t"}"#
        );
        let nested = run(
            vec![JsonOp::Drop {
                path: JsonOp::path("o.x"),
            }],
            &[input],
        );
        assert_eq!(
            String::from_utf8_lossy(&nested.kept[0].value),
            r#"{"z":123456789012345678901234567890,"m":-0,"a":1.5e3,"gone":1,"o":{"y":"caf\u00e9"}}"#
        );
    }

    #[test]
    fn a_filter_only_stage_leaves_bytes_untouched() {
        let out = run(
            vec![JsonOp::Filter {
                path: JsonOp::path("a"),
                op: CompareOp::Exists,
                value: Value::Null,
            }],
            &[r#"{ "a" : 1 }"#],
        );
        assert_eq!(&out.kept[0].value[..], br#"{ "a" : 1 }"#);
    }
}
