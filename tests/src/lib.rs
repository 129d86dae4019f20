//! Support code shared by the workspace's end-to-end suites in `tests/`.
//!
//! The suites run the real `etl` binary (found, or built, by
//! [`etl_binary`]) on generated inputs and on the checked-in bad-input
//! corpus in `tests/corpus/`:
//!
//! * [`write_records`] writes NDJSON inputs whose records carry a unique
//!   `id`; [`passes_filter`] says which of them the suites' filter keeps.
//! * [`PipelineToml`] writes a pipeline configuration.
//! * [`Etl`] runs, kills and restarts the binary, keeping each run's log;
//!   [`RunLog`] reads the `pipeline finished` line and looks for panics.
//! * [`read_output`] counts output lines by record `id` and fails on a
//!   torn (unparsable) line.
//! * [`CrashLoop`] is the SIGKILL crash loop of the suite and of
//!   `cargo xtask soak`; it returns a [`Tally`].
//!
//! ```
//! let dir = tempfile::tempdir()?;
//! let written = etl_tests::write_records(&dir.path().join("in.ndjson"), 0..100, 1, 0)?;
//! assert_eq!(written, 100);
//! let count = etl_tests::read_output(&dir.path().join("in.ndjson"))?;
//! assert_eq!(count.distinct(), 100);
//! assert!(etl_tests::workspace_root().join("Cargo.toml").exists());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod config;
mod crash;
mod input;
mod output;
mod process;
mod tally;

pub use config::{PipelineToml, SinkMode};
pub use crash::CrashLoop;
pub use etl_test_support::{etl_binary, workspace_root};
pub use input::{passes_filter, write_records};
pub use output::{OutputCount, read_dead_letter_ids, read_output};
pub use process::{Etl, ExitInfo, RunLog};
pub use tally::Tally;
