//! `etl validate` checks a Kafka section as `etl run` opens it: known
//! property names, value types, values librdkafka refuses alone or when
//! the client is created, without connecting; each problem at its
//! property's line, exit 78 from both commands.

// Helpers outside `#[test]` functions unwrap too.
#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

use crate::support::BINARY;

fn etl(command: &str, config: &Path) -> Output {
    Command::new(BINARY)
        .arg(command)
        .arg(config)
        .output()
        .unwrap()
}

fn write(dir: &Path, text: &str) -> std::path::PathBuf {
    let config = dir.join("kafka.toml");
    std::fs::write(&config, text).unwrap();
    config
}

const SOURCE: &str = r#"[source]
type = "kafka"
brokers = "127.0.0.1:1"
group_id = "g"
topics = ["orders"]

[source.properties]
"fetch.min.bytes" = 1
"sasl.passwd" = "x"
"linger.ms" = "soon"
"security.protocol" = "sasl_plaintext"
"session.timeout.ms" = "6000"

[[sinks]]
type = "kafka"
brokers = "127.0.0.1:1"
topic = "out"
properties = { "compression.codec" = "rar", "max.in.flight.requests.per.connection" = 100 }

[dead_letter]
type = "kafka"
brokers = "127.0.0.1:1"
topic = "dead"
properties."sasl.pwd" = "x"
"#;

#[test]
fn bad_properties_are_refused_at_their_line_by_validate_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), SOURCE);
    for command in ["validate", "run"] {
        let out = etl(command, &config);
        assert_eq!(out.status.code(), Some(78), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        for expected in [
            "kafka.toml:9:1: [source]: kafka: properties.\"sasl.passwd\": librdkafka has no such property",
            "kafka.toml:10:1: [source]: kafka: properties.\"linger.ms\": librdkafka refuses it",
            "kafka.toml:12:1: [source]: kafka: properties.\"session.timeout.ms\": is set by the connector",
            "kafka.toml:18:16: [[sinks]] #1: kafka: properties.\"compression.codec\": librdkafka refuses it",
            "kafka.toml:24:12: [dead_letter]: kafka: properties.\"sasl.pwd\": librdkafka has no such property",
        ] {
            assert!(stderr.contains(expected), "{command}: {expected}\n{stderr}");
        }
    }
}

#[test]
fn values_only_the_client_refuses_are_caught_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // Each value is valid alone; the idempotent producer allows at most 5
    // requests in flight, which only creating the client checks.
    let config = write(
        dir.path(),
        "[source]\ntype = \"generator\"\n\n[[sinks]]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:1\"\n\
         topic = \"out\"\nproperties = { \"max.in.flight.requests.per.connection\" = 10 }\n",
    );
    for command in ["validate", "run"] {
        let out = etl(command, &config);
        assert_eq!(out.status.code(), Some(78), "{command}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("kafka.toml:8:16: [[sinks]] #1") && stderr.contains("max.in.flight"),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn a_revoke_deadline_past_the_session_timeout_is_a_validation_problem() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "[source]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:1\"\ngroup_id = \"g\"\ntopics = [\"t\"]\n\
         session_timeout = \"6s\"\nheartbeat_interval = \"1s\"\n\n[[sinks]]\ntype = \"blackhole\"\n\n\
         [checkpoint]\nrevoke_deadline = \"5s\"\n",
    );
    let out = etl("validate", &config);
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("kafka.toml:13:1: [checkpoint]: [checkpoint] revoke_deadline = 5s"),
        "{stderr}"
    );
}

#[test]
fn validate_connects_to_no_broker() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let broker = listener.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        &format!(
            "[source]\ntype = \"kafka\"\nbrokers = \"{broker}\"\ngroup_id = \"g\"\ntopics = [\"t\"]\n\
             [source.properties]\n\"linger.ms\" = 5\n\n[[sinks]]\ntype = \"kafka\"\n\
             brokers = \"{broker}\"\ntopic = \"out\"\n"
        ),
    );
    let out = etl("validate", &config);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The process has exited: a connection it made would be waiting in the
    // listener's backlog.
    listener.set_nonblocking(true).unwrap();
    let accepted = listener.accept().map(|_| ()).map_err(|e| e.kind());
    assert_eq!(accepted, Err(std::io::ErrorKind::WouldBlock));
}
