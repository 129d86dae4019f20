//! A known secret, `Zq9SecretPw`, in every failing configuration we can
//! build (bad Kafka property values, misspelled and mistyped keys, an
//! unreachable broker, unset variables, PostgreSQL URLs and connection
//! strings with passwords, an object store's S3, GCS and Azure keys,
//! ...): `etl validate` and `etl run`, with every
//! log line on (`ETL_LOG=trace`, librdkafka's `debug = "all"` where it
//! applies) in both log formats, print it in no byte of their output. And
//! `{:?}` of every configuration type holding it leaves it out.

// Helpers outside `#[test]` functions unwrap too: a panic here is a failed
// test.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::BINARY;

use secrecy::ExposeSecret;
use serde::Deserialize;

const SECRET: &str = "Zq9SecretPw";

/// One failing configuration.
struct Case {
    name: &'static str,
    /// A PostgreSQL sink's case: what it prints is the connector's.
    postgres: bool,
    /// The TOML file.
    toml: String,
    /// Environment variables for the command.
    env: Vec<(&'static str, &'static str)>,
    /// What `etl validate` must exit with, where that is settled.
    validate: Option<i32>,
    /// Strings that must not appear either (parts of a secret).
    also_secret: Vec<&'static str>,
}

fn case(name: &'static str, toml: impl Into<String>) -> Case {
    let toml = toml.into();
    Case {
        name,
        postgres: toml.contains("type = \"postgres\""),
        toml,
        env: Vec::new(),
        validate: Some(78),
        also_secret: Vec::new(),
    }
}

/// A Kafka source against a port nobody listens on, with `extra` in its
/// `[source.properties]`.
fn kafka_source(extra: &str) -> String {
    format!(
        r#"
[source]
type = "kafka"
brokers = "127.0.0.1:1"
group_id = "secrets"
topics = ["orders"]
session_timeout = "6s"
heartbeat_interval = "1s"
commit_timeout = "500ms"

[source.properties]
{extra}

[[sinks]]
type = "blackhole"

[checkpoint]
revoke_deadline = "1s"
shutdown_timeout = "2s"
"#
    )
}

/// A generator into a Kafka sink against a port nobody listens on.
fn kafka_sink(extra: &str) -> String {
    format!(
        r#"
[source]
type = "generator"
records_per_partition = 3

[[sinks]]
type = "kafka"
brokers = "127.0.0.1:1"
topic = "out"
message_timeout = "500ms"
write_timeout = "2s"
retry = {{ max_elapsed = "1s" }}

[sinks.properties]
{extra}

[delivery]
on_failure = "halt"

[checkpoint]
store = {{ type = "memory" }}
shutdown_timeout = "2s"
"#
    )
}

/// A generator into a PostgreSQL sink.
fn postgres(table: &str) -> String {
    format!(
        r#"
[source]
type = "generator"
records_per_partition = 3

[[sinks]]
name = "db"
type = "postgres"
table = "orders"
columns = [{{ name = "id", type = "bigint" }}]
{table}

[checkpoint]
store = {{ type = "memory" }}
shutdown_timeout = "2s"
"#
    )
}

