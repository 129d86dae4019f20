//! Kafka -> blackhole against a raw librdkafka consumer, printed as
//! `RESULT` lines for `cargo xtask bench` (which starts the broker,
//! produces the topic once and alternates the two consumers).
//!
//! * `produce --brokers B --topic T --partitions P --records N`: create
//!   the topic and write `N` NDJSON records of about 100 bytes (id, user,
//!   amount, timestamp, tags) round-robin over its partitions, `acks=all`,
//!   batched for throughput; every delivery report must succeed. A topic
//!   that exists already must hold exactly `N` records (counted by reading
//!   it), or the run fails.
//! * `raw --brokers B --topic T --records N`: a plain rdkafka
//!   [`BaseConsumer`] in a new group reads the topic from the start until
//!   `N` messages arrived, summing payload lengths. Reports `raw_rps`.
//! * `etl --brokers B --topic T --records N`: the real pipeline, built
//!   from a configuration as `etl run` builds it: `[source] type =
//!   "kafka"` in a new group, no transforms, one blackhole sink, offsets
//!   in the group. A task polls the pipeline's metrics every millisecond
//!   until the sink wrote `N` records, then stops the pipeline. Reports
//!   `etl_rps` and `etl_peak_rss_kib`, the process's peak resident set
//!   (`VmHWM`).
//! * `etl-filter --brokers B --topic T --records N`: the same with the
//!   file-to-file row's job in between: parse each value as JSON, keep
//!   `amount >= 100` (about 90%), add a field, write NDJSON to a file in
//!   a temporary directory. Runs until every record is written or
//!   filtered; reports `etl_filter_rps` and `etl_filter_peak_rss_kib`.
//!
//! Rates are `N` over the time from the first message (raw) or the first
//! record entering the transforms (etl) to the `N`th, so joining the group
//! (about half the session timeout on the test broker) is not counted.
//!
//! Both consumers run with the same librdkafka fetch settings: its
//! defaults, except `fetch.queue.backoff.ms`, which the etl source sets to
//! 50 ms and the raw consumer sets likewise (with librdkafka's 1 s default
//! both stall for whole seconds each time a partition's local queue
//! passes 100,000 messages, which swamps a sub-second measurement). Both
//! use the same session timeout and assignment strategy
//! (`cooperative-sticky`), read from `earliest` and never commit on their
//! own. What differs is what the comparison measures: the etl source
//! builds a record of every message on its poll thread (value and key
//! pointing into the message, headers left unparsed until read) and hands
//! batches of up to 500 to the source driver, which tracks them for
//! acknowledgement; the blackhole counts them without encoding; the
//! checkpointer commits the group's offsets every second. The etl figure
//! also includes the sink's linger (up to 50 ms) for the last partial
//! batch, and the metrics polling.
//!
//! Run by hand against `cargo xtask kafka --port 19092`:
//!
//! ```text
//! cargo bench -p etl-tests --bench kafka -- produce --brokers 127.0.0.1:19092 --topic bench --partitions 4 --records 1000000
//! cargo bench -p etl-tests --bench kafka -- raw --brokers 127.0.0.1:19092 --topic bench --records 1000000
//! cargo bench -p etl-tests --bench kafka -- etl --brokers 127.0.0.1:19092 --topic bench --records 1000000
//! cargo bench -p etl-tests --bench kafka -- etl-filter --brokers 127.0.0.1:19092 --topic bench --records 1000000
//! ```

// A bench binary: failures end the run with a message, like a test.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[path = "../../crates/etl/benches/common/mod.rs"]
mod common;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientConfig, TopicPartitionList};
use tokio_util::sync::CancellationToken;

