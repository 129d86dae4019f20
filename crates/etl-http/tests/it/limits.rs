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
