//! The `pgoutput` logical decoding protocol (version 1): the messages
//! inside the replication stream's `XLogData`, decoded without trusting a
//! byte of them.

use bytes::{Buf, Bytes};

use crate::Lsn;

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// One `pgoutput` message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// A transaction starts.
    Begin(Begin),
    /// The transaction ends.
    Commit(Commit),
    /// The transaction came from another server (replication origin).
    Origin {
        /// The origin's commit position.
        commit_lsn: Lsn,
        /// The origin's name.
        name: String,
    },
    /// A table's shape, sent before the first change that uses it and
    /// again after it changes.
    Relation(Relation),
    /// A data type outside `pg_catalog` (an enum, a domain, a composite).
    Type {
        /// The type's OID.
        oid: u32,
        /// Its schema.
        schema: String,
        /// Its name.
        name: String,
    },
    /// A row inserted.
    Insert {
        /// The relation.
        relation: u32,
        /// The new row.
        new: Tuple,
    },
    /// A row updated.
    Update {
        /// The relation.
        relation: u32,
        /// The old row: key columns only ([`OldTuple::Key`]) or the whole
        /// row under `REPLICA IDENTITY FULL` ([`OldTuple::Full`]); absent
        /// when the key did not change.
        old: Option<OldTuple>,
        /// The new row.
        new: Tuple,
    },
    /// A row deleted.
    Delete {
        /// The relation.
        relation: u32,
        /// The old row (key columns only, or the whole row).
        old: OldTuple,
    },
    /// Tables truncated.
    Truncate {
        /// `TRUNCATE ... CASCADE` (bit 0), `RESTART IDENTITY` (bit 1).
        options: u8,
        /// The relations.
        relations: Vec<u32>,
    },
    /// A logical decoding message (`pg_logical_emit_message`), sent only
    /// when asked for with the `messages` option: kept whole, unused.
    LogicalMessage(Bytes),
}

/// `BEGIN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Begin {
    /// The commit record's position (the transaction's final LSN).
    pub final_lsn: Lsn,
    /// Commit time, microseconds since the Unix epoch.
    pub commit_time_micros: i64,
    /// Transaction id.
    pub xid: u32,
}

/// `COMMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commit {
    /// The commit record's position.
    pub commit_lsn: Lsn,
    /// The end of the commit record: the position to confirm once the
    /// transaction is delivered.
    pub end_lsn: Lsn,
    /// Commit time, microseconds since the Unix epoch.
    pub commit_time_micros: i64,
}

/// A table's shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    /// The relation's OID, as the changes name it.
    pub id: u32,
    /// Schema.
    pub schema: String,
    /// Table name.
    pub name: String,
    /// `relreplident`: `d` default (primary key), `n` nothing, `f` full,
    /// `i` index.
    pub replica_identity: u8,
    /// Columns, in order.
    pub columns: Vec<Column>,
}

/// A column of a [`Relation`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    /// Part of the replica identity (the key).
    pub key: bool,
    /// Name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Type modifier.
    pub type_modifier: i32,
}

/// A row's values, one per column.
pub type Tuple = Vec<Value>;

/// The old row of an update or a delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OldTuple {
    /// Key columns only (the others are null).
    Key(Tuple),
    /// The whole row (`REPLICA IDENTITY FULL`).
    Full(Tuple),
}

/// One column's value in a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// SQL null.
    Null,
    /// A TOASTed value that did not change (not sent).
    UnchangedToast,
    /// The value in the type's text output.
    Text(Bytes),
    /// The value in the type's binary output (protocol 2 and later with
    /// `binary`; not asked for).
    Binary(Bytes),
}

/// A message that cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed pgoutput message: {0}")]
pub struct DecodeError(pub String);

fn short(what: &str) -> DecodeError {
    DecodeError(format!("ends inside {what}"))
}

fn u8_of(buf: &mut Bytes, what: &str) -> Result<u8, DecodeError> {
    if buf.remaining() < 1 {
        return Err(short(what));
    }
    Ok(buf.get_u8())
}

fn u32_of(buf: &mut Bytes, what: &str) -> Result<u32, DecodeError> {
    if buf.remaining() < 4 {
        return Err(short(what));
    }
    Ok(buf.get_u32())
}

fn i16_of(buf: &mut Bytes, what: &str) -> Result<i16, DecodeError> {
    if buf.remaining() < 2 {
        return Err(short(what));
    }
    Ok(buf.get_i16())
}

