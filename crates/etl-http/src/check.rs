//! The checks of a configuration, shared by `etl validate` (problems at
//! their key) and the sink's constructor.

use std::time::Duration;

use etl_record::TemplateError;
use secrecy::{ExposeSecret, SecretString};

use crate::bulk::Bulk;
use crate::limit::RateLimit;
use crate::{BodyEncoding, Compression, HttpSinkConfig, UriTemplate};

/// The longest `max_retry_after` a configuration may set.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// What is wrong with a configuration, at its key. Never a secret's value.
#[derive(Debug)]
pub(crate) struct Problem {
    pub(crate) key: &'static str,
    pub(crate) message: String,
}

/// What the checks built on the way.
#[derive(Debug)]
pub(crate) struct Checked {
    pub(crate) uri: UriTemplate,
    /// The URI when it depends on no record.
    pub(crate) fixed: Option<reqwest::Url>,
    pub(crate) headers: Vec<(reqwest::header::HeaderName, SecretString)>,
    pub(crate) rate: Option<RateLimit>,
    /// The bulk API's action lines, with its encoding.
    pub(crate) bulk: Option<Bulk>,
}

/// Check `config`; the first problem found.
pub(crate) fn check(config: &HttpSinkConfig) -> Result<Checked, Problem> {
    let problem = |key: &'static str, message: String| Problem { key, message };
    // The message names no part of the URI: its query may hold a key.
    let uri = UriTemplate::parse(&config.uri).map_err(|e| {
        let why = match e {
            TemplateError::Unclosed { .. } => "a `{` is not closed (write `{{` for a brace)",
            TemplateError::StrayClose => "a `}` closes nothing (write `}}` for a brace)",
            TemplateError::NotAFieldPath { .. } => {
                "a `{...}` placeholder is not a field path (names separated by dots: {labels.app})"
            }
        };
        problem("uri", why.to_owned())
    })?;
    if uri.has_stray_percent() {
        return Err(problem(
            "uri",
            "a `%` that is not followed by two hex digits (write `%25` for a percent sign)"
                .to_owned(),
        ));
    }
    let sample = reqwest::Url::parse(&uri.sample())
        .map_err(|e| problem("uri", format!("not a URI: {e}")))?;
    if !matches!(sample.scheme(), "http" | "https") {
        return Err(problem(
            "uri",
            format!("`{}` is not http:// or https://", sample.scheme()),
        ));
    }
    if !sample.username().is_empty() || sample.password().is_some() {
        return Err(problem(
            "uri",
            "a user or password in the URI would show in messages; use `auth`".to_owned(),
        ));
    }
    let fixed = if uri.has_fields() { None } else { Some(sample) };
    let mut headers = Vec::with_capacity(config.headers.len());
    for (header, value) in &config.headers {
        let name = reqwest::header::HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| problem("headers", format!("`{header}` is not a header name")))?;
        if reqwest::header::HeaderValue::from_str(value.expose_secret()).is_err() {
            // The value is secret: the header is named, never shown.
            return Err(problem(
                "headers",
                format!("the value of `{header}` is not a valid header value"),
            ));
        }
        if let Some(why) = set_elsewhere(&name, config.auth.is_some()) {
            return Err(problem("headers", format!("`{header}` {why}")));
        }
        headers.push((name, value.clone()));
    }
    if config.request_concurrency == 0 {
        return Err(problem(
            "request_concurrency",
            "request_concurrency must be at least 1".to_owned(),
        ));
    }
    if config.request_max_records == Some(0) {
        return Err(problem(
            "request_max_records",
            "request_max_records must be at least 1".to_owned(),
        ));
    }
    if config.timeout.is_zero() {
        return Err(problem(
            "timeout",
            "timeout must be longer than zero".to_owned(),
        ));
    }
    if config.max_retry_after > MAX_RETRY_AFTER {
        return Err(problem(
            "max_retry_after",
            format!("max_retry_after must be at most {MAX_RETRY_AFTER:?}"),
        ));
    }
    if let Some(tls) = &config.tls
        && tls.client_cert_file.is_some() != tls.client_key_file.is_some()
    {
        return Err(problem(
            "tls",
            "client_cert_file and client_key_file go together".to_owned(),
        ));
    }
    let rate = config
        .rate_limit
        .as_ref()
        .map(RateLimit::new)
        .transpose()
        .map_err(|e| problem("rate_limit", e))?;
    let bulk = match (config.encoding, &config.bulk) {
        (BodyEncoding::ElasticsearchBulk, _) if config.compression == Compression::Zstd => {
            // Elasticsearch and OpenSearch take gzip request bodies only:
            // every request would be refused and its records dead-lettered.
            return Err(problem(
                "compression",
                "the bulk API takes gzip bodies, not zstd: use compression = \"gzip\"".to_owned(),
            ));
        }
        (BodyEncoding::ElasticsearchBulk, bulk) => {
            let bulk = bulk.clone().unwrap_or_default();
            let id = bulk
                .id_field
                .as_deref()
                .map(etl_record::FieldPath::parse)
                .transpose()
                .map_err(|e| problem("bulk", format!("id_field: {e}")))?;
            Some(Bulk {
                action: bulk.action,
                id,
            })
        }
        (_, Some(_)) => {
            return Err(problem(
                "bulk",
                "bulk is for encoding = \"elasticsearch_bulk\" only".to_owned(),
            ));
        }
        (_, None) => None,
    };
    Ok(Checked {
        uri,
        fixed,
        headers,
        rate,
        bulk,
    })
}

/// Why a configured header may not be set, if it may not: the client
/// frames the request itself, and the sink sets some headers from other
/// keys. (`Content-Type` may be set: it replaces the encoding's.)
fn set_elsewhere(name: &reqwest::header::HeaderName, auth: bool) -> Option<&'static str> {
    use reqwest::header;
    // `Host` may be set (a virtual host behind an address).
    let framing = [
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
    ];
    if framing.contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
    {
        Some("is set by the HTTP client from the request it sends; remove it")
    } else if name == header::CONTENT_ENCODING {
        Some("is set from `compression`; set that instead")
    } else if name == header::AUTHORIZATION && auth {
        Some("is set by `auth`; keep one of them")
    } else {
        None
    }
}
