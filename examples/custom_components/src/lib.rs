//! The `etl` command with three components of its own, configured from the
//! TOML file like the built-ins and checked by `etl validate` with their own
//! config structs:
//!
//! * `type = "sensors"`, a source: `readings` numbered readings in each of
//!   `partitions` partitions, as JSON (`{"sensor":0,"reading":7,"celsius":21.5}`);
//! * `type = "scale"`, a transform: multiplies a number `field` by `factor`
//!   into `into` (or in place);
//! * `type = "csv"`, a sink: appends the `columns` of each record to a CSV
//!   file, fsync'd before the write returns.
//!
//! `src/main.rs` is the whole program: `etl_cli::main_with(registry())`.
//! `pipeline.toml` beside this crate uses all three; run it with
//! `cargo run -p etl-example-custom -- run examples/custom_components/pipeline.toml`.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use etl::{BoxError, ComponentContext, Refused, Registry, map};
use etl_record::{Offset, PartitionId, Position, Record, SourceId};
use etl_sink::{EncodedBatch, Sink, SinkError};
use etl_source::{PollBatch, Source, SourceError, SourceEvent};
use serde::Deserialize;

/// The registry of this program's components.
#[must_use]
pub fn registry() -> Registry {
    Registry::new()
        .source("sensors", |config: SensorsConfig, context| {
            Ok(Box::new(Sensors::new(config, context)?))
        })
        .transform("scale", |config: ScaleConfig, context| {
            Ok(scale(config, context))
        })
        .sink("csv", |config: CsvConfig, context| {
            Ok(Box::new(CsvSink::open(config, context)?))
        })
}

/// `[source] type = "sensors"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SensorsConfig {
    /// Partitions, one per sensor.
    #[serde(default = "one")]
    pub partitions: u32,
    /// Readings per sensor.
    pub readings: i64,
}

fn one() -> u32 {
    1
}

/// Readings `0..readings` of each sensor; offsets are reading numbers.
#[derive(Debug)]
struct Sensors {
    readings: i64,
    next: BTreeMap<PartitionId, i64>,
    announced: bool,
}

impl Sensors {
    fn new(config: SensorsConfig, _: &ComponentContext<'_>) -> Result<Self, BoxError> {
        if config.partitions == 0 || config.readings < 0 {
            return Err("partitions must be at least 1 and readings not negative".into());
        }
        Ok(Sensors {
            readings: config.readings,
            next: (0..config.partitions)
                .map(|p| (PartitionId(p), 0))
                .collect(),
            announced: false,
        })
    }
}

#[async_trait]
impl Source for Sensors {
    async fn next(&mut self) -> Result<SourceEvent, SourceError> {
        if !self.announced {
            self.announced = true;
            return Ok(SourceEvent::Assigned(self.next.keys().copied().collect()));
        }
        // No `.await` before returning: cancel safe by construction.
        let source = SourceId::new("sensors");
        for (partition, next) in &mut self.next {
            if *next < self.readings {
                let end = (*next + 100).min(self.readings);
                let records = (*next..end)
                    .map(|i| {
                        let position = Position::new(source.clone(), *partition, Offset(i));
                        let celsius = 15.0 + (i % 20) as f64 / 2.0;
                        let value = format!(
                            r#"{{"sensor":{},"reading":{i},"celsius":{celsius}}}"#,
                            partition.0
                        );
                        Record::new(position, value)
                    })
                    .collect();
                *next = end;
                return Ok(SourceEvent::Batch(PollBatch::from_records(
                    *partition, records,
                )));
            }
        }
        Ok(SourceEvent::End)
    }

    async fn seek(&mut self, partition: PartitionId, offset: Offset) -> Result<(), SourceError> {
        match self.next.get_mut(&partition) {
            Some(next) => {
                *next = offset.0;
                Ok(())
            }
            None => Err(SourceError::custom(format!("no sensor {partition}"))),
        }
    }
}

/// `[[transforms]] type = "scale"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScaleConfig {
    /// The number to scale (a top-level field).
    pub field: String,
    /// The factor.
    pub factor: f64,
    /// Where the result goes; `field` itself when absent.
    #[serde(default)]
    pub into: Option<String>,
}

/// A stateless closure: it runs on every transform worker. A record whose
/// `field` is not a number is refused to the dead-letter path.
fn scale(config: ScaleConfig, context: &ComponentContext<'_>) -> Box<dyn etl::Transform> {
    let ScaleConfig {
        field,
        factor,
        into,
    } = config;
    let into = into.unwrap_or_else(|| field.clone());
    Box::new(map(context.name(), move |mut record: Record| {
        let mut value: serde_json::Map<String, serde_json::Value> =
            match serde_json::from_slice(&record.value) {
                Ok(value) => value,
                Err(e) => return Err(Refused::new(record, format!("not a JSON object: {e}"))),
            };
        let Some(number) = value.get(&field).and_then(serde_json::Value::as_f64) else {
            return Err(Refused::new(record, format!("{field} is not a number")));
        };
        value.insert(into.clone(), serde_json::Value::from(number * factor));
        match serde_json::to_vec(&value) {
            Ok(bytes) => record.value = bytes.into(),
            Err(e) => return Err(Refused::new(record, e.to_string())),
        }
        Ok(record)
    }))
}

/// `[[sinks]] type = "csv"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvConfig {
    /// The file (relative to the configuration file's folder).
    pub path: PathBuf,
    /// The top-level fields written, in order; the header line.
    pub columns: Vec<String>,
}

/// Appends CSV rows; `Ok` from `write` means written and fsync'd.
/// At-least-once: a batch replayed after a crash is appended again.
#[derive(Debug)]
struct CsvSink {
    file: Arc<Mutex<File>>,
    path: PathBuf,
    columns: Arc<[String]>,
}

impl CsvSink {
    fn open(config: CsvConfig, context: &ComponentContext<'_>) -> Result<Self, BoxError> {
        if config.columns.is_empty() {
            return Err("columns must name at least one field".into());
        }
        let path = context.resolve(&config.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new().create(true).append(true).open(&path)?;
        if file.metadata()?.len() == 0 {
            writeln!(file, "{}", config.columns.join(","))?;
            file.sync_data()?;
        }
        Ok(CsvSink {
            file: Arc::new(Mutex::new(file)),
            path,
            columns: config.columns.into(),
        })
    }
}

#[async_trait]
impl Sink for CsvSink {
    async fn write(&self, batch: &EncodedBatch) -> Result<(), SinkError> {
        let mut rows = String::new();
        for record in batch.records() {
            let value: serde_json::Value =
                serde_json::from_slice(&record.value).unwrap_or(serde_json::Value::Null);
            let cells: Vec<String> = self
                .columns
                .iter()
                .map(|c| match value.get(c) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                })
                .collect();
            rows.push_str(&cells.join(","));
            rows.push('\n');
        }
        let file = self.file.clone();
        let path = self.path.clone();
        // Blocking file I/O off the runtime's workers.
        tokio::task::spawn_blocking(move || {
            let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
            file.write_all(rows.as_bytes())?;
            file.sync_data()
        })
        .await
        .map_err(|e| SinkError::Permanent(format!("the write task failed: {e}").into()))?
        .map_err(|source| SinkError::Io {
            op: "append to",
            path,
            source,
        })
    }
}
