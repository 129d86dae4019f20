//! TLS against a real server serving a certificate made here (a CA, a
//! server certificate for `localhost` and `127.0.0.1`, a client
//! certificate for the `etl_cert` role): each `sslmode`, a wrong host
//! name, a wrong CA, a client certificate, and `prefer` falling back to
//! plaintext.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use etl_postgres::{PostgresError, PostgresSink, PostgresSinkConfig, SslMode};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use support::{Postgres, table};

/// PEM files of one test PKI.
struct Pki {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    other_ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    server_cert: String,
    server_key: String,
    ca_pem: String,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn pki() -> Pki {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("etl test CA");
    let other = ca_other();
    let mut server = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    server
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &ca).unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, support::CERT_USER);
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &ca).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    Pki {
        ca: write("ca.pem", &ca.pem()),
        other_ca: write("other_ca.pem", &other.pem()),
        client_cert: write("client.pem", &client_cert.pem()),
        client_key: write("client.key", &client_key.serialize_pem()),
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
        ca_pem: ca.pem(),
        _dir: dir,
    }
}

fn ca_other() -> CertifiedIssuer<'static, KeyPair> {
    ca("some other CA")
}

/// One TLS server for this file's tests, with its PKI.
fn server() -> &'static (Postgres, Pki) {
    static SERVER: OnceLock<(Postgres, Pki)> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = support::own_server();
        let pki = pki();
        server
            .enable_tls(&pki.server_cert, &pki.server_key, Some(&pki.ca_pem))
            .expect("TLS on");
        (server, pki)
    })
}

/// `key=value` string reaching the TLS server as `host`.
fn kv(server: &Postgres, host: &str, user: &str, extra: &str) -> String {
    format!(
        "host={host} hostaddr=127.0.0.1 port={} user={user} dbname=etl_test {extra}",
        server.port()
    )
}

fn sink_config(url: String, password: Option<&str>) -> PostgresSinkConfig {
    let config = PostgresSinkConfig::new(url, table("tls"))
        .column("id", "id", "bigint")
        .create_table(true);
    match password {
        Some(p) => config.password(p),
        None => config,
    }
}

/// Whether the sink's session (found by application name) is encrypted.
async fn encrypted(application: &str) -> bool {
    let (server, _) = server();
    let db = support::client(&server.url()).await;
    let row = db
        .query_one(
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .unwrap();
    row.get::<_, Option<bool>>(0)
        .expect("the sink's session is there")
}

async fn connect(config: PostgresSinkConfig) -> Result<PostgresSink, PostgresError> {
    PostgresSink::connect(config).await
}

#[tokio::test]
async fn require_connects_encrypted_without_checking_the_certificate() {
    let (server, _) = server();
    let url = format!(
        "{}?sslmode=require&application_name=tls_require",
        server.url()
    );
    let _sink = connect(sink_config(url, None)).await.unwrap();
    assert!(encrypted("tls_require").await);
}

#[tokio::test]
async fn verify_full_connects_with_the_right_ca_and_host() {
    let (server, pki) = server();
    for host in ["127.0.0.1", "localhost"] {
        let app = format!("tls_full_{}", host.replace('.', "_"));
        let url = kv(
            server,
            host,
            "etl",
            &format!("application_name={app} sslmode=verify-full"),
        );
        let config = sink_config(url, Some(server.password())).sslrootcert(&pki.ca);
        let _sink = connect(config).await.unwrap();
        assert!(encrypted(&app).await, "{host}");
    }
    // The same from the URL alone.
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        server.url(),
        pki.ca.display()
    );
    connect(sink_config(url, None)).await.unwrap();
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_for_another_host_and_names_it() {
    let (server, pki) = server();
    let url = kv(server, "db.example.invalid", "etl", "sslmode=verify-full");
    let config = sink_config(url, Some(server.password())).sslrootcert(&pki.ca);
    let err = connect(config).await.unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    assert!(text.contains("db.example.invalid"), "{text}");
    assert!(text.contains("certificate"), "{text}");
    assert!(
        !err.is_retryable(),
        "a refused certificate is not retried: {text}"
    );
    assert!(!text.contains(server.password()), "{text}");
}

#[tokio::test]
async fn verify_ca_checks_the_chain_but_not_the_name() {
    let (server, pki) = server();
    let url = kv(server, "db.example.invalid", "etl", "sslmode=verify-ca");
    let config = sink_config(url.clone(), Some(server.password())).sslrootcert(&pki.ca);
    connect(config).await.unwrap();

    let wrong = sink_config(url, Some(server.password())).sslrootcert(&pki.other_ca);
    let err = connect(wrong).await.unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    assert!(text.contains("certificate"), "{text}");
    assert!(!err.is_retryable(), "{text}");
    // `require` with a root certificate checks the chain too (libpq).
    let require = kv(server, "127.0.0.1", "etl", "sslmode=require");
    let wrong = sink_config(require, Some(server.password())).sslrootcert(&pki.other_ca);
    assert!(connect(wrong).await.is_err());
}

#[tokio::test]
async fn a_client_certificate_logs_in_without_a_password() {
    let (server, pki) = server();
    let db = support::client(&server.url()).await;
    db.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE {0} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
         GRANT CREATE ON SCHEMA public TO {0}",
        support::CERT_USER
    ))
    .await
    .unwrap();
    let url = kv(
        server,
        "localhost",
        support::CERT_USER,
        "sslmode=verify-full application_name=tls_client_cert",
    );
    let config = sink_config(url.clone(), None)
        .sslrootcert(&pki.ca)
        .client_cert(&pki.client_cert, &pki.client_key);
    let _sink = connect(config).await.unwrap();
    assert!(encrypted("tls_client_cert").await);

    // Without the certificate the role cannot log in.
    let err = connect(sink_config(url, None).sslrootcert(&pki.ca))
        .await
        .unwrap_err();
    eprintln!("{err}");
    assert!(!err.is_retryable(), "{err}");
}

