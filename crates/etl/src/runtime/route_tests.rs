//! Tests of routing: which sinks each record reaches, the branches'
//! transforms, and that a record is committed only once every sink it
//! went to holds it.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etl_checkpoint::{MemoryStore, OffsetStore};
use etl_record::{Offset, PartitionId, Record};
use etl_sink::{EncodedBatch, RawLinesEncoder, Sink, SinkDriver, SinkError};
use etl_source::{GeneratorConfig, GeneratorSource};
use tokio_util::sync::CancellationToken;

use super::{Pipeline, PipelineBuilder, PipelineError, Route, Summary};
use crate::config::RouteMode;
use crate::transform::{Outcome, Transform, filter, map};

type Key = (u32, i64);

/// Keeps the positions of what it is given; fails every write from the
/// `fail_from`-th record it is given on, when set.
#[derive(Debug, Default, Clone)]
struct Collect {
    seen: Arc<Mutex<Vec<Key>>>,
    values: Arc<Mutex<Vec<Vec<u8>>>>,
    fail: bool,
}

impl Collect {
    fn failing() -> Self {
        Collect {
            fail: true,
            ..Collect::default()
        }
    }

    fn keys(&self) -> BTreeSet<Key> {
        self.seen.lock().unwrap().iter().copied().collect()
    }
}

#[async_trait]
impl Sink for Collect {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        if self.fail {
            return Err(SinkError::permanent("this sink cannot write"));
        }
        let mut seen = self.seen.lock().unwrap();
        let mut values = self.values.lock().unwrap();
        for r in batch.records() {
            seen.push((r.position.partition.0, r.position.offset.0));
            values.push(r.value.to_vec());
        }
        Ok(())
    }
}

const PARTITIONS: u32 = 3;
const PER_PARTITION: u64 = 240;

fn source() -> GeneratorSource {
    GeneratorSource::new(GeneratorConfig {
        partitions: PARTITIONS,
        records_per_partition: Some(PER_PARTITION),
        max_batch_records: 7,
        ..GeneratorConfig::default()
    })
    .unwrap()
}

fn every(pred: impl Fn(i64) -> bool) -> BTreeSet<Key> {
    (0..PARTITIONS)
        .flat_map(|p| (0..PER_PARTITION as i64).map(move |o| (p, o)))
        .filter(|(_, o)| pred(*o))
        .collect()
}

fn offset_is(name: &str, pred: fn(i64) -> bool) -> impl Transform + 'static {
    filter(name.to_owned(), move |r: &Record| pred(r.position.offset.0))
}

fn sink(c: &Collect) -> SinkDriver {
    SinkDriver::new(c.clone(), RawLinesEncoder::new())
}

async fn run(builder: PipelineBuilder) -> (Result<Summary, PipelineError>, MemoryStore) {
    let store = MemoryStore::new();
    let pipeline = builder
        .source(source())
        .offset_store(store.clone())
        .transform_workers(2)
        .build()
        .unwrap();
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        pipeline.run(CancellationToken::new()),
    )
    .await
    .unwrap();
    (result, store)
}

