//! Garage, a real self-hosted S3 server, on loopback.
//!
//! The binary is built once per machine with [`INSTALL_ARGS`]: `cargo
//! install garage --version GARAGE_VERSION --locked` in the dev profile
//! without debug information, with only the LMDB metadata engine and the
//! bundled C libraries. That build takes about four minutes on two cores;
//! the release build with every feature took far longer, for a server
//! that only answers tests on loopback. It goes into
//! `~/.cache/etl-test/garage-VERSION-FLAVOUR/` (outside `target/`, so a
//! clean build keeps it; `ETL_TEST_CACHE` moves it), keyed by the version
//! and the build flags ([`FLAVOUR`]), under a file lock so that concurrent
//! tests build it once. A marker holding the flags, written last, tells a
//! finished install from one cut short. `cargo xtask test` installs it
//! before the suites run and prints the build when there is one.
//! `cargo xtask bench` runs another build, cached apart
//! ([`Build::BENCH`]: every dependency optimised, as a production
//! server's are).
//!
//! [`Garage::start`] writes a one-node configuration (LMDB metadata, an
//! RPC secret, the S3 API and the admin API on free loopback ports),
//! starts `garage server`, waits for `garage status`, assigns and applies
//! the layout, and creates an access key through the admin CLI; buckets
//! come from [`Garage::create_bucket`]. [`Garage::stop`] and
//! [`Garage::restart`] stop the server and start it again on the same
//! ports and data, for the tests of a store that goes away mid-run. The
//! server is killed and its folder removed when the guard drops.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{Error, cache_root, free_port, install_once, wait_listening};

/// The pinned version (the one the issue tracker's tests named).
pub const GARAGE_VERSION: &str = "2.5.0";
/// The region the server is configured with.
pub const REGION: &str = "garage";
/// What the build flags make of the binary: part of its cache folder's
/// name, so that other flags build (and cache) another binary.
pub const FLAVOUR: &str = "dev-nodebug-lmdb-bundled-libs";
/// `cargo install`'s arguments after `--root DIR`.
pub const INSTALL_ARGS: &[&str] = &[
    "install",
    "garage",
    "--version",
    GARAGE_VERSION,
    "--locked",
    "--debug",
    "--no-default-features",
    "--features",
    "lmdb,bundled-libs",
];
/// The environment of the build: no debug information (it is what makes a
/// debug build of Garage slow to link and large).
const INSTALL_ENV: &[(&str, &str)] = &[("CARGO_PROFILE_DEV_DEBUG", "0")];

/// How a Garage binary is built: its cache folder's flavour, `cargo
/// install`'s arguments and the build's environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Build {
    /// Part of the cache folder's name.
    pub flavour: &'static str,
    /// `cargo install`'s arguments after `--root DIR`.
    pub args: &'static [&'static str],
    /// More of them, after `args`: what a build changes of another's
    /// (its `--config` settings).
    pub more_args: &'static [&'static str],
    /// The build's environment.
    pub env: &'static [(&'static str, &'static str)],
}

impl Build {
    /// The tests' build ([`FLAVOUR`], [`INSTALL_ARGS`]): the dev profile,
    /// about four minutes on two cores.
    pub const TESTS: Build = Build {
        flavour: FLAVOUR,
        args: INSTALL_ARGS,
        more_args: &[],
        env: INSTALL_ENV,
    };

    /// The benchmarks' build: the tests' with every dependency optimised
    /// (`opt-level = 2`; Garage's own crates are dependencies of the
    /// `garage` package too). The dev build spends a store's time where a
    /// production server does not: its hashing of every byte (BLAKE2,
    /// MD5, SHA-256) runs unoptimised, with debug assertions. About 20
    /// minutes to build on two cores beside other work; built once per
    /// machine, by `cargo xtask bench`.
    pub const BENCH: Build = Build {
        flavour: "dev-nodebug-depsopt2-lmdb-bundled-libs",
        args: INSTALL_ARGS,
        more_args: &["--config", "profile.dev.package.\"*\".opt-level=2"],
        env: INSTALL_ENV,
    };
}

