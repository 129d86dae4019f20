//! Secured test brokers: TLS, client certificates and SASL (SCRAM, PLAIN)
//! in front of the test broker.
//!
//! The pinned broker (Tansu 0.6.0) cannot serve any of these itself: its
//! `--cert` and `--key` options are one clap group that refuses both at
//! once (and a TLS acceptor is built but never used), it has no option
//! for a client CA, and with `--authentication` it accepts SCRAM users
//! only from a client that has already authenticated, while its in-memory
//! storage starts with no user (and its PLAIN is not built in). So a
//! [`SecureBroker`] is a private Tansu
//! broker on a plaintext loopback port behind real terminators:
//!
//! - TLS and client certificates: `stunnel4`, Debian's TLS tunnel (built
//!   on the system OpenSSL), installed with `apt-get` when missing, as the
//!   PostgreSQL suites install PostgreSQL. With client certificates on it
//!   requires and verifies one against the test CA (`verifyChain`,
//!   `requireCert`).
//! - SASL SCRAM-SHA-256/512 and PLAIN: `sasl_gate.py` between stunnel and
//!   the broker answers SaslHandshake and SaslAuthenticate (RFC 5802/7677,
//!   storing only the salted keys; RFC 4616) and then relays bytes to the
//!   broker.
//!
//! The broker advertises the TLS port, so every connection a client makes
//! (bootstrap, partition leaders, group coordinator) goes through the
//! terminators. Certificates are generated per broker with `rcgen`: a CA,
//! the broker's certificate for the names asked for, and a client
//! certificate.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, TopicPartitionList};

use etl_test_support::tansu::{Broker, BrokerCommand};

/// What a [`SecureBroker`] demands of its clients.
#[derive(Clone, Debug)]
pub(crate) struct Security {
    /// Subject alternative names of the broker's certificate.
    pub(crate) server_names: Vec<String>,
    /// Require a client certificate signed by the test CA (mTLS).
    pub(crate) client_certificates: bool,
    /// Require SASL with this mechanism, user and password.
    pub(crate) sasl: Option<Sasl>,
}

/// SASL credentials the broker accepts.
#[derive(Clone, Debug)]
pub(crate) struct Sasl {
    /// `SCRAM-SHA-256`, `SCRAM-SHA-512` or `PLAIN`.
    pub(crate) mechanism: String,
    pub(crate) user: String,
    pub(crate) password: String,
}

impl Security {
    /// TLS only, with a certificate for `localhost` and `127.0.0.1`.
    pub(crate) fn tls() -> Self {
        Security {
            server_names: vec!["localhost".to_owned(), "127.0.0.1".to_owned()],
            client_certificates: false,
            sasl: None,
        }
    }
}

/// A CA of the test, able to issue certificates.
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    pub(crate) fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// The CA certificate, PEM.
    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate and its private key (PEM) for `names`, for a server
    /// or a client.
    pub(crate) fn issue(
        &self,
        common_name: &str,
        names: &[String],
        server: bool,
    ) -> (String, String) {
        let mut params = CertificateParams::new(names.to_vec()).expect("certificate params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![if server {
            ExtendedKeyUsagePurpose::ServerAuth
        } else {
            ExtendedKeyUsagePurpose::ClientAuth
        }];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// A private broker behind TLS (and SASL), killed with its terminators
/// on drop.
#[derive(Debug)]
pub(crate) struct SecureBroker {
    children: Vec<(String, Child)>,
    /// The broker behind the terminators (killed after them, on drop).
    _tansu: Broker,
    dir: tempfile::TempDir,
    addr: String,
    security: Security,
    /// The test CA that signed the broker's (and the client's) certificate.
    pub(crate) ca: Ca,
}

