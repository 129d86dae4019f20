//! Garage, a real self-hosted S3 server, on loopback.
//!
//! The binary is built once per machine with `cargo install garage
//! --version GARAGE_VERSION --locked` into `~/.cache/etl-test/garage-VERSION/`
//! (outside `target/`, so a clean build keeps it; `ETL_TEST_CACHE` moves
//! it), under a file lock so that concurrent tests build it once. The build
//! takes long (hundreds of crates): start it ahead with
//! [`install`] or `cargo xtask` before a first run.
//!
//! [`Garage::start`] writes a one-node configuration (LMDB metadata, an
//! RPC secret, the S3 API and the admin API on free loopback ports),
//! starts `garage server`, waits for `garage status`, assigns and applies
//! the layout, and creates an access key through the admin CLI; buckets
//! come from [`Garage::create_bucket`]. The server is killed and its
//! folder removed when the guard drops.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Error, free_port, wait_listening};

/// The pinned version (the one the issue tracker's tests named).
pub const GARAGE_VERSION: &str = "2.5.0";
/// The region the server is configured with.
pub const REGION: &str = "garage";

/// A running Garage server, killed (and its folder removed) when dropped.
#[derive(Debug)]
pub struct Garage {
    child: Child,
    program: PathBuf,
    dir: PathBuf,
    s3_port: u16,
    key_id: String,
    secret: String,
}

/// The cache folder: `$ETL_TEST_CACHE`, else `~/.cache/etl-test`.
fn cache_root() -> Result<PathBuf, Error> {
    if let Some(dir) = std::env::var_os("ETL_TEST_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME")
        .ok_or_else(|| Error("HOME is not set: set ETL_TEST_CACHE".to_owned()))?;
    Ok(PathBuf::from(home).join(".cache").join("etl-test"))
}

/// The `garage` binary, built with `cargo install` if it is not cached.
pub fn install() -> Result<PathBuf, Error> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one_thread_at_a_time = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let root = cache_root()?.join(format!("garage-{GARAGE_VERSION}"));
    let program = root.join("bin").join("garage");
    if program.is_file() {
        return Ok(program);
    }
    std::fs::create_dir_all(&root)
        .map_err(|e| Error(format!("cannot create {}: {e}", root.display())))?;
    let lock_path = root.join("install.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error(format!("cannot open {}: {e}", lock_path.display())))?;
    lock.lock()
        .map_err(|e| Error(format!("cannot lock {}: {e}", lock_path.display())))?;
    if program.is_file() {
        return Ok(program);
    }
    eprintln!(
        "building garage {GARAGE_VERSION} into {} (once per machine; it takes a while)",
        root.display()
    );
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args([
            "install",
            "garage",
            "--locked",
            "--version",
            GARAGE_VERSION,
            "--root",
        ])
        .arg(&root)
        // Its own build folder, beside the binary: never the workspace's
        // `target/`, which a clean build removes.
        .env("CARGO_TARGET_DIR", root.join("build"))
        .stdin(Stdio::null())
        .status()
        .map_err(|e| Error(format!("cannot run cargo install garage: {e}")))?;
    if !status.success() || !program.is_file() {
        return Err(Error(format!(
            "cargo install garage {GARAGE_VERSION} failed: {status}"
        )));
    }
    Ok(program)
}

impl Garage {
    /// Build the server if needed, start it and make it ready: layout
    /// applied, one access key created.
    pub fn start() -> Result<Garage, Error> {
        let program = install()?;
        let dir = std::env::temp_dir().join(format!(
            "etl-garage-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error(format!("cannot create {}: {e}", dir.display())))?;
        let (s3_port, rpc_port, admin_port) = (free_port()?, free_port()?, free_port()?);
        let config = format!(
            r#"metadata_dir = "{dir}/meta"
data_dir = "{dir}/data"
db_engine = "lmdb"
replication_factor = 1
rpc_bind_addr = "127.0.0.1:{rpc_port}"
rpc_public_addr = "127.0.0.1:{rpc_port}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "127.0.0.1:{s3_port}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{admin_port}"
"#,
            dir = dir.display(),
            secret = rpc_secret(),
        );
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config)
            .map_err(|e| Error(format!("cannot write {}: {e}", config_path.display())))?;
        let log = std::fs::File::create(dir.join("server.log"))
            .map_err(|e| Error(format!("cannot create the server log: {e}")))?;
        let err_log = log
            .try_clone()
            .map_err(|e| Error(format!("cannot share the server log: {e}")))?;
        let child = Command::new(&program)
            .arg("-c")
            .arg(&config_path)
            .arg("server")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .spawn()
            .map_err(|e| Error(format!("cannot start {}: {e}", program.display())))?;
        let mut garage = Garage {
            child,
            program,
            dir,
            s3_port,
            key_id: String::new(),
            secret: String::new(),
        };
        wait_listening(
            "garage",
            &mut garage.child,
            s3_port,
            Duration::from_secs(60),
        )?;
        garage.wait_for_status()?;
        let node = garage.cli(&["node", "id", "-q"])?;
        let node = node.trim();
        let short = node.get(..64).unwrap_or(node);
        garage.cli(&["layout", "assign", short, "-c", "1G", "-z", "dc1"])?;
        garage.cli(&["layout", "apply", "--version", "1"])?;
        let key = garage.cli(&["json-api", "CreateKey", r#"{"name":"etl-test"}"#])?;
        let key: serde_json::Value = serde_json::from_str(&key)
            .map_err(|e| Error(format!("garage's CreateKey answer is not JSON: {e}")))?;
        garage.key_id = key["accessKeyId"].as_str().unwrap_or_default().to_owned();
        garage.secret = key["secretAccessKey"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if garage.key_id.is_empty() || garage.secret.is_empty() {
            return Err(Error("garage created no access key".to_owned()));
        }
        Ok(garage)
    }

    fn wait_for_status(&self) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            match self.cli(&["status"]) {
                Ok(_) => return Ok(()),
                Err(e) if started.elapsed() > Duration::from_secs(60) => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }

    /// Run the admin CLI against this server; its standard output.
    pub fn cli(&self, args: &[&str]) -> Result<String, Error> {
        let output = Command::new(&self.program)
            .arg("-c")
            .arg(self.dir.join("config.toml"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error(format!("cannot run garage {}: {e}", args.join(" "))))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(Error(format!(
                "garage {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr)
            )))
        }
    }

    /// Create `bucket`, readable and writable with [`key_id`](Self::key_id).
    pub fn create_bucket(&self, bucket: &str) -> Result<(), Error> {
        self.cli(&["bucket", "create", bucket])?;
        self.cli(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            bucket,
            "--key",
            &self.key_id,
        ])
        .map(drop)
    }

    /// Delete `bucket` (it must be empty).
    pub fn delete_bucket(&self, bucket: &str) -> Result<(), Error> {
        self.cli(&["bucket", "delete", "--yes", bucket]).map(drop)
    }

    /// `http://127.0.0.1:PORT`, the S3 API.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3_port)
    }

    /// The access key id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The secret access key.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// The server's folder (configuration, data, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 32 random-enough bytes as hex, from the clock and the process id:
/// the RPC secret of a server that listens on loopback only.
fn rpc_secret() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for i in 0..4u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u32(std::process::id());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}