fn cases() -> Vec<Case> {
    let mut cases = vec![
        case(
            "a key password librdkafka refuses",
            kafka_source(&format!(
                "\"ssl.key.password\" = \"{SECRET}\"\n\"security.protocol\" = \"bogus\""
            )),
        ),
        case(
            "a misspelled password property",
            kafka_source(&format!("\"sasl.passwd\" = \"{SECRET}\"")),
        ),
        case(
            "a misspelled password property of a sink",
            kafka_sink(&format!("\"sasl.pasword\" = \"{SECRET}\"")),
        ),
        case(
            "a password of the wrong type",
            kafka_source(&format!("\"sasl.password\" = [\"{SECRET}\"]")),
        ),
        Case {
            also_secret: vec!["918273645546372819"],
            ..case(
                "passwords written as numbers, one misspelled",
                kafka_source(
                    "\"sasl.password\" = 918273645546372819\n\"sasl.passwd\" = 918273645546372819",
                ),
            )
        },
        case(
            "an unterminated password string",
            kafka_source(&format!("\"sasl.password\" = \"{SECRET}")),
        ),
        case(
            "an unquoted password",
            kafka_source(&format!("\"sasl.password\" = {SECRET}")),
        ),
        case(
            "a password with a bad escape",
            kafka_source(&format!("\"sasl.password\" = \"{SECRET}\\q{SECRET}\"")),
        ),
        case(
            "a password set twice",
            kafka_source(&format!(
                "\"sasl.password\" = \"{SECRET}\"\n\"sasl.password\" = \"{SECRET}\""
            )),
        ),
        case(
            "a password in an inline table",
            kafka_source(&format!("\"sasl.password\" = {{ value = \"{SECRET}\" }}")),
        ),
        case(
            "secrets beside an unknown key",
            kafka_source(&format!(
                "\"sasl.password\" = \"{SECRET}\"\n\"ssl.key.pem\" = \"{SECRET}\"\n\
                 \"sasl.oauthbearer.client.secret\" = \"{SECRET}\"\n\"no.such.thing\" = \"1\""
            )),
        ),
        case(
            "a SASL password with a mechanism the client refuses",
            kafka_source(&format!(
                "\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"NOPE\"\n\
                 \"sasl.username\" = \"etl\"\n\"sasl.password\" = \"{SECRET}\""
            )),
        ),
        case(
            "an OAUTHBEARER client secret without its token endpoint",
            kafka_source(&format!(
                "\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"OAUTHBEARER\"\n\
                 \"sasl.oauthbearer.method\" = \"oidc\"\n\"sasl.oauthbearer.client.id\" = \"etl\"\n\
                 \"sasl.oauthbearer.client.secret\" = \"{SECRET}\""
            )),
        ),
        case(
            "a revoke deadline past the session timeout, beside a password",
            kafka_source(&format!("\"sasl.password\" = \"{SECRET}\""))
                .replace("revoke_deadline = \"1s\"", "revoke_deadline = \"10s\""),
        ),
        case(
            "an unset variable beside a password",
            kafka_source(&format!(
                "\"sasl.password\" = \"{SECRET}\"\n\"sasl.username\" = \"${{UNSET_KAFKA_USER}}\""
            )),
        ),
        Case {
            env: vec![("KAFKA_PASSWORD", SECRET)],
            ..case(
                "a secret variable put where it does not belong",
                kafka_source("\"sasl.password\" = \"${KAFKA_PASSWORD}\"")
                    .replace("type = \"kafka\"", "type = \"${KAFKA_PASSWORD}\""),
            )
        },
        Case {
            env: vec![("KAFKA_PASSWORD", SECRET)],
            ..case(
                "a secret variable in a misspelled property",
                kafka_sink("\"sasl.passwrd\" = \"${KAFKA_PASSWORD}\""),
            )
        },
        Case {
            env: vec![("API_TOKEN", SECRET)],
            validate: Some(0),
            ..case(
                "a secret variable in a VRL program that VRL warns about",
                "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n\n\
                 [[transforms]]\ntype = \"remap\"\n\
                 source = '''\nunused = \"${API_TOKEN}\"\n.seen = true\n'''\n\n\
                 [[sinks]]\ntype = \"blackhole\"\n\n\
                 [checkpoint]\nstore = { type = \"memory\" }\n",
            )
        },
        Case {
            validate: Some(0),
            ..case(
                "an unreachable broker, SASL and every librdkafka log line",
                kafka_source(&format!(
                    "\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"PLAIN\"\n\
                     \"sasl.username\" = \"etl\"\n\"sasl.password\" = \"{SECRET}\"\n\"debug\" = \"all\""
                )),
            )
        },
        Case {
            validate: Some(0),
            ..case(
                "a sink's unreachable broker, SASL and every librdkafka log line",
                kafka_sink(&format!(
                    "\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"PLAIN\"\n\
                     \"sasl.username\" = \"etl\"\n\"sasl.password\" = \"{SECRET}\"\n\"debug\" = \"all\""
                )),
            )
        },
        Case {
            env: vec![("KAFKA_PASSWORD", SECRET)],
            validate: Some(0),
            ..case(
                "a password from the environment, an unreachable broker",
                kafka_sink(
                    "\"security.protocol\" = \"SASL_PLAINTEXT\"\n\"sasl.mechanism\" = \"PLAIN\"\n\
                     \"sasl.username\" = \"etl\"\n\"sasl.password\" = \"${KAFKA_PASSWORD}\"",
                ),
            )
        },
        // PostgreSQL: the connector redacts what it prints; the
        // configuration layer holds the table as a secret.
        Case {
            validate: None,
            ..case(
                "a URL with ?password= and an unknown option",
                postgres(&format!(
                    "url = \"postgres://etl@127.0.0.1:1/db?password={SECRET}&bogus_opt=1\""
                )),
            )
        },
        Case {
            validate: None,
            ..case(
                "a URL with user:password@ and a bad port",
                postgres(&format!(
                    "url = \"postgres://etl:{SECRET}@127.0.0.1:notaport/db\""
                )),
            )
        },
        Case {
            validate: None,
            ..case(
                "a connection string with password = x and a bad port",
                postgres(&format!(
                    "url = \"host=127.0.0.1 port=notaport user=etl password = {SECRET}\""
                )),
            )
        },
        Case {
            validate: None,
            also_secret: vec!["SecretPw"],
            ..case(
                "a connection string with a quoted password",
                postgres("url = \"host=127.0.0.1 port=notaport user=etl password='Zq9 SecretPw'\""),
            )
        },
        Case {
            validate: None,
            ..case(
                "a password field beside a mistyped one",
                postgres(&format!(
                    "url = \"postgres://etl@127.0.0.1:1/db\"\npassword = \"{SECRET}\"\nmethod = 5"
                )),
            )
        },
        Case {
            env: vec![(
                "DATABASE_URL",
                "postgres://etl@127.0.0.1:1/db?password=Zq9SecretPw&bogus_opt=1",
            )],
            validate: None,
            ..case(
                "DATABASE_URL with ?password= and an unknown option",
                postgres(""),
            )
        },
        Case {
            env: vec![("PG_URL", "postgres://etl:Zq9SecretPw@127.0.0.1:notaport/db")],
            validate: None,
            ..case("a URL from a variable", postgres("url = \"${PG_URL}\""))
        },
        // Misspelled and unknown options: the parser's messages name the
        // option, never its value, however the key is spelled.
        case(
            "a connection string with passwd=",
            postgres(&format!(
                "url = \"host=127.0.0.1 port=1 user=etl passwd={SECRET}\""
            )),
        ),
        case(
            "a connection string with PASSWORD=",
            postgres(&format!(
                "url = \"host=127.0.0.1 port=1 user=etl PASSWORD={SECRET}\""
            )),
        ),
        case(
            "a connection string with Password=",
            postgres(&format!(
                "url = \"host=127.0.0.1 port=1 user=etl Password = '{SECRET}'\""
            )),
        ),
        case(
            "a connection string with bogus=",
            postgres(&format!(
                "url = \"host=127.0.0.1 port=1 user=etl bogus={SECRET}\""
            )),
        ),
        case(
            "a URL with ?passwd=",
            postgres(&format!(
                "url = \"postgres://etl@127.0.0.1:1/db?passwd={SECRET}\""
            )),
        ),
        case(
            "a URL with ?PASSWORD= and ?bogus=",
            postgres(&format!(
                "url = \"postgres://etl@127.0.0.1:1/db?PASSWORD={SECRET}&bogus={SECRET}\""
            )),
        ),
        case(
            "a URL whose option name is the secret",
            postgres(&format!(
                "url = \"postgres://etl@127.0.0.1:1/db?{SECRET}=1\""
            )),
        ),
        case(
            "a connection string whose option name is the secret",
            postgres(&format!("url = \"host=127.0.0.1 {SECRET}='x\"")),
        ),
        Case {
            env: vec![("PG_PASSWORD", SECRET)],
            ..case(
                "a URL with ?passwd=${PG_PASSWORD}",
                postgres("url = \"postgres://etl@127.0.0.1:1/db?passwd=${PG_PASSWORD}\""),
            )
        },
        Case {
            env: vec![("PG_PASSWORD", SECRET)],
            ..case(
                "a connection string with Password=${PG_PASSWORD}",
                postgres("url = \"host=127.0.0.1 port=1 user=etl Password=${PG_PASSWORD}\""),
            )
        },
        Case {
            env: vec![(
                "DATABASE_URL",
                "postgres://etl@127.0.0.1:1/db?passwd=Zq9SecretPw",
            )],
            ..case("DATABASE_URL with ?passwd=", postgres(""))
        },
        case(
            "an unset variable beside a URL with a password",
            postgres(&format!(
                "url = \"postgres://etl:{SECRET}@127.0.0.1:1/db\"\nschema = \"${{UNSET_SCHEMA}}\""
            )),
        ),
        case(
            "a Kafka dead-letter sink with a misspelled password",
            format!(
                "{}\n[dead_letter]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:1\"\ntopic = \"dead\"\n\
                 properties = {{ \"sasl.pwd\" = \"{SECRET}\" }}\n",
                kafka_sink("").replace("[delivery]\non_failure = \"halt\"\n", "")
            ),
        ),
        case(
            "an HTTP sink's password beside a URI of another scheme",
            http(&format!(
                "uri = \"ftp://127.0.0.1:1/\"\n\
                 auth = {{ strategy = \"basic\", user = \"etl\", password = \"{SECRET}\" }}"
            )),
        ),
        case(
            "an HTTP header's secret value holding a control character",
            http(&format!(
                "uri = \"http://127.0.0.1:1/\"\nheaders = {{ \"X-Key\" = \"{SECRET}\\u0001\" }}"
            )),
        ),
        case(
            "an HTTP bearer token beside the bulk encoding with zstd",
            http(&format!(
                "uri = \"http://127.0.0.1:1/_bulk\"\nencoding = \"elasticsearch_bulk\"\n\
                 compression = \"zstd\"\nauth = {{ strategy = \"bearer\", token = \"{SECRET}\" }}"
            )),
        ),
        Case {
            env: vec![("HTTP_KEY", SECRET)],
            ..case(
                "an HTTP header's secret variable beside an unknown key",
                http(
                    "uri = \"http://127.0.0.1:1/\"\nheaders = { \"X-Key\" = \"${HTTP_KEY}\" }\nno_such_key = 1",
                ),
            )
        },
        Case {
            validate: Some(0),
            // `user:password` as a `Basic` header carries it.
            also_secret: vec!["ZXRsOlpxOVNlY3JldFB3"],
            ..case(
                "an HTTP sink's credentials and header against a port nobody listens on",
                http(&format!(
                    "uri = \"http://127.0.0.1:1/ingest?key={SECRET}\"\n\
                     headers = {{ \"X-Key\" = \"{SECRET}\" }}\n\
                     auth = {{ strategy = \"basic\", user = \"etl\", password = \"{SECRET}\" }}"
                )),
            )
        },
        Case {
            validate: Some(0),
            ..case(
                "an S3 secret key against an endpoint nobody listens on",
                lake(&format!(
                    "kind = \"s3\"\nbucket = \"b\"\nendpoint = \"http://127.0.0.1:1\"\n\
                     access_key_id = \"GKetl\"\nsecret_access_key = \"{SECRET}\"\n\
                     session_token = \"{SECRET}\""
                )),
            )
        },
        Case {
            env: vec![("LAKE_SECRET", SECRET)],
            ..case(
                "an S3 secret key from a variable beside a mistyped field",
                lake(
                    "kind = \"s3\"\nbucket = \"b\"\nendpoint = \"http://127.0.0.1:1\"\n\
                     secret_access_key = \"${LAKE_SECRET}\"\npath_style = \"yes\"",
                ),
            )
        },
        case(
            "an S3 secret key beside an unknown field",
            lake(&format!(
                "kind = \"s3\"\nbucket = \"b\"\nsecret_access_key = \"{SECRET}\"\n\
                 secret_acces_key = \"{SECRET}\""
            )),
        ),
        Case {
            validate: None,
            ..case(
                "a GCS service account key that is not JSON",
                lake(&format!(
                    "kind = \"gcs\"\nbucket = \"b\"\nservice_account_key = \"{SECRET}\""
                )),
            )
        },
        Case {
            validate: None,
            ..case(
                "a GCS service account key whose private key is the secret",
                lake(&format!(
                    "kind = \"gcs\"\nbucket = \"b\"\nservice_account_key = '{{\"type\": \
                     \"service_account\", \"client_email\": \"etl@p.iam.gserviceaccount.com\", \
                     \"private_key_id\": \"k\", \"private_key\": \"{SECRET}\"}}'"
                )),
            )
        },
        Case {
            validate: None,
            ..case(
                "an Azure access key that is not base64",
                lake(&format!(
                    "kind = \"azure\"\naccount = \"etl\"\ncontainer = \"c\"\n\
                     access_key = \"{SECRET}!\""
                )),
            )
        },
    ];
    for c in &mut cases {
        c.also_secret.push(SECRET);
    }
    cases
}