/// A running Garage server, killed (and its folder removed) when dropped.
#[derive(Debug)]
pub struct Garage {
    child: Option<Child>,
    program: PathBuf,
    dir: PathBuf,
    s3_port: u16,
    key_id: String,
    secret: String,
}

/// Where the binary of this version and these flags is cached:
/// `CACHE/garage-VERSION-FLAVOUR/bin/garage`.
pub fn cached_binary() -> Result<PathBuf, Error> {
    Ok(install_root(&Build::TESTS)?.join("bin").join("garage"))
}

fn install_root(build: &Build) -> Result<PathBuf, Error> {
    Ok(cache_root()?.join(format!("garage-{GARAGE_VERSION}-{}", build.flavour)))
}

/// The marker's text: every flag of the build, so that a binary cached by
/// other flags under the same folder name is built again.
fn marker_text(build: &Build) -> String {
    let env: Vec<String> = build.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let args: Vec<&str> = build.args.iter().chain(build.more_args).copied().collect();
    format!("{} cargo {}", env.join(" "), args.join(" "))
}

/// The tests' `garage` binary, built with `cargo install`
/// ([`INSTALL_ARGS`]) if it is not cached. The build is printed on
/// standard error, with the time it took.
pub fn install() -> Result<PathBuf, Error> {
    install_build(&Build::TESTS)
}

/// The `garage` binary of `build`, built with `cargo install` if it is
/// not cached, as [`install`] does.
pub fn install_build(build: &Build) -> Result<PathBuf, Error> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let root = install_root(build)?;
    let program = root.join("bin").join("garage");
    let what = format!("building garage {GARAGE_VERSION} ({})", build.flavour);
    install_once(
        &INSTALL,
        &what,
        &root,
        &program,
        &marker_text(build),
        || {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let status = Command::new(cargo)
                .args(build.args)
                .args(build.more_args)
                .arg("--root")
                .arg(&root)
                .envs(build.env.iter().copied())
                // Its own build folder, beside the binary: never the
                // workspace's `target/`, which a clean build removes, nor a
                // target folder the caller's environment names.
                .env("CARGO_TARGET_DIR", root.join("build"))
                .stdin(Stdio::null())
                .status()
                .map_err(|e| Error(format!("cannot run cargo install garage: {e}")))?;
            if !status.success() {
                return Err(Error(format!(
                    "cargo install garage {GARAGE_VERSION} failed: {status}"
                )));
            }
            // The build folder is only needed to build again; the binary
            // stays.
            let _ = std::fs::remove_dir_all(root.join("build"));
            Ok(())
        },
    )?;
    Ok(program)
}

impl Garage {
    /// Build the server if needed, start it and make it ready: layout
    /// applied, one access key created.
    pub fn start() -> Result<Garage, Error> {
        Garage::start_build(&Build::TESTS)
    }

    /// As [`start`](Self::start), with the binary of `build` (the
    /// benchmarks start [`Build::BENCH`]).
    pub fn start_build(build: &Build) -> Result<Garage, Error> {
        let program = install_build(build)?;
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
        let mut garage = Garage {
            child: None,
            program,
            dir,
            s3_port,
            key_id: String::new(),
            secret: String::new(),
        };
        garage.run_server()?;
        let node = garage.cli(&["node", "id", "-q"])?;
        let node = node.trim();
        let short = node.get(..64).unwrap_or(node);
        garage.apply_layout(short)?;
        let (key_id, secret) = garage.create_key("etl-test")?;
        garage.key_id = key_id;
        garage.secret = secret;
        Ok(garage)
    }

