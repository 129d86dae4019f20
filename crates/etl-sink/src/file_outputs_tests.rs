//! Tests of the templated file outputs: the template, values that cannot
//! be a file name, the split by output, the bound on open outputs.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use etl_record::{Offset, PartitionId, Position, Record, SourceId};

use super::*;
use crate::RawLinesEncoder;

fn record(offset: i64, value: &str) -> Record {
    Record::new(
        Position::new(SourceId::new("s"), PartitionId(0), Offset(offset)),
        value.as_bytes().to_vec(),
    )
}

fn batch(values: &[&str]) -> EncodedBatch {
    let records = values
        .iter()
        .enumerate()
        .map(|(i, v)| record(i as i64, v))
        .collect();
    EncodedBatch::encode(records, &RawLinesEncoder::new()).0
}

fn template(path: &Path, tail: &str) -> PathTemplate {
    PathTemplate::parse(&format!("{}/{tail}", path.display()))
        .unwrap()
        .unwrap()
}

#[test]
fn a_path_without_placeholders_is_no_template_and_bad_ones_are_refused() {
    assert_eq!(PathTemplate::parse("out/all.ndjson").unwrap(), None);
    let braces = PathTemplate::parse("out/{{x}}-{a}.ndjson")
        .unwrap()
        .unwrap();
    assert_eq!(
        braces.render(&record(0, r#"{"a":1}"#)).unwrap(),
        PathBuf::from("out/{x}-1.ndjson")
    );
    let t = PathTemplate::parse("out/{level}/{user.id}.ndjson")
        .unwrap()
        .unwrap();
    assert_eq!(t.base(), PathBuf::from("out"));
    for bad in ["out/{level", "out/{}.ndjson", "out/{a..b}", "out/x}.ndjson"] {
        assert!(PathTemplate::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_value_never_chooses_a_folder_outside_the_template() {
    let t = PathTemplate::parse("out/{a}.ndjson").unwrap().unwrap();
    let path = |v: &str| t.render(&record(0, v));
    assert_eq!(path(r#"{"a":"x"}"#).unwrap(), PathBuf::from("out/x.ndjson"));
    assert_eq!(path(r#"{"a":7}"#).unwrap(), PathBuf::from("out/7.ndjson"));
    for bad in [
        r#"{"a":"../etc/passwd"}"#,
        r#"{"a":".."}"#,
        r#"{"a":"."}"#,
        r#"{"a":""}"#,
        r#"{"a":"x\u0000y"}"#,
        r#"{"a":null}"#,
        r#"{"a":{"b":1}}"#,
        r#"{"b":1}"#,
        "not json",
    ] {
        assert!(path(bad).is_err(), "{bad}");
    }
}

#[tokio::test]
async fn each_record_lands_in_the_file_its_field_names_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileOutputs::new(
        template(dir.path(), "{level}/events.ndjson"),
        FileOutputsConfig::default(),
    )
    .unwrap();
    let values = [
        r#"{"level":"info","n":0}"#,
        r#"{"level":"error","n":1}"#,
        r#"{"level":"../x","n":2}"#,
        r#"{"level":"info","n":3}"#,
        r#"{"n":4}"#,
    ];
    let err = sink.write(&batch(&values)).await.unwrap_err();
    let SinkError::Rejected(rejects) = err else {
        panic!("{err:?}")
    };
    assert_eq!(
        rejects.iter().map(|r| r.index).collect::<Vec<_>>(),
        vec![2, 4]
    );
    let read = |level: &str| {
        std::fs::read_to_string(dir.path().join(level).join("events.ndjson")).unwrap()
    };
    assert_eq!(read("info"), format!("{}\n{}\n", values[0], values[3]));
    assert_eq!(read("error"), format!("{}\n", values[1]));
    assert!(!dir.path().join("x").exists());
}

#[tokio::test]
async fn open_outputs_stay_within_the_bound_and_idle_ones_close() {
    let dir = tempfile::tempdir().unwrap();
    let sink = FileOutputs::new(
        template(dir.path(), "{k}.ndjson"),
        FileOutputsConfig {
            max_open: 2,
            ..FileOutputsConfig::default()
        },
    )
    .unwrap();
    for round in 0..2 {
        for k in 0..5 {
            let value = format!(r#"{{"k":{k},"round":{round}}}"#);
            sink.write(&batch(&[&value])).await.unwrap();
            assert!(sink.open_outputs().await <= 2);
        }
    }
    for k in 0..5 {
        let text = std::fs::read_to_string(dir.path().join(format!("{k}.ndjson"))).unwrap();
        assert_eq!(text.lines().count(), 2, "output {k}: {text}");
    }
    let idle = FileOutputs::new(
        template(dir.path(), "idle-{k}.ndjson"),
        FileOutputsConfig {
            close_idle_after: Duration::ZERO,
            ..FileOutputsConfig::default()
        },
    )
    .unwrap();
    idle.write(&batch(&[r#"{"k":1}"#])).await.unwrap();
    idle.flush().await.unwrap();
    assert_eq!(idle.open_outputs().await, 0);
}

#[test]
fn exactly_once_is_refused_for_a_templated_path() {
    let t = PathTemplate::parse("out/{a}.ndjson").unwrap().unwrap();
    let config = FileOutputsConfig {
        file: FileSinkConfig {
            exactly_once: true,
            ..FileSinkConfig::default()
        },
        ..FileOutputsConfig::default()
    };
    assert!(FileOutputs::new(t, config).is_err());
}
