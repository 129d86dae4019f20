//! Building a pipeline from a configuration file's [`Config`].

//!
//! Every source and sink is built by the factory its `type` was
//! registered with in the [`Registry`](crate::Registry), the built-ins
//! included: nothing here knows a component by name.

use std::sync::Arc;

use etl_checkpoint::{FileStore, MemoryStore, OffsetStore};
use etl_sink::{NdjsonEncoder, Sink, SinkDriver};
use etl_source::SourceDriverConfig;

use super::Route;
use super::{Pipeline, PipelineBuilder, PipelineError};
use crate::config::{Config, SinkConfig, SinkKind, StoreConfig, TransformConfig};
use crate::transform::{
    condition_form, steps_write_json, try_chain_from_config, try_chain_labelled,
};
use etl_config::{
    BoxError, BoxedProgressSink, BuiltSink, BuiltSource, ContextParts, ProgressCheck, SinkHold,
    SourceStart,
};

/// Build the pipeline a configuration describes: open its source, sinks
/// and offset store.
///
/// # Errors
///
/// A part could not be opened (a missing input file, an unwritable output,
/// a corrupt offset store), or the configuration names a connector this
/// build does not include.
pub async fn pipeline_from_config(config: &Config) -> Result<Pipeline, PipelineError> {
    builder_from_config(config, true).await?.build()
}

impl PipelineBuilder {
    /// The builder of the pipeline a configuration describes, its source,
    /// sinks and offset store opened, to take more Rust before it is
    /// built: a transform appended after the file's
    /// ([`transform`](Self::transform)), another sink, a dead-letter sink
    /// in place of the file's.
    ///
    /// Unlike [`pipeline_from_config`], the sinks check that every value
    /// they encode as NDJSON is JSON, since a step added here may change
    /// what the file's steps guaranteed; a value that is not goes to the
    /// dead-letter path.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use bytes::Bytes;
    /// use etl::{PipelineBuilder, map, shutdown_signal};
    /// use etl_record::Record;
    ///
    /// let config = etl::registry().loader().file("pipeline.toml".as_ref())?;
    /// let pipeline = PipelineBuilder::from_config(&config)
    ///     .await?
    ///     .transform(map("stamp", |mut record: Record| {
    ///         record.headers.push("seen-by", Some(Bytes::from_static(b"rust")));
    ///         Ok(record)
    ///     }))
    ///     .build()?;
    /// pipeline.run(shutdown_signal()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`pipeline_from_config`].
    pub async fn from_config(config: &Config) -> Result<PipelineBuilder, PipelineError> {
        builder_from_config(config, false).await
    }
}