    /// Give the one node `node` its role and apply the cluster's first
    /// layout. A server just started has been seen to refuse that apply
    /// ("Invalid new layout version") on a loaded machine; the step is
    /// tried again, a few times, and a layout the server already holds at
    /// version 1 counts as applied.
    fn apply_layout(&self, node: &str) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            let applied = self
                .cli(&["layout", "assign", node, "-c", "1G", "-z", "dc1"])
                .and_then(|_| self.cli(&["layout", "apply", "--version", "1"]));
            let err = match applied {
                Ok(_) => return Ok(()),
                Err(err) => err,
            };
            let shown = self.cli(&["layout", "show"]).unwrap_or_default();
            if shown.contains("Current cluster layout version: 1") {
                return Ok(());
            }
            tries += 1;
            if tries == 5 {
                return Err(Error(format!(
                    "{} (after {tries} tries; the layout now: {shown})",
                    err.0
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Start `garage server` on this server's configuration and wait until
    /// it answers `garage status`.
    fn run_server(&mut self) -> Result<(), Error> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .map_err(|e| Error(format!("cannot open the server log: {e}")))?;
        let err_log = log
            .try_clone()
            .map_err(|e| Error(format!("cannot share the server log: {e}")))?;
        let child = Command::new(&self.program)
            .arg("-c")
            .arg(self.dir.join("config.toml"))
            .arg("server")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err_log)
            .spawn()
            .map_err(|e| Error(format!("cannot start {}: {e}", self.program.display())))?;
        let child = self.child.insert(child);
        wait_listening("garage", child, self.s3_port, Duration::from_secs(60))?;
        self.wait_for_status()
    }

    /// Stop the server (SIGKILL): its S3 port refuses connections until
    /// [`restart`](Self::restart). Its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start the server again on the same ports and data, after
    /// [`stop`](Self::stop) (or while it runs: it is stopped first).
    pub fn restart(&mut self) -> Result<(), Error> {
        self.stop();
        self.run_server()
    }

    /// A new access key named `name`, allowed no bucket yet: its id and
    /// secret.
    pub fn create_key(&self, name: &str) -> Result<(String, String), Error> {
        let request = serde_json::json!({ "name": name }).to_string();
        let key = self.cli(&["json-api", "CreateKey", &request])?;
        let key: serde_json::Value = serde_json::from_str(&key)
            .map_err(|e| Error(format!("garage's CreateKey answer is not JSON: {e}")))?;
        let id = key["accessKeyId"].as_str().unwrap_or_default().to_owned();
        let secret = key["secretAccessKey"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if id.is_empty() || secret.is_empty() {
            return Err(Error(format!("garage created no access key: {key}")));
        }
        Ok((id, secret))
    }

    /// The multipart uploads of `bucket` that were neither completed nor
    /// aborted, as the server counts them (its `GetBucketInfo`).
    pub fn unfinished_multipart_uploads(&self, bucket: &str) -> Result<u64, Error> {
        let request = serde_json::json!({ "globalAlias": bucket }).to_string();
        let info = self.cli(&["json-api", "GetBucketInfo", &request])?;
        let info: serde_json::Value = serde_json::from_str(&info)
            .map_err(|e| Error(format!("garage's GetBucketInfo answer is not JSON: {e}")))?;
        info["unfinishedMultipartUploads"].as_u64().ok_or_else(|| {
            Error(format!(
                "garage's GetBucketInfo has no unfinishedMultipartUploads: {info}"
            ))
        })
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
        self.stop();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_build_is_cached_apart_from_the_tests_and_says_how_it_was_built() {
        let (tests, bench) = (Build::TESTS, Build::BENCH);
        assert_ne!(install_root(&tests).ok(), install_root(&bench).ok());
        assert_eq!(
            marker_text(&tests),
            "CARGO_PROFILE_DEV_DEBUG=0 cargo install garage --version 2.5.0 --locked --debug \
             --no-default-features --features lmdb,bundled-libs"
        );
        assert_eq!(
            marker_text(&bench),
            format!(
                "{} --config profile.dev.package.\"*\".opt-level=2",
                marker_text(&tests)
            )
        );
    }
}
