//! Azurite, Microsoft's Azure Storage emulator, on loopback: the Azure
//! Blob store of the object-store sink's suite.
//!
//! The emulator is installed once per machine with [`INSTALL_ARGS`]
//! (`npm ci --prefix DIR`, package scripts not run, every package at the
//! version and checksum `azurite/package-lock.json` beside this crate
//! pins) into `~/.cache/etl-test/azurite-VERSION/`, beside Garage's
//! build (outside `target/`, so a clean build keeps it; `ETL_TEST_CACHE`
//! moves it), under a file lock so that concurrent tests install it once.
//! A marker holding the command and the lock's checksum, written last,
//! tells a finished install from one cut short or from another lock. `cargo xtask test` installs it before the suites
//! run. The version is the last one whose `engines` take node 20 (3.36
//! and later ask for node 21 or 22).
//!
//! [`Azurite::start`] starts its blob service alone (`azurite-blob`) on a
//! free loopback port, with a folder of its own and one account,
//! [`ACCOUNT`], whose key is drawn for the server; telemetry is off.
//! `--skipApiVersionCheck` is on: pyarrow's Azure client, the suite's
//! independent reader, sends a newer API version than this Azurite
//! knows (the sink's own client, object_store's, sends one it does).
//! Containers come from [`Azurite::create_container`]. The server is
//! killed and its folder removed when the guard drops.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::{Error, cache_root, free_port, install_once, wait_listening};

/// The pinned version.
pub const AZURITE_VERSION: &str = "3.35.0";
/// The storage account the server holds.
pub const ACCOUNT: &str = "etltest";
/// `npm`'s arguments after `--prefix DIR`, where [`PACKAGE`] and
/// [`PACKAGE_LOCK`] were written: exactly the lock's packages.
pub const INSTALL_ARGS: &[&str] = &["ci", "--no-audit", "--no-fund", "--ignore-scripts"];
/// The install's `package.json`: Azurite at [`AZURITE_VERSION`].
pub const PACKAGE: &str = include_str!("../azurite/package.json");
/// Its `package-lock.json`: every package Azurite needs at a version and
/// checksum of its own, so a new machine installs what this one tested
/// (made with `npm install --package-lock-only --ignore-scripts`).
pub const PACKAGE_LOCK: &str = include_str!("../azurite/package-lock.json");
/// The API version of the requests this module signs (the one
/// object_store's Azure client sends).
const API_VERSION: &str = "2023-11-03";

/// A running Azurite blob service, killed (and its folder removed) when
/// dropped. `Debug` by hand: it shows no key.
pub struct Azurite {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
    key: String,
}

fn install_root() -> Result<PathBuf, Error> {
    Ok(cache_root()?.join(format!("azurite-{AZURITE_VERSION}")))
}

/// Where the installed blob service is:
/// `CACHE/azurite-VERSION/node_modules/.bin/azurite-blob`.
pub fn cached_binary() -> Result<PathBuf, Error> {
    Ok(install_root()?
        .join("node_modules")
        .join(".bin")
        .join("azurite-blob"))
}

/// The marker's text: the whole install command and the lock's
/// checksum (FNV-1a), so a changed lock installs again.
fn marker_text() -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in PACKAGE.bytes().chain(PACKAGE_LOCK.bytes()) {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("npm {} (lock {hash:016x})", INSTALL_ARGS.join(" "))
}

/// The `azurite-blob` command, installed with `npm ci`
/// ([`INSTALL_ARGS`], [`PACKAGE_LOCK`]) if it is not cached. The install is printed on
/// standard error, with the time it took.
pub fn install() -> Result<PathBuf, Error> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let root = install_root()?;
    let program = cached_binary()?;
    let what = format!("installing azurite {AZURITE_VERSION}");
    install_once(&INSTALL, &what, &root, &program, &marker_text(), || {
        for (name, text) in [
            ("package.json", PACKAGE),
            ("package-lock.json", PACKAGE_LOCK),
        ] {
            let path = root.join(name);
            std::fs::write(&path, text)
                .map_err(|e| Error(format!("cannot write {}: {e}", path.display())))?;
        }
        let status = Command::new("npm")
            .arg("--prefix")
            .arg(&root)
            .args(INSTALL_ARGS)
            .stdin(Stdio::null())
            .status()
            .map_err(|e| Error(format!("cannot run npm (is Node.js installed?): {e}")))?;
        if !status.success() {
            return Err(Error(format!(
                "npm ci of azurite {AZURITE_VERSION} in {} failed: {status}",
                root.display()
            )));
        }
        Ok(())
    })?;
    Ok(program)
}

