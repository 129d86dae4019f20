//! The crate's errors, and how a response becomes a [`SinkError`].

use std::fmt;

use crate::ClientErrorPolicy;

/// Why an HTTP sink cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpSinkError {
    /// The configuration is inconsistent (a URI that is not HTTP, a
    /// header that is not valid, a rate limit of zero, ...).
    #[error("invalid http sink {sink:?} configuration: {reason}")]
    Config {
        /// The sink's name.
        sink: String,
        /// What is wrong.
        reason: String,
    },
    /// A TLS file cannot be read or used.
    #[error("http sink {sink:?}: cannot use {what} {path}: {reason}")]
    Tls {
        /// The sink's name.
        sink: String,
        /// Which file ("CA file", "client certificate").
        what: &'static str,
        /// Its path.
        path: String,
        /// Why.
        reason: String,
    },
}

/// A request that failed, with the sink and the URI it went to (shown
/// without its query, which may hold a key). Its message never holds a
/// header, a credential or the request's body.
#[derive(Debug)]
pub struct RequestError {
    /// The sink's name.
    pub sink: String,
    /// The URI, without its query.
    pub uri: String,
    /// The status the service answered, if it answered.
    pub status: Option<u16>,
    /// What happened: the start of the response's body, or the client's
    /// error.
    pub detail: String,
    /// Whether the TLS handshake failed (a certificate refused by either
    /// side), which no retry can fix.
    pub tls_refused: bool,
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http sink {:?}: {} ", self.sink, self.uri)?;
        match self.status {
            Some(401) => write!(
                f,
                "refused the credentials (401 Unauthorized): check `auth` and `headers`"
            )?,
            Some(403) => write!(
                f,
                "denied the request (403 Forbidden): the credentials lack the right"
            )?,
            Some(404) => write!(f, "does not exist (404 Not Found): check `uri`")?,
            Some(status) => write!(f, "answered {status}")?,
            None => write!(f, "failed")?,
        }
        if self.detail.is_empty() {
            Ok(())
        } else {
            write!(f, ": {}", self.detail)
        }
    }
}

impl std::error::Error for RequestError {}

impl RequestError {
    /// Whether no retry can fix this whatever the records: refused
    /// credentials or rights, a URI that does not exist, a failed TLS
    /// handshake. The `etl`
    /// binary exits 78 (the configuration's error) for it.
    #[must_use]
    pub fn is_refused(&self) -> bool {
        self.tls_refused || matches!(self.status, Some(401 | 403 | 404))
    }
}

/// The start of a response body, for a message: at most 512 bytes, on
/// one line, with every one of `secrets` taken out of the whole body
/// before it is cut (a secret across the cut shows none of its bytes) or
/// its spaces run together. A secret of fewer than four bytes cannot be
/// taken out without taking out whatever else spells it: a body holding
/// one is not shown at all.
pub(crate) fn excerpt_without(body: &[u8], secrets: &[String]) -> String {
    let mut text = String::from_utf8_lossy(body).into_owned();
    let secrets = secrets.iter().filter(|s| !s.is_empty());
    for secret in secrets {
        if secret.len() < 4 {
            if text.contains(secret.as_str()) {
                return "(not shown: it may hold a configured secret)".to_owned();
            }
        } else {
            text = text.replace(secret.as_str(), "[REDACTED]");
        }
    }
    let mut end = text.len().min(512);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut line: String = text[..end].split_whitespace().collect::<Vec<_>>().join(" ");
    if text.len() > end {
        line.push_str(" ...");
    }
    line
}

/// How the driver should take a request's outcome.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Delivered.
    Delivered,
    /// Try again later (429, 5xx, 408, a broken connection, a timeout).
    Retry(RequestError),
    /// No retry can fix it, whatever the records: halt.
    Halt(RequestError),
    /// The records of the request are at fault.
    Data(RequestError),
}

