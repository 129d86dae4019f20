//! TLS against a server with a certificate made here: a custom CA, a
//! client certificate the server requires, and the handshakes that must
//! halt (an unknown CA, no client certificate) as the configuration's
//! error.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etl::{ErrorKind, Registry};
use etl_ack::AckStatus;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::support::{batches, deliver, drive, driver_config, sink};

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A TLS server on loopback that requires a client certificate of `ca`,
/// answers 200 and keeps every body it read.
struct TlsServer {
    uri: String,
    bodies: Arc<Mutex<Vec<String>>>,
}

/// The PEM files of a test PKI, and a server that trusts its CA.
struct Pki {
    dir: tempfile::TempDir,
    server: TlsServer,
}

impl Pki {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn pki() -> Pki {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let ca = new_ca("etl test CA");
    let other = new_ca("some other CA");
    let mut server = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &ca).unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client.distinguished_name.push(DnType::CommonName, "etl");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &ca).unwrap();
    let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
    write("ca.pem", &ca.pem());
    write("other_ca.pem", &other.pem());
    write("client.pem", &client_cert.pem());
    write("client.key", &client_key.serialize_pem());

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .unwrap();
    let config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from(server_cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )
        .unwrap();
    Pki {
        server: serve(Arc::new(config)),
        dir,
    }
}

fn serve(config: Arc<rustls::ServerConfig>) -> TlsServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!(
        "https://localhost:{}/in",
        listener.local_addr().unwrap().port()
    );
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let kept = bodies.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, kept) = (config.clone(), kept.clone());
            std::thread::spawn(move || {
                let Ok(connection) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut reader = BufReader::new(rustls::StreamOwned::new(connection, tcp));
                let mut length = 0;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_err() {
                    return;
                }
                kept.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
                let stream = reader.get_mut();
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                let _ = stream.flush();
                stream.conn.send_close_notify();
                let _ = stream.flush();
            });
        }
    });
    TlsServer { uri, bodies }
}

fn tls_table(dir: &Path, ca: &str, client: bool) -> String {
    let mut table = format!("\n[tls]\nca_file = \"{}\"\n", dir.join(ca).display());
    if client {
        table.push_str(&format!(
            "client_cert_file = \"{}\"\nclient_key_file = \"{}\"\n",
            dir.join("client.pem").display(),
            dir.join("client.key").display()
        ));
    }
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_ca_and_a_client_certificate_deliver_over_tls() {
    let pki = pki();
    let text = format!(
        "uri = \"{}\"{}",
        pki.server.uri,
        tls_table(pki.dir.path(), "ca.pem", true)
    );
    let (driver, _letters) = drive(sink(&text), driver_config(5, 1));
    let (statuses, closed) = deliver(driver, batches(5, 5)).await;
    closed.unwrap();
    assert_eq!(statuses, [AckStatus::Delivered]);
    let bodies = pki.server.bodies.lock().unwrap().clone();
    assert_eq!(bodies.concat().lines().count(), 5, "{bodies:?}");
    assert!(pki.path("ca.pem").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_ca_or_a_missing_client_certificate_halts_as_the_configurations_error() {
    let pki = pki();
    let registry = etl_http::register(Registry::new());
    for (ca, client) in [("other_ca.pem", true), ("ca.pem", false)] {
        let text = format!(
            "uri = \"{}\"{}",
            pki.server.uri,
            tls_table(pki.dir.path(), ca, client)
        );
        let mut config = driver_config(5, 1);
        config.retry.max_elapsed = Duration::from_secs(2);
        let (driver, _letters) = drive(sink(&text), config);
        let (statuses, closed) = deliver(driver, batches(5, 5)).await;
        let err = closed.unwrap_err();
        assert!(!statuses.contains(&AckStatus::Delivered));
        assert_eq!(
            registry.classify(&err),
            Some(ErrorKind::Config),
            "{ca}, client certificate {client}: {err}"
        );
        assert!(err.to_string().contains("TLS"), "{err}");
    }
    assert!(pki.server.bodies.lock().unwrap().is_empty());
}

#[test]
fn an_unreadable_tls_file_is_refused_when_the_sink_is_built_naming_it() {
    let config: etl_http::HttpSinkConfig =
        toml::from_str("uri = \"https://h/\"\n[tls]\nca_file = \"missing/ca.pem\"\n").unwrap();
    let err = etl_http::HttpSink::new("svc", "/nowhere".as_ref(), config).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("/nowhere/missing/ca.pem") && text.contains("\"svc\""),
        "{text}"
    );
    let registry = etl_http::register(Registry::new());
    assert_eq!(registry.classify(&err), Some(ErrorKind::Config));
}
