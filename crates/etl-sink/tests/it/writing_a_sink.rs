//! Runs the example sinks of `docs/writing-a-sink.md` (blocking client,
//! row sink, transactional sink), and checks that the code the page quotes
//! is the code of the examples.

#![allow(clippy::unwrap_used)]

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/blocking_sink.rs"]
mod blocking_sink;

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/row_sink.rs"]
mod row_sink;

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/transactional_sink.rs"]
mod transactional_sink;

#[tokio::test]
async fn the_blocking_sink_writes_durably_through_spawn_blocking() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        blocking_sink::run(dir.path()).await.unwrap(),
        "one\ntwo\nthree\n"
    );
}

#[tokio::test(start_paused = true)]
async fn the_row_sink_upserts_rows_and_rejects_what_is_not_a_row() {
    let (rows, dead) = row_sink::run().await.unwrap();
    assert_eq!(
        rows,
        vec![
            row_sink::Order { id: 1, amount: 9.5 },
            row_sink::Order {
                id: 2,
                amount: 12.0
            },
        ],
        "the replay replaced its own rows"
    );
    let dead = String::from_utf8(dead).unwrap();
    assert_eq!(
        dead.lines().count(),
        2,
        "one dead letter per delivery: {dead}"
    );
    assert!(dead.contains("\"key\":\"orders/0/1\""), "{dead}");
}

#[tokio::test]
async fn the_transactional_sink_stores_each_record_once_across_a_restart() {
    let tables = transactional_sink::run().await.unwrap();
    let expected: Vec<String> = (0..5).map(|n| format!("{{\"n\":{n}}}")).collect();
    assert_eq!(tables.rows, expected);
    assert_eq!(
        tables.progress.get(etl_record::PartitionId(0)),
        Some(etl_record::Offset(5))
    );
}

/// Every block the page quotes from an example (between its
/// `ANCHOR: sink` and `ANCHOR_END: sink` lines) is in the page verbatim.
#[test]
fn the_page_quotes_the_examples_as_they_are() {
    let root = env!("CARGO_MANIFEST_DIR");
    let page = std::fs::read_to_string(format!("{root}/../../docs/writing-a-sink.md")).unwrap();
    for example in ["blocking_sink", "row_sink", "transactional_sink"] {
        let source = std::fs::read_to_string(format!("{root}/examples/{example}.rs")).unwrap();
        let start = source.find("// ANCHOR: sink\n").unwrap() + "// ANCHOR: sink\n".len();
        let end = source.find("// ANCHOR_END: sink").unwrap();
        let quoted = &source[start..end];
        assert!(
            page.contains(quoted),
            "docs/writing-a-sink.md does not quote examples/{example}.rs as it is"
        );
    }
}
