//! Record headers: an ordered list of key/value pairs.

use bytes::Bytes;

/// One header of a record. Keys need not be unique (Kafka allows repeats).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Header {
    /// Header name.
    pub key: String,
    /// Header value, if any.
    pub value: Option<Bytes>,
}

/// The headers of a record, in order. An empty list does not allocate.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Headers(Vec<Header>);

impl Headers {
    /// No headers.
    #[must_use]
    pub const fn new() -> Self {
        Headers(Vec::new())
    }

    /// Append a header.
    pub fn push(&mut self, key: impl Into<String>, value: Option<Bytes>) {
        self.0.push(Header {
            key: key.into(),
            value,
        });
    }

    /// The value of the last header named `key` (later headers win, as in
    /// Kafka clients), or `None` when absent or valueless.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Bytes> {
        self.0
            .iter()
            .rev()
            .find(|h| h.key == key)
            .and_then(|h| h.value.as_ref())
    }

    /// Iterate over the headers in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Header> {
        self.0.iter()
    }

    /// Number of headers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no headers.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Bytes taken by header names and values, for in-flight accounting.
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.0
            .iter()
            .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
            .sum()
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = &'a Header;
    type IntoIter = std::slice::Iter<'a, Header>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl FromIterator<Header> for Headers {
    fn from_iter<I: IntoIterator<Item = Header>>(iter: I) -> Self {
        Headers(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_header_wins_and_sizes_add_up() {
        let mut h = Headers::new();
        assert!(h.is_empty());
        h.push("a", Some(Bytes::from_static(b"1")));
        h.push("a", Some(Bytes::from_static(b"22")));
        h.push("b", None);
        assert_eq!(h.get("a").map(|v| &v[..]), Some(&b"22"[..]));
        assert_eq!(h.get("b"), None);
        assert_eq!(h.len(), 3);
        assert_eq!(h.byte_len(), 1 + 1 + 1 + 2 + 1);
    }
}
