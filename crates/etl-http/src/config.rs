//! The sink's configuration, as a `[[sinks]]` table reads it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

/// An HTTP sink's configuration: where requests go, what they carry, how
/// they authenticate, and how fast they may be sent.
///
/// Read from a `[[sinks]]` table with `type = "http"`. The driver's own
/// options in the same table (`batch_max_records`, `batch_max_bytes`,
/// `linger`, `concurrency`, `retry`, `write_timeout`,
/// `on_permanent_error`) decide when a batch is cut, how many are in
/// flight and how a failed one is retried; see `docs/http.md`.
///
/// ```
/// let config: etl_http::HttpSinkConfig = toml::from_str(r#"
///     uri = "http://127.0.0.1:8123/?query=INSERT%20INTO%20t%20FORMAT%20JSONEachRow"
///     compression = "gzip"
///     headers = { "X-ClickHouse-User" = "default", "X-ClickHouse-Key" = "${CH_PASSWORD:-}" }
///     timeout = "10s"
///     rate_limit = { requests_per_second = 50 }
/// "#).unwrap();
/// assert_eq!(config.method, etl_http::Method::Post);
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSinkConfig {
    /// The request URI: `http://` or `https://`, with `{field}` (a dotted
    /// path into the record) wherever a record's value decides it; a
    /// batch is sent as one request per distinct URI. No user or password
    /// in it (use [`auth`](Self::auth)): messages name the URI.
    pub uri: String,
    /// The request method (default `POST`).
    #[serde(default)]
    pub method: Method,
    /// How the records make the body (default NDJSON).
    #[serde(default)]
    pub encoding: BodyEncoding,
    /// The action line of each record, with
    /// [`BodyEncoding::ElasticsearchBulk`] only (default `index`, no
    /// `_id`).
    #[serde(default)]
    pub bulk: Option<BulkConfig>,
    /// Compression of the body (default none), sent with its
    /// `Content-Encoding`.
    #[serde(default)]
    pub compression: Compression,
    /// Headers of every request. Values are kept secret: `Debug`, errors
    /// and logs show only the names.
    #[serde(default)]
    pub headers: BTreeMap<String, SecretString>,
    /// Authentication, if any.
    #[serde(default)]
    pub auth: Option<AuthConfig>,
    /// TLS settings for `https://` URIs (a custom CA, a client
    /// certificate).
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Limit of one request, from sending it to reading the whole
    /// response (default `"30s"`). A request that takes longer is retried.
    #[serde(
        default = "default_timeout",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub timeout: Duration,
    /// Requests of this sink in flight at once, across its writes (default
    /// 4). The driver's `concurrency` is how many batches are written at
    /// once; a batch of several URIs sends several requests.
    #[serde(default = "default_request_concurrency")]
    pub request_concurrency: usize,
    /// The most records one request carries (default: no limit, one
    /// request per distinct URI of a batch). `1` sends each record alone,
    /// for a service that takes one JSON document a request (Loki's push
    /// API, Elasticsearch's `_doc`): a batch may hold more records than
    /// `batch_max_records` (the source's chunks are not split).
    #[serde(default)]
    pub request_max_records: Option<usize>,
    /// What a client error other than 401, 403, 404 and 408 means (a 400,
    /// a 413, a 422, ...): the batch's records at fault (default), or the
    /// environment's.
    #[serde(default)]
    pub on_client_error: ClientErrorPolicy,
    /// The longest `Retry-After` honoured as given (default `"60s"`); a
    /// longer one waits this long.
    #[serde(
        default = "default_max_retry_after",
        deserialize_with = "etl_units::duration::deserialize"
    )]
    pub max_retry_after: Duration,
    /// A per-sink rate limit: requests wait for it, none is dropped.
    #[serde(default)]
    pub rate_limit: Option<RateLimitConfig>,
    /// Speak HTTP/2 without negotiating it (cleartext `h2c` or a server
    /// known to take it); by default HTTP/2 is used where TLS negotiates
    /// it, HTTP/1.1 otherwise.
    #[serde(default)]
    pub http2_prior_knowledge: bool,
}

/// `Debug` by hand: a query may carry a key (`?api_key=...`), so the URI
/// shows without it; header values and credentials are [`SecretString`]s.
impl std::fmt::Debug for HttpSinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let uri = match self.uri.split_once('?') {
            Some((before, _)) => format!("{before}?..."),
            None => self.uri.clone(),
        };
        f.debug_struct("HttpSinkConfig")
            .field("uri", &uri)
            .field("method", &self.method)
            .field("encoding", &self.encoding)
            .field("bulk", &self.bulk)
            .field("compression", &self.compression)
            .field("headers", &self.headers)
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .field("timeout", &self.timeout)
            .field("request_concurrency", &self.request_concurrency)
            .field("request_max_records", &self.request_max_records)
            .field("on_client_error", &self.on_client_error)
            .field("max_retry_after", &self.max_retry_after)
            .field("rate_limit", &self.rate_limit)
            .field("http2_prior_knowledge", &self.http2_prior_knowledge)
            .finish()
    }
}

fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_request_concurrency() -> usize {
    4
}

fn default_max_retry_after() -> Duration {
    Duration::from_secs(60)
}