fn i32_of(buf: &mut Bytes, what: &str) -> Result<i32, DecodeError> {
    if buf.remaining() < 4 {
        return Err(short(what));
    }
    Ok(buf.get_i32())
}

fn u64_of(buf: &mut Bytes, what: &str) -> Result<u64, DecodeError> {
    if buf.remaining() < 8 {
        return Err(short(what));
    }
    Ok(buf.get_u64())
}

fn time_of(buf: &mut Bytes, what: &str) -> Result<i64, DecodeError> {
    let pg = u64_of(buf, what)? as i64;
    Ok(pg.saturating_add(PG_EPOCH_OFFSET_MICROS))
}

fn cstring(buf: &mut Bytes, what: &str) -> Result<String, DecodeError> {
    let end = buf
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| DecodeError(format!("{what} has no terminating zero byte")))?;
    let text = buf.split_to(end);
    buf.advance(1);
    String::from_utf8(text.to_vec()).map_err(|_| DecodeError(format!("{what} is not UTF-8")))
}

fn tuple(buf: &mut Bytes) -> Result<Tuple, DecodeError> {
    let n = i16_of(buf, "a tuple's column count")?;
    let n = usize::try_from(n).map_err(|_| DecodeError(format!("a tuple of {n} columns")))?;
    // Each column takes at least one byte: a count larger than what is
    // left is malformed, and must not reserve memory for it.
    if n > buf.remaining() {
        return Err(short("a tuple"));
    }
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        let value = match u8_of(buf, "a tuple")? {
            b'n' => Value::Null,
            b'u' => Value::UnchangedToast,
            kind @ (b't' | b'b') => {
                let len = i32_of(buf, "a value's length")?;
                let len = usize::try_from(len)
                    .map_err(|_| DecodeError(format!("a value of length {len}")))?;
                if buf.remaining() < len {
                    return Err(short("a value"));
                }
                let data = buf.split_to(len);
                if kind == b't' {
                    Value::Text(data)
                } else {
                    Value::Binary(data)
                }
            }
            other => {
                return Err(DecodeError(format!(
                    "unknown tuple value kind {:?}",
                    char::from(other)
                )));
            }
        };
        values.push(value);
    }
    Ok(values)
}

fn old_tuple(kind: u8, buf: &mut Bytes) -> Result<OldTuple, DecodeError> {
    match kind {
        b'K' => Ok(OldTuple::Key(tuple(buf)?)),
        b'O' => Ok(OldTuple::Full(tuple(buf)?)),
        other => Err(DecodeError(format!(
            "expected an old tuple (K or O), found {:?}",
            char::from(other)
        ))),
    }
}

fn new_marker(buf: &mut Bytes) -> Result<(), DecodeError> {
    match u8_of(buf, "a new tuple's marker")? {
        b'N' => Ok(()),
        other => Err(DecodeError(format!(
            "expected a new tuple (N), found {:?}",
            char::from(other)
        ))),
    }
}

