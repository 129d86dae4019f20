//! The built-in JSON transforms, fused: a run of consecutive JSON steps
//! parses each record once and serializes it once (only if it changed).

use std::cmp::Ordering;

use etl_record::Record;
use serde_json::{Map, Value};

use super::json_fast::{Fast, FastStage};
use super::{Outcome, Transform};
use crate::config::CompareOp;

/// One built-in JSON step. Field paths are dotted (`user.id`) and walk
/// nested objects.
#[derive(Clone, Debug, PartialEq)]
pub enum JsonOp {
    /// Keep records whose field compares true against the constant. A
    /// missing field, or one of another type, compares false (so `!=`
    /// keeps it).
    Filter {
        /// Field path.
        path: Vec<String>,
        /// The comparison.
        op: CompareOp,
        /// The constant.
        value: Value,
    },
    /// Set a field, creating parent objects as needed.
    Add {
        /// Field path.
        path: Vec<String>,
        /// The value.
        value: Value,
    },
    /// Move a field; absent fields are left alone.
    Rename {
        /// Where it is.
        from: Vec<String>,
        /// Where it goes.
        to: Vec<String>,
    },
    /// Remove a field; absent fields are left alone.
    Drop {
        /// Field path.
        path: Vec<String>,
    },
}

impl JsonOp {
    /// Split a dotted path.
    #[must_use]
    pub fn path(dotted: &str) -> Vec<String> {
        dotted.split('.').map(str::to_owned).collect()
    }

    fn mutates(&self) -> bool {
        !matches!(self, JsonOp::Filter { .. })
    }
}

/// A fused run of JSON steps. Records whose value is not a JSON object are
/// rejected to the dead-letter path with the parser's message.
#[derive(Debug)]
pub struct JsonStage {
    name: String,
    ops: Vec<JsonOp>,
    mutates: bool,
    /// Steps on top-level fields run without a document tree.
    pub(super) fast: Option<FastStage>,
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

impl Transform for JsonStage {
    fn name(&self) -> &str {
        &self.name
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(JsonStage::new(
            self.name.clone(),
            self.ops.clone(),
        )))
    }

    fn apply(&mut self, mut record: Record) -> Outcome {
        if let Some(fast) = &mut self.fast {
            match fast.apply(&record.value) {
                Fast::Keep(None) => return Outcome::Keep(record),
                Fast::Keep(Some(value)) => {
                    record.value = value;
                    return Outcome::Keep(record);
                }
                Fast::Filtered => return Outcome::Filtered,
                // The tree path below says what is wrong with it.
                Fast::Fallback => {}
            }
        }
        self.apply_tree(record)
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
        for op in &self.ops {
            match op {
                JsonOp::Filter { path, op, value } => {
                    if !compare(get(&doc, path), *op, value) {
                        return Outcome::Filtered;
                    }
                }
                JsonOp::Add { path, value } => set(&mut doc, path, value.clone()),
                JsonOp::Rename { from, to } => {
                    if let Some(v) = remove(&mut doc, from) {
                        set(&mut doc, to, v);
                    }
                }
                JsonOp::Drop { path } => {
                    remove(&mut doc, path);
                }
            }
        }
        if self.mutates {
            match serde_json::to_vec(&doc) {
                Ok(bytes) => record.value = bytes.into(),
                Err(e) => return Outcome::Reject(record, format!("cannot serialize: {e}")),
            }
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

fn get<'a>(doc: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (last, parents) = path.split_last()?;
    let mut map = doc;
    for p in parents {
        map = map.get(p)?.as_object()?;
    }
    map.get(last)
}

fn set(doc: &mut Map<String, Value>, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut map = doc;
    for p in parents {
        let entry = map
            .entry(p.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !entry.is_object() {
            *entry = Value::Object(Map::new());
        }
        let Value::Object(next) = entry else { return };
        map = next;
    }
    map.insert(last.clone(), value);
}

fn remove(doc: &mut Map<String, Value>, path: &[String]) -> Option<Value> {
    let (last, parents) = path.split_last()?;
    let mut map = doc;
    for p in parents {
        map = map.get_mut(p)?.as_object_mut()?;
    }
    map.remove(last)
}

pub(super) fn compare(field: Option<&Value>, op: CompareOp, constant: &Value) -> bool {
    if op == CompareOp::Exists {
        return field.is_some();
    }
    let ordering = field.and_then(|f| match (f, constant) {
        (Value::Number(a), Value::Number(b)) => match (a.as_i64(), b.as_i64()) {
            (Some(a), Some(b)) => Some(a.cmp(&b)),
            _ => a.as_f64()?.partial_cmp(&b.as_f64()?),
        },
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        _ => None,
    });
    match (op, ordering) {
        (CompareOp::Ne, None) => true,
        (_, None) => false,
        (CompareOp::Eq, Some(o)) => o == Ordering::Equal,
        (CompareOp::Ne, Some(o)) => o != Ordering::Equal,
        (CompareOp::Lt, Some(o)) => o == Ordering::Less,
        (CompareOp::Le, Some(o)) => o != Ordering::Greater,
        (CompareOp::Gt, Some(o)) => o == Ordering::Greater,
        (CompareOp::Ge, Some(o)) => o != Ordering::Less,
        (CompareOp::Exists, Some(_)) => true,
    }
}

#[cfg(test)]
mod tests {
    use etl_record::Position;

    use super::*;
    use crate::transform::{ChainOutput, TransformChain};

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
