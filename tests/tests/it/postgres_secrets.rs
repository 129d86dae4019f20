//! `etl validate` and `etl run` with PostgreSQL sinks that fail, each
//! holding the password `Zq9SecretPw` (in the URL, in `password`, in
//! `DATABASE_URL`, quoted, with spaces): no byte of it appears on
//! standard output or standard error, with logs at debug level; the
//! configuration problems are found by `etl validate` already.

#![allow(clippy::unwrap_used)]

use crate::postgres_support;

use std::process::{Command, Stdio};

use postgres_support::etl_binary;

const FRAGMENTS: [&str; 2] = ["Zq9", "SecretPw"];

/// A `[[sinks]]` postgres table body and whether `etl validate` must
/// refuse it (the rest fail only when connecting).
fn cases(port: u16) -> Vec<(String, bool)> {
    let url = |u: &str| format!("url = {u:?}\n");
    vec![
        (
            url("postgres://etl@127.0.0.1:1/db?password=Zq9SecretPw&bogus_opt=1"),
            true,
        ),
        (
            url("postgres://etl:Zq9SecretPw@127.0.0.1:1/db?bogus_opt=1"),
            true,
        ),
        (
            url("host=127.0.0.1 port=notaport user=etl password = Zq9SecretPw"),
            true,
        ),
        (
            url("host=127.0.0.1 port=1 user=etl password='Zq9 SecretPw' bogus=1"),
            true,
        ),
        (
            url("postgres://etl:Zq9SecretPw@127.0.0.1:1/db?sslmode=bogus"),
            true,
        ),
        (
            url(
                "postgres://etl:Zq9SecretPw@127.0.0.1:1/db?sslmode=verify-full&sslrootcert=/no/ca.pem",
            ),
            true,
        ),
        (
            format!(
                "{}password = \"Zq9SecretPw\"\n",
                url("postgres://etl@127.0.0.1:1/db?bogus=1")
            ),
            true,
        ),
        (
            format!("{}password = 12345\n", url("postgres://etl@127.0.0.1:1/db")),
            true,
        ),
        // Valid, but nothing listens / the password is wrong.
        (
            url("host=127.0.0.1 port=1 user=etl password='Zq9 SecretPw' connect_timeout=1"),
            false,
        ),
        (
            url(&format!(
                "postgres://etl:Zq9SecretPw@127.0.0.1:{port}/etl_test"
            )),
            false,
        ),
        (
            format!(
                "{}password = \"Zq9SecretPw\"\n",
                url(&format!("postgres://etl@127.0.0.1:{port}/etl_test"))
            ),
            false,
        ),
    ]
}

fn pipeline(sink: &str) -> String {
    format!(
        "[source]\ntype = \"generator\"\npartitions = 1\nrecords_per_partition = 10\n\n\
         [checkpoint]\nstore = {{ type = \"file\", path = \"state\" }}\n\n\
         [[sinks]]\nname = \"db\"\ntype = \"postgres\"\ntable = \"t\"\n{sink}"
    )
}

/// Run `etl <command> pipeline.toml` in `dir`; (exit code, stdout + stderr).
fn etl(dir: &std::path::Path, command: &str, database_url: Option<&str>) -> (Option<i32>, String) {
    let mut cmd = Command::new(etl_binary());
    cmd.args([command, "pipeline.toml"])
        .current_dir(dir)
        .env("ETL_LOG", "trace")
        .env_remove("PGPASSWORD")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null());
    if let Some(url) = database_url {
        cmd.env("DATABASE_URL", url);
    }
    let out = cmd.output().unwrap();
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code(), text)
}

fn check(dir: &std::path::Path, invalid: bool, database_url: Option<&str>, what: &str) {
    let (code, validated) = etl(dir, "validate", database_url);
    for fragment in FRAGMENTS {
        assert!(
            !validated.contains(fragment),
            "validate {what}: {validated}"
        );
    }
    if invalid {
        assert_eq!(code, Some(78), "validate {what}: {validated}");
    } else {
        assert_eq!(code, Some(0), "validate {what}: {validated}");
    }
    let (code, ran) = etl(dir, "run", database_url);
    for fragment in FRAGMENTS {
        assert!(!ran.contains(fragment), "run {what}: {ran}");
    }
    assert_ne!(code, Some(0), "run {what}: {ran}");
    if invalid {
        assert_eq!(code, Some(78), "run {what}: {ran}");
    }
}

#[test]
fn no_failing_postgres_configuration_prints_the_password() {
    let url = postgres_support::url();
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|rest| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap();
    for (sink, invalid) in cases(port) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pipeline.toml"), pipeline(&sink)).unwrap();
        check(dir.path(), invalid, None, &sink);
    }
    // The URL from DATABASE_URL.
    for (database_url, invalid) in [
        (
            "postgres://etl@127.0.0.1:1/db?password=Zq9SecretPw&bogus_opt=1".to_owned(),
            true,
        ),
        (
            format!("postgres://etl:Zq9SecretPw@127.0.0.1:{port}/etl_test"),
            false,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pipeline.toml"), pipeline("")).unwrap();
        check(dir.path(), invalid, Some(&database_url), &database_url);
    }
}
