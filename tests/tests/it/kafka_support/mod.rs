//! Support for the Kafka end-to-end suites: the test broker (the same
//! code as `etl-kafka`'s tests), producing numbered records, `etl`
//! processes that are members of one consumer group, and reading their
//! file outputs by record id.

#![allow(dead_code, clippy::unwrap_used)]

mod secure;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, FutureRecord};

pub(crate) use etl_test_support::kafka::{TestBroker, unique};
// Only the TLS suite uses these.
#[allow(unused_imports)]
pub(crate) use secure::{Ca, Sasl, SecureBroker, Security};

/// Every produced value is exactly this long, so output bytes count
/// records.
pub(crate) const LINE_BYTES: u64 = 40;

/// The value of record `id`: `{"id":N,"pad":"..."}`, [`LINE_BYTES`] - 1
/// bytes (the file sink adds the newline).
pub(crate) fn value(id: u64) -> String {
    let head = format!("{{\"id\":{id},\"pad\":\"");
    let pad = (LINE_BYTES as usize - 1) - head.len() - 2;
    format!("{head}{}\"}}", "x".repeat(pad))
}

/// Produce records `0..count` round-robin over `partitions` partitions of
/// `topic`; returns each record's idempotency key as the Kafka source
/// names it (`source/partition id/offset`, the id from the topic's name
/// and the partition number), by id.
pub(crate) async fn produce(
    broker: &TestBroker,
    topic: &str,
    partitions: i32,
    count: u64,
    source: &str,
) -> BTreeMap<u64, String> {
    produce_range(&producer(broker), topic, partitions, 0..count, source).await
}

/// A producer for [`produce_range`], batching generously.
pub(crate) fn producer(broker: &TestBroker) -> FutureProducer {
    broker
        .config()
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "2000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create()
        .expect("producer")
}

/// Produce records `ids` as [`produce`] does, waiting for every delivery
/// report.
pub(crate) async fn produce_range(
    producer: &FutureProducer,
    topic: &str,
    partitions: i32,
    ids: std::ops::Range<u64>,
    source: &str,
) -> BTreeMap<u64, String> {
    let mut pending = Vec::with_capacity(usize::try_from(ids.end - ids.start).unwrap_or(0));
    for id in ids {
        let payload = value(id);
        let partition = i32::try_from(id % partitions as u64).expect("few partitions");
        let delivery = producer
            .send_result(
                FutureRecord::<(), _>::to(topic)
                    .payload(&payload)
                    .partition(partition),
            )
            .map_err(|(e, _)| e)
            .expect("enqueue");
        pending.push((id, delivery));
    }
    let map = etl_kafka::PartitionMap::new(vec![topic.to_owned()]).expect("topic");
    let mut keys = BTreeMap::new();
    for (id, delivery) in pending {
        let d = delivery
            .await
            .expect("delivery report")
            .map_err(|(e, _)| e)
            .expect("delivered");
        let partition = map.id(topic, d.partition).expect("mapped");
        keys.insert(id, format!("{source}/{partition}/{}", d.offset));
    }
    keys
}

/// Settings of a group member's pipeline.
#[derive(Clone, Debug)]
pub(crate) struct MemberConfig {
    pub(crate) brokers: String,
    pub(crate) group: String,
    pub(crate) topic: String,
    /// Records per poll batch.
    pub(crate) max_batch_records: usize,
    /// Poll batches in flight, in all.
    pub(crate) max_in_flight_batches: u32,
    pub(crate) commit_interval_ms: u64,
    pub(crate) revoke_deadline_ms: u64,
    /// The source's `commit_timeout` in milliseconds, when not the default.
    pub(crate) commit_timeout_ms: Option<u32>,
    /// The source's librdkafka `properties` (security settings).
    pub(crate) properties: Vec<(String, String)>,
}

impl MemberConfig {
    pub(crate) fn new(broker: &TestBroker, group: &str, topic: &str) -> Self {
        Self::with_brokers(broker.addr(), group, topic)
    }