/// The builder of `config`'s pipeline; `trusted`: the NDJSON encoders may
/// take every value as JSON without checking it, when the source and the
/// steps say every value is.
async fn builder_from_config(
    config: &Config,
    trusted: bool,
) -> Result<PipelineBuilder, PipelineError> {
    let builder = Pipeline::builder()
        .transforms(try_chain_from_config(&config.transforms).map_err(invalid)?)
        .checkpoint(config.checkpoint_config())
        .source_driver(SourceDriverConfig {
            max_replays: config.delivery.max_replays.max(1),
            poison: config.delivery.poison,
            ..SourceDriverConfig::default()
        })
        .on_failure(config.delivery.on_failure);

    let parts = ContextParts {
        checkpoint: &config.checkpoint,
        steps_check_json: first_step_reads_json(config)
            || (trusted && only_sink_reads_json(config)),
        values_are_json: false,
        progress_is_shared: false,
    };
    let built = config.source.build("source", &parts).map_err(|e| {
        let shown = config.source.redacted("source", &e);
        factory_error(e, shown, "[source]")
    })?;
    let parts = ContextParts {
        values_are_json: trusted && values_are_json(config, &built),
        progress_is_shared: built.shares_progress,
        ..parts
    };
    let (mut builder, progress_check) = with_source(builder, built, &config.checkpoint.store)?;
    builder = builder.route_mode(config.routing.mode);
    if let Some(unmatched) = &config.routing.unmatched {
        builder = builder.unmatched(unmatched.clone());
    }
    for sink in &config.sinks {
        if let Some(route) = route_of(sink, steps_write_json(&config.transforms))? {
            builder = builder.route(sink.name.clone(), route);
        }
        let built = build_sink(&sink.kind, &sink.name, &parts).await?;
        let driver_config = sink.options.driver_config();
        let encoder = built
            .encoder
            .unwrap_or_else(|| ndjson(parts.values_are_json));
        builder = match built.sink {
            SinkHold::ExactlyOnce(sink_) => {
                let (driver, progress) =
                    SinkDriver::exactly_once(BoxedProgressSink(sink_), encoder);
                if let Some(check) = &progress_check {
                    check(&progress).map_err(|e| {
                        PipelineError::Invalid(format!("sink {:?}: {e}", sink.name))
                    })?;
                }
                builder.exactly_once_sink(sink.name.clone(), driver.config(driver_config), progress)
            }
            SinkHold::Shared(shared) => builder.sink(
                sink.name.clone(),
                SinkDriver::new(shared, encoder).config(driver_config),
            ),
        };
    }
    if let Some(kind) = &config.dead_letter {
        let built = build_sink(kind, "dead_letter", &parts).await?;
        let sink: Arc<dyn Sink> = match built.sink {
            SinkHold::Shared(sink) => sink,
            SinkHold::ExactlyOnce(sink) => Arc::new(BoxedProgressSink(sink)),
        };
        builder = builder.dead_letter(sink);
    }
    Ok(builder)
}

/// The route of a sink with a `when` or `transforms` of its own;
/// `after_json`: the shared steps write only JSON.
fn route_of(sink: &SinkConfig, after_json: bool) -> Result<Option<Route>, PipelineError> {
    if sink.route.is_plain() {
        return Ok(None);
    }
    let label = format!("sink {:?} ", sink.name);
    let mut route = Route::new();
    if let Some(when) = &sink.route.when {
        let condition = try_chain_labelled(std::slice::from_ref(when), &format!("{label}when "))
            .map_err(invalid)?;
        route = route
            .when_chain(condition)
            .when_fast(condition_form(when, after_json));
    }
    let steps = try_chain_labelled(&sink.route.transforms, &label).map_err(invalid)?;
    Ok(Some(route.transforms(steps)))
}

fn ndjson(trusted: bool) -> Box<dyn etl_sink::Encoder> {
    if trusted {
        Box::new(NdjsonEncoder::trusted())
    } else {
        Box::new(NdjsonEncoder::new())
    }
}

/// A factory's error as the pipeline's: a typed error of the source, a
/// sink, the store or the pipeline kept as it is (its exit code depends
/// on it), anything else a problem of the configuration, shown without
/// the configuration's secrets.
fn factory_error(e: BoxError, shown: String, section: &str) -> PipelineError {
    let e = match e.downcast::<PipelineError>() {
        Ok(e) => return *e,
        Err(e) => e,
    };
    let e = match e.downcast::<etl_source::SourceError>() {
        Ok(e) => return PipelineError::Source(*e),
        Err(e) => e,
    };
    let e = match e.downcast::<etl_checkpoint::CheckpointError>() {
        Ok(e) => return PipelineError::Checkpoint(*e),
        Err(e) => e,
    };
    drop(e);
    PipelineError::Invalid(format!("{section}: {shown}"))
}

/// A chain that cannot be built, as the pipeline reports it.
fn invalid(e: crate::transform::ChainError) -> PipelineError {
    PipelineError::Invalid(e.to_string())
}

