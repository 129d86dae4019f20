//! The sink's configuration, as a `[[sinks]]` table reads it.

use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::schema::ColumnConfig;

/// An object-store sink's configuration: where objects go, how they are
/// named and encoded, and how requests are retried.
///
/// Read from a `[[sinks]]` table with `type = "object_store"` (the
/// driver's own options, `batch_max_records`, `batch_max_bytes` and
/// `linger`, decide when an object is cut; see `docs/object-storage.md`):
///
/// ```
/// let config: etl_object_store::ObjectStoreSinkConfig = toml::from_str(r#"
///     key = "orders/dt={date}/{partition}-{first_offset}.parquet"
///     date_field = "created_at"
///
///     [store]
///     kind = "s3"
///     bucket = "lake"
///     region = "eu-west-1"
///
///     [encoding]
///     format = "parquet"
///     compression = "zstd"
///     columns = [
///         { name = "id", type = "int64", nullable = false },
///         { name = "customer", type = "string", field = "customer.name" },
///     ]
/// "#).unwrap();
/// assert_eq!(config.key, "orders/dt={date}/{partition}-{first_offset}.parquet");
/// ```
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectStoreSinkConfig {
    /// Where the objects are stored.
    pub store: StoreConfig,
    /// The object key template (see [`KeyTemplate`](crate::KeyTemplate)).
    pub key: String,
    /// How records become an object's bytes (default: NDJSON, no
    /// compression).
    #[serde(default)]
    pub encoding: EncodingConfig,
    /// The record field (a dotted path) whose value gives `{date}` and
    /// `{hour}`: an RFC 3339 timestamp string, or milliseconds since the
    /// Unix epoch. Without it they come from the record's timestamp when
    /// it has one, else from the time the sink writes the object (not
    /// deterministic: refused in exactly-once mode).
    #[serde(default)]
    pub date_field: Option<String>,
    /// Cut a partition's records into objects at offsets that are
    /// multiples of this number, on top of the driver's batches: objects
    /// never span such an offset, whatever the batch, so a replay cuts
    /// them at the same places.
    #[serde(default)]
    pub max_object_offsets: Option<u64>,
    /// Objects this large or larger go up as multipart uploads (default
    /// 16 MiB; S3 needs parts of at least 5 MiB).
    #[serde(default = "default_multipart_threshold")]
    pub multipart_threshold: usize,
    /// Size of each part of a multipart upload (default 8 MiB, at least
    /// 5 MiB).
    #[serde(default = "default_part_size")]
    pub part_size: usize,
    /// Where exactly-once progress objects go, relative to the store's
    /// root (default `_etl_progress/<sink name>`; readers of a Hive layout
    /// skip names starting with `_`). Each progress object records the
    /// key template it was written for, and a sink whose key differs
    /// refuses to start on it.
    #[serde(default)]
    pub progress_prefix: Option<String>,
    /// Retrying requests the store answers with throttling (503 SlowDown,
    /// 429) or a server error.
    #[serde(default)]
    pub requests: RequestConfig,
    /// Exactly once by deterministic keys, with progress objects under
    /// [`progress_prefix`](Self::progress_prefix), when the sink is built
    /// through the registry ([`register`](crate::register)); the
    /// pipeline's only sink then (default `false`: at least once).
    #[serde(default)]
    pub exactly_once: bool,
}

fn default_multipart_threshold() -> usize {
    16 << 20
}

fn default_part_size() -> usize {
    8 << 20
}

