//! `etl-faulty CONFIG SEED`: the pipeline a configuration describes, built
//! through the Rust API with its file sink behind fault injectors, for the
//! crash loops (the `etl` binary has no faulty sink to configure).
//!
//! Every write fails transiently with probability 1/20 (seeded; the driver
//! retries) and every 13th write of a run fails as if it held a bad record
//! (`SinkError::Data`: the batch fails and its partition replays). Logs are
//! JSON lines on standard error, ending with `pipeline finished` as `etl
//! run` does; exit code 0 when the input is exhausted, 1 on any error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use etl::config::{FileSinkOptions, FileSourceOptions, SinkKind, StoreConfig};
use etl::{Config, Pipeline};
use etl_checkpoint::FileStore;
use etl_record::SourceId;
use etl_sink::testing::{FailEveryNth, Flaky};
use etl_sink::{
    FileSink, FileSinkConfig, NdjsonEncoder, RetryPolicy, SinkDriver, SinkDriverConfig,
};
use etl_source::{FileSource, FileSourceConfig, SourceDriverConfig};
use tokio_util::sync::CancellationToken;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .json()
        .flatten_event(true)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(config), Some(seed)) = (args.first(), args.get(1).and_then(|s| s.parse().ok()))
    else {
        eprintln!("error: usage: etl-faulty CONFIG SEED");
        return ExitCode::from(2);
    };
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(BoxError::from)
        .and_then(|rt| rt.block_on(run(Path::new(config), seed)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn file_sink_path(kind: &SinkKind) -> Result<PathBuf, BoxError> {
    match kind.options_of::<FileSinkOptions>("file") {
        Some(f) => Ok(f.path),
        None => Err(format!("only file sinks are supported here, not {kind:?}").into()),
    }
}

async fn open_file(path: &Path) -> Result<FileSink, BoxError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    Ok(FileSink::open(path, FileSinkConfig::default()).await?)
}

async fn run(path: &Path, seed: u64) -> Result<(), BoxError> {
    let config: Config = etl::registry().loader().file(path)?;
    let Some(source) = config.source.options_of::<FileSourceOptions>("file") else {
        return Err("only a file source is supported here".into());
    };
    let source = FileSource::open(FileSourceConfig {
        name: SourceId::new(source.name.as_deref().unwrap_or("file")),
        paths: source.paths.clone(),
        max_batch_records: source.max_batch_records,
        ..FileSourceConfig::default()
    })?;
    let [sink] = config.sinks.as_slice() else {
        return Err("exactly one sink is supported here".into());
    };
    let file = open_file(&file_sink_path(&sink.kind)?).await?;
    let faulty = FailEveryNth::data(Flaky::new(file, 0.05, seed), 13);
    let driver = SinkDriver::new(faulty, NdjsonEncoder::new()).config(SinkDriverConfig {
        batch_max_records: sink.options.batch_max_records,
        linger: sink.options.linger,
        retry: RetryPolicy {
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(20),
            ..RetryPolicy::default()
        },
        ..SinkDriverConfig::default()
    });
    let mut builder = Pipeline::builder()
        .source(source)
        .transforms(etl::chain_from_config(&config.transforms))
        .sink(sink.name.clone(), driver)
        .checkpoint(config.checkpoint_config())
        // Permanent failures hit different ranges; a range would need to
        // fail this often in a row to count as poison.
        .source_driver(SourceDriverConfig {
            max_replays: 20,
            ..SourceDriverConfig::default()
        });
    if let Some(kind) = &config.dead_letter {
        builder = builder.dead_letter(open_file(&file_sink_path(kind)?).await?);
    }
    if let StoreConfig::File { path } = &config.checkpoint.store {
        builder = builder.offset_store(FileStore::open(path)?);
    } else {
        return Err("only a file offset store is supported here".into());
    }
    let summary = builder.build()?.run(CancellationToken::new()).await?;
    tracing::info!(
        read = summary.read,
        written = summary.written(),
        filtered = summary.filtered,
        dead_lettered = summary.dead_lettered,
        replays = summary.replays,
        "pipeline finished"
    );
    Ok(())
}
