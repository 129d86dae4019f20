//! `etl run`: build the pipeline, run it with signals, progress and
//! metrics, report the summary.

use crate::args::RunArgs;
use crate::exit::{Exit, code};
use crate::{metrics_server, progress};
use etl::Registry;

pub(crate) fn run(args: &RunArgs, status_line: bool, registry: &Registry) -> Result<(), Exit> {
    let config = registry
        .loader()
        .file(&args.config)
        .map_err(Exit::from_config)?;
    for w in &config.warnings {
        tracing::warn!(config = %args.config.display(), "{w}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("etl-worker")
        .build()
        .map_err(|e| Exit::failure(format!("cannot start the runtime: {e}")))?;
    let result = runtime.block_on(run_async(args, &config, status_line, registry));
    // The stop is over (bounded by shutdown_timeout): a blocking call of a
    // sink it aborted may still be stuck in the kernel, and must not hold
    // the exit.
    runtime.shutdown_background();
    result
}

async fn run_async(
    args: &RunArgs,
    config: &etl::Config,
    status_line: bool,
    registry: &Registry,
) -> Result<(), Exit> {
    let pipeline = etl::pipeline_from_config(config)
        .await
        .map_err(|e| Exit::from_pipeline(e, registry))?;
    let hub = pipeline.metrics();
    // First SIGINT/SIGTERM/SIGHUP: graceful stop. Second: exit at once (130); by
    // the delivery contract nothing is lost, uncommitted work replays.
    let shutdown = etl::shutdown_signal()
        .map_err(|e| Exit::failure(format!("cannot watch for signals: {e}")))?;

    let metrics_task = match args.metrics_addr {
        Some(addr) => {
            let (bound, task) = metrics_server::serve(addr, hub.clone())
                .await
                .map_err(|e| Exit::new(code::IO, e.to_string()))?;
            tracing::info!(address = %bound, "serving metrics at /metrics");
            Some(task)
        }
        None => None,
    };

    let interval = progress::report_interval(args.progress_interval);
    let progress_hub = hub.clone();
    let shape = input_shape(config);
    let mut reporter = progress::ProgressReporter::new(status_line, shape);
    let (stop_progress, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let progress = tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => reporter.report(&progress_hub.totals()),
                _ = &mut stopped => break,
            }
        }
        // The run is over: the status line goes, the summary follows.
        reporter.finish();
    });

    tracing::info!(config = %args.config.display(), "pipeline started");
    let result = pipeline.run(shutdown).await;
    let _ = stop_progress.send(());
    let _ = progress.await;
    if let Some(task) = metrics_task {
        task.abort();
    }
    let summary = result.map_err(|e| Exit::from_pipeline(e, registry))?;
    // The first few partitions and a count, as the progress line shows
    // them: a file source has a partition per input file, and every one
    // of 100,000 rendered at once would be the run's peak of memory
    // (`etl offsets show` lists them all).
    let committed = progress::render_committed(&etl::CommittedTotals::of(
        summary.committed.iter().map(|(p, o)| (*p, *o)),
    ));
    tracing::info!(
        read = summary.read,
        written = summary.written(),
        filtered = summary.filtered,
        dead_lettered = summary.dead_lettered,
        unrouted = summary.unrouted,
        replays = summary.replays,
        committed = %committed,
        stopped_by_signal = summary.stopped,
        "pipeline finished"
    );
    Ok(())
}

/// What the progress report can know of the input before the run: a
/// file source's offsets are bytes, and files read to their end (not
/// followed) have a known total size.
fn input_shape(config: &etl::Config) -> progress::InputShape {
    match config
        .source
        .options::<etl::config::FileSourceOptions>()
        .filter(|_| config.source.type_name() == "file")
    {
        Some(file) => {
            let total = (!file.follow)
                .then(|| etl_source::resolve_inputs(&file.paths).ok())
                .flatten()
                .map(|paths| {
                    paths
                        .iter()
                        .filter_map(|p| std::fs::metadata(p).ok())
                        .map(|m| m.len())
                        .sum()
                });
            progress::InputShape {
                unit: progress::OffsetUnit::Bytes,
                total,
            }
        }
        _ => progress::InputShape {
            unit: progress::OffsetUnit::Records,
            total: None,
        },
    }
}