/// Group settings both consumers share: the test broker takes about half
/// the session timeout to form a new group, so it is short.
const SESSION_TIMEOUT_MS: u32 = 6_000;
const HEARTBEAT_INTERVAL_MS: u32 = 1_000;
/// The etl source's default assignment strategy, used by both.
const ASSIGNMENT_STRATEGY: &str = "cooperative-sticky";
/// The etl source's `fetch.queue.backoff.ms` (`etl-kafka`'s
/// `SOURCE_DEFAULTS`), given to the raw consumer too.
const FETCH_QUEUE_BACKOFF_MS: u32 = 50;
/// How long a run may take before it is called stuck.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

fn main() {
    // The allocator setting the `etl` binary runs with (its memory use is
    // part of what the rows measure).
    etl_cli::keep_large_buffers_out_of_the_heap();
    // `cargo bench` passes `--bench`; flags of our own come in pairs.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let text = |name: &str| -> String {
        args.windows(2)
            .find(|w| w[0] == name)
            .map(|w| w[1].clone())
            .unwrap_or_else(|| fail(&format!("{name} is required")))
    };
    let number = |name: &str| -> u64 {
        text(name)
            .parse()
            .unwrap_or_else(|_| fail(&format!("{name} takes a number")))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (brokers, topic) = (text("--brokers"), text("--topic"));
    let records = number("--records");
    match args.first().map(String::as_str) {
        Some("produce") => {
            let partitions = i32::try_from(number("--partitions"))
                .ok()
                .filter(|p| *p > 0)
                .unwrap_or_else(|| fail("--partitions takes a count from 1"));
            match runtime.block_on(produce(&brokers, &topic, partitions, records)) {
                Some(rate) => println!("RESULT produced={records} produce_rps={rate:.0}"),
                None => println!("RESULT produced=0"),
            }
        }
        Some("raw") => {
            let rate = raw(&brokers, &topic, records);
            println!("RESULT raw_rps={rate:.0}");
        }
        Some("etl") => {
            let (rate, peak) = runtime.block_on(etl(&brokers, &topic, records, Shape::Blackhole));
            println!("RESULT etl_rps={rate:.0} etl_peak_rss_kib={peak}");
        }
        Some("etl-filter") => {
            let (rate, peak) =
                runtime.block_on(etl(&brokers, &topic, records, Shape::FilterToFile));
            println!("RESULT etl_filter_rps={rate:.0} etl_filter_peak_rss_kib={peak}");
        }
        other => fail(&format!(
            "unknown mode {other:?}: produce | raw | etl | etl-filter"
        )),
    }
}

/// The process's peak resident set (`VmHWM`), in KiB; 0 where `/proc`
/// does not say.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn fail(message: &str) -> ! {
    eprintln!("kafka bench: {message}");
    std::process::exit(2);
}

/// A group id no earlier run used, so the group starts at `earliest`.
fn new_group(side: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("bench-{side}-{}-{nanos}", std::process::id())
}

/// Counts delivery reports.
#[derive(Default)]
struct Deliveries {
    ok: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
        match result {
            Ok(_) => {
                self.ok.fetch_add(1, Ordering::Relaxed);
            }
            Err((err, _)) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("kafka bench: delivery failed: {err}");
                }
            }
        }
    }
}