/// The request method.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    /// `POST`.
    #[default]
    Post,
    /// `PUT`.
    Put,
    /// `PATCH`.
    Patch,
}

/// How the records of a request make its body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyEncoding {
    /// One JSON document a line (`application/x-ndjson`): ClickHouse's
    /// `JSONEachRow`, VictoriaMetrics' import.
    #[default]
    Ndjson,
    /// One JSON array of the records (`application/json`).
    JsonArray,
    /// Elasticsearch's (and OpenSearch's) bulk API: an action line before
    /// each record's line (`{"index":{}}`, see [`BulkConfig`]), as
    /// `application/x-ndjson`. A 2xx answer is read for its `errors`
    /// field: `true` means some item failed, and the request is not
    /// delivered.
    ElasticsearchBulk,
}

/// The action line written before each record with
/// [`BodyEncoding::ElasticsearchBulk`]: `{"index":{}}`, or with an
/// [`id_field`](Self::id_field) `{"index":{"_id":"..."}}`.
///
/// ```
/// let config: etl_http::HttpSinkConfig = toml::from_str(r#"
///     uri = "http://127.0.0.1:9200/orders/_bulk"
///     encoding = "elasticsearch_bulk"
///     bulk = { action = "create", id_field = "order.id" }
/// "#).unwrap();
/// let bulk = config.bulk.unwrap();
/// assert_eq!(bulk.action, etl_http::BulkAction::Create);
/// assert_eq!(bulk.id_field.as_deref(), Some("order.id"));
/// ```
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkConfig {
    /// The action of every record (default `index`).
    #[serde(default)]
    pub action: BulkAction,
    /// The record field (a dotted path) whose value is the document's
    /// `_id`: a string, a number or a boolean. A record without it goes
    /// to the dead-letter path. Without an id field, Elasticsearch picks
    /// one, and a replayed record is stored twice.
    #[serde(default)]
    pub id_field: Option<String>,
}

/// The bulk action of each record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkAction {
    /// `index`: store the document, replacing one of the same `_id`.
    #[default]
    Index,
    /// `create`: store the document unless one of the same `_id` exists
    /// (required by data streams). An item answered 409 (the `_id`
    /// exists) counts as delivered: a replay finds its own earlier write.
    Create,
}

/// Compression of a request's body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// None.
    #[default]
    None,
    /// gzip (`Content-Encoding: gzip`).
    Gzip,
    /// zstd (`Content-Encoding: zstd`).
    Zstd,
}

/// Authentication of every request. The secrets are kept secret: `Debug`,
/// errors and logs never show them.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "strategy", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum AuthConfig {
    /// `Authorization: Basic ...`.
    Basic {
        /// The user.
        user: String,
        /// The password.
        password: SecretString,
    },
    /// `Authorization: Bearer ...`.
    Bearer {
        /// The token.
        token: SecretString,
    },
}

/// TLS settings. Paths are relative to the configuration file's folder.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificates of the CAs to trust, instead of the system's.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The client certificate (PEM, its chain after it), for servers that
    /// ask for one; with [`client_key_file`](Self::client_key_file).
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM, PKCS#8, PKCS#1 or SEC1).
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
}

/// What a client error other than 401, 403, 404 and 408 means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientErrorPolicy {
    /// The records of the request are at fault: a request of one record
    /// rejects that record, a larger one fails the batch as the data's
    /// fault, which the driver narrows to the record (with
    /// `on_permanent_error = "dead_letter"`, to the dead-letter sink).
    #[default]
    DeadLetter,
    /// The service refuses whatever the records: the pipeline halts.
    Halt,
}

/// A per-sink rate limit. A request waits until both limits allow it;
/// none is ever dropped.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Requests per second at most, evenly spaced.
    #[serde(default)]
    pub requests_per_second: Option<f64>,
    /// Body bytes (as sent, compressed) per second at most.
    #[serde(default)]
    pub bytes_per_second: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    #[test]
    fn secrets_of_headers_and_auth_never_show_in_debug() {
        let config: HttpSinkConfig = toml::from_str(
            r#"
            uri = "https://logs.example/insert"
            headers = { "X-Api-Key" = "hunter2-header" }
            auth = { strategy = "basic", user = "ingest", password = "hunter2-basic" }
            "#,
        )
        .unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("X-Api-Key") && shown.contains("ingest"),
            "{shown}"
        );
        assert_eq!(
            config.headers["X-Api-Key"].expose_secret(),
            "hunter2-header"
        );
    }

    #[test]
    fn unknown_fields_and_bad_durations_are_refused() {
        let err =
            toml::from_str::<HttpSinkConfig>("uri = \"http://x\"\nmethdo = \"PUT\"\n").unwrap_err();
        assert!(err.to_string().contains("methdo"), "{err}");
        let err = toml::from_str::<HttpSinkConfig>("uri = \"http://x\"\ntimeout = \"soon\"\n")
            .unwrap_err();
        assert!(err.to_string().contains("invalid duration"), "{err}");
        let config: HttpSinkConfig =
            toml::from_str("uri = \"http://x\"\nmethod = \"PUT\"\ntimeout = \"1500ms\"\n").unwrap();
        assert_eq!(config.method, Method::Put);
        assert_eq!(config.timeout, Duration::from_millis(1500));
    }
}
