//! Paths to a field of a record's JSON value, read the same way by every
//! component that takes one: the JSON steps, the Kafka sink's
//! `key_field` and `topic_field`, the PostgreSQL sink's columns, the
//! object-store key and the file sink's path templates.

use std::fmt;

/// A dotted path to a field of a JSON value: names separated by dots
/// (`user.id`); a name of ASCII digits only (`items.0.qty`) also indexes
/// an array. `+1`, `01`... are names like any other: `01` is element 1 of
/// an array, `+1` is no index.
///
/// ```
/// use etl_record::FieldPath;
///
/// let path: FieldPath = "items.0.sku".parse().unwrap();
/// assert_eq!(path.segments(), ["items", "0", "sku"]);
/// assert!("items..sku".parse::<FieldPath>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldPath {
    segments: Vec<String>,
}

/// Why a text is not a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a field path: {reason} (names separated by dots; an array index is a name \
     of digits: items.0.qty)"
)]
pub struct FieldPathError {
    text: String,
    reason: &'static str,
}

impl FieldPath {
    /// The path `dotted` stands for.
    ///
    /// # Errors
    ///
    /// An empty path or name, or a name with `[` or `]` (`items[0]` would
    /// match nothing).
    pub fn parse(dotted: &str) -> Result<FieldPath, FieldPathError> {
        let error = |reason| FieldPathError {
            text: dotted.to_owned(),
            reason,
        };
        if dotted.is_empty() {
            return Err(error("it is empty"));
        }
        let segments: Vec<String> = dotted.split('.').map(str::to_owned).collect();
        if segments.iter().any(String::is_empty) {
            return Err(error("a name between dots is empty"));
        }
        if segments.iter().any(|s| s.contains(['[', ']'])) {
            return Err(error("brackets do not index"));
        }
        Ok(FieldPath { segments })
    }

    /// The names, in order.
    #[must_use]
    pub fn segments(&self) -> &[String] {
        &self.segments
    }

    /// The value at this path of `value`, if there is one.
    #[cfg(feature = "json")]
    #[must_use]
    pub fn get<'a>(&self, value: &'a serde_json::Value) -> Option<&'a serde_json::Value> {
        json_field(value, &self.segments)
    }
}

impl std::str::FromStr for FieldPath {
    type Err = FieldPathError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FieldPath::parse(s)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.segments.join("."))
    }
}

/// The array index a path's name stands for: ASCII digits only.
#[must_use]
pub fn array_index(segment: &str) -> Option<usize> {
    if segment.is_empty() || !segment.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    segment.parse().ok()
}

/// The value at the path whose names are `path` of `value`: a name picks
/// an object's key, or (digits only, [`array_index`]) an array's element.
///
/// ```
/// # #[cfg(feature = "json")] {
/// let doc = serde_json::json!({"items": [{"sku": "a"}, {"sku": "b"}]});
/// let sku = etl_record::json_field(&doc, "items.1.sku".split('.'));
/// assert_eq!(sku, Some(&serde_json::json!("b")));
/// assert_eq!(etl_record::json_field(&doc, "items.+1.sku".split('.')), None);
/// # }
/// ```
#[cfg(feature = "json")]
pub fn json_field<S: AsRef<str>>(
    value: &serde_json::Value,
    path: impl IntoIterator<Item = S>,
) -> Option<&serde_json::Value> {
    path.into_iter().try_fold(value, |at, segment| {
        let segment = segment.as_ref();
        match at {
            serde_json::Value::Object(map) => map.get(segment),
            serde_json::Value::Array(items) => items.get(array_index(segment)?),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_digits_index_an_array() {
        for (segment, index) in [
            ("0", Some(0)),
            ("01", Some(1)),
            ("+1", None),
            ("-1", None),
            ("", None),
            ("1a", None),
        ] {
            assert_eq!(array_index(segment), index, "{segment}");
        }
    }

    #[test]
    fn bad_paths_are_refused() {
        for bad in ["", ".", "a.", ".a", "a..b", "items[0]"] {
            assert!(FieldPath::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(FieldPath::parse("a.0.b").unwrap().to_string(), "a.0.b");
    }

    #[cfg(feature = "json")]
    #[test]
    fn a_path_reads_objects_and_arrays_alike_everywhere() {
        let doc = serde_json::json!({"a": {"0": "key", "list": [10, 20]}});
        let at = |p: &str| FieldPath::parse(p).unwrap().get(&doc).cloned();
        assert_eq!(at("a.0"), Some(serde_json::json!("key")));
        assert_eq!(at("a.list.1"), Some(serde_json::json!(20)));
        assert_eq!(at("a.list.+1"), None);
        assert_eq!(at("a.missing"), None);
    }
}
