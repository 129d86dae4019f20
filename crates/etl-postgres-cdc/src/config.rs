//! `[source] type = "postgres_cdc"`: where to connect, which publication
//! and slot.

use std::path::PathBuf;
use std::time::Duration;

use etl_postgres::{ClientSettings, PostgresSinkConfig, SslMode};
use secrecy::SecretString;
use serde::Deserialize;

use crate::CdcError;

/// The source's configuration, as the `etl` TOML file gives it.
///
/// ```toml
/// [source]
/// type = "postgres_cdc"
/// url = "postgres://etl@db.internal:5432/shop"
/// password = "${PGPASSWORD}"
/// publication = "etl"
/// slot = "etl_shop"
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresCdcConfig {
    /// The records' source name (the first part of their idempotency
    /// key); `postgres_cdc` by default.
    #[serde(default)]
    pub name: Option<String>,
    /// `postgres://user@host:port/database` or `key=value` pairs, as the
    /// PostgreSQL sink takes it. Kept secret: it may hold the password.
    pub url: SecretString,
    /// The password, when not in the URL (then `PGPASSWORD`).
    #[serde(default)]
    pub password: Option<SecretString>,
    /// libpq's `sslmode`; the URL's, else `prefer`.
    #[serde(default)]
    pub sslmode: Option<SslMode>,
    /// CA certificate(s) to check the server against.
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// Client certificate.
    #[serde(default)]
    pub sslcert: Option<PathBuf>,
    /// Client certificate's key.
    #[serde(default)]
    pub sslkey: Option<PathBuf>,
    /// The publication to stream (`CREATE PUBLICATION ...`); it must exist.
    pub publication: String,
    /// The logical replication slot (`pgoutput`): letters, digits and `_`.
    pub slot: String,
    /// Create the slot when it does not exist (the default); `false`
    /// refuses to start without it.
    #[serde(default = "yes")]
    pub create_slot: bool,
    /// Whether the rows already in the published tables come first, when
    /// the slot is created ([`Snapshot::Initial`], the default), or only
    /// the changes after it ([`Snapshot::Never`]).
    #[serde(default)]
    pub snapshot: Snapshot,
    /// Most records in one batch.
    #[serde(default = "default_batch")]
    pub max_batch_records: usize,
    /// Time between standby status updates when nothing else sends one,
    /// written as a duration (`"10s"`); keep it well under the server's
    /// `wal_sender_timeout`.
    #[serde(
        default = "default_status",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub status_interval: Duration,
    /// How long to wait for the server when connecting, written as a
    /// duration (`"10s"`).
    #[serde(
        default = "default_connect",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub connect_timeout: Duration,
}

/// What the source reads before the changes, when it creates the slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Snapshot {
    /// The rows of every published table as of the slot's creation (one
    /// `"read"` record each), then the changes from that point on.
    #[default]
    Initial,
    /// Only the changes after the slot's creation.
    Never,
}

fn yes() -> bool {
    true
}

fn default_batch() -> usize {
    1000
}

fn default_status() -> Duration {
    Duration::from_secs(10)
}

fn default_connect() -> Duration {
    Duration::from_secs(10)
}

impl PostgresCdcConfig {
    /// A configuration with the defaults.
    pub fn new(
        url: impl Into<String>,
        publication: impl Into<String>,
        slot: impl Into<String>,
    ) -> Self {
        PostgresCdcConfig {
            name: None,
            url: SecretString::from(url.into()),
            password: None,
            sslmode: None,
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            publication: publication.into(),
            slot: slot.into(),
            create_slot: true,
            snapshot: Snapshot::Initial,
            max_batch_records: default_batch(),
            status_interval: default_status(),
            connect_timeout: default_connect(),
        }
    }

