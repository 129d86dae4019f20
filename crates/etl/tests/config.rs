//! Configuration loading: defaults, path resolution, and every problem
//! reported with its place.

use std::path::Path;
use std::time::Duration;

use etl::{
    ByteSize, CompareOp, ConfigError, SinkKind, SourceConfig, StoreConfig, TransformConfig,
    load_config, parse_config,
};

const GOOD: &str = r#"
[source]
type = "file"
paths = ["in/*.ndjson"]

[[transforms]]
type = "parse_json"

[[transforms]]
type = "filter"
field = "amount"
op = ">="
value = 10

[[sinks]]
name = "out"
type = "file"
path = "out/records.ndjson"
batch_max_bytes = "1MiB"
linger = "20ms"

[dead_letter]
type = "file"
path = "out/dead.ndjson"

[limits]
max_in_flight_bytes = "8MiB"

[checkpoint]
commit_interval = "250ms"
"#;

#[test]
fn a_good_config_loads_with_defaults_and_resolved_paths() {
    let config = parse_config(GOOD, Path::new("/etc/etl")).unwrap();
    let SourceConfig::File(f) = &config.source else {
        panic!("file source expected")
    };
    assert_eq!(f.paths, vec!["/etc/etl/in/*.ndjson"]);
    assert_eq!(config.transforms.len(), 2);
    assert!(matches!(
        config.transforms[1],
        TransformConfig::Filter {
            op: CompareOp::Ge,
            ..
        }
    ));
    let sink = &config.sinks[0];
    assert_eq!(sink.name, "out");
    assert_eq!(sink.options.batch_max_bytes, ByteSize(1 << 20));
    assert_eq!(sink.options.linger, Duration::from_millis(20));
    let SinkKind::File(fs) = &sink.kind else {
        panic!("file sink expected")
    };
    assert_eq!(fs.path, Path::new("/etc/etl/out/records.ndjson"));
    assert_eq!(config.limits.max_in_flight_bytes, ByteSize(8 << 20));
    assert_eq!(
        config.checkpoint.commit_interval,
        Duration::from_millis(250)
    );
    assert_eq!(
        config.checkpoint.store,
        StoreConfig::File {
            path: "/etc/etl/.etl-state".into()
        }
    );
}

#[test]
fn every_problem_is_reported_with_its_line() {
    let bad = r#"
[source]
type = "file"
pathz = ["x"]

[[transforms]]
type = "filter"
field = "a"
op = ">"

[[sinks]]
type = "file"
path = "o"
linger = "soon"

[[sinks]]
type = "teleport"

[checkpoint]
commit_interval = "0s"
"#;
    let problems = parse_config(bad, Path::new(".")).unwrap_err();
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 5, "{shown:#?}");
    assert!(
        shown[0].starts_with("4:1: [source]:") && shown[0].contains("pathz"),
        "{shown:#?}"
    );
    assert!(shown[1].starts_with("9:1: [[transforms]] #1:") && shown[1].contains("needs a value"));
    assert!(shown[2].starts_with("14:11: [[sinks]] #1:") && shown[2].contains("invalid duration"));
    assert!(
        shown[3].starts_with("17:9: [[sinks]] #2:") && shown[3].contains("teleport"),
        "{shown:#?}"
    );
    assert!(shown[4].starts_with("20:1: [checkpoint]:") && shown[4].contains("commit_interval"));
}

#[test]
fn syntax_errors_have_a_place_too() {
    let problems = parse_config("[source\ntype = 1\n", Path::new(".")).unwrap_err();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].line, 1);
}

#[test]
fn missing_sections_and_exactly_once_with_fan_out_are_rejected() {
    let problems = parse_config("", Path::new(".")).unwrap_err();
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert!(
        text.iter().any(|p| p.contains("missing [source]")),
        "{text:?}"
    );
    assert!(
        text.iter().any(|p| p.contains("at least one sink")),
        "{text:?}"
    );

    let fan_out = r#"
[source]
type = "generator"
records_per_partition = 1
[[sinks]]
type = "file"
path = "a"
exactly_once = true
[[sinks]]
type = "blackhole"
"#;
    let problems = parse_config(fan_out, Path::new(".")).unwrap_err();
    assert!(problems[0].message.contains("single sink"), "{problems:?}");
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let err = load_config(&missing).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().contains("nope.toml"));

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[source]\ntype = \"generator\"\n").unwrap();
    let err = load_config(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.toml:"), "{err}");
    assert!(err.contains("at least one sink"), "{err}");
}

#[test]
fn zero_sink_limits_are_refused() {
    for (option, value) in [
        ("batch_max_bytes", "\"0B\""),
        ("batch_max_records", "0"),
        ("concurrency", "0"),
        ("timeout", "\"0s\""),
    ] {
        let config = format!(
            "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n\
             [[sinks]]\ntype = \"blackhole\"\n{option} = {value}\n"
        );
        let problems = parse_config(&config, Path::new(".")).unwrap_err();
        assert_eq!(problems.len(), 1, "{option}: {problems:?}");
        assert!(
            problems[0].message.contains(option),
            "{option}: {problems:?}"
        );
    }
}
