//! A minimal HTTP endpoint serving the metrics page at `GET /metrics`.
//!
//! It answers one request per connection and closes it, which is all a
//! Prometheus scraper needs; anything else gets a 404 or 405.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Renders the current metrics page.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Bind `addr` and serve metrics until the returned task is aborted.
///
/// # Errors
///
/// The bind error, naming the address.
pub async fn serve_metrics(
    addr: SocketAddr,
    render: Render,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {addr} for metrics: {e}"),
        )
    })?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let render = render.clone();
                    tokio::spawn(async move {
                        if let Err(e) = answer(stream, &render).await {
                            tracing::debug!(error = %e, "metrics request failed");
                        }
                    });
                }
                Err(e) => tracing::warn!(error = %e, "metrics endpoint cannot accept"),
            }
        }
    });
    Ok((local, task))
}

async fn answer(mut stream: TcpStream, render: &Render) -> std::io::Result<()> {
    let mut buf = [0u8; 2048];
    let mut len = 0;
    // Read until the end of the request line; headers are not needed.
    while !buf[..len].contains(&b'\n') && len < buf.len() {
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            break;
        }
        len += n;
    }
    let line = String::from_utf8_lossy(&buf[..len]);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", render()),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "not found; try /metrics\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is supported\n".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn serves_the_page_and_refuses_the_rest() {
        let render: Render = Arc::new(|| "etl_up 1\n".to_owned());
        let (addr, task) = serve_metrics("127.0.0.1:0".parse().unwrap(), render)
            .await
            .unwrap();
        let get = |req: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.ends_with("etl_up 1\n"));
        assert!(get("GET / HTTP/1.1\r\n\r\n").await.contains("404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").await.contains("405"));
        task.abort();
    }
}