    /// Check the values that need no server.
    ///
    /// # Errors
    ///
    /// [`CdcError::Config`] naming the field of the first problem
    /// [`problems`](Self::problems) finds.
    pub fn validate(&self) -> Result<(), CdcError> {
        match self.problems().into_iter().next() {
            Some((field, reason)) => Err(CdcError::Config {
                field: field.to_owned(),
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Every value that needs no server to be wrong, as (field, what is
    /// wrong): a slot name the server would refuse (PostgreSQL's rule: 1
    /// to 63 lower-case letters, digits and underscores), a publication
    /// name empty or longer than the 63 bytes the server keeps, a batch
    /// of no records, a duration of zero.
    #[must_use]
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if self.slot.is_empty() || self.slot.len() > 63 {
            problems.push((
                "slot",
                format!(
                    "a slot name is 1 to 63 lower-case letters, digits and underscores; \
                     {:?} has {} bytes",
                    self.slot,
                    self.slot.len()
                ),
            ));
        } else if let Some(c) = self
            .slot
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
        {
            problems.push((
                "slot",
                format!(
                    "a slot name is 1 to 63 lower-case letters, digits and underscores; \
                     {:?} has {c:?}",
                    self.slot
                ),
            ));
        }
        if self.publication.is_empty() || self.publication.contains('\0') {
            problems.push((
                "publication",
                "publication must name a publication".to_owned(),
            ));
        } else if self.publication.len() > 63 {
            problems.push((
                "publication",
                format!(
                    "a publication name has at most 63 bytes (the server cuts longer ones); \
                     this one has {}",
                    self.publication.len()
                ),
            ));
        }
        if self.max_batch_records == 0 {
            problems.push((
                "max_batch_records",
                "max_batch_records must be at least 1".to_owned(),
            ));
        }
        if self.status_interval.is_zero() {
            problems.push((
                "status_interval",
                "status_interval must be above zero".to_owned(),
            ));
        }
        if self.connect_timeout.is_zero() {
            problems.push((
                "connect_timeout",
                "connect_timeout must be above zero".to_owned(),
            ));
        }
        problems
    }

    /// The connection settings, resolved as the PostgreSQL sink resolves
    /// its own (URL, password, TLS files).
    pub(crate) fn client_settings(&self) -> Result<ClientSettings, CdcError> {
        let mut sink = PostgresSinkConfig::new("", "unused");
        sink.url = self.url.clone();
        sink.password = self.password.clone();
        sink.sslmode = self.sslmode;
        sink.sslrootcert = self.sslrootcert.clone();
        sink.sslcert = self.sslcert.clone();
        sink.sslkey = self.sslkey.clone();
        sink.connect_timeout = self.connect_timeout;
        ClientSettings::resolve(&sink).map_err(|e| CdcError::Config {
            field: "url".to_owned(),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_name_the_server_would_refuse_is_refused_before_connecting() {
        let mut config = PostgresCdcConfig::new("postgres://u@h/d", "pub", "etl_slot");
        assert!(config.validate().is_ok());
        config.slot = "Bad-Name".to_owned();
        let e = config.validate().expect_err("invalid");
        assert!(e.to_string().contains("slot"), "{e}");
        assert!(e.is_configuration());
    }

    #[test]
    fn the_config_reads_from_toml_with_defaults() {
        let config: PostgresCdcConfig =
            toml_like(r#"{"url":"postgres://u:secret@h/d","publication":"p","slot":"s"}"#);
        assert!(config.create_slot);
        assert_eq!(config.max_batch_records, 1000);
        assert!(!format!("{config:?}").contains("secret"));
    }

    #[test]
    fn durations_are_written_with_their_unit_and_the_old_names_point_to_the_new_ones() {
        let registry = crate::register(etl_config::Registry::new());
        let text = |lines: &str| {
            format!(
                "[source]\ntype = \"postgres_cdc\"\nurl = \"postgres://u@h/d\"\n\
                 publication = \"p\"\nslot = \"s\"\n{lines}\n\n[[sinks]]\ntype = \"blackhole\"\n"
            )
        };
        let base = std::path::Path::new("/base");
        let config = registry
            .loader()
            .text(
                &text("status_interval = \"2s\"\nconnect_timeout = \"500ms\""),
                base,
            )
            .expect("the new form");
        let read = config
            .source
            .options_of::<PostgresCdcConfig>("postgres_cdc")
            .expect("a postgres_cdc table");
        assert_eq!(read.status_interval, Duration::from_secs(2));
        assert_eq!(read.connect_timeout, Duration::from_millis(500));

        let problems = registry
            .loader()
            .text(
                &text("status_interval_secs = 2\nconnect_timeout_secs = 3"),
                base,
            )
            .expect_err("the old names");
        for (line, old, new) in [
            (6, "status_interval_secs", "status_interval"),
            (7, "connect_timeout_secs", "connect_timeout"),
        ] {
            assert!(
                problems.iter().any(|p| p.line == line
                    && p.message.contains(old)
                    && p.message.contains(&format!("renamed to {new}"))),
                "{old}: {problems:#?}"
            );
        }
    }

    #[test]
    fn every_problem_of_the_table_is_reported_at_its_line() {
        let registry = crate::register(etl_config::Registry::new());
        let text = "[source]\ntype = \"postgres_cdc\"\nurl = \"postgres://u@h/d\"\n\
                    publication = \"\"\nslot = \"Shop-Changes\"\nmax_batch_records = 0\n\
                    status_interval = \"0s\"\nconnect_timeout = \"0s\"\n\
                    snapshot = \"always\"\n\n[[sinks]]\ntype = \"blackhole\"\n";
        let problems = registry
            .loader()
            .text(text, std::path::Path::new("/base"))
            .expect_err("problems");
        // An unknown snapshot mode is serde's, and stops the table there.
        assert!(
            problems
                .iter()
                .any(|p| p.line == 9 && p.message.contains("initial")),
            "{problems:#?}"
        );
        let problems = registry
            .loader()
            .text(
                &text.replace("snapshot = \"always\"", "snapshot = \"never\""),
                std::path::Path::new("/base"),
            )
            .expect_err("problems");
        for (line, key) in [
            (4, "publication"),
            (5, "slot"),
            (6, "max_batch_records"),
            (7, "status_interval"),
            (8, "connect_timeout"),
        ] {
            assert!(
                problems
                    .iter()
                    .any(|p| p.line == line && p.message.contains(key)),
                "{key} at line {line}: {problems:#?}"
            );
        }

        let long = format!("p{}", "x".repeat(63));
        let problems = registry
            .loader()
            .text(
                &text
                    .replace("publication = \"\"", &format!("publication = \"{long}\""))
                    .replace("snapshot = \"always\"\n", ""),
                std::path::Path::new("/base"),
            )
            .expect_err("problems");
        assert!(
            problems
                .iter()
                .any(|p| p.line == 4 && p.message.contains("63")),
            "a publication name the server would cut: {problems:#?}"
        );
    }

    fn toml_like(json: &str) -> PostgresCdcConfig {
        serde_json::from_str(json).expect("config")
    }
}
