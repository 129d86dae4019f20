//! The crate's errors, and how the store's failures become
//! [`SinkError`]s.

use std::fmt;

use etl_sink::SinkError;

/// Why an object-store sink cannot be built or opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ObjectStoreSinkError {
    /// The configuration is inconsistent (a key template without
    /// `{first_offset}`, a Parquet schema without columns, ...).
    #[error("invalid object-store sink configuration: {0}")]
    Config(String),
    /// The store could not be set up from the configuration (a malformed
    /// endpoint, unreadable credentials).
    #[error("cannot set up the object store {location}: {source}")]
    Store {
        /// `scheme://bucket` of the store.
        location: String,
        /// What the store's client said.
        #[source]
        source: object_store::Error,
    },
    /// The stored progress could not be read.
    #[error("cannot read the progress of sink {sink:?}: {source}")]
    Progress {
        /// The sink's name.
        sink: String,
        /// Why.
        #[source]
        source: SinkError,
    },
}

/// A failed request, with the sink, bucket and key it concerned. Its
/// `Display` is object_store's message, which never holds a credential
/// (object_store redacts signed URLs).
#[derive(Debug)]
pub(crate) struct RequestFailed {
    pub(crate) what: String,
    pub(crate) source: object_store::Error,
}

impl fmt::Display for RequestFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for RequestFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// What a failed request says about the store, for the sink driver.
///
/// * A missing bucket (404 on a write), a refused credential (401, 403),
///   and any other client error (a wrong region is a 301 or a 400) fail
///   whatever the records: an I/O error of the output that is not retried
///   (the `etl` binary exits 74), naming the sink, the bucket and the key.
/// * Anything else (throttling, server errors, a broken connection, all of
///   them already retried by the store's client with backoff and jitter)
///   is retryable by the driver's policy, and halts the pipeline once that
///   is spent.
pub(crate) fn classify(
    op: &'static str,
    sink: &str,
    location: &str,
    key: &str,
    err: object_store::Error,
) -> SinkError {
    use object_store::Error as E;
    let place = format!("{location}/{key} (sink {sink:?})");
    let refused = match &err {
        E::NotFound { .. } if op != "read" => {
            Some("the bucket does not exist or cannot be reached")
        }
        E::PermissionDenied { .. } => Some("the store denied the credential"),
        E::Unauthenticated { .. } => Some("the store refused the credential"),
        // object_store reports most answers as generic errors: the
        // status says which refusal it is.
        E::Generic { .. } => client_error_status(&err).map(|status| match status {
            401 | 403 => "the store refused the credential",
            404 if op != "read" => "the bucket does not exist or cannot be reached",
            _ => "the store refused the request (a wrong region or endpoint?)",
        }),
        _ => None,
    };
    match refused {
        Some(why) => SinkError::io(
            op,
            place,
            std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                RequestFailed {
                    what: why.to_owned(),
                    source: err,
                },
            ),
        ),
        None => SinkError::retryable(RequestFailed {
            what: format!("cannot {op} {place}"),
            source: err,
        }),
    }
}

/// The HTTP status of a client error (3xx, 4xx) the store answered, if
/// that is what `err` reports.
///
/// object_store keeps the status in an error type it does not export, so
/// it is read from the message of its error chain, where the type writes
/// it as "non-2xx status code: NNN".
fn client_error_status(err: &object_store::Error) -> Option<u16> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        let text = e.to_string();
        if let Some(at) = text.find("non-2xx status code: ") {
            let digits: String = text[at + 21..].chars().take(3).collect();
            if let Ok(status) = digits.parse::<u16>() {
                // 429 is throttling: retried, not refused.
                if (300..500).contains(&status) && status != 429 && status != 408 {
                    return Some(status);
                }
                return None;
            }
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_credential_is_an_unretried_output_error_naming_sink_bucket_and_key() {
        let err = classify(
            "put",
            "lake",
            "s3://orders",
            "p/0.parquet",
            object_store::Error::PermissionDenied {
                path: "p/0.parquet".into(),
                source: "403 Forbidden".into(),
            },
        );
        assert!(!err.is_retryable() && err.is_io(), "{err:?}");
        let text = err.to_string();
        for part in ["\"lake\"", "s3://orders/p/0.parquet", "denied"] {
            assert!(text.contains(part), "{part}: {text}");
        }
        let err = classify(
            "put",
            "lake",
            "s3://orders",
            "k",
            object_store::Error::Generic {
                store: "S3",
                source: "connection reset".into(),
            },
        );
        assert!(err.is_retryable(), "{err:?}");
    }
}