/// Where objects are stored. Credentials left out of the table come from
/// the provider's usual environment variables and files (`AWS_*`,
/// `GOOGLE_*`, `AZURE_*`, instance metadata); a `${VAR}` in the table is
/// read from the environment by the configuration loader. Secrets are
/// kept in [`SecretString`]s: `Debug` and errors never show them.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum StoreConfig {
    /// Amazon S3 or an S3-compatible server.
    S3 {
        /// The bucket.
        bucket: String,
        /// The region (default: `AWS_REGION`/`AWS_DEFAULT_REGION`, else
        /// `us-east-1`).
        #[serde(default)]
        region: Option<String>,
        /// The endpoint of an S3-compatible server
        /// (`http://127.0.0.1:3900`).
        #[serde(default)]
        endpoint: Option<String>,
        /// Path-style requests (`endpoint/bucket/key`) rather than
        /// virtual-hosted ones (`bucket.endpoint/key`); most
        /// S3-compatible servers want them (default `true` with an
        /// `endpoint`, `false` without).
        #[serde(default)]
        path_style: Option<bool>,
        /// Allow plain HTTP (default: only for an `http://` endpoint).
        #[serde(default)]
        allow_http: Option<bool>,
        /// Access key id (default: `AWS_ACCESS_KEY_ID` or a provider).
        #[serde(default)]
        access_key_id: Option<SecretString>,
        /// Secret access key.
        #[serde(default)]
        secret_access_key: Option<SecretString>,
        /// Session token of temporary credentials.
        #[serde(default)]
        session_token: Option<SecretString>,
    },
    /// Google Cloud Storage.
    Gcs {
        /// The bucket.
        bucket: String,
        /// A service account key file (default:
        /// `GOOGLE_APPLICATION_CREDENTIALS` or the metadata server).
        #[serde(default)]
        service_account_path: Option<String>,
        /// A service account key, as JSON.
        #[serde(default)]
        service_account_key: Option<SecretString>,
    },
    /// Azure Blob Storage.
    Azure {
        /// The storage account.
        account: String,
        /// The container.
        container: String,
        /// The account's blob endpoint, for an emulator or a private
        /// endpoint (default `https://{account}.blob.core.windows.net`).
        /// Requests go to `{endpoint}/{container}/{key}`, so an emulator
        /// that serves accounts by path takes the account in it:
        /// `http://127.0.0.1:10000/devstoreaccount1` for Azurite.
        #[serde(default)]
        endpoint: Option<String>,
        /// Allow plain HTTP (default: only for an `http://` endpoint).
        #[serde(default)]
        allow_http: Option<bool>,
        /// The account's access key (default: `AZURE_*` variables).
        #[serde(default)]
        access_key: Option<SecretString>,
    },
    /// A folder of the local file system (created if missing).
    Local {
        /// The folder.
        path: String,
    },
}

impl StoreConfig {
    /// The bucket, container or folder, for messages.
    #[must_use]
    pub fn bucket(&self) -> &str {
        match self {
            StoreConfig::S3 { bucket, .. } | StoreConfig::Gcs { bucket, .. } => bucket,
            StoreConfig::Azure { container, .. } => container,
            StoreConfig::Local { path } => path,
        }
    }

    /// The URL scheme of the store (`s3`, `gs`, `az`, `file`), for
    /// messages.
    #[must_use]
    pub fn scheme(&self) -> &'static str {
        match self {
            StoreConfig::S3 { .. } => "s3",
            StoreConfig::Gcs { .. } => "gs",
            StoreConfig::Azure { .. } => "az",
            StoreConfig::Local { .. } => "file",
        }
    }
}

/// How records become an object's bytes.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "format", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum EncodingConfig {
    /// One JSON document per line, as the records hold them.
    Ndjson {
        /// Compression of the whole object (default none).
        #[serde(default)]
        compression: NdjsonCompression,
    },
    /// Apache Parquet with a declared schema.
    Parquet {
        /// The columns, in order. Left out (or empty), they are inferred
        /// from the first record the sink checks, and fixed from then on
        /// (at-least-once only: a replay may start from another record).
        /// Inference: every top-level field of that record, in name order,
        /// nullable; `true`/`false` a boolean, an integer an `int64`, any
        /// other number a `float64`, a string or a null a `string`, an
        /// object a struct of its fields, an array a list of its first
        /// non-null item's type. A field whose name holds a `.`, an empty
        /// object and an array with no non-null item give no column. A
        /// later record that does not fit is dead-lettered like one that
        /// does not fit a declared schema.
        #[serde(default)]
        columns: Vec<ColumnConfig>,
        /// Compression of the column chunks (default zstd).
        #[serde(default)]
        compression: ParquetCompression,
        /// Rows per row group at most (default 122 880, what DuckDB and
        /// Spark use by default).
        #[serde(default = "default_row_group_rows")]
        row_group_rows: usize,
        /// Target size of a data page in bytes (default 1 MiB).
        #[serde(default = "default_page_bytes")]
        page_bytes: usize,
    },
}

impl Default for EncodingConfig {
    fn default() -> Self {
        EncodingConfig::Ndjson {
            compression: NdjsonCompression::None,
        }
    }
}

