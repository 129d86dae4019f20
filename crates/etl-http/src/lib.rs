//! An HTTP sink: batches of records to any service that takes them over
//! HTTP (ClickHouse, Loki, Elasticsearch, VictoriaMetrics, Splunk HEC, an
//! in-house service), without ever counting as delivered a record whose
//! request was not answered 2xx, body and all (and, for Elasticsearch's
//! bulk API, whose 2xx answer reports failed items, with `"errors":
//! false`).
//!
//! * [`HttpSinkConfig`] is the `[[sinks]]` table of `type = "http"`: the
//!   URI (a [`UriTemplate`] over record fields: one request per distinct
//!   URI of a batch, or fewer records each with `request_max_records`),
//!   the method, the body ([`BodyEncoding`]: NDJSON, a JSON array, or
//!   Elasticsearch's bulk API with a [`BulkConfig`]; [`Compression`]: gzip
//!   or zstd), headers and
//!   [`AuthConfig`] (basic, bearer; every value kept secret), TLS
//!   ([`TlsConfig`]: a custom CA, a client certificate), the request
//!   timeout, the requests in flight, a [`RateLimitConfig`] and the
//!   [`ClientErrorPolicy`].
//! * [`HttpSink`] implements [`etl_sink::Sink`]. A write returns `Ok`
//!   once every request of its batch was answered 2xx; only then are its
//!   records delivered (at least once: a write retried after a timeout
//!   sends its records again, so a service that must not store them twice
//!   deduplicates, for example on the record's idempotency key).
//! * Responses are classified for the driver ([`RequestError`] says
//!   which): 429, 5xx, 408, a timeout and a broken connection are
//!   retried by the driver's `retry` policy (backoff with jitter), and a
//!   `Retry-After` (seconds or an HTTP date) holds back every request of
//!   the sink until it has passed; 401, 403 and 404 halt the pipeline
//!   naming the sink and the URI (the `etl` binary exits 78: the
//!   configuration's error); any other 4xx is the records' fault, which
//!   the driver narrows down to the record and dead-letters (with
//!   `on_permanent_error = "dead_letter"`), or halts with
//!   `on_client_error = "halt"`.
//! * [`register`] is the crate's one registration line: the `http` sink
//!   type in a [`Registry`](etl_config::Registry), as the `etl` command
//!   does.
//!
//! `docs/http.md` has the options, the classification table with its exit
//! codes, and examples for ClickHouse, Loki and Elasticsearch.
//!
//! # Example
//!
//! Two records posted as one NDJSON request to a local service:
//!
//! ```
//! use std::io::{Read, Write};
//! use etl_ack::{Acked, BatchId, BatchMeta};
//! use etl_http::{HttpSink, HttpSinkConfig};
//! use etl_record::{Offset, PartitionId, Position, Record, SourceId};
//! use etl_sink::{NdjsonEncoder, SinkDriver};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A service that answers one request with 204 and hands its body back.
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let uri = format!("http://{}/ingest", listener.local_addr()?);
//! let service = std::thread::spawn(move || -> std::io::Result<String> {
//!     let (mut socket, _) = listener.accept()?;
//!     let mut request = Vec::new();
//!     let mut buf = [0; 4096];
//!     while !String::from_utf8_lossy(&request).contains("}\n{\"id\":1}\n") {
//!         let n = socket.read(&mut buf)?;
//!         request.extend_from_slice(&buf[..n]);
//!     }
//!     socket.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")?;
//!     Ok(String::from_utf8_lossy(&request).into_owned())
//! });
//!
//! let config: HttpSinkConfig = toml::from_str(&format!("uri = \"{uri}\""))?;
//! let sink = HttpSink::new("service", ".".as_ref(), config)?;
//! let driver = SinkDriver::new(sink, NdjsonEncoder::new()).spawn();
//!
//! let (acker, _events) = etl_ack::channel();
//! let id = BatchId { partition: PartitionId(0), epoch: 1, seq: 0 };
//! let meta = BatchMeta { id, first_offset: Offset(0), last_offset: Offset(1), records: 2, bytes: 16 };
//! let records = (0..2)
//!     .map(|o| {
//!         let at = Position::new(SourceId::new("in"), PartitionId(0), Offset(o));
//!         Record::new(at, format!("{{\"id\":{o}}}"))
//!     })
//!     .collect();
//! driver.send(Acked::new(records, acker.open(meta)?)).await?;
//! driver.close().await?;
//!
//! let request = service.join().expect("the service thread")?;
//! assert!(request.starts_with("POST /ingest HTTP/1.1"));
//! assert!(request.contains("content-type: application/x-ndjson"));
//! assert!(request.ends_with("{\"id\":0}\n{\"id\":1}\n"));
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod body;
mod bulk;
mod check;
mod client;
mod config;
mod error;
mod limit;
mod sink;
mod template;

pub use config::{
    AuthConfig, BodyEncoding, BulkAction, BulkConfig, ClientErrorPolicy, Compression,
    HttpSinkConfig, Method, RateLimitConfig, TlsConfig,
};
pub use error::{HttpSinkError, RequestError};
pub use sink::HttpSink;
pub use template::{UriError, UriTemplate};

/// Register the `http` sink type in `registry`, as a user's connector
/// crate registers its own: the `etl` command's one line for this crate.
///
/// `etl validate` reports a configuration the sink would refuse (a URI
/// that is not HTTP, a header that is not valid, a zero limit) at its key.
/// Its errors get their [`ErrorKind`](etl_config::ErrorKind): a sink that
/// cannot be built (a bad URI, an unreadable CA file), a service that
/// refused the credentials or the URI (401, 403, 404) or the TLS
/// handshake are the configuration's error (the `etl` binary exits 78).
///
/// ```
/// let registry = etl_http::register(etl_config::Registry::new());
/// assert!(registry.has_sink("http"));
/// ```
#[must_use]
pub fn register(registry: etl_config::Registry) -> etl_config::Registry {
    use etl_config::{BuiltSink, ComponentContext, ErrorKind, SinkPlugin};

    let plugin = SinkPlugin::new_async(|config: HttpSinkConfig, context: &ComponentContext<'_>| {
        let built = HttpSink::new(context.name(), context.base_dir(), config)
            .map(BuiltSink::new)
            .map_err(Into::into);
        std::future::ready(built)
    })
    // `etl validate` reports what the constructor would refuse, at its key.
    .check(|config, report| {
        if let Err(problem) = check::check(config) {
            report.problem(problem.key, problem.message);
        }
    });
    registry.sink_plugin("http", plugin).error_kind(|error| {
        if error.is::<HttpSinkError>() {
            return Some(ErrorKind::Config);
        }
        error
            .downcast_ref::<RequestError>()
            .filter(|e| e.is_refused())
            .map(|_| ErrorKind::Config)
    })
}