    /// The defaults for a group on `brokers` (any broker, such as a
    /// [`SecureBroker`]).
    pub(crate) fn with_brokers(brokers: &str, group: &str, topic: &str) -> Self {
        MemberConfig {
            brokers: brokers.to_owned(),
            group: group.to_owned(),
            topic: topic.to_owned(),
            max_batch_records: 500,
            max_in_flight_batches: 8,
            commit_interval_ms: 20,
            revoke_deadline_ms: 3_000,
            commit_timeout_ms: None,
            properties: Vec::new(),
        }
    }

    /// Records in flight at most: every batch in flight full.
    pub(crate) fn in_flight_records(&self) -> u64 {
        u64::from(self.max_in_flight_batches) * self.max_batch_records as u64
    }

    /// The most records one kill can write twice: those in flight when
    /// the last commit was taken, and those opened with the credit handed
    /// back before the next (commits follow every moved watermark within
    /// `commit_interval`): twice the in-flight bound.
    pub(crate) fn duplicate_bound_per_kill(&self) -> u64 {
        2 * self.in_flight_records()
    }

    /// The pipeline: the group's topic into `sink`, a TOML `[[sinks]]`
    /// body (without its header).
    pub(crate) fn render(&self, sink: &str) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "[source]\ntype = \"kafka\"\nbrokers = {:?}\ngroup_id = {:?}\ntopics = [{:?}]\n\
             session_timeout = \"6s\"\nheartbeat_interval = \"1s\"\n\
             max_batch_records = {}\nmax_buffered_records = {}\n\n\
             [[sinks]]\nname = \"out\"\n{sink}\n\n\
             [limits]\nmax_in_flight_batches = {}\nmax_in_flight_batches_per_partition = {}\n\n\
             [checkpoint]\ncommit_interval = \"{}ms\"\nrevoke_deadline = \"{}ms\"\n\
             shutdown_timeout = \"10s\"\nstore = {{ type = \"source\" }}\n",
            self.brokers,
            self.group,
            self.topic,
            self.max_batch_records,
            4 * self.max_batch_records,
            self.max_in_flight_batches,
            self.max_in_flight_batches,
            self.commit_interval_ms,
            self.revoke_deadline_ms,
        );
        if let Some(ms) = self.commit_timeout_ms {
            // Still in the `[source]` table: appended after its keys.
            s = s.replacen(
                "\n\n[[sinks]]",
                &format!("\ncommit_timeout = \"{ms}ms\"\n\n[[sinks]]"),
                1,
            );
        }
        if !self.properties.is_empty() {
            let table = toml_inline_table(&self.properties);
            s = s.replacen(
                "\n\n[[sinks]]",
                &format!("\nproperties = {table}\n\n[[sinks]]"),
                1,
            );
        }
        s
    }
}

/// `{ "key" = "value", ... }`: librdkafka properties as a TOML inline
/// table (Rust's string escapes are TOML's for these values).
pub(crate) fn toml_inline_table(properties: &[(String, String)]) -> String {
    let entries: Vec<String> = properties
        .iter()
        .map(|(k, v)| format!("{k:?} = {v:?}"))
        .collect();
    format!("{{ {} }}", entries.join(", "))
}

/// What a member logs when it hands partitions over with records still
/// in flight or without committing them: the revoke deadline passed, the
/// pipeline did not take the revocation in time, a revocation's commit
/// failed, or the shutdown deadline passed. (A failed periodic commit is
/// not one: the revocation commits again; nor is leaving the group late,
/// after the final commit.) One handover may say two of these: the bound
/// they make is generous, not tight.
pub(crate) const UNCLEAN_HANDOVER: &[&str] = &[
    "revoking with batches still in flight",
    "the pipeline did not take the revocation in time",
    // A revocation's commit failed: said by the rebalance callback or by
    // the source driver, whichever of the two asked first.
    "revoke did not commit",
    "revoked partitions could not be committed",
    "shutdown deadline passed with batches in flight",
];

/// One `etl run` process of the group, restarted under the same name with
/// a fresh output file (and log) per run.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) name: String,
    dir: PathBuf,
    config: MemberConfig,
    child: Option<Child>,
    pub(crate) runs: u32,
}

