//! Configuration loading: defaults, path resolution, and every problem
//! reported with its place.

use std::path::Path;
use std::time::Duration;

use etl::config::{
    ByteSize, FileSinkOptions, FileSourceOptions, GeneratorOptions, StdoutSinkOptions, StoreConfig,
    TransformConfig,
};
use etl::{CompareOp, ConfigError};

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
    let config = etl::registry()
        .loader()
        .text(GOOD, Path::new("/etc/etl"))
        .unwrap();
    let Some(f) = config.source.options_of::<FileSourceOptions>("file") else {
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
    let Some(fs) = sink.kind.options_of::<FileSinkOptions>("file") else {
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
    let problems = etl::registry()
        .loader()
        .text(bad, Path::new("."))
        .unwrap_err();
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 6, "{shown:#?}");
    // The misspelled key, and the key it should have been, both reported.
    assert!(
        shown[0].starts_with("2:1: [source]:") && shown[0].contains("missing field `paths`"),
        "{shown:#?}"
    );
    assert!(
        shown[1].starts_with("4:1: [source]:") && shown[1].contains("pathz"),
        "{shown:#?}"
    );
    assert!(shown[2].starts_with("9:1: [[transforms]] #1:") && shown[2].contains("needs a value"));
    assert!(shown[3].starts_with("14:11: [[sinks]] #1:") && shown[3].contains("invalid duration"));
    assert!(
        shown[4].starts_with("17:9: [[sinks]] #2:") && shown[4].contains("teleport"),
        "{shown:#?}"
    );
    assert!(shown[5].starts_with("20:1: [checkpoint]:") && shown[5].contains("commit_interval"));
}

#[test]
fn syntax_errors_have_a_place_too() {
    let problems = etl::registry()
        .loader()
        .text("[source\ntype = 1\n", Path::new("."))
        .unwrap_err();
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].line, 1);
}

#[test]
fn missing_sections_and_exactly_once_with_fan_out_are_rejected() {
    let problems = etl::registry()
        .loader()
        .text("", Path::new("."))
        .unwrap_err();
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
    let problems = etl::registry()
        .loader()
        .text(fan_out, Path::new("."))
        .unwrap_err();
    assert!(problems[0].message.contains("single sink"), "{problems:?}");
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let err = etl::registry().loader().file(&missing).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().contains("nope.toml"));

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[source]\ntype = \"generator\"\n").unwrap();
    let err = etl::registry().loader().file(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.toml:"), "{err}");
    assert!(err.contains("at least one sink"), "{err}");
}

/// A configuration with one setting replaced: `[section]` gets `line`.
fn with_setting(section: &str, line: &str) -> String {
    let mut text = String::from(
        "[source]\ntype = \"generator\"\nrecords_per_partition = 10\n\n\
         [[sinks]]\nname = \"out\"\ntype = \"file\"\npath = \"out.ndjson\"\n",
    );
    match section {
        "[source]" => text = text.replacen("[source]\n", &format!("[source]\n{line}\n"), 1),
        "[[sinks]]" => {
            text = text.replacen("[[sinks]]\n", &format!("[[sinks]]\n{line}\n"), 1);
        }
        other => text.push_str(&format!("\n{other}\n{line}\n")),
    }
    text
}