/// A generator into an `object_store` sink (Parquet) with `store` as its
/// `[sinks.store]` table.
fn lake(store: &str) -> String {
    format!(
        "[source]\ntype = \"generator\"\nrecords_per_partition = 100\n\n\
         [[sinks]]\ntype = \"object_store\"\nname = \"lake\"\n\
         key = \"k/{{partition}}-{{first_offset}}.parquet\"\n\
         [sinks.requests]\nmax_retries = 2\nretry_timeout = \"1s\"\n\
         initial_backoff = \"10ms\"\nmax_backoff = \"50ms\"\n\
         [sinks.encoding]\nformat = \"parquet\"\n\
         [sinks.store]\n{store}\n\n\
         [checkpoint]\nstore = {{ type = \"memory\" }}\n"
    )
}

/// A generator into an HTTP sink with `table` in its `[[sinks]]` table.
fn http(table: &str) -> String {
    format!(
        "[source]\ntype = \"generator\"\nrecords_per_partition = 100\n\n\
         [[sinks]]\ntype = \"http\"\nname = \"svc\"\n{table}\n\
         retry = {{ initial_backoff = \"10ms\", max_backoff = \"50ms\", max_elapsed = \"1s\" }}\n\n\
         [checkpoint]\nstore = {{ type = \"memory\" }}\n"
    )
}

