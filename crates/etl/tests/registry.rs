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
        .parse_config(&config_text(dir, transforms), dir)
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
        .parse_config_with_env(&text, dir.path(), |_| None)
        .unwrap_err();
    assert!(
        problems
            .iter()
            .any(|p| p.message.contains("VAULT_PASSWORD")),
        "{problems:?}"
    );

    let config = registry
        .parse_config_with_env(&text, dir.path(), env)
        .unwrap();
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