/// Build the sink of a `[[sinks]]` entry or of `[dead_letter]`.
async fn build_sink(
    kind: &SinkKind,
    name: &str,
    parts: &ContextParts<'_>,
) -> Result<BuiltSink, PipelineError> {
    let opened = match kind.build(name, parts) {
        Ok(future) => future.await,
        Err(e) => Err(e),
    };
    opened.map_err(|e| match e.downcast::<etl_sink::SinkError>() {
        Ok(e) => PipelineError::Sink {
            name: name.to_owned(),
            source: (*e).into(),
        },
        Err(e) => {
            let shown = kind.redacted(name, &e);
            factory_error(e, shown, &format!("sink {name:?}"))
        }
    })
}

fn open_store(store: &StoreConfig) -> Result<Box<dyn OffsetStore>, PipelineError> {
    Ok(match store {
        StoreConfig::File { path } => Box::new(FileStore::open(path)?),
        StoreConfig::Memory => Box::new(MemoryStore::new()),
        StoreConfig::Source => {
            return Err(PipelineError::Invalid(
                "store = \"source\" needs a source that keeps offsets (kafka)".to_owned(),
            ));
        }
    })
}

/// The source and the offset store: the source's own when it keeps its
/// offsets, `[checkpoint] store` otherwise.
fn with_source(
    builder: PipelineBuilder,
    built: BuiltSource,
    store: &StoreConfig,
) -> Result<(PipelineBuilder, Option<ProgressCheck>), PipelineError> {
    let builder = match built.offset_store {
        Some(own) => builder.offset_store(own),
        None => builder.offset_store(open_store(store)?),
    };
    let builder = match built.start {
        SourceStart::Ready(source) => builder.source(source),
        SourceStart::WithHandle(start) => builder.source_factory(move |handle| {
            start(handle).map_err(|e| {
                let shown = e.to_string();
                factory_error(e, shown, "[source]")
            })
        }),
    };
    Ok((builder, built.progress_check))
}

/// Whether a pipeline without steps has one sink, on no route, that reads
/// every value as JSON and refuses what is not (a Parquet encoder), and a
/// `[dead_letter]` sink that takes what it refuses as it is (one that
/// does not read values as JSON itself): every record then reaches it
/// and is checked there, once, and a line that is not JSON is
/// dead-lettered there as the source would have. Only for a pipeline
/// built from its configuration alone (`pipeline_from_config`): a sink or
/// a step added in Rust afterwards would see lines nobody checked.
/// Without a `[dead_letter]` sink the source checks, so that such a line
/// halts the run at once as bad data (exit 65), as it always did.
fn only_sink_reads_json(config: &Config) -> bool {
    let takes_letters = config
        .dead_letter
        .as_ref()
        .is_some_and(|d| !d.reads_values_as_json());
    match config.sinks.as_slice() {
        [sink] => {
            config.transforms.is_empty()
                && takes_letters
                && sink.route.transforms.is_empty()
                && sink.route.when.is_none()
                && config.routing.unmatched.is_none()
                && sink.kind.reads_values_as_json()
        }
        _ => false,
    }
}

/// The first step is a built-in one, which parses every record as JSON
/// and dead-letters what is not (a registered step may not).
fn first_step_reads_json(config: &Config) -> bool {
    config
        .transforms
        .first()
        .is_some_and(|t| !matches!(t, TransformConfig::Custom(_)))
}

