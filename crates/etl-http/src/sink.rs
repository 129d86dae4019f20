//! The sink: a batch cut by URI into requests, sent, and judged by the
//! responses.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use etl_sink::{EncodedBatch, Reject, Sink, SinkError};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::body::Actions;
use crate::bulk::{self, Bulk};
use crate::check::{Checked, check};
use crate::error::{Verdict, classify, excerpt_without};
use crate::limit::{Pause, RateLimit, retry_after};
use crate::template::{shown, shown_text};
use crate::{
    AuthConfig, BodyEncoding, BulkAction, ClientErrorPolicy, Compression, HttpSinkConfig,
    HttpSinkError, Method, RequestError, UriTemplate, body, client,
};

/// A sink sending batches of records to an HTTP service.
///
/// Each write (one batch of the sink driver, which cuts batches by
/// records, bytes and age) sends one request per distinct URI of its
/// records, at most `request_concurrency` of the sink's requests at once,
/// each after the rate limit and the service's last `Retry-After` allow
/// it. A write returns `Ok` once every request was answered 2xx: that is
/// when its records count as delivered (at least once: a retried write
/// sends its requests again).
///
/// The responses are judged as `docs/http.md` tabulates: 429, 5xx, 408,
/// a timeout or a broken connection are retryable (the driver's `retry`
/// policy backs off with jitter; a `Retry-After` holds back every request
/// of the sink until it has passed); 401, 403, 404, a redirect and a
/// failed TLS handshake halt the pipeline; any other 4xx is the records'
/// fault ([`ClientErrorPolicy::DeadLetter`]: a request of one record
/// rejects it, a larger one fails the write as [`SinkError::Data`], which
/// the driver narrows down to the record) or halts
/// ([`ClientErrorPolicy::Halt`]). With
/// [`BodyEncoding::ElasticsearchBulk`], a 2xx answer is delivered only
/// when its body says `"errors": false`; with `true`, a request of several
/// records fails as [`SinkError::Data`] (the driver sends it again in
/// halves) and a single record's item status is judged as above.
#[derive(Clone, Debug)]
pub struct HttpSink {
    inner: Arc<Inner>,
}

/// `Debug` by hand: the headers' values and the credentials are secret.
struct Inner {
    name: String,
    client: reqwest::Client,
    uri: UriTemplate,
    /// The URI when it depends on no record.
    fixed: Option<reqwest::Url>,
    method: reqwest::Method,
    headers: Vec<(reqwest::header::HeaderName, SecretString)>,
    auth: Option<AuthConfig>,
    encoding: BodyEncoding,
    /// The bulk API's action lines, with [`BodyEncoding::ElasticsearchBulk`].
    bulk: Option<Bulk>,
    compression: Compression,
    policy: ClientErrorPolicy,
    max_retry_after: Duration,
    rate: Option<RateLimit>,
    /// The most records a request carries.
    request_max_records: Option<usize>,
    pause: Pause,
    permits: Semaphore,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let header_names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        let auth = self.auth.as_ref().map(|a| match a {
            AuthConfig::Basic { .. } => "basic",
            AuthConfig::Bearer { .. } => "bearer",
        });
        f.debug_struct("HttpSink")
            .field("name", &self.name)
            .field("uri", &self.fixed.as_ref().map(shown))
            .field("method", &self.method)
            .field("headers", &header_names)
            .field("auth", &auth)
            .field("encoding", &self.encoding)
            .field("bulk", &self.bulk)
            .field("compression", &self.compression)
            .field("on_client_error", &self.policy)
            .field("rate_limit", &self.rate)
            .finish_non_exhaustive()
    }
}

