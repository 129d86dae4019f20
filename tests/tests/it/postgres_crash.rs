//! The `etl` binary writing to a real PostgreSQL server, killed with
//! SIGKILL at seeded moments and restarted until its bounded input is
//! done: exactly-once mode stores every record once, at-least-once mode
//! with the upsert never duplicates a key.

#![allow(clippy::unwrap_used)]

use crate::postgres_support;

use std::time::{Duration, Instant};

use postgres_support::{CHECKPOINT, Etl, Seeded, counts, generator, kill_9, postgres_sink, table};

const PARTITIONS: u32 = 3;
const PER_PARTITION: u64 = 2_000;
/// Records per second over all partitions: a whole run takes about two
/// seconds, so kills land mid-run.
const RATE: u64 = 3_000;
const KILLS: usize = 4;
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// Run `etl` and kill it with SIGKILL, up to `KILLS` times: each run is
/// killed once it has stored rows beyond what was there (so every run makes
/// progress, however slow the machine), after a further pause drawn from
/// `seed`. `before_last` runs just before the last run. Returns the
/// pipeline folder, the rows stored before the last run, and how many runs
/// were killed.
fn crash_loop(
    url: &str,
    table: &str,
    config: &str,
    seed: u64,
    before_last: impl FnOnce(&Etl),
) -> (Etl, i64, usize) {
    let mut etl = Etl::new(url, config);
    let mut pauses = Seeded::new(seed);
    let mut killed = 0;
    while killed < KILLS {
        let before = counts(url, table).0;
        let mut child = etl.spawn();
        let deadline = Instant::now() + RUN_LIMIT;
        let mut exited = None;
        while exited.is_none() && counts(url, table).0 <= before {
            assert!(Instant::now() < deadline, "no progress: {}", etl.last_log());
            std::thread::sleep(Duration::from_millis(20));
            exited = child.try_wait().unwrap();
        }
        std::thread::sleep(pauses.millis(0, 400));
        if exited.or_else(|| child.try_wait().unwrap()).is_some() {
            // The input ran out before this kill.
            let ended = etl.wait(child, RUN_LIMIT);
            assert!(ended.status.success(), "{}", ended.log);
            break;
        }
        kill_9(child);
        killed += 1;
    }
    before_last(&etl);
    let stored = counts(url, table).0;
    etl.run_to_end(RUN_LIMIT);
    (etl, stored, killed)
}

/// The `read` total of the last run's `pipeline finished` line.
fn last_read(etl: &Etl) -> i64 {
    etl.last_log()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == "pipeline finished")
        .and_then(|v| v["read"].as_i64())
        .unwrap_or_else(|| panic!("no `pipeline finished` line:\n{}", etl.last_log()))
}

fn expected() -> i64 {
    i64::from(PARTITIONS) * i64::try_from(PER_PARTITION).unwrap()
}

#[test]
fn exactly_once_stores_every_record_once_across_kill_9() {
    let url = postgres_support::url();
    let table = table("eo_crash");
    let config = format!(
        "{}{}{}batch_max_records = 100\nlinger = \"5ms\"\n",
        generator(PARTITIONS, PER_PARTITION, RATE),
        CHECKPOINT,
        postgres_sink(
            &url,
            &table,
            "exactly_once = true\ncolumns = [{ name = \"id\", type = \"bigint\" }, \
             { name = \"amount\", type = \"numeric\" }]",
        ),
    );
    let (etl, before_last, killed) = crash_loop(&url, &table, &config, 0x5eed_0001, |_| ());
    assert!(killed >= 2, "only {killed} kills landed mid-run");

    let (rows, keys, ids) = counts(&url, &table);
    assert_eq!(rows, expected(), "row count against input count");
    assert_eq!(keys, rows, "an idempotency key repeats");
    assert_eq!(ids, rows, "a record id repeats");
    // The last run resumed at the offset store's commit, which may lag the
    // stored progress: it read at least the records not stored yet, and
    // the sink skipped (without writing them again) those it held.
    assert!(last_read(&etl) >= expected() - before_last);
    let progress = postgres_support::query(
        &url,
        &format!("SELECT next_offset FROM etl_progress WHERE name = '{table}'"),
    );
    let end = PER_PARTITION.to_string();
    assert_eq!(progress.len(), PARTITIONS as usize, "{progress:?}");
    assert!(
        progress
            .iter()
            .all(|row| row[0].as_deref() == Some(end.as_str())),
        "{progress:?}"
    );
    assert!(!etl.all_logs().contains("panicked"), "{}", etl.all_logs());
}

#[test]
fn at_least_once_upsert_never_duplicates_a_key_across_kill_9() {
    let url = postgres_support::url();
    let table = table("alo_crash");
    let config = format!(
        "{}{}{}batch_max_records = 100\nlinger = \"5ms\"\nconcurrency = 2\n",
        generator(PARTITIONS, PER_PARTITION, RATE),
        CHECKPOINT,
        postgres_sink(
            &url,
            &table,
            "method = \"insert\"\ncolumns = [{ name = \"id\", type = \"bigint\" }, \
             { name = \"user\", type = \"text\" }]",
        ),
    );
    let (etl, before_last, killed) = crash_loop(&url, &table, &config, 0x5eed_0002, |etl| {
        // Each restart replayed what was in flight at its kill; to replay
        // every stored row for certain, the last run also finds its
        // offset store gone and starts over.
        std::fs::remove_dir_all(etl.dir.path().join("state")).unwrap();
    });
    assert!(killed >= 2, "only {killed} kills landed mid-run");

    let (rows, keys, ids) = counts(&url, &table);
    assert_eq!(rows, expected(), "row count against input count");
    assert_eq!(keys, rows, "an idempotency key repeats");
    assert_eq!(ids, rows, "a record id repeats");
    // The last run started from nothing: it replayed the `before_last`
    // rows already stored, and they did not duplicate.
    assert!(before_last > 0);
    assert_eq!(last_read(&etl), expected());
    assert!(!etl.all_logs().contains("panicked"), "{}", etl.all_logs());
}
