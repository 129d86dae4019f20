//! A throwaway ClickHouse server on loopback, for the HTTP sink's suite.
//!
//! [`start`] finds `clickhouse-server` (installing Debian's
//! `clickhouse-server` package if it is missing and we are root), writes a
//! configuration into a fresh temporary directory (data, logs and users
//! there; HTTP and native ports on `127.0.0.1` only; the `default` user
//! without a password, from loopback only) and starts it. [`ClickHouse`]
//! answers queries over HTTP, restarts the server on the same directory
//! and ports, and stops it and removes the directory when dropped.
//!
//! As for PostgreSQL, cleanup does not depend on this process exiting
//! normally: a reaper shell holds a pipe from the guard and, when the pipe
//! closes (the guard dropped, or this process killed), kills the server
//! and removes the directory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Error;

/// Where Debian's package puts the server.
const SERVER: &str = "/usr/sbin/clickhouse-server";

/// A running server in a temporary directory, stopped and removed on drop.
#[derive(Debug)]
pub struct ClickHouse {
    dir: PathBuf,
    http_port: u16,
    tcp_port: u16,
    server: Option<Child>,
    reaper: Option<(Child, ChildStdin)>,
}

/// Start a server.
///
/// # Errors
///
/// When the server cannot be installed, configured or started.
pub fn start() -> Result<ClickHouse, Error> {
    let server = install()?;
    let dir = std::env::temp_dir().join(format!(
        "etl-clickhouse-{}-{}",
        std::process::id(),
        crate::free_port()?
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error(format!("cannot create {}: {e}", dir.display())))?;
    let http_port = crate::free_port()?;
    let tcp_port = crate::free_port()?;
    write_config(&dir, http_port, tcp_port)
        .map_err(|e| Error(format!("cannot write the configuration: {e}")))?;
    let mut clickhouse = ClickHouse {
        dir,
        http_port,
        tcp_port,
        server: None,
        reaper: None,
    };
    clickhouse.reaper = Some(spawn_reaper(&clickhouse.dir)?);
    clickhouse.launch(&server)?;
    Ok(clickhouse)
}

impl ClickHouse {
    /// `http://127.0.0.1:PORT`, the HTTP interface.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// The native protocol's port (`clickhouse-client --port`).
    #[must_use]
    pub fn tcp_port(&self) -> u16 {
        self.tcp_port
    }

    /// Run `sql` over HTTP; its output, or the server's error.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached or answers other than 200.
    pub fn query(&self, sql: &str) -> Result<String, Error> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.http_port));
        let fail = |e: std::io::Error| Error(format!("ClickHouse at {addr}: {e}"));
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(fail)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(fail)?;
        write!(
            stream,
            "POST / HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n{sql}",
            sql.len()
        )
        .map_err(fail)?;
        let mut response = String::new();
        stream.read_to_string(&mut response).map_err(fail)?;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        if head.split_whitespace().nth(1) == Some("200") {
            Ok(body.to_owned())
        } else {
            Err(Error(format!("ClickHouse refused `{sql}`: {head}\n{body}")))
        }
    }

    /// Kill the server (SIGKILL: nothing flushed that it did not already
    /// hold) and start it again on the same data and ports.
    ///
    /// # Errors
    ///
    /// When it does not come back.
    pub fn restart(&mut self, down_for: Duration) -> Result<(), Error> {
        self.kill();
        std::thread::sleep(down_for);
        self.launch(Path::new(SERVER))
    }

    fn launch(&mut self, server: &Path) -> Result<(), Error> {
        let config = self.dir.join("config.xml");
        let log = std::fs::File::create(self.dir.join("stdout.log"))
            .map_err(|e| Error(format!("cannot create the server's log: {e}")))?;
        let child = Command::new(server)
            .arg(format!("--config-file={}", config.display()))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(
                log.try_clone()
                    .map_err(|e| Error(format!("cannot share the log: {e}")))?,
            )
            .stderr(log)
            .spawn()
            .map_err(|e| Error(format!("cannot start {}: {e}", server.display())))?;
        // The reaper kills it by this pid if this process dies.
        std::fs::write(self.dir.join("server.pid"), child.id().to_string())
            .map_err(|e| Error(format!("cannot record the server's pid: {e}")))?;
        self.server = Some(child);
        let started = Instant::now();
        loop {
            if self.query("SELECT 1").is_ok() {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.server.as_mut().map(Child::try_wait) {
                return Err(Error(format!(
                    "clickhouse-server exited before answering: {status}; see {}",
                    self.dir.join("log/error.log").display()
                )));
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(Error(
                    "clickhouse-server did not answer within 60 s".to_owned(),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        self.kill();
        if let Some((mut reaper, stdin)) = self.reaper.take() {
            drop(stdin);
            let _ = reaper.wait();
        }
    }
}

/// The server binary, installed from Debian's packages when it is missing
/// and we are root (`cargo xtask test` calls this before the suites, so a
/// fresh machine gets it once, up front).
///
/// # Errors
///
/// When it is missing and cannot be installed.
pub fn install() -> Result<PathBuf, Error> {
    crate::apt_install(SERVER, "clickhouse-server")
}

/// The server's configuration and users in `dir`: everything under it,
/// listening on loopback only.
fn write_config(dir: &Path, http_port: u16, tcp_port: u16) -> std::io::Result<()> {
    for sub in ["data", "tmp", "log", "user_files"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let d = dir.display();
    std::fs::write(
        dir.join("config.xml"),
        format!(
            "<yandex>\n\
             <logger><level>warning</level><log>{d}/log/server.log</log><errorlog>{d}/log/error.log</errorlog></logger>\n\
             <listen_host>127.0.0.1</listen_host>\n\
             <http_port>{http_port}</http_port>\n\
             <tcp_port>{tcp_port}</tcp_port>\n\
             <path>{d}/data/</path>\n\
             <tmp_path>{d}/tmp/</tmp_path>\n\
             <user_files_path>{d}/user_files/</user_files_path>\n\
             <users_config>{d}/users.xml</users_config>\n\
             <default_profile>default</default_profile>\n\
             <default_database>default</default_database>\n\
             <mark_cache_size>104857600</mark_cache_size>\n\
             </yandex>\n"
        ),
    )?;
    std::fs::write(
        dir.join("users.xml"),
        "<yandex>\n\
         <profiles><default></default></profiles>\n\
         <users><default><password></password><networks><ip>127.0.0.1</ip></networks>\
         <profile>default</profile><quota>default</quota></default></users>\n\
         <quotas><default></default></quotas>\n\
         </yandex>\n",
    )
}

/// A shell that, once its standard input closes (the guard dropped, or
/// this process gone in any way), kills the server whose pid the last
/// start wrote to `server.pid` and removes `dir`.
fn spawn_reaper(dir: &Path) -> Result<(Child, ChildStdin), Error> {
    let script = r#"trap '' INT TERM HUP; cat > /dev/null; kill -KILL "$(cat "$1/server.pid")" 2>/dev/null; rm -rf -- "$1""#;
    let mut child = Command::new("sh")
        .args(["-c", script, "reaper"])
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