impl HttpSink {
    /// A sink named `name`; relative TLS file paths are read from
    /// `base_dir`. Nothing is sent until the first write.
    ///
    /// # Errors
    ///
    /// [`HttpSinkError::Config`] for an inconsistent configuration,
    /// [`HttpSinkError::Tls`] for a TLS file that cannot be read or used.
    pub fn new(name: &str, base_dir: &Path, config: HttpSinkConfig) -> Result<Self, HttpSinkError> {
        let checked = check(&config).map_err(|p| HttpSinkError::Config {
            sink: name.to_owned(),
            reason: format!("{}: {}", p.key, p.message),
        })?;
        let client = client::build(name, base_dir, &config)?;
        let Checked {
            uri,
            fixed,
            headers,
            rate,
            bulk,
        } = checked;
        Ok(HttpSink {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                client,
                uri,
                fixed,
                method: match config.method {
                    Method::Post => reqwest::Method::POST,
                    Method::Put => reqwest::Method::PUT,
                    Method::Patch => reqwest::Method::PATCH,
                },
                headers,
                auth: config.auth,
                encoding: config.encoding,
                bulk,
                compression: config.compression,
                policy: config.on_client_error,
                max_retry_after: config.max_retry_after,
                rate,
                request_max_records: config.request_max_records,
                pause: Pause::default(),
                permits: Semaphore::new(config.request_concurrency),
            }),
        })
    }
}

/// One request of a write: a URI and the records (batch indices) it
/// carries.
struct Group {
    uri: String,
    rows: Vec<usize>,
}

impl Inner {
    /// The batch's records by URI, in the order of their first record,
    /// and each record's bulk `_id` (empty without an id field); the
    /// records that give no URI or no `_id` are rejected.
    fn plan(&self, batch: &EncodedBatch) -> (Vec<Group>, Vec<Reject>, Vec<Option<String>>) {
        let ids_wanted = self.bulk.as_ref().is_some_and(|b| b.id.is_some());
        if let Some(fixed) = &self.fixed
            && !ids_wanted
        {
            let rows = (0..batch.len()).collect();
            return (
                vec![Group {
                    uri: fixed.to_string(),
                    rows,
                }],
                Vec::new(),
                Vec::new(),
            );
        }
        let mut groups: Vec<Group> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        let mut rejects = Vec::new();
        let mut ids = Vec::with_capacity(if ids_wanted { batch.len() } else { 0 });
        for (i, record) in batch.records().iter().enumerate() {
            let value = serde_json::from_slice::<Value>(&record.value).ok();
            if let Some(bulk) = &self.bulk
                && ids_wanted
            {
                match bulk.id_of(value.as_ref()) {
                    Ok(id) => ids.push(id),
                    Err(why) => {
                        ids.push(None);
                        rejects.push(Reject::new(i, why.to_string()));
                        continue;
                    }
                }
            }
            let uri = match &self.fixed {
                Some(fixed) => Ok(fixed.to_string()),
                None => self.uri.render(value.as_ref()),
            };
            match uri {
                Ok(uri) => match at.get(&uri) {
                    Some(&g) => groups[g].rows.push(i),
                    None => {
                        at.insert(uri.clone(), groups.len());
                        groups.push(Group { uri, rows: vec![i] });
                    }
                },
                Err(why) => rejects.push(Reject::new(i, why.to_string())),
            }
        }
        (groups, rejects, ids)
    }

    fn error(&self, uri: &str, status: Option<u16>, detail: String) -> RequestError {
        let uri = reqwest::Url::parse(uri).map_or_else(|_| shown_text(uri), |u| shown(&u));
        RequestError {
            sink: self.name.clone(),
            uri,
            status,
            detail,
            tls_refused: false,
        }
    }

