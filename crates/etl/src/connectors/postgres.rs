//! `[[sinks]] type = "postgres"`: the PostgreSQL sink of `etl-postgres`,
//! opened from its TOML table.
//!
//! The table deserializes into [`PostgresSinkConfig`] and is validated
//! before connecting; without a `url` the URL comes from `DATABASE_URL`
//! (the password from the URL, `password`, or `PGPASSWORD`). Configuration problems are
//! [`PipelineError::Invalid`]; a failed connection is
//! [`PipelineError::Connector`]. Neither message, nor any log line, holds
//! the password: the crate's errors name the server as
//! `user@host:port/database`, and a deserialization message that quotes a
//! value has any password in it replaced by `***`.

use std::time::{Duration, Instant};

use etl_postgres::{PostgresError, PostgresSink, PostgresSinkConfig};
use secrecy::ExposeSecret;
use serde::Deserialize;

use crate::PipelineError;
use crate::config::ConnectorTable;
use etl_config::{BuiltSink, ErrorKind, Registry, SinkPlugin};

/// `registry` with the PostgreSQL sink. Its table is checked when the
/// configuration is loaded (without connecting); a progress held by
/// another run is [`ErrorKind::InUse`].
pub(super) fn register(registry: Registry) -> Registry {
    registry
        .sink_plugin(
            "postgres",
            SinkPlugin::new_async(|table: ConnectorTable, context| {
                let name = context.name().to_owned();
                // The members of one consumer group write one progress
                // (the group keeps their partitions apart), so the
                // progress lock is shared unless the table says otherwise.
                let table = if context.progress_is_shared() {
                    let mut shared = table.expose_secret().clone();
                    shared
                        .entry("progress_lock")
                        .or_insert_with(|| toml::Value::String("shared".to_owned()));
                    ConnectorTable::new(shared)
                } else {
                    table
                };
                async move {
                    let sink = open_postgres(&table, &name).await?;
                    Ok(if sink.config().exactly_once {
                        BuiltSink::exactly_once(sink)
                    } else {
                        BuiltSink::new(sink)
                    })
                }
            })
            .check(|table, report| {
                let message = match postgres_config(table, report.name()) {
                    Ok(_) => return,
                    Err(PipelineError::Invalid(message)) => message,
                    Err(other) => other.to_string(),
                };
                // At the key the problem names, when the table has it.
                let key = named_key(table, &message);
                let path: Vec<&str> = key.as_deref().into_iter().collect();
                report.problem_at(&path, message);
            }),
        )
        .error_kind(|e| {
            e.downcast_ref::<PostgresError>()
                .filter(|e| e.is_in_use())
                .map(|_| ErrorKind::InUse)
        })
}

/// The first key of `table` that `message` names in backquotes (serde's
/// `unknown field `key``, the sink's `invalid `key``), as a path for
/// [`CheckReport::problem_at`](etl_config::CheckReport::problem_at);
/// none when it names none.
fn named_key(table: &ConnectorTable, message: &str) -> Option<String> {
    message
        .split('`')
        .skip(1)
        .step_by(2)
        .find(|key| table.expose_secret().contains_key(*key))
        .map(str::to_owned)
}

/// Where the URL comes from when the sink's table has no `url`.
const URL_ENV: &str = "DATABASE_URL";

/// How long a start waits for a server that refuses connections (one being
/// restarted, say) before giving up.
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);
/// The first pause between connection attempts; it doubles up to
/// [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Read a `type = "postgres"` table into the sink's configuration and check
/// it, without connecting. Without a `url`, the URL is `DATABASE_URL`'s.
///
/// # Errors
///
/// [`PipelineError::Invalid`] naming the sink and the field.
pub(crate) fn postgres_config(
    table: &ConnectorTable,
    name: &str,
) -> Result<PostgresSinkConfig, PipelineError> {
    let mut table = table.expose_secret().clone();
    if !table.contains_key("url") {
        let url = std::env::var(URL_ENV).map_err(|_| {
            PipelineError::Invalid(format!(
                "sink {name:?} (postgres): no `url`, and {URL_ENV} is not set in the environment"
            ))
        })?;
        table.insert("url".to_owned(), toml::Value::String(url));
    }
    let invalid = |message: String| {
        PipelineError::Invalid(format!(
            "sink {name:?} (postgres): {}",
            redact(&message, &table)
        ))
    };
    let config = PostgresSinkConfig::deserialize(toml::Value::Table(table.clone()))
        .map_err(|e| invalid(e.to_string().trim_end().to_owned()))?;
    config.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(config)
}

