//! The file source on real files: offsets, batching, seeks, follow mode and
//! every kind of bad input.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::Path;

use etl_record::{DeadLetter, Offset, PartitionId, Record};
use etl_source::{
    EofPolicy, FileSource, FileSourceConfig, LineFormat, ReplacedPolicy, Source, SourceError,
    SourceEvent,
};
use proptest::prelude::*;

fn config(inputs: &[&Path]) -> FileSourceConfig {
    FileSourceConfig {
        paths: inputs.iter().map(|p| p.display().to_string()).collect(),
        read_chunk_bytes: 4096,
        ..FileSourceConfig::default()
    }
}

/// Everything the source returns until `End` (or `Idle`), per kind.
async fn drain(source: &mut FileSource) -> (Vec<Record>, Vec<DeadLetter>, bool) {
    let (mut records, mut rejected) = (Vec::new(), Vec::new());
    loop {
        match source.next().await.unwrap() {
            SourceEvent::Assigned(_) => {}
            SourceEvent::Batch(b) => {
                assert!(!b.is_empty());
                records.extend(b.records);
                rejected.extend(b.rejected);
            }
            SourceEvent::End => return (records, rejected, true),
            SourceEvent::Idle => return (records, rejected, false),
            SourceEvent::Revoked(_) => panic!("a file source never revokes"),
        }
    }
}

fn values(records: &[Record]) -> Vec<(i64, String)> {
    records
        .iter()
        .map(|r| {
            (
                r.position.offset.0,
                String::from_utf8(r.value.to_vec()).unwrap(),
            )
        })
        .collect()
}

fn write(dir: &Path, name: &str, content: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path
}

#[tokio::test]
async fn offsets_are_line_starts_and_values_share_the_read_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "a.ndjson", b"{\"a\":1}\n{\"b\":22}\r\n[]\n");
    let mut source = FileSource::open(config(&[&path])).unwrap();
    let partition = source.partitions()[0].0;
    assert_eq!(
        source.path_of(partition),
        Some(path.canonicalize().unwrap().as_path())
    );
    assert!(
        matches!(source.next().await.unwrap(), SourceEvent::Assigned(p) if p == vec![partition])
    );
    let (records, rejected, ended) = drain(&mut source).await;
    assert!(ended && rejected.is_empty());
    assert_eq!(
        values(&records),
        vec![
            (0, "{\"a\":1}".into()),
            (8, "{\"b\":22}".into()),
            (18, "[]".into())
        ]
    );
    assert!(records.iter().all(|r| r.position.partition == partition));
    // The second value starts right after the first line in the same buffer.
    let first = records[0].value.as_ptr() as usize;
    assert_eq!(records[1].value.as_ptr() as usize, first + 8);
}

#[tokio::test]
async fn bad_lines_become_dead_letters_with_their_reason_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut content = Vec::new();
    content.extend_from_slice(b"{\"ok\":1}\n"); // 0
    content.extend_from_slice(b"{not json\n"); // 9
    content.extend_from_slice(b"\"caf\xe9\"\n"); // 19: invalid UTF-8
    content.extend_from_slice(b"\n"); // 26: empty
    content.extend_from_slice(b"{\"ok\":2}\n"); // 27
    let path = write(dir.path(), "bad.ndjson", &content);
    let mut source = FileSource::open(config(&[&path])).unwrap();
    let (records, rejected, _) = drain(&mut source).await;
    assert_eq!(
        values(&records),
        vec![(0, "{\"ok\":1}".into()), (27, "{\"ok\":2}".into())]
    );
    let reasons: Vec<(i64, &str)> = rejected
        .iter()
        .map(|d| (d.record.position.offset.0, d.reason.as_str()))
        .collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons[0].0 == 9 && reasons[0].1.contains("invalid JSON"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].0 == 19 && reasons[1].1.contains("invalid UTF-8 at byte 4"),
        "{reasons:?}"
    );
    assert!(
        reasons[2].0 == 26 && reasons[2].1.contains("empty line"),
        "{reasons:?}"
    );
    assert!(reasons.iter().all(|(_, r)| r.contains("bad.ndjson")));
    assert_eq!(&rejected[1].record.value[..], b"\"caf\xe9\"");
}