impl SecureBroker {
    /// Start the broker and its terminators; panics (failing the test)
    /// with the reason if any of them cannot start.
    pub(crate) fn start(security: Security) -> SecureBroker {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = Ca::new("etl test CA");
        write(dir.path(), "ca.pem", &ca.pem());
        let (cert, key) = ca.issue("etl test broker", &security.server_names, true);
        write(dir.path(), "server.pem", &cert);
        write(dir.path(), "server.key", &key);
        let (cert, key) = ca.issue("etl-client", &["etl-client".to_owned()], false);
        write(dir.path(), "client.pem", &cert);
        write(dir.path(), "client.key", &key);

        let broker_port = free_port();
        let tls_port = free_port();
        let logs = dir.path().to_path_buf();
        let tansu = BrokerCommand::new()
            .port(broker_port)
            .advertised_port(tls_port)
            .log_to(&logs)
            .start()
            .unwrap_or_else(|e| panic!("the test broker did not start: {e}"));
        let mut broker = SecureBroker {
            children: Vec::new(),
            _tansu: tansu,
            addr: format!("127.0.0.1:{tls_port}"),
            dir,
            security,
            ca,
        };
        let log =
            |name: &str| std::fs::File::create(logs.join(format!("{name}.log"))).expect("log file");

        let mut behind_tls = broker_port;
        if let Some(sasl) = broker.security.sasl.clone() {
            let gate_port = free_port();
            let script = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests")
                .join("it")
                .join("kafka_support")
                .join("sasl_gate.py");
            let gate = Command::new("python3")
                .arg(&script)
                .args([gate_port.to_string(), broker_port.to_string()])
                .args([&sasl.mechanism, &sasl.user])
                .env("SASL_GATE_PASSWORD", &sasl.password)
                .stdin(Stdio::null())
                .stdout(log("sasl-gate"))
                .stderr(log("sasl-gate-stderr"))
                .spawn()
                .expect("python3 runs the SASL gate of the TLS suite");
            broker.children.push(("SASL gate".to_owned(), gate));
            broker.wait_listening("SASL gate", gate_port);
            behind_tls = gate_port;
        }

        let mut conf = format!(
            "foreground = yes\npid =\ndebug = notice\n\n[kafka]\n\
             accept = 127.0.0.1:{tls_port}\nconnect = 127.0.0.1:{behind_tls}\n\
             cert = {}\nkey = {}\n",
            broker.path("server.pem").display(),
            broker.path("server.key").display(),
        );
        if broker.security.client_certificates {
            conf.push_str(&format!(
                "CAfile = {}\nverifyChain = yes\nrequireCert = yes\n",
                broker.path("ca.pem").display()
            ));
        }
        write(broker.dir.path(), "stunnel.conf", &conf);
        let stunnel = Command::new(stunnel())
            .arg(broker.path("stunnel.conf"))
            .stdin(Stdio::null())
            .stdout(log("stunnel"))
            .stderr(log("stunnel-stderr"))
            .spawn()
            .expect("start stunnel");
        broker.children.push(("stunnel".to_owned(), stunnel));
        broker.wait_listening("stunnel", tls_port);
        broker
    }

    /// The bootstrap address (the TLS port).
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// A file of the broker's folder (`ca.pem`, `client.pem`,
    /// `client.key`, ...).
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Write `contents` into the broker's folder; returns the path.
    pub(crate) fn write(&self, name: &str, contents: &str) -> PathBuf {
        write(self.dir.path(), name, contents)
    }

    /// The librdkafka settings a client of this broker needs, the CA as a
    /// file: TLS, the client certificate when required, SASL when
    /// required.
    pub(crate) fn properties(&self) -> Vec<(String, String)> {
        let mut p = vec![
            (
                "security.protocol".to_owned(),
                if self.security.sasl.is_some() {
                    "SASL_SSL"
                } else {
                    "SSL"
                }
                .to_owned(),
            ),
            (
                "ssl.ca.location".to_owned(),
                self.path("ca.pem").display().to_string(),
            ),
        ];
        if self.security.client_certificates {
            p.push((
                "ssl.certificate.location".to_owned(),
                self.path("client.pem").display().to_string(),
            ));
            p.push((
                "ssl.key.location".to_owned(),
                self.path("client.key").display().to_string(),
            ));
        }
        if let Some(sasl) = &self.security.sasl {
            p.push(("sasl.mechanism".to_owned(), sasl.mechanism.clone()));
            p.push(("sasl.username".to_owned(), sasl.user.clone()));
            p.push(("sasl.password".to_owned(), sasl.password.clone()));
        }
        p
    }