/// Open the PostgreSQL sink a `type = "postgres"` table describes:
/// validate, connect (waiting up to 30 seconds for a server that is not
/// accepting connections yet), create the tables it asks for and, in
/// exactly-once mode, read its stored progress.
///
/// # Errors
///
/// [`PipelineError::Invalid`] for a bad configuration;
/// [`PipelineError::Connector`] when the server cannot be reached in time,
/// refuses the credentials, or a statement fails.
pub(crate) async fn open_postgres(
    table: &ConnectorTable,
    name: &str,
) -> Result<PostgresSink, PipelineError> {
    let config = postgres_config(table, name)?;
    let started = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        match PostgresSink::connect(config.clone()).await {
            Ok(sink) => return Ok(sink),
            Err(e) if e.is_retryable() && started.elapsed() + pause < CONNECT_PATIENCE => {
                tracing::warn!(
                    sink = name,
                    error = %e,
                    "PostgreSQL not reachable yet; retrying in {:.1} s",
                    pause.as_secs_f64()
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Err(e) => return Err(connector_error(name, e)),
        }
    }
}

fn connector_error(name: &str, e: PostgresError) -> PipelineError {
    let message = match &e {
        PostgresError::Config { .. } => {
            return PipelineError::Invalid(format!("sink {name:?}: {e}"));
        }
        // Kept typed: the binary exits 75 (state in use) on it.
        PostgresError::InUse { .. } => {
            return PipelineError::Sink {
                name: name.to_owned(),
                source: etl_sink::SinkError::from(e).into(),
            };
        }
        _ => format!("sink {name:?}: {e}"),
    };
    PipelineError::Connector(message.into())
}

/// `message` with every password the table holds (the `password` field, or
/// one in `url`) and the whole `url` replaced by `***`.
fn redact(message: &str, table: &toml::Table) -> String {
    let mut secrets: Vec<String> = Vec::new();
    if let Some(password) = table.get("password") {
        secrets.push(match password {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    }
    if let Some(url) = table.get("url").and_then(toml::Value::as_str) {
        // The whole URL too: any part of it may be a secret, whatever its
        // key is called (`passwd=`, `Password=`).
        secrets.push(url.to_owned());
        secrets.extend(url_password(url));
    }
    let mut out = message.to_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        out = out.replace(secret.as_str(), "***");
    }
    out
}

/// The password of a `postgres://user:password@host/...` URL or of a
/// `password=...` key in a key=value string.
fn url_password(url: &str) -> Option<String> {
    if let Some(rest) = url.split_once("://").map(|(_, rest)| rest) {
        let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
        let userinfo = &authority[..authority.rfind('@')?];
        return userinfo.split_once(':').map(|(_, p)| p.to_owned());
    }
    url.split_whitespace()
        .find_map(|kv| kv.strip_prefix("password="))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> ConnectorTable {
        ConnectorTable::new(text.parse().expect("test TOML parses"))
    }

    #[test]
    fn reads_a_table_into_the_sink_config() {
        let config = postgres_config(
            &table(
                r#"
                url = "postgres://etl@127.0.0.1:5432/shop"
                table = "orders"
                exactly_once = true
                columns = [{ name = "id", type = "bigint" }]
                "#,
            ),
            "db",
        )
        .expect("valid");
        assert_eq!(config.table, "orders");
        assert!(config.exactly_once);
        assert_eq!(config.columns[0].json_path(), "id");
    }

    #[test]
    fn errors_name_the_sink_and_field_but_never_the_password() {
        let cases = [
            (
                r#"url = "postgres://u:s3cr3t@h/db"
                   table = "t"
                   columns = [{ name = "a", type = "text; drop" }]"#,
                "columns[0].type",
            ),
            (
                r#"url = "postgres://u:s3cr3t@h/db"
                   table = "t"
                   colums = []"#,
                "colums",
            ),
            (
                r#"url = "postgres://u@h/db"
                   password = "s3cr3t"
                   table = 5"#,
                "table",
            ),
            (
                r#"url = "postgres://u:s3cr3t@h/db"
                   password = "s3cr3t"
                   table = "t"
                   method = "s3cr3t""#,
                "method",
            ),
        ];
        for (text, field) in cases {
            let err = postgres_config(&table(text), "db").expect_err(text);
            let shown = err.to_string();
            assert!(matches!(err, PipelineError::Invalid(_)), "{shown}");
            assert!(shown.contains("sink \"db\""), "{shown}");
            assert!(shown.contains(field), "{shown}");
            assert!(!shown.contains("s3cr3t"), "{shown}");
        }
    }

    #[test]
    fn finds_passwords_in_both_url_forms() {
        assert_eq!(
            url_password("postgres://u:pw@h:1/db").as_deref(),
            Some("pw")
        );
        assert_eq!(url_password("postgres://u@h/db"), None);
        assert_eq!(
            url_password("host=h password=pw user=u").as_deref(),
            Some("pw")
        );
    }
}
