//! Record headers: an ordered list of key/value pairs, held by the record
//! or parsed from the source's input when first read.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

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

/// Where a source keeps headers it parses only when something reads them
/// (see [`Headers::deferred`]): a Kafka source's batch of fetched
/// messages, whose header sections are parsed on request.
///
/// Most records are never asked for their headers (a pipeline that only
/// moves values), and parsing them for every record cost a source an
/// allocation per record even when there were none.
pub trait HeaderSource: Send + Sync + fmt::Debug {
    /// The headers of item `index`, in order: parsed on the first call,
    /// the same list on every later one (from any thread). An index the
    /// source does not know has none.
    fn headers(&self, index: usize) -> &[Header];

    /// Bytes of the names and values of item `index`'s headers, for
    /// in-flight accounting, without parsing them if they are not parsed
    /// yet: a source that cannot tell without parsing says 0 until then
    /// (the bytes are still held by the input the record points into).
    fn byte_len(&self, index: usize) -> usize;
}

/// The headers of a record, in order. An empty list does not allocate,
/// and neither do headers left in a [`HeaderSource`] until read.
#[derive(Clone, Default)]
pub struct Headers(Repr);

#[derive(Clone)]
enum Repr {
    Owned(Vec<Header>),
    /// Item `index` of `source`, parsed when first read.
    Deferred {
        source: Arc<dyn HeaderSource>,
        index: usize,
    },
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Owned(Vec::new())
    }
}

impl Headers {
    /// No headers.
    #[must_use]
    pub const fn new() -> Self {
        Headers(Repr::Owned(Vec::new()))
    }

    /// The headers of item `index` of `source`, parsed only when something
    /// reads them.
    #[must_use]
    pub fn deferred(source: Arc<dyn HeaderSource>, index: usize) -> Self {
        Headers(Repr::Deferred { source, index })
    }

    /// The headers as a list, parsing deferred ones.
    fn as_slice(&self) -> &[Header] {
        match &self.0 {
            Repr::Owned(list) => list,
            Repr::Deferred { source, index } => source.headers(*index),
        }
    }

    /// The list, to change: deferred headers are parsed and copied out
    /// first (their values still point into the source's input).
    fn to_mut(&mut self) -> &mut Vec<Header> {
        if let Repr::Deferred { source, index } = &self.0 {
            self.0 = Repr::Owned(source.headers(*index).to_vec());
        }
        match &mut self.0 {
            Repr::Owned(list) => list,
            Repr::Deferred { .. } => unreachable!("made owned above"),
        }
    }

    /// Append a header.
    pub fn push(&mut self, key: impl Into<String>, value: Option<Bytes>) {
        self.to_mut().push(Header {
            key: key.into(),
            value,
        });
    }

    /// The value of the last header named `key` (later headers win, as in
    /// Kafka clients), or `None` when absent or valueless.
    #[must_use]
    pub fn get(&self, key: &str) -> Option<&Bytes> {
        self.as_slice()
            .iter()
            .rev()
            .find(|h| h.key == key)
            .and_then(|h| h.value.as_ref())
    }

    /// Iterate over the headers in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Header> {
        self.as_slice().iter()
    }

    /// Number of headers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are no headers.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Bytes taken by header names and values, for in-flight accounting.
    /// Deferred headers are not parsed for it: their source says what it
    /// knows ([`HeaderSource::byte_len`]).
    #[must_use]
    pub fn byte_len(&self) -> usize {
        match &self.0 {
            Repr::Owned(list) => list
                .iter()
                .map(|h| h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                .sum(),
            Repr::Deferred { source, index } => source.byte_len(*index),
        }
    }
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl PartialEq for Headers {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Headers {}

impl Hash for Headers {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = &'a Header;
    type IntoIter = std::slice::Iter<'a, Header>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl FromIterator<Header> for Headers {
    fn from_iter<I: IntoIterator<Item = Header>>(iter: I) -> Self {
        Headers(Repr::Owned(iter.into_iter().collect()))
    }
}

#[cfg(feature = "serde")]
impl serde::Serialize for Headers {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.as_slice().serialize(s)
    }
}

#[cfg(feature = "serde")]
impl<'de> serde::Deserialize<'de> for Headers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Headers(Repr::Owned(Vec::deserialize(d)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicUsize, Ordering};

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

    /// One item with one header, counting its parses.
    #[derive(Debug, Default)]
    struct Parsed {
        parses: AtomicUsize,
        list: OnceLock<Vec<Header>>,
    }

    impl HeaderSource for Parsed {
        fn headers(&self, index: usize) -> &[Header] {
            if index != 0 {
                return &[];
            }
            self.list.get_or_init(|| {
                self.parses.fetch_add(1, Ordering::SeqCst);
                vec![Header {
                    key: "k".to_owned(),
                    value: Some(Bytes::from_static(b"v")),
                }]
            })
        }

        fn byte_len(&self, index: usize) -> usize {
            if index == 0 {
                self.list.get().map_or(0, |_| 2)
            } else {
                0
            }
        }
    }

    #[test]
    fn deferred_headers_are_parsed_once_when_read_and_copied_when_changed() {
        let source = Arc::new(Parsed::default());
        let mut h = Headers::deferred(Arc::clone(&source) as Arc<dyn HeaderSource>, 0);
        let copy = h.clone();
        assert_eq!(h.byte_len(), 0, "not parsed for accounting");
        assert_eq!(source.parses.load(Ordering::SeqCst), 0);
        assert_eq!(h.get("k").map(|v| &v[..]), Some(&b"v"[..]));
        assert_eq!(copy.len(), 1);
        assert_eq!(source.parses.load(Ordering::SeqCst), 1);
        h.push("k", None);
        assert_eq!(h.len(), 2);
        assert_eq!(copy.len(), 1, "the clone keeps the source's list");
        assert_eq!(h.get("k"), None);
        let none = Headers::deferred(source as Arc<dyn HeaderSource>, 1);
        assert!(none.is_empty());
        assert_eq!(none, Headers::new());
    }
}