#[tokio::test]
async fn ndjson_lines_are_judged_and_their_reasons_worded_as_serde_json_does() {
    // Lines the quick check passes, lines it leaves to serde_json (which
    // takes some: surrogate escapes, deep nesting) and broken ones.
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let lines: Vec<&[u8]> = vec![
        br#"{"a":"x\n\u00e9","b":[1,-2.5e3,true,null]}"#,
        br#"{"a":"\ud83d\ude00","b":"\udc00"}"#,
        deep.as_bytes(),
        br#"{"a":1,}"#,
        b"{\"a\":\"tab\there\"}",
        br#"[01]"#,
        br#"{"a":"\x"}"#,
        br#"{"a":1} x"#,
        br#" {"a" : [ ] } "#,
        &deep.as_bytes()[..deep.len() - 1],
    ];
    let dir = tempfile::tempdir().unwrap();
    let content: Vec<u8> = lines.iter().flat_map(|l| [*l, b"\n"].concat()).collect();
    let path = write(dir.path(), "mixed.ndjson", &content);
    let mut source = FileSource::open(config(&[&path])).unwrap();
    let (records, rejected, _) = drain(&mut source).await;
    let (mut want_records, mut want_reasons) = (Vec::new(), Vec::new());
    let mut start = 0;
    for line in &lines {
        match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
            Ok(_) => want_records.push((start, String::from_utf8(line.to_vec()).unwrap())),
            Err(e) => want_reasons.push((
                start,
                format!("{} at byte {start}: invalid JSON: {e}", path.display()),
            )),
        }
        start += line.len() as i64 + 1;
    }
    assert_eq!(values(&records), want_records);
    let reasons: Vec<(i64, String)> = rejected
        .iter()
        .map(|d| (d.record.position.offset.0, d.reason.clone()))
        .collect();
    assert_eq!(reasons, want_reasons);
    assert_eq!((records.len(), rejected.len()), (4, 6));
}

#[tokio::test]
async fn raw_lines_are_not_parsed_but_must_be_utf8() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "a.log", b"plain text\n\nbad \xff\n");
    let mut source = FileSource::open(FileSourceConfig {
        format: LineFormat::Lines,
        ..config(&[&path])
    })
    .unwrap();
    let (records, rejected, _) = drain(&mut source).await;
    assert_eq!(
        values(&records),
        vec![(0, "plain text".into()), (11, String::new())]
    );
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].record.position.offset, Offset(12));
}

#[tokio::test]
async fn an_oversized_line_is_skipped_to_its_newline_as_a_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    let long = format!("\"{}\"", "x".repeat(20_000)); // spans several 4 KiB reads
    let content = format!("1\n{long}\n2\n{}\n3\n", "y".repeat(100));
    let path = write(dir.path(), "long.ndjson", content.as_bytes());
    let mut source = FileSource::open(FileSourceConfig {
        max_line_bytes: 64,
        ..config(&[&path])
    })
    .unwrap();
    let (records, rejected, ended) = drain(&mut source).await;
    assert!(ended);
    let after_long = 2 + long.len() as i64 + 1;
    assert_eq!(
        values(&records),
        vec![
            (0, "1".into()),
            (after_long, "2".into()),
            (after_long + 2 + 101, "3".into())
        ]
    );
    assert_eq!(rejected.len(), 2);
    assert_eq!(rejected[0].record.position.offset, Offset(2));
    assert!(
        rejected[0].reason.contains("maximum of 64 bytes"),
        "{}",
        rejected[0].reason
    );
    assert!(rejected[0].record.value.len() <= 1024);
    assert_eq!(rejected[1].record.position.offset, Offset(after_long + 2));
}

