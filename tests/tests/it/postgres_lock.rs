//! Two `etl run`s on one exactly-once PostgreSQL progress: the second is
//! refused with exit code 75 (state in use) naming the progress, and
//! writes nothing; once the first has ended, a new run proceeds.

#![allow(clippy::unwrap_used)]

use crate::postgres_support;

use std::time::{Duration, Instant};

use postgres_support::{CHECKPOINT, Etl, counts, generator, postgres_sink, table, url};

#[test]
fn a_second_run_on_the_same_progress_exits_75_until_the_first_ends() {
    let url = url();
    let table = table("lock");
    // Slow enough (10 s) that the first run is still going when the
    // second has started and waited out the lock's grace (2 s), on a
    // loaded machine too: at 3 s, the second run once found the lock
    // free and ran to the end.
    let config = format!(
        "{}{}{}batch_max_records = 50\nlinger = \"5ms\"\n",
        generator(1, 10_000, 1_000),
        CHECKPOINT,
        postgres_sink(
            &url,
            &table,
            "exactly_once = true\ncolumns = [{ name = \"id\", type = \"bigint\" }]",
        ),
    );
    let mut first = Etl::new(&url, &config);
    let child = first.spawn();
    let deadline = Instant::now() + Duration::from_secs(60);
    while counts(&url, &table).0 == 0 {
        assert!(Instant::now() < deadline, "no rows: {}", first.last_log());
        std::thread::sleep(Duration::from_millis(20));
    }

    // Its own folder: only the PostgreSQL progress is shared.
    let mut second = Etl::new(&url, &config);
    let refused = second.spawn();
    let ended = second.wait(refused, Duration::from_secs(60));
    assert_eq!(ended.status.code(), Some(75), "{}", ended.log);
    assert!(
        ended.log.contains("is in use by another sink"),
        "{}",
        ended.log
    );
    assert!(ended.log.contains(&table), "{}", ended.log);
    assert!(
        !second.dir.path().join("state").exists()
            || std::fs::read_dir(second.dir.path().join("state"))
                .unwrap()
                .count()
                <= 1,
        "the refused run committed nothing"
    );

    let ended = first.wait(child, Duration::from_secs(120));
    assert!(ended.status.success(), "{}", ended.log);
    let mut third = Etl::new(&url, &config);
    third.run_to_end(Duration::from_secs(60));
    let (rows, keys, _) = counts(&url, &table);
    assert_eq!((rows, keys), (10_000, 10_000));
}
