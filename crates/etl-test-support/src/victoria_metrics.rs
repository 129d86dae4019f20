//! A throwaway VictoriaMetrics server on loopback, a second real receiver
//! for the HTTP sink's suite (its `/api/v1/import` takes JSON lines).
//!
//! [`start`] finds `victoria-metrics` (installing Debian's
//! `victoria-metrics` package if it is missing and we are root) and starts
//! it on a free `127.0.0.1` port with its data in a fresh temporary
//! directory; [`VictoriaMetrics`] answers HTTP GETs, and kills the server
//! and removes the directory when dropped (or, through a reaper shell as
//! for ClickHouse, when this process dies).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Error;

/// Where Debian's package puts the server.
const SERVER: &str = "/usr/bin/victoria-metrics";

/// A running server in a temporary directory, stopped and removed on drop.
#[derive(Debug)]
pub struct VictoriaMetrics {
    port: u16,
    server: Option<Child>,
    reaper: Option<(Child, ChildStdin)>,
}

/// Start a server.
///
/// # Errors
///
/// When the server cannot be installed or started.
pub fn start() -> Result<VictoriaMetrics, Error> {
    let binary = install()?;
    let port = crate::free_port()?;
    let dir = std::env::temp_dir().join(format!("etl-victoria-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error(format!("cannot create {}: {e}", dir.display())))?;
    let child = Command::new(&binary)
        .arg(format!("-storageDataPath={}", dir.join("data").display()))
        .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
        // Samples of any age are kept (the default keeps a month).
        .arg("-retentionPeriod=100y")
        .arg("-loggerLevel=ERROR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| Error(format!("cannot start {}: {e}", binary.display())))?;
    let pid = child.id();
    let mut server = VictoriaMetrics {
        port,
        server: Some(child),
        reaper: None,
    };
    server.reaper = Some(spawn_reaper(pid, &dir)?);
    let started = Instant::now();
    loop {
        if server.get("/health").is_ok() {
            return Ok(server);
        }
        if let Some(Ok(Some(status))) = server.server.as_mut().map(Child::try_wait) {
            return Err(Error(format!(
                "victoria-metrics exited before answering: {status}"
            )));
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(Error(
                "victoria-metrics did not answer within 30 s".to_owned(),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl VictoriaMetrics {
    /// `http://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// GET `path` (with its query); the body of a 2xx answer.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or answers otherwise.
    pub fn get(&self, path: &str) -> Result<String, Error> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let fail = |e: std::io::Error| Error(format!("VictoriaMetrics at {addr}: {e}"));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(fail)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(fail)?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(fail)?;
        let mut response = String::new();
        stream.read_to_string(&mut response).map_err(fail)?;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        match head.split_whitespace().nth(1) {
            Some(status) if status.starts_with('2') => Ok(body.to_owned()),
            _ => Err(Error(format!(
                "VictoriaMetrics refused GET {path}: {head}\n{body}"
            ))),
        }
    }
}

impl Drop for VictoriaMetrics {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some((mut reaper, stdin)) = self.reaper.take() {
            drop(stdin);
            let _ = reaper.wait();
        }
    }
}

/// The server binary, installed from Debian's packages when it is missing
/// and we are root.
///
/// # Errors
///
/// When it is missing and cannot be installed.
pub fn install() -> Result<PathBuf, Error> {
    crate::apt_install(SERVER, "victoria-metrics")
}

/// A shell that, once its standard input closes, kills `pid` and removes
/// `dir`.
fn spawn_reaper(pid: u32, dir: &std::path::Path) -> Result<(Child, ChildStdin), Error> {
    let script =
        r#"trap '' INT TERM HUP; cat > /dev/null; kill -KILL "$1" 2>/dev/null; rm -rf -- "$2""#;
    let mut child = Command::new("sh")
        .args(["-c", script, "reaper", &pid.to_string()])
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| Error(format!("cannot start the cleanup shell: {e}")))?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| Error("the cleanup shell has no input".to_owned()))?;
    Ok((child, stdin))
}
