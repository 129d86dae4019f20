//! `cargo xtask bench --only cdc`: changes per second from a pgbench
//! load through `postgres_cdc` to a blackhole and to a PostgreSQL target,
//! against `pg_recvlogical` writing the same stream to /dev/null in the
//! same run (the server's own decoder, the ceiling).
//!
//! One throwaway server (`etl_test_support::postgres`, `wal_level =
//! logical`). Before the load, one `pgoutput` slot per reader and round
//! is created, so every reader decodes the same transactions from the
//! same position. pgbench then commits its transactions (four changes
//! each, two clients). Each reader is timed from its start until it has
//! the stream up to the server's end of WAL after the load:
//! `pg_recvlogical --endpos` exits there; `etl` runs until its slot's
//! `confirmed_flush_lsn` reaches it (polled every 20 ms, so its figure
//! includes the commit and status intervals, 100 ms each), then is
//! stopped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etl_test_support::postgres::Postgres;

use super::{Row, si};
use crate::Result;

/// pgbench transactions per client.
const TRANSACTIONS_PER_CLIENT: u64 = 100_000;
/// pgbench clients.
const CLIENTS: u64 = 2;
/// Changes per pgbench transaction (the script below).
const CHANGES_PER_TRANSACTION: u64 = 4;
/// Rows of the accounts table.
const ACCOUNTS: u64 = 100_000;
/// Runs of each reader, alternated; the best of each counts.
const ROUNDS: usize = 2;
/// The longest a reader may take to reach the end of the load.
const READ_LIMIT: Duration = Duration::from_secs(300);

/// pgbench's transaction: a transfer between two accounts, each leg
/// logged (two updates, two inserts).
const SCRIPT: &str = "\\set aid random(1, 100000)
\\set bid random(1, 100000)
\\set delta random(-5000, 5000)
\\set back 0 - :delta
BEGIN;
UPDATE bench_accounts SET balance = balance + :back WHERE id = :aid;
INSERT INTO bench_history (account, delta) VALUES (:aid, :back);
UPDATE bench_accounts SET balance = balance + :delta WHERE id = :bid;
INSERT INTO bench_history (account, delta) VALUES (:bid, :delta);
END;
";

/// The readers, each with a slot per round.
const READERS: [&str; 3] = ["recvlogical", "blackhole", "postgres"];

/// The server and how to reach it without a password in any argument.
struct Server {
    server: Postgres,
    /// `host=... port=... user=... dbname=...`, no password.
    conninfo: String,
    /// The same as a URL, for the `etl` configuration.
    url: String,
}

impl Server {
    fn start() -> Result<Server> {
        let server = etl_test_support::postgres::start().map_err(|e| e.to_string())?;
        let port = server.port();
        Ok(Server {
            conninfo: format!("host=127.0.0.1 port={port} user=etl dbname=etl_test"),
            url: format!("postgres://etl@127.0.0.1:{port}/etl_test"),
            server,
        })
    }

