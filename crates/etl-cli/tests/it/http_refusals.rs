//! An HTTP sink whose receiver refuses the credentials, the rights or the
//! URI: `etl run` exits 78 (docs/operations.md) naming the sink and the
//! URI, and no byte of its output (every log line on, in both log
//! formats) holds a secret.

// Helpers outside `#[test]` functions unwrap too: a panic here is a failed
// test.
#![allow(clippy::unwrap_used)]

use std::process::Command;

use crate::support::{BINARY, http_receiver};

const SECRETS: [&str; 3] = ["tok-SECRET-7", "hdr-SECRET-8", "query-SECRET-9"];

#[test]
fn a_receiver_refusing_401_403_or_404_exits_78_naming_the_sink_and_uri_without_a_secret() {
    for status in [401, 403, 404] {
        let (port, received) = http_receiver(status);
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("http.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[source]
type = "generator"
partitions = 1
records_per_partition = 50

[[sinks]]
type = "http"
name = "search"
uri = "http://127.0.0.1:{port}/orders/_bulk?key={query}"
encoding = "elasticsearch_bulk"
headers = {{ "X-Api-Key" = "{header}" }}
auth = {{ strategy = "bearer", token = "{token}" }}
"#,
                query = SECRETS[2],
                header = SECRETS[1],
                token = SECRETS[0],
            ),
        )
        .unwrap();
        for format in ["json", "text"] {
            let out = Command::new(BINARY)
                .args(["--log-format", format, "run"])
                .arg(&config)
                .env("ETL_LOG", "trace")
                .output()
                .expect("etl runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(78), "{status} {format}: {stderr}");
            assert!(
                stderr.contains("search")
                    && stderr.contains(&format!("http://127.0.0.1:{port}/orders/_bulk"))
                    && stderr.contains(&status.to_string()),
                "{status} {format}: {stderr}"
            );
            for secret in SECRETS {
                assert!(
                    !out.stdout
                        .windows(secret.len())
                        .any(|w| w == secret.as_bytes())
                        && !out
                            .stderr
                            .windows(secret.len())
                            .any(|w| w == secret.as_bytes()),
                    "{status} {format}: {secret} printed:\n{stdout}\n{stderr}"
                );
            }
        }
        // Each run sent its first request and stopped at the refusal: no
        // retry of it.
        let received = received.lock().unwrap().clone();
        assert!(
            (2..=4).contains(&received.len()),
            "{status}: {} requests",
            received.len()
        );
        for request in received {
            assert!(
                request.head.starts_with("post /orders/_bulk?key="),
                "{:?}",
                request.head.lines().next()
            );
            assert!(request.body.starts_with(b"{\"index\":{}}\n"));
        }
    }
}