#[tokio::test]
async fn a_truncated_last_line_waits_by_default_and_is_read_once_complete() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "t.ndjson", b"{\"a\":1}\n{\"b\":");
    let mut source = FileSource::open(config(&[&path])).unwrap();
    let (records, rejected, ended) = drain(&mut source).await;
    assert!(ended && rejected.is_empty());
    assert_eq!(values(&records), vec![(0, "{\"a\":1}".into())]);

    // The writer finishes the line; a new run resumes after the delivered
    // record (its committed offset is last offset + 1).
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"2}\n")
        .unwrap();
    let mut source = FileSource::open(config(&[&path])).unwrap();
    let p = source.partitions()[0].0;
    source.seek(p, Offset(1)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(values(&records), vec![(8, "{\"b\":2}".into())]);
}

#[tokio::test]
async fn a_truncated_last_line_can_be_emitted_or_dead_lettered_by_policy() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "t.ndjson", b"{\"a\":1}\n{\"b\":2}");
    let mut source = FileSource::open(FileSourceConfig {
        eof: EofPolicy::Emit,
        ..config(&[&path])
    })
    .unwrap();
    let (records, _, ended) = drain(&mut source).await;
    assert!(ended);
    assert_eq!(values(&records)[1], (8, "{\"b\":2}".into()));

    let mut source = FileSource::open(FileSourceConfig {
        eof: EofPolicy::DeadLetter,
        ..config(&[&path])
    })
    .unwrap();
    let (records, rejected, ended) = drain(&mut source).await;
    assert!(ended);
    assert_eq!(records.len(), 1);
    assert_eq!(rejected[0].record.position.offset, Offset(8));
    assert!(
        rejected[0].reason.contains("truncated last line"),
        "{}",
        rejected[0].reason
    );
}

#[tokio::test]
async fn the_rest_of_a_line_emitted_unterminated_is_a_line_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "t.log", b"one\ntw");
    let cfg = FileSourceConfig {
        format: LineFormat::Lines,
        eof: EofPolicy::Emit,
        state_dir: Some(dir.path().join("state")),
        ..config(&[&path])
    };
    let mut source = FileSource::open(cfg.clone()).unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(values(&records), vec![(0, "one".into()), (4, "tw".into())]);

    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"o\nthree\n")
        .unwrap();
    // A new run resumes after the emitted part (committed: 4 + 1).
    let mut source = FileSource::open(cfg.clone()).unwrap();
    let p = source.partitions()[0].0;
    source.seek(p, Offset(5)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(values(&records), vec![(6, "o".into()), (8, "three".into())]);
    // Read from the start, the line is cut in the same place.
    source.seek(p, Offset(0)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(
        values(&records),
        vec![
            (0, "one".into()),
            (4, "tw".into()),
            (6, "o".into()),
            (8, "three".into())
        ]
    );
}

#[tokio::test]
async fn a_newline_completing_a_cut_line_only_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "t.ndjson", b"{\"a\":1}");
    let cfg = FileSourceConfig {
        eof: EofPolicy::Emit,
        state_dir: Some(dir.path().join("state")),
        ..config(&[&path])
    };
    let mut source = FileSource::open(cfg.clone()).unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(values(&records), vec![(0, "{\"a\":1}".into())]);
    // The writer adds the newline it had not written yet, then a line.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"\n{\"b\":2}\n")
        .unwrap();
    for from in [1, 0] {
        let mut source = FileSource::open(cfg.clone()).unwrap();
        let p = source.partitions()[0].0;
        source.seek(p, Offset(from)).await.unwrap();
        let (records, rejected, _) = drain(&mut source).await;
        assert!(rejected.is_empty(), "no empty line: {rejected:?}");
        let expected: Vec<(i64, String)> = if from == 0 {
            vec![(0, "{\"a\":1}".into()), (8, "{\"b\":2}".into())]
        } else {
            vec![(8, "{\"b\":2}".into())]
        };
        assert_eq!(values(&records), expected);
    }
}

#[tokio::test]
async fn a_fifo_is_refused_as_not_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let err = FileSource::open(config(&[&fifo])).unwrap_err();
    assert!(matches!(err, SourceError::NotAFile { .. }), "{err}");
    assert!(err.to_string().contains("FIFO"), "{err}");
}

