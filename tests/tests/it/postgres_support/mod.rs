//! Shared helpers of the `postgres_*` suites: a real PostgreSQL server, the
//! `etl` binary, pipeline configurations with a `postgres` sink, and
//! queries that check what the pipeline stored.
//!
//! The server is the one `ETL_TEST_POSTGRES` names (`cargo xtask test`
//! starts one for the whole run), or else one this process starts with the
//! same code as `cargo xtask postgres`. A missing server fails the test
//! with the reason; nothing skips.

// Each suite uses a different part of these helpers; failed queries and
// processes panic, which fails the test that called them.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) use etl_test_support::postgres::Postgres;

/// The URL of the shared test server, starting one on first use.
pub fn url() -> String {
    etl_test_support::postgres::shared_url()
}

/// A server of the calling test's own, to stop and restart.
pub(crate) fn own_server() -> Postgres {
    etl_test_support::postgres::start()
        .unwrap_or_else(|e| panic!("cannot start a PostgreSQL server: {e}"))
}

/// `url` split into the URL without its password and the password, so a
/// configuration can leave the password to `PGPASSWORD`.
pub fn split_password(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_owned(), None);
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return (url.to_owned(), None);
    };
    match rest[..at].split_once(':') {
        Some((user, password)) => (
            format!("{scheme}://{user}{}", &rest[at..]),
            Some(password.to_owned()),
        ),
        None => (url.to_owned(), None),
    }
}

/// A table name no other test uses (tests share one database).
pub fn table(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Run one statement or query on `url`; rows as `Vec` of text columns.
pub fn query(url: &str, sql: &str) -> Vec<Vec<Option<String>>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the test server: {e}"));
        tokio::spawn(connection);
        let messages = client
            .simple_query(sql)
            .await
            .unwrap_or_else(|e| panic!("`{sql}` failed: {e}"));
        messages
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_owned))
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    })
}

/// One integer from a query returning one row of one column.
pub fn scalar(url: &str, sql: &str) -> i64 {
    let rows = query(url, sql);
    rows.first()
        .and_then(|r| r.first().cloned().flatten())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("`{sql}` returned {rows:?}, not one integer"))
}

/// Rows, distinct `etl_key`s and distinct `id`s of `table`; 0s while it does
/// not exist yet.
pub fn counts(url: &str, table: &str) -> (i64, i64, i64) {
    let exists = scalar(
        url,
        &format!("SELECT count(*) FROM pg_tables WHERE tablename = '{table}'"),
    );
    if exists == 0 {
        return (0, 0, 0);
    }
    let row = &query(
        url,
        &format!("SELECT count(*), count(DISTINCT etl_key), count(DISTINCT id) FROM \"{table}\""),
    )[0];
    let n = |i: usize| row[i].as_deref().unwrap_or("0").parse().unwrap();
    (n(0), n(1), n(2))
}

/// The `[[sinks]]` entry of a `postgres` sink; the password is left to
/// `PGPASSWORD` (see [`Etl::spawn`]).
pub fn postgres_sink(url: &str, table: &str, extra: &str) -> String {
    let (bare, _) = split_password(url);
    format!(
        r#"
[[sinks]]
name = "db"
type = "postgres"
url = "{bare}"
table = "{table}"
create_table = true
{extra}
"#
    )
}

/// A rate-limited generator source, so a run lasts long enough to be
/// interrupted: `partitions` partitions of `per_partition` records each.
pub fn generator(partitions: u32, per_partition: u64, rate: u64) -> String {
    format!(
        r#"
[source]
type = "generator"
partitions = {partitions}
records_per_partition = {per_partition}
rate = {rate}
max_batch_records = 50
seed = 7
"#
    )
}

/// The `[checkpoint]` section: a file store in the run's folder.
pub const CHECKPOINT: &str = r#"
[checkpoint]
commit_interval = "100ms"
shutdown_timeout = "10s"
store = { type = "file", path = "state" }
"#;

pub use etl_test_support::etl_binary;

/// A pipeline folder (config, offset store, logs) and the runs of `etl`
/// on it.
#[derive(Debug)]
pub struct Etl {
    pub dir: tempfile::TempDir,
    password: Option<String>,
    database_url: Option<String>,
    runs: u32,
}

/// How one run of `etl run` ended.
#[derive(Debug)]
pub struct Ended {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its standard error (logs, the final error).
    pub log: String,
}

impl Etl {
    /// A folder holding `config`; runs get `PGPASSWORD` from `url`.
    pub fn new(url: &str, config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pipeline.toml"), config).unwrap();
        Etl {
            dir,
            password: split_password(url).1,
            database_url: None,
            runs: 0,
        }
    }

    /// Runs get `DATABASE_URL` (for a sink without `url`).
    #[must_use]
    pub fn database_url(mut self, url: &str) -> Self {
        self.database_url = Some(url.to_owned());
        self
    }

    /// Start `etl run` with JSON logs at debug level into its own file.
    pub fn spawn(&mut self) -> Child {
        self.runs += 1;
        let log = std::fs::File::create(self.log_path(self.runs)).unwrap();
        let mut cmd = Command::new(etl_binary());
        cmd.args(["--log-format", "json", "run", "pipeline.toml"])
            .current_dir(self.dir.path())
            .env("ETL_LOG", "debug")
            .env_remove("PGPASSWORD")
            .env_remove("ETL_TEST_POSTGRES")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(password) = &self.password {
            cmd.env("PGPASSWORD", password);
        }
        if let Some(url) = &self.database_url {
            cmd.env("DATABASE_URL", url);
        }
        cmd.spawn().expect("start etl")
    }

    fn log_path(&self, run: u32) -> PathBuf {
        self.dir.path().join(format!("run-{run}.log"))
    }

    /// The standard error of the latest run.
    pub fn last_log(&self) -> String {
        std::fs::read_to_string(self.log_path(self.runs)).unwrap_or_default()
    }

    /// Every run's standard error, in order.
    pub fn all_logs(&self) -> String {
        (1..=self.runs)
            .map(|r| std::fs::read_to_string(self.log_path(r)).unwrap_or_default())
            .collect()
    }

    /// Wait for `child` to exit, killing it (and failing) after `limit`.
    pub fn wait(&self, mut child: Child, limit: Duration) -> Ended {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return Ended {
                    status,
                    log: self.last_log(),
                };
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "etl did not finish within {limit:?}; its log:\n{}",
                    self.last_log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Run to the end and require exit status 0.
    pub fn run_to_end(&mut self, limit: Duration) -> Ended {
        let child = self.spawn();
        let ended = self.wait(child, limit);
        assert!(
            ended.status.success(),
            "etl failed with {}; its log:\n{}",
            ended.status,
            ended.log
        );
        ended
    }
}

/// SIGKILL `child` (no chance to flush or commit) and reap it.
pub fn kill_9(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// A small seeded generator (splitmix64), for kill moments that are the
/// same on every run.
#[derive(Debug)]
pub struct Seeded(u64);

impl Seeded {
    pub fn new(seed: u64) -> Self {
        Seeded(seed)
    }

    /// A duration in `[lo, hi)` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Duration::from_millis(lo + z % (hi - lo).max(1))
    }
}
