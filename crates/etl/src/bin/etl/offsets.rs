//! `etl offsets show|reset`: inspect and rewind the offset store.

use etl_checkpoint::{FileStore, OffsetStore, Offsets};
use etl_record::{Offset, PartitionId};

use crate::args::OffsetsCommand;
use crate::exit::{Exit, code};

/// The file store's folder named by the configuration.
fn store_dir(config: &std::path::Path) -> Result<std::path::PathBuf, Exit> {
    let config = etl::load_config(config).map_err(Exit::from_config)?;
    match &config.checkpoint.store {
        etl::StoreConfig::File { path } => Ok(path.clone()),
        other => Err(Exit::new(
            code::CONFIG,
            format!("the offset store is {other:?}: only a file store can be shown or reset here"),
        )),
    }
}

pub(crate) fn offsets(command: &OffsetsCommand) -> Result<(), Exit> {
    match command {
        OffsetsCommand::Show { config, json } => {
            // Reading needs no ownership: this works while a run has it.
            let dir = store_dir(config)?;
            let offsets = FileStore::peek(&dir).map_err(|e| Exit::from_store(&e))?;
            if *json {
                let map: serde_json::Map<String, serde_json::Value> = offsets
                    .iter()
                    .map(|(p, o)| (p.to_string(), serde_json::Value::from(o.0)))
                    .collect();
                crate::exit::say(format_args!("{}", serde_json::Value::Object(map)))?;
            } else if offsets.is_empty() {
                crate::exit::say(format_args!("no committed offsets in {}", dir.display()))?;
            } else {
                crate::exit::say(format_args!("{:>10}  {:>20}", "PARTITION", "COMMITTED"))?;
                for (p, o) in &offsets {
                    crate::exit::say(format_args!("{:>10}  {:>20}", p.0, o.0))?;
                }
            }
            Ok(())
        }
        OffsetsCommand::Reset {
            config,
            partitions,
            to,
        } => {
            // Rewinding owns the store: refused (75) while a run has it.
            let mut store =
                FileStore::open(store_dir(config)?).map_err(|e| Exit::from_store(&e))?;
            let current = store.load().map_err(|e| Exit::from_store(&e))?;
            let targets: Vec<PartitionId> = if partitions.is_empty() {
                current.keys().copied().collect()
            } else {
                partitions.iter().map(|p| PartitionId(*p)).collect()
            };
            if targets.is_empty() {
                crate::exit::say(format_args!(
                    "no committed offsets to reset in {}",
                    store.dir().display()
                ))?;
                return Ok(());
            }
            let reset: Offsets = targets.iter().map(|p| (*p, Offset(*to))).collect();
            store.commit(&reset).map_err(|e| Exit::from_store(&e))?;
            for p in targets {
                let before = current.get(&p).map_or("-".to_owned(), |o| o.to_string());
                crate::exit::say(format_args!("partition {p}: {before} -> {to}"))?;
            }
            Ok(())
        }
    }
}
