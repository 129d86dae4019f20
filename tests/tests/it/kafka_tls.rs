//! Kafka over TLS, with SASL (SCRAM, PLAIN) and with client certificates, through
//! the real `etl` binary and librdkafka's TLS over the system's OpenSSL.
//!
//! The broker is the pinned test broker behind real terminators (see
//! `kafka_support/secure.rs` for why the broker cannot terminate them
//! itself): TLS and client certificates by `stunnel4`, SASL by the
//! suite's SASL gate. Each failing case waits for librdkafka's own reason
//! in the pipeline's log (the pipeline keeps retrying an unreachable
//! cluster) and checks that no secret reached stdout or stderr.

use crate::kafka_support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use kafka_support::{
    Ca, Member, MemberConfig, Sasl, SecureBroker, Security, produce_range, toml_inline_table,
    unique, value,
};

const PARTITIONS: i32 = 2;
const RECORDS: u64 = 300;
/// How long a failing pipeline may take to log librdkafka's reason.
const FAILURE_WAIT: Duration = Duration::from_secs(60);

/// Records in over TLS, through `etl run` (Kafka source and Kafka sink,
/// both over TLS), records out over TLS, and the group's commits.
async fn pipeline_works(broker: &SecureBroker, sink_properties: Vec<(String, String)>) {
    let input = unique("tls-in");
    let output = unique("tls-out");
    let group = unique("tls-group");
    broker.create_topic(&input, PARTITIONS).await;
    broker.create_topic(&output, 1).await;
    let producer = broker.config().create().expect("producer over TLS");
    produce_range(&producer, &input, PARTITIONS, 0..RECORDS, "kafka").await;

    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = MemberConfig::with_brokers(broker.addr(), &group, &input);
    config.properties = broker.properties();
    let mut member = Member::new("tls", dir.path(), &config);
    member.start_with(&format!(
        "type = \"kafka\"\nbrokers = {:?}\ntopic = {output:?}\nlinger = \"5ms\"\nproperties = {}",
        broker.addr(),
        toml_inline_table(&sink_properties)
    ));

    let values = broker.read_values(&output, 1, RECORDS as usize, Duration::from_secs(90));
    let arrived: BTreeSet<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let missing: Vec<u64> = (0..RECORDS)
        .filter(|id| !arrived.contains(value(*id).as_bytes()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {RECORDS} records missing from {output} (first {:?}); pipeline log:\n{}\n{}",
        missing.len(),
        missing.first(),
        member.log(1),
        broker.logs()
    );

    // Commits: every input record's offset is committed once the batches
    // are acknowledged (the source commits every 20 ms).
    let deadline = Instant::now() + Duration::from_secs(30);
    let expected = RECORDS as i64 / i64::from(PARTITIONS);
    loop {
        let committed = broker.committed(&group, &input, PARTITIONS);
        if (0..PARTITIONS).all(|p| committed.get(&p) == Some(&expected)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "committed offsets {committed:?}, expected {expected} on each of {PARTITIONS} partitions\n{}",
            member.log(1)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = member.terminate();
    assert!(
        status.success(),
        "after SIGTERM: {status}\n{}",
        member.log(1)
    );
}

/// `etl run` of a Kafka source with these client properties and a file
/// sink, until its log shows `needle` (or [`FAILURE_WAIT`] passes); then
/// SIGTERM. Returns stdout and stderr.
fn run_until_logged(
    broker_addr: &str,
    properties: Vec<(String, String)>,
    needle: &str,
) -> (String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = MemberConfig::with_brokers(broker_addr, &unique("tls-bad"), "tls-unused");
    config.properties = properties;
    let sink = format!(
        "type = \"file\"\npath = {:?}",
        dir.path().join("out.ndjson").display().to_string()
    );
    let path = dir.path().join("pipeline.toml");
    std::fs::write(&path, config.render(&sink)).expect("write config");
    let stdout = dir.path().join("stdout");
    let stderr = dir.path().join("stderr");
    let mut child = Command::new(etl_tests::etl_binary())
        .args(["--log-format", "json", "run"])
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("start etl");
    let deadline = Instant::now() + FAILURE_WAIT;
    while Instant::now() < deadline
        && !read(&stderr).contains(needle)
        && child.try_wait().expect("try_wait").is_none()
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(&mut child);
    let (stdout, stderr) = (read(&stdout), read(&stderr));
    if let Some(line) = stderr.lines().find(|l| l.contains(needle)) {
        println!("the pipeline logged: {line}");
    }
    (stdout, stderr)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// SIGTERM, then SIGKILL if it has not stopped after 30 s.
fn stop(child: &mut Child) {
    if child.try_wait().expect("try_wait").is_some() {
        return;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn with(mut properties: Vec<(String, String)>, key: &str, value: &str) -> Vec<(String, String)> {
    properties.retain(|(k, _)| k != key);
    properties.push((key.to_owned(), value.to_owned()));
    properties
}

#[test]
fn hostname_verification_is_on_by_default() {
    let native = rdkafka::ClientConfig::new()
        .create_native_config()
        .expect("librdkafka configuration");
    assert_eq!(
        native
            .get("ssl.endpoint.identification.algorithm")
            .expect("known property"),
        "https"
    );
    // The build has TLS and SCRAM: librdkafka refuses these otherwise.
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("security.protocol", "SASL_SSL")
        .set("sasl.mechanism", "SCRAM-SHA-512");
    config
        .create_native_config()
        .expect("librdkafka built with SSL and SCRAM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_pipeline_with_the_right_ca_moves_records_and_commits() {
    let broker = SecureBroker::start(Security::tls());
    // The source reads the CA from a file (`ssl.ca.location`), the sink
    // takes it inline (`ssl.ca.pem`).
    let sink = vec![
        ("security.protocol".to_owned(), "SSL".to_owned()),
        ("ssl.ca.pem".to_owned(), broker.ca.pem()),
    ];
    pipeline_works(&broker, sink).await;
}

#[test]
fn tls_with_the_wrong_ca_fails_with_a_certificate_error() {
    let broker = SecureBroker::start(Security::tls());
    let other = broker.write("other-ca.pem", &Ca::new("some other CA").pem());
    let properties = with(
        broker.properties(),
        "ssl.ca.location",
        &other.display().to_string(),
    );
    let needle = "certificate verify failed";
    let (_, stderr) = run_until_logged(broker.addr(), properties, needle);
    assert!(
        stderr.contains(needle),
        "no certificate error within {FAILURE_WAIT:?}:\n{stderr}\n{}",
        broker.logs()
    );
}

#[test]
fn tls_to_a_broker_certified_for_another_name_fails() {
    let broker = SecureBroker::start(Security {
        server_names: vec!["kafka.example.invalid".to_owned()],
        ..Security::tls()
    });
    // Nothing but the CA configured: verification of the name is
    // librdkafka's default.
    let needle = "certificate verify failed";
    let (_, stderr) = run_until_logged(broker.addr(), broker.properties(), needle);
    assert!(
        stderr.contains(needle),
        "the name mismatch was not refused within {FAILURE_WAIT:?}:\n{stderr}\n{}",
        broker.logs()
    );
    // The control: the same broker and CA with the name check off
    // connects, so the name was what failed.
    let consumer: BaseConsumer = broker
        .config()
        .set("ssl.endpoint.identification.algorithm", "none")
        .create()
        .expect("client");
    consumer
        .fetch_metadata(None, Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("without the name check: {e}\n{}", broker.logs()));
}

fn sasl(mechanism: &str) -> Security {
    Security {
        sasl: Some(Sasl {
            mechanism: mechanism.to_owned(),
            user: "etl-pipeline".to_owned(),
            password: "Zq9Sec-ret%pw".to_owned(),
        }),
        ..Security::tls()
    }
}

async fn sasl_works(mechanism: &str) {
    let broker = SecureBroker::start(sasl(mechanism));
    let sink: Vec<(String, String)> = broker.properties();
    pipeline_works(&broker, sink).await;
}

fn sasl_wrong_password_fails(mechanism: &str) {
    let broker = SecureBroker::start(sasl(mechanism));
    let wrong = "Wr0ng-Zq9-password";
    let properties = with(broker.properties(), "sasl.password", wrong);
    let needle = "Authentication failed";
    let (stdout, stderr) = run_until_logged(broker.addr(), properties, needle);
    assert!(
        stderr.contains(needle) && stderr.contains(mechanism),
        "no authentication error within {FAILURE_WAIT:?}:\n{stderr}\n{}",
        broker.logs()
    );
    for (name, output) in [("stdout", &stdout), ("stderr", &stderr)] {
        assert!(
            !output.contains(wrong) && !output.contains("Zq9Sec-ret%pw"),
            "a password reached {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sha_256_with_the_right_password_works() {
    sasl_works("SCRAM-SHA-256").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sha_512_with_the_right_password_works() {
    sasl_works("SCRAM-SHA-512").await;
}

#[test]
fn scram_sha_256_with_a_wrong_password_fails_clearly_without_printing_it() {
    sasl_wrong_password_fails("SCRAM-SHA-256");
}

#[test]
fn scram_sha_512_with_a_wrong_password_fails_clearly_without_printing_it() {
    sasl_wrong_password_fails("SCRAM-SHA-512");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_plain_over_tls_with_the_right_password_works() {
    sasl_works("PLAIN").await;
}

#[test]
fn sasl_plain_with_a_wrong_password_fails_clearly_without_printing_it() {
    sasl_wrong_password_fails("PLAIN");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_with_a_client_certificate_works() {
    let broker = SecureBroker::start(Security {
        client_certificates: true,
        ..Security::tls()
    });
    let sink = broker.properties();
    pipeline_works(&broker, sink).await;
}

#[test]
fn mtls_without_a_client_certificate_is_refused() {
    let broker = SecureBroker::start(Security {
        client_certificates: true,
        ..Security::tls()
    });
    let properties: Vec<(String, String)> = broker
        .properties()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("ssl.certificate") && !k.starts_with("ssl.key"))
        .collect();
    // TLS 1.3: the server's alert arrives with the first response. It
    // refuses the settings, as a wrong CA does: a configuration error.
    let needle = "alert certificate required";
    let (code, _, stderr) = run_to_exit("run", &source_pipeline(broker.addr(), properties));
    let said = format!("broker {} failed the TLS handshake", broker.addr());
    assert_eq!(
        code,
        Some(78),
        "exit code; stderr:\n{stderr}\n{}",
        broker.logs()
    );
    assert!(
        stderr.contains(needle) && lines_with(&stderr, &said) == 1,
        "a client without a certificate is refused, said once:\n{stderr}\n{}",
        broker.logs()
    );
    assert_eq!(lines_with(&stderr, "brokers unreachable"), 0, "{stderr}");
}

/// `examples/kafka/secured.toml` as shipped (TLS + SCRAM-SHA-512, secrets
/// as `${VAR}`), against a broker that demands exactly that. The
/// references are filled in here as the environment would fill them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secured_example_runs_against_a_tls_and_scram_broker() {
    let security = sasl("SCRAM-SHA-512");
    let credentials = security.sasl.clone().expect("SASL");
    let broker = SecureBroker::start(security);
    broker.create_topic("orders", PARTITIONS).await;
    broker.create_topic("big-orders", 1).await;
    let producer: rdkafka::producer::FutureProducer =
        broker.config().create().expect("producer over TLS");
    for id in 0..RECORDS {
        let payload = format!("{{\"id\":{id},\"amount\":{}}}", id % 20);
        producer
            .send(
                rdkafka::producer::FutureRecord::<(), _>::to("orders").payload(&payload),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .expect("delivered");
    }

    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/kafka/secured.toml");
    let ca = broker.path("ca.pem").display().to_string();
    let vars = [
        ("KAFKA_BROKERS", broker.addr()),
        ("KAFKA_USER", credentials.user.as_str()),
        ("KAFKA_PASSWORD", credentials.password.as_str()),
        ("KAFKA_CA", ca.as_str()),
    ];
    let mut text = std::fs::read_to_string(&example).expect("read the example");
    for (name, value) in vars {
        text = text.replace(&format!("${{{name}}}"), value);
    }
    assert!(
        !text
            .lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains("${")),
        "a reference left unfilled:\n{text}"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("secured.toml");
    std::fs::write(&config, text).expect("write config");
    let log = dir.path().join("etl.log");
    let mut child = Command::new(etl_tests::etl_binary())
        .args(["--log-format", "json", "run"])
        .arg(&config)
        .envs(vars)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start etl");

    let kept = usize::try_from(RECORDS / 2).expect("small");
    let values = broker.read_values("big-orders", 1, kept, Duration::from_secs(90));
    stop(&mut child);
    let ids: BTreeSet<u64> = values
        .iter()
        .map(|v| {
            let v: serde_json::Value = serde_json::from_slice(v).expect("a JSON record");
            v["id"].as_u64().expect("an id")
        })
        .collect();
    let expected: BTreeSet<u64> = (0..RECORDS).filter(|id| id % 20 >= 10).collect();
    assert_eq!(ids, expected, "big-orders; pipeline log:\n{}", read(&log));
    let written = read(&dir.path().join("output/big-orders.ndjson"));
    assert_eq!(written.lines().count(), kept, "the file sink");
    assert!(
        !read(&log).contains(&credentials.password),
        "the password reached the log"
    );
}

/// `etl` with these arguments and the configuration `config`, until it
/// exits on its own: its exit code, stdout and stderr. A run still going
/// after [`FAILURE_WAIT`] is stopped and fails the test: it was meant to
/// give up by itself.
fn run_to_exit(command: &str, config: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pipeline.toml");
    std::fs::write(&path, config).expect("write config");
    let stdout = dir.path().join("stdout");
    let stderr = dir.path().join("stderr");
    let mut child = Command::new(etl_tests::etl_binary())
        .args(["--log-format", "json", command])
        .arg(&path)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("start etl");
    let deadline = Instant::now() + FAILURE_WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            stop(&mut child);
            panic!(
                "`etl {command}` was still running after {FAILURE_WAIT:?}: it keeps retrying \
                 instead of giving up\n{}",
                read(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = read(&stderr);
    // Shown when the test fails.
    println!("`etl {command}` exited with {status}; stderr:\n{stderr}");
    (status.code(), read(&stdout), stderr)
}

/// A Kafka source with these client properties into a file sink.
fn source_pipeline(broker_addr: &str, properties: Vec<(String, String)>) -> String {
    let mut config = MemberConfig::with_brokers(broker_addr, &unique("tls-bad"), "tls-unused");
    config.properties = properties;
    config.render("type = \"file\"\npath = \"out.ndjson\"")
}

/// A generator into a Kafka sink with these client properties.
fn sink_pipeline(broker_addr: &str, properties: &[(String, String)]) -> String {
    format!(
        "[source]\ntype = \"generator\"\nrecords_per_partition = 20\n\n\
         [[sinks]]\nname = \"copy\"\ntype = \"kafka\"\nbrokers = {broker_addr:?}\n\
         topic = {:?}\nproperties = {}\n\n\
         [checkpoint]\nstore = {{ type = \"memory\" }}\nshutdown_timeout = \"5s\"\n",
        unique("tls-sink"),
        toml_inline_table(properties)
    )
}

fn lines_with(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

fn no_secret_in(outputs: &[(&str, &str)], secrets: &[&str]) {
    for (name, output) in outputs {
        for secret in secrets {
            assert!(!output.contains(secret), "a secret reached {name}");
        }
    }
}

/// A wrong password is not an outage: the source says that the broker
/// refused the login (which broker, which mechanism), once, and the run
/// ends with the configuration's exit code instead of retrying forever.
#[test]
fn a_source_refused_its_scram_login_exits_78_naming_the_broker_and_mechanism() {
    let broker = SecureBroker::start(sasl("SCRAM-SHA-256"));
    let wrong = "Wr0ng-Zq9-password";
    let properties = with(broker.properties(), "sasl.password", wrong);
    let (code, stdout, stderr) = run_to_exit("run", &source_pipeline(broker.addr(), properties));
    let said = format!(
        "broker {} refused the SASL login (mechanism SCRAM-SHA-256)",
        broker.addr()
    );
    assert_eq!(
        code,
        Some(78),
        "exit code; stderr:\n{stderr}\n{}",
        broker.logs()
    );
    assert_eq!(lines_with(&stderr, &said), 1, "said once:\n{stderr}");
    assert!(
        stderr.contains("Authentication failed") && stderr.contains("configuration error"),
        "{stderr}"
    );
    assert_eq!(
        lines_with(&stderr, "brokers unreachable"),
        0,
        "a refusal is no outage:\n{stderr}"
    );
    no_secret_in(
        &[("stdout", &stdout), ("stderr", &stderr)],
        &[wrong, "Zq9Sec-ret%pw"],
    );
}

/// The TLS handshake fails (a CA that did not sign the broker's
/// certificate): a configuration error naming the broker and the TLS
/// problem, not "brokers unreachable" forever.
#[test]
fn a_source_whose_tls_handshake_fails_exits_78_naming_the_broker_and_the_certificate_problem() {
    let broker = SecureBroker::start(sasl("SCRAM-SHA-512"));
    let other = broker.write("other-ca.pem", &Ca::new("some other CA").pem());
    let properties = with(
        broker.properties(),
        "ssl.ca.location",
        &other.display().to_string(),
    );
    let (code, _, stderr) = run_to_exit("run", &source_pipeline(broker.addr(), properties));
    let said = format!("broker {} failed the TLS handshake", broker.addr());
    assert_eq!(
        code,
        Some(78),
        "exit code; stderr:\n{stderr}\n{}",
        broker.logs()
    );
    assert_eq!(lines_with(&stderr, &said), 1, "said once:\n{stderr}");
    assert!(stderr.contains("certificate verify failed"), "{stderr}");
    assert_eq!(
        lines_with(&stderr, "brokers unreachable"),
        0,
        "a refusal is no outage:\n{stderr}"
    );
}

/// A sink whose login is refused fails its first write at once with the
/// refusal (not `sink write timed out` after retrying for a minute), and
/// the run ends with the configuration's exit code.
#[test]
fn a_sink_refused_its_scram_login_halts_at_once_with_the_refusal() {
    let broker = SecureBroker::start(sasl("SCRAM-SHA-512"));
    let wrong = "Wr0ng-Zq9-password";
    let properties = with(broker.properties(), "sasl.password", wrong);
    let (code, stdout, stderr) = run_to_exit("run", &sink_pipeline(broker.addr(), &properties));
    let said = format!(
        "broker {} refused the SASL login (mechanism SCRAM-SHA-512)",
        broker.addr()
    );
    assert_eq!(
        code,
        Some(78),
        "exit code; stderr:\n{stderr}\n{}",
        broker.logs()
    );
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("sink \"copy\"")
            && last.contains(&said)
            && last.contains("configuration error"),
        "the run's error names the sink and the refusal:\n{stderr}"
    );
    assert_eq!(lines_with(&stderr, "timed out"), 0, "{stderr}");
    no_secret_in(
        &[("stdout", &stdout), ("stderr", &stderr)],
        &[wrong, "Zq9Sec-ret%pw"],
    );
}

/// An encrypted client key with the wrong `ssl.key.password` is said as
/// that (not OpenSSL's `PEM lib` against `ssl.key.location`), exit 78;
/// with the right password the same configuration is valid.
#[test]
fn a_wrong_key_password_is_named_as_the_problem_of_ssl_key_password() {
    let broker = SecureBroker::start(Security {
        client_certificates: true,
        ..Security::tls()
    });
    let right = "Zq9-key-pass";
    let key = broker.encrypted_client_key(right);
    let properties = |password: &str| {
        let p = with(
            broker.properties(),
            "ssl.key.location",
            &key.display().to_string(),
        );
        with(p, "ssl.key.password", password)
    };
    let wrong = "Wr0ng-key-pass";
    for command in ["validate", "run"] {
        let (code, stdout, stderr) =
            run_to_exit(command, &source_pipeline(broker.addr(), properties(wrong)));
        let all = format!("{stdout}{stderr}");
        assert_eq!(code, Some(78), "`etl {command}`:\n{all}");
        assert!(
            all.contains("properties.\"ssl.key.password\"")
                && all.contains("does not decrypt the private key of ssl.key.location"),
            "`etl {command}` names the password as the problem:\n{all}"
        );
        no_secret_in(&[("output", &all)], &[wrong, right]);
    }
    let (code, stdout, stderr) = run_to_exit(
        "validate",
        &source_pipeline(broker.addr(), properties(right)),
    );
    assert_eq!(code, Some(0), "with the right password:\n{stdout}{stderr}");
}
