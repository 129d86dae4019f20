//! Runs the example sink of `docs/writing-a-sink.md` as a test.

// Helpers outside `#[test]` functions unwrap too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/uppercase_sink.rs"]
mod uppercase_sink;

#[tokio::test(start_paused = true)]
async fn the_documented_example_sink_runs() {
    let (lines, dead) = uppercase_sink::run().await.unwrap();
    assert_eq!(lines, vec!["HELLO", "WORLD"]);
    let letter: serde_json::Value = serde_json::from_slice(&dead).unwrap();
    assert_eq!(letter["key"], "demo/0/1");
    assert_eq!(letter["value"], "please reject me");
}
