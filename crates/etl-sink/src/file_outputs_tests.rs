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

#[test]
fn a_record_given_no_output_path_says_why_in_a_typed_error() {
    let t = PathTemplate::parse("out/{a}").unwrap().unwrap();
    let err = t.render(&record(0, "not json")).unwrap_err();
    assert!(matches!(err, OutputPathError::NotJson(_)), "{err:?}");
    assert!(
        err.to_string().starts_with("the value is not JSON (")
            && err.to_string().ends_with("): no output path"),
        "{err}"
    );
    let cause = std::error::Error::source(&err).expect("serde_json's error");
    assert!(cause.is::<serde_json::Error>(), "{cause:?}");

    let shown = |value: &str| t.render(&record(0, value)).unwrap_err().to_string();
    assert_eq!(
        shown(r#"{"b":1}"#),
        "field \"a\" of the output path is missing"
    );
    assert_eq!(
        shown(r#"{"a":null}"#),
        "field \"a\" of the output path is not a string, number or boolean"
    );
    assert_eq!(
        shown(r#"{"a":".."}"#),
        "field \"a\" of the output path is \"..\": not a file name part \
         (empty, `.`, `..`, or holding `/` or NUL)"
    );
    assert_eq!(
        shown(r#"{"a":"x.lock"}"#),
        "the output \"out/x.lock\" ends like a file another output keeps beside it \
         (a lock): the record would write into it"
    );
    let long = format!(r#"{{"a":"{}"}}"#, "x".repeat(256));
    assert!(matches!(
        t.render(&record(0, &long)),
        Err(OutputPathError::NameTooLong { bytes: 256 })
    ));
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
fn a_value_never_names_another_outputs_side_files() {
    let t = PathTemplate::parse("out/{k}").unwrap().unwrap();
    for bad in [
        "x.lock",
        "x.progress",
        "x.recovery",
        "x.recovery.tmp",
        "x.1",
        "x.ndjson.12",
    ] {
        let value = format!(r#"{{"k":"{bad}"}}"#);
        assert!(t.render(&record(0, &value)).is_err(), "{bad}");
    }
    let long = format!(r#"{{"k":"{}"}}"#, "a".repeat(256));
    assert!(t.render(&record(0, &long)).is_err());
    assert!(t.render(&record(0, r#"{"k":"x.ndjson"}"#)).is_ok());
}

#[tokio::test]
async fn an_output_its_name_cannot_open_refuses_its_records_not_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    // A file where a folder of the template would go, and an output
    // another sink holds.
    std::fs::write(dir.path().join("file"), "x").unwrap();
    std::fs::create_dir(dir.path().join("held")).unwrap();
    let holder = FileSink::open(dir.path().join("held/x.ndjson"), FileSinkConfig::default())
        .await
        .unwrap();
    let sink = FileOutputs::new(
        template(dir.path(), "{k}/x.ndjson"),
        FileOutputsConfig::default(),
    )
    .unwrap();
    let values = [
        r#"{"k":"ok","n":0}"#,
        r#"{"k":"file","n":1}"#,
        r#"{"k":"held","n":2}"#,
        r#"{"k":"ok","n":3}"#,
    ];
    let err = sink.write(&batch(&values)).await.unwrap_err();
    let SinkError::Rejected(rejects) = err else {
        panic!("{err:?}")
    };
    assert_eq!(
        rejects.iter().map(|r| r.index).collect::<Vec<_>>(),
        vec![1, 2],
        "{rejects:?}"
    );
    let ok = std::fs::read_to_string(dir.path().join("ok/x.ndjson")).unwrap();
    assert_eq!(ok.lines().count(), 2);
    drop(holder);
}

#[tokio::test]
async fn a_retry_after_a_write_failed_part_way_writes_only_the_outputs_it_had_not() {
    use etl_fs::{SimFaults, SimFs};

    let sim = SimFs::new(7);
    let fs: Arc<dyn Fs> = Arc::new(sim.process());
    let sink = FileOutputs::new_in(
        fs,
        PathTemplate::parse("/out/{k}/x.ndjson").unwrap().unwrap(),
        FileOutputsConfig::default(),
    )
    .unwrap();
    sink.write(&batch(&[r#"{"k":"a","n":0}"#, r#"{"k":"b","n":0}"#]))
        .await
        .unwrap();
    sim.set_faults(SimFaults {
        write_fail: 1000,
        under: Some(PathBuf::from("/out/b")),
        ..SimFaults::default()
    });
    let second = batch(&[r#"{"k":"a","n":1}"#, r#"{"k":"b","n":1}"#]);
    let failed = sink.write(&second).await.unwrap_err();
    assert!(failed.is_retryable(), "{failed:?}");
    sim.set_faults(SimFaults::default());
    sink.write(&second).await.unwrap();
    let lines = |path: &str| {
        let bytes = sim.process().read(Path::new(path)).unwrap();
        String::from_utf8(bytes).unwrap()
    };
    assert_eq!(
        lines("/out/a/x.ndjson"),
        "{\"k\":\"a\",\"n\":0}\n{\"k\":\"a\",\"n\":1}\n",
        "a's part is not written twice"
    );
    assert_eq!(lines("/out/b/x.ndjson").lines().count(), 2);
}

#[tokio::test]
async fn exactly_once_outputs_hold_each_record_once_across_a_crash_between_them() {
    use etl_fs::{SimFaults, SimFs};

    let sim = SimFs::new(11);
    let config = FileOutputsConfig {
        file: FileSinkConfig {
            exactly_once: true,
            ..FileSinkConfig::default()
        },
        ..FileOutputsConfig::default()
    };
    let template = || PathTemplate::parse("/out/{k}.ndjson").unwrap().unwrap();
    let open =
        |sim: &SimFs| FileOutputs::new_in(Arc::new(sim.process()), template(), config).unwrap();
    let batch_at = |from: i64, values: &[&str]| {
        let records = values
            .iter()
            .enumerate()
            .map(|(i, v)| record(from + i as i64, v))
            .collect();
        EncodedBatch::encode(records, &RawLinesEncoder::new()).0
    };
    let first = batch_at(0, &[r#"{"k":"a","n":0}"#, r#"{"k":"b","n":1}"#]);
    let second = batch_at(2, &[r#"{"k":"a","n":2}"#, r#"{"k":"b","n":3}"#]);
    let sink = open(&sim);
    sink.write(&first).await.unwrap();
    assert_eq!(sink.progress().get(PartitionId(0)), Some(Offset(2)));
    // The second batch reaches a, not b; then the machine goes down.
    sim.set_faults(SimFaults {
        write_fail: 1000,
        under: Some(PathBuf::from("/out/b.ndjson")),
        ..SimFaults::default()
    });
    sink.write(&second).await.unwrap_err();
    drop(sink);
    sim.crash();
    sim.set_faults(SimFaults::default());

    // The next run resumes where every output holds its part, and sends
    // what follows again (the first batch too, as a driver replaying from
    // an older commit would): each output skips what it holds.
    let sink = open(&sim);
    assert_eq!(sink.progress().get(PartitionId(0)), Some(Offset(2)));
    assert_eq!(
        sink.reload_progress().await.unwrap().get(PartitionId(0)),
        Some(Offset(2))
    );
    sink.write(&first).await.unwrap();
    sink.write(&second).await.unwrap();
    assert_eq!(sink.progress().get(PartitionId(0)), Some(Offset(4)));
    let text =
        |path: &str| String::from_utf8(sim.process().read(Path::new(path)).unwrap()).unwrap();
    assert_eq!(
        text("/out/a.ndjson"),
        "{\"k\":\"a\",\"n\":0}\n{\"k\":\"a\",\"n\":2}\n"
    );
    assert_eq!(
        text("/out/b.ndjson"),
        "{\"k\":\"b\",\"n\":1}\n{\"k\":\"b\",\"n\":3}\n"
    );
}

#[test]
fn a_placeholder_with_brackets_is_refused_as_every_field_path_is() {
    let error = PathTemplate::parse("out/{items[0]}.ndjson").unwrap_err();
    assert!(error.to_string().contains("brackets"), "{error}");
}
