//! A throwaway PostgreSQL server on loopback.
//!
//! [`start`] finds the server binaries (installing Debian's `postgresql`
//! package if they are missing and we are root), runs `initdb` into a fresh
//! temporary directory, starts the server with `pg_ctl` on a free
//! `127.0.0.1` port and `wal_level = logical` (the change-data-capture
//! suites stream from it), creates a database and returns a [`Postgres`]
//! guard; [`start_with`] adds server settings of the test's own (a server
//! with `wal_level = replica`, say).
//! [`shared_url`] is what most suites want: the server `ETL_TEST_POSTGRES`
//! names (`cargo xtask test` starts one for the whole run), or else one
//! started on first use and kept for the test process.
//!
//! Cleanup does not depend on this process exiting normally. Right after
//! the directory is made, a small reaper shell is spawned whose standard
//! input is a pipe held by the guard; it ignores SIGINT, SIGTERM and SIGHUP
//! and waits for that pipe to close. Dropping the guard closes it, and so
//! does the kernel when this process dies in any way (Ctrl-C, panic,
//! `kill -9`). The reaper then stops the server and removes the directory.
//! `Drop` waits for it, so a dropped guard means a stopped server.
//!
//! The server refuses to run as root, so as root every server command runs
//! as the `postgres` system user (the package creates it) via `runuser`.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::Error;

/// What the private steps return; the public ones wrap it in [`Error`].
type Res<T = ()> = std::result::Result<T, String>;

/// The database superuser the cluster is initialised with.
const USER: &str = "etl";
/// The database created for the tests.
const DATABASE: &str = "etl_test";
/// The role [`Postgres::enable_tls`] lets in by client certificate.
pub const CERT_USER: &str = "etl_cert";
/// The system user that runs the server when we are root.
const SYSTEM_USER: &str = "postgres";
/// Ports tried before giving up (another process may grab a free port
/// between our probe and the server's bind).
const PORT_ATTEMPTS: usize = 5;

/// A running server in a temporary directory, stopped and removed on drop.
#[derive(Debug)]
pub struct Postgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    password: String,
    /// `-c NAME=VALUE` settings given after the defaults, which they
    /// override.
    settings: Vec<String>,
    reaper: Option<Reaper>,
}

#[derive(Debug)]
struct Reaper {
    child: Child,
    pipe: ChildStdin,
}