#[test]
fn every_limit_out_of_range_is_refused_naming_its_key() {
    let cases = [
        ("[[sinks]]", "batch_max_bytes = \"0B\"", "batch_max_bytes"),
        ("[[sinks]]", "batch_max_bytes = 0", "batch_max_bytes"),
        ("[[sinks]]", "batch_max_bytes = \"0.4B\"", "batch_max_bytes"),
        ("[[sinks]]", "batch_max_records = 0", "batch_max_records"),
        ("[[sinks]]", "concurrency = 0", "concurrency"),
        ("[[sinks]]", "write_timeout = \"0s\"", "write_timeout"),
        ("[[sinks]]", "linger = \"1000000000y\"", "linger"),
        (
            "[[sinks]]",
            "retry = { max_elapsed = \"1000000000y\" }",
            "max_elapsed",
        ),
        ("[[sinks]]", "batch_max_records = -1", "batch_max_records"),
        ("[[sinks]]", "rotate_bytes = 0", "rotate_bytes"),
        ("[[sinks]]", "rotate_interval = \"0s\"", "rotate_interval"),
        (
            "[[sinks]]",
            "fsync = \"interval\"\nfsync_interval = \"0s\"",
            "fsync_interval",
        ),
        ("[source]", "max_batch_records = 0", "max_batch_records"),
        ("[source]", "partitions = 0", "partitions"),
        ("[source]", "rate = 0", "rate"),
        (
            "[limits]",
            "max_in_flight_batches = 0",
            "max_in_flight_batches",
        ),
        (
            "[limits]",
            "max_in_flight_bytes = \"0B\"",
            "max_in_flight_bytes",
        ),
        (
            "[limits]",
            "max_in_flight_batches_per_partition = 0",
            "max_in_flight_batches_per_partition",
        ),
        (
            "[limits]",
            "max_in_flight_bytes_per_partition = 0",
            "max_in_flight_bytes_per_partition",
        ),
        ("[delivery]", "max_replays = 0", "max_replays"),
        (
            "[checkpoint]",
            "commit_interval = \"0s\"",
            "commit_interval",
        ),
        (
            "[checkpoint]",
            "shutdown_timeout = \"0s\"",
            "shutdown_timeout",
        ),
        (
            "[checkpoint]",
            "revoke_deadline = \"0s\"",
            "revoke_deadline",
        ),
        (
            "[checkpoint]",
            "shutdown_timeout = \"1000000000y\"",
            "shutdown_timeout",
        ),
        (
            "[checkpoint]",
            "commit_interval = \"1000000000y\"",
            "commit_interval",
        ),
    ];
    let mut accepted = Vec::new();
    for (section, line, key) in cases {
        let text = with_setting(section, line);
        match etl::registry().loader().text(&text, Path::new(".")) {
            Ok(_) => accepted.push(format!("{section} {line}")),
            Err(problems) => {
                let named = problems.iter().any(|p| p.message.contains(key));
                assert!(
                    named,
                    "{section} {line}: no problem names {key}: {problems:?}"
                );
                let at_key = problems.iter().any(|p| {
                    text.lines()
                        .nth(p.line - 1)
                        .is_some_and(|l| l.contains(key))
                });
                assert!(
                    at_key,
                    "{section} {line}: not pointed at its line: {problems:?}"
                );
            }
        }
    }
    assert!(accepted.is_empty(), "accepted: {accepted:#?}");
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
        let problems = etl::registry()
            .loader()
            .text(&config, Path::new("."))
            .unwrap_err();
        assert_eq!(problems.len(), 1, "{option}: {problems:?}");
        assert!(
            problems[0].message.contains(option),
            "{option}: {problems:?}"
        );
    }
}

/// A bad value in a section does not hide the section's other problems:
/// each is reported in the same run, type errors and ranges alike.
#[test]
fn every_problem_of_one_section_is_reported_not_only_the_first_type_error() {
    let bad = r#"
[source]
type = "file"
paths = ["in.ndjson"]
max_batch_records = 0
max_line_bytes = "banana"

[[sinks]]
type = "file"
path = "out.ndjson"
linger = 5
concurrency = 0
"#;
    let problems = etl::registry()
        .loader()
        .text(bad, Path::new("."))
        .unwrap_err();
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(problems.len(), 4, "{shown:#?}");
    assert!(
        shown[0].starts_with("5:1: [source]:") && shown[0].contains("max_batch_records"),
        "{shown:#?}"
    );
    assert!(
        shown[1].starts_with("6:") && shown[1].contains("banana"),
        "{shown:#?}"
    );
    assert!(
        shown[2].starts_with("11:") && shown[2].contains("linger"),
        "{shown:#?}"
    );
    assert!(
        shown[3].starts_with("12:") && shown[3].contains("concurrency"),
        "{shown:#?}"
    );
}

