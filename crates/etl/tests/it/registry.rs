//! Registered components in a configuration: how they meet the built-ins'
//! promises.

use std::path::Path;

use etl::{Refused, Registry, map, pipeline_from_config};
use etl_record::Record;
use tokio_util::sync::CancellationToken;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Garble {
    /// Values holding this text are replaced by text that is not JSON.
    when: String,
}

fn registry() -> Registry {
    Registry::new().transform("garble", |config: Garble, context| {
        let when = config.when.into_bytes();
        Ok(Box::new(map(context.name(), move |mut record: Record| {
            if record
                .value
                .windows(when.len())
                .any(|w| w == when.as_slice())
            {
                record.value = b"{not json".to_vec().into();
            }
            if record.value.is_empty() {
                return Err(Refused::new(record, "empty"));
            }
            Ok(record)
        })))
    })
}

fn config_text(dir: &Path, transforms: &str) -> String {
    format!(
        r#"
[source]
type = "file"
paths = ["{dir}/in.ndjson"]
{transforms}
[[sinks]]
type = "file"
path = "{dir}/out.ndjson"

[dead_letter]
type = "file"
path = "{dir}/dead.ndjson"

[checkpoint]
store = {{ type = "memory" }}
"#,
        dir = dir.display()
    )
}

#[allow(
    clippy::unwrap_used,
    reason = "a test helper: a failure fails the test"
)]
async fn run(dir: &Path, transforms: &str) -> (String, String) {
    std::fs::write(
        dir.join("in.ndjson"),
        "{\"id\":1}\n{\"id\":2,\"x\":\"garble\"}\nnot json at all\n",
    )
    .unwrap();
    let config = registry()
        .loader()
        .text(&config_text(dir, transforms), dir)
        .unwrap();
    pipeline_from_config(&config)
        .await
        .unwrap()
        .run(CancellationToken::new())
        .await
        .unwrap();
    (
        std::fs::read_to_string(dir.join("out.ndjson")).unwrap(),
        std::fs::read_to_string(dir.join("dead.ndjson")).unwrap_or_default(),
    )
}

#[tokio::test]
async fn what_a_registered_step_writes_is_checked_before_an_ndjson_file_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (out, dead) = run(
        dir.path(),
        "[[transforms]]\ntype = \"parse_json\"\n[[transforms]]\ntype = \"garble\"\nwhen = \"garble\"\n",
    )
    .await;
    assert_eq!(out, "{\"id\":1}\n", "only the record left as JSON");
    // The line that was never JSON (refused by parse_json) and the one the
    // registered step garbled (refused by the NDJSON encoder).
    assert_eq!(dead.lines().count(), 2, "{dead}");
    assert!(dead.contains("{not json"), "{dead}");
}

#[tokio::test]
async fn a_registered_first_step_does_not_stand_in_for_the_sources_json_check() {
    let dir = tempfile::tempdir().unwrap();
    let (out, dead) = run(
        dir.path(),
        "[[transforms]]\ntype = \"garble\"\nwhen = \"nothing matches this\"\n",
    )
    .await;
    // The NDJSON source checks every line itself when the first step is
    // not a built-in one that would.
    assert_eq!(
        out, "{\"id\":1}\n{\"id\":2,\"x\":\"garble\"}\n",
        "{out}\n{dead}"
    );
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(dead.contains("not json at all"), "{dead}");
}

#[test]
#[should_panic(expected = "built-in")]
fn a_registered_type_cannot_shadow_a_built_in() {
    let _ = Registry::new().transform(
        "filter",
        |_: Garble, _| -> Result<Box<dyn etl::Transform>, etl::BoxError> { Err("never".into()) },
    );
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Vault {
    password: String,
}

#[tokio::test]
#[allow(clippy::unwrap_used)]
async fn a_registered_table_takes_variables_from_the_given_environment_and_never_shows_them() {
    const SECRET: &str = "Zq9RegisteredSecret";
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let got = seen.clone();
    let registry = Registry::new().transform("vault", move |config: Vault, context| {
        *got.lock().unwrap() = config.password;
        Ok(Box::new(map(context.name(), Ok)))
    });
    let dir = tempfile::tempdir().unwrap();
    let text = config_text(
        dir.path(),
        "[[transforms]]\ntype = \"vault\"\npassword = \"${VAULT_PASSWORD}\"\n",
    );
    let env = |name: &str| (name == "VAULT_PASSWORD").then(|| SECRET.to_owned());

    // An unset variable is a problem naming it, from the given
    // environment, not the process's.
    let problems = registry
        .loader()
        .env(|_| None)
        .text(&text, dir.path())
        .unwrap_err();
    assert!(
        problems
            .iter()
            .any(|p| p.message.contains("VAULT_PASSWORD")),
        "{problems:?}"
    );

    let config = registry.loader().env(env).text(&text, dir.path()).unwrap();
    assert!(!format!("{config:?}").contains(SECRET));
    std::fs::write(dir.path().join("in.ndjson"), "{\"id\":1}\n").unwrap();
    pipeline_from_config(&config)
        .await
        .unwrap()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), SECRET, "the factory got the value");
}

/// A sink that stores its progress with its data: it reports the
/// progress `stored` and keeps the offsets it is given.
#[derive(Debug, Clone)]
struct Ledger {
    stored: etl_sink::Progress,
    offsets: std::sync::Arc<std::sync::Mutex<Vec<i64>>>,
}

#[async_trait::async_trait]
impl etl_sink::Sink for Ledger {
    async fn write(&self, batch: &etl_sink::EncodedBatch) -> Result<(), etl_sink::SinkError> {
        let mut offsets = self
            .offsets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        offsets.extend(batch.records().iter().map(|r| r.position.offset.0));
        Ok(())
    }
}

