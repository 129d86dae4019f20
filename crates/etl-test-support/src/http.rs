//! A fault-injecting HTTP/1.1 server on 127.0.0.1, for testing HTTP
//! sinks: it answers 2xx by default and, by script, 429 with
//! `Retry-After`, bursts of 503, slow and hanging responses, connection
//! resets, a 401 without the expected credentials and a 400 for any
//! request holding a marked record; with [`FaultServer::answer_bulk`] it
//! answers as Elasticsearch's bulk API does, item by item. It logs every
//! request and keeps
//! every body it accepted (decompressed), so a test checks that no record
//! was lost and counts requests per window from the log.
//!
//! Written on `std::net` rather than a server framework: a reset (a
//! connection closed with the request's body unread, which makes the
//! kernel send RST) and a response that never comes need the socket
//! itself.
//!
//! ```
//! use etl_test_support::http::{Fault, FaultServer};
//!
//! let server = FaultServer::start().unwrap();
//! server.script([Fault::status(503), Fault::Reset]);
//! // The first two requests fail; the third is accepted and logged.
//! assert!(server.accepted().is_empty());
//! ```

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Error;

/// What the server does with one request instead of accepting it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status, with a `Retry-After` if given (seconds or an
    /// HTTP date, as written).
    Status {
        /// The status.
        status: u16,
        /// The `Retry-After` header's value.
        retry_after: Option<String>,
    },
    /// Accept the request, but answer only after this long.
    Slow(Duration),
    /// Never answer (until the client gives up or the server stops).
    Hang,
    /// Close the connection with the body unread: the client sees a reset.
    Reset,
}

impl Fault {
    /// A status without `Retry-After`.
    #[must_use]
    pub fn status(status: u16) -> Self {
        Fault::Status {
            status,
            retry_after: None,
        }
    }
}

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Logged {
    /// When its head was read.
    pub at: Instant,
    /// The request target (path and query).
    pub target: String,
    /// Its headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The status answered (`None`: reset, or never answered).
    pub status: Option<u16>,
    /// The body, decompressed (empty for a reset).
    pub body: Vec<u8>,
}