/// Decode one message (the payload of an `XLogData`).
///
/// # Errors
///
/// [`DecodeError`] naming what is wrong; never a panic, whatever the
/// bytes.
pub fn decode(mut buf: Bytes) -> Result<Message, DecodeError> {
    let tag = u8_of(&mut buf, "the message tag")?;
    let buf = &mut buf;
    let message = match tag {
        b'B' => Message::Begin(Begin {
            final_lsn: Lsn(u64_of(buf, "BEGIN")?),
            commit_time_micros: time_of(buf, "BEGIN")?,
            xid: u32_of(buf, "BEGIN")?,
        }),
        b'C' => {
            let _flags = u8_of(buf, "COMMIT")?;
            Message::Commit(Commit {
                commit_lsn: Lsn(u64_of(buf, "COMMIT")?),
                end_lsn: Lsn(u64_of(buf, "COMMIT")?),
                commit_time_micros: time_of(buf, "COMMIT")?,
            })
        }
        b'O' => Message::Origin {
            commit_lsn: Lsn(u64_of(buf, "ORIGIN")?),
            name: cstring(buf, "the origin's name")?,
        },
        b'R' => {
            let id = u32_of(buf, "RELATION")?;
            let schema = cstring(buf, "the relation's schema")?;
            let name = cstring(buf, "the relation's name")?;
            let replica_identity = u8_of(buf, "RELATION")?;
            let n = i16_of(buf, "RELATION")?;
            let n = usize::try_from(n)
                .map_err(|_| DecodeError(format!("a relation of {n} columns")))?;
            if n > buf.remaining() {
                return Err(short("RELATION"));
            }
            let mut columns = Vec::with_capacity(n);
            for _ in 0..n {
                let flags = u8_of(buf, "a column")?;
                columns.push(Column {
                    key: flags & 1 == 1,
                    name: cstring(buf, "a column's name")?,
                    type_oid: u32_of(buf, "a column")?,
                    type_modifier: i32_of(buf, "a column")?,
                });
            }
            Message::Relation(Relation {
                id,
                schema,
                name,
                replica_identity,
                columns,
            })
        }
        b'Y' => Message::Type {
            oid: u32_of(buf, "TYPE")?,
            schema: cstring(buf, "the type's schema")?,
            name: cstring(buf, "the type's name")?,
        },
        b'I' => {
            let relation = u32_of(buf, "INSERT")?;
            new_marker(buf)?;
            Message::Insert {
                relation,
                new: tuple(buf)?,
            }
        }
        b'U' => {
            let relation = u32_of(buf, "UPDATE")?;
            let kind = u8_of(buf, "UPDATE")?;
            let old = if kind == b'N' {
                None
            } else {
                let old = old_tuple(kind, buf)?;
                new_marker(buf)?;
                Some(old)
            };
            Message::Update {
                relation,
                old,
                new: tuple(buf)?,
            }
        }
        b'D' => {
            let relation = u32_of(buf, "DELETE")?;
            let kind = u8_of(buf, "DELETE")?;
            Message::Delete {
                relation,
                old: old_tuple(kind, buf)?,
            }
        }
        b'T' => {
            let n = u32_of(buf, "TRUNCATE")?;
            let options = u8_of(buf, "TRUNCATE")?;
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > buf.remaining() / 4 {
                return Err(short("TRUNCATE"));
            }
            let relations = (0..n)
                .map(|_| u32_of(buf, "TRUNCATE"))
                .collect::<Result<_, _>>()?;
            Message::Truncate { options, relations }
        }
        b'M' => Message::LogicalMessage(std::mem::take(buf)),
        other => {
            return Err(DecodeError(format!(
                "unknown message tag {:?}",
                char::from(other)
            )));
        }
    };
    if buf.has_remaining() && !matches!(message, Message::LogicalMessage(_)) {
        return Err(DecodeError(format!(
            "{} bytes after the message",
            buf.remaining()
        )));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn hex(text: &str) -> Bytes {
        let text: String = text.split_whitespace().collect();
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
            .collect::<Vec<u8>>()
            .into()
    }

    /// Messages PostgreSQL 15 wrote for a table `grows (id int primary
    /// key, x int)`: `INSERT (1, 10)`, then under `REPLICA IDENTITY FULL`
    /// `UPDATE SET x = 11`, `DELETE`, `TRUNCATE`; and an update of a
    /// table `docs (id, n, body)` leaving its TOASTed body unchanged.
    #[test]
    fn the_servers_own_bytes_decode_to_what_the_statements_did() {
        let begin = decode(hex("42 000000000192dfd0 000304ed6e27c05e 000002d7")).expect("begin");
        let Message::Begin(begin) = begin else {
            panic!("{begin:?}")
        };
        assert_eq!(begin.final_lsn, Lsn(0x192_dfd0));
        assert_eq!(begin.xid, 727);
        assert_eq!(
            begin.commit_time_micros,
            0x0003_04ed_6e27_c05e + PG_EPOCH_OFFSET_MICROS
        );

        let relation = decode(hex(
            "52 0000400f 7075626c696300 67726f77735f636170747572655f31353830325f3000 64 0002 \
             01 696400 00000017 ffffffff 00 7800 00000017 ffffffff",
        ))
        .expect("relation");
        let Message::Relation(relation) = relation else {
            panic!("{relation:?}")
        };
        assert_eq!(
            (
                relation.id,
                relation.schema.as_str(),
                relation.replica_identity
            ),
            (0x400f, "public", b'd')
        );
        assert_eq!(relation.name, "grows_capture_15802_0");
        let columns: Vec<(bool, &str, u32, i32)> = relation
            .columns
            .iter()
            .map(|c| (c.key, c.name.as_str(), c.type_oid, c.type_modifier))
            .collect();
        assert_eq!(columns, [(true, "id", 23, -1), (false, "x", 23, -1)]);

        let text = |s: &'static str| Value::Text(Bytes::from_static(s.as_bytes()));
        assert_eq!(
            decode(hex("49 0000400f 4e 0002 74 00000001 31 74 00000002 3130")).expect("insert"),
            Message::Insert {
                relation: 0x400f,
                new: vec![text("1"), text("10")],
            }
        );
        assert_eq!(
            decode(hex(
                "43 00 000000000192dfd0 000000000192e000 000304ed6e27c05e"
            ))
            .expect("commit"),
            Message::Commit(Commit {
                commit_lsn: Lsn(0x192_dfd0),
                end_lsn: Lsn(0x192_e000),
                commit_time_micros: begin.commit_time_micros,
            })
        );
        assert_eq!(
            decode(hex(
                "55 0000400f 4f 0002 74 00000001 31 74 00000002 3130 4e 0002 74 00000001 31 74 00000002 3131"
            ))
            .expect("update"),
            Message::Update {
                relation: 0x400f,
                old: Some(OldTuple::Full(vec![text("1"), text("10")])),
                new: vec![text("1"), text("11")],
            }
        );
        assert_eq!(
            decode(hex("44 0000400f 4f 0002 74 00000001 31 74 00000002 3131")).expect("delete"),
            Message::Delete {
                relation: 0x400f,
                old: OldTuple::Full(vec![text("1"), text("11")]),
            }
        );
        assert_eq!(
            decode(hex("54 00000001 00 0000400f")).expect("truncate"),
            Message::Truncate {
                options: 0,
                relations: vec![0x400f],
            }
        );
        assert_eq!(
            decode(hex("55 00004008 4e 0003 74 00000001 31 74 00000001 31 75")).expect("update"),
            Message::Update {
                relation: 0x4008,
                old: None,
                new: vec![text("1"), text("1"), Value::UnchangedToast],
            }
        );
    }

    #[test]
    fn a_truncated_change_is_an_error_naming_where_it_ends() {
        // INSERT into relation 16390 of one text column "abc", cut short.
        let whole = hex("49 00004006 4e 0001 74 00000003 616263");
        assert_eq!(
            decode(whole.clone()).expect("insert"),
            Message::Insert {
                relation: 16390,
                new: vec![Value::Text(Bytes::from_static(b"abc"))],
            }
        );
        for cut in 0..whole.len() {
            let e = decode(whole.slice(..cut)).expect_err("truncated");
            assert!(e.to_string().contains("ends inside"), "{cut}: {e}");
        }
        let e = decode(hex("49 00004006 4e 0001 74 00000003 61626364")).expect_err("extra");
        assert!(e.to_string().contains("1 bytes after"), "{e}");
    }

    /// A connector's property tests run in the test step (the prop step
    /// builds no connector): 2,000 cases there, or `PROPTEST_CASES`.
    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2000)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        /// Whatever the bytes, decoding returns; it never panics and
        /// never reserves memory a length field claims without the
        /// bytes to back it.
        #[test]
        fn decoding_never_panics_on_any_bytes(
            tag in prop::sample::select(b"BCORYIUDTMX".to_vec()),
            body in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut bytes = vec![tag];
            bytes.extend(body);
            let _ = decode(Bytes::from(bytes));
        }

        /// Well-formed tuples decode to what was encoded.
        #[test]
        fn tuples_round_trip(values in prop::collection::vec(
            prop_oneof![
                Just(None),
                Just(Some(None)),
                prop::collection::vec(any::<u8>(), 0..16).prop_map(|v| Some(Some(v))),
            ],
            0..8,
        )) {
            let mut bytes = vec![b'I', 0, 0, 0, 7, b'N'];
            bytes.extend((values.len() as i16).to_be_bytes());
            let mut expected = Vec::new();
            for value in &values {
                match value {
                    None => {
                        bytes.push(b'n');
                        expected.push(Value::Null);
                    }
                    Some(None) => {
                        bytes.push(b'u');
                        expected.push(Value::UnchangedToast);
                    }
                    Some(Some(v)) => {
                        bytes.push(b't');
                        bytes.extend((v.len() as i32).to_be_bytes());
                        bytes.extend(v);
                        expected.push(Value::Text(Bytes::from(v.clone())));
                    }
                }
            }
            prop_assert_eq!(
                decode(Bytes::from(bytes)).expect("decodes"),
                Message::Insert { relation: 7, new: expected }
            );
        }
    }
}