#[test]
fn an_option_left_out_takes_the_default_of_the_rust_setting_it_becomes() {
    let config = etl::registry()
        .loader()
        .text(
            r#"
[source]
type = "file"
paths = ["in.ndjson"]

[[sinks]]
type = "blackhole"
"#,
            Path::new("/base"),
        )
        .unwrap();
    let Some(file) = config.source.options_of::<FileSourceOptions>("file") else {
        panic!("not a file source: {:?}", config.source);
    };
    let rust = etl_source::FileSourceConfig::default();
    assert_eq!(file.max_batch_records, rust.max_batch_records);
    assert_eq!(file.max_line_bytes.0, rust.max_line_bytes as u64);
    assert_eq!(file.max_open_files, rust.max_open_files);
    assert_eq!(file.format, rust.format);
    assert_eq!(file.eof, rust.eof);
    assert_eq!(file.on_replaced, rust.on_replaced);

    assert_eq!(
        config.sinks[0].options.driver_config(),
        etl_sink::SinkDriverConfig::default()
    );

    let checkpoint = etl_checkpoint::CheckpointConfig::default();
    assert_eq!(
        config.checkpoint.commit_interval,
        checkpoint.commit_interval
    );
    assert_eq!(
        config.checkpoint.revoke_deadline,
        checkpoint.revoke_deadline
    );
    assert_eq!(
        config.checkpoint.shutdown_timeout,
        checkpoint.shutdown_timeout
    );
    let limits = checkpoint.limits;
    assert_eq!(
        config.limits.max_in_flight_batches,
        limits.max_in_flight_batches
    );
    assert_eq!(
        config.limits.max_in_flight_bytes.0,
        limits.max_in_flight_bytes
    );
    assert_eq!(
        config.limits.max_in_flight_batches_per_partition,
        limits.max_in_flight_batches_per_partition
    );
    assert_eq!(
        config.limits.max_in_flight_bytes_per_partition.0,
        limits.max_in_flight_bytes_per_partition
    );

    let driver = etl_source::SourceDriverConfig::default();
    assert_eq!(config.delivery.max_replays, driver.max_replays);
    assert_eq!(config.delivery.poison, driver.poison);

    let generator = etl::registry()
        .loader()
        .text(
            "[source]\ntype = \"generator\"\n[[sinks]]\ntype = \"blackhole\"\n",
            Path::new("/base"),
        )
        .unwrap();
    let Some(g) = generator.source.options_of::<GeneratorOptions>("generator") else {
        panic!("not a generator: {:?}", generator.source);
    };
    let rust = etl_source::GeneratorConfig::default();
    assert_eq!(g.max_batch_records, rust.max_batch_records);
    assert_eq!(g.partitions, rust.partitions);

    let stdout = etl::registry()
        .loader()
        .text(
            "[source]\ntype = \"generator\"\n[[sinks]]\ntype = \"stdout\"\n",
            Path::new("/base"),
        )
        .unwrap();
    let Some(s) = stdout.sinks[0]
        .kind
        .options_of::<StdoutSinkOptions>("stdout")
    else {
        panic!("not a stdout sink: {:?}", stdout.sinks[0].kind);
    };
    assert_eq!(
        s.allow_null_device,
        etl_sink::StdoutSinkConfig::default().allow_null_device
    );
}

#[test]
fn a_renamed_option_points_to_its_new_name() {
    let cases = [
        (
            "[source]\ntype = \"file\"\npaths = [\"in\"]\nbatch_records = 10\n",
            "renamed to max_batch_records",
        ),
        (
            "[source]\ntype = \"file\"\npaths = [\"in\"]\n[[sinks]]\ntype = \"blackhole\"\ntimeout = \"1s\"\n",
            "renamed to write_timeout",
        ),
        (
            "[source]\ntype = \"file\"\npaths = [\"in\"]\n[[sinks]]\ntype = \"blackhole\"\nretry_max_elapsed = \"1s\"\n",
            "renamed to retry.max_elapsed",
        ),
    ];
    for (text, hint) in cases {
        let text = if text.contains("[[sinks]]") {
            text.to_owned()
        } else {
            format!("{text}[[sinks]]\ntype = \"blackhole\"\n")
        };
        let problems = etl::registry()
            .loader()
            .text(&text, Path::new("/base"))
            .unwrap_err();
        assert!(
            problems.iter().any(|p| p.message.contains(hint)),
            "{hint}: {problems:?}"
        );
    }
}

