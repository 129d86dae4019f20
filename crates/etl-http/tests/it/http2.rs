//! HTTP/2: the sink speaks it to a receiver that takes only HTTP/2
//! (cleartext, with prior knowledge), and every record arrives.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use etl_ack::AckStatus;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::support::{batches, deliver, drive, driver_config, ids, sink};

/// Versions and bodies of the requests an HTTP/2-only server received.
type Seen = Arc<Mutex<Vec<(Version, String)>>>;

/// An h2c server on loopback (it speaks nothing but HTTP/2); its URI.
async fn h2c_server(seen: Seen) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let version = req.version();
                        let body = req.into_body().collect().await.map(|b| b.to_bytes());
                        let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
                        seen.lock().unwrap().push((version, body));
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}/ingest")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_arrives_over_http2_with_prior_knowledge() {
    let seen: Seen = Arc::default();
    let uri = h2c_server(seen.clone()).await;
    let http = sink(&format!("uri = \"{uri}\"\nhttp2_prior_knowledge = true\n"));
    let (driver, letters) = drive(http, driver_config(25, 2));
    let (statuses, closed) = deliver(driver, batches(500, 50)).await;
    closed.unwrap();
    assert!(
        statuses.iter().all(|s| *s == AckStatus::Delivered),
        "{statuses:?}"
    );
    assert!(letters.records().is_empty());
    let seen = seen.lock().unwrap();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|(v, _)| *v == Version::HTTP_2),
        "{:?}",
        seen.iter().map(|(v, _)| *v).collect::<Vec<_>>()
    );
    let lines: Vec<String> = seen
        .iter()
        .flat_map(|(_, body)| body.lines().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    assert_eq!(lines.len(), 500, "each record once");
    assert_eq!(ids(&lines), (0..500).collect());
}
