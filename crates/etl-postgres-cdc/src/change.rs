//! Changes as records: one JSON object per inserted, updated, deleted or
//! truncated row, and per row of the initial snapshot (the format is in `docs/postgres-cdc.md`).

use std::collections::HashMap;

use bytes::Bytes;
use etl_record::{Offset, PartitionId, Position, Record, SourceId, Timestamp};

use crate::Lsn;
use crate::pgoutput::{OldTuple, Relation, Tuple, Value};
use crate::value::{push_str, push_value};

/// The transaction a change belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxnInfo {
    pub(crate) commit_lsn: Lsn,
    pub(crate) commit_time_micros: i64,
    /// The transaction's id; none for the rows of the initial snapshot.
    pub(crate) xid: Option<u32>,
}

/// What happened to a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// A row of the initial snapshot.
    Read,
    Insert,
    Update,
    Delete,
    Truncate,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Truncate => "truncate",
        }
    }
}

/// The relations the stream described so far, by id: a relation message
/// replaces the shape from the change it comes with.
#[derive(Debug, Default)]
pub(crate) struct Relations {
    by_id: HashMap<u32, Relation>,
}

impl Relations {
    pub(crate) fn put(&mut self, relation: Relation) {
        self.by_id.insert(relation.id, relation);
    }

