//! Throttling: an S3 endpoint that answers 503 SlowDown, then 429, then
//! takes the object.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use etl_ack::AckStatus;
use etl_object_store::ObjectStoreSink;
use etl_sink::SinkDriver;

use crate::support::{config, deliver, record};

/// Answers the first requests with `refusals` (status, body), the rest
/// with 200; records the method and path of every request.
fn throttling_endpoint(refusals: Vec<(u16, &'static str)>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let refusals = Arc::new(Mutex::new(refusals.into_iter()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let log = log.clone();
            let refusals = refusals.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let request = line.trim().to_owned();
                    let mut length = 0usize;
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).unwrap_or(0) == 0 {
                            return;
                        }
                        let header = header.trim();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    log.lock().unwrap().push(request);
                    let answer = refusals.lock().unwrap().next();
                    let response = match answer {
                        Some((status, body)) => format!(
                            "HTTP/1.1 {status} Refused\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        ),
                        None => {
                            "HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\n\r\n".to_owned()
                        }
                    };
                    if stream.write_all(response.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (endpoint, seen)
}

const SLOW_DOWN: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_with_backoff_until_the_store_takes_the_object() {
    let (endpoint, seen) = throttling_endpoint(vec![(503, SLOW_DOWN), (429, ""), (503, SLOW_DOWN)]);
    let text = format!(
        r#"
        key = "t/{{partition}}-{{first_offset}}.ndjson"
        [store]
        kind = "s3"
        bucket = "b"
        endpoint = "{endpoint}"
        access_key_id = "k"
        secret_access_key = "s"
        [requests]
        initial_backoff = "10ms"
        max_backoff = "50ms"
        "#
    );
    let folder = tempfile::tempdir().unwrap();
    let sink = ObjectStoreSink::new("lake", folder.path(), config(&text)).unwrap();
    let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new()).spawn();
    let (statuses, closed) = deliver(driver, vec![vec![record(0, 0, "{}")]]).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        seen.iter()
            .all(|r| r.starts_with("PUT /b/t/0-00000000000000000000.ndjson")),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_credential_or_a_wrong_region_halts_at_once_with_an_output_error() {
    const DENIED: &str = "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>";
    const REGION: &str = "<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region 'us-east-1' is wrong; expecting 'eu-west-1'</Message></Error>";
    for (status, body, why) in [
        (403, DENIED, "denied"),
        (400, REGION, "refused the request"),
    ] {
        let (endpoint, seen) = throttling_endpoint(vec![(status, body); 20]);
        let text = format!(
            r#"
            key = "t/{{partition}}-{{first_offset}}.ndjson"
            [store]
            kind = "s3"
            bucket = "b"
            endpoint = "{endpoint}"
            access_key_id = "k"
            secret_access_key = "very-secret-value"
            "#
        );
        let folder = tempfile::tempdir().unwrap();
        let sink = ObjectStoreSink::new("lake", folder.path(), config(&text)).unwrap();
        let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new()).spawn();
        let (statuses, closed) = deliver(driver, vec![vec![record(0, 0, "{}")]]).await;
        assert_eq!(statuses, [AckStatus::Failed], "{status}");
        let err = closed.unwrap_err();
        for part in ["\"lake\"", "s3://b/t/0-00000000000000000000.ndjson", why] {
            assert!(err.contains(part), "{status}: {part} in {err}");
        }
        assert!(!err.contains("very-secret-value"), "{err}");
        assert_eq!(seen.lock().unwrap().len(), 1, "{status}: not retried");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_stops_answering_fails_the_write_within_its_request_bounds() {
    // Takes connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            held.push(stream);
        }
    });
    let text = format!(
        r#"
        key = "t/{{partition}}-{{first_offset}}.ndjson"
        [store]
        kind = "s3"
        bucket = "b"
        endpoint = "{endpoint}"
        access_key_id = "k"
        secret_access_key = "s"
        [requests]
        timeout = "300ms"
        max_retries = 2
        retry_timeout = "2s"
        initial_backoff = "10ms"
        max_backoff = "50ms"
        "#
    );
    let folder = tempfile::tempdir().unwrap();
    let sink = ObjectStoreSink::new("lake", folder.path(), config(&text)).unwrap();
    let driver = SinkDriver::new(sink, etl_sink::NdjsonEncoder::new())
        .config(etl_sink::SinkDriverConfig {
            retry: etl_sink::RetryPolicy::never(),
            ..etl_sink::SinkDriverConfig::default()
        })
        .spawn();
    let started = std::time::Instant::now();
    let (statuses, closed) = deliver(driver, vec![vec![record(0, 0, "{}")]]).await;
    assert_eq!(statuses, [AckStatus::Failed]);
    let err = closed.unwrap_err();
    assert!(
        err.contains("s3://b/t/0-00000000000000000000.ndjson"),
        "{err}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}
