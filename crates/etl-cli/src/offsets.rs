//! `etl offsets show|reset`: inspect and rewind the offset store.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use etl_checkpoint::{FileStore, OffsetStore, PartitionOffsets};
use etl_record::{Offset, PartitionId};

use crate::args::OffsetsCommand;
use crate::exit::{Exit, code, say};
use etl::Registry;

/// What a pipeline's state says about each partition.
struct View {
    /// The offset store's folder.
    dir: PathBuf,
    /// What a committed value counts, for the reader.
    unit: &'static str,
    /// Each known partition's name (its file, or topic and partition).
    names: BTreeMap<PartitionId, String>,
    /// Input files by partition, to bound `reset --to`.
    files: BTreeMap<PartitionId, PathBuf>,
    /// What an exactly-once file sink stored with its data, by sink path:
    /// what has been delivered, whatever the offset store says.
    delivered: Vec<(PathBuf, PartitionOffsets)>,
}

impl View {
    fn load(config_path: &Path, registry: &Registry) -> Result<Self, Exit> {
        let config = registry
            .loader()
            .file(config_path)
            .map_err(Exit::from_config)?;
        // A Kafka source's offsets live in its consumer group whatever
        // `[checkpoint]` says (a store other than the group is refused at
        // load): the default folder would read as "no committed offsets".
        let kafka = config.source.keeps_offsets();
        let dir = match &config.checkpoint.store {
            _ if kafka => return Err(keeps_its_own_offsets()),
            etl::config::StoreConfig::File { path } => path.clone(),
            etl::config::StoreConfig::Memory => {
                return Err(Exit::new(
                    code::CONFIG,
                    "the offset store is in memory: there is nothing to show or reset".to_owned(),
                ));
            }
            etl::config::StoreConfig::Source => return Err(keeps_its_own_offsets()),
        };
        let mut view = View {
            dir,
            unit: "offset",
            names: BTreeMap::new(),
            files: BTreeMap::new(),
            delivered: Vec::new(),
        };
        match config.source.type_name() {
            "file" => {
                view.unit = "a byte position in the file: the next run reads the lines that start at or after it";
                if view.dir.is_dir() {
                    view.files = etl_source::registered_inputs(&view.dir).map_err(|e| {
                        Exit::new(code::IO, format!("cannot read which file is which: {e}"))
                    })?;
                }
                view.names = view
                    .files
                    .iter()
                    .map(|(p, path)| (*p, path.display().to_string()))
                    .collect();
            }
            "generator" => {
                view.unit = "the number of the next record to generate";
            }
            _ => {
                view.unit = "the offset of the next record to read, as the source counts";
            }
        }
        for sink in &config.sinks {
            if sink.kind.type_name() == "file"
                && sink.kind.is_exactly_once()
                && let Some(file) = sink.kind.options::<etl::config::FileSinkOptions>()
            {
                let progress = etl_sink::FileSink::stored_progress(&file.path)
                    .map_err(|e| Exit::new(code::IO, format!("sink {:?}: {e}", sink.name)))?
                    .map(|p| p.iter().collect())
                    .unwrap_or_default();
                view.delivered.push((file.path.clone(), progress));
            }
        }
        Ok(view)
    }

    fn name(&self, partition: PartitionId) -> &str {
        self.names.get(&partition).map_or("", String::as_str)
    }
}

/// The answer for a source that keeps its own offsets (a Kafka consumer
/// group): this command has nothing of them to show or reset.
fn keeps_its_own_offsets() -> Exit {
    Exit::new(
        code::CONFIG,
        "the source keeps the offsets (a Kafka consumer group): use the broker's \
         tools (kafka-consumer-groups) to show or reset them"
            .to_owned(),
    )
}

pub(crate) fn offsets(command: &OffsetsCommand, registry: &Registry) -> Result<(), Exit> {
    match command {
        OffsetsCommand::Show { config, json } => {
            let view = View::load(config, registry)?;
            // Reading needs no ownership: this works while a run has it.
            let offsets = FileStore::peek(&view.dir).map_err(|e| Exit::from_store(&e))?;
            show(&view, &offsets, *json)
        }
        OffsetsCommand::Reset {
            config,
            partitions,
            to,
        } => reset(config, partitions, *to, registry),
    }
}