#[test]
fn a_sink_retry_table_sets_the_whole_retry_policy() {
    let config = etl::registry()
        .loader()
        .text(
            r#"
[source]
type = "file"
paths = ["in.ndjson"]

[[sinks]]
type = "blackhole"
write_timeout = "2s"
retry = { initial_backoff = "10ms", max_backoff = "1s", max_elapsed = "5s", max_retries = 7 }
"#,
            Path::new("/base"),
        )
        .unwrap();
    let driver = config.sinks[0].options.driver_config();
    assert_eq!(driver.write_timeout, Some(Duration::from_secs(2)));
    assert_eq!(
        driver.retry,
        etl_sink::RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
            max_elapsed: Duration::from_secs(5),
            max_retries: Some(7),
        }
    );
}

/// Whether `problems` holds one at `line` that names `old` and points to
/// `new`.
#[cfg(any(feature = "kafka", feature = "postgres"))]
fn renamed_at(problems: &[etl::ConfigProblem], line: usize, old: &str, new: &str) -> bool {
    problems.iter().any(|p| {
        p.line == line
            && p.message.contains(old)
            && p.message.contains(&format!("renamed to {new}"))
    })
}

#[cfg(feature = "kafka")]
#[test]
fn kafka_durations_are_written_with_their_unit_and_the_old_names_point_to_the_new_ones() {
    let config = etl::registry()
        .loader()
        .text(
            r#"
[source]
type = "kafka"
brokers = "127.0.0.1:9"
group_id = "g"
topics = ["in"]
session_timeout = "6s"
heartbeat_interval = "1s"
commit_timeout = "500ms"

[[sinks]]
type = "kafka"
brokers = "127.0.0.1:9"
topic = "out"
message_timeout = "2s"

[checkpoint]
revoke_deadline = "3s"
"#,
            Path::new("/base"),
        )
        .unwrap();
    let source = config
        .source
        .options_of::<etl_kafka::KafkaSourceConfig>("kafka")
        .unwrap();
    assert_eq!(source.session_timeout, Duration::from_secs(6));
    assert_eq!(source.heartbeat_interval, Duration::from_secs(1));
    assert_eq!(source.commit_timeout, Duration::from_millis(500));
    let sink = config.sinks[0]
        .kind
        .options_of::<etl_kafka::KafkaSinkConfig>("kafka")
        .unwrap();
    assert_eq!(sink.message_timeout, Duration::from_secs(2));

    let problems = etl::registry()
        .loader()
        .text(
            r#"
[source]
type = "kafka"
brokers = "127.0.0.1:9"
group_id = "g"
topics = ["in"]
session_timeout_ms = 6000

[[sinks]]
type = "kafka"
brokers = "127.0.0.1:9"
topic = "out"
message_timeout_ms = 2000
"#,
            Path::new("/base"),
        )
        .unwrap_err();
    assert!(
        renamed_at(&problems, 7, "session_timeout_ms", "session_timeout"),
        "{problems:#?}"
    );
    assert!(
        renamed_at(&problems, 13, "message_timeout_ms", "message_timeout"),
        "{problems:#?}"
    );
}

#[cfg(feature = "postgres")]
#[test]
fn the_postgres_connect_timeout_is_a_duration_and_its_old_name_points_to_it() {
    let sink = |line: &str| {
        format!(
            "[source]\ntype = \"generator\"\n\n[[sinks]]\ntype = \"postgres\"\n\
             url = \"postgres://etl@127.0.0.1:9/shop\"\ntable = \"orders\"\n{line}\n"
        )
    };
    let config = etl::registry()
        .loader()
        .text(&sink("connect_timeout = \"3s\""), Path::new("/base"))
        .unwrap();
    let read = config.sinks[0]
        .kind
        .options_of::<etl_postgres::PostgresSinkConfig>("postgres")
        .unwrap();
    assert_eq!(read.connect_timeout, Duration::from_secs(3));

    let problems = etl::registry()
        .loader()
        .text(&sink("connect_timeout_secs = 3"), Path::new("/base"))
        .unwrap_err();
    assert!(
        renamed_at(&problems, 8, "connect_timeout_secs", "connect_timeout"),
        "{problems:#?}"
    );
}
