//! A `remap` program writes `%key`, `%headers` and `%timestamp`, and the
//! record leaves with them; the rest of the metadata is read-only.

#![allow(clippy::unwrap_used)]

use etl::{ChainOutput, Remap, TransformChain, VrlProgram};
use etl_record::{Offset, PartitionId, Position, Record, SourceId, Timestamp};

fn record() -> Record {
    let mut r = Record::new(
        Position::new(SourceId::new("orders"), PartitionId(3), Offset(40)),
        br#"{"id":7, "user":"u-1"}"#.to_vec(),
    )
    .with_key(b"k-1".to_vec())
    .with_header("trace", b"t-9".to_vec())
    .with_timestamp(Timestamp(1_767_225_600_000));
    r.headers.push("dup", Some(b"1".to_vec().into()));
    r.headers.push("dup", Some(b"2".to_vec().into()));
    r
}

fn run(program: &str, drop_on_error: bool) -> ChainOutput {
    let mut chain = TransformChain::new();
    chain.push(Box::new(
        Remap::new("remap", VrlProgram::remap(program).unwrap()).drop_on_error(drop_on_error),
    ));
    let mut out = ChainOutput::default();
    chain.apply(vec![record()], &mut out);
    out
}

#[test]
fn key_headers_and_timestamp_are_written_back() {
    let out = run(
        r#"
        %key = "user:" + string!(.user)
        %headers.region = "eu"
        del(%headers.trace)
        %timestamp = t'2026-01-01T00:00:01.5Z'
        "#,
        true,
    );
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    let r = &out.kept[0];
    assert_eq!(r.key.as_deref(), Some(&b"user:u-1"[..]));
    let headers: Vec<(&str, Option<&[u8]>)> = r
        .headers
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_deref()))
        .collect();
    assert_eq!(
        headers,
        vec![("dup", Some(&b"2"[..])), ("region", Some(&b"eu"[..]))],
        "rewritten headers: VRL's object, in its (sorted) order, the last of repeated keys"
    );
    assert_eq!(r.timestamp, Some(Timestamp(1_767_225_601_500)));
    assert_eq!(
        &r.value[..],
        br#"{"id":7, "user":"u-1"}"#,
        "the value is untouched"
    );
    assert_eq!(r.position, record().position);
}

#[test]
fn metadata_a_program_does_not_write_is_left_as_it_came() {
    for program in [r#".k = string!(%key)"#, r#"%key = "k-1""#, ".x = 1"] {
        let out = run(program, true);
        let r = &out.kept[0];
        assert_eq!(r.key, record().key, "{program}");
        assert_eq!(
            r.headers,
            record().headers,
            "{program}: repeated headers kept"
        );
        assert_eq!(r.timestamp, record().timestamp, "{program}");
    }
    let out = run("del(%key)\n%timestamp = null\n%headers = {}", true);
    let r = &out.kept[0];
    assert_eq!(
        (r.key.is_none(), r.headers.len(), r.timestamp),
        (true, 0, None)
    );
}

#[test]
fn a_value_of_the_wrong_type_is_a_runtime_error() {
    let out = run("%key = 5", true);
    assert!(out.kept.is_empty());
    let letter = &out.rejected[0];
    assert!(
        letter
            .reason
            .contains("%key must be a string (bytes) or null, not integer"),
        "{}",
        letter.reason
    );
    assert_eq!(letter.record.key, record().key, "the record as it came");
    let out = run(r#"%timestamp = "yesterday""#, false);
    assert!(
        out.halted
            .as_ref()
            .is_some_and(|h| h.reason.contains("%timestamp must be a timestamp")),
        "{:?}",
        out.halted
    );
}

#[test]
fn source_partition_offset_and_other_metadata_are_read_only() {
    for (program, expected) in [
        ("%partition = 1", "read-only"),
        ("%offset = 1", "read-only"),
        (r#"%source = "x""#, "read-only"),
        (r#"% = {}"#, "read-only"),
        (r#"%topic = "t""#, "read-only"),
        (
            "%region = \"t\"",
            "a program assigns only %key, %headers and %timestamp",
        ),
    ] {
        let err = VrlProgram::remap(program).unwrap_err();
        assert!(err.message.contains(expected), "{program}: {}", err.message);
    }
    let err = VrlProgram::condition(r#"%key = "x"; true"#).unwrap_err();
    assert!(err.message.contains("read-only"), "{}", err.message);
}

#[test]
fn the_topic_a_record_was_read_from_is_readable_and_null_without_one() {
    let mut chain = TransformChain::new();
    chain.push(Box::new(Remap::new(
        "remap",
        VrlProgram::remap(".topic = %topic").unwrap(),
    )));
    let mut from_kafka = record();
    from_kafka.topic = Some("orders.eu".into());
    let mut out = ChainOutput::default();
    chain.apply(vec![from_kafka, record()], &mut out);
    assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    assert_eq!(
        &out.kept[0].value[..],
        br#"{"id":7,"user":"u-1","topic":"orders.eu"}"#
    );
    assert_eq!(
        &out.kept[1].value[..],
        br#"{"id":7,"user":"u-1","topic":null}"#
    );
}
