//! `[source] type = "file"` and `[[sinks]] type = "file"`: lines of local
//! files, and a local file appended to (exactly once if asked).

use etl_record::SourceId;
use etl_sink::{FileOutputs, FileOutputsConfig, FileSink, PathTemplate};
use etl_source::{FileSource, FileSourceConfig, LineFormat};

use super::encoder;
use crate::config::{FileSinkOptions, FileSinkTable, FileSourceOptions, FsyncKey};
use crate::registry::{BuiltSink, BuiltSource, CheckReport, Registry, SinkPlugin, SourcePlugin};

pub(super) fn register(registry: Registry) -> Registry {
    registry
        .source_plugin(
            "file",
            SourcePlugin::new(open_source)
                .check(check_source)
                .paths(&["paths"]),
        )
        .sink_plugin(
            "file",
            SinkPlugin::new_async(|f: FileSinkTable, context| {
                let encoder = encoder(f.encoding, context);
                let base = context.base_dir().to_owned();
                async move { open_sink(f, &base).await.map(|sink| sink.encoder(encoder)) }
            })
            .check(check_sink)
            .paths(&["path"]),
        )
}

fn open_source(
    f: FileSourceOptions,
    context: &crate::ComponentContext<'_>,
) -> Result<BuiltSource, crate::BoxError> {
    let format = match f.format {
        // The JSON steps (or a sink that reads every value as JSON,
        // alone after the source) parse every line anyway and send what
        // is not JSON to the dead-letter path with their reason: checking
        // at the source as well would parse each line twice.
        LineFormat::Ndjson if context.steps_check_json() => LineFormat::Lines,
        format => format,
    };
    let source = FileSource::open(FileSourceConfig {
        name: SourceId::new(f.name.as_deref().unwrap_or("file")),
        paths: f.paths.clone(),
        format,
        max_line_bytes: usize::try_from(f.max_line_bytes.0).unwrap_or(usize::MAX),
        max_batch_records: f.max_batch_records,
        eof: f.eof,
        follow: f.follow,
        max_open_files: f.max_open_files,
        on_replaced: f.on_replaced,
        // Which file each partition id stands for is kept next to the
        // offsets it gives meaning to.
        state_dir: context.state_dir().map(ToOwned::to_owned),
        ..FileSourceConfig::default()
    })?;
    // The NDJSON source checks every line, unless it leaves that to what
    // follows it.
    Ok(BuiltSource::new(source).values_are_json(format == LineFormat::Ndjson))
}

fn check_source(f: &FileSourceOptions, report: &mut CheckReport<'_>) {
    if f.paths.is_empty() {
        report.problem("paths", "paths is empty: name at least one file or glob");
    }
    report.at_least_one("max_batch_records", f.max_batch_records as u64);
    report.at_least_one("max_line_bytes", f.max_line_bytes.0);
    report.at_least_one("max_open_files", f.max_open_files as u64);
    // The same check as the source's when it opens them.
    for path in &f.paths {
        if path.contains(['*', '?', '['])
            && let Err(e) = glob::glob(path)
        {
            report.problem("paths", format!("paths: {path:?} is not a valid glob: {e}"));
        }
    }
    report.reads_files(&f.paths);
}

/// The template a sink's `path` is, if it has placeholders. `path` was
/// resolved against the configuration file's folder `base`: only what
/// the file wrote is read for placeholders, not the folder's own name.
fn template_of(
    path: &std::path::Path,
    base: &std::path::Path,
) -> Result<Option<PathTemplate>, String> {
    let parsed = match path.strip_prefix(base) {
        Ok(relative) if !base.as_os_str().is_empty() => relative
            .to_str()
            .map_or(Ok(None), |r| PathTemplate::parse_under(base, r)),
        _ => path.to_str().map_or(Ok(None), PathTemplate::parse),
    };
    parsed.map_err(|e| format!("{:?}: {e}", path.display().to_string()))
}

async fn open_sink(f: FileSinkTable, base: &std::path::Path) -> Result<BuiltSink, crate::BoxError> {
    let f = FileSinkOptions::try_from(f)?;
    let config = f.file_config();
    if let Some(template) = template_of(&f.path, base)? {
        let outputs = FileOutputs::new(
            template,
            FileOutputsConfig {
                file: config,
                max_open: f.max_open_outputs,
                close_idle_after: f.close_idle_after,
            },
        )?;
        return Ok(if f.exactly_once {
            BuiltSink::exactly_once(outputs)
        } else {
            BuiltSink::new(outputs)
        });
    }
    if let Some(dir) = f.path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| etl_sink::SinkError::Io {
            op: "create the output folder",
            path: dir.to_owned(),
            source,
        })?;
    }
    let file = FileSink::open(&f.path, config).await?;
    Ok(if f.exactly_once {
        BuiltSink::exactly_once(file)
    } else {
        BuiltSink::new(file)
    })
}

