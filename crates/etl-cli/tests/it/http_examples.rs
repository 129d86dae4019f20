//! The examples of docs/http.md as written there, run by `etl` against a
//! receiver on 127.0.0.1: what the service would get.

// Helpers outside `#[test]` functions unwrap too: a panic here is a failed
// test.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::support::{BINARY, http_receiver};

/// The TOML block of docs/http.md that follows the line starting with
/// `title`.
fn example(title: &str) -> String {
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/http.md");
    let text = std::fs::read_to_string(docs).unwrap();
    let after = &text[text.find(&format!("\n{title}")).unwrap()..];
    let start = after.find("```toml\n").unwrap() + "```toml\n".len();
    let end = start + after[start..].find("```").unwrap();
    after[start..end].to_owned()
}

#[test]
fn the_loki_example_pushes_each_record_alone_as_a_json_stream() {
    let (port, received) = http_receiver(204);
    let dir = tempfile::tempdir().unwrap();
    let mut input = String::new();
    for id in 0..30 {
        // A level, a null one, or none.
        let level = match id % 3 {
            0 => ",\"level\":\"warn\"",
            1 => ",\"level\":null",
            _ => "",
        };
        input.push_str(&format!("{{\"id\":{id}{level}}}\n"));
    }
    std::fs::write(dir.path().join("in.ndjson"), input).unwrap();
    let pipeline = example("**Loki**").replace(
        "http://loki:3100/loki/api/v1/push",
        &format!("http://127.0.0.1:{port}/loki/api/v1/push"),
    );
    let config = dir.path().join("loki.toml");
    std::fs::write(
        &config,
        format!("[source]\ntype = \"file\"\npaths = [\"in.ndjson\"]\n\n{pipeline}"),
    )
    .unwrap();
    let out = Command::new(BINARY)
        .arg("run")
        .arg(&config)
        .env("LOKI_PASSWORD", "loki-SECRET-5")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        !stderr.contains("loki-SECRET-5")
            && !String::from_utf8_lossy(&out.stdout).contains("loki-SECRET-5")
    );
    let received = received.lock().unwrap().clone();
    assert_eq!(received.len(), 30, "one record a request");
    let mut ids = Vec::new();
    for request in &received {
        assert!(
            request.head.starts_with("post /loki/api/v1/push "),
            "{:?}",
            request.head.lines().next()
        );
        let types: Vec<&str> = request
            .head
            .lines()
            .filter(|l| l.starts_with("content-type:"))
            .collect();
        assert_eq!(
            types,
            ["content-type: application/json"],
            "{:?}",
            request.head.lines().next()
        );
        // `tenant-1:loki-SECRET-5` in base64 (the head is kept in lower
        // case).
        assert!(
            request
                .head
                .contains("authorization: basic dgvuyw50lte6bg9ras1trunsrvqtnq==\r\n"),
            "{:?}",
            request.head.lines().next()
        );
        let push: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
        let streams = push["streams"].as_array().unwrap();
        assert_eq!(streams.len(), 1, "{push}");
        assert_eq!(streams[0]["stream"]["job"], "orders");
        let values = streams[0]["values"].as_array().unwrap();
        assert_eq!(values.len(), 1, "{push}");
        let ns: u128 = values[0][0].as_str().unwrap().parse().unwrap();
        assert!(ns > 1_600_000_000_000_000_000, "{push}");
        let line: serde_json::Value = serde_json::from_str(values[0][1].as_str().unwrap()).unwrap();
        let id = line["id"].as_i64().unwrap();
        let level = if id % 3 == 0 { "warn" } else { "info" };
        assert_eq!(streams[0]["stream"]["level"], level, "{push}");
        ids.push(id);
    }
    ids.sort_unstable();
    assert_eq!(ids, (0..30).collect::<Vec<_>>());
}