    /// A client configuration for this broker.
    pub(crate) fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.addr);
        for (k, v) in self.properties() {
            config.set(k, v);
        }
        config
    }

    /// Create a topic over TLS.
    pub(crate) async fn create_topic(&self, name: &str, partitions: i32) {
        if let Err(e) =
            etl_test_support::kafka::try_create_topic(self.config(), name, partitions).await
        {
            panic!("{e} (over TLS)\n{}", self.logs());
        }
    }

    /// The offsets `group` has committed on partitions `0..partitions`
    /// of `topic`, read over TLS without joining the group.
    pub(crate) fn committed(
        &self,
        group: &str,
        topic: &str,
        partitions: i32,
    ) -> std::collections::BTreeMap<i32, i64> {
        etl_test_support::kafka::committed(self.config(), group, topic, partitions)
    }

    /// Every record value of `topic` (partitions `0..partitions`) read
    /// over TLS until `expected` arrived or `timeout` passed.
    pub(crate) fn read_values(
        &self,
        topic: &str,
        partitions: i32,
        expected: usize,
        timeout: Duration,
    ) -> Vec<Vec<u8>> {
        let consumer: BaseConsumer = self
            .config()
            .set("group.id", super::unique("tls-reader"))
            .set("enable.auto.commit", "false")
            .create()
            .expect("reader");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        let deadline = Instant::now() + timeout;
        let mut values = Vec::new();
        while values.len() < expected && Instant::now() < deadline {
            if let Some(message) = consumer.poll(Duration::from_millis(200)) {
                let message = message.expect("read over TLS");
                values.push(message.payload().unwrap_or_default().to_vec());
            }
        }
        values
    }

    /// The client key (`client.key`) encrypted with `password` (PKCS#8,
    /// OpenSSL's default cipher), as `client-encrypted.key`; its path.
    pub(crate) fn encrypted_client_key(&self, password: &str) -> PathBuf {
        let out = self.path("client-encrypted.key");
        let status = Command::new(openssl())
            .args(["pkcs8", "-topk8", "-in"])
            .arg(self.path("client.key"))
            .arg("-out")
            .arg(&out)
            .args(["-passout", "env:ETL_TEST_KEY_PASSWORD"])
            .env("ETL_TEST_KEY_PASSWORD", password)
            .stdin(Stdio::null())
            .status()
            .expect("run openssl");
        assert!(status.success(), "openssl pkcs8 -topk8: {status}");
        out
    }

    /// The terminators' and the broker's logs, for failure messages.
    pub(crate) fn logs(&self) -> String {
        let mut out = String::new();
        for name in [
            "stunnel",
            "stunnel-stderr",
            "sasl-gate-stderr",
            "tansu-stderr",
        ] {
            if let Ok(text) = std::fs::read_to_string(self.path(&format!("{name}.log"))) {
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                out.push_str(&format!("--- {name} (last lines)\n"));
                for line in tail.into_iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }

    fn wait_listening(&mut self, what: &str, port: u16) {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            let (_, child) = self.children.last_mut().expect("a child");
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{what} exited before listening on {addr}: {status}\n{}",
                    self.logs()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what} not listening on {addr} after 30 s\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for SecureBroker {
    fn drop(&mut self) {
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

fn free_port() -> u16 {
    etl_test_support::free_port().unwrap_or_else(|e| panic!("{e}"))
}

/// `stunnel4`, installed from Debian's packages when missing (as root).
fn stunnel() -> PathBuf {
    installed(
        "stunnel4",
        &[
            "/usr/bin/stunnel4",
            "/usr/bin/stunnel",
            "/usr/local/bin/stunnel",
        ],
    )
}

/// The `openssl` command, installed from Debian's packages when missing
/// (as root).
fn openssl() -> PathBuf {
    installed("openssl", &["/usr/bin/openssl", "/usr/local/bin/openssl"])
}

/// The first of `candidates` that exists, after installing Debian's
/// `package` if none does.
fn installed(package: &str, candidates: &[&str]) -> PathBuf {
    let find = || candidates.iter().map(PathBuf::from).find(|p| p.is_file());
    if let Some(path) = find() {
        return path;
    }
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = find() {
        return path;
    }
    eprintln!("{package} is not installed; installing Debian's `{package}` for the TLS suite");
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let install = ["install", "-y", "--no-install-recommends", package];
    // Another test process may hold apt's lock and install it meanwhile.
    if !apt(&install) && find().is_none() {
        assert!(
            apt(&["update"]) || find().is_some(),
            "apt-get update failed (needed to install {package})"
        );
        assert!(
            find().is_some() || apt(&install),
            "apt-get install {package} failed: the TLS suite needs {package} (install it, e.g. `apt-get install {package}`)"
        );
    }
    find().unwrap_or_else(|| panic!("apt-get installed {package} but no binary was found"))
}
