//! An S3-compatible object store on loopback, for a broker whose data
//! must outlive a restart.
//!
//! Tansu keeps its data in memory unless it is given another storage
//! engine; of those built into the pinned binary, only `s3://` keeps data
//! across a restart. [`S3Server::start`] runs moto's S3 server (pinned,
//! installed from PyPI into a virtual environment under
//! `target/moto/` the first time) on a free loopback port and creates
//! buckets on request; [`S3Server::tansu_env`] is what a broker needs to
//! store in it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::{Error, free_port, wait_listening, with_file_lock, workspace_root};

/// The pinned server: moto's S3 implementation, which honours the
/// conditional writes (`If-Match`, `If-None-Match`) Tansu's storage
/// relies on.
pub const MOTO: &str = "moto[server]==5.2.5";
/// Every package it installs, pinned too (`pip install -c`).
const CONSTRAINTS: &str = include_str!("../moto-constraints.txt");

/// A running S3-compatible server, killed when dropped.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    port: u16,
}

impl S3Server {
    /// Install the server if needed, start it on a free loopback port and
    /// wait until it answers.
    pub fn start() -> Result<S3Server, Error> {
        let program = moto_server()?;
        let mut last = Error(String::from("no attempt made"));
        for _ in 0..3 {
            let port = free_port()?;
            let mut child = Command::new(&program)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| Error(format!("cannot start {}: {e}", program.display())))?;
            match wait_listening("the S3 server", &mut child, port, Duration::from_secs(60)) {
                Ok(()) => return Ok(S3Server { child, port }),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Create a bucket (the server takes any credentials).
    pub fn create_bucket(&self, name: &str) -> Result<(), Error> {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let fail = |what: &str, e: std::io::Error| {
            Error(format!("creating bucket {name} on {addr}: {what}: {e}"))
        };
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .map_err(|e| fail("connect", e))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| fail("timeout", e))?;
        write!(
            stream,
            "PUT /{name} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .map_err(|e| fail("request", e))?;
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .map_err(|e| fail("answer", e))?;
        let status = answer.lines().next().unwrap_or_default();
        if status.split_whitespace().nth(1) == Some("200") {
            Ok(())
        } else {
            Err(Error(format!(
                "creating bucket {name} on {addr}: the server answered {status:?}"
            )))
        }
    }

    /// The environment a Tansu broker with `--storage-engine
    /// s3://BUCKET/` needs to store in this server.
    pub fn tansu_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".to_owned()),
            ("AWS_ACCESS_KEY_ID", "etl-test".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "etl-test".to_owned()),
            ("AWS_DEFAULT_REGION", "us-east-1".to_owned()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `target/moto/venv/bin/moto_server`, installing it first if missing.
fn moto_server() -> Result<PathBuf, Error> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one_thread_at_a_time = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = workspace_root().join("target").join("moto");
    let program = cache.join("venv").join("bin").join("moto_server");
    // Written last: an install cut short is done again.
    let marker = cache.join("installed");
    let installed =
        || program.is_file() && std::fs::read_to_string(&marker).is_ok_and(|m| m == MOTO);
    if installed() {
        return Ok(program);
    }
    // One process at a time: `venv --clear` would wipe another's install.
    with_file_lock("moto", || {
        if installed() {
            return Ok(program.clone());
        }
        install(&cache, &marker)?;
        if program.is_file() {
            Ok(program.clone())
        } else {
            Err(Error(format!(
                "pip installed {MOTO} but {} is missing",
                program.display()
            )))
        }
    })
}

/// A virtual environment in `cache/venv` with the pinned server in it.
fn install(cache: &Path, marker: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(cache)
        .map_err(|e| Error(format!("cannot create {}: {e}", cache.display())))?;
    let venv = cache.join("venv");
    eprintln!(
        "installing the test S3 server ({MOTO}) into {}",
        venv.display()
    );
    let run = |program: &str, args: &[&str]| -> Result<(), Error> {
        let status = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .status()
            .map_err(|e| Error(format!("cannot run {program}: {e}")))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error(format!(
                "`{program} {}` failed: {status}",
                args.join(" ")
            )))
        }
    };
    let constraints = cache.join("constraints.txt");
    std::fs::write(&constraints, CONSTRAINTS)
        .map_err(|e| Error(format!("cannot write {}: {e}", constraints.display())))?;
    run(
        "python3",
        &["-m", "venv", "--clear", &venv.to_string_lossy()],
    )?;
    run(
        &venv.join("bin").join("pip").to_string_lossy(),
        &[
            "install",
            "-q",
            "--disable-pip-version-check",
            "-c",
            &constraints.to_string_lossy(),
            MOTO,
        ],
    )?;
    std::fs::write(marker, MOTO)
        .map_err(|e| Error(format!("cannot write {}: {e}", marker.display())))
}