#[tokio::test]
async fn missing_and_unreadable_inputs_are_errors_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.ndjson");
    let err = FileSource::open(config(&[&missing])).unwrap_err();
    assert!(matches!(err, SourceError::Io { .. }));
    assert!(err.to_string().contains("missing.ndjson"), "{err}");

    let sub = dir.path().join("subdir");
    std::fs::create_dir(&sub).unwrap();
    let err = FileSource::open(config(&[&sub])).unwrap_err();
    assert!(
        err.to_string().contains("subdir") && err.to_string().contains("directory"),
        "{err}"
    );

    let err = FileSource::open(FileSourceConfig::default()).unwrap_err();
    assert!(matches!(err, SourceError::Config(_)));
}

#[tokio::test]
async fn seeks_land_on_the_first_line_at_or_after_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    // Line starts: 0, 2, 3 (empty line), 4.
    let path = write(dir.path(), "s.log", b"a\n\n\nbb\n");
    let mut source = FileSource::open(FileSourceConfig {
        format: LineFormat::Lines,
        ..config(&[&path])
    })
    .unwrap();
    let p = source.partitions()[0].0;
    let starts = |r: Vec<Record>| r.iter().map(|r| r.position.offset.0).collect::<Vec<_>>();
    for (seek, expected) in [
        (0, vec![0, 2, 3, 4]),
        (1, vec![2, 3, 4]),
        (2, vec![2, 3, 4]),
        (3, vec![3, 4]),
        (4, vec![4]),
        (5, vec![]),
        (7, vec![]),
    ] {
        source.seek(p, Offset(seek)).await.unwrap();
        let (records, _, ended) = drain(&mut source).await;
        assert!(ended);
        assert_eq!(starts(records), expected, "seek to {seek}");
    }
    let err = source
        .seek(PartitionId(p.0.wrapping_add(1)), Offset(0))
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::UnknownPartition { .. }));
}

#[tokio::test]
async fn an_offset_beyond_the_end_makes_the_file_a_new_partition_read_from_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "s.log", b"a\nbb\n");
    let mut source = FileSource::open(FileSourceConfig {
        format: LineFormat::Lines,
        ..config(&[&path])
    })
    .unwrap();
    let old = source.partitions()[0].0;
    assert!(matches!(
        source.next().await.unwrap(),
        SourceEvent::Assigned(_)
    ));
    // Committed in a longer file that had this name before.
    source.seek(old, Offset(99)).await.unwrap();
    assert!(matches!(source.next().await.unwrap(), SourceEvent::Revoked(p) if p == vec![old]));
    let SourceEvent::Assigned(new) = source.next().await.unwrap() else {
        panic!("the file comes back as a new partition")
    };
    assert_eq!(source.partitions()[0].0, new[0]);
    assert_ne!(new[0], old);
    // Calls about the old partition are harmless from now on.
    source.seek(old, Offset(0)).await.unwrap();
    source.resume(&[old]).await.unwrap();
    source.seek(new[0], Offset(0)).await.unwrap();
    let (records, _, ended) = drain(&mut source).await;
    assert!(ended);
    assert_eq!(values(&records), vec![(0, "a".into()), (2, "bb".into())]);
}

#[tokio::test]
async fn a_file_replaced_between_runs_gets_a_new_partition_and_a_kept_one_its_old() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let a = write(dir.path(), "a.log", b"1\n2\n");
    let b = write(dir.path(), "b.log", b"1\n2\n");
    let cfg = FileSourceConfig {
        state_dir: Some(state.clone()),
        ..config(&[&a, &b])
    };
    let ids = |source: &FileSource| {
        source
            .partitions()
            .into_iter()
            .map(|(p, path)| (path.file_name().unwrap().to_string_lossy().into_owned(), p))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = ids(&FileSource::open(cfg.clone()).unwrap());
    let mut source = FileSource::open(cfg.clone()).unwrap();
    source.next().await.unwrap(); // the registry is written here
    assert_eq!(ids(&source), before);
    // `a` grows (same file), `b` is replaced.
    std::fs::write(&a, b"1\n2\n3\n").unwrap();
    std::fs::remove_file(&b).unwrap();
    write(dir.path(), "b.log", b"9\n");
    let after = ids(&FileSource::open(cfg.clone()).unwrap());
    assert_eq!(after["a.log"], before["a.log"]);
    assert_ne!(after["b.log"], before["b.log"]);

    let err = FileSource::open(FileSourceConfig {
        on_replaced: ReplacedPolicy::Fail,
        ..cfg
    })
    .unwrap_err();
    assert!(
        matches!(err, SourceError::InputReplaced { partition, .. } if partition == before["b.log"]),
        "{err}"
    );
}