/// Create the topic and fill it: records per second of producing, or
/// `None` when the topic already held the records.
async fn produce(brokers: &str, topic: &str, partitions: i32, records: u64) -> Option<f64> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let results = admin
        .create_topics(
            [&NewTopic::new(
                topic,
                partitions,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap_or_else(|e| fail(&format!("creating topic {topic}: {e}")));
    for result in results {
        match result {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                let held = count(brokers, topic);
                if held != records {
                    fail(&format!(
                        "topic {topic} already exists with {held} records, not {records}: \
                         use another topic or a fresh broker"
                    ));
                }
                eprintln!("kafka bench: topic {topic} already holds {records} records");
                return None;
            }
            Err((t, e)) => fail(&format!("cannot create topic {t}: {e}")),
        }
    }
    let producer: BaseProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("acks", "all")
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create_with_context(Deliveries::default())
        .unwrap();
    let started = Instant::now();
    let mut line = String::with_capacity(160);
    let spread = u64::from(partitions.unsigned_abs());
    for id in 0..records {
        line.clear();
        common::record(id, &mut line);
        let partition = i32::try_from(id % spread).unwrap_or(0);
        let mut message = BaseRecord::<(), str>::to(topic)
            .payload(line.as_str())
            .partition(partition);
        loop {
            match producer.send(message) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    message = back;
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => fail(&format!("producing record {id}: {e}")),
            }
        }
        if id % 10_000 == 0 {
            producer.poll(Duration::ZERO);
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .unwrap_or_else(|e| fail(&format!("flushing the producer: {e}")));
    let rate = records as f64 / started.elapsed().as_secs_f64();
    let deliveries = producer.context();
    let (ok, failed) = (
        deliveries.ok.load(Ordering::Relaxed),
        deliveries.failed.load(Ordering::Relaxed),
    );
    if ok != records || failed != 0 {
        fail(&format!(
            "{ok} of {records} records delivered, {failed} failed"
        ));
    }
    // Not checked against the watermarks: Tansu 0.6.0 reports a
    // partition's high watermark as the last batch's base offset + 1.
    Some(rate)
}

/// Records in `topic`, counted by reading every partition from the start
/// until nothing more arrives for two seconds.
fn count(brokers: &str, topic: &str) -> u64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", new_group("count"))
        .set("enable.auto.commit", "false")
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS.to_string())
        .create()
        .unwrap();
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap_or_else(|e| fail(&format!("metadata of {topic}: {e}")));
    let mut assignment = TopicPartitionList::new();
    for t in metadata.topics() {
        for p in t.partitions() {
            assignment
                .add_partition_offset(topic, p.id(), rdkafka::Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&assignment).unwrap();
    let mut seen = 0u64;
    let mut last = Instant::now();
    while last.elapsed() < Duration::from_secs(2) {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(_)) => {
                seen += 1;
                last = Instant::now();
            }
            Some(Err(e)) => fail(&format!("counting {topic}: {e}")),
            None => {}
        }
    }
    seen
}

/// A plain consumer in a new group: records per second from the first
/// message to the `records`th.
fn raw(brokers: &str, topic: &str, records: u64) -> f64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", new_group("raw"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", SESSION_TIMEOUT_MS.to_string())
        .set("heartbeat.interval.ms", HEARTBEAT_INTERVAL_MS.to_string())
        .set("partition.assignment.strategy", ASSIGNMENT_STRATEGY)
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS.to_string())
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + RUN_TIMEOUT;
    let mut first = None;
    let (mut received, mut bytes) = (0u64, 0u64);
    while received < records {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                first.get_or_insert_with(Instant::now);
                bytes += message.payload().map_or(0, |p| p.len() as u64);
                received += 1;
            }
            Some(Err(e)) => eprintln!("kafka bench: consumer error: {e}"),
            None => {}
        }
        if Instant::now() > deadline {
            fail(&format!(
                "raw consumer read {received} of {records} records in {RUN_TIMEOUT:?}"
            ));
        }
    }
    let secs = first.map_or(f64::NAN, |t| t.elapsed().as_secs_f64());
    eprintln!(
        "kafka bench: raw read {received} messages, {} payload bytes in {secs:.3} s",
        std::hint::black_box(bytes)
    );
    records as f64 / secs
}

/// What the etl side does with the records it reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// No transforms, one blackhole sink.
    Blackhole,
    /// Parse each value as JSON, keep `amount >= 100` (about 90%), add a
    /// field, and write NDJSON to a file: the file-to-file row's job.
    FilterToFile,
}

