//! Pipeline configurations for the suites, written as TOML.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Which sink a crash loop drives, and so which program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SinkMode {
    /// The `etl` binary with an at-least-once file sink.
    AtLeastOnce,
    /// The `etl` binary with the exactly-once file sink
    /// (`exactly_once = true`): no duplicates at all.
    ExactlyOnce,
    /// The `etl-faulty` program of this package: the same pipeline built
    /// through the Rust API, with a file sink behind fault injectors
    /// (transient failures that retry, permanent ones that replay).
    Faulty,
}

/// A file-to-file NDJSON pipeline: filter `amount >= 10`, add a field,
/// write to a file sink, dead letters to a second file, offsets in a file
/// store.
#[derive(Clone, Debug)]
pub struct PipelineToml {
    /// Input files.
    pub inputs: Vec<PathBuf>,
    /// Output file.
    pub output: PathBuf,
    /// Dead-letter file.
    pub dead_letter: PathBuf,
    /// Offset store folder.
    pub store: PathBuf,
    /// Exactly-once file sink.
    pub exactly_once: bool,
    /// Largest source poll batch, in records.
    pub max_batch_records: u64,
    /// Largest sink write, in records.
    pub sink_batch_records: u64,
    /// `[limits] max_in_flight_batches` (also per partition).
    pub max_in_flight_batches: u64,
    /// `[checkpoint] commit_interval`, in milliseconds.
    pub commit_interval_ms: u64,
    /// Sink `linger`, in milliseconds.
    pub linger_ms: u64,
    /// Raw TOML appended to the `[source]` section (`max_line_bytes`, ...).
    pub source_extra: String,
    /// Raw TOML appended to the `[[sinks]]` entry.
    pub sink_extra: String,
    /// Raw TOML appended at the end (`[delivery]`, ...).
    pub extra: String,
}

impl PipelineToml {
    /// A pipeline from `inputs` to `<dir>/out/out.ndjson`, dead letters in
    /// `<dir>/out/dead.ndjson`, offsets in `<dir>/state`.
    #[must_use]
    pub fn new(dir: &Path, inputs: Vec<PathBuf>) -> Self {
        PipelineToml {
            inputs,
            output: dir.join("out").join("out.ndjson"),
            dead_letter: dir.join("out").join("dead.ndjson"),
            store: dir.join("state"),
            exactly_once: false,
            max_batch_records: 1000,
            sink_batch_records: 1000,
            max_in_flight_batches: 8,
            commit_interval_ms: 1,
            linger_ms: 5,
            source_extra: String::new(),
            sink_extra: String::new(),
            extra: String::new(),
        }
    }

    /// Records that can be in flight at once: `[limits]
    /// max_in_flight_batches` source batches of `max_batch_records`.
    #[must_use]
    pub fn in_flight_records(&self) -> u64 {
        self.max_in_flight_batches * self.max_batch_records
    }

    /// The most records one kill (or one replay) can write twice.
    ///
    /// A record is written again after a kill when it was written but not
    /// yet covered by the last stored commit. The checkpointer commits (with
    /// a tiny `commit_interval`) whenever the watermark moved, and credit
    /// for new batches comes back only while it handles acknowledgements,
    /// never during a commit. So the records past the last stored commit are
    /// those in flight when it was taken (at most the in-flight bound) plus
    /// those opened with the credit handed back between that commit and the
    /// next (at most the in-flight bound again): twice the in-flight bound.
    #[must_use]
    pub fn duplicate_bound_per_event(&self) -> u64 {
        2 * self.in_flight_records()
    }

    /// The configuration as TOML.
    #[must_use]
    pub fn render(&self) -> String {
        let q = |p: &Path| format!("{:?}", p.display().to_string());
        let inputs: Vec<String> = self.inputs.iter().map(|p| q(p)).collect();
        let mut s = String::new();
        let _ = write!(
            s,
            "[source]\ntype = \"file\"\npaths = [{}]\nmax_batch_records = {}\n{}\n\
             [[transforms]]\ntype = \"filter\"\nfield = \"amount\"\nop = \">=\"\nvalue = 10\n\n\
             [[transforms]]\ntype = \"add_field\"\nfield = \"seen\"\nvalue = true\n\n\
             [[sinks]]\nname = \"out\"\ntype = \"file\"\npath = {}\nexactly_once = {}\n\
             batch_max_records = {}\nlinger = \"{}ms\"\n{}\n\
             [dead_letter]\ntype = \"file\"\npath = {}\n\n\
             [limits]\nmax_in_flight_batches = {}\nmax_in_flight_batches_per_partition = {}\n\n\
             [checkpoint]\ncommit_interval = \"{}ms\"\nstore = {{ type = \"file\", path = {} }}\n\n{}\n",
            inputs.join(", "),
            self.max_batch_records,
            self.source_extra,
            q(&self.output),
            self.exactly_once,
            self.sink_batch_records,
            self.linger_ms,
            self.sink_extra,
            q(&self.dead_letter),
            self.max_in_flight_batches,
            self.max_in_flight_batches,
            self.commit_interval_ms,
            q(&self.store),
            self.extra,
        );
        s
    }

    /// Write the configuration to `path`.
    ///
    /// # Errors
    ///
    /// The file cannot be written.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.render())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn renders_a_configuration_etl_accepts() {
        let dir = Path::new("/data");
        let mut toml = PipelineToml::new(dir, vec![dir.join("a b.ndjson")]);
        toml.exactly_once = true;
        let config = etl::registry().loader().text(&toml.render(), dir).unwrap();
        assert_eq!(config.sinks.len(), 1);
        assert_eq!(config.transforms.len(), 2);
        assert_eq!(config.limits.max_in_flight_batches, 8);
        assert_eq!(toml.in_flight_records(), 8000);
        assert_eq!(toml.duplicate_bound_per_event(), 16_000);
    }
}