#[tokio::test]
async fn open_files_stay_under_the_cap_and_each_file_is_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let files = 40;
    for f in 0..files {
        let lines: String = (0..25).map(|i| format!("{{\"n\":{i}}}\n")).collect();
        write(dir.path(), &format!("{f:02}.ndjson"), lines.as_bytes());
    }
    let mut cfg = config(&[]);
    cfg.paths = vec![format!("{}/*.ndjson", dir.path().display())];
    cfg.max_batch_records = 10;
    cfg.max_open_files = 3;
    let mut source = FileSource::open(cfg).unwrap();
    let mut per_partition = std::collections::BTreeMap::<PartitionId, usize>::new();
    loop {
        let event = source.next().await.unwrap();
        assert!(source.open_files() <= 3, "{} open", source.open_files());
        match event {
            SourceEvent::Assigned(p) => assert_eq!(p.len(), files),
            SourceEvent::Batch(b) => {
                *per_partition.entry(b.partition).or_default() += b.records.len()
            }
            SourceEvent::End => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(source.open_files(), 0, "every file is closed at its end");
    assert_eq!(per_partition.len(), files);
    assert!(per_partition.values().all(|n| *n == 25));
}

#[tokio::test]
async fn a_paused_file_gives_its_slot_to_another_and_resumes_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let a = write(dir.path(), "a.log", b"1\n2\n3\n4\n");
    let b = write(dir.path(), "b.log", b"5\n6\n");
    let mut source = FileSource::open(FileSourceConfig {
        max_open_files: 1,
        max_batch_records: 2,
        ..config(&[&a, &b])
    })
    .unwrap();
    let (pa, pb) = (source.partitions()[0].0, source.partitions()[1].0);
    source.next().await.unwrap();
    let first = loop {
        if let SourceEvent::Batch(batch) = source.next().await.unwrap() {
            break batch;
        }
    };
    let (paused, other) = if first.partition == pa {
        (pa, pb)
    } else {
        (pb, pa)
    };
    source.pause(&[paused]).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert!(records.iter().all(|r| r.position.partition == other));
    source.resume(&[paused]).await.unwrap();
    let (rest, _, ended) = drain(&mut source).await;
    assert!(ended);
    let total = first.records.len() + records.len() + rest.len();
    assert_eq!(total, 6, "nothing read twice, nothing skipped");
}

#[tokio::test]
async fn several_files_are_served_round_robin_in_bounded_batches() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..10).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    write(dir.path(), "a.ndjson", lines.as_bytes());
    write(dir.path(), "b.ndjson", lines.as_bytes());
    write(dir.path(), "ignored.txt", b"x\n");
    let mut cfg = config(&[]);
    cfg.paths = vec![format!("{}/*.ndjson", dir.path().display())];
    cfg.max_batch_records = 3;
    let mut source = FileSource::open(cfg).unwrap();
    assert!(matches!(source.next().await.unwrap(), SourceEvent::Assigned(p) if p.len() == 2));
    let mut order = Vec::new();
    let mut count = 0;
    loop {
        match source.next().await.unwrap() {
            SourceEvent::Batch(b) => {
                assert!(b.records.len() <= 3);
                count += b.records.len();
                order.push(b.partition);
            }
            SourceEvent::End => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(count, 20);
    assert_ne!(order[0], order[1], "partitions alternate");
}

#[tokio::test]
async fn pausing_a_file_holds_its_batches_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "a.ndjson", b"1\n2\n");
    let mut source = FileSource::open(config(&[&path])).unwrap();
    let p = source.partitions()[0].0;
    source.next().await.unwrap();
    source.pause(&[p]).await.unwrap();
    assert!(matches!(source.next().await.unwrap(), SourceEvent::Idle));
    source.resume(&[p]).await.unwrap();
    assert!(matches!(source.next().await.unwrap(), SourceEvent::Batch(b) if b.records.len() == 2));
}