impl Azurite {
    /// Install the emulator if needed and start its blob service, with
    /// the account [`ACCOUNT`] and a key drawn for it.
    ///
    /// A port another process took between its choice and the server's
    /// start (the suites start servers in parallel) is tried again on
    /// another, three times in all.
    pub fn start() -> Result<Azurite, Error> {
        let program = install()?;
        let mut last = Error(String::from("no attempt made"));
        for _ in 0..3 {
            match Azurite::start_on(&program, free_port()?) {
                Ok(server) => return Ok(server),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Start the blob service of `program` on `port` and wait until it
    /// answers.
    fn start_on(program: &Path, port: u16) -> Result<Azurite, Error> {
        let dir = std::env::temp_dir().join(format!("etl-azurite-{}-{port}", std::process::id()));
        std::fs::create_dir_all(dir.join("data"))
            .map_err(|e| Error(format!("cannot create {}: {e}", dir.display())))?;
        let log_path = dir.join("server.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| Error(format!("cannot create {}: {e}", log_path.display())))?;
        let err_log = log
            .try_clone()
            .map_err(|e| Error(format!("cannot share the server log: {e}")))?;
        let key = account_key();
        let child = Command::new(program)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .arg("--location")
            .arg(dir.join("data"))
            .args(["--silent", "--disableTelemetry", "--skipApiVersionCheck"])
            // Its one account, in place of the well-known development
            // account.
            .env("AZURITE_ACCOUNTS", format!("{ACCOUNT}:{key}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .spawn()
            .map_err(|e| Error(format!("cannot start {}: {e}", program.display())))?;
        let mut server = Azurite {
            child: Some(child),
            dir,
            port,
            key,
        };
        let child = server.child.as_mut().expect("just started");
        if let Err(e) = wait_listening("azurite", child, port, Duration::from_secs(60)) {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(Error(format!("{e}; its log: {log}")));
        }
        Ok(server)
    }

    /// `http://127.0.0.1:PORT`, the blob service.
    pub fn service(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT/ACCOUNT`, the account's blob endpoint (the
    /// emulator takes the account from the path).
    pub fn endpoint(&self) -> String {
        format!("{}/{ACCOUNT}", self.service())
    }

    /// The account's key (base64).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The server's folder (data, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Create the container `name` (Create Container, signed with the
    /// account's key).
    pub fn create_container(&self, name: &str) -> Result<(), Error> {
        let path = format!("/{ACCOUNT}/{name}");
        let date = httpdate::fmt_http_date(SystemTime::now());
        // The Shared Key string to sign: the verb, eleven standard
        // headers (all empty here; a zero length is written empty), the
        // `x-ms-` headers, then the account and the path, and the query.
        let to_sign = format!(
            "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{API_VERSION}\n\
             /{ACCOUNT}{path}\nrestype:container"
        );
        let key = STANDARD
            .decode(&self.key)
            .map_err(|e| Error(format!("the account key is not base64: {e}")))?;
        let signature = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key),
            to_sign.as_bytes(),
        );
        let request = format!(
            "PUT {path}?restype=container HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             x-ms-date: {date}\r\nx-ms-version: {API_VERSION}\r\n\
             Authorization: SharedKey {ACCOUNT}:{signature}\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n",
            port = self.port,
            signature = STANDARD.encode(signature.as_ref()),
        );
        let answer = exchange(self.port, &request)
            .map_err(|e| Error(format!("cannot create the container {name}: {e}")))?;
        if answer.starts_with("HTTP/1.1 201") {
            Ok(())
        } else {
            Err(Error(format!(
                "azurite did not create the container {name}: {answer}"
            )))
        }
    }
}

/// Send `request` to `127.0.0.1:port` and read the whole answer.
fn exchange(port: u16, request: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(request.as_bytes())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

impl std::fmt::Debug for Azurite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Azurite")
            .field("dir", &self.dir)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 32 random-enough bytes, in base64, from std's per-process random hash
/// keys: the key of an account on a server that listens on loopback only.
fn account_key() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut bytes = Vec::with_capacity(32);
    for i in 0..4u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(i);
        h.write_u32(std::process::id());
        bytes.extend_from_slice(&h.finish().to_le_bytes());
    }
    STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_install_takes_the_locked_pinned_version_and_runs_no_package_script() {
        assert_eq!(INSTALL_ARGS[0], "ci", "{INSTALL_ARGS:?}");
        assert!(INSTALL_ARGS.contains(&"--ignore-scripts"));
        let pinned = format!("\"azurite\": \"{AZURITE_VERSION}\"");
        assert!(PACKAGE.contains(&pinned.replace(' ', "")), "{PACKAGE}");
        let locked =
            format!("\"node_modules/azurite\": {{\n      \"version\": \"{AZURITE_VERSION}\"");
        assert!(
            PACKAGE_LOCK.contains(&locked),
            "azurite not locked at the version"
        );
        // Every locked package has its checksum.
        assert_eq!(
            PACKAGE_LOCK.matches("\"version\":").count(),
            PACKAGE_LOCK.matches("\"integrity\":").count()
        );
        assert!(marker_text().starts_with("npm ci "));
    }

    #[test]
    fn an_account_key_is_32_bytes_in_base64_and_drawn_anew() {
        let key = account_key();
        assert_eq!(STANDARD.decode(&key).map(|k| k.len()), Ok(32), "{key}");
        assert_ne!(key, account_key());
    }
}