impl Postgres {
    /// `postgres://etl:PASSWORD@127.0.0.1:PORT/etl_test`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{USER}:{}@127.0.0.1:{}/{DATABASE}",
            self.password, self.port
        )
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password of the `etl` superuser (random per server).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The folder of the server's programs (`psql`, `pgbench`,
    /// `pg_recvlogical` beside `initdb` and `pg_ctl`): clients of the
    /// same version as the server.
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// Stop the server (fast shutdown: open sessions are terminated), for
    /// outage tests. The directory stays; [`Postgres::restart`] brings the
    /// server back on the same port.
    pub fn stop(&self) -> Result<(), Error> {
        self.pg_ctl(&["stop", "-m", "fast", "-w"]).map_err(Error)
    }

    /// Start a stopped server again on the same port and directory.
    pub fn restart(&self) -> Result<(), Error> {
        self.pg_ctl_start().map_err(Error)
    }

    /// Serve TLS with this PEM certificate (chain) and key, and with
    /// `client_ca` also check client certificates against it: the role
    /// [`CERT_USER`] then logs in from loopback by its certificate alone
    /// (`hostssl ... cert`, the certificate's CN naming the role; create
    /// the role to use it). Other connections may still use plaintext.
    /// The server reloads its configuration; the files live in its data
    /// directory.
    pub fn enable_tls(&self, cert: &str, key: &str, client_ca: Option<&str>) -> Result<(), Error> {
        self.try_enable_tls(cert, key, client_ca).map_err(Error)
    }

    fn try_enable_tls(&self, cert: &str, key: &str, client_ca: Option<&str>) -> Res {
        let data = self.data();
        let mut conf =
            String::from("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        let mut files = vec![("server.crt", cert), ("server.key", key)];
        if let Some(ca) = client_ca {
            files.push(("client_ca.crt", ca));
            conf.push_str("ssl_ca_file = 'client_ca.crt'\n");
        }
        // Written by the server's user, 0600 (the server refuses a key
        // others can read); contents travel in the environment.
        for (name, text) in files {
            run_env(
                &self.dir,
                Path::new("sh"),
                &[
                    "-c",
                    "umask 077; printf '%s' \"$ETL_PEM\" > \"$1\"",
                    "sh",
                    &data.join(name).to_string_lossy(),
                ],
                &[("ETL_PEM", text)],
            )?;
        }
        run_env(
            &self.dir,
            Path::new("sh"),
            &[
                "-c",
                "printf '%s' \"$ETL_CONF\" >> \"$1\"",
                "sh",
                &data.join("postgresql.conf").to_string_lossy(),
            ],
            &[("ETL_CONF", &conf)],
        )?;
        if client_ca.is_some() {
            // First match wins: the certificate role goes before the rest.
            let line = format!("hostssl all {CERT_USER} 127.0.0.1/32 cert\n");
            run_env(
                &self.dir,
                Path::new("sh"),
                &[
                    "-c",
                    "{ printf '%s' \"$ETL_HBA\"; cat \"$1\"; } > \"$1.new\" && mv \"$1.new\" \"$1\"",
                    "sh",
                    &data.join("pg_hba.conf").to_string_lossy(),
                ],
                &[("ETL_HBA", &line)],
            )?;
        }
        self.pg_ctl(&["reload"])?;
        // `reload` returns before the server has read the files; wait
        // until it accepts a TLS request.
        for _ in 0..100 {
            if accepts_tls(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err("the server did not start serving TLS after a reload".to_owned())
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn pg_ctl_start(&self) -> Res {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c wal_level=logical",
            self.port,
            self.dir.display()
        );
        for setting in &self.settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
        let log = self.dir.join("server.log");
        let result = self.pg_ctl(&[
            "start",
            "-w",
            "-t",
            "60",
            "-l",
            &log.to_string_lossy(),
            "-o",
            &options,
        ]);
        if let Err(e) = result {
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(10).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(format!("{e}\nserver log:\n{}", tail.join("\n")));
        }
        wait_for_tcp(self.port)
    }

    fn pg_ctl(&self, args: &[&str]) -> Res {
        let data = self.data();
        let mut all = vec!["-D", data.to_str().unwrap_or_default(), "-s"];
        all.extend_from_slice(args);
        run(&self.dir, &self.bin.join("pg_ctl"), &all)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(Reaper { mut child, pipe }) = self.reaper.take() {
            // Closing the pipe is the reaper's signal to stop and clean up.
            drop(pipe);
            let _ = child.wait();
        }
    }
}

/// Start a fresh server on a free loopback port with a random password and
/// an empty `etl_test` database.
pub fn start() -> Result<Postgres, Error> {
    start_with(&[])
}

/// [`start`] with server settings of its own, given to the server as
/// `-c NAME=VALUE` after the defaults (`listen_addresses`, `fsync = off`,
/// `wal_level = logical`), which they override, also across
/// [`Postgres::restart`]: `start_with(&[("wal_level", "replica")])` is a
/// server logical decoding refuses. A value must be one word (no blank,
/// no quote); a setting the server does not know, or a value it
/// refuses, makes it fail to start, which is the error.
pub fn start_with(settings: &[(&str, &str)]) -> Result<Postgres, Error> {
    try_start(settings).map_err(Error)
}

fn try_start(settings: &[(&str, &str)]) -> Res<Postgres> {
    let mut options = Vec::with_capacity(settings.len());
    for (name, value) in settings {
        let word = |text: &str| {
            !text.is_empty()
                && !text
                    .chars()
                    .any(|c| c.is_whitespace() || c == '\'' || c == '"' || c == '\\' || c == '=')
        };
        if !word(name) || !word(value) {
            return Err(format!(
                "the server setting {name:?} = {value:?} is not one word each"
            ));
        }
        options.push(format!("{name}={value}"));
    }
    let bin = binaries()?;
    let dir = make_dir()?;
    let mut server = Postgres {
        reaper: Some(spawn_reaper(&dir, &bin)?),
        dir,
        bin,
        port: 0,
        password: random_hex(),
        settings: options,
    };
    initdb(&server)?;
    let mut last = String::new();
    for _ in 0..PORT_ATTEMPTS {
        server.port = free_port()?;
        match server.pg_ctl_start() {
            Ok(()) => {
                create_database(&server)?;
                return Ok(server);
            }
            Err(e) => last = e,
        }
    }
    Err(format!(
        "the server did not start on any of {PORT_ATTEMPTS} ports: {last}"
    ))
}

/// The URL of the suite's server: the one `ETL_TEST_POSTGRES` names, or
/// else one this process starts on first use and keeps until it exits
/// (the reaper stops it then). Panics, failing the test, with the reason
/// when no server can be had: a suite that needs PostgreSQL never skips.
pub fn shared_url() -> String {
    if let Ok(url) = std::env::var("ETL_TEST_POSTGRES")
        && !url.is_empty()
    {
        return url;
    }
    static SHARED: OnceLock<Result<Postgres, Error>> = OnceLock::new();
    match SHARED.get_or_init(start) {
        Ok(server) => server.url(),
        Err(e) => panic!(
            "cannot start a PostgreSQL server for the tests ({e}); \
             set ETL_TEST_POSTGRES=postgres://... to use a running one"
        ),
    }
}

/// The directory holding `initdb` and `pg_ctl`, installing the Debian
/// package first if neither Debian's nor `PATH`'s copy exists.
fn binaries() -> Res<PathBuf> {
    if let Some(bin) = find_binaries() {
        return Ok(bin);
    }
    if !is_root() {
        return Err(
            "initdb and pg_ctl not found (not in /usr/lib/postgresql/*/bin nor PATH); \
             install PostgreSQL, e.g. `apt-get install postgresql`"
                .to_owned(),
        );
    }
    eprintln!("xtask: PostgreSQL is not installed; installing Debian's `postgresql`");
    let root = Path::new("/");
    run_env(
        root,
        Path::new("apt-get"),
        &["update"],
        &[("DEBIAN_FRONTEND", "noninteractive")],
    )?;
    run_env(
        root,
        Path::new("apt-get"),
        &["install", "-y", "--no-install-recommends", "postgresql"],
        &[("DEBIAN_FRONTEND", "noninteractive")],
    )?;
    find_binaries().ok_or_else(|| "apt-get installed postgresql but initdb was not found".into())
}

fn find_binaries() -> Option<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    // Debian keeps one directory per major version; take the newest.
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_both(bin))
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|dir| has_both(dir))
}

