//! What the pipeline lets people see: Prometheus text, an HTTP endpoint
//! for it, and the periodic progress report.

mod progress;
mod prometheus;
mod server;

pub use progress::ProgressTotals;
pub use prometheus::{PromKind, PromText};
pub use server::{Render, serve_metrics};