fn committed_all(store: &mut MemoryStore) {
    let offsets = store.load().unwrap();
    for p in 0..PARTITIONS {
        assert_eq!(
            offsets.get(&PartitionId(p)),
            Some(&Offset(PER_PARTITION as i64)),
            "partition {p} committed to its end"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_record_goes_to_every_sink_whose_condition_it_matches() {
    let (even, thirds, all) = (Collect::default(), Collect::default(), Collect::default());
    let (result, mut store) = run(Pipeline::builder()
        .sink("even", sink(&even))
        .sink("thirds", sink(&thirds))
        .sink("all", sink(&all))
        .route("even", Route::new().when(offset_is("even", |o| o % 2 == 0)))
        .route(
            "thirds",
            Route::new().when(offset_is("thirds", |o| o % 3 == 0)),
        ))
    .await;
    let summary = result.unwrap();
    assert_eq!(even.keys(), every(|o| o % 2 == 0));
    assert_eq!(thirds.keys(), every(|o| o % 3 == 0));
    assert_eq!(all.keys(), every(|_| true));
    assert_eq!(summary.unrouted, 0, "a sink without a condition takes all");
    committed_all(&mut store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_routes_send_each_record_to_its_first_match_and_the_rest_to_unmatched() {
    let (even, thirds, rest) = (Collect::default(), Collect::default(), Collect::default());
    let (result, mut store) = run(Pipeline::builder()
        .sink("even", sink(&even))
        .sink("thirds", sink(&thirds))
        .sink("rest", sink(&rest))
        .route("even", Route::new().when(offset_is("even", |o| o % 2 == 0)))
        .route(
            "thirds",
            Route::new().when(offset_is("thirds", |o| o % 3 == 0)),
        )
        .route_mode(RouteMode::Exclusive)
        .unmatched("rest"))
    .await;
    result.unwrap();
    assert_eq!(even.keys(), every(|o| o % 2 == 0));
    assert_eq!(thirds.keys(), every(|o| o % 2 != 0 && o % 3 == 0));
    assert_eq!(rest.keys(), every(|o| o % 2 != 0 && o % 3 != 0));
    let n = |c: &Collect| c.seen.lock().unwrap().len();
    assert_eq!(
        n(&even) + n(&thirds) + n(&rest),
        (u64::from(PARTITIONS) * PER_PARTITION) as usize,
        "each record once"
    );
    committed_all(&mut store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unmatched_sink_takes_what_no_condition_matched_beside_every_match() {
    let (even, thirds, rest) = (Collect::default(), Collect::default(), Collect::default());
    let (result, mut store) = run(Pipeline::builder()
        .sink("even", sink(&even))
        .sink("thirds", sink(&thirds))
        .sink("rest", sink(&rest))
        .route("even", Route::new().when(offset_is("even", |o| o % 2 == 0)))
        .route(
            "thirds",
            Route::new().when(offset_is("thirds", |o| o % 3 == 0)),
        )
        .unmatched("rest"))
    .await;
    result.unwrap();
    assert_eq!(even.keys(), every(|o| o % 2 == 0));
    assert_eq!(thirds.keys(), every(|o| o % 3 == 0));
    assert_eq!(rest.keys(), every(|o| o % 2 != 0 && o % 3 != 0));
    committed_all(&mut store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_no_route_takes_are_counted_and_committed() {
    for mode in [RouteMode::All, RouteMode::Exclusive] {
        let (even, thirds) = (Collect::default(), Collect::default());
        let (result, mut store) = run(Pipeline::builder()
            .sink("even", sink(&even))
            .sink("thirds", sink(&thirds))
            .route("even", Route::new().when(offset_is("even", |o| o % 2 == 0)))
            .route(
                "thirds",
                Route::new().when(offset_is("thirds", |o| o % 3 == 0)),
            )
            .route_mode(mode))
        .await;
        let summary = result.unwrap();
        let nowhere = every(|o| o % 2 != 0 && o % 3 != 0).len() as u64;
        assert_eq!(summary.unrouted, nowhere, "{mode:?}");
        committed_all(&mut store);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_transforms_only_its_own_copy_and_its_rejects_are_dead_lettered() {
    let (plain, marked, dlq) = (Collect::default(), Collect::default(), Collect::default());
    let branch = Route::new()
        .transform(map("mark", |mut r: Record| {
            let mut v = b"marked:".to_vec();
            v.extend_from_slice(&r.value);
            r.value = v.into();
            Ok(r)
        }))
        .transform(RejectMultiplesOf5);
    let (result, mut store) = run(Pipeline::builder()
        .sink("plain", sink(&plain))
        .sink("marked", sink(&marked))
        .route("marked", branch)
        .dead_letter(dlq.clone()))
    .await;
    let summary = result.unwrap();
    assert_eq!(plain.keys(), every(|_| true));
    assert!(
        plain
            .values
            .lock()
            .unwrap()
            .iter()
            .all(|v| !v.starts_with(b"marked:")),
        "the other sink's copy is untouched"
    );
    assert_eq!(marked.keys(), every(|o| o % 5 != 0));
    assert!(
        marked
            .values
            .lock()
            .unwrap()
            .iter()
            .all(|v| v.starts_with(b"marked:"))
    );
    assert_eq!(dlq.keys(), every(|o| o % 5 == 0));
    assert_eq!(summary.dead_lettered, every(|o| o % 5 == 0).len() as u64);
    committed_all(&mut store);
}

/// Rejects records at offsets that are multiples of 5.
#[derive(Debug, Clone)]
struct RejectMultiplesOf5;

impl Transform for RejectMultiplesOf5 {
    fn name(&self) -> &str {
        "fives"
    }

    fn apply(&mut self, record: Record) -> Outcome {
        if record.position.offset.0 % 5 == 0 {
            Outcome::Reject(record, "a multiple of five".to_owned())
        } else {
            Outcome::Keep(record)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_is_not_committed_while_a_sink_it_was_routed_to_lacks_it() {
    // Offsets from 100 on go to a sink that cannot write; those below to
    // one that can. Nothing at or past 100 may be committed.
    let (low, high) = (Collect::default(), Collect::failing());
    let (result, mut store) = run(Pipeline::builder()
        .sink("low", sink(&low))
        .sink("high", sink(&high))
        .route("low", Route::new().when(offset_is("low", |o| o < 100)))
        .route("high", Route::new().when(offset_is("high", |o| o >= 100))))
    .await;
    assert!(result.is_err(), "the failing sink halts the run");
    let offsets = store.load().unwrap();
    for (p, o) in offsets.iter() {
        assert!(
            o.0 <= 100,
            "partition {} committed {} past the failed sink",
            p.0,
            o.0
        );
    }
}

#[test]
fn a_route_or_unmatched_sink_naming_no_sink_is_refused() {
    let c = Collect::default();
    let named_nothing = Pipeline::builder()
        .source(source())
        .sink("out", sink(&c))
        .route("nope", Route::new())
        .build();
    assert!(matches!(named_nothing, Err(PipelineError::Invalid(m)) if m.contains("\"nope\"")));
    let unmatched_nothing = Pipeline::builder()
        .source(source())
        .sink("out", sink(&c))
        .unmatched("nope")
        .build();
    assert!(matches!(unmatched_nothing, Err(PipelineError::Invalid(_))));
    let unmatched_with_condition = Pipeline::builder()
        .source(source())
        .sink("out", sink(&c))
        .route("out", Route::new().when(offset_is("x", |_| true)))
        .unmatched("out")
        .build();
    assert!(
        matches!(unmatched_with_condition, Err(PipelineError::Invalid(m)) if m.contains("condition"))
    );
}

/// The lines of `path`, or none.
fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[cfg(feature = "remap")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routed_file_sends_each_record_where_its_when_says_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let input: Vec<String> = (0..300)
        .map(|i| {
            let level = ["error", "warn", "info"][i % 3];
            format!(r#"{{"n": {i},  "level":"{level}", "email": "a@b.c", "note": "\u00e9"}}"#)
        })
        .collect();
    std::fs::write(dir.path().join("in.ndjson"), input.join("\n") + "\n").unwrap();
    let text = r#"
[source]
type = "file"
paths = ["in.ndjson"]
format = "ndjson"

[routing]
mode = "exclusive"
unmatched = "rest"

[[sinks]]
name = "errors"
type = "file"
path = "errors.ndjson"
when = '.level == "error"'
[[sinks.transforms]]
type = "drop_field"
field = "email"

[[sinks]]
name = "warnings"
type = "file"
path = "warnings.ndjson"
when = { field = "level", op = "==", value = "warn" }

[[sinks]]
name = "rest"
type = "file"
path = "rest.ndjson"

[checkpoint]
store = { type = "file", path = "state" }
"#;
    let config = etl_config::Registry::new()
        .loader()
        .text(text, dir.path())
        .unwrap();
    let pipeline = super::pipeline_from_config(&config).await.unwrap();
    let summary = pipeline.run(CancellationToken::new()).await.unwrap();
    assert_eq!(summary.read, 300);
    let errors = lines(&dir.path().join("errors.ndjson"));
    let warnings = lines(&dir.path().join("warnings.ndjson"));
    let rest = lines(&dir.path().join("rest.ndjson"));
    assert_eq!(errors.len(), 100);
    assert!(
        errors
            .iter()
            .all(|l| l.contains(r#""level":"error""#) && !l.contains("email"))
    );
    // Untouched by a step: the bytes as read.
    let by_level = |level: &str| -> Vec<String> {
        input
            .iter()
            .filter(|l| l.contains(&format!(r#""level":"{level}""#)))
            .cloned()
            .collect()
    };
    assert_eq!(warnings, by_level("warn"));
    assert_eq!(rest, by_level("info"));
}

#[test]
fn routing_problems_are_placed_and_never_matching_routes_warned() {
    let dir = tempfile::tempdir().unwrap();
    let head = "[source]\ntype = \"generator\"\n";
    let problems = |text: &str| -> Vec<String> {
        match etl_config::Registry::new()
            .loader()
            .text(&format!("{head}{text}"), dir.path())
        {
            Ok(_) => Vec::new(),
            Err(problems) => problems.iter().map(ToString::to_string).collect(),
        }
    };
    let nobody = problems(
        "[routing]\nunmatched = \"nobody\"\n[[sinks]]\nname = \"out\"\ntype = \"blackhole\"\n",
    );
    assert!(
        nobody
            .iter()
            .any(|p| p.starts_with("4:") && p.contains("names no sink")),
        "{nobody:?}"
    );
    let conditioned = problems(
        "[routing]\nunmatched = \"out\"\n[[sinks]]\nname = \"out\"\ntype = \"blackhole\"\n\
         when = { field = \"a\", op = \"==\", value = 1 }\n",
    );
    assert!(
        conditioned
            .iter()
            .any(|p| p.starts_with("8:") && p.contains("cannot have a `when`")),
        "{conditioned:?}"
    );
    let wrong = problems("[[sinks]]\ntype = \"blackhole\"\nwhen = 3\n");
    assert!(
        wrong
            .iter()
            .any(|p| p.starts_with("5:") && p.contains("when must be")),
        "{wrong:?}"
    );
    let unknown =
        problems("[[sinks]]\ntype = \"blackhole\"\nwhen = { field = \"a\", opp = \"==\" }\n");
    assert!(unknown.iter().any(|p| p.contains("opp")), "{unknown:?}");

    let config = etl_config::Registry::new().loader().text(&format!(
            "{head}[routing]\nmode = \"exclusive\"\n\
             [[sinks]]\nname = \"a\"\ntype = \"blackhole\"\nwhen = {{ field = \"x\", op = \"exists\" }}\n\
             [[sinks]]\nname = \"b\"\ntype = \"blackhole\"\nwhen = {{ field = \"x\", op = \"exists\" }}\n\
             [[sinks]]\nname = \"all\"\ntype = \"blackhole\"\n\
             [[sinks]]\nname = \"never\"\ntype = \"blackhole\"\n"
        ), dir.path())
    .unwrap();
    let warnings: Vec<String> = config.warnings.iter().map(ToString::to_string).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("\"a\"") && w.contains("same `when`")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("\"all\"") && w.contains("\"never\" never")),
        "{warnings:?}"
    );
    assert_eq!(warnings.len(), 2, "{warnings:?}");

    // An unmatched sink beside sinks none of which has a condition takes
    // every record: said, and placed at `[routing]`.
    let config = etl_config::Registry::new()
        .loader()
        .text(
            &format!(
                "{head}[routing]\nunmatched = \"rest\"\n\
                 [[sinks]]\nname = \"a\"\ntype = \"blackhole\"\n\
                 [[sinks]]\nname = \"rest\"\ntype = \"blackhole\"\n"
            ),
            dir.path(),
        )
        .unwrap();
    let warnings: Vec<String> = config.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("3:")
            && warnings[0]
                .contains("no sink has a `when`: the unmatched sink \"rest\" takes every record"),
        "{warnings:?}"
    );
}

#[cfg(feature = "remap")]
#[test]
fn a_when_program_that_does_not_compile_is_placed_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let text =
        "[source]\ntype = \"generator\"\n[[sinks]]\ntype = \"blackhole\"\nwhen = '.level ==== 1'\n";
    let problems: Vec<String> = etl_config::Registry::new()
        .loader()
        .text(text, dir.path())
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(problems.iter().any(|p| p.starts_with("5:")), "{problems:?}");
}

#[cfg(feature = "remap")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routing_example_writes_what_its_readme_says() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/routing");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("input")).unwrap();
    std::fs::copy(
        example.join("input/app.ndjson"),
        dir.path().join("input/app.ndjson"),
    )
    .unwrap();
    let text = std::fs::read_to_string(example.join("pipeline.toml")).unwrap();
    let config = etl_config::Registry::new()
        .loader()
        .text(&text, dir.path())
        .unwrap();
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let pipeline = super::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    let input = lines(&dir.path().join("input/app.ndjson"));
    let out = |name: &str| lines(&dir.path().join("output").join(name));
    let errors = out("errors.ndjson");
    assert_eq!(errors.len(), 2);
    assert!(
        errors
            .iter()
            .all(|l| l.contains(r#""level":"error""#) && !l.contains("email"))
    );
    let expect = |keep: fn(&str) -> bool| -> Vec<String> {
        input.iter().filter(|l| keep(l)).cloned().collect()
    };
    assert_eq!(
        out("audit.ndjson"),
        expect(|l| l.contains(r#""kind":"audit""#) && !l.contains(r#""level":"error""#))
    );
    assert_eq!(
        out("other.ndjson"),
        expect(|l| !l.contains(r#""kind":"audit""#) && !l.contains(r#""level":"error""#))
    );
    assert_eq!(out("other.ndjson").len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_templated_file_path_writes_one_output_per_value_and_dead_letters_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let input: Vec<String> = (0..90)
        .map(|i| match i % 10 {
            9 => format!(r#"{{"n":{i}}}"#),
            _ => format!(r#"{{"n":{i},"region":"{}"}}"#, ["eu", "us", "ap"][i % 3]),
        })
        .collect();
    std::fs::write(dir.path().join("in.ndjson"), input.join("\n") + "\n").unwrap();
    let text = r#"
[source]
type = "file"
paths = ["in.ndjson"]
format = "ndjson"

[[sinks]]
name = "by_region"
type = "file"
path = "out/{region}/orders.ndjson"
max_open_outputs = 2

[dead_letter]
type = "file"
path = "dead.ndjson"

[checkpoint]
store = { type = "file", path = "state" }
"#;
    let config = etl_config::Registry::new()
        .loader()
        .text(text, dir.path())
        .unwrap();
    let pipeline = super::pipeline_from_config(&config).await.unwrap();
    let summary = pipeline.run(CancellationToken::new()).await.unwrap();
    assert_eq!(summary.read, 90);
    for region in ["eu", "us", "ap"] {
        let got = lines(&dir.path().join("out").join(region).join("orders.ndjson"));
        let want: Vec<String> = input
            .iter()
            .filter(|l| l.contains(&format!(r#""region":"{region}""#)))
            .cloned()
            .collect();
        assert_eq!(got, want, "{region}");
    }
    assert_eq!(lines(&dir.path().join("dead.ndjson")).len(), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exactly_once_templated_sink_resumes_from_its_outputs_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let input: Vec<String> = (0..120)
        .map(|i| format!(r#"{{"n":{i},"region":"{}"}}"#, ["eu", "us", "ap"][i % 3]))
        .collect();
    std::fs::write(dir.path().join("in.ndjson"), input.join("\n") + "\n").unwrap();
    let text = r#"
[source]
type = "file"
paths = ["in.ndjson"]
format = "ndjson"

[[sinks]]
name = "by_region"
type = "file"
path = "out/{region}.ndjson"
exactly_once = true
max_open_outputs = 2
batch_max_records = 7

[checkpoint]
store = { type = "file", path = "state" }
"#;
    for _ in 0..2 {
        let config = etl_config::Registry::new()
            .loader()
            .text(text, dir.path())
            .unwrap();
        let pipeline = super::pipeline_from_config(&config).await.unwrap();
        pipeline.run(CancellationToken::new()).await.unwrap();
        // The offsets are lost: the next run resumes from what the
        // outputs hold, and writes nothing twice.
        std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    }
    for region in ["eu", "us", "ap"] {
        let got = lines(&dir.path().join("out").join(format!("{region}.ndjson")));
        let want: Vec<String> = input
            .iter()
            .filter(|l| l.contains(&format!(r#""region":"{region}""#)))
            .cloned()
            .collect();
        assert_eq!(got, want, "{region}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn braces_in_the_configuration_files_folder_are_no_placeholders() {
    let top = tempfile::tempdir().unwrap();
    let dir = top.path().join("{prod}");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("in.ndjson"), "{\"k\":\"a\"}\n{\"k\":\"b\"}\n").unwrap();
    let text = "[source]\ntype = \"file\"\npaths = [\"in.ndjson\"]\n\
                [[sinks]]\nname = \"plain\"\ntype = \"file\"\npath = \"out.ndjson\"\n\
                [[sinks]]\nname = \"by_k\"\ntype = \"file\"\npath = \"by/{k}.ndjson\"\n\
                [checkpoint]\nstore = { type = \"memory\" }\n";
    let config = etl_config::Registry::new()
        .loader()
        .text(text, &dir)
        .unwrap();
    let pipeline = super::pipeline_from_config(&config).await.unwrap();
    pipeline.run(CancellationToken::new()).await.unwrap();
    assert_eq!(lines(&dir.join("out.ndjson")).len(), 2);
    assert_eq!(
        lines(&dir.join("by/a.ndjson")),
        vec!["{\"k\":\"a\"}".to_owned()]
    );
    assert_eq!(
        lines(&dir.join("by/b.ndjson")),
        vec!["{\"k\":\"b\"}".to_owned()]
    );
}

/// A condition that cannot judge offsets divisible by 4, takes those
/// that are 1 mod 4, and not the others.
#[derive(Debug, Clone)]
struct Judge;

impl Transform for Judge {
    fn name(&self) -> &str {
        "judge"
    }

    fn apply(&mut self, record: Record) -> Outcome {
        match record.position.offset.0 % 4 {
            0 => Outcome::Reject(record, "cannot judge".to_owned()),
            1 => Outcome::Keep(record),
            _ => Outcome::Filtered,
        }
    }

    fn fork(&self) -> Option<Box<dyn Transform>> {
        Some(Box::new(self.clone()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_no_condition_can_judge_is_dead_lettered_once_and_not_counted_unrouted() {
    for unmatched in [false, true] {
        let (a, b, rest, dlq) = (
            Collect::default(),
            Collect::default(),
            Collect::default(),
            Collect::default(),
        );
        let mut builder = Pipeline::builder()
            .sink("a", sink(&a))
            .sink("b", sink(&b))
            .route("a", Route::new().when(Judge))
            .route("b", Route::new().when(Judge))
            .dead_letter(dlq.clone());
        if unmatched {
            builder = builder.sink("rest", sink(&rest)).unmatched("rest");
        }
        let (result, mut store) = run(builder).await;
        let summary = result.unwrap();
        let letters = dlq.seen.lock().unwrap().len();
        assert_eq!(
            letters,
            every(|o| o % 4 == 0).len(),
            "unmatched: {unmatched}"
        );
        assert_eq!(summary.dead_lettered, letters as u64);
        assert_eq!(a.keys(), every(|o| o % 4 == 1));
        if unmatched {
            assert_eq!(rest.keys(), every(|o| o % 4 >= 2));
            assert_eq!(summary.unrouted, 0);
        } else {
            assert_eq!(summary.unrouted, every(|o| o % 4 >= 2).len() as u64);
        }
        committed_all(&mut store);
    }
}

#[test]
fn a_templated_dead_letter_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[source]\ntype = \"generator\"\n[[sinks]]\ntype = \"blackhole\"\n\
                [dead_letter]\ntype = \"file\"\npath = \"dead/{reason}.ndjson\"\n";
    let problems = etl_config::Registry::new()
        .loader()
        .text(text, dir.path())
        .unwrap_err();
    assert!(
        problems
            .iter()
            .any(|p| p.message.contains("dead-letter sink's path")),
        "{problems:?}"
    );
}

#[cfg(feature = "remap")]
#[test]
fn a_problem_in_a_sinks_own_step_is_placed_in_that_step() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[source]\ntype = \"generator\"\n\
                [[sinks]]\ntype = \"blackhole\"\n\
                [[sinks.transforms]]\ntype = \"remap\"\nsource = '.a = 1'\n\
                [[sinks.transforms]]\ntype = \"remap\"\nsource = '.b = ===='\n";
    let problems: Vec<String> = etl_config::Registry::new()
        .loader()
        .text(text, dir.path())
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.starts_with("10:") && p.contains("transforms #2")),
        "{problems:?}"
    );
    let inline = "[source]\ntype = \"generator\"\n\
                  [[sinks]]\ntype = \"blackhole\"\n\
                  transforms = [\n  { type = \"drop_field\", field = \"a\" },\n  { type = \"drop_field\", fild = \"b\" },\n]\n";
    let problems: Vec<String> = etl_config::Registry::new()
        .loader()
        .text(inline, dir.path())
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(problems.iter().any(|p| p.starts_with("7:")), "{problems:?}");
}

/// A condition (a program: declarative ones are read by the validating
/// reader whatever the claim) whose fast form takes its input as checked
/// JSON (as the configuration gives it after built-in steps), and shared
/// steps set
/// after it that write text a reading of checked input would judge
/// (`"x":tru` is no JSON, but a scan that trusts its input reads past
/// it): the builder takes the claim back, so the condition's own stage
/// judges the text, refuses it, and the record is dead-lettered.
#[cfg(feature = "remap")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_set_after_a_route_take_back_its_conditions_claim_of_checked_input() {
    use etl_json::{Condition, VrlFilter, VrlProgram};

    use crate::transform::TransformChain;

    let not_json = || {
        map("not json", |mut r: Record| {
            r.value = br#"{"amount":5,"x":tru}"#.to_vec().into();
            Ok(r)
        })
    };
    for replace in [false, true] {
        let (picked, dlq) = (Collect::default(), Collect::default());
        let program = VrlProgram::condition(".amount == 5").unwrap();
        let fast = Condition::program(&program).map(|c| c.checked_input(true));
        let when = VrlFilter::new("when", program);
        assert!(fast.is_some(), "the condition has a fast form");
        let mut condition = TransformChain::new();
        condition.push(Box::new(when));
        let builder = Pipeline::builder()
            .sink("picked", sink(&picked))
            .route("picked", Route::new().when_chain(condition).when_fast(fast))
            .dead_letter(dlq.clone());
        let builder = if replace {
            let mut chain = TransformChain::new();
            chain.push(Box::new(not_json()));
            builder.transforms(chain)
        } else {
            builder.transform(not_json())
        };
        let (result, mut store) = run(builder).await;
        let summary = result.unwrap();
        assert_eq!(picked.keys(), BTreeSet::new(), "replace: {replace}");
        assert_eq!(dlq.keys(), every(|_| true), "replace: {replace}");
        assert_eq!(summary.dead_lettered, every(|_| true).len() as u64);
        committed_all(&mut store);
    }
}