#[async_trait::async_trait]
impl etl_sink::ProgressSink for Ledger {
    fn progress(&self) -> etl_sink::Progress {
        self.stored.clone()
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerConfig {
    /// The offset of partition 0 its progress says is next.
    resume_at: i64,
}

fn ledger_registry(offsets: std::sync::Arc<std::sync::Mutex<Vec<i64>>>) -> Registry {
    Registry::new().sink_plugin(
        "ledger",
        etl::SinkPlugin::new(move |config: LedgerConfig, _context| {
            let stored = [(
                etl_record::PartitionId(0),
                etl_record::Offset(config.resume_at),
            )]
            .into_iter()
            .collect();
            Ok(etl::BuiltSink::exactly_once(Ledger {
                stored,
                offsets: offsets.clone(),
            }))
        })
        .check(|_, report| report.exactly_once()),
    )
}

#[tokio::test]
#[allow(clippy::unwrap_used)]
async fn a_registered_exactly_once_sink_resumes_from_the_progress_it_stored() {
    let offsets = std::sync::Arc::default();
    let config = ledger_registry(std::sync::Arc::clone(&offsets))
        .loader()
        .text(
            "[source]\ntype = \"generator\"\nrecords_per_partition = 8\npartitions = 1\n\
             [[sinks]]\ntype = \"ledger\"\nresume_at = 5\n\
             [checkpoint]\nstore = { type = \"memory\" }\n",
            Path::new("."),
        )
        .unwrap();
    let summary = pipeline_from_config(&config)
        .await
        .unwrap()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(summary.read, 8);
    // What its progress covers is delivered without being written again.
    assert_eq!(*offsets.lock().unwrap(), [5, 6, 7]);
}

#[test]
fn a_registered_exactly_once_sink_must_be_the_only_sink() {
    let problems = ledger_registry(std::sync::Arc::default())
        .loader()
        .text(
            "[source]\ntype = \"generator\"\n\
             [[sinks]]\ntype = \"ledger\"\nresume_at = 0\n\
             [[sinks]]\ntype = \"blackhole\"\n",
            Path::new("."),
        )
        .unwrap_err();
    assert!(
        problems
            .iter()
            .any(|p| p.message.contains("exactly_once needs a single sink")),
        "{problems:?}"
    );
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Counted {
    records: u64,
}

#[tokio::test]
#[allow(clippy::unwrap_used)]
async fn a_registered_source_starts_with_the_checkpoint_handle_and_may_keep_its_offsets() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let started = std::sync::Arc::new(AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&started);
    let registry = Registry::new().source_plugin(
        "counted",
        etl::SourcePlugin::new(move |config: Counted, _context| {
            let flag = std::sync::Arc::clone(&flag);
            Ok(etl::BuiltSource::with_handle(move |_handle| {
                flag.store(true, Ordering::SeqCst);
                let source = etl_source::GeneratorSource::new(etl_source::GeneratorConfig {
                    partitions: 1,
                    records_per_partition: Some(config.records),
                    ..etl_source::GeneratorConfig::default()
                })?;
                Ok(Box::new(source))
            })
            .offset_store(etl_checkpoint::MemoryStore::new()))
        })
        .check(|config, report| {
            report.keeps_offsets();
            report.at_least_one("records", config.records);
        }),
    );
    let dir = tempfile::tempdir().unwrap();
    let text = "[source]\ntype = \"counted\"\nrecords = 4\n[[sinks]]\ntype = \"blackhole\"\n";
    let config = registry.loader().text(text, dir.path()).unwrap();
    assert!(config.source.keeps_offsets());
    let summary = pipeline_from_config(&config)
        .await
        .unwrap()
        .run(CancellationToken::new())
        .await
        .unwrap();
    assert!(started.load(Ordering::SeqCst));
    assert_eq!((summary.read, summary.written()), (4, 4));
    // Its own store held the offsets: the default file store was never
    // opened.
    assert!(!dir.path().join(".etl-state").exists());

    // Its check's problem is placed at the key it names.
    let problems = registry
        .loader()
        .text(&text.replace("records = 4", "records = 0"), dir.path())
        .unwrap_err();
    assert_eq!(
        problems
            .iter()
            .map(|p| (p.line, p.column, p.message.as_str()))
            .collect::<Vec<_>>(),
        [(3, 1, "records must be at least 1")]
    );
}

#[derive(Debug, thiserror::Error)]
#[error("the lease is held")]
struct LeaseHeld;

#[derive(Debug, thiserror::Error)]
#[error("write failed")]
struct WriteFailed(#[source] LeaseHeld);

#[test]
fn a_components_error_kind_is_found_down_the_source_chain() {
    let plain = Registry::new();
    assert_eq!(plain.classify(&WriteFailed(LeaseHeld)), None);
    let registry = Registry::new()
        .error_kind(|e| e.downcast_ref::<LeaseHeld>().map(|_| etl::ErrorKind::InUse));
    assert_eq!(
        registry.classify(&WriteFailed(LeaseHeld)),
        Some(etl::ErrorKind::InUse)
    );
}

#[cfg(feature = "kafka")]
#[test]
fn the_kafka_connector_calls_a_refused_setting_a_configuration_error() {
    let refused = etl_kafka::KafkaError::Config {
        key: "sasl.mechanism".to_owned(),
        message: "unknown".to_owned(),
    };
    assert_eq!(
        etl::registry().classify(&refused),
        Some(etl::ErrorKind::Config)
    );
    assert_eq!(Registry::new().classify(&refused), None);
}