    /// A client program of the server's, with the password in its
    /// environment.
    fn program(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.server.bin().join(name));
        cmd.env("PGPASSWORD", self.server.password());
        cmd
    }

    /// Run `sql`; its output, one value a line.
    fn sql(&self, sql: &str) -> Result<String> {
        let out = self
            .program("psql")
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
            .arg(&self.conninfo)
            .arg("-c")
            .arg(sql)
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run psql: {e}"))?;
        if !out.status.success() {
            return Err(format!("psql failed ({}) on: {sql}", out.status));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Whether slot `slot` is confirmed at or past `end`.
    fn confirmed_past(&self, slot: &str, end: &str) -> Result<bool> {
        let answer = self.sql(&format!(
            "SELECT confirmed_flush_lsn >= '{end}'::pg_lsn FROM pg_replication_slots \
             WHERE slot_name = '{slot}'"
        ))?;
        Ok(answer == "t")
    }
}

/// The rows: `etl` to a blackhole and to PostgreSQL, each against
/// `pg_recvlogical`.
pub(super) fn rows(etl: &Path, work: &Path) -> Result<Vec<Row>> {
    let dir = work.join("cdc");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let server = Server::start()?;
    server.sql(&format!(
        "CREATE TABLE bench_accounts (id int PRIMARY KEY, balance int NOT NULL, filler text);
         INSERT INTO bench_accounts SELECT g, 0, repeat('x', 80) FROM generate_series(1, {ACCOUNTS}) g;
         CREATE TABLE bench_history (id bigserial PRIMARY KEY, account int, delta int,
                                     at timestamptz DEFAULT now());
         CREATE PUBLICATION bench FOR TABLE bench_accounts, bench_history;"
    ))?;
    for round in 0..ROUNDS {
        for reader in READERS {
            server.sql(&format!(
                "SELECT pg_create_logical_replication_slot('{}', 'pgoutput')",
                slot(reader, round)
            ))?;
        }
    }
    let script = dir.join("transfer.sql");
    std::fs::write(&script, SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    eprintln!(
        "xtask: pgbench: {} transactions of {CHANGES_PER_TRANSACTION} changes",
        TRANSACTIONS_PER_CLIENT * CLIENTS
    );
    let status = server
        .program("pgbench")
        .args(["-n", "-c", &CLIENTS.to_string(), "-j"])
        .arg(CLIENTS.to_string())
        .arg("-t")
        .arg(TRANSACTIONS_PER_CLIENT.to_string())
        .arg("-f")
        .arg(&script)
        .arg(&server.conninfo)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run pgbench: {e}"))?;
    if !status.success() {
        return Err(format!("pgbench failed: {status}"));
    }
    let end = server.sql("SELECT pg_current_wal_lsn()")?;
    let changes = (TRANSACTIONS_PER_CLIENT * CLIENTS * CHANGES_PER_TRANSACTION) as f64;

    let (mut recv, mut blackhole, mut postgres) = (0f64, 0f64, 0f64);
    for round in 0..ROUNDS {
        recv = recv.max(changes / recvlogical(&server, &slot("recvlogical", round), &end)?);
        blackhole = blackhole
            .max(changes / etl_run(etl, &dir, &server, &slot("blackhole", round), &end, None)?);
        let target = format!("bench_target_{round}");
        postgres = postgres.max(
            changes
                / etl_run(
                    etl,
                    &dir,
                    &server,
                    &slot("postgres", round),
                    &end,
                    Some(&target),
                )?,
        );
    }
    let ceiling = format!("{} changes/s pg_recvlogical -> /dev/null", si(recv));
    Ok(vec![
        Row {
            name: "cdc: pgbench load -> postgres_cdc -> blackhole".into(),
            figure: format!("{} changes/s", si(blackhole)),
            baseline: ceiling.clone(),
            ratio: blackhole / recv,
            budget: ">= 0.8".into(),
            met: Some(blackhole / recv >= 0.8),
        },
        Row {
            name: "cdc: pgbench load -> postgres_cdc -> PostgreSQL (copy)".into(),
            figure: format!("{} changes/s", si(postgres)),
            baseline: ceiling,
            ratio: postgres / recv,
            budget: "none".into(),
            met: None,
        },
    ])
}

fn slot(reader: &str, round: usize) -> String {
    format!("bench_{reader}_{round}")
}

/// Seconds `pg_recvlogical` takes to stream `slot` up to `end` into
/// /dev/null.
fn recvlogical(server: &Server, slot: &str, end: &str) -> Result<f64> {
    let started = Instant::now();
    let status = server
        .program("pg_recvlogical")
        .arg("-d")
        .arg(&server.conninfo)
        .args(["--slot", slot, "--start", "--no-loop", "-f", "/dev/null"])
        .args(["-o", "proto_version=1", "-o", "publication_names=bench"])
        .arg(format!("--endpos={end}"))
        .status()
        .map_err(|e| format!("cannot run pg_recvlogical: {e}"))?;
    if !status.success() {
        return Err(format!("pg_recvlogical failed: {status}"));
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Seconds `etl` takes, from its start, until `slot` is confirmed at
/// `end`: into a blackhole, or into the PostgreSQL table `target`.
fn etl_run(
    etl: &Path,
    dir: &Path,
    server: &Server,
    slot: &str,
    end: &str,
    target: Option<&str>,
) -> Result<f64> {
    let sink = match target {
        None => "type = \"blackhole\"\n".to_owned(),
        Some(table) => format!(
            "type = \"postgres\"\nurl = \"{}\"\ntable = \"{table}\"\ncreate_table = true\n\
             columns = [{{ name = \"doc\", path = \"\", type = \"jsonb\" }}]\n",
            server.url
        ),
    };
    let config = dir.join(format!("{slot}.toml"));
    let state = dir.join(format!("{slot}.state"));
    std::fs::write(
        &config,
        format!(
            "# Written by `cargo xtask bench --only cdc`.\n\
             [source]\ntype = \"postgres_cdc\"\nurl = \"{}\"\npublication = \"bench\"\n\
             slot = \"{slot}\"\ncreate_slot = false\nsnapshot = \"never\"\n\
             max_batch_records = 1000\nstatus_interval = \"100ms\"\n\n\
             [[sinks]]\n{sink}\n\
             [checkpoint]\ncommit_interval = \"100ms\"\n\
             store = {{ type = \"file\", path = \"{}\" }}\n",
            server.url,
            state.display()
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let log = |stream: &str| {
        let path = dir.join(format!("{slot}.{stream}"));
        std::fs::File::create(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))
    };
    let started = Instant::now();
    let mut child = Command::new(etl)
        .arg("run")
        .arg(&config)
        .env("PGPASSWORD", server.server.password())
        .stdin(Stdio::null())
        .stdout(log("out")?)
        .stderr(log("err")?)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", etl.display()))?;
    let result = wait_confirmed(&mut child, server, slot, end, started);
    stop(&mut child);
    result.map_err(|e| format!("{e} (see {}/{slot}.err)", dir.display()))
}

/// Wait until `slot` is confirmed at `end`: the seconds since `started`.
fn wait_confirmed(
    child: &mut Child,
    server: &Server,
    slot: &str,
    end: &str,
    started: Instant,
) -> Result<f64> {
    loop {
        if server.confirmed_past(slot, end)? {
            return Ok(started.elapsed().as_secs_f64());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("etl ended before reaching {end}: {status}"));
        }
        if started.elapsed() > READ_LIMIT {
            return Err(format!("etl did not reach {end} within {READ_LIMIT:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stop `etl` with SIGTERM (it drains and commits), SIGKILL past 30 s.
fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