/// The real pipeline from a configuration: records per second from the
/// first record read to the `records`th written (or filtered), and the
/// process's peak resident set (KiB) at the end of the run.
async fn etl(brokers: &str, topic: &str, records: u64, shape: Shape) -> (f64, u64) {
    let out = tempfile::tempdir().unwrap();
    let (transforms, sink) = match shape {
        Shape::Blackhole => (String::new(), "type = \"blackhole\"".to_owned()),
        Shape::FilterToFile => (
            r#"
[[transforms]]
type = "filter"
field = "amount"
op = ">="
value = 100

[[transforms]]
type = "add_field"
field = "pipeline"
value = "bench"
"#
            .to_owned(),
            format!(
                "type = \"file\"\npath = \"{}\"",
                out.path().join("out.ndjson").display()
            ),
        ),
    };
    let expected = match shape {
        Shape::Blackhole => records,
        Shape::FilterToFile => (0..records)
            .filter(|id| common::amount_cents(*id) >= 10_000)
            .count() as u64,
    };
    let config = format!(
        r#"
[source]
type = "kafka"
name = "bench"
brokers = "{brokers}"
group_id = "{group}"
topics = ["{topic}"]
session_timeout = "{SESSION_TIMEOUT_MS}ms"
heartbeat_interval = "{HEARTBEAT_INTERVAL_MS}ms"
assignment_strategy = "{ASSIGNMENT_STRATEGY}"
auto_offset_reset = "earliest"
{transforms}
[[sinks]]
name = "out"
{sink}

[checkpoint]
revoke_deadline = "3s"
store = {{ type = "source" }}
"#,
        group = new_group("etl"),
    );
    let config = etl::registry()
        .loader()
        .text(&config, std::path::Path::new("."))
        .unwrap_or_else(|e| fail(&format!("configuration: {e:?}")));
    let pipeline = etl::pipeline_from_config(&config)
        .await
        .unwrap_or_else(|e| fail(&format!("building the pipeline: {e}")));
    let hub = pipeline.metrics();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let watch = tokio::spawn(async move {
        let deadline = Instant::now() + RUN_TIMEOUT;
        let mut first = None;
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let totals = hub.totals();
            if first.is_none() && totals.read > 0 {
                first = Some(Instant::now());
            }
            if totals.written >= expected && totals.written + totals.filtered >= records {
                stop.cancel();
                return first.map(|t| t.elapsed().as_secs_f64());
            }
            if Instant::now() > deadline {
                eprintln!(
                    "kafka bench: etl wrote {} of {records} records (read {}) in {RUN_TIMEOUT:?}",
                    totals.written, totals.read
                );
                stop.cancel();
                return None;
            }
        }
    });
    let summary = pipeline
        .run(shutdown)
        .await
        .unwrap_or_else(|e| fail(&format!("the pipeline failed: {e}")));
    let secs = watch
        .await
        .unwrap()
        .unwrap_or_else(|| fail("the pipeline did not write every record"));
    eprintln!(
        "kafka bench: etl read {}, wrote {} in {secs:.3} s",
        summary.read,
        summary.written()
    );
    if summary.read < records || summary.written() < expected {
        fail(&format!(
            "etl read {} and wrote {} records, expected at least {records} and {expected}",
            summary.read,
            summary.written()
        ));
    }
    // The pipeline's peak, before the check below reads the output.
    let peak = peak_rss_kib();
    if shape == Shape::FilterToFile {
        let lines = count_lines(&out.path().join("out.ndjson"))
            .unwrap_or_else(|e| fail(&format!("reading the output: {e}")));
        if lines < expected {
            fail(&format!(
                "the output holds {lines} lines, expected {expected}"
            ));
        }
    }
    (records as f64 / secs, peak)
}

/// The lines of a file, read a block at a time.
fn count_lines(path: &std::path::Path) -> std::io::Result<u64> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let mut block = vec![0u8; 1 << 16];
    let mut lines = 0u64;
    loop {
        let n = file.read(&mut block)?;
        if n == 0 {
            return Ok(lines);
        }
        lines += block[..n].iter().filter(|b| **b == b'\n').count() as u64;
    }
}