impl Logged {
    /// The value of header `name` (lower case), if sent.
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A bulk item that fails: the document holding `marker` is answered
/// `status`, `times` times.
#[derive(Debug)]
struct ItemFault {
    marker: Vec<u8>,
    status: u16,
    times: usize,
}

#[derive(Debug, Default)]
struct State {
    script: VecDeque<Fault>,
    marker: Option<Vec<u8>>,
    authorization: Option<String>,
    log: Vec<Logged>,
    /// Answer 2xx requests as the bulk API does.
    bulk: bool,
    item_faults: Vec<ItemFault>,
    /// The documents of the bulk items answered 2xx, in order.
    stored: Vec<String>,
    /// The action lines with an `_id` of the items stored.
    stored_ids: std::collections::HashSet<Vec<u8>>,
}

/// The server; it stops when dropped (a hanging response is then closed).
#[derive(Debug)]
pub struct FaultServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl FaultServer {
    /// Start on a free loopback port.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub fn start() -> Result<Self, Error> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| Error(format!("cannot bind a loopback port: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error(format!("no local address: {e}")))?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (state, stop) = (state.clone(), stop.clone());
                    std::thread::spawn(move || serve(stream, &state, &stop));
                }
            })
        };
        Ok(FaultServer {
            addr,
            state,
            stop,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    #[must_use]
    pub fn uri(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next requests meet these faults, in order; later ones are
    /// accepted.
    pub fn script(&self, faults: impl IntoIterator<Item = Fault>) {
        self.lock().script.extend(faults);
    }

    /// Answer 400 to any request whose (decompressed) body holds `marker`,
    /// whatever the script says.
    pub fn reject_marked(&self, marker: &str) {
        self.lock().marker = Some(marker.as_bytes().to_vec());
    }

    /// Answer 401 to any request whose `Authorization` is not `expected`.
    pub fn require_authorization(&self, expected: &str) {
        self.lock().authorization = Some(expected.to_owned());
    }

    /// Answer a request that would be accepted as Elasticsearch's bulk
    /// API does: 200 with `{"took":1,"errors":...,"items":[...]}`, one
    /// item for each action line and document that follow it, stored
    /// (201) unless [`fail_bulk_item`](Self::fail_bulk_item) says
    /// otherwise. A `create` item whose `_id` was stored before is
    /// answered 409, as Elasticsearch does.
    pub fn answer_bulk(&self) {
        self.lock().bulk = true;
    }

    /// With [`answer_bulk`](Self::answer_bulk): the item whose document
    /// holds `marker` is answered `status` (with an `error` object),
    /// `times` times (`usize::MAX`: always); the other items of its
    /// request are stored.
    pub fn fail_bulk_item(&self, marker: &str, status: u16, times: usize) {
        self.lock().item_faults.push(ItemFault {
            marker: marker.as_bytes().to_vec(),
            status,
            times,
        });
    }

    /// With [`answer_bulk`](Self::answer_bulk): the documents of the
    /// items answered 2xx, in order (a document stored twice is here
    /// twice).
    #[must_use]
    pub fn bulk_stored(&self) -> Vec<String> {
        self.lock().stored.clone()
    }

    /// Every request received so far, in order of arrival.
    #[must_use]
    pub fn log(&self) -> Vec<Logged> {
        self.lock().log.clone()
    }

    /// The requests answered 2xx, in order of arrival.
    #[must_use]
    pub fn accepted(&self) -> Vec<Logged> {
        self.log()
            .into_iter()
            .filter(|l| l.status.is_some_and(|s| (200..300).contains(&s)))
            .collect()
    }

    /// The lines of every accepted body (NDJSON records), in order.
    #[must_use]
    pub fn accepted_lines(&self) -> Vec<String> {
        self.accepted()
            .iter()
            .flat_map(|l| {
                String::from_utf8_lossy(&l.body)
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// Serve one connection's requests until it closes.
fn serve(stream: TcpStream, state: &Mutex<State>, stop: &AtomicBool) {
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let mut writer = writer;
    let mut reader = BufReader::new(stream);
    loop {
        let Some((target, headers)) = read_head(&mut reader) else {
            return;
        };
        let at = Instant::now();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let fault = {
            let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
            state.script.pop_front()
        };
        if fault == Some(Fault::Reset) {
            log(state, at, target, headers, None, Vec::new());
            // Dropping both halves with the body unread resets the
            // connection.
            return;
        }
        let length: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut raw = vec![0; length];
        if reader.read_exact(&mut raw).is_err() {
            return;
        }
        let body = decode(header("content-encoding").as_deref(), raw);
        let (marked, authorized) = {
            let state = state.lock().unwrap_or_else(PoisonError::into_inner);
            let marked = state
                .marker
                .as_ref()
                .is_some_and(|m| body.windows(m.len()).any(|w| w == m.as_slice()));
            let authorized = state
                .authorization
                .as_ref()
                .is_none_or(|a| header("authorization").as_deref() == Some(a));
            (marked, authorized)
        };
        let (status, retry_after) = match fault {
            _ if !authorized => (401, None),
            _ if marked => (400, None),
            Some(Fault::Status {
                status,
                retry_after,
            }) => (status, retry_after),
            Some(Fault::Slow(wait)) => {
                std::thread::sleep(wait);
                (200, None)
            }
            Some(Fault::Hang) => {
                log(state, at, target, headers, None, body);
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return;
            }
            Some(Fault::Reset) | None => (200, None),
        };
        let bulk = status == 200 && state.lock().unwrap_or_else(PoisonError::into_inner).bulk;
        let text: Vec<u8> = match status {
            400 => b"a marked record is in this request".to_vec(),
            401 => b"unauthorized".to_vec(),
            _ if bulk => bulk_answer(state, &body),
            _ => Vec::new(),
        };
        let mut response = format!(
            "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\n",
            reason(status),
            text.len()
        );
        if let Some(retry_after) = retry_after {
            response.push_str(&format!("retry-after: {retry_after}\r\n"));
        }
        response.push_str("\r\n");
        // Logged before the answer, so a client that has the answer finds
        // its request in the log.
        log(state, at, target, headers, Some(status), body);
        if writer.write_all(response.as_bytes()).is_err()
            || writer.write_all(&text).is_err()
            || writer.flush().is_err()
        {
            return;
        }
    }
}

/// The bulk API's answer to `body` (action lines, each followed by its
/// document), storing the items that do not fail.
fn bulk_answer(state: &Mutex<State>, body: &[u8]) -> Vec<u8> {
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    let mut lines = body.split(|&b| b == b'\n').filter(|l| !l.is_empty());
    let mut items = Vec::new();
    let mut errors = false;
    while let (Some(action), Some(document)) = (lines.next(), lines.next()) {
        let create = action.starts_with(b"{\"create\"");
        let name = if create { "create" } else { "index" };
        let has_id = action.windows(6).any(|w| w == b"\"_id\":");
        let state = &mut *state;
        let fault = state
            .item_faults
            .iter_mut()
            .find(|f| f.times > 0 && document.windows(f.marker.len()).any(|w| w == f.marker));
        let status = match fault {
            Some(fault) => {
                fault.times -= 1;
                fault.status
            }
            None if create && has_id && state.stored_ids.contains(action) => 409,
            None => {
                state
                    .stored
                    .push(String::from_utf8_lossy(document).into_owned());
                if has_id {
                    state.stored_ids.insert(action.to_vec());
                }
                201
            }
        };
        if (200..300).contains(&status) {
            items.push(format!(
                "{{\"{name}\":{{\"_index\":\"test\",\"status\":{status}}}}}"
            ));
        } else {
            errors = true;
            items.push(format!(
                "{{\"{name}\":{{\"_index\":\"test\",\"status\":{status},\"error\":\
                 {{\"type\":\"injected\",\"reason\":\"an injected item fault\"}}}}}}"
            ));
        }
    }
    format!(
        "{{\"took\":1,\"errors\":{errors},\"items\":[{}]}}",
        items.join(",")
    )
    .into_bytes()
}

fn log(
    state: &Mutex<State>,
    at: Instant,
    target: String,
    headers: Vec<(String, String)>,
    status: Option<u16>,
    body: Vec<u8>,
) {
    state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .log
        .push(Logged {
            at,
            target,
            headers,
            status,
            body,
        });
}

/// The request target and headers, or `None` when the connection ended.
fn read_head(reader: &mut BufReader<TcpStream>) -> Option<(String, Vec<(String, String)>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let target = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Some((target, headers));
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
    }
}

/// The body as sent before `encoding` compressed it (as received when it
/// cannot be decoded).
fn decode(encoding: Option<&str>, raw: Vec<u8>) -> Vec<u8> {
    match encoding {
        Some("gzip") => {
            let mut out = Vec::new();
            match flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut out) {
                Ok(_) => out,
                Err(_) => raw,
            }
        }
        Some("zstd") => zstd::decode_all(&raw[..]).unwrap_or(raw),
        _ => raw,
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
