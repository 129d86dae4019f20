//! What the suites share: the `etl` binary cargo built for this test run,
//! and the usual ways of running it.

use std::path::Path;
use std::process::{Command, Output};

/// The `etl` binary cargo built for this test run (always up to date with
/// the sources: cargo builds a package's binaries before its tests).
pub(crate) const BINARY: &str = env!("CARGO_BIN_EXE_etl");

/// `etl` logging JSON lines, which the suites read from standard error.
pub(crate) fn etl() -> Command {
    let mut cmd = Command::new(BINARY);
    cmd.arg("--log-format").arg("json");
    cmd
}

/// `etl run <config>` to its end.
pub(crate) fn run(config: &Path) -> Output {
    etl().arg("run").arg(config).output().expect("etl runs")
}

/// One request an [`http_receiver`] read: its head (lower case) and body.
#[cfg(feature = "http")]
#[derive(Clone, Debug)]
pub(crate) struct Received {
    pub(crate) head: String,
    pub(crate) body: Vec<u8>,
}

/// An HTTP/1.1 receiver on 127.0.0.1 that reads each request, keeps it
/// and answers `status`; it serves until the test process ends. Its port
/// and what it received.
#[cfg(feature = "http")]
pub(crate) fn http_receiver(status: u16) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<Received>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::{Arc, Mutex};

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("its address").port();
    let received = Arc::new(Mutex::new(Vec::new()));
    let kept = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let kept = kept.clone();
            std::thread::spawn(move || {
                let Ok(mut writer) = stream.try_clone() else {
                    return;
                };
                let mut reader = BufReader::new(stream);
                loop {
                    let mut head = String::new();
                    let mut length = 0;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        head.push_str(&lower);
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    if let Ok(mut kept) = kept.lock() {
                        kept.push(Received { head, body });
                    }
                    let text = if (200..300).contains(&status) {
                        ""
                    } else {
                        "refused"
                    };
                    let answer = format!(
                        "HTTP/1.1 {status} Status\r\ncontent-length: {}\r\n\r\n{text}",
                        text.len()
                    );
                    if writer.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, received)
}
