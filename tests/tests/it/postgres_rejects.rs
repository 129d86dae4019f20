//! Rows the database refuses are dead-lettered with its reason while the
//! rest of the input is stored; credentials never reach the logs or the
//! error messages of the `etl` binary.

#![allow(clippy::unwrap_used)]

use crate::postgres_support;

use std::time::Duration;

use postgres_support::{CHECKPOINT, Etl, counts, postgres_sink, query, split_password, table};

const LIMIT: Duration = Duration::from_secs(60);

/// A file source over `input.ndjson` in the pipeline folder.
const FILE_SOURCE: &str = r#"
[source]
type = "file"
paths = ["input.ndjson"]
max_batch_records = 64
"#;

#[test]
fn rows_the_database_refuses_are_dead_lettered_with_its_reason() {
    let url = postgres_support::url();
    let table = table("rejects");
    query(
        &url,
        &format!(
            "CREATE TABLE \"{table}\" (etl_key text PRIMARY KEY, id bigint NOT NULL, \
             amount numeric CHECK (amount >= 0))"
        ),
    );
    // 200 good rows, with three bad ones among them.
    let mut lines: Vec<String> = (0..200)
        .map(|i| format!(r#"{{"id":{i},"amount":{}.5}}"#, i % 7))
        .collect();
    lines.insert(17, r#"{"id":1000,"amount":"abc"}"#.to_owned());
    lines.insert(90, r#"{"id":1001,"amount":-5}"#.to_owned());
    lines.insert(150, r#"{"amount":3}"#.to_owned());
    let config = format!(
        "{FILE_SOURCE}{CHECKPOINT}{}batch_max_records = 50\nlinger = \"5ms\"\n\
         \n[dead_letter]\ntype = \"file\"\npath = \"dead.ndjson\"\n",
        postgres_sink(
            &url,
            &table,
            "columns = [{ name = \"id\", type = \"bigint\" }, \
             { name = \"amount\", type = \"numeric\" }]",
        ),
    );
    let mut etl = Etl::new(&url, &config);
    std::fs::write(etl.dir.path().join("input.ndjson"), lines.join("\n") + "\n").unwrap();
    etl.run_to_end(LIMIT);

    let (rows, keys, ids) = counts(&url, &table);
    assert_eq!((rows, keys, ids), (200, 200, 200));
    let dead = std::fs::read_to_string(etl.dir.path().join("dead.ndjson")).unwrap();
    let dead: Vec<serde_json::Value> = dead
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dead.len(), 3, "{dead:?}");
    let reason_of = |needle: &str| {
        dead.iter()
            .find(|d| d["value"].as_str().unwrap().contains(needle))
            .unwrap_or_else(|| panic!("{needle} not dead-lettered: {dead:?}"))["reason"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let abc = reason_of("\"abc\"");
    assert!(
        abc.contains("invalid input syntax for type numeric"),
        "{abc}"
    );
    assert!(abc.contains("22P02"), "{abc}");
    let negative = reason_of("-5");
    assert!(negative.contains("violates check constraint"), "{negative}");
    assert!(negative.contains("23514"), "{negative}");
    let no_id = reason_of("{\"amount\":3}");
    assert!(no_id.contains("null value in column \"id\""), "{no_id}");
    assert!(no_id.contains("23502"), "{no_id}");

    // The run logged at debug level with the password in PGPASSWORD.
    if let (_, Some(password)) = split_password(&url) {
        assert!(!etl.all_logs().contains(&password), "{}", etl.all_logs());
    }
}

#[test]
fn a_wrong_password_fails_the_run_without_showing_it() {
    let url = postgres_support::url();
    let (bare, _) = split_password(&url);
    let secret = "wr0ng-s3cret-pw";
    for (place, sink) in [
        // In the password field.
        (
            "field",
            postgres_sink(&url, &table("creds"), &format!("password = \"{secret}\"")),
        ),
        // In the URL.
        (
            "url",
            postgres_sink(&url, &table("creds"), "")
                .replace(&bare, &bare.replacen('@', &format!(":{secret}@"), 1)),
        ),
    ] {
        let config = format!("{FILE_SOURCE}{CHECKPOINT}{sink}");
        let mut etl = Etl::new(&url, &config);
        std::fs::write(etl.dir.path().join("input.ndjson"), "{\"id\":1}\n").unwrap();
        let child = etl.spawn();
        let ended = etl.wait(child, LIMIT);
        assert_eq!(ended.status.code(), Some(1), "{place}: {}", ended.log);
        assert!(
            ended.log.contains("password authentication failed"),
            "{place}: {}",
            ended.log
        );
        assert!(!ended.log.contains(secret), "{place}: {}", ended.log);
    }
}

#[test]
fn an_invalid_sink_config_is_a_config_error_naming_the_field() {
    let url = postgres_support::url();
    let secret = "s3cret-in-config";
    let sink = postgres_sink(
        &url,
        &table("invalid"),
        &format!(
            "password = \"{secret}\"\ncolumns = [{{ name = \"id\", type = \"bigint; DROP TABLE x\" }}]"
        ),
    );
    let mut etl = Etl::new(&url, &format!("{FILE_SOURCE}{CHECKPOINT}{sink}"));
    std::fs::write(etl.dir.path().join("input.ndjson"), "{\"id\":1}\n").unwrap();
    let child = etl.spawn();
    let ended = etl.wait(child, LIMIT);
    assert_eq!(ended.status.code(), Some(78), "{}", ended.log);
    assert!(ended.log.contains("columns[0].type"), "{}", ended.log);
    assert!(ended.log.contains("sink \"db\""), "{}", ended.log);
    assert!(!ended.log.contains(secret), "{}", ended.log);
}