#[tokio::test(start_paused = true)]
async fn follow_mode_reads_appended_lines_and_waits_for_newlines() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "f.ndjson", b"1\n");
    let mut source = FileSource::open(FileSourceConfig {
        follow: true,
        ..config(&[&path])
    })
    .unwrap();
    let (records, _, ended) = drain(&mut source).await;
    assert!(!ended, "a followed file never ends");
    assert_eq!(values(&records), vec![(0, "1".into())]);

    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    file.write_all(b"2\n3").unwrap();
    let (records, rejected, _) = drain(&mut source).await;
    assert_eq!(values(&records), vec![(2, "2".into())]);
    assert!(
        rejected.is_empty(),
        "an unterminated line waits in follow mode"
    );
    file.write_all(b"4\n").unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(values(&records), vec![(4, "34".into())]);
}

#[tokio::test(start_paused = true)]
async fn a_followed_file_rotated_or_truncated_continues_as_a_new_partition() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "f.ndjson", b"1\n2\n");
    let mut source = FileSource::open(FileSourceConfig {
        follow: true,
        ..config(&[&path])
    })
    .unwrap();
    let first = source.partitions()[0].0;
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(records.len(), 2);

    // Rotation: renamed away, a new file under the name.
    std::fs::rename(&path, dir.path().join("f.ndjson.1")).unwrap();
    write(dir.path(), "f.ndjson", b"3\n");
    assert!(matches!(next_event(&mut source).await, SourceEvent::Revoked(p) if p == vec![first]));
    let SourceEvent::Assigned(second) = next_event(&mut source).await else {
        panic!("the new file is a new partition")
    };
    source.seek(second[0], Offset(0)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(values(&records), vec![(0, "3".into())]);

    // Copy-truncate: the same file, emptied and written again.
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(next_event(&mut source).await, SourceEvent::Revoked(p) if p == second));
    let SourceEvent::Assigned(third) = next_event(&mut source).await else {
        panic!("the truncated file is a new partition")
    };
    std::fs::write(&path, b"4\n").unwrap();
    source.seek(third[0], Offset(0)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(values(&records), vec![(0, "4".into())]);
}

/// The next event that is not `Idle`.
async fn next_event(source: &mut FileSource) -> SourceEvent {
    loop {
        match source.next().await.unwrap() {
            SourceEvent::Idle => {}
            event => return event,
        }
    }
}

#[tokio::test]
async fn a_file_renamed_between_runs_keeps_its_partition_and_its_cut() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let path = write(dir.path(), "app.log", b"1\n2");
    let cfg = FileSourceConfig {
        paths: vec![format!("{}/app.log*", dir.path().display())],
        format: LineFormat::Lines,
        eof: EofPolicy::Emit,
        state_dir: Some(state),
        ..config(&[])
    };
    let mut source = FileSource::open(cfg.clone()).unwrap();
    let old = source.partitions()[0].0;
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(records.len(), 2);

    // Rotated: the writer finishes its line, the file is renamed, a new
    // one takes the name.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"3\n")
        .unwrap();
    let rotated = dir.path().join("app.log.1");
    std::fs::rename(&path, &rotated).unwrap();
    write(dir.path(), "app.log", b"4\n");
    let mut source = FileSource::open(cfg).unwrap();
    let rotated_id = source
        .partitions()
        .into_iter()
        .find(|(_, p)| p.ends_with("app.log.1"))
        .unwrap()
        .0;
    assert_eq!(rotated_id, old);
    let fresh = source
        .partitions()
        .into_iter()
        .find(|(_, p)| p.ends_with("app.log"))
        .unwrap()
        .0;
    assert_ne!(fresh, old);
    source.next().await.unwrap();
    // The rotated file resumes after the emitted part of its cut line.
    source.seek(rotated_id, Offset(3)).await.unwrap();
    source.seek(fresh, Offset(0)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    let mut got: Vec<_> = records
        .iter()
        .map(|r| String::from_utf8(r.value.to_vec()).unwrap())
        .collect();
    got.sort();
    assert_eq!(got, ["3", "4"]);
}

