//! The rate limit, counted from the server's log.

use std::time::Duration;

use etl_ack::AckStatus;
use etl_test_support::http::FaultServer;

use crate::support::{batches, deliver, drive, driver_config, sink};

/// The most requests the log holds in any window of `window`.
fn most_in_window(arrivals: &[std::time::Instant], window: Duration) -> usize {
    (0..arrivals.len())
        .map(|i| {
            arrivals[i..]
                .iter()
                .take_while(|&&t| t - arrivals[i] < window)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_rate_limit_holds_across_concurrent_writes_and_drops_nothing() {
    let server = FaultServer::start().unwrap();
    let sink = sink(&format!(
        "uri = \"{}\"\nrate_limit = {{ requests_per_second = 20 }}",
        server.uri("/")
    ));
    // One record a write, four writes at once: unlimited, 30 requests
    // would arrive within a few milliseconds.
    let (driver, _letters) = drive(sink, driver_config(1, 4));
    let (statuses, closed) = deliver(driver, batches(30, 1)).await;
    closed.unwrap();
    assert!(statuses.iter().all(|s| *s == AckStatus::Delivered));
    let arrivals: Vec<_> = server.log().iter().map(|l| l.at).collect();
    assert_eq!(arrivals.len(), 30);
    // 20 a second, evenly spaced: at most 21 in any second (20 and the
    // one that opens the window), with 2 of slack for requests that reach
    // the server late and close up on the next (unlimited: all 30 within
    // a few milliseconds).
    let most = most_in_window(&arrivals, Duration::from_secs(1));
    assert!(most <= 23, "{most} requests within a second");
    let span = *arrivals.last().unwrap() - arrivals[0];
    assert!(
        span >= Duration::from_millis(1300),
        "30 requests in {span:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_rate_limit_spaces_requests_by_their_size() {
    let server = FaultServer::start().unwrap();
    // Each request is one record of 1000 bytes: 10 requests a second.
    let sink = sink(&format!(
        "uri = \"{}\"\nrate_limit = {{ bytes_per_second = 10000 }}",
        server.uri("/")
    ));
    let (driver, _letters) = drive(sink, driver_config(1, 4));
    let pad = "x".repeat(1000 - "{\"id\":10,\"pad\":\"\"}\n".len());
    let records: Vec<_> = (10..25)
        .map(|o| crate::support::record(o, &format!("{{\"id\":{o},\"pad\":\"{pad}\"}}")))
        .map(|r| vec![r])
        .collect();
    let (statuses, closed) = deliver(driver, records).await;
    closed.unwrap();
    assert!(statuses.iter().all(|s| *s == AckStatus::Delivered));
    let log = server.log();
    assert!(
        log.iter().all(|l| l.body.len() == 1000),
        "{:?}",
        log[0].body.len()
    );
    let arrivals: Vec<_> = log.iter().map(|l| l.at).collect();
    // 10 a second: at most 11 in any second, and 2 of slack as above.
    let most = most_in_window(&arrivals, Duration::from_secs(1));
    assert!(most <= 13, "{most} requests of 1000 bytes within a second");
    let span = *arrivals.last().unwrap() - arrivals[0];
    assert!(
        span >= Duration::from_millis(1200),
        "15 requests in {span:?}"
    );
}

/// A server on 127.0.0.1 that holds each request 50 ms before answering
/// 200, counting the requests it holds at once; returns its port and the
/// most it held.
async fn counting_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let most_seen = most.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (held, most) = (held.clone(), most.clone());
            tokio::spawn(async move {
                // The head, then as many body bytes as it announces.
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                let head_end = loop {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
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
                let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                held.fetch_sub(1, Ordering::SeqCst);
                let answer = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (port, most_seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_than_request_concurrency_requests_are_in_flight_at_once() {
    use std::sync::atomic::Ordering;

    let (port, most) = counting_server().await;
    // Four writes at once, each of five URIs (one request each): without
    // the bound, twenty requests would be held at once.
    let sink = sink(&format!(
        "uri = \"http://127.0.0.1:{port}/in/{{shard}}\"\nrequest_concurrency = 2"
    ));
    let records: Vec<_> = (0..100)
        .map(|o| crate::support::record(o, &format!("{{\"id\":{o},\"shard\":{}}}", o % 5)))
        .collect();
    let (driver, letters) = drive(sink, driver_config(10, 4));
    let (statuses, closed) = deliver(driver, records.chunks(10).map(<[_]>::to_vec).collect()).await;
    closed.unwrap();
    assert_eq!(statuses, vec![AckStatus::Delivered; 10]);
    assert!(letters.records().is_empty());
    let most = most.load(Ordering::SeqCst);
    assert_eq!(most, 2, "{most} requests were in flight at once");
}
