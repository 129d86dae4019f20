//! The HTTP endpoint serving the metrics at `GET /metrics` (axum), for
//! Prometheus to scrape.

use std::net::SocketAddr;

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use etl::MetricsHub;

/// The OpenMetrics text format's media type.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Bind `addr` and serve `hub`'s metrics until the returned task is
/// aborted. Other paths answer 404, other methods 405.
pub(crate) async fn serve(
    addr: SocketAddr,
    hub: MetricsHub,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {addr} for metrics: {e}"),
        )
    })?;
    let local = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let hub = hub.clone();
            async move { ([(CONTENT_TYPE, OPENMETRICS)], hub.prometheus()).into_response() }
        }),
    );
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics endpoint stopped");
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn serves_the_page_and_refuses_the_rest() {
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), MetricsHub::default())
            .await
            .unwrap();
        let get = |req: String| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let close = "Host: x\r\nConnection: close\r\n\r\n";
        let ok = get(format!("GET /metrics HTTP/1.1\r\n{close}")).await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.contains("openmetrics-text"), "{ok}");
        assert!(ok.contains("etl_records_read_total 0"), "{ok}");
        assert!(ok.trim_end().ends_with("# EOF"), "{ok}");
        let missing = get(format!("GET / HTTP/1.1\r\n{close}")).await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = get(format!("POST /metrics HTTP/1.1\r\n{close}")).await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        task.abort();
    }
}
