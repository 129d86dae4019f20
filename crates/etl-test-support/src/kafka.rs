//! The test broker from a client's side, through rdkafka.
//!
//! [`TestBroker::start`] gives a test its broker: the shared one
//! `ETL_TEST_KAFKA=host:port` names (what `cargo xtask test` provides), or
//! else a private Tansu broker on a free loopback port, killed when the
//! guard drops. A broker that cannot be had fails the test with the
//! reason; it never skips.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, TopicPartitionList};

use crate::tansu::{Broker, BrokerCommand};

/// A broker for one test: either the shared one named by `ETL_TEST_KAFKA`
/// or a private Tansu process, killed on drop.
#[derive(Debug)]
pub struct TestBroker {
    private: Option<Broker>,
    addr: String,
}

impl TestBroker {
    /// The broker for this test. Panics (failing the test) if none can be
    /// had.
    pub fn start() -> TestBroker {
        if let Ok(addr) = std::env::var("ETL_TEST_KAFKA")
            && !addr.is_empty()
        {
            return TestBroker {
                private: None,
                addr,
            };
        }
        Self::private(BrokerCommand::new())
    }

    /// A private broker started by `command` (a persistent storage engine,
    /// logs), whatever `ETL_TEST_KAFKA` says: for tests that stop and
    /// restart it. Panics (failing the test) if it cannot start.
    pub fn private(command: BrokerCommand) -> TestBroker {
        let broker = command
            .start()
            .unwrap_or_else(|e| panic!("the test broker did not start: {e}"));
        TestBroker {
            addr: broker.addr(),
            private: Some(broker),
        }
    }

    /// The bootstrap address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Client settings every test client shares: the broker's address.
    pub fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.addr);
        config
    }

    /// Settings for a group consumer: the timeouts the test broker needs
    /// (its first JoinGroup of a group takes about half the session
    /// timeout) and reading from the start.
    pub fn consumer_config(&self, group: &str) -> ClientConfig {
        let mut config = self.config();
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "1000");
        config
    }

    /// Create a topic with `partitions` partitions. Panics (failing the
    /// test) if the broker refuses.
    pub async fn create_topic(&self, name: &str, partitions: i32) {
        create_topic(self.config(), name, partitions).await;
    }

    /// Kill a private broker (it becomes unreachable). Panics with a
    /// shared one (`ETL_TEST_KAFKA`), which a test cannot stop.
    pub fn kill(&mut self) {
        self.private_broker().kill();
    }

    /// Start a killed private broker again on the same port. Panics
    /// (failing the test) if it cannot start, or with a shared broker.
    pub fn restart(&mut self) {
        self.private_broker()
            .restart()
            .unwrap_or_else(|e| panic!("the test broker did not restart: {e}"));
    }

    fn private_broker(&mut self) -> &mut Broker {
        self.private
            .as_mut()
            .expect("a test that stops the broker needs a private one (unset ETL_TEST_KAFKA)")
    }

    /// The offsets `group` has committed for partitions `0..partitions` of
    /// `topic`, read by a fresh client that does not join the group.
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
        committed(self.config(), group, topic, partitions)
    }
}

/// Create a topic with `partitions` partitions through a client of
/// `config` (any broker, secured ones included). Panics (failing the
/// test) if the broker refuses or does not answer within 30 s.
pub async fn create_topic(config: ClientConfig, name: &str, partitions: i32) {
    try_create_topic(config, name, partitions)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// [`create_topic`], saying why it failed instead of panicking (for a
/// test that adds its broker's logs to the failure).
pub async fn try_create_topic(
    config: ClientConfig,
    name: &str,
    partitions: i32,
) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> =
        config.create().map_err(|e| format!("admin client: {e}"))?;
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let results = admin
        .create_topics(
            [&topic],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .map_err(|e| format!("create_topics: {e}"))?;
    for result in results {
        result.map_err(|(t, e)| format!("cannot create topic {t}: {e}"))?;
    }
    Ok(())
}

/// The offsets `group` has committed for partitions `0..partitions` of
/// `topic`, read by a fresh client of `config` that does not join the
/// group. Panics (failing the test) if they cannot be read in 30 s.
pub fn committed(
    mut config: ClientConfig,
    group: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = config
        .set("group.id", group)
        .create()
        .expect("offset reader");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(30))
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

/// A name no other test (or earlier run against a shared broker) uses.
pub fn unique(prefix: &str) -> String {
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