/// Run `etl` with every log line on; stop it (SIGTERM, then SIGKILL) if
/// it is still running after `patience`: a source against an unreachable
/// broker retries until stopped.
fn etl(args: &[&str], config: &Path, env: &[(&str, &str)], patience: Duration) -> Output {
    let mut cmd = Command::new(BINARY);
    cmd.args(args)
        .arg(config)
        .env("ETL_LOG", "trace")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let started = Instant::now();
    let mut signalled = None;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        match signalled {
            None if started.elapsed() > patience => {
                let _ = Command::new("kill")
                    .arg("-TERM")
                    .arg(child.id().to_string())
                    .status();
                signalled = Some(Instant::now());
            }
            Some(at) if at.elapsed() > Duration::from_secs(20) => {
                let _ = child.kill();
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn check(case: &Case, dir: &Path) -> Vec<String> {
    let config = dir.join("pipeline.toml");
    std::fs::write(&config, &case.toml).unwrap();
    let mut failures = Vec::new();
    let runs: [(&[&str], Duration); 3] = [
        (
            &["--log-format", "json", "validate"],
            Duration::from_secs(60),
        ),
        (&["--log-format", "json", "run"], Duration::from_secs(3)),
        (&["--log-format", "text", "run"], Duration::from_secs(3)),
    ];
    for (args, patience) in runs {
        let out = etl(args, &config, &case.env, patience);
        let command = args.join(" ");
        for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            let text = String::from_utf8_lossy(bytes);
            for secret in &case.also_secret {
                if text.contains(secret) {
                    failures.push(format!(
                        "{}: `etl {command}` printed {secret:?} on {stream}:\n{}",
                        case.name,
                        text.lines()
                            .filter(|l| l.contains(secret))
                            .take(5)
                            .collect::<Vec<_>>()
                            .join("\n")
                    ));
                }
            }
        }
        if args.contains(&"validate")
            && let Some(code) = case.validate
            && out.status.code() != Some(code)
        {
            failures.push(format!(
                "{}: `etl {command}` exited {:?}, not {code}:\n{}",
                case.name,
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains("panicked"),
            "{}: {}",
            case.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    failures
}

/// Check `cases` a few at a time (most wait for a timeout or a signal).
fn check_all(cases: &[Case]) {
    let failures: Vec<String> = cases
        .chunks(6)
        .flat_map(|chunk| {
            std::thread::scope(|scope| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|case| {
                        scope.spawn(move || {
                            let dir = tempfile::tempdir().unwrap();
                            check(case, dir.path())
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn no_failing_kafka_or_configuration_case_prints_its_secret() {
    let cases: Vec<Case> = cases().into_iter().filter(|c| !c.postgres).collect();
    check_all(&cases);
}

#[test]
fn no_failing_postgres_case_prints_its_secret() {
    let cases: Vec<Case> = cases().into_iter().filter(|c| c.postgres).collect();
    check_all(&cases);
}

/// A configuration holding the secret in every place one can be written.
fn everywhere() -> String {
    format!(
        r#"
[source]
type = "kafka"
brokers = "127.0.0.1:1"
group_id = "g"
topics = ["t"]
properties = {{ "sasl.password" = "{SECRET}", "sasl.username" = "etl" }}

[[sinks]]
name = "topic"
type = "kafka"
brokers = "127.0.0.1:1"
topic = "out"
properties = {{ "sasl.password" = "{SECRET}" }}

[[sinks]]
name = "db"
type = "postgres"
url = "postgres://etl:{SECRET}@127.0.0.1:1/db?password={SECRET}"
password = "{SECRET}"
table = "orders"
columns = [{{ name = "id", type = "bigint" }}]

[dead_letter]
type = "postgres"
url = "host=127.0.0.1 user=etl password = {SECRET}"
table = "dead"
columns = [{{ name = "id", type = "bigint" }}]
"#
    )
}

#[test]
fn debug_of_every_configuration_type_leaves_secrets_out() {
    let config = etl::registry()
        .loader()
        .text(&everywhere(), Path::new("."))
        .unwrap_or_else(|p| panic!("{p:?}"));
    let mut shown = vec![
        format!("{config:?}"),
        format!("{config:#?}"),
        format!("{:?}", config.source),
        format!("{:?}", config.sinks),
        format!("{:?}", config.dead_letter),
    ];
    assert_eq!(config.source.type_name(), "kafka", "a kafka source");
    let source = config.source.table();
    let source_table = source.expose_secret().clone();
    let mut table = source_table.clone();
    table.remove("name");
    let kafka_source =
        etl_kafka::KafkaSourceConfig::deserialize(toml::Value::Table(table)).unwrap();
    shown.push(format!("{kafka_source:?}"));
    // Every property that may hold a secret, misspelled ones too (parsed
    // alone: this build of librdkafka may refuse some of them).
    let mut all: toml::Table = toml::from_str(&format!(
        "brokers = \"b:1\"\ngroup_id = \"g\"\ntopics = [\"t\"]\n[properties]\n{}",
        [
            "sasl.password",
            "ssl.key.password",
            "ssl.keystore.password",
            "ssl.key.pem",
            "ssl_key",
            "sasl.oauthbearer.client.secret",
            "sasl.oauthbearer.config",
            "sasl.passwd",
            "sasl.pasword",
            "my.secret",
            "x.password",
        ]
        .map(|k| format!("\"{k}\" = \"{SECRET}\"\n"))
        .concat()
    ))
    .unwrap();
    let table = etl::config::ConnectorTable::new(all.clone());
    shown.push(format!("{table:?}"));
    shown.push(format!("{:?}", config.source));
    all.remove("group_id");
    all.remove("topics");
    all.insert("topic".to_owned(), "t".into());
    let sink = etl_kafka::KafkaSinkConfig::deserialize(toml::Value::Table(all)).unwrap();
    shown.push(format!("{sink:?}"));
    shown.push(format!("{:?}", sink.validate()));
    shown.push(format!("{:?}", kafka_source.properties));
    shown.push(format!("{:?}", kafka_source.validate()));
    assert_eq!(config.sinks[0].kind.type_name(), "kafka", "a kafka sink");
    let sink = config.sinks[0].kind.table();
    let kafka_sink =
        etl_kafka::KafkaSinkConfig::deserialize(toml::Value::Table(sink.expose_secret().clone()))
            .unwrap();
    shown.push(format!("{kafka_sink:?}"));
    for kind in [&config.sinks[1].kind, config.dead_letter.as_ref().unwrap()] {
        assert_eq!(kind.type_name(), "postgres", "a postgres sink");
        let table = kind.table();
        shown.push(format!("{table:?}"));
    }
    for text in shown {
        assert!(!text.contains(SECRET), "{text}");
    }
}

#[test]
fn debug_of_the_postgres_sink_config_leaves_secrets_out() {
    let config = etl::registry()
        .loader()
        .text(&everywhere(), Path::new("."))
        .unwrap_or_else(|p| panic!("{p:?}"));
    for kind in [&config.sinks[1].kind, config.dead_letter.as_ref().unwrap()] {
        assert_eq!(kind.type_name(), "postgres", "a postgres sink");
        let table = kind.table();
        let pg = etl_postgres::PostgresSinkConfig::deserialize(toml::Value::Table(
            table.expose_secret().clone(),
        ))
        .unwrap();
        let shown = format!("{pg:?}");
        assert!(!shown.contains(SECRET), "{shown}");
    }
}

/// A registered transform whose table holds a nested secret.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Vault {
    #[serde(default)]
    auth: Option<VaultAuth>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    mode: VaultMode,
    /// Fail to build, quoting the nested password (as a careless factory
    /// might).
    #[serde(default)]
    refuse: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VaultAuth {
    user: String,
    password: String,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum VaultMode {
    #[default]
    Plain,
    Sealed,
}

fn vault_registry() -> etl::Registry {
    etl::Registry::new().transform("vault", |config: Vault, context| {
        let _ = (config.password, matches!(config.mode, VaultMode::Sealed));
        match config.auth {
            Some(auth) if config.refuse => Err(format!(
                "vault refused {}:{} for {}",
                auth.user,
                auth.password,
                context.name()
            )
            .into()),
            _ => Ok(Box::new(etl::map(context.name(), Ok))),
        }
    })
}

fn vault_config(transforms: &str) -> String {
    format!(
        "[source]\ntype = \"generator\"\nrecords_per_partition = 1\n\n{transforms}\n\
         [[sinks]]\ntype = \"blackhole\"\n\n[checkpoint]\nstore = {{ type = \"memory\" }}\n"
    )
}

#[tokio::test]
async fn no_registered_component_prints_a_secret_from_any_table_or_depth() {
    let env = |name: &str| (name == "PG_PASSWORD").then(|| SECRET.to_owned());
    let nested = format!(
        "[[transforms]]\ntype = \"vault\"\nauth = {{ user = \"etl\", password = \"{SECRET}\" }}\n"
    );
    let nested_var = "[[transforms]]\ntype = \"vault\"\n\
                      auth = { user = \"etl\", password = \"${PG_PASSWORD}\" }\n";
    let problems = [
        (
            "a nested secret, echoed by a mistyped field of its table",
            format!("{nested}mode = \"{SECRET}\"\n"),
        ),
        (
            "a nested secret under a [table], echoed by a mistyped field",
            format!(
                "[[transforms]]\ntype = \"vault\"\nmode = \"{SECRET}\"\n\
                 [transforms.auth]\nuser = \"etl\"\npassword = \"{SECRET}\"\n"
            ),
        ),
        (
            "a secret of another registered table, echoed by a mistyped field",
            format!(
                "{nested}[[transforms]]\ntype = \"vault\"\nmode = \"{SECRET}\"\n\
                 [[transforms]]\ntype = \"vault\"\npassword = \"{SECRET}\"\n"
            ),
        ),
        (
            "a secret of a built-in table, echoed by a registered table",
            format!(
                "[[transforms]]\ntype = \"vault\"\nmode = \"{SECRET}\"\n\
                 [[sinks]]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:1\"\ntopic = \"t\"\n\
                 properties = {{ \"sasl.password\" = \"{SECRET}\" }}\n"
            ),
        ),
        (
            "a nested ${PG_PASSWORD}, echoed by a mistyped field",
            format!("{nested_var}mode = \"${{PG_PASSWORD}}\"\n"),
        ),
        (
            "a nested secret in an array of tables, echoed by a mistyped field",
            format!(
                "[[transforms]]\ntype = \"vault\"\nmode = \"{SECRET}\"\n\
                 [[transforms]]\ntype = \"vault\"\nauth = [{{ user = \"etl\", \
                 password = \"{SECRET}\" }}]\n"
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (name, transforms) in &problems {
        let text = vault_config(transforms);
        match vault_registry()
            .loader()
            .env(env)
            .text(&text, Path::new("."))
        {
            Ok(config) => failures.push(format!("{name}: parsed: {config:?}")),
            Err(problems) => {
                let shown = format!("{problems:?}");
                if shown.contains(SECRET) {
                    failures.push(format!("{name}: {shown}"));
                }
            }
        }
    }
    // A factory that quotes its secret when it fails: the pipeline's error
    // leaves it out too, whether the secret was written in the file or
    // came from a variable, in this table or another one.
    let builds = [
        (
            "a factory quoting its nested secret",
            format!("{nested}refuse = true\n"),
        ),
        (
            "a factory quoting its nested ${PG_PASSWORD}",
            format!("{nested_var}refuse = true\n"),
        ),
        (
            "a factory quoting a secret written in another table",
            format!(
                "[[transforms]]\ntype = \"vault\"\nauth = {{ user = \"etl\", \
                 password = \"{SECRET}\" }}\nrefuse = true\n\
                 [[transforms]]\ntype = \"vault\"\npassword = \"{SECRET}\"\n"
            )
            .replace(
                &format!("password = \"{SECRET}\" }}"),
                "password = \"xpw1\" }",
            )
            .replace("user = \"etl\"", &format!("user = \"{SECRET}\"")),
        ),
    ];
    for (name, transforms) in &builds {
        let text = vault_config(transforms);
        let config = match vault_registry()
            .loader()
            .env(env)
            .text(&text, Path::new("."))
        {
            Ok(config) => config,
            Err(problems) => {
                failures.push(format!("{name}: does not parse: {problems:?}"));
                continue;
            }
        };
        let shown = format!("{config:?}");
        if shown.contains(SECRET) {
            failures.push(format!("{name}: Debug: {shown}"));
        }
        match etl::pipeline_from_config(&config).await {
            Ok(_) => failures.push(format!("{name}: built")),
            Err(e) => {
                let shown = format!("{e} / {e:?}");
                if shown.contains(SECRET) {
                    failures.push(format!("{name}: {shown}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
