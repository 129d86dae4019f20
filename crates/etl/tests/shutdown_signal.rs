//! `etl::shutdown_signal` against a real signal: this test binary sends
//! itself SIGINT and SIGTERM. (The second-signal abort is covered by the
//! unit tests of `signal.rs`, which do not end the process.)
#![cfg(unix)]

use std::process::Command;
use std::time::Duration;

fn kill_self(name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(std::process::id().to_string())
        .status()
        .expect("kill runs");
    assert!(status.success());
}

#[tokio::test]
async fn the_first_signal_cancels_the_token() {
    let token = etl::shutdown_signal().unwrap();
    assert!(!token.is_cancelled());
    kill_self("INT");
    tokio::time::timeout(Duration::from_secs(60), token.cancelled())
        .await
        .expect("SIGINT cancels the token");
}