fn show(view: &View, offsets: &PartitionOffsets, json: bool) -> Result<(), Exit> {
    if json {
        let rows: Vec<serde_json::Value> = offsets
            .iter()
            .map(|(p, o)| {
                let mut row = serde_json::json!({
                    "partition": p.0,
                    "committed": o.0,
                });
                if let Some(name) = view.names.get(p) {
                    row["input"] = name.as_str().into();
                }
                for (path, delivered) in &view.delivered {
                    if let Some(d) = delivered.get(p) {
                        row["delivered"] = d.0.into();
                        row["delivered_by"] = path.display().to_string().into();
                    }
                }
                row
            })
            .collect();
        return say(format_args!(
            "{}",
            serde_json::json!({ "committed_means": view.unit, "partitions": rows })
        ));
    }
    if offsets.is_empty() {
        return say(format_args!(
            "no committed offsets in {}",
            view.dir.display()
        ));
    }
    say(format_args!(
        "committed offsets in {} (COMMITTED is {})",
        view.dir.display(),
        view.unit
    ))?;
    let exactly_once = !view.delivered.is_empty();
    if exactly_once {
        say(format_args!(
            "{:>10}  {:>20}  {:>20}  INPUT",
            "PARTITION", "COMMITTED", "DELIVERED"
        ))?;
    } else {
        say(format_args!(
            "{:>10}  {:>20}  INPUT",
            "PARTITION", "COMMITTED"
        ))?;
    }
    for (p, o) in offsets {
        if exactly_once {
            let delivered = view
                .delivered
                .iter()
                .filter_map(|(_, d)| d.get(p))
                .min()
                .map_or("-".to_owned(), |d| d.0.to_string());
            say(format_args!(
                "{:>10}  {:>20}  {:>20}  {}",
                p.0,
                o.0,
                delivered,
                view.name(*p)
            ))?;
        } else {
            say(format_args!("{:>10}  {:>20}  {}", p.0, o.0, view.name(*p)))?;
        }
    }
    if exactly_once {
        say(format_args!(
            "DELIVERED is what the exactly-once output already holds (stored with its data): \
             the next run skips records below it, whatever COMMITTED says"
        ))?;
    }
    Ok(())
}

fn reset(config: &Path, partitions: &[u32], to: i64, registry: &Registry) -> Result<(), Exit> {
    if to < 0 {
        return Err(Exit::new(
            code::CONFIG,
            format!("--to {to}: an offset is never negative"),
        ));
    }
    let view = View::load(config, registry)?;
    // Rewinding owns the store: refused (75) while a run has it.
    let (mut store, current) = match FileStore::open(&view.dir) {
        Ok(mut store) => {
            let current = store.load().map_err(|e| Exit::from_store(&e))?;
            (store, current)
        }
        // Every generation is unreadable: an explicit reset of named
        // partitions is the way out, writing a new generation over them.
        Err(etl_checkpoint::CheckpointError::Corrupt { path, detail })
            if !partitions.is_empty() =>
        {
            tracing::warn!(store = %path.display(), %detail, "the offset store is corrupt; writing a new generation with the partitions named");
            let store =
                FileStore::open_discarding_corrupt(&view.dir).map_err(|e| Exit::from_store(&e))?;
            (store, PartitionOffsets::new())
        }
        Err(e) => return Err(Exit::from_store(&e)),
    };
    let targets: Vec<PartitionId> = if partitions.is_empty() {
        current.keys().copied().collect()
    } else {
        partitions.iter().map(|p| PartitionId(*p)).collect()
    };
    if targets.is_empty() {
        return say(format_args!(
            "no committed offsets to reset in {}",
            store.dir().display()
        ));
    }
    for p in &targets {
        let known = current.contains_key(p) || view.names.contains_key(p);
        if !known && !partitions.is_empty() && !current.is_empty() {
            return Err(Exit::new(
                code::CONFIG,
                format!(
                    "partition {p} is not in {} (its partitions: {}); `etl offsets show` lists them",
                    store.dir().display(),
                    current
                        .keys()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        if let Some(file) = view.files.get(p)
            && let Ok(meta) = std::fs::metadata(file)
            && u64::try_from(to).is_ok_and(|to| to > meta.len())
        {
            return Err(Exit::new(
                code::CONFIG,
                format!(
                    "--to {to} is past the end of {} ({} bytes): partition {p} cannot start there",
                    file.display(),
                    meta.len()
                ),
            ));
        }
    }
    let mut reset = current.clone();
    for p in &targets {
        reset.insert(*p, Offset(to));
    }
    store.commit(&reset).map_err(|e| Exit::from_store(&e))?;
    for p in targets {
        let before = current.get(&p).map_or("-".to_owned(), |o| o.to_string());
        say(format_args!(
            "partition {p}: {before} -> {to}  {}",
            view.name(p)
        ))?;
    }
    Ok(())
}