fn is_root() -> bool {
    // The owner of `/proc/self` is this process's effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A fresh 0700 directory owned by whoever will run the server.
fn make_dir() -> Res<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "etl-postgres-{}-{}",
        std::process::id(),
        &random_hex()[..8]
    ));
    run(
        Path::new("/"),
        Path::new("mkdir"),
        &["-m", "700", &dir.to_string_lossy()],
    )?;
    Ok(dir)
}

/// The reaper: waits for its stdin to close, then stops the server and
/// removes the directory, ignoring the signals a terminal sends.
fn spawn_reaper(dir: &Path, bin: &Path) -> Res<Reaper> {
    const SCRIPT: &str = r#"trap "" INT TERM HUP
dir=$1; shift
read _ignored
"$@" >/dev/null 2>&1
rm -rf "$dir""#;
    let data = dir.join("data");
    let pg_ctl = bin.join("pg_ctl");
    let mut args: Vec<String> = vec!["-c".into(), SCRIPT.into(), "sh".into()];
    args.push(dir.to_string_lossy().into_owned());
    args.extend(as_server_user());
    args.extend(
        [
            pg_ctl.to_string_lossy().as_ref(),
            "stop",
            "-D",
            data.to_string_lossy().as_ref(),
            "-m",
            "fast",
            "-w",
        ]
        .map(str::to_owned),
    );
    let mut child = Command::new("sh")
        .args(&args)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the cleanup shell: {e}"))?;
    let pipe = child
        .stdin
        .take()
        .ok_or_else(|| "the cleanup shell has no stdin pipe".to_owned())?;
    Ok(Reaper { child, pipe })
}