proptest! {
    /// Whatever the content, chunk size and batch size: every line start is
    /// covered exactly once, good lines come back byte for byte, bad ones as
    /// dead letters.
    #[test]
    fn prop_every_line_is_a_record_or_a_dead_letter(
        lines in proptest::collection::vec(
            prop_oneof![
                3 => "[a-z0-9]{0,40}".prop_map(|s| format!("\"{s}\"").into_bytes()),
                1 => proptest::collection::vec(any::<u8>().prop_filter("no newline", |b| *b != b'\n'), 0..60),
            ],
            0..40,
        ),
        chunk in 4096usize..6000,
        max_line in 8usize..50,
        batch in 1usize..7,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = lines.iter().flat_map(|l| l.iter().copied().chain([b'\n'])).collect();
        let path = write(dir.path(), "p.ndjson", &content);
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let (records, rejected, ended) = rt.block_on(async {
            let mut source = FileSource::open(FileSourceConfig {
                read_chunk_bytes: chunk,
                max_line_bytes: max_line,
                max_batch_records: batch,
                ..config(&[&path])
            }).unwrap();
            drain(&mut source).await
        });
        prop_assert!(ended);
        let mut starts = Vec::new();
        let mut pos = 0i64;
        for l in &lines {
            starts.push(pos);
            pos += l.len() as i64 + 1;
        }
        let mut seen: Vec<i64> = records.iter().map(|r| r.position.offset.0)
            .chain(rejected.iter().map(|d| d.record.position.offset.0)).collect();
        seen.sort_unstable();
        prop_assert_eq!(seen, starts.clone());
        for r in &records {
            let i = starts.binary_search(&r.position.offset.0).unwrap();
            let mut expected = &lines[i][..];
            if expected.last() == Some(&b'\r') { expected = &expected[..expected.len() - 1]; }
            prop_assert_eq!(&r.value[..], expected);
            prop_assert!(r.value.len() <= max_line);
        }
    }
}

