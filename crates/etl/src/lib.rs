//! The pipeline runtime and the `etl` command line.
//!
//! ```
//! let config = etl::parse_config(
//!     r#"
//!     [source]
//!     type = "generator"
//!     records_per_partition = 10
//!
//!     [[sinks]]
//!     type = "blackhole"
//!     "#,
//!     std::path::Path::new("."),
//! )
//! .unwrap();
//! assert_eq!(config.sinks.len(), 1);
//! ```

mod config;
mod connectors;
mod metrics;
mod runtime;
mod signal;
mod transform;

pub use config::*;
pub use connectors::check_connectors;
pub use metrics::*;
pub use runtime::*;
pub use signal::{ABORT_EXIT_CODE, shutdown_signal};
pub use transform::*;
