//! Passwords never print: every configuration that fails (at validation,
//! at connect, against a real server) with the password `Zq9SecretPw`
//! somewhere in it gives errors whose `Display` and `Debug`, and a config
//! whose `Debug`, hold no byte of it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use etl_postgres::{PostgresSink, PostgresSinkConfig};

const SECRET: &str = "Zq9SecretPw";

/// Fragments of the secrets used below, none of which may show.
const FRAGMENTS: [&str; 3] = ["Zq9", "SecretPw", "Zq9%53"];

fn assert_hidden(what: &str, text: &str) {
    for fragment in FRAGMENTS {
        assert!(
            !text.contains(fragment),
            "{what} shows {fragment:?}: {text}"
        );
    }
}

/// Connection strings that fail, each holding the secret.
fn failing(port: u16) -> Vec<(String, Option<&'static str>)> {
    let mut out: Vec<(String, Option<&'static str>)> = [
        // An unknown option, the password in the URL twice.
        "postgres://etl:Zq9SecretPw@127.0.0.1:1/db?password=Zq9SecretPw&bogus_opt=1".to_owned(),
        "postgres://etl@127.0.0.1:1/db?password=Zq9SecretPw&bogus_opt=1".to_owned(),
        // A port that is not a number.
        "postgres://etl:Zq9SecretPw@127.0.0.1:notaport/db".to_owned(),
        "host=127.0.0.1 port=notaport user=etl password = Zq9SecretPw".to_owned(),
        // Quoted, with a space, and an unknown option after it.
        "host=127.0.0.1 port=1 user=etl password='Zq9 SecretPw' bogus=1".to_owned(),
        // An unterminated quote.
        "host=127.0.0.1 port=1 user=etl password='Zq9SecretPw".to_owned(),
        // Percent-encoded in the URL.
        "postgres://etl:Zq9%53ecretPw@127.0.0.1:1/db?bogus=1".to_owned(),
        // A bad sslmode, verify-full without a root certificate, a
        // missing certificate file.
        "postgres://etl:Zq9SecretPw@127.0.0.1:1/db?sslmode=bogus".to_owned(),
        "postgres://etl:Zq9SecretPw@127.0.0.1:1/db?sslmode=verify-full".to_owned(),
        "postgres://etl:Zq9SecretPw@127.0.0.1:1/db?sslmode=verify-ca&sslrootcert=/no/ca.pem"
            .to_owned(),
        // Misspelled and unknown options holding the password, in both
        // forms, and an option name that is the password itself.
        "host=127.0.0.1 port=1 user=etl passwd=Zq9SecretPw".to_owned(),
        "host=127.0.0.1 port=1 user=etl PASSWORD=Zq9SecretPw".to_owned(),
        "host=127.0.0.1 port=1 user=etl Password = 'Zq9 SecretPw'".to_owned(),
        "host=127.0.0.1 port=1 user=etl bogus=Zq9SecretPw".to_owned(),
        "postgres://etl@127.0.0.1:1/db?passwd=Zq9SecretPw".to_owned(),
        "postgres://etl@127.0.0.1:1/db?Password=Zq9SecretPw".to_owned(),
        "postgres://etl@127.0.0.1:1/db?sslmode=require&bogus=Zq9SecretPw".to_owned(),
        "postgres://etl@127.0.0.1:1/db?Zq9SecretPw=1".to_owned(),
        "postgres://etl@127.0.0.1:1/db?sslmode=Zq9SecretPw".to_owned(),
        // Not a PostgreSQL URL; a word without `=`.
        "mysql://etl:Zq9SecretPw@127.0.0.1:1/db".to_owned(),
        "host=127.0.0.1 Zq9SecretPw".to_owned(),
        // Unreachable (nothing listens on port 1).
        "postgres://etl:Zq9SecretPw@127.0.0.1:1/db?connect_timeout=2".to_owned(),
        "host=127.0.0.1 port=1 user=etl password='Zq9 SecretPw'".to_owned(),
        // The real server, the wrong password (in the URL, key=value).
        format!("postgres://etl:Zq9SecretPw@127.0.0.1:{port}/etl_test"),
        format!("host=127.0.0.1 port={port} user=etl dbname=etl_test password = 'Zq9 SecretPw'"),
        // A database that does not exist.
        format!("postgres://etl@127.0.0.1:{port}/no_such_db?password=Zq9SecretPw"),
    ]
    .into_iter()
    .map(|url| (url, None))
    .collect();
    // The password field, with a URL that fails in each way.
    for url in [
        "postgres://etl@127.0.0.1:1/db?bogus_opt=1".to_owned(),
        format!("postgres://etl@127.0.0.1:{port}/etl_test"),
        "postgres://etl@127.0.0.1:1/db?sslmode=bogus".to_owned(),
    ] {
        out.push((url, Some(SECRET)));
    }
    out
}

#[tokio::test]
async fn no_failing_configuration_shows_the_password() {
    let url = support::url();
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|rest| rest.split('/').next())
        .and_then(|p| p.parse().ok())
        .expect("the test URL has a port");
    for (conn, password) in failing(port) {
        let mut config = PostgresSinkConfig::new(conn.clone(), "t").column("id", "id", "bigint");
        if let Some(p) = password {
            config = config.password(p);
        }
        assert_hidden("config Debug", &format!("{config:?}"));
        let validated = config.validate();
        if let Err(e) = &validated {
            assert_hidden("validate Display", &e.to_string());
            assert_hidden("validate Debug", &format!("{e:?}"));
        }
        let err = match PostgresSink::connect(config).await {
            Ok(_) => panic!("{conn:?} connected"),
            Err(e) => e,
        };
        let shown = format!("{err}");
        eprintln!("{shown}");
        assert_hidden("connect Display", &shown);
        assert_hidden("connect Debug", &format!("{err:?}"));
        let sink_error = etl_sink::SinkError::from(err);
        assert_hidden("SinkError Display", &sink_error.to_string());
        assert_hidden("SinkError Debug", &format!("{sink_error:?}"));
    }
}

#[test]
fn the_config_holds_the_url_and_password_as_secrets() {
    let config: PostgresSinkConfig = serde_json::from_str(
        r#"{"url": "postgres://etl:Zq9SecretPw@h/db?password=Zq9SecretPw", "table": "t",
            "password": "Zq9SecretPw", "sslmode": "verify-full", "sslrootcert": "/ca.pem"}"#,
    )
    .unwrap();
    let debug = format!("{config:?}");
    assert_hidden("config Debug", &debug);
    // Any part of the URL may be a secret, whatever its key is called.
    assert!(debug.contains("url: \"***\""), "{debug}");
    assert!(debug.contains("VerifyFull"), "{debug}");
}