    /// Send one group's request and judge its outcome.
    async fn send(&self, batch: &EncodedBatch, group: &Group, ids: &[Option<String>]) -> Verdict {
        let uri = match reqwest::Url::parse(&group.uri) {
            Ok(uri) => uri,
            Err(e) => {
                // A record's value made a URI that does not parse (an
                // empty host): the records' fault.
                return Verdict::Data(self.error(&group.uri, None, format!("not a URI: {e}")));
            }
        };
        // The body is built once a request may go: a write cut into many
        // requests holds at most `request_concurrency` bodies at once.
        let Ok(_permit) = self.permits.acquire().await else {
            return Verdict::Retry(self.error(&group.uri, None, "the sink is closed".to_owned()));
        };
        let actions = self.bulk.as_ref().map(|bulk| Actions { bulk, ids });
        let body = match body::build(batch, &group.rows, self.encoding, actions, self.compression) {
            Ok(body) => body,
            Err(e) => {
                return Verdict::Retry(self.error(
                    &group.uri,
                    None,
                    format!("cannot compress the body: {e}"),
                ));
            }
        };
        self.pause.wait().await;
        if let Some(rate) = &self.rate {
            rate.acquire(body.len()).await;
        }
        let mut request = self.client.request(self.method.clone(), uri).body(body);
        // A configured `Content-Type` replaces the encoding's.
        if !self
            .headers
            .iter()
            .any(|(name, _)| name == reqwest::header::CONTENT_TYPE)
        {
            request = request.header(
                reqwest::header::CONTENT_TYPE,
                body::content_type(self.encoding),
            );
        }
        if let Some(encoding) = body::content_encoding(self.compression) {
            request = request.header(reqwest::header::CONTENT_ENCODING, encoding);
        }
        for (name, value) in &self.headers {
            if let Ok(mut value) = reqwest::header::HeaderValue::from_str(value.expose_secret()) {
                value.set_sensitive(true);
                request = request.header(name.clone(), value);
            }
        }
        request = match &self.auth {
            Some(AuthConfig::Basic { user, password }) => {
                request.basic_auth(user, Some(password.expose_secret()))
            }
            Some(AuthConfig::Bearer { token }) => request.bearer_auth(token.expose_secret()),
            None => request,
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => return self.failed(&group.uri, &e),
        };
        let status = response.status().as_u16();
        let wait = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, SystemTime::now(), self.max_retry_after));
        let success = (200..300).contains(&status);
        let mut tally = (success && self.bulk.is_some()).then(bulk::Tally::default);
        let (kept, text) = match read_body(response, success, tally.as_mut()).await {
            Ok(kept) => {
                let text = self.excerpt(&kept);
                (kept, text)
            }
            // A 2xx cut off is no verdict: ClickHouse, for one, answers 200
            // before an insert ends and reports a late failure in the body.
            Err(e) if success => {
                return Verdict::Retry(self.error(
                    &group.uri,
                    Some(status),
                    format!(
                        "the {status} answer's body was cut off ({}): whether the service took \
                         the records is unknown",
                        chain(&e)
                    ),
                ));
            }
            Err(e) => return self.failed(&group.uri, &e),
        };
        if let Some(wait) = wait
            && matches!(status, 429 | 500..=599)
        {
            tracing::info!(sink = %self.name, status, ?wait, "the service asked to wait (Retry-After)");
            self.pause.extend(wait);
        }
        if let (Some(bulk), Some(tally)) = (&self.bulk, &tally) {
            return self.judge_bulk(bulk, group, status, &kept, tally);
        }
        classify(
            status,
            self.policy,
            self.error(&group.uri, Some(status), text),
        )
    }

    /// The verdict on a 2xx answer of the bulk API, whose body (its first
    /// [`BODY_KEPT`] bytes, `kept`) says whether every item was stored,
    /// and whose items were counted by status as it streamed in (`tally`).
    ///
    /// An answer must hold one item a record. A request of several
    /// records with failed items is sent again whole, after the driver's
    /// backoff, when one of them was refused for now (429, 5xx: the
    /// cluster's back-pressure); with `create`, it is delivered when the
    /// only refusals are 409s (their `_id`s exist: a replay's); otherwise
    /// it fails as the data's fault, which the driver narrows down to
    /// single records. A single record's item status is judged like an
    /// HTTP status.
    fn judge_bulk(
        &self,
        bulk: &Bulk,
        group: &Group,
        status: u16,
        kept: &[u8],
        tally: &bulk::Tally,
    ) -> Verdict {
        let error = |detail: String| self.error(&group.uri, Some(status), detail);
        let answer = bulk::read(kept);
        if answer != bulk::Answer::Unknown && tally.items() != group.rows.len() {
            return Verdict::Halt(error(format!(
                "the bulk answer holds {} items for the request's {} records: not an answer \
                 of this request (check `uri`): {}",
                tally.items(),
                group.rows.len(),
                self.excerpt(kept)
            )));
        }
        match answer {
            bulk::Answer::Clean => Verdict::Delivered,
            bulk::Answer::Unknown => Verdict::Halt(error(format!(
                "not a bulk API answer (no `errors` field at its start; check that `uri` ends in \
                 `_bulk`): {}",
                self.excerpt(kept)
            ))),
            bulk::Answer::Failed { .. } if group.rows.len() > 1 && tally.retryable > 0 => {
                Verdict::Retry(error(format!(
                    "{} of the {} items of the bulk request were refused for now (429 or 5xx), \
                     so it is sent again: {}",
                    tally.retryable,
                    group.rows.len(),
                    self.excerpt(kept)
                )))
            }
            bulk::Answer::Failed { .. }
                if group.rows.len() > 1
                    && bulk.action == BulkAction::Create
                    && tally.refused == 0 =>
            {
                self.conflicts(tally.conflicts);
                Verdict::Delivered
            }
            bulk::Answer::Failed { .. } if group.rows.len() > 1 => Verdict::Data(error(format!(
                "{} of the {} items of the bulk request were refused (`errors: true`), so it \
                 is sent again in halves: {}",
                tally.refused + tally.conflicts,
                group.rows.len(),
                self.excerpt(kept)
            ))),
            bulk::Answer::Failed {
                first_item_status: Some(409),
            } if bulk.action == BulkAction::Create => {
                self.conflicts(1);
                Verdict::Delivered
            }
            bulk::Answer::Failed {
                first_item_status: Some(item),
            } => {
                let error = self.error(
                    &group.uri,
                    Some(item),
                    format!(
                        "(its one bulk item's status; the request was answered {status}) {}",
                        self.excerpt(kept)
                    ),
                );
                match classify(item, self.policy, error) {
                    // `errors: true` for an item stored is no delivery.
                    Verdict::Delivered => Verdict::Retry(self.error(
                        &group.uri,
                        Some(status),
                        format!(
                            "the bulk answer says `errors: true` for an item of status {item}: {}",
                            self.excerpt(kept)
                        ),
                    )),
                    verdict => verdict,
                }
            }
            bulk::Answer::Failed {
                first_item_status: None,
            } => Verdict::Retry(error(format!(
                "the bulk answer says `errors: true` without its item's status in its first \
                 {BODY_KEPT} bytes: {}",
                self.excerpt(kept)
            ))),
        }
    }

    /// `create` items refused because their `_id` exists count as
    /// delivered: a replay finds its own earlier write. A different
    /// record with the same `_id` is not stored either; say so.
    fn conflicts(&self, count: usize) {
        if count > 0 {
            tracing::warn!(
                sink = %self.name,
                count,
                "bulk `create` items whose `_id` exists counted as delivered (a replay's, or \
                 another record with the same `_id`, which is not stored)"
            );
        }
    }

    /// The start of an answer's body as one line, with every configured
    /// secret (header values, the password, the token, and the `Basic`
    /// credentials as sent) taken out: a service may echo the request.
    fn excerpt(&self, body: &[u8]) -> String {
        let mut secrets: Vec<String> = self
            .headers
            .iter()
            .map(|(_, v)| v.expose_secret().to_owned())
            .collect();
        match &self.auth {
            Some(AuthConfig::Basic { user, password }) => {
                secrets.push(password.expose_secret().to_owned());
                secrets.push(basic_credentials(user, password.expose_secret()));
            }
            Some(AuthConfig::Bearer { token }) => secrets.push(token.expose_secret().to_owned()),
            None => {}
        }
        excerpt_without(body, &secrets)
    }

    /// The verdict on a request that got no response.
    fn failed(&self, uri: &str, err: &reqwest::Error) -> Verdict {
        let detail = chain(err);
        if let Some(tls) = client::tls_failure(err) {
            // A certificate the client or the server refuses is refused
            // again on every retry.
            return Verdict::Halt(RequestError {
                tls_refused: true,
                ..self.error(
                    uri,
                    None,
                    format!("TLS handshake failed ({tls}); check `tls`"),
                )
            });
        }
        if err.is_builder() {
            return Verdict::Halt(self.error(uri, None, detail));
        }
        Verdict::Retry(self.error(uri, None, detail))
    }
}

