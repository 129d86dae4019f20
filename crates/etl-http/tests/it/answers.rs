//! Answers that are not what they seem, from a server that writes raw
//! bytes: a 2xx cut off before its body ends, an endless error body, a
//! request head the configuration's headers must not change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use etl_ack::AckStatus;
use etl_sink::{PermanentErrorPolicy, SinkDriverConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{batches, deliver, drive, driver_config};

/// What the server does with one connection, in order; the last is
/// repeated.
#[derive(Clone)]
enum Answer {
    /// Write these bytes, then close.
    Raw(&'static str),
    /// A 500 whose chunked body never ends.
    Endless,
}

/// A server that answers each connection's first request with the next
/// [`Answer`], and keeps every request head and the bytes it wrote.
struct RawServer {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
    written: Arc<AtomicU64>,
}

impl RawServer {
    async fn start(answers: Vec<Answer>) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::new(AtomicU64::new(0));
        let (h, w) = (heads.clone(), written.clone());
        tokio::spawn(async move {
            let mut next = 0;
            while let Ok((stream, _)) = listener.accept().await {
                let answer = answers[next.min(answers.len() - 1)].clone();
                next += 1;
                tokio::spawn(serve(stream, answer, h.clone(), w.clone()));
            }
        });
        RawServer {
            port,
            heads,
            written,
        }
    }

    fn uri(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn serve(
    mut stream: TcpStream,
    answer: Answer,
    heads: Arc<Mutex<Vec<String>>>,
    written: Arc<AtomicU64>,
) {
    // The head, then as many body bytes as it announces.
    let mut request = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        let Ok(n) = stream.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        request.extend_from_slice(&buf[..n]);
        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&request[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while request.len() < head_end + length {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    heads.lock().unwrap().push(head);
    match answer {
        Answer::Raw(bytes) => {
            let _ = stream.write_all(bytes.as_bytes()).await;
            written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        Answer::Endless => {
            let head = "HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n";
            if stream.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = format!("4000\r\n{}\r\n", "e".repeat(0x4000));
            while stream.write_all(chunk.as_bytes()).await.is_ok() {
                written.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        }
    }
    let _ = stream.shutdown().await;
}

const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_whose_body_is_cut_off_is_sent_again() {
    // ClickHouse answers 200 before an insert ends and reports a late
    // failure inside the body; a body cut short is no verdict.
    let server = RawServer::start(vec![
        Answer::Raw("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nCode: 241"),
        Answer::Raw(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\nCode: 241\r\n5\r\nDB::E",
        ),
        Answer::Raw(OK),
    ])
    .await;
    let sink = crate::support::sink(&format!(
        "uri = \"{}\"\ntimeout = \"2s\"",
        server.uri("/in")
    ));
    ten_delivered_in_one_write(sink).await;
    assert_eq!(
        server.heads().len(),
        3,
        "a 2xx whose body did not arrive whole was taken as delivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_error_body_is_not_read_past_what_the_message_shows() {
    let server = RawServer::start(vec![Answer::Endless, Answer::Raw(OK)]).await;
    let sink = crate::support::sink(&format!(
        "uri = \"{}\"\ntimeout = \"3s\"",
        server.uri("/in")
    ));
    let (driver, _letters) = drive(sink, driver_config(10, 1));
    let (statuses, closed) = deliver(driver, batches(10, 10)).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    // Socket buffers hold a few MiB; reading the body to its end (or to
    // the timeout) takes gigabytes at loopback speed.
    let written = server.written.load(Ordering::Relaxed);
    assert!(
        written < 64 << 20,
        "the client read {written} bytes of an error body it shows 512 of"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_content_type_replaces_the_sinks_own() {
    let server = RawServer::start(vec![Answer::Raw(OK)]).await;
    let sink = crate::support::sink(&format!(
        "uri = \"{}\"\nheaders = {{ \"Content-Type\" = \"text/plain\" }}",
        server.uri("/in")
    ));
    let (driver, _letters) = drive(sink, driver_config(10, 1));
    let (statuses, closed) = deliver(driver, batches(10, 10)).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    let heads = server.heads();
    let types: Vec<&str> = heads[0]
        .lines()
        .filter(|l| l.starts_with("content-type:"))
        .collect();
    assert_eq!(types, ["content-type: text/plain"], "{heads:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uri_that_does_not_parse_is_shown_without_its_query_in_the_dead_letter() {
    let server = RawServer::start(vec![Answer::Raw(OK)]).await;
    let sink = crate::support::sink(&format!(
        "uri = \"http://{{h}}:{}/x?api_key=QUERYSECRET1\"",
        server.port
    ));
    let (driver, letters) = drive(sink, driver_config(1, 1));
    let records = vec![vec![crate::support::record(0, r#"{"h":"bad host"}"#)]];
    let (_statuses, closed) = deliver(driver, records).await;
    closed.unwrap();
    let letters = String::from_utf8_lossy(&letters.bytes()).into_owned();
    assert!(letters.contains("not a URI"), "{letters}");
    assert!(!letters.contains("QUERYSECRET1"), "{letters}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_value_is_a_dot_segment_is_refused_not_sent_up_the_path() {
    let server = RawServer::start(vec![Answer::Raw(OK)]).await;
    let sink = crate::support::sink(&format!(
        "uri = \"{}\"",
        server.uri("/tenants/{tenant}/{idx}/ingest?v={idx}")
    ));
    let (driver, letters) = drive(sink, driver_config(1, 1));
    let records = vec![
        vec![crate::support::record(0, r#"{"tenant":"t0","idx":".."}"#)],
        vec![crate::support::record(1, r#"{"tenant":"t0","idx":"."}"#)],
        vec![crate::support::record(2, r#"{"tenant":"t0","idx":""}"#)],
    ];
    let (_statuses, closed) = deliver(driver, records).await;
    closed.unwrap();
    assert_eq!(server.heads(), Vec::<String>::new(), "a request was sent");
    assert_eq!(letters.records().len(), 3);
}

/// A bulk answer storing `items` items, each with `pad` bytes of an
/// `_index` name, as a whole HTTP response.
fn bulk_answer(items: usize, pad: usize) -> &'static str {
    let item = format!(
        "{{\"index\":{{\"_index\":\"{}\",\"status\":201}}}}",
        "l".repeat(pad)
    );
    let body = format!(
        "{{\"took\":9,\"errors\":false,\"items\":[{}]}}",
        vec![item; items].join(",")
    );
    answered_200(&body)
}

fn bulk_sink(server: &RawServer) -> etl_http::HttpSink {
    crate::support::sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\ntimeout = \"2s\"",
        server.uri("/logs/_bulk")
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_answer_cut_off_after_errors_false_is_sent_again() {
    // `errors: false` arrived, but the answer did not end: no verdict.
    let server = RawServer::start(vec![
        Answer::Raw("HTTP/1.1 200 OK\r\ncontent-length: 300\r\n\r\n{\"took\":1,\"errors\":false,\"items\":["),
        Answer::Raw(bulk_answer(10, 4)),
    ])
    .await;
    ten_delivered_in_one_write(bulk_sink(&server)).await;
    assert_eq!(
        server.heads().len(),
        2,
        "a cut-off bulk answer was taken as delivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_bulk_answer_is_judged_by_its_start_and_read_to_its_end() {
    // Ten items of 1 KiB: their statuses are counted past the 4 KiB kept
    // (one item a record, or the answer is not this request's).
    let server = RawServer::start(vec![Answer::Raw(bulk_answer(10, 1024))]).await;
    ten_delivered_in_one_write(bulk_sink(&server)).await;
    assert_eq!(server.heads().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_answer_with_another_number_of_items_than_records_halts() {
    for items in [1, 9, 11, 10_000] {
        let server = RawServer::start(vec![Answer::Raw(bulk_answer(items, 4))]).await;
        let (driver, letters) = drive(bulk_sink(&server), driver_config(10, 1));
        let (statuses, closed) = deliver(driver, batches(10, 10)).await;
        let err = closed.unwrap_err().to_string();
        assert!(
            err.contains(&format!("holds {items} items for the request's 10 records")),
            "{err}"
        );
        assert!(!statuses.contains(&AckStatus::Delivered), "{statuses:?}");
        assert!(letters.records().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2xx_that_is_not_a_bulk_answer_halts_rather_than_counting_as_delivered() {
    let server = RawServer::start(vec![Answer::Raw(OK)]).await;
    let (driver, letters) = drive(bulk_sink(&server), driver_config(10, 1));
    let (statuses, closed) = deliver(driver, batches(10, 10)).await;
    let err = closed.unwrap_err().to_string();
    assert!(
        err.contains("not a bulk API answer") && err.contains("_bulk"),
        "{err}"
    );
    assert!(!statuses.contains(&AckStatus::Delivered), "{statuses:?}");
    assert!(letters.records().is_empty());
}

/// A bulk answer of `statuses`, one item each, `errors: true` when one
/// is not 2xx, as a whole HTTP response.
fn bulk_failed(action: &str, statuses: &[u16]) -> &'static str {
    let items: Vec<String> = statuses
        .iter()
        .map(|s| format!("{{\"{action}\":{{\"_index\":\"o\",\"status\":{s}}}}}"))
        .collect();
    let errors = statuses.iter().any(|s| !(200..300).contains(s));
    let body = format!(
        "{{\"took\":2,\"errors\":{errors},\"items\":[{}]}}",
        items.join(",")
    );
    answered_200(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_refused_for_now_send_the_request_again_whole_not_in_halves() {
    // Elasticsearch's back-pressure: 429 items inside a 200. Under the
    // default `on_permanent_error = "fail"` too, the request is sent
    // again after the driver's backoff, never narrowed down.
    let mut statuses = vec![201u16; 10];
    statuses[3] = 429;
    statuses[7] = 503;
    let server = RawServer::start(vec![
        Answer::Raw(bulk_failed("index", &statuses)),
        Answer::Raw(bulk_answer(10, 4)),
    ])
    .await;
    let config = SinkDriverConfig {
        on_permanent_error: PermanentErrorPolicy::Fail,
        ..driver_config(10, 1)
    };
    let (driver, letters) = drive(bulk_sink(&server), config);
    let (statuses, closed) = deliver(driver, batches(10, 10)).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    assert!(letters.records().is_empty());
    assert_eq!(server.heads().len(), 2, "sent again whole, once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_create_whose_ids_all_exist_is_delivered_at_once() {
    let server = RawServer::start(vec![Answer::Raw(bulk_failed("create", &[409; 10]))]).await;
    let sink = crate::support::sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\ntimeout = \"2s\"\n\
         bulk = {{ action = \"create\" }}",
        server.uri("/logs/_bulk")
    ));
    ten_delivered_in_one_write(sink).await;
    assert_eq!(
        server.heads().len(),
        1,
        "not narrowed down record by record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_id_under_index_is_no_delivery() {
    // `index` overwrites: a 409 there is a version conflict, the record
    // not stored. Narrowed down to its record, which is dead-lettered.
    let mut first = vec![201u16; 2];
    first[1] = 409;
    let server = RawServer::start(vec![
        Answer::Raw(bulk_failed("index", &first)),
        Answer::Raw(bulk_failed("index", &[201])),
        Answer::Raw(bulk_failed("index", &[409])),
    ])
    .await;
    let (driver, letters) = drive(bulk_sink(&server), driver_config(2, 1));
    let (statuses, closed) = deliver(driver, batches(2, 2)).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    assert_eq!(letters.records().len(), 1, "{:?}", letters.records());
    assert_eq!(server.heads().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_echoing_the_request_shows_none_of_its_secrets() {
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode("etl:echo-SECRET-7");
    let body = format!(
        "{{\"headers\":{{\"Authorization\":\"Basic {basic}\",\"X-Key\":\"hdr-SECRET-8\"}}}}"
    );
    let server = RawServer::start(vec![Answer::Raw(answered_200(&body))]).await;
    let sink = crate::support::sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\ntimeout = \"2s\"\n\
         headers = {{ \"X-Key\" = \"hdr-SECRET-8\" }}\n\
         auth = {{ strategy = \"basic\", user = \"etl\", password = \"echo-SECRET-7\" }}",
        server.uri("/anything")
    ));
    let text = halted_on_a_2xx_that_is_no_bulk_answer(sink).await;
    assert!(text.contains("[REDACTED]"), "{text}");
    assert!(!text.contains("SECRET") && !text.contains(&basic), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_echoing_a_secret_too_short_to_take_out_is_not_shown() {
    // A three-byte secret cannot be taken out of a text without taking
    // out whatever else spells those bytes: the answer is not shown.
    let body = "{\"echo\":{\"password\":\"q7Z\"}}";
    let server = RawServer::start(vec![Answer::Raw(answered_200(body))]).await;
    let sink = crate::support::sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\ntimeout = \"2s\"\n\
         auth = {{ strategy = \"basic\", user = \"etl\", password = \"q7Z\" }}",
        server.uri("/anything")
    ));
    let text = halted_on_a_2xx_that_is_no_bulk_answer(sink).await;
    assert!(!text.contains("q7Z"), "{text}");
    assert!(text.contains("not shown"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_echoed_across_the_excerpts_end_shows_none_of_its_bytes() {
    // The excerpt ends 512 bytes in; the echoed secret starts 7 bytes
    // before that, so cutting first and redacting after would show its
    // first 7 bytes.
    let body = format!("{}\"wraps-SECRET-9\"", "x".repeat(504));
    let server = RawServer::start(vec![Answer::Raw(answered_200(&body))]).await;
    let sink = crate::support::sink(&format!(
        "uri = \"{}\"\nencoding = \"elasticsearch_bulk\"\ntimeout = \"2s\"\n\
         auth = {{ strategy = \"bearer\", token = \"wraps-SECRET-9\" }}",
        server.uri("/anything")
    ));
    let text = halted_on_a_2xx_that_is_no_bulk_answer(sink).await;
    assert!(!text.contains("wraps-"), "{text}");
}

/// Ten records through `sink`, whose receiver answers a 2xx that is no
/// bulk answer: the write halts and nothing is dead-lettered. The error's
/// text and `Debug`, for the caller to search.
async fn halted_on_a_2xx_that_is_no_bulk_answer(sink: etl_http::HttpSink) -> String {
    let (driver, letters) = drive(sink, driver_config(10, 1));
    let (_statuses, closed) = deliver(driver, batches(10, 10)).await;
    let err = closed.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(text.contains("not a bulk API answer"), "{text}");
    assert!(letters.records().is_empty());
    text
}

/// A raw `200 OK` answer of `body`, closing the connection.
fn answered_200(body: &str) -> &'static str {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .leak()
}

/// Ten records in one write through `sink`: all delivered, none
/// dead-lettered.
async fn ten_delivered_in_one_write(sink: etl_http::HttpSink) {
    let (driver, letters) = drive(sink, driver_config(10, 1));
    let (statuses, closed) = deliver(driver, batches(10, 10)).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    assert!(letters.records().is_empty(), "{:?}", letters.records());
}