/// The verdict on a response of `status`.
pub(crate) fn classify(status: u16, policy: ClientErrorPolicy, error: RequestError) -> Verdict {
    match status {
        200..=299 => Verdict::Delivered,
        408 | 429 | 500..=599 => Verdict::Retry(error),
        401 | 403 | 404 => Verdict::Halt(error),
        // The method, media type, encoding, framing or head is refused:
        // every record would be refused alike, so none is the records'
        // fault.
        405 | 406 | 407 | 410 | 411 | 415 | 417 | 421 | 426 | 431 => Verdict::Halt(error),
        400..=499 => match policy {
            ClientErrorPolicy::DeadLetter => Verdict::Data(error),
            ClientErrorPolicy::Halt => Verdict::Halt(error),
        },
        // 1xx and 3xx (redirects are not followed: a body would be sent
        // twice) are the configuration's error.
        _ => Verdict::Halt(error),
    }
}

#[cfg(test)]
impl Verdict {
    /// The error the sink returns for the request, if it failed.
    pub(crate) fn into_sink_error(self) -> Option<etl_sink::SinkError> {
        use etl_sink::SinkError;
        match self {
            Verdict::Delivered => None,
            Verdict::Retry(e) => Some(SinkError::retryable(e)),
            Verdict::Halt(e) => Some(SinkError::permanent(e)),
            Verdict::Data(e) => Some(SinkError::data(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etl_sink::FailureKind;

    fn error(status: u16) -> RequestError {
        RequestError {
            sink: "ch".to_owned(),
            uri: "http://127.0.0.1:8123/".to_owned(),
            status: Some(status),
            detail: String::new(),
            tls_refused: false,
        }
    }

    #[test]
    fn statuses_are_classified_as_the_docs_table_says() {
        let policy = ClientErrorPolicy::DeadLetter;
        assert!(matches!(
            classify(204, policy, error(204)),
            Verdict::Delivered
        ));
        for status in [408, 429, 500, 502, 503, 504] {
            let err = classify(status, policy, error(status)).into_sink_error();
            let err = err.unwrap();
            assert!(err.is_retryable(), "{status}");
            assert_eq!(err.kind(), FailureKind::Environment, "{status}");
        }
        for status in [401, 403, 404, 301] {
            let err = classify(status, policy, error(status))
                .into_sink_error()
                .unwrap();
            assert!(!err.is_retryable(), "{status}");
            assert_eq!(err.kind(), FailureKind::Environment, "{status}");
        }
        for status in [400, 413, 422] {
            let err = classify(status, policy, error(status))
                .into_sink_error()
                .unwrap();
            assert_eq!(err.kind(), FailureKind::Data, "{status}");
            let err = classify(status, ClientErrorPolicy::Halt, error(status))
                .into_sink_error()
                .unwrap();
            assert_eq!(err.kind(), FailureKind::Environment, "{status}");
            assert!(!err.is_retryable());
        }
    }

    #[test]
    fn statuses_that_refuse_every_request_alike_halt_rather_than_dead_letter() {
        // The method, the media type, the encoding or the head is wrong:
        // every record would be refused the same way.
        for status in [405, 406, 407, 410, 411, 415, 417, 421, 426, 431] {
            let err = classify(status, ClientErrorPolicy::DeadLetter, error(status))
                .into_sink_error()
                .unwrap();
            assert_eq!(err.kind(), FailureKind::Environment, "{status}");
            assert!(!err.is_retryable(), "{status}");
        }
    }

    #[test]
    fn a_refusal_names_the_sink_the_uri_and_what_to_check() {
        let text = error(401).to_string();
        for part in ["\"ch\"", "http://127.0.0.1:8123/", "401", "auth"] {
            assert!(text.contains(part), "{part}: {text}");
        }
        assert!(error(403).is_refused() && error(404).is_refused());
        assert!(!error(400).is_refused());
        assert_eq!(
            excerpt_without(b"Code: 27.\n  bad\trow", &[]),
            "Code: 27. bad row"
        );
    }
}