fn default_row_group_rows() -> usize {
    122_880
}

fn default_page_bytes() -> usize {
    1 << 20
}

/// Compression of an NDJSON object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NdjsonCompression {
    /// Plain text (`.ndjson`).
    #[default]
    None,
    /// gzip (`.ndjson.gz`).
    Gzip,
    /// zstd (`.ndjson.zst`).
    Zstd,
}

/// Compression of Parquet column chunks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParquetCompression {
    /// None.
    None,
    /// Snappy.
    Snappy,
    /// zstd (level 3).
    #[default]
    Zstd,
}

/// How requests are retried: by object_store's client, with exponential
/// backoff and jitter, for throttling (503 SlowDown, 429), server errors
/// and broken connections.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestConfig {
    /// Retries of one request at most (default 10).
    #[serde(default = "default_max_retries")]
    pub max_retries: usize,
    /// Give up retrying a request this long after it was first sent
    /// (default `"3m"`).
    #[serde(
        default = "default_retry_timeout",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub retry_timeout: Duration,
    /// The first backoff (default `"100ms"`); it doubles up to
    /// `max_backoff`, each wait drawn at random below it.
    #[serde(
        default = "default_initial_backoff",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub initial_backoff: Duration,
    /// The largest backoff (default `"15s"`).
    #[serde(
        default = "default_max_backoff",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub max_backoff: Duration,
    /// Limit of one request (default `"30s"`).
    #[serde(
        default = "default_timeout",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub timeout: Duration,
}

impl Default for RequestConfig {
    fn default() -> Self {
        RequestConfig {
            max_retries: default_max_retries(),
            retry_timeout: default_retry_timeout(),
            initial_backoff: default_initial_backoff(),
            max_backoff: default_max_backoff(),
            timeout: default_timeout(),
        }
    }
}

fn default_max_retries() -> usize {
    10
}
fn default_retry_timeout() -> Duration {
    Duration::from_secs(180)
}
fn default_initial_backoff() -> Duration {
    Duration::from_millis(100)
}
fn default_max_backoff() -> Duration {
    Duration::from_secs(15)
}
fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    #[test]
    fn a_secret_in_the_table_never_shows_in_debug() {
        let config: ObjectStoreSinkConfig = toml::from_str(
            r#"
            key = "{partition}-{first_offset}.ndjson"
            [store]
            kind = "s3"
            bucket = "b"
            access_key_id = "AKIDEXAMPLE"
            secret_access_key = "hunter2-very-secret"
            "#,
        )
        .unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2-very-secret"), "{shown}");
        assert!(!shown.contains("AKIDEXAMPLE"), "{shown}");
        let StoreConfig::S3 {
            secret_access_key: Some(secret),
            ..
        } = &config.store
        else {
            panic!("{config:?}")
        };
        assert_eq!(secret.expose_secret(), "hunter2-very-secret");
        // The other stores' secrets, and the session token.
        for store in [
            "kind = \"s3\"\nbucket = \"b\"\nsession_token = \"hunter2-very-secret\"",
            "kind = \"gcs\"\nbucket = \"b\"\nservice_account_key = \"hunter2-very-secret\"",
            "kind = \"azure\"\naccount = \"a\"\ncontainer = \"c\"\naccess_key = \"hunter2-very-secret\"",
        ] {
            let config: ObjectStoreSinkConfig = toml::from_str(&format!(
                "key = \"{{partition}}-{{first_offset}}.ndjson\"\n[store]\n{store}\n"
            ))
            .unwrap();
            for shown in [format!("{config:?}"), format!("{config:#?}")] {
                assert!(!shown.contains("hunter2"), "{shown}");
            }
        }
    }

    #[test]
    fn unknown_fields_and_bad_durations_are_refused() {
        let err = toml::from_str::<ObjectStoreSinkConfig>(
            "key = \"k\"\n[store]\nkind = \"local\"\npath = \"/tmp\"\nbukcet = \"x\"\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("bukcet"), "{err}");
        let err = toml::from_str::<ObjectStoreSinkConfig>(
            "key = \"k\"\n[store]\nkind = \"local\"\npath = \"/tmp\"\n[requests]\ntimeout = \"soon\"\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("invalid duration"), "{err}");
        assert_eq!(
            etl_units::duration::parse("3m"),
            Ok(Duration::from_secs(180))
        );
    }
}
