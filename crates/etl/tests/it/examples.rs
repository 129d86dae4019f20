//! The examples run as tests, so they stay correct.

#[path = "../../examples/custom_pipeline.rs"]
#[allow(dead_code)]
mod custom_pipeline;

#[path = "../../examples/file_to_file.rs"]
#[allow(dead_code)]
mod file_to_file;

#[path = "../../examples/log_errors.rs"]
#[allow(dead_code)]
mod log_errors;

use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn custom_source_and_sink_pipeline() {
    let lines = custom_pipeline::run().await.unwrap();
    assert_eq!(lines.len(), 300);
    assert!(lines.iter().all(|l| l.starts_with("SENSOR-")));
}

#[tokio::test]
async fn file_to_file_resumes_from_its_store() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.ndjson");
    std::fs::write(
        &input,
        "{\"id\":1,\"amount\":5}\n{\"id\":2,\"amount\":50,\"user\":\"ann\"}\n{\"id\":3,\"amount\":500}\n",
    )
    .unwrap();
    let input = input.to_str().unwrap();
    let out = dir.path().join("out");
    let run = || file_to_file::run(input, &out, CancellationToken::new());
    assert_eq!(run().await.unwrap(), (3, 2));
    assert_eq!(run().await.unwrap(), (0, 0), "resumed");
    let text = std::fs::read_to_string(out.join("orders.ndjson")).unwrap();
    assert_eq!(text.lines().count(), 2);
    assert!(text.contains("\"pipeline\":\"quickstart\""));
    assert!(text.contains("\"customer\":\"ann\""), "{text}");
}

/// The quickstart's input through the Rust version of its pipeline gives
/// what the quickstart's TOML gives: every order worth at least 10, tagged
/// and with `customer` for `user`.
#[tokio::test]
async fn file_to_file_is_the_quickstart() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart/input/*.ndjson"
    );
    let out = dir.path().join("out");
    let (read, written) = file_to_file::run(inputs, &out, CancellationToken::new())
        .await
        .unwrap();
    let text = std::fs::read_to_string(out.join("orders.ndjson")).unwrap();
    assert_eq!(text.lines().count() as u64, written);
    assert!(read > written, "some orders are under 10");
    for line in text.lines() {
        let order: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(order["amount"].as_f64().unwrap() >= 10.0, "{line}");
        assert_eq!(order["pipeline"], "quickstart");
        assert!(order.get("user").is_none(), "{line}");
    }
}

#[tokio::test]
async fn log_errors_keeps_server_errors_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let line = |path: &str, status: u16| {
        format!("10.0.0.1 - - [01/Dec/2026:10:00:00 +0000] \"GET {path} HTTP/1.1\" {status} 512\n")
    };
    std::fs::write(
        logs.join("a.log"),
        [line("/", 200), line("/pay", 503), line("/x", 404)].concat(),
    )
    .unwrap();
    std::fs::write(
        logs.join("b.log"),
        [line("/cart", 500), line("/", 304)].concat(),
    )
    .unwrap();
    let pattern = format!("{}/*.log", logs.display());
    let out = dir.path().join("out");

    let summary = log_errors::run(&pattern, &out, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        (summary.read, summary.written(), summary.stopped),
        (5, 2, false)
    );
    let kept = std::fs::read_to_string(out.join("errors.log")).unwrap();
    assert_eq!(kept.lines().count(), 2);
    assert!(kept.contains("/pay") && kept.contains("/cart"), "{kept}");

    let again = log_errors::run(&pattern, &out, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again.read, 0, "resumed where the first run committed");
}

/// A token cancelled before the run (a signal that came early) stops it
/// cleanly: `Ok`, marked stopped.
#[tokio::test]
async fn log_errors_stops_when_its_token_is_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("a.log");
    std::fs::write(&log, "x \"GET / HTTP/1.1\" 500 1\n").unwrap();
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    let summary = log_errors::run(log.to_str().unwrap(), &dir.path().join("out"), shutdown)
        .await
        .unwrap();
    assert!(summary.stopped);
}

/// `docs/using-the-crates.md` shows `log_errors.rs` whole, as it is.
#[test]
fn the_library_page_shows_log_errors_as_it_is() {
    let root = env!("CARGO_MANIFEST_DIR");
    let page = std::fs::read_to_string(format!("{root}/../../docs/using-the-crates.md")).unwrap();
    let program = std::fs::read_to_string(format!("{root}/examples/log_errors.rs")).unwrap();
    assert!(
        page.contains(&format!("```rust\n{program}```")),
        "docs/using-the-crates.md does not show examples/log_errors.rs as it is"
    );
}