/// `groups` cut into requests of at most `most` records each.
fn split(groups: Vec<Group>, most: usize) -> Vec<Group> {
    let most = most.max(1);
    if groups.iter().all(|g| g.rows.len() <= most) {
        return groups;
    }
    groups
        .into_iter()
        .flat_map(|group| {
            group
                .rows
                .chunks(most)
                .map(|rows| Group {
                    uri: group.uri.clone(),
                    rows: rows.to_vec(),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `user:password` as a `Basic` authorization carries it.
fn basic_credentials(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// The most of a response body any message shows (see [`excerpt`]).
const BODY_KEPT: usize = 4096;

/// The first [`BODY_KEPT`] bytes of `response`'s body. A 2xx body is
/// read to its end (its end is part of the verdict; the connection then
/// goes back to the pool); any other is read no further than what is
/// kept, and its connection is dropped, so an endless error body costs
/// nothing.
async fn read_body(
    mut response: reqwest::Response,
    whole: bool,
    mut tally: Option<&mut bulk::Tally>,
) -> Result<Vec<u8>, reqwest::Error> {
    let mut kept = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if let Some(tally) = tally.as_deref_mut() {
            tally.feed(&chunk);
        }
        let room = BODY_KEPT.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if !whole && kept.len() >= BODY_KEPT {
            break;
        }
    }
    Ok(kept)
}

/// `err` and its causes on one line, without its URL (the caller names
/// the URI, without its query).
fn chain(err: &reqwest::Error) -> String {
    let mut text = String::new();
    let mut current: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(err);
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    text.push_str(kind);
    while let Some(e) = current {
        text.push_str(": ");
        text.push_str(&e.to_string());
        current = e.source();
    }
    text
}

#[async_trait]
impl Sink for HttpSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let inner = &*self.inner;
        let (mut groups, mut rejects, ids) = inner.plan(batch);
        if let Some(most) = inner.request_max_records {
            groups = split(groups, most);
        }
        let verdicts =
            futures::future::join_all(groups.iter().map(|group| inner.send(batch, group, &ids)))
                .await;
        let mut retry = None;
        let mut data = None;
        for (group, verdict) in groups.iter().zip(verdicts) {
            match verdict {
                Verdict::Delivered => {}
                Verdict::Halt(e) => return Err(SinkError::permanent(e)),
                Verdict::Retry(e) => {
                    retry.get_or_insert(e);
                }
                Verdict::Data(e) => match group.rows.as_slice() {
                    // One record refused alone: it is the one at fault,
                    // and every other request of the write was answered.
                    &[row] => rejects.push(Reject::new(row, e.to_string())),
                    _ => {
                        data.get_or_insert(e);
                    }
                },
            }
        }
        if let Some(e) = retry {
            return Err(SinkError::retryable(e));
        }
        if let Some(e) = data {
            return Err(SinkError::data(e));
        }
        if rejects.is_empty() {
            Ok(())
        } else {
            rejects.sort_by_key(|r| r.index);
            Err(SinkError::Rejected(rejects))
        }
    }
}
