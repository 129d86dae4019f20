//! The transform engine's inner readers, reachable by the fuzz targets in
//! `fuzz/` (feature `fuzzing`; not a stable interface): the checking pass,
//! the scanner it is held to, and the JSON stage without its fast path.

use crate::{JsonOp, JsonStage, check, scan};

/// An object's entries: each key (unescaped) and its value's text.
pub type Entries = Vec<(String, String)>;

/// The entries, each key decoded. A key that does not decode (which the
/// readers refuse before they give it) is given as it is held, quotes
/// and escapes included: no reading of serde_json's gives that key, so
/// a target holding a reader to serde_json sees the difference.
fn owned(entries: &[scan::Entry<'_>]) -> Entries {
    entries
        .iter()
        .map(|(k, v)| {
            let key = k
                .decoded()
                .map_or_else(|| k.held().to_owned(), |k| k.into_owned());
            (key, (*v).to_owned())
        })
        .collect()
}

/// The top-level entries the checking pass reads, when it takes `text`
/// (it then claims the whole text is a JSON object serde_json reads).
#[must_use]
pub fn checked_entries(text: &str) -> Option<Entries> {
    check::entries_in(text, Vec::new()).map(|e| owned(&e))
}

/// A nested object the checking pass kept: where it starts and ends in
/// the text, and its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptObject {
    /// Its first byte (the brace).
    pub at: usize,
    /// Just past its closing brace.
    pub end: usize,
    /// Its entries as the checking pass read them.
    pub entries: Entries,
}

/// The checking pass's reading of `text` keeping nested objects: the
/// top-level entries and the objects kept.
#[must_use]
pub fn checked_objects(text: &str) -> Option<(Entries, Vec<KeptObject>)> {
    let (mut objects, mut entries) = (Vec::new(), Vec::new());
    let nested = check::Nested {
        max_depth: usize::MAX,
        objects: &mut objects,
        entries: &mut entries,
    };
    let top = check::entries_keeping(text, Vec::new(), nested)?;
    let kept = objects
        .iter()
        .map(|o| KeptObject {
            at: o.at,
            end: o.end,
            entries: entries
                .get(o.slot)
                .and_then(|e| e.get(o.entries.clone()))
                .map(owned)
                .unwrap_or_default(),
        })
        .collect();
    Some((owned(&top), kept))
}

/// The entries of the object `text` as the scanner (which trusts the
/// text is valid JSON) reads them.
#[must_use]
pub fn scanned_entries(text: &str) -> Option<Entries> {
    scan::entries(text).map(|e| owned(&e))
}

/// A JSON stage that always takes its general path: what its fast path
/// is held to.
#[must_use]
pub fn json_stage_without_fast_path(name: &str, ops: Vec<JsonOp>) -> JsonStage {
    let mut stage = JsonStage::new(name, ops);
    stage.fast = None;
    stage
}