fn initdb(server: &Postgres) -> Res {
    // The password goes through a file, never the command line.
    let pwfile = server.dir.join("pwfile");
    run_env(
        &server.dir,
        Path::new("sh"),
        &[
            "-c",
            "umask 077; printf '%s\\n' \"$ETL_PGPASSWORD\" > \"$1\"",
            "sh",
            &pwfile.to_string_lossy(),
        ],
        &[("ETL_PGPASSWORD", &server.password)],
    )?;
    let data = server.data();
    run(
        &server.dir,
        &server.bin.join("initdb"),
        &[
            "-D",
            &data.to_string_lossy(),
            "-U",
            USER,
            "--pwfile",
            &pwfile.to_string_lossy(),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ],
    )
    .map_err(|e| format!("initdb failed: {e}"))
}

fn create_database(server: &Postgres) -> Res {
    run(
        &server.dir,
        &server.bin.join("createdb"),
        &[
            "-h",
            &server.dir.to_string_lossy(),
            "-p",
            &server.port.to_string(),
            "-U",
            USER,
            DATABASE,
        ],
    )
}

/// The prefix that runs a command as the server's system user: `runuser`
/// as root, nothing otherwise.
fn as_server_user() -> Vec<String> {
    if is_root() {
        ["runuser", "-u", SYSTEM_USER, "--"]
            .map(str::to_owned)
            .to_vec()
    } else {
        Vec::new()
    }
}

fn run(cwd: &Path, program: &Path, args: &[&str]) -> Res {
    run_env(cwd, program, args, &[])
}

/// Run a command (as the server user unless it is `apt-get`), printing it
/// first; its output is captured and shown only on failure.
fn run_env(cwd: &Path, program: &Path, args: &[&str], envs: &[(&str, &str)]) -> Res {
    let mut line: Vec<String> = if program == Path::new("apt-get") {
        Vec::new()
    } else {
        as_server_user()
    };
    line.push(program.to_string_lossy().into_owned());
    line.extend(args.iter().map(|a| (*a).to_owned()));
    let shown = shown(&line);
    eprintln!("$ {shown}");
    let out = Command::new(&line[0])
        .args(&line[1..])
        .envs(envs.iter().copied())
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{shown}` failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// A command line for display. The password never appears in one: it
/// travels in an environment variable into the password file.
fn shown(line: &[String]) -> String {
    line.join(" ")
}

fn free_port() -> Res<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free loopback port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// `pg_ctl start -w` waits for the socket; also check the TCP listener.
fn wait_for_tcp(port: u16) -> Res {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    for _ in 0..100 {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("the server does not accept connections on {addr}"))
}

/// Whether the server answers PostgreSQL's TLS request with `S`.
fn accepts_tls(port: u16) -> bool {
    use std::io::Read;
    // SSLRequest: length 8, code 80877103.
    const REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut answer = [0u8];
    stream.write_all(&REQUEST).is_ok()
        && stream.read_exact(&mut answer).is_ok()
        && answer[0] == b'S'
}

/// 16 random hex digits from the standard library's per-process hash keys.
fn random_hex() -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_that_is_not_one_word_is_refused_before_anything_starts() {
        for (name, value) in [
            ("wal_level", "replica -c fsync=on"),
            ("wal_level", ""),
            ("work mem", "4MB"),
            ("wal_level", "'logical'"),
        ] {
            let error = start_with(&[(name, value)]).unwrap_err();
            assert!(
                error.0.contains("not one word"),
                "{name} = {value}: {error:?}"
            );
        }
    }
}