/// Whether every value reaching the sinks is known to be valid JSON: the
/// built-in transforms (all JSON steps, fused into one stage that runs
/// last) parse every record they keep, and the source may say its values
/// are JSON (the NDJSON file source checks every line, the generator
/// writes JSON). The sinks' NDJSON encoders then skip their own check.
fn values_are_json(config: &Config, source: &BuiltSource) -> bool {
    // A registered transform may write anything, in the shared steps or
    // in a sink's own.
    let branches = config.sinks.iter().flat_map(|s| &s.route.transforms);
    if config
        .transforms
        .iter()
        .chain(branches)
        .any(|t| matches!(t, TransformConfig::Custom(_)))
    {
        return false;
    }
    !config.transforms.is_empty() || source.values_are_json
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(source: &str, transforms: &str) -> Config {
        let text = format!("[source]\n{source}\n{transforms}\n[[sinks]]\ntype = \"blackhole\"\n");
        etl_config::Registry::new()
            .loader()
            .text(&text, std::path::Path::new("."))
            .unwrap_or_else(|e| panic!("{e:?}"))
    }

    #[test]
    fn encoders_trust_only_values_known_to_be_json() {
        let dir = tempfile::tempdir().unwrap();
        for file in ["in.ndjson", "in.txt"] {
            std::fs::write(dir.path().join(file), "{}\n").unwrap();
        }
        let at = |file: &str| dir.path().join(file).display().to_string();
        let trusted = |source: &str, transforms: &str| {
            let mut config = config(source, transforms);
            config.checkpoint.store = StoreConfig::Memory;
            let parts = ContextParts {
                checkpoint: &config.checkpoint,
                steps_check_json: first_step_reads_json(&config),
                values_are_json: false,
                progress_is_shared: false,
            };
            let built = config.source.build("source", &parts).unwrap();
            values_are_json(&config, &built)
        };
        let filter = "[[transforms]]\ntype = \"filter\"\nfield = \"n\"\nop = \">\"\nvalue = 1";
        let ndjson = format!("type = \"file\"\npaths = [{:?}]", at("in.ndjson"));
        let lines = format!(
            "type = \"file\"\npaths = [{:?}]\nformat = \"lines\"",
            at("in.txt")
        );
        let generator = "type = \"generator\"\nrecords_per_partition = 1";
        assert!(trusted(&ndjson, ""));
        assert!(trusted(generator, ""));
        assert!(trusted(&lines, filter));
        assert!(!trusted(&lines, ""));
    }

    /// How [`run_into`] builds and runs its pipeline.
    #[derive(Clone, Copy, PartialEq)]
    enum Run {
        /// `pipeline_from_config`, with `[dead_letter]` to `dead.ndjson`.
        WithLetters,
        /// The same without `[dead_letter]`.
        NoLetters,
        /// `PipelineBuilder::from_config`, then a sink `copy` added in
        /// Rust that writes every value as it is.
        SinkAdded,
    }

    /// A pipeline reading `in.ndjson` (one line that is not JSON between
    /// two that are) into one sink of type `sink`; the registry has a sink
    /// type `checks_json` whose encoder refuses what is not JSON and which
    /// says so at load. What the sinks wrote, how many were dead-lettered,
    /// the dead letters' file, and the values the added sink took; or the
    /// run's error.
    async fn run_into(
        dir: &std::path::Path,
        sink: &str,
        transforms: &str,
        run: Run,
    ) -> Result<(u64, u64, String, Vec<String>), PipelineError> {
        #[derive(serde::Deserialize)]
        struct NoOptions {}
        let registry = etl_config::Registry::new().sink_plugin(
            "checks_json",
            etl_config::SinkPlugin::new(|_: NoOptions, _| {
                Ok(etl_config::BuiltSink::new(etl_sink::BlackholeSink::new())
                    .encoder(etl_sink::NdjsonEncoder::new()))
            })
            .check(|_, report| report.reads_values_as_json()),
        );
        std::fs::write(dir.join("in.ndjson"), "{\"a\":1}\nnot json\n{\"a\":2}\n").unwrap();
        let letters = if run == Run::NoLetters {
            String::new()
        } else {
            format!(
                "[dead_letter]\ntype = \"file\"\npath = {:?}\n",
                dir.join("dead.ndjson")
            )
        };
        let text = format!(
            "[source]\ntype = \"file\"\npaths = [{:?}]\n{transforms}\n[[sinks]]\ntype = \"{sink}\"\n\
             {letters}[checkpoint]\nstore = {{ type = \"memory\" }}\n",
            dir.join("in.ndjson"),
        );
        let config = registry
            .loader()
            .text(&text, dir)
            .unwrap_or_else(|e| panic!("{e:?}"));
        let copy = etl_sink::testing::MemorySink::new();
        let pipeline = if run == Run::SinkAdded {
            PipelineBuilder::from_config(&config)
                .await
                .unwrap()
                .sink(
                    "copy",
                    etl_sink::SinkDriver::new(copy.clone(), etl_sink::RawLinesEncoder::new()),
                )
                .build()
                .unwrap()
        } else {
            pipeline_from_config(&config).await.unwrap()
        };
        let summary = pipeline
            .run(tokio_util::sync::CancellationToken::new())
            .await?;
        let dead = std::fs::read_to_string(dir.join("dead.ndjson")).unwrap_or_default();
        let copied = copy
            .records()
            .iter()
            .map(|r| String::from_utf8_lossy(&r.value).into_owned())
            .collect();
        Ok((summary.written(), summary.dead_lettered, dead, copied))
    }

    #[tokio::test]
    async fn a_line_goes_unchecked_by_the_source_to_the_only_sink_that_reads_json_and_is_dead_lettered_there()
     {
        let dir = tempfile::tempdir().unwrap();
        let (written, dead, letters, _) = run_into(dir.path(), "checks_json", "", Run::WithLetters)
            .await
            .unwrap();
        assert_eq!((written, dead), (2, 1), "{letters}");
        // The sink's encoder refused it: the source let it through.
        assert!(letters.contains("value is not valid JSON"), "{letters}");
        assert!(!letters.contains("invalid JSON"), "{letters}");
    }

    #[tokio::test]
    async fn without_a_dead_letter_sink_the_source_checks_and_a_line_that_is_not_json_halts_the_run()
     {
        let dir = tempfile::tempdir().unwrap();
        let err = run_into(dir.path(), "checks_json", "", Run::NoLetters)
            .await
            .unwrap_err();
        assert!(
            matches!(err, PipelineError::NoDeadLetterSink { .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("invalid JSON"), "{err}");
    }

    #[tokio::test]
    async fn a_sink_added_in_rust_to_a_pipeline_from_its_configuration_never_takes_an_unchecked_line()
     {
        let dir = tempfile::tempdir().unwrap();
        let (_, dead, letters, copied) = run_into(dir.path(), "checks_json", "", Run::SinkAdded)
            .await
            .unwrap();
        assert_eq!(copied, ["{\"a\":1}", "{\"a\":2}"], "{letters}");
        assert_eq!(dead, 1, "{letters}");
        assert!(letters.contains("invalid JSON"), "{letters}");
    }

    #[tokio::test]
    async fn the_source_checks_its_lines_for_a_sink_that_does_not_read_json() {
        // A sink that takes anything: the source's check is the only one.
        let dir = tempfile::tempdir().unwrap();
        let (written, dead, letters, _) = run_into(dir.path(), "blackhole", "", Run::WithLetters)
            .await
            .unwrap();
        assert_eq!((written, dead), (2, 1), "{letters}");
        assert!(letters.contains("invalid JSON"), "{letters}");
    }

    #[tokio::test]
    async fn the_blackhole_takes_values_that_are_not_json() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("in.txt"), "not json\n{\"a\":1}\n").unwrap();
        let source = format!(
            "type = \"file\"\npaths = [{:?}]\nformat = \"lines\"",
            dir.path().join("in.txt")
        );
        let mut config = config(&source, "");
        config.checkpoint.store = crate::config::StoreConfig::Memory;
        let pipeline = pipeline_from_config(&config).await.unwrap();
        let summary = pipeline
            .run(tokio_util::sync::CancellationToken::new())
            .await
            .unwrap();
        assert_eq!((summary.read, summary.written()), (2, 2));
        assert_eq!(summary.dead_lettered, 0);
    }
}