/// Log lines written while a test runs.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn prefer_says_at_warn_when_it_falls_back_to_plaintext() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // The shared test server has no TLS.
    let plain = format!("{}?sslmode=prefer", support::url());
    let sink = connect(sink_config(plain, None)).await.unwrap();
    drop(sink);
    let text = captured.text();
    eprintln!("{text}");
    assert!(text.contains("WARN"), "{text}");
    assert!(text.contains("NOT encrypted"), "{text}");

    // A server with TLS: encrypted, nothing said.
    let before = captured.text().len();
    let (server, _) = server();
    let url = format!("{}?application_name=tls_prefer", server.url());
    let _sink = connect(sink_config(url, None)).await.unwrap();
    assert!(
        encrypted("tls_prefer").await,
        "prefer is the default and uses TLS"
    );
    assert_eq!(captured.text().len(), before, "{}", captured.text());
}

#[test]
fn validation_reports_tls_mistakes_without_connecting() {
    let missing = Path::new("/nonexistent/ca.pem");
    let cases = [
        (
            PostgresSinkConfig::new(
                "postgres://etl@127.0.0.1:1/db?sslmode=verify-everything",
                "t",
            ),
            "sslmode",
        ),
        (
            PostgresSinkConfig::new("postgres://etl@127.0.0.1:1/db?sslmode=verify-full", "t"),
            "sslrootcert",
        ),
        (
            PostgresSinkConfig::new("postgres://etl@127.0.0.1:1/db", "t")
                .sslmode(SslMode::VerifyCa)
                .sslrootcert(missing),
            "/nonexistent/ca.pem",
        ),
        (
            PostgresSinkConfig::new(
                "host=127.0.0.1 port=1 sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
                "t",
            ),
            // A path the URL holds is named by its option: the URL's text
            // never reaches a message.
            "option `sslrootcert`: cannot read the file it names",
        ),
        (
            PostgresSinkConfig::new("postgres://etl@127.0.0.1:1/db?sslcert=/tmp/c.pem", "t"),
            "sslkey",
        ),
    ];
    for (config, expected) in cases {
        let err = config.validate().expect_err(expected);
        let text = err.to_string();
        eprintln!("{text}");
        assert!(text.contains(expected), "{text}");
    }
}