#[tokio::test]
async fn a_utf8_bom_at_the_start_of_a_file_is_not_part_of_the_first_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "bom.ndjson",
        b"\xEF\xBB\xBF{\"a\":1}\n{\"b\":\"\xEF\xBB\xBF\"}\n{\"c\":3}\n",
    );
    let mut source = FileSource::open(config(&[&path])).unwrap();
    let (records, rejected, ended) = drain(&mut source).await;
    assert!(ended && rejected.is_empty(), "{rejected:?}");
    assert_eq!(
        values(&records),
        vec![
            (0, "{\"a\":1}".into()),
            (11, "{\"b\":\"\u{feff}\"}".into()),
            (23, "{\"c\":3}".into()),
        ],
        "offsets count the BOM's bytes; only the file's first 3 bytes are dropped"
    );
    // A rerun resumes after the first record (committed: 0 + 1).
    let mut source = FileSource::open(config(&[&path])).unwrap();
    let p = source.partitions()[0].0;
    source.seek(p, Offset(1)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(
        values(&records),
        vec![
            (11, "{\"b\":\"\u{feff}\"}".into()),
            (23, "{\"c\":3}".into())
        ]
    );
    // From the start again, the BOM is dropped again.
    let mut source = FileSource::open(config(&[&path])).unwrap();
    source.seek(p, Offset(0)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(records[0].value, &b"{\"a\":1}"[..]);
}

/// `n` NDJSON lines numbered from `from`, each about 40 bytes.
fn export(from: usize, n: usize) -> Vec<u8> {
    (from..from + n)
        .flat_map(|i| format!("{{\"id\":{i},\"pad\":\"{:0>20}\"}}\n", i).into_bytes())
        .collect()
}

#[cfg(unix)]
fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

#[cfg(unix)]
#[tokio::test]
async fn an_input_rewritten_in_place_with_the_same_first_kib_is_read_from_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "export.ndjson", &export(0, 200));
    let cfg = FileSourceConfig {
        state_dir: Some(dir.path().join("state")),
        ..config(&[&path])
    };
    let mut source = FileSource::open(cfg.clone()).unwrap();
    let old = source.partitions()[0].0;
    let (records, _, ended) = drain(&mut source).await;
    assert!(ended && records.len() == 200);
    // What the checkpointer commits once every record is delivered.
    let committed = Offset(records.last().unwrap().position.offset.0 + 1);
    drop(source);

    // Regenerated in place (`cat next > export.ndjson`): the same inode,
    // the same first 100 lines (4 KiB), then other records, and longer.
    let ino = inode(&path);
    let mut next = export(0, 100);
    next.extend(export(1000, 300));
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap()
        .write_all(&next)
        .unwrap();
    assert_eq!(inode(&path), ino);
    assert!(next.len() as i64 >= committed.0);

    let mut source = FileSource::open(cfg.clone()).unwrap();
    let new = source.partitions()[0].0;
    assert_ne!(new, old, "the rewritten file is a new partition");
    // The driver seeks each partition to its committed offset; the new
    // one has none.
    source.next().await.unwrap();
    let start = if new == old { committed } else { Offset(0) };
    source.seek(new, start).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(records.len(), 400, "every record of the new export is read");
    drop(source);

    let err = FileSource::open(FileSourceConfig {
        on_replaced: ReplacedPolicy::Fail,
        ..cfg.clone()
    });
    assert!(err.is_ok(), "the new export is the recorded file now");
    std::fs::write(&path, export(0, 400)).unwrap();
    let err = FileSource::open(FileSourceConfig {
        on_replaced: ReplacedPolicy::Fail,
        ..cfg
    })
    .unwrap_err();
    assert!(
        matches!(err, SourceError::InputReplaced { ref reason, .. } if reason.contains("rewritten")),
        "{err}"
    );
}

#[tokio::test]
async fn an_input_that_only_grew_keeps_its_partition_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "app.ndjson", &export(0, 200));
    let cfg = FileSourceConfig {
        state_dir: Some(dir.path().join("state")),
        ..config(&[&path])
    };
    let mut source = FileSource::open(cfg.clone()).unwrap();
    let old = source.partitions()[0].0;
    let (records, _, _) = drain(&mut source).await;
    let committed = Offset(records.last().unwrap().position.offset.0 + 1);
    drop(source);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&export(200, 50))
        .unwrap();
    for _ in 0..2 {
        let mut source = FileSource::open(cfg.clone()).unwrap();
        assert_eq!(source.partitions()[0].0, old);
        source.next().await.unwrap();
        source.seek(old, committed).await.unwrap();
        let (records, _, _) = drain(&mut source).await;
        assert_eq!(records.len(), 50);
        assert_eq!(
            &records[0].value[..],
            &export(200, 1)[..export(200, 1).len() - 1]
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_followed_file_rewritten_in_place_continues_as_a_new_partition() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "f.ndjson", &export(0, 100));
    let mut source = FileSource::open(FileSourceConfig {
        follow: true,
        ..config(&[&path])
    })
    .unwrap();
    let first = source.partitions()[0].0;
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(records.len(), 100);

    // Written over in place between two looks, longer than before, with
    // the same first lines.
    let mut next = export(0, 50);
    next.extend(export(1000, 100));
    std::fs::write(&path, &next).unwrap();
    assert!(matches!(next_event(&mut source).await, SourceEvent::Revoked(p) if p == vec![first]));
    let SourceEvent::Assigned(second) = next_event(&mut source).await else {
        panic!("the rewritten file is a new partition")
    };
    source.seek(second[0], Offset(0)).await.unwrap();
    let (records, _, _) = drain(&mut source).await;
    assert_eq!(records.len(), 150);
}