    pub(crate) fn get(&self, id: u32) -> Option<&Relation> {
        self.by_id.get(&id)
    }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` for microseconds since the Unix epoch.
pub(crate) fn iso_utc(micros: i64) -> String {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{frac:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// One change, ready to become a record.
pub(crate) struct Change<'a> {
    pub(crate) op: Op,
    pub(crate) relation: &'a Relation,
    pub(crate) old: Option<&'a OldTuple>,
    pub(crate) new: Option<&'a Tuple>,
}

fn check_width(relation: &Relation, tuple: &Tuple) -> Result<(), String> {
    if tuple.len() == relation.columns.len() {
        Ok(())
    } else {
        Err(format!(
            "a row of {} values for {}.{}, which has {} columns",
            tuple.len(),
            relation.schema,
            relation.name,
            relation.columns.len()
        ))
    }
}

/// `{"col":value,...}` of `tuple`'s columns that `keep` selects; names of
/// unchanged TOAST columns go to `unchanged`.
fn push_row(
    out: &mut Vec<u8>,
    relation: &Relation,
    tuple: &Tuple,
    keep: impl Fn(usize) -> bool,
    mut unchanged: Option<&mut Vec<usize>>,
) {
    out.push(b'{');
    let mut first = true;
    for (i, (column, value)) in relation.columns.iter().zip(tuple).enumerate() {
        if !keep(i) {
            continue;
        }
        if *value == Value::UnchangedToast {
            if let Some(unchanged) = unchanged.as_deref_mut() {
                unchanged.push(i);
            }
            continue;
        }
        if !first {
            out.push(b',');
        }
        first = false;
        push_str(out, &column.name);
        out.push(b':');
        push_value(out, column.type_oid, value);
    }
    out.push(b'}');
}

/// The record of `change` at `offset`; `Err` with the reason when the
/// change does not fit its relation (a dead letter).
pub(crate) fn record(
    source: &SourceId,
    partition: PartitionId,
    offset: i64,
    txn: &TxnInfo,
    change: &Change<'_>,
) -> Result<Record, String> {
    let relation = change.relation;
    for tuple in [change.new, change.old.map(old_values)]
        .into_iter()
        .flatten()
    {
        check_width(relation, tuple)?;
    }
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"op\":\"");
    out.extend_from_slice(change.op.name().as_bytes());
    out.extend_from_slice(b"\",\"schema\":");
    push_str(&mut out, &relation.schema);
    out.extend_from_slice(b",\"table\":");
    push_str(&mut out, &relation.name);
    out.extend_from_slice(b",\"commit_lsn\":\"");
    out.extend_from_slice(txn.commit_lsn.to_string().as_bytes());
    out.extend_from_slice(b"\",\"commit_time\":\"");
    out.extend_from_slice(iso_utc(txn.commit_time_micros).as_bytes());
    out.extend_from_slice(b"\",\"xid\":");
    match txn.xid {
        Some(xid) => out.extend_from_slice(xid.to_string().as_bytes()),
        None => out.extend_from_slice(b"null"),
    }

    // The key: the replica identity's columns, of the new row when there
    // is one, else of the old.
    let is_key = |i: usize| relation.columns.get(i).is_some_and(|c| c.key);
    let key_source = change.new.or(change.old.map(old_values));
    let mut key = Vec::new();
    if let Some(tuple) = key_source {
        push_row(&mut key, relation, tuple, is_key, None);
    }
    out.extend_from_slice(b",\"key\":");
    if key.is_empty() || key == b"{}" {
        out.extend_from_slice(b"null");
    } else {
        out.extend_from_slice(&key);
    }
    out.extend_from_slice(b",\"before\":");
    match change.old {
        Some(OldTuple::Full(tuple)) => push_row(&mut out, relation, tuple, |_| true, None),
        Some(OldTuple::Key(tuple)) => push_row(&mut out, relation, tuple, is_key, None),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"after\":");
    let mut unchanged = Vec::new();
    match change.new {
        Some(tuple) => push_row(&mut out, relation, tuple, |_| true, Some(&mut unchanged)),
        None => out.extend_from_slice(b"null"),
    }
    if !unchanged.is_empty() {
        out.extend_from_slice(b",\"unchanged_toast\":[");
        for (n, i) in unchanged.iter().enumerate() {
            if n > 0 {
                out.push(b',');
            }
            push_str(&mut out, &relation.columns[*i].name);
        }
        out.push(b']');
    }
    out.push(b'}');
    let mut record = Record::new(
        Position::new(source.clone(), partition, Offset(offset)),
        Bytes::from(out),
    )
    .with_timestamp(Timestamp(txn.commit_time_micros.div_euclid(1000)));
    if !key.is_empty() && key != b"{}" {
        record = record.with_key(key);
    }
    Ok(record)
}

fn old_values(old: &OldTuple) -> &Tuple {
    match old {
        OldTuple::Key(tuple) | OldTuple::Full(tuple) => tuple,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::Column;

    fn relation() -> Relation {
        let column = |key, name: &str, type_oid| Column {
            key,
            name: name.to_owned(),
            type_oid,
            type_modifier: -1,
        };
        Relation {
            id: 1,
            schema: "public".to_owned(),
            name: "docs".to_owned(),
            replica_identity: b'd',
            columns: vec![
                column(true, "id", 23),
                column(false, "body", 25),
                column(false, "price", 1700),
            ],
        }
    }

    fn text(s: &'static str) -> Value {
        Value::Text(Bytes::from_static(s.as_bytes()))
    }

    #[test]
    fn commit_times_are_iso_8601_utc() {
        assert_eq!(iso_utc(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            iso_utc(1_709_251_200_000_001),
            "2024-03-01T00:00:00.000001Z"
        );
        assert_eq!(iso_utc(-1), "1969-12-31T23:59:59.999999Z");
    }

    #[test]
    fn an_unchanged_toast_column_is_marked_not_nulled() {
        let relation = relation();
        let new = vec![text("7"), Value::UnchangedToast, text("1.10")];
        let txn = TxnInfo {
            commit_lsn: Lsn(0x16_B374_D848),
            commit_time_micros: 0,
            xid: Some(42),
        };
        let record = record(
            &SourceId::new("cdc"),
            PartitionId(0),
            99,
            &txn,
            &Change {
                op: Op::Update,
                relation: &relation,
                old: None,
                new: Some(&new),
            },
        )
        .expect("record");
        let value: serde_json::Value = serde_json::from_slice(&record.value).expect("json");
        assert_eq!(value["op"], "update");
        assert_eq!(value["commit_lsn"], "16/B374D848");
        assert_eq!(value["xid"], 42);
        assert_eq!(value["key"], serde_json::json!({"id": 7}));
        assert_eq!(
            value["after"],
            serde_json::json!({"id": 7, "price": "1.10"})
        );
        assert_eq!(value["unchanged_toast"], serde_json::json!(["body"]));
        assert!(value["before"].is_null());
        assert_eq!(record.key.as_deref(), Some(&br#"{"id":7}"#[..]));
        assert_eq!(record.position.offset, Offset(99));
    }

    #[test]
    fn a_row_that_does_not_fit_its_relation_is_refused_with_the_reason() {
        let relation = relation();
        let new = vec![text("7")];
        let txn = TxnInfo {
            commit_lsn: Lsn(1),
            commit_time_micros: 0,
            xid: Some(1),
        };
        let e = record(
            &SourceId::new("cdc"),
            PartitionId(0),
            1,
            &txn,
            &Change {
                op: Op::Insert,
                relation: &relation,
                old: None,
                new: Some(&new),
            },
        )
        .expect_err("refused");
        assert!(e.contains("1 values") && e.contains("public.docs"), "{e}");
    }
}