impl Member {
    pub(crate) fn new(name: &str, dir: &Path, config: &MemberConfig) -> Self {
        Member {
            name: name.to_owned(),
            dir: dir.to_path_buf(),
            config: config.clone(),
            child: None,
            runs: 0,
        }
    }

    /// Records written by every run so far (see [`LINE_BYTES`]).
    pub(crate) fn written(&self) -> u64 {
        (1..=self.runs)
            .filter_map(|r| std::fs::metadata(self.output(r)).ok())
            .map(|m| m.len() / LINE_BYTES)
            .sum()
    }

    fn output(&self, run: u32) -> PathBuf {
        self.dir.join(format!("{}-run{run}.ndjson", self.name))
    }

    /// Start a run writing to its own file sink.
    pub(crate) fn start(&mut self) {
        let output = self.output(self.runs + 1);
        let sink = format!("type = \"file\"\npath = {:?}", output.display().to_string());
        self.start_with(&sink);
    }

    /// Start a run with this `[[sinks]]` body.
    pub(crate) fn start_with(&mut self, sink: &str) {
        assert!(self.child.is_none(), "{} is running", self.name);
        self.runs += 1;
        let base = self.dir.join(format!("{}-run{}", self.name, self.runs));
        let config = base.with_extension("toml");
        std::fs::write(&config, self.config.render(sink)).expect("write config");
        let log = std::fs::File::create(base.with_extension("log")).expect("log file");
        let child = Command::new(etl_tests::etl_binary())
            .args(["--log-format", "json", "run"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etl");
        self.child = Some(child);
    }

    pub(crate) fn running(&mut self) -> bool {
        match &mut self.child {
            Some(c) => c.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// SIGKILL: no handler runs, nothing is drained or committed.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait for the graceful stop; fails the test after a
    /// generous guard.
    pub(crate) fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success(), "kill -TERM {}", child.id());
        let guard = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                return status;
            }
            if Instant::now() > guard {
                let _ = child.kill();
                panic!("{} did not stop within 30 s of SIGTERM", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The member's state as its current run last logged it: the last
    /// `kafka member state` line (assignment, paused partitions, fetch
    /// positions), and its last assignment and revocation lines.
    pub(crate) fn state(&self) -> String {
        let log = self.log(self.runs);
        let last = |needle: &str| {
            log.lines()
                .rev()
                .find(|l| l.contains(needle))
                .unwrap_or("(none)")
                .to_owned()
        };
        format!(
            "{} (run {}, running: {}):\n  state:    {}\n  assigned: {}\n  revoked:  {}",
            self.name,
            self.runs,
            self.child.is_some(),
            last("kafka member state"),
            last("partitions assigned"),
            last("partitions revoked"),
        )
    }

    /// Every warning and error line of every run so far, each headed by
    /// the member and run: what a failed count is read beside.
    pub(crate) fn warnings(&self) -> String {
        let mut out = String::new();
        for run in 1..=self.runs {
            for line in self
                .log(run)
                .lines()
                .filter(|l| l.contains(r#""level":"WARN""#) || l.contains(r#""level":"ERROR""#))
            {
                let _ = writeln!(out, "{} run {run}: {line}", self.name);
            }
        }
        out
    }

    /// Every assignment and revocation line of every run so far (the
    /// offsets each revocation committed), headed by member and run.
    pub(crate) fn handovers(&self) -> String {
        let mut out = String::new();
        for run in 1..=self.runs {
            for line in self.log(run).lines().filter(|l| {
                l.contains(r#""message":"partitions assigned""#)
                    || l.contains(r#""message":"partitions revoked""#)
            }) {
                let _ = writeln!(out, "{} run {run}: {line}", self.name);
            }
        }
        out
    }

    /// The lines of every run so far that say a handover was not clean:
    /// records in flight then may be written by this member and read
    /// again by the partitions' next owner, as at-least-once allows.
    pub(crate) fn unclean_handovers(&self) -> Vec<String> {
        (1..=self.runs)
            .flat_map(|run| {
                self.log(run)
                    .lines()
                    .filter(|l| UNCLEAN_HANDOVER.iter().any(|n| l.contains(n)))
                    .map(|l| format!("{} run {run}: {l}", self.name))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The log of run `run` (1-based).
    pub(crate) fn log(&self, run: u32) -> String {
        let path = self.dir.join(format!("{}-run{run}.log", self.name));
        std::fs::read_to_string(path).unwrap_or_default()
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Bytes in the `.ndjson` files of `dir`: with [`LINE_BYTES`]-long lines,
/// a count of written records (duplicates included).
pub(crate) fn output_bytes(dir: &Path) -> u64 {
    ndjson_files(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum()
}

fn ndjson_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "ndjson"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// Lines of every `.ndjson` file of `dir`, counted by record id. A last
/// line without its newline (a run killed in the middle of a write; that
/// batch was never acknowledged) is left out; any other line that is not
/// a record fails the test.
pub(crate) fn read_ids(dir: &Path) -> BTreeMap<u64, u32> {
    let mut ids = BTreeMap::new();
    for path in ndjson_files(dir) {
        let bytes = std::fs::read(&path).expect("read output");
        let complete = match bytes.iter().rposition(|b| *b == b'\n') {
            Some(i) => &bytes[..=i],
            None => &[][..],
        };
        for line in complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).unwrap_or_else(|e| {
                panic!(
                    "{}: not a record ({e}): {}",
                    path.display(),
                    String::from_utf8_lossy(line)
                )
            });
            let id = v["id"].as_u64().expect("record with an id");
            *ids.entry(id).or_insert(0) += 1;
        }
    }
    ids
}

/// Where the records written more than once were written: for each
/// output file of `dir`, the runs of duplicated ids it holds (an id
/// `i` is record `i / partitions` of partition `i % partitions`), in
/// file order. What a failed count is read beside.
pub(crate) fn duplicates_by_file(dir: &Path, partitions: u64) -> String {
    let ids = read_ids(dir);
    let mut out = String::new();
    for path in ndjson_files(dir) {
        let bytes = std::fs::read(&path).unwrap_or_default();
        let mut runs: Vec<(u64, u64, u64)> = Vec::new();
        for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let Some(id) = serde_json::from_slice::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["id"].as_u64())
            else {
                continue;
            };
            if ids.get(&id).copied().unwrap_or(0) < 2 {
                continue;
            }
            let (partition, offset) = (id % partitions, id / partitions);
            match runs.last_mut() {
                Some((p, _, last)) if *p == partition && *last + 1 == offset => *last = offset,
                _ => runs.push((partition, offset, offset)),
            }
        }
        if !runs.is_empty() {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let _ = writeln!(out, "{}:", name.unwrap_or_default());
            for (p, from, to) in runs {
                let _ = writeln!(out, "  partition {p}: offsets {from}..={to}");
            }
        }
    }
    out
}

/// Lost records and duplicates, by id, of records `0..count`.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) lines: u64,
    pub(crate) distinct: u64,
    pub(crate) missing: Vec<u64>,
    pub(crate) unexpected: u64,
    pub(crate) duplicates: u64,
}

pub(crate) fn count(ids: &BTreeMap<u64, u32>, count: u64) -> Counts {
    let mut c = Counts::default();
    for (id, n) in ids {
        c.lines += u64::from(*n);
        if *id < count {
            c.distinct += 1;
            c.duplicates += u64::from(n - 1);
        } else {
            c.unexpected += u64::from(*n);
        }
    }
    c.missing = (0..count).filter(|id| !ids.contains_key(id)).collect();
    c
}

/// Each member's last logged state, for a failure's message.
pub(crate) fn states(members: &[&Member]) -> String {
    members
        .iter()
        .map(|m| m.state())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wait (at most 120 s) until `done`, failing as soon as a member exits
/// on its own, and at the deadline with each member's last state.
pub(crate) fn wait_until(
    what: &str,
    members: &mut [&mut Member],
    mut done: impl FnMut(&[&mut Member]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done(members) {
        for m in members.iter_mut() {
            assert!(
                m.running(),
                "{} exited on its own:\n{}",
                m.name,
                m.log(m.runs)
            );
        }
        assert!(
            Instant::now() < deadline,
            "not {what} after 120 s:\n{}",
            states(&members.iter().map(|m| &**m).collect::<Vec<_>>())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