fn check_sink(f: &FileSinkTable, report: &mut CheckReport<'_>) {
    if f.fsync == FsyncKey::Interval && f.fsync_interval.is_none() {
        report.problem("fsync", crate::config::INTERVAL_NEEDS_ITS_LENGTH);
    }
    if let Some(every) = f.fsync_interval {
        report.above_zero("fsync_interval", every);
    }
    if let Some(bytes) = f.rotate_bytes {
        report.at_least_one("rotate_bytes", bytes.0);
    }
    if let Some(age) = f.rotate_interval {
        report.above_zero("rotate_interval", age);
    }
    // Read before the path is resolved against the file's folder.
    match template_of(&f.path, std::path::Path::new("")) {
        Err(e) => report.problem("path", format!("path: {e}")),
        Ok(Some(_)) => {
            if report.name() == "dead_letter" {
                report.problem(
                    "path",
                    "the dead-letter sink's path cannot name fields: a dead letter is the \
                     record with its reason, and one it cannot place would have nowhere to go",
                );
            }
            report.at_least_one("max_open_outputs", f.max_open_outputs as u64);
            report.above_zero("close_idle_after", f.close_idle_after);
        }
        Ok(None) => report.writes_file(
            &f.path,
            f.rotate_bytes.is_some() || f.rotate_interval.is_some(),
        ),
    }
    if f.exactly_once {
        report.exactly_once();
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use crate::Registry;
    use crate::config::{FileSinkOptions, FsyncPolicy};

    fn with_fsync(lines: &str) -> String {
        format!(
            "[source]\ntype = \"generator\"\n\n[[sinks]]\ntype = \"file\"\npath = \"out.ndjson\"\n{lines}\n"
        )
    }

    #[test]
    fn fsync_interval_reads_into_the_sink_s_own_policy() {
        let text = with_fsync("fsync = \"interval\"\nfsync_interval = \"5ms\"");
        let config = Registry::new()
            .loader()
            .text(&text, Path::new("."))
            .expect("it loads");
        let options = config.sinks[0]
            .kind
            .options_of::<FileSinkOptions>("file")
            .expect("a file sink");
        assert_eq!(
            options.fsync,
            FsyncPolicy::Interval(Duration::from_millis(5))
        );
        assert_eq!(options.file_config().fsync, options.fsync);

        let text = with_fsync("");
        let config = Registry::new().loader().text(&text, Path::new("."));
        let options = config.expect("it loads").sinks[0]
            .kind
            .options_of::<FileSinkOptions>("file")
            .expect("a file sink");
        assert_eq!(options.fsync, FsyncPolicy::EveryBatch);
    }

    #[test]
    fn a_parquet_encoding_on_a_file_sink_is_refused_at_its_key_pointing_to_the_local_store() {
        let text = with_fsync("encoding = \"parquet\"");
        let problems = Registry::new()
            .loader()
            .text(&text, Path::new("."))
            .expect_err("refused");
        assert_eq!(problems.len(), 1, "{problems:?}");
        let problem = &problems[0];
        assert_eq!((problem.line, problem.column), (7, 13), "{problems:?}");
        for part in [
            "Parquet",
            "type = \"object_store\"",
            "kind = \"local\"",
            "docs/object-storage.md",
        ] {
            assert!(problem.message.contains(part), "{part:?} in {problems:?}");
        }
    }

    #[test]
    fn an_fsync_interval_without_its_length_is_refused_at_the_fsync_key() {
        let text = with_fsync("rotate_bytes = 1000\nfsync = \"interval\"");
        let problems = Registry::new()
            .loader()
            .text(&text, Path::new("."))
            .expect_err("refused");
        let at: Vec<_> = problems
            .iter()
            .map(|p| (p.line, p.column, p.message.as_str()))
            .collect();
        assert_eq!(
            at,
            vec![(8, 1, "fsync = \"interval\" needs fsync_interval")],
            "{problems:?}"
        );
    }
}
