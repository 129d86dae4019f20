//! An HTTP sink whose receiver refuses the credentials, the rights or the
//! URI: `etl run` exits 78 (docs/operations.md) naming the sink and the
//! URI, and no byte of its output (every log line on, in both log
//! formats) holds a secret.

// Helpers outside `#[test]` functions unwrap too: a panic here is a failed
// test.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

use std::process::Command;

use crate::support::BINARY;

const SECRETS: [&str; 3] = ["tok-SECRET-7", "hdr-SECRET-8", "query-SECRET-9"];

/// A receiver on 127.0.0.1 that reads each request and answers `status`;
/// it serves until the test process ends.
fn refusing(status: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                loop {
                    let mut length = 0;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let answer =
                        format!("HTTP/1.1 {status} Refused\r\ncontent-length: 7\r\n\r\nrefused");
                    if writer.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[test]
fn a_receiver_refusing_401_403_or_404_exits_78_naming_the_sink_and_uri_without_a_secret() {
    for status in [401, 403, 404] {
        let port = refusing(status);
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
    }
}
