//! The operations of the built-in JSON steps and what they share with the
//! fast paths: the comparison of a `filter` step ([`CompareOp`]), the
//! steps themselves ([`JsonOp`]), and reading, setting and removing a
//! field by its dotted path in a document tree.
//!
//! Everything here works on `serde_json` values; the engine's readers of
//! raw text (`json_fast`, `remap_fast`) decide with `decide` and
//! `index` exactly as the tree path does, so both paths agree.

use std::cmp::Ordering;

use serde::Deserialize;
use serde_json::{Map, Value};

/// A comparison in a `filter` step, spelled in a configuration as the
/// operator (`"=="`, `"<"`, `"exists"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum CompareOp {
    /// Equal.
    #[serde(rename = "==")]
    Eq,
    /// Not equal.
    #[serde(rename = "!=")]
    Ne,
    /// Less than.
    #[serde(rename = "<")]
    Lt,
    /// Less than or equal.
    #[serde(rename = "<=")]
    Le,
    /// Greater than.
    #[serde(rename = ">")]
    Gt,
    /// Greater than or equal.
    #[serde(rename = ">=")]
    Ge,
    /// The field is present (any value).
    #[serde(rename = "exists")]
    Exists,
}

/// One built-in JSON step. Field paths are dotted (`user.id`) and walk
/// nested objects; a segment of digits indexes an array (`items.0.qty`).
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

    pub(crate) fn mutates(&self) -> bool {
        !matches!(self, JsonOp::Filter { .. })
    }
}

/// The array index a path segment names: digits only (`items.0.qty`).
/// Such a segment also names the key `"0"` of an object. The same rule as
/// every other component's ([`etl_record::array_index`]).
pub(crate) fn index(segment: &str) -> Option<usize> {
    etl_record::array_index(segment)
}

pub(crate) fn child<'a>(value: &'a Value, segment: &str) -> Option<&'a Value> {
    match value {
        Value::Object(map) => map.get(segment),
        Value::Array(items) => items.get(index(segment)?),
        _ => None,
    }
}

fn child_mut<'a>(value: &'a mut Value, segment: &str) -> Option<&'a mut Value> {
    match value {
        Value::Object(map) => map.get_mut(segment),
        Value::Array(items) => items.get_mut(index(segment)?),
        _ => None,
    }
}

pub(crate) fn get<'a>(doc: &'a Map<String, Value>, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    rest.iter().try_fold(doc.get(first)?, |v, s| child(v, s))
}

/// Set the field at `path`, creating missing parent objects (and
/// replacing a scalar parent with an object). Through an array, a segment
/// must index an element that exists.
pub(crate) fn set(
    doc: &mut Map<String, Value>,
    path: &[String],
    value: Value,
) -> Result<(), String> {
    let Some((first, rest)) = path.split_first() else {
        return Ok(());
    };
    let Some((last, middle)) = rest.split_last() else {
        doc.insert(first.clone(), value);
        return Ok(());
    };
    let mut node = parent_slot(doc.entry(first.clone()).or_insert(Value::Null));
    for (i, segment) in middle.iter().enumerate() {
        node = match node {
            Value::Object(map) => parent_slot(map.entry(segment.clone()).or_insert(Value::Null)),
            Value::Array(items) => {
                let len = items.len();
                match index(segment).and_then(|i| items.get_mut(i)) {
                    Some(item) => parent_slot(item),
                    None => return Err(not_in_array(&path[..=i], segment, len)),
                }
            }
            // `parent_slot` leaves only objects and arrays.
            _ => return Ok(()),
        };
    }
    match node {
        Value::Object(map) => {
            map.insert(last.clone(), value);
        }
        Value::Array(items) => {
            let len = items.len();
            match index(last).and_then(|i| items.get_mut(i)) {
                Some(item) => *item = value,
                None => return Err(not_in_array(&path[..path.len() - 1], last, len)),
            }
        }
        _ => {}
    }
    Ok(())
}

/// A parent on the way to a field: objects and arrays are walked into,
/// anything else becomes an empty object.
fn parent_slot(slot: &mut Value) -> &mut Value {
    if !slot.is_object() && !slot.is_array() {
        *slot = Value::Object(Map::new());
    }
    slot
}

fn not_in_array(array: &[String], segment: &str, len: usize) -> String {
    format!(
        "cannot set {segment:?} in {}: it is an array of {len}, and a path through an array \
         names one of its elements by index (0 to {})",
        array.join("."),
        len.saturating_sub(1)
    )
}

pub(crate) fn remove(doc: &mut Map<String, Value>, path: &[String]) -> Option<Value> {
    let (last, parents) = path.split_last()?;
    let Some((first, middle)) = parents.split_first() else {
        return doc.remove(last);
    };
    let parent = middle
        .iter()
        .try_fold(doc.get_mut(first)?, |v, s| child_mut(v, s))?;
    match parent {
        Value::Object(map) => map.remove(last),
        Value::Array(items) => {
            let i = index(last).filter(|i| *i < items.len())?;
            Some(items.remove(i))
        }
        _ => None,
    }
}

pub(crate) fn compare(field: Option<&Value>, op: CompareOp, constant: &Value) -> bool {
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
    decide(op, ordering)
}

/// Whether a field ordered `ordering` against the constant (`None`: not
/// comparable) passes `op`.
pub(crate) fn decide(op: CompareOp, ordering: Option<Ordering>) -> bool {
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
